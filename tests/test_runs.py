"""The recorded runs under data/runs/ carry their provenance, and dsv4lab.runs reads them."""
import json
from pathlib import Path

import pandas as pd
import pytest

from dsv4lab import runs
from dsv4lab import record

RUN_FILES = sorted(p for p in (Path(__file__).resolve().parent.parent / "data" / "runs").glob("*/*.json")
                   if p.name != "manifest.json")


def test_there_are_recorded_runs():
    assert RUN_FILES, "no recorded run under data/runs/"
    assert "h200" in runs.available()


@pytest.mark.parametrize("path", RUN_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_recorded_json_has_provenance(path):
    d = json.loads(path.read_text())
    assert isinstance(d.get("date"), str) and d["date"][:4].isdigit()
    dev = d["device"]
    assert dev["name"] and isinstance(dev["sm_count"], int) and dev["sm_count"] > 0
    assert isinstance(dev["capability"], str) and "." in dev["capability"]
    assert d["torch"] and d["triton"]
    if path.stem in ("device", "checks", "decode", "tiles", "split"):   # the recorded run measures its ceilings
        c = d["ceilings"]
        assert c["copy_tb_s"] > 0 and c["bf16_tflops"] > 0


@pytest.mark.parametrize("part", ["checks", "decode", "tiles", "split"])
def test_table_loads_rows(part):
    df = runs.table(part)
    assert isinstance(df, pd.DataFrame) and len(df) > 0
    assert len(df) == len(runs.load(part)["rows"])


def test_decode_table_columns():
    df = runs.table("decode")
    assert {"impl", "B", "graph_us", "eager_us"} <= set(df.columns)
    assert {"simt", "sglang", "mma", "splitk", "splitk_auto"} <= set(df["impl"])


def test_ceilings_and_provenance():
    c = runs.ceilings()
    assert c.ridge_flop_per_byte > 0
    line = runs.provenance("decode")
    assert "RECORDED" in line and runs.load("decode")["device"]["name"] in line


def test_tile_choice_is_a_config():
    for use in ("mma", "split"):
        cfg = runs.tile_choice(use)
        assert {"block_h", "block_n", "num_warps", "num_stages"} <= set(cfg)


@pytest.mark.parametrize("name", ["story_profile", "throughput", "story_facts.csv"])
def test_campaign_tables(name):
    assert len(runs.campaign(name)) > 0


def test_clear_errors():
    with pytest.raises(FileNotFoundError, match="available"):
        runs.load("decode", run="no-such-run")
    with pytest.raises(FileNotFoundError, match="no part"):
        runs.load("no-such-part")
    with pytest.raises(KeyError, match="no rows"):
        runs.table("device")
    with pytest.raises(FileNotFoundError, match="campaign"):
        runs.campaign("nope")


def test_missing_data_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(runs, "_DATA", [tmp_path / "absent"])
    with pytest.raises(FileNotFoundError, match="use_data_dir"):
        runs.available()


def test_select_rows_of_the_chosen_split_config():
    sp = runs.table("split")
    rows = runs.select(sp, runs.tile_choice("split"))
    assert len(rows) > 0 and rows["B"].nunique() > 1


def test_trace_table_accounts_for_the_graph_time():
    """The recorded program clocks hang together: a program's loop fits inside the program, the
    program inside the span, the span inside the (traced) graph replay; B=128 used 128 SMs."""
    from dsv4lab import runs
    tt = runs.trace_table()
    assert {"splitk", "mma"} <= set(tt.case)
    assert (tt.outside_kernels_us > 0).all()
    assert (tt.loop_us < tt.program_us).all() and (tt.program_us <= tt.span_us + 1e-9).all()
    assert (tt[tt.B == 128].sms == 128).all()
    split = tt[tt.case == "splitk"]
    assert split.gap_to_combine_us.notna().all() and split.combine_us.notna().all()


def test_select_compares_the_dequant_on_whole_row_launches_only():
    # sweep rows record what ran; split launches run "cvt" whatever the entry says, so a "bits"
    # entry's rows are its whole-row launches plus every split launch of its tiles
    df = pd.DataFrame([dict(block_h=64, block_n=128, nsplit=1, dequant="bits", fold_scale=True, us=1.0),
                       dict(block_h=64, block_n=128, nsplit=1, dequant="cvt", fold_scale=False, us=2.0),
                       dict(block_h=64, block_n=128, nsplit=2, dequant="cvt", fold_scale=False, us=3.0),
                       dict(block_h=16, block_n=64, nsplit=2, dequant="cvt", fold_scale=False, us=4.0)])
    bits = dict(block_h=64, block_n=128, dequant="bits", fold_scale=True)
    assert sorted(runs.select(df, bits).us) == [1.0, 3.0]
    assert sorted(runs.select(df, {**bits, "dequant": "cvt", "fold_scale": False}).us) == [2.0, 3.0]
    tiles = df[df.nsplit == 1].drop(columns="nsplit")        # a tile sweep: no nsplit column
    assert list(runs.select(tiles, bits).us) == [1.0]


def test_a_sweep_row_times_live_with_the_dequant_it_ran():
    # the widgets' live timing rebuilds a row's TileConfig: a "bits" row must not be re-timed as "cvt"
    from dsv4lab import widgets
    row = dict(block_h=64, block_n=128, num_warps=8, num_stages=1, prefetch=5)
    bits = widgets._tile_config({**row, "dequant": "bits", "fold_scale": True})
    assert (bits.dequant, bits.fold_scale, bits.loop) == ("bits", True, "l2_hint")
    old = widgets._tile_config(pd.Series({**row, "dequant": float("nan"), "fold_scale": float("nan")}))
    assert (old.dequant, old.fold_scale) == ("cvt", False)             # recorded before the keys: cvt


@pytest.mark.parametrize("folder", sorted({p.parent for p in RUN_FILES}), ids=lambda p: p.name)
def test_manifest_lists_every_recorded_part(folder):
    """manifest.json (record.write_manifest) names every JSON of the run with the file's own date,
    device and versions, and every entry's file exists."""
    man = json.loads((folder / "manifest.json").read_text())
    files = {p.name for p in folder.glob("*.json")} - {"manifest.json"}
    assert {e["file"] for e in man.values() if "/" not in e["file"]} == files
    for part, e in man.items():
        d = json.loads((folder / e["file"]).read_text())
        d = d.get("environment", d)                  # the replay keeps its stamp under "environment"
        assert e["file"] in (f"{part}.json", f"{part}/{part}.json") and e["date"] == d["date"]
        assert (e["device"], e["torch"], e["triton"]) == (d["device"]["name"], d["torch"], d["triton"])
        assert e["command"] and e["read_by"]


def test_write_manifest_adds_and_replaces_entries(tmp_path):
    payload = {"date": "2026-01-01T00:00:00+00:00", "device": {"name": "GPU"}, "torch": "t", "triton": "tr"}
    record.write_manifest(tmp_path, "decode", payload, "cmd 1")
    record.write_manifest(tmp_path, "tiles", payload, "cmd 2")
    record.write_manifest(tmp_path, "decode", {**payload, "date": "2026-01-02T00:00:00+00:00"}, "cmd 3")
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert list(man) == ["decode", "tiles"]
    assert man["decode"]["date"].startswith("2026-01-02") and man["decode"]["command"] == "cmd 3"
    assert man["tiles"]["read_by"] == record.PART_READERS["tiles"]


def test_experiment_data_loads():
    names = runs.experiment_names()
    assert "trace_decode" in names["program_clocks"] and "pdl_on/ab_pdl" in names["pdl_for_the_combine"]
    d = runs.experiment("pdl_for_the_combine", "pdl_on/ab_pdl.json")
    assert d["rows"] and d["device"]["name"]
    df = runs.experiment_table("in_graph_timing", "ab_layers2")
    assert {"kind", "variant", "graph_us", "graph_layer_us"} <= set(df.columns)
    assert "experiments/in_graph_timing/ab_layers2.json" in runs.experiment_provenance("in_graph_timing", "ab_layers2")


def test_experiment_errors_list_what_exists():
    with pytest.raises(FileNotFoundError, match="program_clocks"):
        runs.experiment("no_such_question", "x")
    with pytest.raises(FileNotFoundError, match="trace_decode"):
        runs.experiment("program_clocks", "no_such_file")
    with pytest.raises(FileNotFoundError, match="has no data file"):
        runs.experiment("program_clocks", "../../data/runs/h200/decode")
    with pytest.raises(KeyError, match="no list 'rows'"):
        runs.experiment_table("program_clocks", "trace_decode")


REPLAY = Path(__file__).resolve().parent.parent / "data" / "runs" / "h200" / "reproduce" / "reproduce.json"


@pytest.mark.skipif(not REPLAY.exists(), reason="no recorded replay committed (python -m dsv4lab reproduce)")
def test_replay_readers():
    d = runs.replay()
    assert set(d["tables"]) >= {"throughput", "profile", "glue_ops"}
    glue = runs.replay_table("glue_ops")
    assert {"stage", "op", "us", "share"} <= set(glue.columns)
    g = runs.replay_glue("S0")
    assert g["C"] == d["profile_batch"] and g["total_us"] > 0 and len(g["ops"])
    assert g["ops"].share.sum() == pytest.approx(1.0, abs=0.05)      # the top ops of the glue + FP32 GEMM set
    assert any(r.startswith("dsv4::indexer[") for r in g["region_us"])
    with pytest.raises(KeyError, match="no table 'nope'"):
        runs.replay_table("nope")
    with pytest.raises(KeyError, match="no eager step of stage 'S9'"):
        runs.replay_glue("S9")


def test_optional_prints_one_line_for_what_is_missing(capsys):
    assert runs.optional(runs.replay, "no-such-run") is None
    assert runs.optional(runs.table, "device") is None                # a KeyError: the part has no rows
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("not recorded here: ") for line in out)
    assert "no recorded replay" in out[0] and "no rows" in out[1]
    assert runs.optional(runs.table, "decode") is not None             # present: the reader's result


