"""Notebooks 06-07's widgets: the stage-pair explorer at a grid that puts every stage on both sides
at every recorded concurrency (each setting also runs both stages' tiny step now and compares their
logits), the story-vs-lab view at every figure of the table, and the sensitivity view (the cost model
of dsv4lab.bridge over a replay's recorded per-layer costs) at every setting of each of its knobs (the
ratio-4 layer count at nine of them)."""
import dsv4lab  # noqa: F401  (first: sets the mode before anything imports triton)
import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dsv4lab import report, runs, widgets  # noqa: E402

REC = runs.replay()
STAGES = list(REC["stages"])
PAIRS = [(a, STAGES[(i + 1) % len(STAGES)]) for i, a in enumerate(STAGES)]


@pytest.fixture
def no_show(monkeypatch):
    """Count the figures the views draw, and close them (no display in tests)."""
    shown = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: (shown.append(plt.gcf()), plt.close("all")))
    return shown


@pytest.mark.parametrize("C", [int(c) for c in REC["concurrency"]])
def test_stage_pair_view_every_stage_at_every_concurrency(C, no_show, capsys):
    for before, after in PAIRS:
        got = widgets.stage_pair_view(REC, before, after, C)
        for name, row in ((before, got["before"]), (after, got["after"])):
            recorded = next(r for r in REC["stages"][name]["steps"] if r["C"] == C)
            assert row["step_ms"] == recorded["step_ms"], (name, C)
        assert str(got["profiled_C"]) in REC["stages"][before]["profiles"]
        assert got["live"]["ok"], (before, after, C, got["live"])
        assert got["live"]["B"] == widgets.tiny_batch(C)
    out = capsys.readouterr().out
    assert "NOT the same step" not in out and f"at C={C}" in out
    assert len(no_show) == len(PAIRS)


def test_explore_stages_builds_at_the_profiled_batch(no_show):
    ui = widgets.explore_stages(REC)
    assert [c.value for c in ui.children[:3]] == [STAGES[0], STAGES[1], REC["profile_batch"]]


def test_story_row_view_every_figure(no_show, capsys):
    """Every figure of the table: a bridged one gets its bridge computed from the record (the product of
    its factors is the lab's measurement, whichever GPU the story's figures are taken to come from), any
    other change its two factors and their ratio; every row prints its reasons."""
    from dsv4lab import bridge
    table = report.story_vs_lab_table()
    assert set(widgets.BRIDGED) <= set(table["figure"]), "a bridged figure was renamed in story_vs_lab_table"
    drawn = 0
    for figure in table["figure"]:
        row = widgets.story_row_view(table, figure, REC)
        assert row["figure"] == figure
        if figure in widgets.BRIDGED:
            assert row["product"] == pytest.approx(row["measured"])
            recorded = REC["factors"][widgets.BRIDGED[figure]]["factors"]              # the record's bridge, recomputed
            assert [(r["factor"], r["source"]) for r in row["bridge"]] == [(r["factor"], r["source"]) for r in recorded]
            assert [r["value"] for r in row["bridge"]] == pytest.approx([r["value"] for r in recorded])
        elif row["story x"] == row["story x"] and row["lab x"] == row["lab x"]:
            assert row["lab_over_story"] == pytest.approx(row["lab x"] / row["story x"])
        else:
            continue
        drawn += 1
    assert len(no_show) == drawn > len(widgets.BRIDGED)
    out = capsys.readouterr().out
    assert out.count("why they differ:") == len(table)
    for gpu in widgets.bridge_gpus():
        row = widgets.story_row_view(table, "sparse-MLA decode kernel time, in the model", REC, gpu)
        gpu_factor = next(r["value"] for r in row["bridge"] if r["factor"] == "GPU factor")
        assert row["product"] == pytest.approx(row["measured"]) and row["story_gpu"] == gpu
        if gpu == REC["environment"]["device"]["name"]:
            assert gpu_factor == pytest.approx(1.0)           # the same GPU on both sides: nothing to move
        if gpu == bridge.STORY_GPU:
            assert gpu_factor == pytest.approx(by_factor(REC, "GPU factor"))
    with pytest.raises(ValueError, match="figure must be one of"):
        widgets.story_row_view(table, "no such figure")
    ui = widgets.explore_story_vs_lab(table, REC)
    assert [c.value for c in ui.children[:2]] == [next(iter(widgets.BRIDGED)), bridge.STORY_GPU]


def by_factor(rec, name):
    return next(r["value"] for r in rec["factors"]["step"]["factors"] if r["factor"] == name)


# ---- notebook 07's sensitivity widget: the cost model over a replay's recorded per-layer costs ------

