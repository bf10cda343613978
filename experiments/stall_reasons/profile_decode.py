"""Run one decode a few times at one batch size: a target for ncu (stall_profile.py runs it).

    ncu --clock-control none -k regex:_head_batched --launch-skip 2 --launch-count 1 \
        python experiments/stall_reasons/profile_decode.py mma 128 [SPEC] [--cpu-smoke]

IMPL is a registered sparse-decode impl; with SPEC (BLOCK_H,BLOCK_N,warps,stages,loop[,dequant,fold],
e.g. 64,128,8,1,l2_hint,bits,1) the tuned head-batched kernel runs whole rows with those tiles
instead. Four calls, so --launch-skip 2 profiles a warm one. --cpu-smoke: tiny shapes, interpreter.
"""
import argparse

import sys
from pathlib import Path
import dsv4lab
from dsv4lab.kernels.decode import planning
from dsv4lab.device import mode
from dsv4lab.testing import make_decode_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402


def tiles(spec: str) -> planning.TileConfig:
    bh, bn, nw, ns, loop, *rest = spec.split(",")
    dq, fold = (rest[0], rest[1] in ("1", "True", "true")) if rest else ("cvt", False)
    return planning.TileConfig(int(bh), int(bn), int(nw), int(ns), "profile", loop=loop, dequant=dq, fold_scale=fold)


def target(impl: str, B: int, spec: str | None = None, smoke: bool = False, calls: int = 4):
    """The decode ncu profiles: ``calls`` calls of ``impl`` (or of the tuned kernel with ``spec``'s tiles)."""
    H, K, ctx = (4, 32, 64) if smoke else (64, 512, 8192)
    inp = make_decode_inputs(B, H, K, context=ctx, seed=1)
    if spec:
        cfg = tiles(spec)
        opts = planning.Launch(cfg, dequant=cfg.dequant, fold_scale=cfg.fold_scale)
        run = lambda: ab.decode(opts, inp)  # noqa: E731
    else:
        run = lambda: dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl)  # noqa: E731
    for _ in range(calls):
        out = run()
    if mode() == "cuda":
        import torch
        torch.cuda.synchronize()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("impl")
    ap.add_argument("B", type=int)
    ap.add_argument("spec", nargs="?")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, one call (automatic without a GPU)")
    a = ap.parse_args(argv)
    smoke = a.cpu_smoke or mode() != "cuda"
    target(a.impl, a.B, a.spec, smoke, calls=1 if smoke else 4)


if __name__ == "__main__":
    main()
