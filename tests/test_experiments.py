"""experiments/: every A/B study has a README, its data and its script; the scripts that run on the
current package run in their CPU smoke mode (tiny shapes, Triton's interpreter, no timings), the
ones kept for deleted variants say which commit of main's history they run at."""
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
#: first line of a script kept for variants the package no longer has (the commit is in main's history)
AT_COMMIT = re.compile(r"# Runs at commit ([0-9a-f]{40}) as (tools|experiments/\w+)/\w+\.py, not on the current package")
#: first line of a script kept only as the record of how its data was made (its variant is gone)
RECORD = re.compile(r"# Kept as a record: .* it does not run on the current package")
#: runnable scripts -> the arguments after OUT.json of their smoke run (None: no JSON of its own)
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
    "eager_host_path/host_python.py": ["--profile"],
    "eager_host_path/process_state.py": [],
    "eager_host_path/per_caller.py": [],
    "compute_sanitizer/run.py": [],
    "other_gpus_compile/run.py": [],
}
#: run in a process of their own: they compile (DSV4LAB_MODE=compile) instead of interpreting
COMPILE_MODE = ("compiler_resource_report/resources.py", "other_gpus_compile/sm120_tiles.py")


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


def test_every_script_is_runnable_or_kept_at_a_commit():
    for path in SCRIPTS:
        first = path.read_text().splitlines()[0]
        assert (rel(path) in RUNNABLE or rel(path) in (*COMPILE_MODE, "stall_reasons/profile_decode.py")
                or AT_COMMIT.match(first) or RECORD.match(first)), \
            f"{rel(path)}: neither a smoke-tested script nor kept at a commit nor marked as a record"
    for name in [*RUNNABLE, *COMPILE_MODE]:
        assert (EXP / name).exists(), name


@pytest.mark.parametrize("name", sorted(RUNNABLE))
def test_script_smoke_run(name, tmp_path):
    mod = load(EXP / name)
    out = tmp_path / "out.json"
    mod.main([str(out), "--cpu-smoke", *RUNNABLE[name]])
    check_smoke_json(out, name.split("/")[0])


def test_ncu_target_smoke_run():
    out, lse = load(EXP / "stall_reasons/profile_decode.py").target("mma", 2, "16,16,4,1,registers", smoke=True)
    assert out.shape == (2, 4, 512) and bool(out.float().isfinite().all())


def test_stall_summary_from_ncu_csv():
    sp = load(EXP / "stall_reasons/stall_profile.py")
    row = sp.summarize(sp.SAMPLE_SOURCE, sp.SAMPLE_DETAILS, "64,128,8,1,l2_hint", 128)
    assert row["stall_share"] == pytest.approx({"long_sb": 6 / 13, "barrier": 5 / 13, "wait": 2 / 13}, abs=1e-4)
    assert row["stall_by_opcode"] == pytest.approx({"LDG": 7 / 13, "HGMMA": 3 / 13, "WARPGROUP": 3 / 13}, abs=1e-4)
    assert row["hot_sass"][0]["sass"].startswith("LDG") and row["duration_us"] == 65.89 and row["registers"] == 255


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
    for path in folder.glob("*.py"):
        m = AT_COMMIT.match(path.read_text().splitlines()[0])
        if m:                                 # a kept script: its README says how to check out the commit
            assert f"git checkout {m.group(1)}" in text, f"{folder.name}/README.md: no 'git checkout {m.group(1)}'"
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
