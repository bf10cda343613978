"""The replay's plots: tok/s against concurrency with the fit, the story's published points, the
change at the MMA kernel, and the kernel-time shift per stage (profile_shift.png, throughput.png)."""
from __future__ import annotations

from .. import profile, runs
from .tables import categories_by_stage, stages_run, time_unit


def throughput_lines(ax, results: dict, names, colors: dict | None = None):
    """tok/s vs C per stage (markers: measured; lines: C / (a + b C) from the fit); ``colors``:
    stage -> matplotlib color (default: the cycle, in the order of ``names``)."""
    for i, n in enumerate(names):
        color = (colors or {}).get(n, f"C{i % 10}")
        st = results["stages"].get(n, {})
        pts = [(r["C"], r["tok_s"]) for r in st.get("steps", []) if "tok_s" in r]
        if not pts:
            continue
        C, t = zip(*pts)
        ax.plot(C, t, "o", color=color, label=n)
        f = st.get("fit")
        if f:
            xs = [1 + k * (max(C) - 1) / 60 for k in range(61)]
            ax.plot(xs, [x / ((f["a_ms"] + f["b_ms"] * x) / 1e3) for x in xs], "-", color=color, alpha=0.6)
    ax.set_xlabel("concurrency C (batch = C)")
    ax.set_ylabel("tokens / s (one GPU's step)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def story_throughput_points(ax, colors: dict | None = None):
    """The story's published tok/s before (S0) and after (S1) its MMA kernel, on a second y axis of
    ``ax`` (an 8-GPU server's tok/s, not one GPU's share: their scales differ, so they get their own)."""
    thr = runs.campaign("story_throughput")
    twin = ax.twinx()
    for col, n, marker in (("before_tok_s", "S0", "*"), ("after_tok_s", "S1", "P")):
        pts = thr.dropna(subset=[col])
        twin.plot(pts.concurrency, pts[col], marker, ms=11, mfc="none", color=(colors or {}).get(n, "k"),
                  label=f"story, {'before' if n == 'S0' else 'after'} its MMA kernel ({n})")
    twin.set_ylabel("story's tokens / s (8-GPU server; right axis)", fontsize=8)
    twin.legend(fontsize=7, loc="lower right")
    return twin


def story_change_lines(ax, results: dict, pairs=(("S0", "S1"), ("S0", "S1stop")), colors: dict | None = None):
    """tok/s after / before against C: the lab's measured ratio for each (before, after) pair, and the
    story's published change S0 -> S1 (C = 1, 16, 64; C = 16 was published only as this ratio)."""
    import matplotlib.ticker
    st = results.get("stages", {})
    for before, after in pairs:
        a = {r["C"]: r["tok_s"] for r in st.get(before, {}).get("steps", []) if "tok_s" in r}
        b = {r["C"]: r["tok_s"] for r in st.get(after, {}).get("steps", []) if "tok_s" in r}
        Cs = sorted(set(a) & set(b))
        if Cs:
            ax.plot(Cs, [b[C] / a[C] for C in Cs], "o-", color=(colors or {}).get(after), label=f"here: {after} / {before}")
    thr = runs.campaign("story_throughput")
    ax.plot(thr.concurrency, 1 + thr.change_pct / 100, "*", ms=12, color="k", label="story: after / before its MMA kernel")
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_xlabel("concurrency C (batch = C)")
    ax.set_ylabel("tok/s after / before (log)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def with_story_bars(per_stage: dict) -> dict:
    """``per_stage`` ({stage: {category: us}}) with the story's published shares as a bar just before
    S0 ("story\nbefore") and before S1 ("story\nafter"), for a share plot (the story's ms are not all
    published)."""
    story = runs.story_shares()
    out = {}
    for n, v in per_stage.items():
        if n in ("S0", "S1"):
            key = "story\nbefore" if n == "S0" else "story\nafter"
            out[key] = story[key]
        out[n] = v
    return out


def write_figures(results: dict, shift_png, throughput_png):
    """profile_shift.png (kernel time per stage at the story's batch, and its shares with the story's
    beside S0 and S1) and throughput.png (tok/s against C with the fit and the story's points; the
    change at the MMA kernel, here and in the story)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    B = results["profile_batch"]
    order = stages_run(results)
    per_stage_cat = categories_by_stage(results)
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.8))
    profile.category_bars(axes[0], per_stage_cat, title=f"kernel time per step at C={B} ({time_unit(results)})")
    profile.category_bars(axes[1], with_story_bars(per_stage_cat), share=True,
                          title="share of kernel time (story's published shares beside S0 and S1)")
    if axes[0].get_legend() is not None:
        axes[0].get_legend().remove()
    fig.tight_layout()
    fig.savefig(shift_png, dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    colors = {n: f"C{i % 10}" for i, n in enumerate(order)}
    throughput_lines(axes[0], results, order, colors)
    story_throughput_points(axes[0], colors)
    axes[0].set_title("tokens/s vs concurrency (markers measured, lines: the a + b C fit)", fontsize=9)
    story_change_lines(axes[1], results, colors=colors)
    axes[1].set_title("the change at the MMA kernel, here and in the story", fontsize=9)
    fig.tight_layout()
    fig.savefig(throughput_png, dpi=110)
    plt.close(fig)
