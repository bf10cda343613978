"""Check and time tile configs of the tuned head-batched kernel on the GPU, outside the recorded run.

    python experiments/tile_sweep/tile_sweep.py OUT.json [SPEC ...] [--batches 1 8 32 128] [--cpu-smoke]

SPEC is BLOCK_H,BLOCK_N,warps,stages,loop[,dequant,fold] with loop one of plain, registers,
l2_hint (planning.LOOPS), dequant cvt or bits, fold 0 or 1, e.g. "64,128,8,1,l2_hint,bits,1";
without specs, the recorded run's candidates (sweeps.TILE_CANDIDATES). Every config is checked
against the float64 reference (poisoned outputs, topk_len, sink) and then timed with graph
replay at each B, whole-row launches: sweeps.tile_sweep, the loop `python -m dsv4lab record
--only tiles` runs (which also makes the fastest config at the largest B the table's entry).
~1 min per 13 configs on an H200.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

from dsv4lab import sweeps
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "tile_sweep"
#: the interpreter's tile entry with each loop (smoke mode)
SMOKE = [(16, 16, 4, 1, "plain"), (16, 16, 4, 1, "registers"), (16, 16, 4, 1, "l2_hint")]


def spec(text: str) -> tuple:
    bh, bn, nw, ns, loop, *rest = text.split(",")
    if rest and len(rest) != 2:
        raise ValueError(f"a spec is BLOCK_H,BLOCK_N,warps,stages,loop[,dequant,fold], got {text!r}")
    extra = (rest[0], rest[1] in ("1", "True", "true")) if rest else ()
    return (int(bh), int(bn), int(nw), int(ns), loop, *extra)


def main(argv=None):
    def add(p):
        p.add_argument("specs", nargs="*", help="BLOCK_H,BLOCK_N,warps,stages,loop[,dequant,fold]")
        p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    a = ab.parse_args(__doc__, add, argv)
    if a.smoke:
        H, K, ctx, batches, cands = 4, 32, 64, [1], SMOKE
    else:
        H, K, ctx, batches = 64, 512, 8192, a.batches
        cands = [spec(s) for s in a.specs] or sweeps.TILE_CANDIDATES
    rows = sweeps.tile_sweep(cands, batches=batches, H=H, K=K, context=ctx,
                             timer=lambda fn: ab.time_us(fn, a.smoke, warmup=10, rep=40))
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows)


if __name__ == "__main__":
    main()
