"""The fp8 -> bf16 dequant on the GPU: conversion instructions ("cvt") against integer ops ("bits",
common.dequant_kv_bits), each with and without the softmax scale folded into exp2's FMA. One JSON.

    python tools/ab_dequant.py OUT.json [--batches 1 32 128]

Checks first (poisoned outputs, float64 reference, topk_len, -1 padding, sink): every variant on
the mma and splitk launches; "bits" must equal "cvt" bitwise with the same fold setting (both
dequantize exactly), also on a cache holding every e4m3 byte and scale bytes 90..MAX_SCALE_BYTE.
Then CUDA-graph replay times (do_bench median, L2 flushed) of mma at each B and splitk at B <= 32,
the variants interleaved, best of 2 passes.
"""
import argparse
import json

import torch

import dsv4lab
from dsv4lab import bench, reference
from dsv4lab.kernels import common, head_batched
from dsv4lab.testing import LSE_TOL, OUT_TOL, make_decode_inputs, poisoned, rel_err

H, K = 64, 512
VARIANTS = [("cvt", False), ("cvt", True), ("bits", False), ("bits", True)]


def use(variant):
    head_batched.DEQUANT, head_batched.FOLD_SCALE = variant


def every_byte_cache(inp):
    """Overwrite the nope bytes of every token with all non-NaN e4m3 patterns (shifted per token)
    and its scale bytes with values in [90, MAX_SCALE_BYTE]."""
    c = inp.cache
    ps, n = c.page_size, c.num_pages * c.page_size
    pats = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    tok = torch.arange(n)[:, None]
    data = pats[(tok * 7 + torch.arange(448)[None, :]) % len(pats)]
    sc = (90 + (tok * 3 + torch.arange(8)[None, :]) % (common.MAX_SCALE_BYTE - 89)).to(torch.uint8)
    buf = c.buffer.view(c.num_pages, -1)
    d = buf[:, : ps * 576].reshape(c.num_pages, ps, 576)
    d[..., :448] = data.reshape(c.num_pages, ps, 448).to(buf.device)
    buf[:, ps * 576: ps * 584] = sc.reshape(c.num_pages, ps * 8).to(buf.device)
    return inp


def run(impl, inp):
    with poisoned():
        return dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs())


def checks():
    rows = []
    cases = {"odd": make_decode_inputs(5, H, K, context=1500, topk_len=True, sink=True, pad_frac=0.1, seed=21),
             "B1": make_decode_inputs(1, H, K, context=8192, seed=22),
             "every_byte": every_byte_cache(make_decode_inputs(3, H, K, context=1024, seed=23))}
    for name, inp in cases.items():
        ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, **inp.kwargs())
        for impl in ("mma", "splitk"):
            outs = {}
            for v in VARIANTS:
                use(v)
                o, lse = run(impl, inp)
                outs[v] = (o, lse)
                row = dict(case=name, impl=impl, dequant=v[0], fold=v[1], out_err=rel_err(o.float(), ro),
                           lse_err=rel_err(lse, rl))
                row["ok"] = row["out_err"] <= OUT_TOL and row["lse_err"] <= LSE_TOL
                if v[0] == "bits":
                    a, b = outs[("cvt", v[1])], outs[v]
                    row["bitwise_vs_cvt"] = bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
                    row["ok"] = row["ok"] and row["bitwise_vs_cvt"]
                rows.append(row)
                print(row, flush=True)
    return rows


def timings(batches):
    rows = []
    for B in batches:
        inp = make_decode_inputs(B, H, K, context=8192, seed=500 + B)
        impls = ["mma"] + (["splitk"] if B <= 32 else [])
        for impl in impls:
            fn = lambda: dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, check_ranges=False)  # noqa: E731
            best = {}
            for _ in range(2):
                for v in VARIANTS:
                    use(v)
                    us = bench.time_ms(fn, graph=True) * 1e3
                    best[v] = min(best.get(v, us), us)
            for v, us in best.items():
                row = dict(B=B, impl=impl, dequant=v[0], fold=v[1], us=us)
                if impl == "mma":
                    row["tflops"] = 4 * H * K * 512 * B / (us * 1e-6) / 1e12
                rows.append(row)
                print(row, flush=True)
        del inp
        torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    a = ap.parse_args()
    default = (head_batched.DEQUANT, head_batched.FOLD_SCALE)
    res = {"checks": checks(), "timings": timings(a.batches)}
    use(default)
    json.dump({**bench.environment(), "part": "ab_dequant", **res}, open(a.out, "w"), indent=1, default=str)
