"""Notebook 09's widget: S5's step with a set of fusions on, run now on the small preset. The launch count
follows the fusions (every fusion off is S4's count, each fusion saves launches), the logits stay within
the bound against S4's, and the view prints what it computed."""
import dsv4lab  # noqa: F401  (first: sets the mode before anything imports triton)
import pytest

from dsv4lab import step_fused, widgets
from dsv4lab.device import mode

ALL = frozenset(step_fused.FUSIONS)


def test_all_off_launches_what_s4_launches():
    s4, off = widgets.launches_per_layer("S4"), widgets.launches_per_layer("S5", ())
    assert s4 == off and set(s4) == {"c0", "c4", "c128", "embed + head"}
    s5 = widgets.launches_per_layer("S5")
    assert all(s5[k] < s4[k] for k in s4)


def test_fusion_check_counts_and_agrees():
    on, none = widgets.fusion_check(ALL), widgets.fusion_check(frozenset())
    assert on["ok"] and none["ok"] and on["launches"] < none["launches"]
    if mode() != "cuda":
        assert none["rel_err"] == 0.0
        assert on["launches"] == on["triton"] + on["torch_ops"] and on["triton"] > none["triton"]


def test_the_view_prints_what_it_computed(capsys):
    res = widgets.fusion_view(moe=False)
    out = capsys.readouterr().out
    assert res["fusions"] == len(ALL) - 1 and "S4's ops for moe" in out
    assert f"launches per step: {res['launches']}" in out
    assert "within" in out
    w = widgets.explore_fusions()
    assert [c.description for c in w.children[1:1 + len(ALL)]] == list(step_fused.FUSIONS)


def test_count_launches_leaves_the_interpreter_as_it_was():
    if mode() == "cuda":
        pytest.skip("the interpreter's launch regions apply to interpret mode")
    from triton.runtime.interpreter import InterpretedFunction
    run = InterpretedFunction.run
    widgets.count_launches(lambda: None)
    assert InterpretedFunction.run is run
