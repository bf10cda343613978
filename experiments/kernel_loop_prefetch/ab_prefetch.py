# Runs at commit 971bafeb1eb2fcc70cc2c5b9747b0797d8c2c218 as tools/ab_prefetch.py, not on the current package (its variants were deleted).
"""The 64-head tile's prefetch loops on the GPU: 4 (indices one tile ahead) against 5 (4 + the next
tile's bytes requested into L2 after this tile's Q @ K^T) and 7 (two tiles ahead), the last two also
with the integer dequant and the folded scale (VARIANTS). One JSON.

    python tools/ab_prefetch.py OUT.json

Why: tools/trace_decode.py showed B=128 programs spend 55.5 us in the tile loop when every request
reads its own tokens, 42.5 us when all read the same (L2-resident) ones: the gathers queue on HBM
because every program issues its gather at the same moment. Checks first (poisoned outputs, float64
reference, topk_len, -1 padding, sink, at NSPLIT 1 and 2), then CUDA-graph replay times (do_bench
median, L2 flushed) at each (B, NSPLIT), the modes interleaved, best of 2 passes, and the per-program
loop time from the clock trace at B=128.
"""
import dataclasses
import json
import sys

import torch

from dsv4lab import bench, reference
from dsv4lab.kernels import head_batched, split_k
from dsv4lab.testing import LSE_TOL, OUT_TOL, make_decode_inputs, poisoned, rel_err

H, K, SCALE = 64, 512, 512 ** -0.5
BASE = head_batched.tile_config(H)
DEFAULT = (head_batched.DEQUANT, head_batched.FOLD_SCALE)
#: (prefetch loop, dequant, fold the softmax scale): the loops with the default dequant, and the two
#: best loops with the instruction-saving variants of ab_dequant.json on top
VARIANTS = [(4, "cvt", False), (5, "cvt", False), (7, "cvt", False), (5, "bits", True), (7, "bits", True)]
SHAPES = [(1, 1), (1, 4), (32, 1), (32, 4), (64, 1), (64, 2), (128, 1)]      # (B, NSPLIT)


def decode(inp, variant, nsplit, **kw):
    cfg = dataclasses.replace(BASE, prefetch=variant[0])
    head_batched.DEQUANT, head_batched.FOLD_SCALE = variant[1], variant[2]
    return split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, topk_len=kw.get("topk_len"),
                                       sm_scale=SCALE, attn_sink=kw.get("attn_sink"), nsplit=nsplit, cfg=cfg)


def main(path):
    rows = []
    chk = make_decode_inputs(6, H, K, context=1500, topk_len=True, sink=True, pad_frac=0.1, seed=31)
    ro, rl = reference.sparse_decode(chk.q, chk.cache, chk.indices, sm_scale=SCALE, **chk.kwargs())
    for v in VARIANTS:
        for n in (1, 2):
            with poisoned():
                o, lse = decode(chk, v, n, **chk.kwargs())
            row = dict(kind="check", prefetch=v[0], dequant=v[1], fold=v[2], nsplit=n, out_err=rel_err(o.float(), ro), lse_err=rel_err(lse, rl))
            row["ok"] = row["out_err"] <= OUT_TOL and row["lse_err"] <= LSE_TOL
            rows.append(row)
            print(row, flush=True)
    for B, n in SHAPES:
        inp = make_decode_inputs(B, H, K, context=8192, seed=700 + B)
        best = {}
        for _ in range(2):
            for v in VARIANTS:
                us = bench.time_ms(lambda: decode(inp, v, n), graph=True) * 1e3  # noqa: B023
                best[v] = min(best.get(v, us), us)
        for v, us in best.items():
            rows.append(dict(kind="time", B=B, nsplit=n, prefetch=v[0], dequant=v[1], fold=v[2], us=us,
                             tflops=4 * H * K * 512 * B / (us * 1e-6) / 1e12))
            print(rows[-1], flush=True)
        if B == 128:
            for v in VARIANTS:
                cfg = dataclasses.replace(BASE, prefetch=v[0])
                head_batched.DEQUANT, head_batched.FOLD_SCALE = v[1], v[2]
                tr = torch.zeros(B, 4, dtype=torch.int64, device="cuda")
                out = torch.empty(B, H, 512, dtype=torch.bfloat16, device="cuda")
                lse = torch.empty(B, H, dtype=torch.float32, device="cuda")
                loops = []
                for _ in range(10):
                    torch.empty(256 * 2**20, dtype=torch.int8, device="cuda").zero_()
                    head_batched.launch(inp.q, inp.cache, inp.indices, None, SCALE, None, out, lse, cfg=cfg, trace=tr)
                    torch.cuda.synchronize()
                    t = tr.cpu()
                    loops.append(float((t[:, 1] - t[:, 0]).double().median()) / 1e3)
                rows.append(dict(kind="trace", B=B, prefetch=v[0], dequant=v[1], fold=v[2], loop_us_median=sorted(loops)[len(loops) // 2]))
                print(rows[-1], flush=True)
        del inp
        torch.cuda.empty_cache()
    head_batched.DEQUANT, head_batched.FOLD_SCALE = DEFAULT
    json.dump({**bench.environment(), "part": "ab_prefetch", "base": vars(BASE), "rows": rows},
              open(path, "w"), indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
