"""Matplotlib helpers the notebooks share. Each draws on axes it is given and
returns them, so a notebook decides the figure layout."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle
from matplotlib.ticker import NullFormatter

from .registry import registered


def _ceil(c, key):
    return c[key] if isinstance(c, dict) else getattr(c, key)


def roofline(ax, ceilings, points):
    """Log-log roofline: memory roof (copy TB/s x intensity), compute roof (bf16 TFLOP/s),
    the ridge point, and ``points`` (rows with label, intensity in FLOP/B and, if
    measured, tflops; a point without tflops sits on the roof: what it could reach)."""
    bw, peak = _ceil(ceilings, "copy_tb_s"), _ceil(ceilings, "bf16_tflops")
    ridge = peak / bw
    pts = pd.DataFrame(points)
    if "tflops" not in pts:
        pts["tflops"] = np.nan
    roof = np.minimum(bw * pts["intensity"], peak)
    pts["tflops"] = pts["tflops"].fillna(roof)
    lo = min(pts["intensity"].min(), ridge) / 30
    hi = max(pts["intensity"].max(), ridge) * 5
    x = np.geomspace(lo, hi, 200)
    ax.loglog(x, np.minimum(bw * x, peak), color="black", lw=2,
              label=f"roof: {bw:.2f} TB/s x intensity, capped at {peak:.0f} TFLOP/s")
    ax.axvline(ridge, color="gray", ls=":")
    ax.plot([ridge], [peak], "D", color="black", ms=7, label=f"ridge point: {ridge:.0f} FLOP/B")
    markers = "os^vP*Xh"
    for i, r in enumerate(pts.itertuples()):
        ax.plot(r.intensity, r.tflops, markers[i % len(markers)], ms=8, color=f"C{i % 10}",
                label=f"{r.label} ({r.intensity:.3g} FLOP/B, {r.tflops:.3g} TFLOP/s)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))   # outside: measured points sit low right
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", alpha=0.3)
    return ax


def time_vs_batch(ax, df, impls, floor_us=None, col="graph_us"):
    """Time per call vs batch, one line per impl (log-log); ``floor_us`` (a Series or dict
    B -> us) is drawn dashed: no implementation can go below it."""
    for impl in impls:
        d = df[df["impl"] == impl].dropna(subset=[col]).sort_values("B")
        ax.loglog(d["B"], d[col], "o-", label=impl)
    if floor_us is not None:
        f = pd.Series(floor_us).sort_index()
        ax.loglog(f.index, f.values, "k--", label="floor (bytes or FLOPs at the ceilings)")
    bs = sorted(df["B"].unique())
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.minorticks_off()
    ax.set_xlabel("batch B")
    ax.set_ylabel(f"{col.replace('_us', '')} time per call (us)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def loop_name(row) -> str:
    """The kernel loop a sweep row ran (planning.LOOPS). Runs recorded before loops had names carry
    its number ("prefetch"): 0, 2 and 5 are plain, registers and l2_hint; the other numbers are
    loops the lab measured and deleted, shown as "loop <n>"."""
    from .kernels.decode.planning import LOOP_OF_PREFETCH
    loop = row.get("loop")
    if isinstance(loop, str):
        return loop
    pf = row.get("prefetch")
    if pf is None or pf != pf:
        return "plain"
    return LOOP_OF_PREFETCH.get(int(pf), f"loop {int(pf)}")


def config_label(row, dequant: bool = True) -> str:
    """'64x128 w8 s1 l2_hint bits+fold' for a sweep row: tiles, warps, stages, loop and (with
    ``dequant``) the fp8 dequant and folded scale when they are not the plain "cvt", no fold."""
    label = (f"{int(row['block_h'])}x{int(row['block_n'])} w{int(row['num_warps'])} s{int(row['num_stages'])} "
             f"{loop_name(row)}")
    if dequant:
        fold = row.get("fold_scale")
        extra = ("bits" if row.get("dequant") == "bits" else "") + ("+fold" if fold is True or fold == 1 else "")
        label += f" {extra.lstrip('+')}" if extra else ""
    if row.get("lazy_rescale") is True or row.get("lazy_rescale") == 1:     # a deleted variant's rows
        label += " lazy rescale"
    return label


def times(x) -> str:
    """A ratio as a table or a sentence shows it: two significant figures below 10 (1.6x, never "2x"),
    whole numbers from 10; "" where it is missing."""
    if x is None or x != x:
        return ""
    return f"{x:.2g}x" if abs(x) < 10 else f"{x:.0f}x"


def launch_of(row) -> dict | None:
    """{block_h, block_n, loop, nsplit} of a decode-table row of a tensor-core impl: the row's
    ``launch`` dict (planning.Launch.as_dict) or, in runs recorded before it, the plan_* / tiles_*
    columns; None for impls without tiles."""
    launch = row.get("launch")
    if isinstance(launch, dict):
        return {k: launch[k] for k in ("block_h", "block_n", "loop", "nsplit")}
    if isinstance(row.get("plan_use"), str):
        return dict(block_h=int(row["plan_block_h"]), block_n=int(row["plan_block_n"]), loop=None,
                    nsplit=int(row["plan_nsplit"]))
    bh = row.get("tiles_block_h")
    if bh is not None and bh == bh:
        return dict(block_h=int(bh), block_n=int(row["tiles_block_n"]),
                    loop=loop_name({"prefetch": row.get("tiles_prefetch")}), nsplit=1)
    return None


def launch_label(row) -> str:
    """'16x64 registers x8' for a decode-table row (launch_of: tiles, loop, NSPLIT); "" without tiles."""
    la = launch_of(row)
    if la is None:
        return ""
    return f"{la['block_h']}x{la['block_n']}" + (f" {la['loop']}" if la["loop"] else "") + f" x{la['nsplit']}"


def split_heatmap(ax, df, value="us"):
    """The NSPLIT sweep as one heat map: a row per (tile config, NSPLIT), a column per B. Colour =
    time over the fastest cell at that B over every config (1.0 = fastest); each cell shows its
    time in us; a red box marks the model's choice (``model_choice``: one cell per B, whichever
    config it is in), a black dot the fastest cell. Configs are told apart by tiles, warps, stages
    and loop (a config's split cells run "cvt" whatever its whole-row launches take). Returns the
    grid (DataFrame, rows (config, nsplit))."""
    d = df.dropna(subset=[value]).assign(config=lambda t: t.apply(config_label, axis=1, dequant=False))
    grid = d.pivot_table(index=["config", "nsplit"], columns="B", values=value, aggfunc="min")
    rows = list(grid.index)
    rel = grid / grid.min()
    im = ax.imshow(rel.values, cmap="viridis_r", vmin=1, vmax=min(4, np.nanmax(rel.values)), aspect="auto")
    ax.set_xticks(range(len(grid.columns)), [str(b) for b in grid.columns])
    ax.set_yticks(range(len(rows)), [f"{c}  x{n}" for c, n in rows], fontsize=7)
    ax.set_xlabel("batch B")
    ax.set_ylabel("tiles, warps, stages, loop  x NSPLIT")
    for i, key in enumerate(rows):
        for j, b in enumerate(grid.columns):
            v = grid.loc[key, b]
            if not math.isnan(v):
                ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7,
                        color="white" if rel.loc[key, b] > 2 else "black")
        if i and rows[i - 1][0] != key[0]:
            ax.axhline(i - 0.5, color="white", lw=2)
    chosen = d[d["model_choice"].astype(bool)] if "model_choice" in d else d.iloc[:0]
    for r in chosen.itertuples():
        i, j = rows.index((r.config, r.nsplit)), list(grid.columns).index(r.B)
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=2))
    best = grid.idxmin()
    # in the cell's top-right corner, clear of the number
    ax.plot(np.arange(len(best)) + 0.33, [rows.index(k) - 0.25 for k in best], "o", ms=5, mfc="black", mec="white")
    plt.colorbar(im, ax=ax, label="time / fastest time at this B")
    ax.set_title("number: us; red box: the model's choice; black dot: the fastest cell", fontsize=9)
    return grid


def sweep_bars(ax, df, col="us_B128", chosen=None):
    """Horizontal bars: each swept config's time at one batch (``col``), fastest at the top, labelled
    by config_label; the ``chosen`` config (a dict with the sweep's keys) in red."""
    d = df.dropna(subset=[col]).assign(label=lambda t: t.apply(config_label, axis=1)).sort_values(col, ascending=False)
    is_chosen = d["label"] == config_label(chosen) if chosen is not None else np.zeros(len(d), bool)
    ax.barh(d["label"], d[col], color=np.where(is_chosen, "C3", "C0"))
    for y, v in enumerate(d[col]):
        ax.text(v, y, f" {v:.1f}", va="center", fontsize=6)
    ax.set_xlabel(f"{col.replace('us_', 'time at ')} (us, graph replay)")
    ax.tick_params(axis="y", labelsize=7)
    return ax


def traffic_diagram(axes, H, block_h, n_tiles=8):
    """Who reads each gathered KV tile of one query, SIMT vs head-batched.

    Rows are heads, columns the KV tiles of the top-k row. A cell's colour is the
    program that loads that tile for that head: in the (B, H) SIMT grid every head is
    its own program, so each tile is fetched H times; with BLOCK_H heads per program it
    is fetched ceil(H / BLOCK_H) times. Returns {scheme: reads of each tile}."""
    reads = {}
    for ax, (name, per) in zip(axes, [("SIMT grid (B, H)", 1), (f"head-batched, BLOCK_H={block_h}", block_h)]):
        prog = np.repeat(np.arange(H) // per, n_tiles).reshape(H, n_tiles)
        n_prog = math.ceil(H / per)
        ax.imshow(prog % 20, cmap="tab20", vmin=0, vmax=19, aspect="auto", interpolation="nearest")
        for p in range(1, n_prog):      # a line where one program's heads end
            ax.axhline(p * per - 0.5, color="white", lw=0.6 if n_prog > 16 else 1.5)
        ax.set_xticks(range(n_tiles), [f"t{i}" for i in range(n_tiles)], fontsize=7)
        ax.set_xlabel("gathered KV tile of one query's top-k row")
        ax.set_ylabel(f"head (0..{H - 1})")
        ax.set_title(f"{name}\n{n_prog} program(s) per query: each tile read {n_prog}x", fontsize=9)
        reads[name] = n_prog
    return reads


def programs_vs_sms(ax, programs: dict, sms: dict):
    """Bars of programs launched (label -> count) against horizontal lines at each device's
    SM count (name -> SMs): below a line, that many SMs sit idle."""
    labels = list(programs)
    ax.bar(labels, [programs[k] for k in labels], color="C0")
    for i, (name, n) in enumerate(sms.items()):
        ax.axhline(n, color=f"C{i + 1}", ls="--", label=f"{name}: {n} SMs")
    for i, k in enumerate(labels):
        ax.text(i, programs[k], str(programs[k]), ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(0.5, max(sms.values()) * 3)
    ax.set_ylabel("programs (thread blocks) launched")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)
    return ax


def time_vs_batch_floors(ax, df, impls, floors: dict, col="graph_us"):
    """:func:`time_vs_batch` with several floors: ``floors`` maps a label to a Series / dict
    (B -> us, drawn as a dashed line) or to a number (one time at every B, a dotted line)."""
    time_vs_batch(ax, df, impls, col=col)
    bs = sorted(df["B"].unique())
    for i, (label, f) in enumerate(floors.items()):
        color = f"C{(len(impls) + i) % 10}"
        if isinstance(f, (int, float)):
            ax.axhline(f, color=color, ls=":", lw=1.5, label=label)
        else:
            s = pd.Series(f).sort_index()
            ax.loglog(s.index, s.values, "--", color=color, label=label)
    ax.set_xticks(bs, [str(b) for b in bs])
    ax.minorticks_off()
    ax.legend(fontsize=7)
    return ax


def bytes_served_bars(ax, served: dict, floor_bytes, chosen=None):
    """Bars of the bytes a launch makes the memory system serve (label -> bytes, MB on a log
    axis) against the byte floor (a dashed line); the ``chosen`` label in red."""
    labels = list(served)
    mb = [served[k] / 1e6 for k in labels]
    ax.barh(labels, mb, color=["C3" if k == chosen else "C0" for k in labels])
    ax.axvline(floor_bytes / 1e6, color="black", ls="--", lw=1, label=f"byte floor {floor_bytes / 1e6:.3g} MB")
    for i, v in enumerate(mb):
        ax.text(v, i, f" {v / (floor_bytes / 1e6):.1f}x", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.set_xlim(floor_bytes / 1e6 / 2, max(mb) * 4)
    ax.set_xlabel("MB served per call (log)")
    ax.legend(fontsize=7, loc="upper right")
    return ax


def _with_floor(ax, d, x, floor_label, xlabel, ylabel):
    """The dashed floor (column floor_us of ``d`` against ``x``), axis labels, grid and legend."""
    g = d.dropna(subset=["floor_us"]).sort_values(x)
    if len(g):
        ax.loglog(g[x], g["floor_us"], "k--", label=floor_label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def _live_pages_only() -> set:
    """The indexer impls that read only each request's live pages (their lines solid), not every page up to
    the max context (dotted): the registry's reads_dead_pages."""
    return {i.name for i in registered("indexer_logits") if not i.reads_dead_pages}


def indexer_step_vs_max(ax, df, col="graph_us"):
    """The whole indexer step (logits + top-k) against the max context, one line per impl (log-log),
    from rows kind="step_vs_max" (experiments/indexer_topk); the Triton step's byte floor (its live
    bytes at the copy ceiling) dashed: a step that pays for the live context stays flat."""
    d = df[df["kind"] == "step_vs_max"].dropna(subset=[col])
    solid = _live_pages_only()
    for impl, g in d.groupby("impl"):
        g = g.sort_values("max_seq_len")
        ax.loglog(g["max_seq_len"], g[col], "o-" if impl in solid else "s:", label=impl)
    live = ", ".join(str(int(x)) for x in sorted(d["live"].unique()))
    return _with_floor(ax, d[d["impl"].isin(solid)], "max_seq_len", "floor: the live bytes at the copy ceiling",
                       f"max context (tokens; {live} live a request)", "logits + top-k, us per step (graph replay)")


def indexer_step_vs_live(ax, df):
    """The Triton step, its logits and its top-k against the live length (log-log), from rows
    kind="step_vs_live" (experiments/indexer_topk), with the step's byte floor dashed."""
    d = df[df["kind"] == "step_vs_live"].sort_values("live")
    for col, style, label in (("graph_us", "o-", "logits + top-k"), ("logits_us", "s-", "logits (live pages only)"),
                              ("topk_us", "^-", "top-k (live prefix only)")):
        g = d.dropna(subset=[col])
        ax.loglog(g["live"], g[col], style, label=label)
    mx = ", ".join(str(int(x)) for x in sorted(d["max_seq_len"].unique()))
    return _with_floor(ax, d, "live", "floor: the step's bytes at the copy ceiling",
                       f"live tokens a request (max context {mx})", "us per call (graph replay)")


def indexer_logits_vs_max(ax, df, impls, B=32, col="graph_us"):
    """Indexer logits time against the max context at batch ``B``, one line per impl (log-log), from
    rows kind="time" (data/runs/*/indexer.json), with the floor of the live context's bytes dashed."""
    d = df[(df["kind"] == "time") & (df["B"] == B)].dropna(subset=[col])
    solid = _live_pages_only()
    for impl in impls:
        g = d[d["impl"] == impl].sort_values("max_seq_len")
        if len(g):
            ax.loglog(g["max_seq_len"], g[col], "o-" if impl in solid else "s:", label=impl)
    live = ", ".join(str(int(x)) for x in sorted(d["live"].dropna().unique()))
    return _with_floor(ax, d[d["impl"] == impls[0]], "max_seq_len", "floor: live keys read, logits rows written",
                       f"max context (tokens; {live} live a request)", "logits, us per call (graph replay)")


def op_share_bars(ax, shares: dict, ops=None, min_share=2.0):
    """Grouped horizontal bars of the share (%) each aten op takes of a profile's glue, one bar per
    profile: ``shares`` maps a label to {op: percent}. ``ops`` (default: every op at ``min_share`` %
    or more in some profile) in that order, top to bottom; op names without their "aten::" prefix."""
    if ops is None:
        ops = list(dict.fromkeys(op for s in shares.values() for op, v in s.items() if v >= min_share))
    n = len(shares)
    height = 0.8 / max(n, 1)
    y = np.arange(len(ops))
    for i, (label, s) in enumerate(shares.items()):
        vals = [s.get(op, 0.0) for op in ops]
        ax.barh(y - 0.4 + height * (i + 0.5), vals, height, label=label, color=f"C{i}")
    ax.set_yticks(y, [op.removeprefix("aten::") for op in ops])
    ax.invert_yaxis()
    ax.set_xlabel("share of the glue (%)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return ax


def hopper_timeline(ax, segments, clock_ghz=1.98):
    """Segments of roofline.hopper_timeline as a Gantt chart in us, one lane per role, one colour
    per step, each bar labelled with its tile number."""
    lanes = list(dict.fromkeys(s["lane"] for s in segments))[::-1]
    steps = list(dict.fromkeys(s["what"] for s in segments))
    colors = {w: f"C{i}" for i, w in enumerate(steps)}
    for s in segments:
        y = lanes.index(s["lane"])
        x0, dx = s["start"] / (clock_ghz * 1e3), (s["end"] - s["start"]) / (clock_ghz * 1e3)
        ax.broken_barh([(x0, dx)], (y - 0.35, 0.7), facecolors=colors[s["what"]], edgecolor="white", lw=0.5)
        if s["lane"].startswith("consumers") or s is segments[0]:   # the producer's bars are too short to label
            ax.text(x0 + dx / 2, y, str(s["tile"]), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
    ax.set_xlabel("time in one program (us, model at ideal issue: not a trace)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, list(colors), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return ax


def story_timeline(ax, timeline, not_taken=()):
    """The story's steps (dsv4lab.story.TIMELINE) left to right on one line, each with where the lab
    replays it; the steps the story did not take (NOT_TAKEN) in grey below the line."""
    import textwrap

    def where(s):
        return " · ".join(([", ".join(s.stages)] if s.stages else []) + [f"notebook {s.notebook}"])
    for i, s in enumerate(timeline):
        ax.plot(i, 0, "o", color="C0", ms=9)
        ax.text(i, 0.15, textwrap.fill(s.what, 20), ha="center", va="bottom", fontsize=8)
        ax.text(i, -0.15, textwrap.fill(where(s), 22), ha="center", va="top", fontsize=7, color="C0")
    ax.plot([0, len(timeline) - 1], [0, 0], color="C0", lw=1.5, zorder=0)
    step = (len(timeline) - 1) / max(1, len(not_taken))
    for j, s in enumerate(not_taken):
        x = step * (j + 0.5)
        ax.plot(x, -0.8, "o", color="grey", ms=7, mfc="white")
        ax.text(x, -0.95, textwrap.fill(f"{s.what}: {s.outcome}; the lab builds it: {where(s)}", 34),
                ha="center", va="top", fontsize=7, color="grey")
    ax.set_xlim(-0.7, len(timeline) - 0.3)
    ax.set_ylim(-1.5, 0.65)
    ax.axis("off")
    return ax


def index_row(ax, rows: dict):
    """Horizontal bars on a log axis, one per labelled count (tokens, compressed positions, the index
    row's width): how the words of the lab's vocabulary relate, drawn to scale."""
    names = list(rows)[::-1]
    ax.barh(names, [rows[n] for n in names], color=[f"C{i}" for i in range(len(names))][::-1])
    for y, n in enumerate(names):
        ax.text(rows[n], y, f" {rows[n]:,}", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(1e3, max(rows.values()) * 8)
    ax.tick_params(axis="y", labelsize=8)
    return ax
