"""Does every Triton kernel the package launches compile, and fit, on the GPUs a reader may bring:
H200 (sm_90), B200 (sm_100), RTX PRO 6000 Blackwell (sm_120, the story's GPU), GB10 (sm_121) and
L40S (sm_89, a GPU with no tile entry of its own and ~99 KB of shared memory a block)?

    python experiments/other_gpus_compile/run.py OUT.json [--targets B200 GB10] [--cpu-smoke]

Each target is planned in a process of its own (DSV4LAB_MODE=compile, nothing runs): the public
entries are called with CPU tensors at the campaign's shapes while the package plans as on that
GPU (``compile_report.planned_for``: the tile table by its capability, splits and grids by its SM
count). Every Triton launch they ask for is recorded, then compiled for the target's architecture
with the Triton installed here; ptxas's report is kept (registers, spills, shared memory against
what a block may use on that GPU, the matrix instructions). Rows: ``kind="launch"`` (one per
distinct compile, with the calls that asked for it) and ``kind="call"`` (each call, and its error
if it raised). CPU only, a few minutes a target (tests/test_other_gpus.py compiles each kernel once the same way, in
~10 s); --cpu-smoke: one decode call and one top-k call on B200.
"""
import argparse
import json
import os
import subprocess
import sys

if __name__ == "__main__":
    os.environ.setdefault("DSV4LAB_MODE", "compile")   # before dsv4lab decides the mode

import dsv4lab  # noqa: E402
from dsv4lab import compile_report as cr, registry  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # experiments/: ab.py
import ab  # noqa: E402

QUESTION = "other_gpus_compile"


def calls(which: str) -> dict:
    """label -> a thunk that calls a public entry the way the replay and the notebooks do
    (compile_report's thunks); ``which``: "full" (every recorded decode impl at B = 1, 8, 32, 128) or
    "smoke"."""
    if which == "smoke":
        return {"mma B=1 K=512": cr.decode_call("mma", 1, 512), "top-k B=1 width 65536": cr.topk_call(1, 65536)}
    out = {}
    for impl in [i.name for i in registry.registered(tag="recorded")]:
        for B in (1, 8, 32, 128):
            out[f"{impl} B={B} K=512"] = cr.decode_call(impl, B, 512)
    for impl in ("mma", "splitk_auto", "auto"):
        for B in (1, 32):
            out[f"{impl} B={B} K=128"] = cr.decode_call(impl, B, 128)
    for B in (1, 32, 128):
        out[f"indexer_topk triton B={B} live 8192 max 65536"] = cr.indexer_call(B)
    for width in (262208, 1048576):
        out[f"top-k B=32 width {width}"] = cr.topk_call(32, width)
    return {**out, **cr.step_kernel_calls()}


def child(target_name: str, which: str) -> list:
    """Rows of one target (run in a process of its own: plans are cached per shape)."""
    return cr.planned_launches(target_name, calls(which))


def main(argv=None):
    a = ab.parse_args(__doc__, argv=argv, add=lambda p: (
        p.add_argument("--targets", nargs="+", choices=sorted(cr.TARGETS),
                       default=sorted(cr.TARGETS)),
        p.add_argument("--calls", choices=("full",), default="full",
                       help="full: every recorded impl at B = 1, 8, 32, 128 (a few minutes a target)"),
        p.add_argument("--child", help=argparse.SUPPRESS)))
    which = "smoke" if a.cpu_smoke else a.calls
    if a.child:
        json.dump(child(a.child, which), sys.stdout)
        return
    targets = ["B200"] if a.cpu_smoke else a.targets
    rows = []
    for name in targets:
        env = {**os.environ, "DSV4LAB_MODE": "compile"}
        env.pop("TRITON_INTERPRET", None)
        cmd = [sys.executable, __file__, os.devnull, "--child", name, "--calls", a.calls] + (
            ["--cpu-smoke"] if a.cpu_smoke else [])
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        sys.stderr.write(r.stderr)
        if r.returncode:
            rows.append({"kind": "target", "target": name, "error": f"the child exited with {r.returncode}"})
        else:
            rows.extend(json.loads(r.stdout))
        ab.write(a.out, QUESTION, a.cpu_smoke, complete=False, rows=rows)
    ab.write(a.out, QUESTION, a.cpu_smoke, complete=True, calls=which,
             targets={n: cr.TARGETS[n] for n in targets}, rows=rows)


if __name__ == "__main__":
    main()
