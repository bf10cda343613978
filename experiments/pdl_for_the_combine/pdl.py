"""Split-K's combine launch with and without programmatic dependent launch (PDL), on the GPU.

    python experiments/pdl_for_the_combine/pdl.py OUT.json [--batches 1 2 4 8 16 32 64] [--cpu-smoke]

At each B, splitk's plan for the shape (planning.choose_split) with Launch.pdl off and on: with
PDL the combine kernel is launched while the split kernel runs and waits on the GPU
(griddepcontrol) for the partials. Each variant is checked first (poisoned outputs, float64
reference, topk_len, -1 padding, sink; CUDA-graph replay bitwise equal to the eager call), then
timed in a graph of one call and per call in a graph of 8 calls on copies of the inputs, the
variants interleaved, best of 2 passes. Each row also says what the package's default
(planning.launch_for: PDL where the split grid leaves at least half the SMs idle) picks.
The interpreter has no PDL: --cpu-smoke runs the "off" variant only. ~2 min on an H200.
"""
from dataclasses import replace

import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)
from dsv4lab.kernels.decode import planning
from dsv4lab.testing import make_decode_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "pdl_for_the_combine"


def main(argv=None):
    a = ab.parse_args(__doc__, lambda p: p.add_argument("--batches", type=int, nargs="+",
                                                        default=[1, 2, 4, 8, 16, 32, 64]), argv)
    H, K, ctx = (4, 32, 64) if a.smoke else (64, 512, 8192)
    batches = [1, 2] if a.smoke else a.batches
    settings = [False] if a.smoke else [False, True]
    rows = []
    for B in batches:
        plan = planning.choose_split(B, H, K)
        default = planning.launch_of_plan(plan)
        variants = {pdl: replace(default, pdl=pdl) for pdl in settings}
        base = dict(B=B, block_h=plan.cfg.block_h, block_n=plan.cfg.block_n, nsplit=plan.nsplit,
                    programs=plan.programs, sms=planning.sm_count(), default_pdl=default.pdl)
        chk = make_decode_inputs(min(B, 3), H, K, context=ctx, topk_len=True, sink=True, pad_frac=0.1, seed=60 + B)
        for pdl, opts in variants.items():
            call = lambda x, opts=opts: ab.decode(opts, x)  # noqa: E731
            rows.append(ab.attempt(dict(base, kind="check", pdl=pdl), lambda: ab.check(call, chk, a.smoke)))
        inp = make_decode_inputs(B, H, K, context=ctx, seed=600 + B)
        ab.add_times(rows, ab.time_variants(variants, inp, a.smoke), lambda pdl: dict(base, kind="time", pdl=pdl))
        del inp
        ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=False)   # kept if cut short
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=True)


if __name__ == "__main__":
    main()
