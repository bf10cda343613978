"""Split-K's partial outputs in bf16 or fp32, end to end on the GPU: error and time.

    python experiments/split_partials_dtype/partials.py OUT.json [--batches 1 8 16 32 64] [--cpu-smoke]

The partials (one [512] output row per slice, head and request) are written by the split launch
and read back once by the combine launch: bf16 halves those bytes for one more rounding. At each
B, the split launches splitk and splitk_auto take for the shape (planning.choose_split / choose, NSPLIT
> 1 only) with Launch.partials "float32" and "bfloat16"; the combine launch takes its warps from
the dtype (split_k.combine_warps: 4 for fp32, 2 for bf16). Checks first (poisoned outputs,
float64 reference, topk_len, -1 padding, sink; graph replay bitwise): the error each dtype costs.
Then the pair's time in a graph of one call and per call in a graph of 8 calls, the dtypes
interleaved, best of 2 passes. ~2 min on an H200.
"""
from dataclasses import replace

import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)
import torch

from dsv4lab.kernels.decode import planning
from dsv4lab.kernels.decode import split_k
from dsv4lab.testing import make_decode_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "split_partials_dtype"
DTYPES = ("float32", "bfloat16")


def main(argv=None):
    a = ab.parse_args(__doc__, lambda p: p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32, 64]),
                      argv)
    H, K, ctx = (4, 32, 64) if a.smoke else (64, 512, 8192)
    batches = [2] if a.smoke else a.batches
    rows = []
    chk = make_decode_inputs(3, H, K, context=ctx, topk_len=True, sink=True, pad_frac=0.1, seed=70)
    for B in batches:
        inp = make_decode_inputs(B, H, K, context=ctx, seed=700 + B)
        for plan in ab.split_plans(B, H, K):
            variants = {d: replace(planning.launch_of_plan(plan), partials=d) for d in DTYPES}
            base = dict(B=B, block_h=plan.cfg.block_h, block_n=plan.cfg.block_n, loop=plan.cfg.loop,
                        nsplit=plan.nsplit)
            for d, opts in variants.items():
                call = lambda x, opts=opts: ab.decode(opts, x)  # noqa: E731
                rows.append(ab.attempt(dict(base, kind="check", partials=d,
                                            combine_warps=split_k.combine_warps(getattr(torch, d))),
                                       lambda: ab.check(call, chk, a.smoke)))
            ab.add_times(rows, ab.time_variants(variants, inp, a.smoke), lambda d: dict(base, kind="time", partials=d))
        del inp
        ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=False)   # kept if cut short
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=True)


if __name__ == "__main__":
    main()
