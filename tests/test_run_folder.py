"""The main job's output never lies about itself (dsv4lab.run_folder): a folder is one whole run or
visibly incomplete, even when the run is killed; two runs never write one folder at once; every
reader checks; arguments a CPU accepts are planned the same way on a GPU."""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from dsv4lab import replay, run_folder, runs
from dsv4lab.__main__ import main as cli
from dsv4lab.model import DSV4_FLASH_TP8


def _fake_run(folder: Path, run_id: str, text: str = "a"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tables.md").write_text(text)
    d = dict(run_id=run_id, output=run_folder.manifest(folder, ["tables.md"], run_id))
    (folder / "reproduce.json").write_text(json.dumps(d))


@pytest.mark.parametrize("bad", ["", "  ", ".", "..", "./"])
def test_an_out_that_is_nothing_or_the_working_folder_is_refused(bad):
    with pytest.raises(ValueError, match="--out must"):
        run_folder.check_out(bad)
    assert cli(["reproduce", "--quick", "--out", bad]) == 2


def test_an_out_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "x"
    f.write_text("")
    with pytest.raises(ValueError, match="must be a folder"):
        run_folder.check_out(f)


def test_a_failed_run_leaves_the_old_folder_whole_and_its_own_visibly_partial(tmp_path):
    out = tmp_path / "rep"
    _fake_run(out, "first")
    with pytest.raises(RuntimeError):
        with run_folder.writing(out) as stage:
            (stage / "reproduce.json").write_text(json.dumps({"run_id": "second"}))
            raise RuntimeError("killed midway")
    assert run_folder.verify(out)["run_id"] == "first"
    partial = [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    assert len(partial) == 1
    with pytest.raises(run_folder.IncompleteRun, match="did not finish"):
        run_folder.verify(partial[0])


def test_a_finished_run_replaces_the_folder_whole(tmp_path):
    out = tmp_path / "rep"
    _fake_run(out, "first")
    (out / "stale.csv").write_text("from the first run")
    with run_folder.writing(out) as stage:
        _fake_run(stage, "second", "b")
    assert run_folder.verify(out)["run_id"] == "second" and not (out / "stale.csv").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".rep.") and p.is_dir()] == []


def test_two_writers_of_one_folder_are_refused(tmp_path):
    out = tmp_path / "rep"
    with run_folder.writing(out):
        with pytest.raises(ValueError, match="another run is writing"):
            with run_folder.writing(out):
                pass
    with run_folder.writing(out) as stage:                  # the lock went with the first writer
        _fake_run(stage, "third")


def test_a_file_from_another_run_is_caught_by_every_reader(tmp_path, monkeypatch):
    out = tmp_path / "runs" / "x" / "reproduce"
    _fake_run(out, "first")
    run_folder.verify(out)
    (out / "tables.md").write_text("from another run")
    with pytest.raises(run_folder.IncompleteRun, match="tables.md not what run first wrote"):
        run_folder.verify(out)
    monkeypatch.setattr(runs, "data_dir", lambda: tmp_path)
    with pytest.raises(run_folder.IncompleteRun):
        runs.replay("x")


def test_the_committed_replays_are_whole():
    for run in runs.replays():
        assert runs.replay(run)["output"]["complete"]


def _wait_for(path: Path, proc, timeout=300):
    t = time.time()
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() - t < timeout
        time.sleep(0.5)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("killed") / "rep"
    assert cli(["reproduce", "--quick", "--stages", "S4", "--no-compile", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_run_killed_midway_leaves_the_previous_run_whole(finished_run, sig):
    """A second run into the same folder, killed once its first stage is saved: the folder still holds
    the first run, whole; what the killed run wrote is in a folder named partial, and says so."""
    first = run_folder.verify(finished_run)["run_id"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "dsv4lab", "reproduce", "--quick", "--stages", "S4", "S0",
                             "--no-compile", "--out", str(finished_run)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    partial = finished_run.parent / f".{finished_run.name}.partial-{proc.pid}"
    _wait_for(partial / "reproduce.json", proc)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    assert proc.returncode != 0
    assert run_folder.verify(finished_run)["run_id"] == first
    with pytest.raises(run_folder.IncompleteRun):
        run_folder.verify(partial)


@settings(max_examples=40, deadline=None)
@given(window=st.integers(0, 3), c4=st.integers(0, 3), c128=st.integers(0, 3),
       live=st.sampled_from([256, 2048, 8192]))
def test_the_gpu_plan_takes_every_config_the_cpu_takes(window, c4, c128, live):
    """The budget a GPU run plans first is built from the same configurations its parts build: a layer
    mix or context the CPU run accepts never fails there (e.g. --layers 1 0 0)."""
    try:
        cfg = replace(DSV4_FLASH_TP8, layers_window=window, layers_c4=c4, layers_c128=c128, live_context=live)
    except ValueError:
        return                                                # refused up front, on every machine alike
    todo = [replay.stage_for(s, cfg) for s in replay.STAGES]
    counts = replay.glue_scaling_counts(cfg, replay.GLUE_SCALING_COUNTS)
    plan = replay.budget_plan(cfg, todo, replay.CONCURRENCY, (1, replay.PROFILE_BATCH), counts, True)
    assert all(v >= 0 for v in plan["stages_s"].values()) and plan["glue_scaling_s"] >= 0
    assert all(n <= c4 + c128 for n in counts)


def test_a_model_without_compressed_layers_runs_end_to_end(tmp_path):
    """--layers 1 0 0: no ratio-4 or ratio-128 layer; every part runs or says why it cannot."""
    out = tmp_path / "rep"
    assert cli(["reproduce", "--quick", "--layers", "1", "0", "0", "--stages", "S0", "S1", "S0cap",
                "--out", str(out)]) == 0
    d = run_folder.verify(out)
    assert "note" in d["factors"] and "note" in d["sensitivity"]
