"""Notebooks 06-07's widgets: the stage-pair explorer at a grid that puts every stage on both sides
at every recorded concurrency (each setting also runs both stages' tiny step now and compares their
logits), and the story-vs-lab view at every figure of the table."""
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
    table = report.story_vs_lab_table()
    changes = 0
    for figure in table["figure"]:
        row = widgets.story_row_view(table, figure)
        assert row["figure"] == figure
        changes += row["story x"] == row["story x"] and row["lab x"] == row["lab x"]
    assert len(no_show) == changes > 0
    out = capsys.readouterr().out
    assert out.count("why they differ:") == len(table)
    with pytest.raises(ValueError, match="figure must be one of"):
        widgets.story_row_view(table, "no such figure")
    widgets.explore_story_vs_lab(table)