def test_latest_experiment_picks_the_newest_date(monkeypatch, tmp_path):
    folder = tmp_path / "experiments" / "q"
    folder.mkdir(parents=True)
    (tmp_path / "data").mkdir()
    for name, date in (("h200_run1", "2026-01-03T00:00:00+00:00"), ("h200_run2", "2026-01-02T00:00:00+00:00"),
                       ("h200_run10", "2026-01-05T00:00:00+00:00"), ("cpu", "2026-01-09T00:00:00+00:00")):
        (folder / f"{name}.json").write_text(json.dumps({"date": date}))
    monkeypatch.setattr(runs, "_DATA", [tmp_path / "data"])
    assert runs.latest_experiment("q", "h200_run") == "h200_run10"
    assert runs.latest_experiment("q") == "cpu"
    with pytest.raises(FileNotFoundError, match=r"no data file named gpu\*"):
        runs.latest_experiment("q", "gpu")


def test_story_glue_ops():
    ops = runs.story_glue_ops()
    assert list(ops)[:2] == ["aten::copy_", "aten::mul"] and all(op.startswith("aten::") for op in ops)
    text = runs.campaign("story_facts").set_index("figure").value["glue breakdown (op share of glue)"]
    assert all(f"{v:g}%" in text for v in ops.values())