def _with_sensitivity():
    """A run with recorded costs: test_bridge's synthetic GPU-shaped run (known costs), and every
    recorded replay that carries a sensitivity."""
    from test_bridge import synthetic_run

    from dsv4lab import bridge
    syn = synthetic_run()
    syn["sensitivity"] = bridge.sensitivity(syn)
    out = [pytest.param("synthetic", syn, id="synthetic")]
    for run in runs.replays():
        rec = runs.replay(run)
        if isinstance(rec.get("sensitivity", {}).get("costs"), dict):
            out.append(pytest.param(run, rec, id=run))
    return out


@pytest.mark.parametrize("name, res", _with_sensitivity())
def test_sensitivity_view_every_setting_of_each_knob(name, res, no_show, capsys):
    from dsv4lab import bridge
    cfg, costs = res["config"], res["sensitivity"]["costs"]
    opts = widgets.sensitivity_options(res)
    own = dict(ratio4=cfg["layers_c4"], live=cfg["live_context"], max_context=cfg["max_context"])
    assert all(own[k] in opts[k] for k in own)
    # at the replay's own setting the view gives back what the run wrote as its setting
    got = widgets.sensitivity_view(res, **own)
    for k, v in res["sensitivity"]["replay_setting"].items():
        assert got[k] == pytest.approx(v), k
    assert "the replay's own setting" in capsys.readouterr().out
    views = 1
    for knob, values in opts.items():
        if len(values) > 9:                                   # 0..41 ratio-4 layers: the ends, the run's own, 6 between
            values = sorted({values[0], values[-1], own[knob], *values[::-(-len(values) // 6)]})
        for v in values:
            at = dict(own, **{knob: v})
            got = widgets.sensitivity_view(res, **at)
            if at["live"] > at["max_context"]:
                assert "error" in got and "cannot exceed" in capsys.readouterr().out
                continue
            views += 1
            want = bridge.predict(costs, res, **at)
            assert got["attention_speedup"] == pytest.approx(want["attention_speedup"])
            assert got["c1_change_pct"] == pytest.approx(want["c1_change_pct"])
    assert len(no_show) == views
    ui = widgets.explore_sensitivity(res)
    assert [c.value for c in ui.children[:3]] == [own["ratio4"], own["live"], own["max_context"]]


def test_sensitivity_grid_and_a_run_without_costs():
    from test_bridge import synthetic_run

    from dsv4lab import bridge
    res = synthetic_run()
    res["sensitivity"] = bridge.sensitivity(res)
    grid = widgets.sensitivity_grid(res, ratio4=[0, 21], live=[8192, 131072], max_context=[8192, 1048576])
    assert len(grid) == 2 * 3                                   # 131072 live tokens do not fit a max of 8192
    one = grid[(grid.ratio4 == 21) & (grid.live == 8192) & (grid.max_context == 1048576)].iloc[0]
    assert one.attention_speedup == pytest.approx(res["sensitivity"]["replay_setting"]["attention_speedup"])
    fit = res["sensitivity"]["story_fit"]
    best = widgets.sensitivity_grid(res, [fit["ratio4"]], [fit["live"]], [fit["max_context"]]).iloc[0]
    assert best.story_share_miss_pts == pytest.approx(fit["largest_miss_pts"])
    old = runs.replay()
    if "sensitivity" not in old:                              # a replay recorded before the sensitivity
        with pytest.raises(ValueError, match="no recorded per-layer costs"):
            widgets.explore_sensitivity(old)
    with pytest.raises(ValueError, match="no recorded per-layer costs"):
        widgets.sensitivity_view(dict(res, sensitivity=dict(note="needs the stages")), 1, 8192, 1048576)


@pytest.mark.parametrize("run", runs.replays())
def test_story_vs_lab_table_of_every_replay_with_the_kernel_runs_of_h200(run):
    """Notebook 07 reads a replay recorded in a folder of its own (data/runs/<run>/reproduce) beside the
    kernels' recorded runs of another (kernel_run): every figure gets a row, and the kernel-alone row
    reads kernel_run's decode table."""
    table = report.story_vs_lab_table(run, kernel_run="h200")
    assert len(table) == len(report.story_vs_lab_table()) and (table["why they differ"].str.len() > 0).all()
    B = runs.replay(run)["profile_batch"]
    sg = runs.table("decode", "h200").pivot_table(index="B", columns="impl", values="graph_us").loc[B, "sglang"]
    row = table[table.figure.str.startswith("sparse-MLA decode, the kernel alone")].iloc[0]
    assert f"SGLang's kernel {sg:.0f} us per call" in row["lab"]
