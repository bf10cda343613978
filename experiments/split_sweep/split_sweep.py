"""NSPLIT x B for tile configs of split-K on the GPU, and the launch-time model's costs fitted to it.

    python experiments/split_sweep/split_sweep.py OUT.json [SPEC ...] [--batches 1 2 4 8 16 32 64 128]
        [--splits 1 2 4 8 16] [--cpu-smoke]

SPEC is BLOCK_H,BLOCK_N,warps,stages,loop[,dequant,fold] (as experiments/tile_sweep takes it);
without specs, this device's two table entries (planning.tile_config: the 64-head "mma" entry and
the 16-head "split" entry). Each (config, B, NSPLIT) launch takes the options the package gives it
(planning.launch_for) and is timed with graph replay (sweeps.split_sweep); then each config's
us_per_tile, fixed_us and merge_us are fitted to its B = 1 rows (sweeps.fit_costs), and each row
says whether the model with those fitted figures picks it (planning.choose). The recorded run
(`python -m dsv4lab record --only tiles split`) runs the same sweep over the tile sweep's picks.
~1 min for the two entries on an H200.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

from dsv4lab import sweeps
from dsv4lab.kernels.decode import planning
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "split_sweep"


def spec(text: str):
    bh, bn, nw, ns, loop, *rest = text.split(",")
    dq, fold = (rest[0], rest[1] in ("1", "True", "true")) if rest else ("cvt", False)
    return planning.TileConfig(int(bh), int(bn), int(nw), int(ns), "command line", loop=loop, dequant=dq,
                               fold_scale=fold)


def main(argv=None):
    def add(p):
        p.add_argument("specs", nargs="*", help="BLOCK_H,BLOCK_N,warps,stages,loop[,dequant,fold]")
        p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
        p.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    a = ab.parse_args(__doc__, add, argv)
    H, K, ctx = (4, 32, 64) if a.smoke else (64, 512, 8192)
    batches, splits = ([1, 2], [1, 2]) if a.smoke else (a.batches, a.splits)
    cands = [spec(s) for s in a.specs] if a.specs and not a.smoke else \
        list(dict.fromkeys([planning.tile_config(H), planning.tile_config(H, split=True)]))
    rows = sweeps.split_sweep(cands, batches=batches, splits=splits, H=H, K=K, context=ctx,
                              timer=lambda fn: ab.time_us(fn, a.smoke, warmup=10, rep=50))
    fitted = [sweeps.fit_costs(rows, c) for c in cands]
    for r in rows:                   # what splitk_auto's model picks over the fitted configs
        p = planning.choose(r["B"], H, K, cfgs=fitted)
        r["model_choice"] = r["nsplit"] == p.nsplit and sweeps.ran(r, p.cfg)
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, fitted=[vars(c) for c in fitted])


if __name__ == "__main__":
    main()