def test_every_recorded_replay_reads_and_names_its_device():
    """Each data/runs/<run>/reproduce/ holds a whole replay on the device its folder names: every
    stage it ran at every C it lists, each step finite, no stage skipped (a record that ran short of
    time may lack its torch.compile lessons, and says so), not the CPU preset."""
    names = runs.replays()
    assert names[0] == runs.REPLAY_RUN and {"h100", "h200"} <= set(names)
    for run in names:
        d = runs.replay(run)
        assert run.upper() in d["environment"]["device"]["name"].replace(" ", "").upper()
        assert not d["quick"] and all(s["part"].startswith("compile lesson") for s in d["skipped"]), run
        tp = pd.DataFrame(d["tables"]["throughput"])
        stages = {s["name"] for s in d["stages_run"]}
        assert stages >= {"S0", "S1", "S2", "S3", "S4"} and set(tp.stage) == stages, run
        grid = tp.pivot(index="stage", columns="C", values="tok_s")
        assert len(tp) == len(stages) * len(d["concurrency"]) and set(grid.columns) == set(d["concurrency"])
        assert grid.notna().all().all() and (grid > 0).all().all() and tp.finite.all(), run


def test_the_recorded_indexer_step_has_its_checks_and_targets():
    """data/runs/h200/indexer_step.json (notebook 05, the README): a whole run on an H200, every
    check exact, the safety case flagged, every target's verdict consistent with its value, and
    the same file as the study's run it was copied from."""
    d = runs.load("indexer_step")
    assert "H200" in d["device"]["name"] and d["complete"] and not d["smoke"]
    rows = pd.DataFrame(d["rows"])
    checks = rows[rows.kind == "check"]
    assert len(checks) >= 3 and checks.ok.all() and checks.exact.all()
    assert rows[rows.kind == "safety"].ok.all() and (rows.kind == "safety").any()
    targets = rows[rows.kind == "target"]
    assert len(targets) >= 8
    for r in targets.itertuples():
        holds = r.value <= r.target if r.cmp == "<=" else r.value >= r.target
        assert holds == bool(r.meets), r.metric
    study = runs.experiments_dir() / "indexer_topk" / "h200_run23.json"
    assert json.loads(study.read_text()) == d
