"""Notebook 08's widget at every recorded batch: the recorded times it shows are the run's, the
launch and model follow hopper's split rule, and the live check runs the Hopper kernel itself where
this process can (an sm_90 GPU), else says why not and checks what auto runs in its place."""
import dsv4lab  # noqa: F401  (first: sets the mode before anything imports triton)
import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dsv4lab import report, roofline, runs, widgets  # noqa: E402
from dsv4lab.config import DSV4_FLASH  # noqa: E402
from dsv4lab.registry import impl_info  # noqa: E402

# the run the notebook reads, and run 1, whose split-K rows still carry their old name (auto)
TIMES = report.hopper_time_rows(runs.experiment("hopper_decode", report.HOPPER_RUN)).astype({"B": int})
OLD = report.hopper_time_rows(runs.experiment("hopper_decode", "h200_run1")).astype({"B": int})
CEIL = runs.ceilings()
BUDGET = roofline.hopper_tile_budget()


@pytest.fixture
def no_show(monkeypatch):
    shown = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: (shown.append(plt.gcf()), plt.close("all")))
    return shown


@pytest.mark.parametrize("B", sorted(TIMES.B.unique()))
def test_hopper_batch_view_every_batch(B, no_show, capsys):
    got = widgets.hopper_batch_view(TIMES, B, CEIL, DSV4_FLASH, BUDGET)
    rec = TIMES[(TIMES.B == B) & (TIMES.impl == "hopper")].iloc[0]
    assert got["us"]["hopper"] == rec.graph_us and got["nsplit"] == rec.nsplit
    assert got["tiles"] * got["nsplit"] * 64 >= DSV4_FLASH.topk > (got["tiles"] - 1) * got["nsplit"] * 64
    assert 0 < got["floor"]["floor_us"] < min(got["us"].values())
    assert got["live"]["ok"], got["live"]
    can_run = impl_info("sparse_decode", "hopper").unavailable() is None
    assert got["live"]["impl"] == ("hopper" if can_run else "auto")
    assert len(no_show) == 1
    out = capsys.readouterr().out
    assert f"B = {B}: hopper" in out and "within tolerance" in out
    assert ("hopper cannot run in this process" in out) == (not can_run)
    assert f"auto runs {'hopper' if B >= 8 else 'splitk_auto'} there" in out


def test_old_runs_name_the_split_k_kernel_as_it_is_named_now(no_show, capsys):
    assert "splitk_auto" in set(OLD.impl) and "auto" not in set(OLD.impl)
    got = widgets.hopper_batch_view(OLD, 128, CEIL, DSV4_FLASH, BUDGET)
    assert got["us"]["splitk_auto"] == OLD[(OLD.B == 128) & (OLD.impl == "splitk_auto")].graph_us.iloc[0]


def test_hopper_batch_view_refuses_an_unrecorded_batch(no_show):
    with pytest.raises(ValueError, match="B must be one of the recorded batches"):
        widgets.hopper_batch_view(TIMES, 3, CEIL, DSV4_FLASH, BUDGET)
    widgets.explore_hopper(TIMES, CEIL, DSV4_FLASH, BUDGET)


def test_tile_budget_and_timeline():
    rows = {r["step"]: r for r in BUDGET}
    assert rows["Q K^T (wgmma)"]["bound"] == "shared memory"          # Q re-read by both warp groups
    assert rows["P V (wgmma)"]["cycles"] == 2 * 64 * 64 * 512 / 4096
    segs = roofline.hopper_timeline(BUDGET, tiles=3)
    cons = [s for s in segs if s["lane"].startswith("consumers")]
    prod = [s for s in segs if s["what"] == "dequant"]
    for t in range(3):   # the consumers start a tile only after the producer finished it
        assert min(s["start"] for s in cons if s["tile"] == t) >= max(s["end"] for s in prod if s["tile"] == t)
