"""The compiler's resource report for every tile candidate, without a GPU: registers a thread,
bytes spilled to local memory, shared memory, and the matrix instructions picked (wgmma on
Hopper, mma.sync otherwise), from ptxas (shipped in Triton's wheel) compiling for sm_90a.

    DSV4LAB_MODE=compile python experiments/compiler_resource_report/resources.py OUT.json [--cpu-smoke]

Rows: each tile sweep candidate (sweeps.TILE_CANDIDATES) as a launch of whole rows and as split
slices (NSPLIT 2, bf16 partials: the dequant and fold of a split launch, planning.launch_for),
and the story's stage-2 kernel (planning.STORY_TILES). Spills differ between Triton versions
(the recorded GPU timings used 3.6): run it with the Triton the timings were taken with. A few
seconds a config, CPU only. --cpu-smoke: one small config.
"""
import os
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

if __name__ == "__main__":
    os.environ.setdefault("DSV4LAB_MODE", "compile")   # before dsv4lab decides the mode
import dsv4lab  # noqa: E402,F401
from dsv4lab import compile_report, sweeps
from dsv4lab.kernels.decode import planning  # noqa: E402
from dsv4lab.device import mode  # noqa: E402

QUESTION = "compiler_resource_report"


def launches(smoke: bool):
    """(what, Launch, story?) for every config compiled."""
    specs = [(16, 16, 4, 1, "plain")] if smoke else sweeps.TILE_CANDIDATES
    out = []
    for spec in specs:
        tiles = sweeps.candidate(spec)
        out.append(("whole rows", planning.Launch(tiles, dequant=tiles.dequant, fold_scale=tiles.fold_scale), False))
        if not smoke:
            out.append(("split slices", planning.Launch(tiles, nsplit=2), False))
    if not smoke:
        out.append(("story", planning.Launch(planning.STORY_TILES), True))
    return out


def main(argv=None):
    a = ab.parse_args(__doc__, argv=argv)
    if mode() != "compile":
        sys.exit("the resource report compiles without running: start it with DSV4LAB_MODE=compile "
                 "(and without TRITON_INTERPRET=1)")
    rows = []
    for what, opts, story in launches(a.cpu_smoke):
        rows.append(ab.attempt({"what": what}, lambda: compile_report.launch_report(opts, story=story)))
    ab.write(a.out, QUESTION, a.cpu_smoke, arch="sm_90a", rows=rows)


if __name__ == "__main__":
    main()
