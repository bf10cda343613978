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
if it raised). CPU only, a few minutes a target (--calls ci: each kernel once, ~30 s); --cpu-smoke: one decode
call and one top-k call on B200.
"""
import argparse
import json
import os
import subprocess
import sys

if __name__ == "__main__":
    os.environ.setdefault("DSV4LAB_MODE", "compile")   # before dsv4lab decides the mode
import torch  # noqa: E402

import dsv4lab  # noqa: E402
from dsv4lab import ab, compile_report, testing  # noqa: E402

QUESTION = "other_gpus_compile"
DECODE_IMPLS = ("simt", "mma_story", "mma", "splitk", "splitk_auto", "auto", "sglang")


def calls(which: str) -> dict:
    """label -> a thunk that calls a public entry the way the replay and the notebooks do; ``which``:
    "full", "ci" or "smoke"."""
    from dsv4lab import model
    from dsv4lab.config import DSV4_FLASH as F
    from dsv4lab.kernels import topk

    def decode(impl, B, K):
        inp = testing.make_decode_inputs(B, 64, K, context=K, topk_len=True, sink=True, seed=0, device="cpu")
        return lambda: dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, topk_len=inp.topk_len,
                                             attn_sink=inp.attn_sink, impl=impl)

    def indexer(B):
        inp = testing.make_indexer_inputs(B, F.index_heads, 65536, seq_lens=8192, seed=0, device="cpu")
        return lambda: dsv4lab.indexer_topk(inp.q, inp.cache, inp.weights, inp.seq_lens, inp.page_table,
                                            max_seq_len=inp.max_seq_len, topk=512, impl="triton")

    def topk_alone(B, width):
        return lambda: topk.topk_triton(torch.zeros(B, width), torch.full((B,), 8192, dtype=torch.int32), 512)

    def moe():
        x = torch.zeros(2, 16, F.hidden, dtype=torch.bfloat16)
        w = torch.zeros(2, F.hidden, 2 * F.moe_intermediate, dtype=torch.bfloat16)
        return model.moe_grouped_gemm(x, w)

    def sinkhorn():
        n = F.hc_mult
        return model.mhc_sinkhorn(torch.zeros(32, (2 + n) * n), torch.ones(3), torch.zeros((2 + n) * n), n,
                                  F.hc_sinkhorn_iters, 1e-6)

    if which == "smoke":
        return {"mma B=1 K=512": decode("mma", 1, 512), "top-k B=1 width 65536": topk_alone(1, 65536)}
    if which == "ci":          # every kernel once, the decode tiles at both ends of B (tests/test_other_gpus.py)
        return {"simt B=1 K=512": decode("simt", 1, 512), "mma_story B=1 K=512": decode("mma_story", 1, 512),
                "mma B=1 K=512": decode("mma", 1, 512), "mma B=128 K=512": decode("mma", 128, 512),
                "splitk_auto B=1 K=512": decode("splitk_auto", 1, 512),
                "splitk_auto B=32 K=512": decode("splitk_auto", 32, 512),
                "sglang B=32 K=512": decode("sglang", 32, 512),
                "indexer_topk triton B=32 live 8192 max 65536": indexer(32),
                "top-k B=32 width 262208": topk_alone(32, 262208), "moe grouped GEMM": moe, "mHC sinkhorn": sinkhorn}
    out = {}
    for impl in DECODE_IMPLS:
        for B in (1, 8, 32, 128):
            out[f"{impl} B={B} K=512"] = decode(impl, B, 512)
    for impl in ("mma", "splitk_auto", "auto"):
        for B in (1, 32):
            out[f"{impl} B={B} K=128"] = decode(impl, B, 128)
    for B in (1, 32, 128):
        out[f"indexer_topk triton B={B} live 8192 max 65536"] = indexer(B)
    for width in (262208, 1048576):
        out[f"top-k B=32 width {width}"] = topk_alone(32, width)
    out["moe grouped GEMM"] = moe
    out["mHC sinkhorn"] = sinkhorn
    return out


def _key(c: compile_report.Captured) -> str:
    """What a compile depends on: the kernel and its specialized signature (compile_report.signature)."""
    sig, consts, attrs, options = compile_report.signature(c)
    return repr((c.name, sig, sorted(consts.items()), sorted(attrs.items()), sorted(options.items())))


def child(target_name: str, which: str) -> list:
    """Rows of one target (run in a process of its own: plans are cached per shape)."""
    target = compile_report.target_info(target_name)
    unique, rows = {}, []
    for label, thunk in calls(which).items():
        row = {"kind": "call", "target": target_name, "call": label}
        with compile_report.planned_for(target) as launches:
            try:
                thunk()
            except Exception as e:  # noqa: BLE001  (a call the package refuses here is a row, e.g. no sglang wheel)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        row["launches"] = [c.name for c in launches]
        rows.append(row)
        for c in launches:
            unique.setdefault(_key(c), (c, []))[1].append(label)
    for c, labels in unique.values():
        r = {"kind": "launch", "target": target_name, "calls": labels,
             **compile_report.captured_report(c, target)}
        print({k: r.get(k) for k in ("target", "kernel", "registers", "spill_stores", "shared_bytes", "smem_limit",
                                     "fits", "mma", "error")}, file=sys.stderr, flush=True)
        rows.append(r)
    return rows


def main(argv=None):
    a = ab.parse_args(__doc__, argv=argv, add=lambda p: (
        p.add_argument("--targets", nargs="+", choices=sorted(compile_report.TARGETS),
                       default=sorted(compile_report.TARGETS)),
        p.add_argument("--calls", choices=("full", "ci"), default="full",
                       help="full: every impl at B = 1, 8, 32, 128 (a few minutes a target); ci: each kernel once"),
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
             targets={n: compile_report.TARGETS[n] for n in targets}, rows=rows)


if __name__ == "__main__":
    main()
