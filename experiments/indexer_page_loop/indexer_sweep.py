"""The Triton indexer's knobs on the GPU: programs per SM (the grid) x num_stages x the page loop
(plain, or the register pipeline over pages: kernels.indexer's PREFETCH).

    python experiments/indexer_page_loop/indexer_sweep.py OUT.json [--per-sm 4 8 16] [--stages 1 3] [--cpu-smoke]

Each config is checked against the float64 reference first (poisoned outputs; logits bound
testing.INDEXER_TOL), then timed (graph replay, do_bench median, L2 flushed) at B = 1 and 32 with
8192 live tokens a request, max context 8192 and 262208. The package's launch is 8 programs per SM
(triton_indexer.PROGRAMS_PER_SM), 3 stages, the register pipeline. ~1 min on an H200.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

from dsv4lab import reference
from dsv4lab.device import info
from dsv4lab.kernels.indexer import triton_indexer
from dsv4lab.testing import INDEXER_TOL, make_indexer_inputs, poisoned, rel_err
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "indexer_page_loop"


def main(argv=None):
    def add(p):
        p.add_argument("--per-sm", type=int, nargs="+", default=[4, 8, 16], help="programs per SM")
        p.add_argument("--stages", type=int, nargs="+", default=[1, 3])
    a = ab.parse_args(__doc__, add, argv)
    H = 64
    if a.smoke:
        chk_len, live, shapes, per_sm, stages = 200, 130, [(1, 256), (2, 512)], [2], [1]
    else:
        chk_len, live, shapes, per_sm, stages = 4096, 8192, [(1, 8192), (1, 262208), (32, 8192), (32, 262208)], \
            a.per_sm, a.stages
    sms = info().sm_count or 2                      # the interpreter has no SMs: triton_indexer.grid assumes 2
    chk = make_indexer_inputs(3, H, chk_len, seed=11)
    ref = reference.indexer_logits(*chk.args(), chk_len)
    inputs = {(B, L): make_indexer_inputs(B, H, L, seq_lens=live, seed=13) for B, L in shapes}
    rows = []
    for prefetch in (False, True):
        for n in per_sm:
            for st in stages:
                def nprog(B, L, n=n):
                    return max(1, min(-(-L // 64), -(-n * sms // B)))

                def one(prefetch=prefetch, st=st, nprog=nprog):
                    with poisoned():
                        out = triton_indexer.logits_triton(*chk.args(), chk_len, nprog=nprog(3, chk_len), num_stages=st,
                                                    prefetch=prefetch)
                    row = {"err": rel_err(out, ref)}
                    row["ok"] = row["err"] <= INDEXER_TOL
                    for (B, L), inp in inputs.items():
                        fn = lambda inp=inp, B=B, L=L: triton_indexer.logits_triton(  # noqa: E731
                            *inp.args(), L, nprog=nprog(B, L), num_stages=st, prefetch=prefetch)
                        row[f"us_B{B}_L{L}"] = ab.time_us(fn, a.smoke)
                    return row
                rows.append(ab.attempt(dict(programs_per_sm=n, num_stages=st, prefetch=prefetch), one))
    ab.write(a.out, QUESTION, a.smoke, H=H, live=live, rows=rows)


if __name__ == "__main__":
    main()
