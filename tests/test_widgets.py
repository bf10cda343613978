"""Every widget's callback at every setting it offers (on a CPU: the interpreter, small shapes).

One test function per widget; :func:`every_setting` enumerates a widget's controls, so a test
only builds the widget and says which outputs it must print."""
import itertools

import matplotlib
import matplotlib.pyplot as plt
import pandas as pd
import pytest

import dsv4lab
from dsv4lab import runs, widgets

matplotlib.use("Agg")


def every_setting(wid):
    """Each combination of the widget's control values: the options of selection controls, both
    values of an enabled checkbox, the current value of a disabled one."""
    names, values = [], []
    for c in wid.kwargs_widgets:
        names.append(c._kwarg)
        if hasattr(c, "options"):
            values.append([v if not isinstance(v, tuple) else v[1] for v in c.options])
        elif isinstance(c.value, bool) and not c.disabled:
            values.append([False, True])
        else:
            values.append([c.value])
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def run_every_setting(wid, capsys, keep=lambda kw: True):
    """Call the widget's callback at every setting (those ``keep`` accepts); return what each printed."""
    capsys.readouterr()
    printed = {}
    for kw in filter(keep, every_setting(wid)):
        wid.f(**kw)
        plt.close("all")
        printed[tuple(kw.items())] = capsys.readouterr().out
    return printed


@pytest.fixture(scope="module")
def decode():
    return runs.table("decode")


def _newer_format(decode):
    """The recorded table as a newer run writes it: a launch dict instead of the tiles/plan
    columns, rows for impl "mma_story", an impl that failed at one B, and no SGLang rows."""
    d = decode[decode.impl != "sglang"].drop(columns=[c for c in decode if c.startswith(("tiles_", "plan_"))])
    d = d.assign(launch=[{"block_h": 64 if r.B >= 64 else 16} if r.impl == "mma" else None for r in d.itertuples()])
    story = d[d.impl == "simt"].assign(impl="mma_story", graph_us=lambda t: t.graph_us / 20,
                                       launch=[{"block_h": 32}] * int((d.impl == "simt").sum()))
    d = pd.concat([d, story], ignore_index=True)
    d.loc[(d.impl == "splitk") & (d.B == d.B.max()), "graph_us"] = float("nan")
    return d


@pytest.mark.parametrize("fmt", ["recorded", "newer"])
def test_explore_kernels_vs_floor(decode, fmt, capsys):
    table = decode if fmt == "recorded" else _newer_format(decode)
    wid = widgets.explore_kernels_vs_floor(table, runs.ceilings(), dsv4lab.DSV4_FLASH)
    ends = {table.B.min(), table.B.max()}
    printed = run_every_setting(wid, capsys, keep=lambda kw: fmt == "recorded" or kw["B"] in ends)
    assert len(printed) == len(widgets.recorded_impls(table)) * (table.B.nunique() if fmt == "recorded" else 2)
    for out in printed.values():
        assert "vs the float64 reference: within tolerance" in out, out
    if fmt == "newer":
        assert "mma_story" in widgets.recorded_impls(table) and "sglang" not in widgets.recorded_impls(table)
        assert any("the recorded run has no time for splitk" in out for out in printed.values())


@pytest.mark.parametrize("fmt", ["recorded", "newer"])
def test_explore_heads_per_program(decode, fmt, capsys):
    table = decode if fmt == "recorded" else _newer_format(decode)
    wid = widgets.explore_heads_per_program(table, runs.table("tiles"), sms=132)
    ends = {table.B.min(), table.B.max()}
    printed = run_every_setting(wid, capsys, keep=lambda kw: fmt == "recorded" or kw["B"] in ends)
    assert len(printed) == len(widgets.HEADS_PER_PROGRAM) * (table.B.nunique() if fmt == "recorded" else 2)
    for (( _, hp), (_, B), _live), out in printed.items():
        assert f"each gathered tile is read {-(-64 // hp)}x per query" in out, out
        assert "vs the float64 reference: within tolerance" in out, out
    if fmt == "newer":
        assert "mma_story (BLOCK_H 32)" in printed[(("heads_per_program", 32), ("B", 1), ("live", False))]


def test_recorded_at_heads_names_whole_row_launches_only(decode):
    # one head per program: the SIMT grids; more: the head-batched rows at the BLOCK_H they launched
    # with, never a split-K launch (the same BLOCK_H, but NSPLIT programs a row)
    for B in decode.B.unique():
        at = {hp: widgets.recorded_at_heads(decode, None, hp, int(B)) for hp in widgets.HEADS_PER_PROGRAM}
        assert set(at[1]) == {"sglang", "simt"}, (B, at[1])
        assert at[1]["simt"] == widgets.recorded_us(decode, "simt", int(B))
        labels = [label for hp in widgets.HEADS_PER_PROGRAM[1:] for label in at[hp]]
        assert len(labels) == 2 and all(label.startswith(("mma_story (", "mma (")) for label in labels), (B, labels)
