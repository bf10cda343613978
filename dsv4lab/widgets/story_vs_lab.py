"""Notebook 07a's widget: one published figure at a time, the story's value beside the lab's."""
from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd


def story_row_view(table: pd.DataFrame, figure: str) -> dict:
    """What explore_story_vs_lab shows for one figure: the story's and the lab's value, how the lab
    measured it, why they differ, beyond the story; for a figure that is a change (story x, lab x) a
    bar of both factors."""
    if figure not in set(table["figure"]):
        raise ValueError(f"figure must be one of the table's figures, got {figure!r}")
    r = table[table["figure"] == figure].iloc[0]
    sx, lx = r.get("story x"), r.get("lab x")
    if sx == sx and lx == lx and sx is not None and lx is not None:
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
    for key in ("story", "lab", "lab: measured as", "why they differ", "beyond the story"):
        print(f"{key:>17}: {r[key]}")
    return r.to_dict()


def explore_story_vs_lab(table: pd.DataFrame):
    """One figure of report.story_vs_lab_table at a time (story_row_view)."""
    figures = list(table["figure"])

    def show(figure):
        story_row_view(table, figure)

    return w.interactive(show, figure=w.Dropdown(options=figures, value=figures[0], description="figure",
                                                 layout=w.Layout(width="95%")))
