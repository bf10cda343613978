"""Which head-batched tiles fit sm_120 (the story's RTX PRO 6000) without spilling? Every tile shape
of the lab's kernel compiled for sm_120 (no GPU): registers a thread, bytes spilled, shared memory
against the ~99 KB a block may use there. sm_120 has no wgmma, so mma.sync keeps the [BLOCK_H, 512]
accumulator in registers: the question is how many heads a program can hold.

    DSV4LAB_MODE=compile python experiments/other_gpus_compile/sm120_tiles.py OUT.json [--cpu-smoke]

BLOCK_H 16 / 32 / 64 x BLOCK_N 16 / 32 / 64, 4 / 8 warps (and 16 for 64 heads), 1-2 stages, the
plain loop and the register pipeline, each as whole rows and as split slices (NSPLIT 2). About five
minutes on one core; --cpu-smoke: one tile.
"""
import itertools
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DSV4LAB_MODE", "compile")   # before dsv4lab decides the mode
import dsv4lab  # noqa: E402,F401
from dsv4lab import compile_report  # noqa: E402
from dsv4lab.device import mode  # noqa: E402
from dsv4lab.kernels.decode.planning import Launch, TileConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # experiments/: ab.py
import ab  # noqa: E402

QUESTION = "other_gpus_compile"
SMEM_LIMIT = compile_report.TARGETS["RTX PRO 6000"][3]


def tiles(smoke: bool) -> list:
    if smoke:
        return [(16, 64, 8, 1, "registers")]
    return [(bh, bn, nw, ns, loop) for bh, bn, nw, ns, loop in
            itertools.product((16, 32, 64), (16, 32, 64), (4, 8, 16), (1, 2), ("plain", "registers"))
            if not (nw == 16 and bh < 64) and not (ns == 2 and loop == "registers")]


def main(argv=None):
    a = ab.parse_args(__doc__, argv=argv)
    if mode() != "compile":
        sys.exit("the tile filter compiles without running: start it with DSV4LAB_MODE=compile "
                 "(and without TRITON_INTERPRET=1)")
    rows = []
    for bh, bn, nw, ns, loop in tiles(a.cpu_smoke):
        for nsplit in (1, 2):
            row = {"block_h": bh, "block_n": bn, "num_warps": nw, "num_stages": ns, "loop": loop, "nsplit": nsplit}
            cfg = TileConfig(bh, bn, nw, ns, "sm_120 tile filter", loop=loop)
            rows.append(ab.attempt(row, lambda: {
                k: v for k, v in compile_report.launch_report(Launch(cfg, nsplit=nsplit), arch=120).items()
                if k in ("registers", "spill_stores", "spill_loads", "shared_bytes", "mma", "ptxas_ok", "triton")}))
            row["fits"] = row.get("ptxas_ok", False) and row["shared_bytes"] <= SMEM_LIMIT
    ab.write(a.out, QUESTION, a.cpu_smoke, arch="sm_120a", smem_limit=SMEM_LIMIT, rows=rows)


if __name__ == "__main__":
    main()
