"""experiments/: every A/B study has a README, its data and, where its script still runs on the current
package, the script; every script runs here in its CPU smoke mode (tiny shapes, Triton's interpreter, no
timings). A study whose script no longer runs keeps its README and data, and the README names the commit
of main's history that holds the script. No other test imports from experiments/."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXP = ROOT / "experiments"
FOLDERS = sorted(p for p in EXP.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
SCRIPTS = sorted(EXP.glob("*/*.py"))
#: the scripts -> the arguments after OUT.json of their smoke run
RUNNABLE = {
    "batch1_split_k_speedup/b1_ratio.py": [],
    "combine_launch_shape/combine_shape.py": [],
    "fp8_dequant_by_integer_ops/dequant.py": [],
    "hopper_decode/run.py": [],
    "hopper_decode/clocks.py": [],
    "hopper_decode/gather_roofline.py": [],
    "hopper_decode/cluster_probe.py": [],
    "hopper_decode/stalls.py": [],
    "indexer_page_loop/indexer_sweep.py": [],
    "indexer_topk/run.py": [],
    "indexer_topk/lean.py": [],
    "indexer_selection_quality/quality.py": [],
    "kernel_loop_prefetch/loops.py": [],
    "pdl_for_the_combine/pdl.py": [],
    "split_partials_dtype/partials.py": [],
    "split_sweep/split_sweep.py": [],
    "stall_reasons/stall_profile.py": ["mma", "128", "16,16,4,1,l2_hint"],
    "tile_sweep/tile_sweep.py": [],
    "sglang_patch/run.py": ["--cpu-smoke"],
    "eager_host_path/run.py": [],
    "s5_fused_glue/moe_launch.py": [],
    "s5_fused_glue/step_s4_vs_s5.py": [],
    "eager_host_path/host_python.py": ["--profile"],
    "eager_host_path/process_state.py": [],
    "eager_host_path/per_caller.py": [],
    "compute_sanitizer/run.py": [],
    "other_gpus_compile/run.py": [],
    "s5_fused_glue/per_op.py": [],
}
#: run in a process of their own: they compile (DSV4LAB_MODE=compile) instead of interpreting
COMPILE_MODE = ("compiler_resource_report/resources.py", "other_gpus_compile/sm120_tiles.py")
#: run by another script's smoke run (ncu's target: stall_profile.py's smoke run runs it once)
RUN_BY = {"stall_reasons/profile_decode.py": "stall_reasons/stall_profile.py"}


def rel(p: Path) -> str:
    return p.relative_to(EXP).as_posix()


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"experiment_{path.parent.name}_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_smoke_json(path: Path, question: str):
    d = json.loads(path.read_text())
    assert d["experiment"] == question and d["smoke"] is True and d.get("complete", True) is True
    assert d["rows"], "a smoke run writes its rows"
    for row in d["rows"]:
        assert "error" not in row, row
        assert row.get("ok", True) is True, row


def test_every_script_runs_in_the_smoke_test():
    for path in SCRIPTS:
        assert rel(path) in (*RUNNABLE, *COMPILE_MODE, *RUN_BY), \
            f"{rel(path)}: not smoke-tested; a script that no longer runs leaves the tree (its README names the commit)"
    for name in [*RUNNABLE, *COMPILE_MODE, *RUN_BY]:
        assert (EXP / name).exists(), name


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_script_smoke_run(name, tmp_path):
    mod = load(EXP / name)
    out = tmp_path / "out.json"
    mod.main([str(out), "--cpu-smoke", *RUNNABLE[name]])
    check_smoke_json(out, name.split("/")[0])


@pytest.mark.parametrize("name", COMPILE_MODE)
def test_compile_report_smoke_run(name, tmp_path):
    load(EXP / name)                          # importable in this (interpreter) process
    out = tmp_path / "out.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(DSV4LAB_MODE="compile", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, str(EXP / name), str(out), "--cpu-smoke"], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    check_smoke_json(out, name.split("/")[0])
    row = json.loads(out.read_text())["rows"][0]
    assert row["ptxas_ok"] and row["registers"] > 0 and row["mma"]


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_readme_names_its_files_and_how_to_rerun(folder):
    text = (folder / "README.md").read_text()
    assert text.startswith("# ") and "## Question" in text and "## Decision" in text
    for f in folder.rglob("*"):
        if f.is_file() and f.name != "README.md" and "__pycache__" not in f.parts:
            assert f.relative_to(folder).as_posix() in text, f"{folder.name}/README.md does not name {f.name}"
    # tags do not travel with a clone: a README checks out commits
    assert not re.findall(r"git checkout (?![0-9a-f]{40}\b)\S+", text), f"{folder.name}: check out a full commit hash"


def _history():
    """Every commit reachable from HEAD, or None where there is no full history to ask."""
    try:
        git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=True).stdout
        if git("rev-parse", "--is-shallow-repository").strip() != "false":
            return None
        return set(git("rev-list", "HEAD").split())
    except (OSError, subprocess.CalledProcessError):
        return None


def test_every_commit_an_experiment_names_is_in_mains_history():
    history = _history()
    if history is None:
        pytest.skip("no full git history here (not a clone, or a shallow one)")
    files = [*EXP.glob("*/README.md"), EXP / "README.md", *SCRIPTS]
    named = {(h, f.relative_to(EXP).as_posix()) for f in files for h in re.findall(r"\b[0-9a-f]{40}\b", f.read_text())}
    assert named, "the experiments name commits"
    missing = sorted(f"{f}: {h}" for h, f in named if h not in history)
    assert not missing, "named commits that a clone of main does not have: " + ", ".join(missing)


def test_index_lists_every_experiment():
    index = (EXP / "README.md").read_text()
    for folder in FOLDERS:
        assert f"[{folder.name}]({folder.name}/)" in index, folder.name


@pytest.mark.parametrize("path", sorted(EXP.rglob("*.json")), ids=rel)
def test_experiment_json_has_provenance(path):
    d = json.loads(path.read_text())
    assert isinstance(d.get("date"), str) and d["date"][:4].isdigit()
    assert d["device"]["name"] and d["torch"] and d["triton"]
    if d["device"].get("mode") == "cuda":              # compile and interpreter runs have no SMs
        assert isinstance(d["device"]["sm_count"], int) and d["device"]["sm_count"] > 0
    else:
        assert d["device"].get("mode") in ("compile", "interpret"), d["device"]
