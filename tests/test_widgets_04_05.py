"""Notebooks 04-05's widgets: every view callback at every setting it offers, on the recorded data. On a
CPU each setting runs the indexer (the torch fallback and the Triton kernel; the Triton step with its
top-k) through the interpreter at a small shape and checks it against the float64 reference."""
import dsv4lab  # noqa: F401  (first: sets the mode before anything imports triton)
import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dsv4lab import runs, widgets  # noqa: E402
from dsv4lab import registry

#: the indexer impls the recorded run times, in the campaign's order
IMPLS = [i.name for i in registry.registered("indexer_logits", tag="recorded")]


@pytest.fixture
def no_show(monkeypatch):
    """Count the figures the views draw, and close them (no display in tests)."""
    shown = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: (shown.append(plt.gcf()), plt.close("all")))
    return shown


@pytest.fixture(scope="module")
def indexer():
    return runs.table("indexer")


@pytest.fixture(scope="module")
def step_rows():
    return pd.DataFrame(runs.experiment("indexer_topk", runs.latest_experiment("indexer_topk", "h200_run"))["rows"])


def test_indexer_max_view_at_every_setting(indexer, no_show, capsys):
    w = widgets.explore_indexer_max(indexer)                   # by default the recorded impls, IMPLS
    lens = list(w.children[0].options)
    assert lens == sorted(int(v) for v in indexer[(indexer.kind == "time") & (indexer.B == 32)].max_seq_len.unique())
    capsys.readouterr()
    for L in lens:
        chk = widgets.indexer_max_view(indexer, L, impls=IMPLS)
        out = capsys.readouterr().out
        assert chk["ok"], chk
        B, H, live, Ls, k = widgets.indexer_max_shape(L)
        assert (chk["B"], chk["live"], chk["max_seq_len"]) == (B, live, Ls)
        # the fallback computes every page of the max context, the Triton kernel the live pages only
        assert chk["impls"]["torch_fp32"]["positions"] == -(-Ls // 64) * 64
        assert chk["impls"]["triton"]["positions"] == -(-live // 64) * 64
        assert f"{-(-L // 64) * 64:,} positions a request" in out and "FAILS" not in out
        assert out.count("-> ok") == len(widgets.INDEXER_LIVE_IMPLS)
    assert len(no_show) == 1 + len(lens)                     # one on creation, one per setting


def test_indexer_max_view_without_a_recorded_time(indexer, no_show, capsys):
    chk = widgets.indexer_max_view(indexer[indexer.impl != "sglang"], 8192, impls=IMPLS)
    assert chk["ok"] and "sglang" not in capsys.readouterr().out.split("checked now")[0].split("positions")[0]
    widgets.indexer_max_view(indexer, 12345, impls=IMPLS)       # not recorded: a note on the figure, no error
    assert len(no_show) == 2


def _swap_impl(monkeypatch, op, name, fn):
    """Register ``fn`` as impl ``name`` of ``op`` for this test (what the API and the widgets call)."""
    import dataclasses

    from dsv4lab import api
    monkeypatch.setitem(registry._IMPLS[op], name, dataclasses.replace(registry.impl_info(op, name), fn=fn))


def test_indexer_max_check_catches_a_wrong_kernel(monkeypatch):
    # the check is real: a fallback whose logits are 1% off fails it, the others still pass
    from dsv4lab import api
    real = registry.impl_info("indexer_logits", "torch_fp32").fn
    _swap_impl(monkeypatch, "indexer_logits", "torch_fp32", lambda *a, **k: real(*a, **k) * 1.01)
    widgets.indexer_max_context._indexer_max_check.cache_clear()
    try:
        chk = widgets.indexer_max_check(8192)
        assert not chk["ok"] and not chk["impls"]["torch_fp32"]["ok"] and chk["impls"]["triton"]["ok"]
    finally:
        widgets.indexer_max_context._indexer_max_check.cache_clear()


def test_indexer_step_view_at_every_setting(step_rows, no_show, capsys):
    w = widgets.explore_indexer_step(step_rows)
    lives, maxes = list(w.children[0].options), list(w.children[1].options)
    assert lives == sorted(int(v) for v in step_rows[step_rows.kind == "step_vs_live"].live.unique())
    capsys.readouterr()
    for live in lives:
        for L in maxes:
            chk = widgets.indexer_step_view(step_rows, live, L)
            out = capsys.readouterr().out
            assert chk["ok"] and chk["exact"] and chk["recall"] == 1.0, (live, L, chk)
            B, H, lens, Ls, k = widgets.indexer_step_shape(live, L)
            assert chk["lens"] == lens and chk["max_seq_len"] == Ls and max(lens) <= Ls
            # only the live pages are read; rows shorter than k are padded with -1
            assert chk["read"] == sum(-(-n // 64) * 64 for n in lens)
            assert chk["padded"] == sum(max(0, k - n) for n in lens)
            assert "-> ok" in out and ("do not fit" in out) == (live > L)
            assert "recorded:" in out
    assert len(no_show) == 1 + len(lives) * len(maxes)


def test_indexer_step_check_catches_a_wrong_selection(monkeypatch):
    # a top-k that drops each row's first chosen position is not the contract
    import torch

    from dsv4lab import api
    real = registry.impl_info("indexer_topk", "triton").fn

    def wrong(*a, **k):
        top = real(*a, **k)
        return torch.cat([top[:, 1:], torch.full_like(top[:, :1], -1)], dim=1)
    _swap_impl(monkeypatch, "indexer_topk", "triton", wrong)
    widgets.indexer_step._indexer_step_check.cache_clear()
    try:
        assert not widgets.indexer_step_check(8192, 65536)["ok"]
    finally:
        widgets.indexer_step._indexer_step_check.cache_clear()


def test_the_plots_of_notebooks_04_05(indexer, step_rows):
    from dsv4lab import plots, roofline
    fig, (a, b) = plt.subplots(1, 2)
    plots.indexer_logits_vs_max(a, indexer, IMPLS, B=32)
    assert [t.get_text() for t in a.get_legend().get_texts()][:len(IMPLS)] == IMPLS
    plots.op_share_bars(b, {"x": {"aten::copy_": 40.0, "aten::mul": 1.0}, "y": {"aten::sum": 30.0}})
    assert [t.get_text() for t in b.get_yticklabels()] == ["copy_", "sum"]       # below 2% in every profile: left out
    plt.close(fig)
    # the live step's bytes, as the recorded run counted them
    live = step_rows[step_rows.kind == "step_vs_live"]
    for r in live.itertuples():
        assert roofline.indexer_step_bytes(int(r.B), int(r.live)) == r.step_bytes
