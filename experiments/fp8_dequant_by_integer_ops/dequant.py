"""The fp8 -> bf16 dequant on the GPU: conversion instructions ("cvt") against integer ops
("bits", kernels.kv_tiles.dequant_kv_bits), each with and without the softmax scale folded into
exp2's FMA (Launch.dequant, Launch.fold_scale). One JSON.

    python experiments/fp8_dequant_by_integer_ops/dequant.py OUT.json [--batches 1 32 128] [--cpu-smoke]

Checks first (poisoned outputs, float64 reference, topk_len, -1 padding, sink; graph replay
bitwise): every variant on the launches mma and splitk take for the shape; "bits" must equal
"cvt" bitwise with the same fold setting (both dequantize exactly), also on a cache holding every
non-NaN e4m3 byte and scale bytes 90..MAX_SCALE_BYTE. Then mma at each B and splitk at B <= 32,
in a graph of one call and per call in a graph of 8 calls, the variants interleaved, best of 2
passes. The interpreter cannot run "bits" (inline PTX): --cpu-smoke runs the "cvt" variants.
~3 min on an H200.
"""
from dataclasses import replace

import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)
import torch

from dsv4lab import reference
from dsv4lab.cache import scale_view
from dsv4lab.kernels.decode import head_batched, split_k
from dsv4lab.kernels.decode import kv_tiles
from dsv4lab.testing import make_decode_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "fp8_dequant_by_integer_ops"
VARIANTS = [("cvt", False), ("cvt", True), ("bits", False), ("bits", True)]
LAUNCHES = {"mma": head_batched.mma_launch, "splitk": split_k.splitk_launch}


def every_byte_cache(inp):
    """Overwrite the nope bytes of every token with all non-NaN e4m3 patterns (shifted per token)
    and its scale bytes with values in [90, MAX_SCALE_BYTE]."""
    c = inp.cache
    ps, n = c.page_size, c.num_pages * c.page_size
    pats = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    tok = torch.arange(n)[:, None]
    data = pats[(tok * 7 + torch.arange(448)[None, :]) % len(pats)]
    sc = (90 + (tok * 3 + torch.arange(8)[None, :]) % (kv_tiles.MAX_SCALE_BYTE - 89)).to(torch.uint8)
    c.buffer[:, : ps * 576].reshape(c.num_pages, ps, 576)[..., :448] = data.reshape(c.num_pages, ps, 448).to(c.device)
    scale_view(c)[:] = sc.reshape(c.num_pages, ps, 8).to(c.device)
    return inp


def main(argv=None):
    a = ab.parse_args(__doc__, lambda p: p.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128]), argv)
    H, K, ctx = (4, 32, 64) if a.smoke else (64, 512, 8192)
    variants = [v for v in VARIANTS if v[0] == "cvt"] if a.smoke else VARIANTS
    cases = {"odd": make_decode_inputs(2 if a.smoke else 5, H, K, context=ctx, topk_len=True, sink=True,
                                       pad_frac=0.1, seed=21),
             "every_byte": every_byte_cache(make_decode_inputs(2 if a.smoke else 3, H, K, context=ctx, seed=23))}
    if not a.smoke:
        cases["B1"] = make_decode_inputs(1, H, K, context=ctx, seed=22)
    rows = []
    for name, inp in cases.items():
        ref = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=ab.SCALE, **inp.kwargs())
        B = inp.q.shape[0]
        for impl, launch in LAUNCHES.items():
            outs = {}
            for dq, fold in variants:
                opts = replace(launch(B, H, K), dequant=dq, fold_scale=fold)

                def call(x, opts=opts, key=(dq, fold)):
                    outs[key] = ab.decode(opts, x)
                    return outs[key]
                row = ab.attempt(dict(kind="check", case=name, impl=impl, **opts.as_dict()),
                                 lambda: ab.check(call, inp, a.smoke, ref), log=None)
                if dq == "bits" and ("cvt", fold) in outs and (dq, fold) in outs:
                    x, y = outs[("cvt", fold)], outs[(dq, fold)]
                    row["bitwise_vs_cvt"] = bool(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]))
                    row["ok"] = row.get("ok", False) and row["bitwise_vs_cvt"]
                rows.append(row)
                print(row, flush=True)
    for B in ([2] if a.smoke else a.batches):
        inp = make_decode_inputs(B, H, K, context=ctx, seed=500 + B)
        for impl in ["mma"] + (["splitk"] if B <= 32 else []):
            opts = {v: replace(LAUNCHES[impl](B, H, K), dequant=v[0], fold_scale=v[1]) for v in variants}
            ab.add_times(rows, ab.time_variants(opts, inp, a.smoke),
                         lambda v: dict(kind="time", B=B, impl=impl, **opts[v].as_dict()))
        del inp
        ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=False)   # kept if cut short
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=True)


if __name__ == "__main__":
    main()
