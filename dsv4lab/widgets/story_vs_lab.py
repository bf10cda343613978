"""Notebook 07a's widget: one published figure at a time, and the bridge from the story's value to the
lab's, computed now from the replay's recorded calls for the GPU the story's figures are taken to
come from."""
from __future__ import annotations

import math

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from .. import bridge

#: the figures of report.story_vs_lab_table that dsv4lab.bridge writes as a product of named factors,
#: and which of bridge.factors' bridges each is
BRIDGED = {"sparse-MLA decode kernel time, in the model": "step", "tok/s at concurrency 1": "c1"}


def bridge_gpus() -> list[str]:
    """The GPUs with the datasheet figures a bridge needs (dsv4lab.device.KNOWN_DEVICES), the story's first."""
    from ..device import KNOWN_DEVICES
    have = [n for n, d in KNOWN_DEVICES.items() if d.get("fp32_tflops_datasheet") and d.get("hbm_tb_s_datasheet")]
    return [bridge.STORY_GPU] + sorted(n for n in have if n != bridge.STORY_GPU)


def story_row_view(table: pd.DataFrame, figure: str, rec: dict | None = None,
                   story_gpu: str = bridge.STORY_GPU) -> dict:
    """What explore_story_vs_lab shows for one figure. A figure the bridge covers (BRIDGED) gets its
    bridge computed now from ``rec`` (a replay's record) with the story's figures taken to come from
    ``story_gpu``: each factor, their product against the lab's measurement, drawn as a chain on a log
    axis. Any other figure that is a change (story x, lab x) gets both factors and their ratio, which no
    named factor explains. Then the row's words: how the lab measured it and why the two differ."""
    if figure not in set(table["figure"]):
        raise ValueError(f"figure must be one of the table's figures, got {figure!r}")
    r = table[table["figure"] == figure].iloc[0]
    out = r.to_dict()
    sx, lx = r.get("story x"), r.get("lab x")
    kind = BRIDGED.get(figure)
    if kind and rec is not None:
        f = bridge.factors(rec, story_gpu=story_gpu)
        b = f.get(kind, {}) if "note" not in f else {}
        if "factors" not in b:
            print(f"no bridge for this record: {f.get('note') or b.get('note')}")
        else:
            rows = b["factors"]
            fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(rows) + 1.3))
            running = 1.0
            for y, row in enumerate(rows):
                lo, running = running, running * row["value"]
                ax.barh(y, math.log10(running) - math.log10(lo), left=math.log10(lo),
                        color="C2" if row["value"] >= 1 else "C3")
                ax.text(max(math.log10(lo), math.log10(running)), y, f" x {row['value']:.3g}", va="center", fontsize=8)
            ax.axvline(math.log10(b["measured"]), color="black", ls="--", lw=1, label=f"measured here {b['measured']:.3g}")
            ax.set_yticks(range(len(rows)), [row["factor"] for row in rows], fontsize=8)
            ax.invert_yaxis()
            ax.set_xlabel("log10 of the running product (after / before)")
            ax.set_title(f"{figure}: the story's value, moved from the {story_gpu}", fontsize=9)
            ax.legend(fontsize=7, loc="lower right")
            plt.show()
            for row in rows:
                print(f"{row['factor']:>40}: {row['value']:.3g}")
            print(f"{'product':>40}: {b['product']:.4g} (measured here {b['measured']:.4g})")
            out.update(bridge=rows, product=b["product"], measured=b["measured"], story_gpu=story_gpu)
    elif sx == sx and lx == lx and sx is not None and lx is not None:
        fig, ax = plt.subplots(figsize=(5.5, 1.6))
        ax.barh(["lab (recorded)", "story (published)"], [lx, sx], color=["C0", "C1"])
        for y, v in enumerate([lx, sx]):
            ax.text(v, y, f" {v:.2f}x", va="center", fontsize=8)
        ax.axvline(1, color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlim(min(0.5, lx, sx) / 1.5, max(lx, sx) * 4)
        ax.set_xlabel("after vs before (x, > 1: faster; log)")
        ax.set_title(figure, fontsize=9)
        plt.show()
        print(f"lab x / story x = {lx / sx:.3g}: no named factor of the bridge covers this figure")
        out.update(lab_over_story=lx / sx)
    for key in ("story", "lab", "lab: measured as", "why they differ", "beyond the story"):
        print(f"{key:>17}: {r[key]}")
    return out


def explore_story_vs_lab(table: pd.DataFrame, rec: dict | None = None):
    """One figure of report.story_vs_lab_table at a time, and the GPU the story's figures are taken to
    come from (story_row_view)."""
    figures = list(table["figure"])
    first = next((f for f in figures if f in BRIDGED), figures[0]) if rec is not None else figures[0]

    def show(figure, story_gpu):
        story_row_view(table, figure, rec, story_gpu)

    return w.interactive(show, figure=w.Dropdown(options=figures, value=first, description="figure",
                                                 layout=w.Layout(width="95%")),
                         story_gpu=w.Dropdown(options=bridge_gpus(), value=bridge.STORY_GPU,
                                              description="story's GPU", layout=w.Layout(width="60%")))
