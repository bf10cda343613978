"""The package on GPUs the lab has not measured (compile mode, no GPU): its launches are planned as
on each GPU and compiled for its architecture (compile_report.planned_launches); every kernel must
compile, ptxas must accept it, and its shared memory must fit what a block may use there (the study
with every impl at every B: experiments/other_gpus_compile)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: each kernel once, the decode tiles at both ends of B; run in a process of its own in compile mode
CHILD = """
import json, sys
import dsv4lab
from dsv4lab import compile_report as cr
calls = {"simt B=1 K=512": cr.decode_call("simt", 1, 512), "mma_story B=1 K=512": cr.decode_call("mma_story", 1, 512),
         "mma B=1 K=512": cr.decode_call("mma", 1, 512), "mma B=128 K=512": cr.decode_call("mma", 128, 512),
         "splitk_auto B=1 K=512": cr.decode_call("splitk_auto", 1, 512),
         "splitk_auto B=32 K=512": cr.decode_call("splitk_auto", 32, 512),
         "sglang B=32 K=512": cr.decode_call("sglang", 32, 512), "indexer_topk B=32": cr.indexer_call(32),
         "top-k B=32 width 262208": cr.topk_call(32, 262208), **cr.step_kernel_calls()}
json.dump(cr.planned_launches(sys.argv[1], calls), sys.stdout)
"""
#: one launch of each: the decode kernels (SIMT, the story's, the tuned, split-K's combine, the
#: guard), SGLang's, the indexer's logits and top-k, the model's two
KERNELS = {"_simt_decode_kernel", "_story_kernel", "_head_batched_kernel", "_combine_kernel", "_decode_guard_kernel",
           "_tiled_sparse_decode_kernel", "_indexer_kernel", "_topk_kernel", "_moe_grouped_gemm_kernel",
           "_mhc_sinkhorn_kernel"}


def compile_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(DSV4LAB_MODE="compile", PYTHONPATH=str(ROOT))
    return env


@pytest.mark.parametrize("target", ["B200", "RTX PRO 6000", "GB10", "L40S"])
def test_every_kernel_compiles_and_fits(target):
    r = subprocess.run([sys.executable, "-c", CHILD, target], env=compile_env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout)
    calls = [row for row in rows if row["kind"] == "call"]
    launches = [row for row in rows if row["kind"] == "launch"]
    assert calls and all("error" not in row for row in calls), [row for row in calls if "error" in row]
    assert {row["kernel"] for row in launches} == KERNELS
    for row in launches:
        assert row["compiled"] and row["ptxas_ok"], row
        assert row["shared_bytes"] <= row["smem_limit"] and row["fits"], row


def test_the_tile_table_entry_each_gpu_gets():
    code = ("from dsv4lab import compile_report as cr\nfrom dsv4lab.kernels.decode import planning\n"
            "for name in cr.TARGETS:\n"
            "    with cr.planned_for(cr.target_info(name)):\n"
            "        print(name, '|', planning._table_key('mma'), '|', planning.tile_config().block_h)\n")
    r = subprocess.run([sys.executable, "-c", code], env=compile_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line.split(" | ") for line in r.stdout.splitlines()]
    got = {name: key for name, key, _ in rows}
    # its own entry (H200), its family's (GB10: sm_121 -> sm_120), the ~99 KB entry where a block gets
    # less shared memory than the default needs (L40S), else the default (B200)
    assert got == {"H200": "9.0", "B200": "default", "RTX PRO 6000": "12.0", "GB10": "12.0", "L40S": "12.0"}
    # the ~99 KB GPUs get 16-head tiles, the others 64-head ones
    assert {name: int(h) for name, _, h in rows} == {"H200": 64, "B200": 64, "RTX PRO 6000": 16, "GB10": 16, "L40S": 16}


def test_planned_for_needs_compile_mode():
    from dsv4lab import compile_report
    with pytest.raises(RuntimeError, match="DSV4LAB_MODE=compile"):
        with compile_report.planned_for(compile_report.target_info("B200")):
            pass
