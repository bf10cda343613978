"""Notebook 01's widget: heads per program, from the SIMT grid to the head-batched one, recorded and live."""
from __future__ import annotations

import dataclasses

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from .. import plots, roofline
from ..device import mode
from ..registry import registered
from ..stages import stage
from .live import decode_inputs, live_box, live_check, live_line, slider, time_us


def _row_block_h(row) -> int | None:
    """The heads per program a recorded decode row launched with (its launch dict, or the
    tiles column of older runs)."""
    launch = row.get("launch")
    if isinstance(launch, dict) and launch.get("block_h"):
        return int(launch["block_h"])
    bh = row.get("tiles_block_h")
    return int(bh) if bh is not None and bh == bh else None


def recorded_at_heads(decode: pd.DataFrame, tiles: pd.DataFrame | None, heads_per_program: int, B: int) -> dict:
    """{label: recorded us} of whole-row launches (the impls tagged whole_row) at ``B`` whose programs
    own ``heads_per_program`` heads: a SIMT grid (an impl without a launch) owns 1, a head-batched row
    the BLOCK_H it launched with; and the fastest tile-sweep config with that BLOCK_H (when the sweep
    ran this B)."""
    whole_row = {i.name: i for i in registered(tag="whole_row")}
    out = {}
    for _, row in decode[(decode["B"] == B) & decode["impl"].isin(whole_row)].iterrows():
        heads = 1 if whole_row[row["impl"]].launch is None else _row_block_h(row)
        if heads == heads_per_program and row.get("graph_us") == row.get("graph_us"):
            out[row["impl"] if heads == 1 else f"{row['impl']} (BLOCK_H {heads})"] = float(row["graph_us"])
    col = f"us_B{B}"
    if tiles is not None and col in tiles:
        t = tiles[tiles["block_h"] == heads_per_program][col].dropna()
        if len(t):
            out[f"tile sweep, fastest with BLOCK_H {heads_per_program}"] = float(t.min())
    return out


HEADS_PER_PROGRAM = (1, 16, 32, 64)   # 1: the SIMT grid; tl.dot needs >= 16 rows


def _simt() -> str:
    """The lab's SIMT kernel: one program per (request, head)."""
    (simt,) = registered(tag="simt")
    return simt.name


def _heads_live(heads_per_program, live_shape):
    if heads_per_program == 1:
        simt = _simt()
        return live_check(simt, *live_shape), f"impl {simt!r} (1 head per program)"
    story = stage("S1").decode_impl
    return (live_check(story, *live_shape, block_h=heads_per_program),
            f"the story's head-batched kernel (impl {story!r}) with BLOCK_H {heads_per_program}")


def heads_per_program_table(decode, tiles, B, H=64, K=512, live_shape=(1, 64, 40), options=HEADS_PER_PROGRAM):
    """One row per heads-per-program setting at batch ``B``: programs per launch, reads of each
    gathered tile, bytes served vs the floor, the recorded times with that many heads per
    program, and the live check of a kernel launched that way at ``live_shape`` (B, H, K)."""
    floor = roofline.decode_floor_bytes(B, H, K)
    rows = []
    for hp in options:
        served = roofline.decode_served_bytes(B, H, K, hp)
        rec = recorded_at_heads(decode, tiles, hp, B)
        live, _ = _heads_live(hp, live_shape)
        rows.append({"heads/program": hp, "programs": B * -(-H // hp), "reads of each tile": -(-H // hp),
                     "served MB": served / 1e6, "x byte floor": served / floor,
                     "recorded us (fastest)": min(rec.values()) if rec else None,
                     "recorded as": min(rec, key=rec.get) if rec else "-",
                     "live out err": live.get("out_err"), "live ok": live.get("ok")})
    return pd.DataFrame(rows).set_index("heads/program")


def heads_per_program_view(heads_per_program, B, live=False, *, decode, tiles=None, H=64, K=512, sms=None,
                           context=8192, live_shape=(1, 64, 40)):
    """What :func:`explore_heads_per_program` draws for one setting: who reads each KV tile,
    the bytes each setting serves at ``B``, the recorded times, and a kernel launched with that
    many heads per program run live at ``live_shape`` against the float64 reference."""
    floor = roofline.decode_floor_bytes(B, H, K)
    served = {str(hp): roofline.decode_served_bytes(B, H, K, hp) for hp in HEADS_PER_PROGRAM}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.2), gridspec_kw={"width_ratios": [1, 1, 1.3]})
    plots.traffic_diagram(axes[:2], H, heads_per_program)      # the SIMT grid beside this setting
    plots.bytes_served_bars(axes[2], served, floor, chosen=str(heads_per_program))
    axes[2].set(title=f"bytes served per call at B={B}", ylabel="heads per program")
    axes[2].title.set_fontsize(9)
    fig.subplots_adjust(wspace=0.4)       # fixed spacing: a tight layout costs a render per call
    plt.show()
    progs = B * -(-H // heads_per_program)
    on = f" on {sms} SMs" if sms else ""
    print(f"B={B}, {heads_per_program} head(s) per program: {progs} programs{on}; each gathered tile is read "
          f"{-(-H // heads_per_program)}x per query; {served[str(heads_per_program)] / 1e6:.1f} MB "
          f"served = {served[str(heads_per_program)] / floor:.1f}x the byte floor")
    rec = recorded_at_heads(decode, tiles, heads_per_program, B)
    print("recorded (graph replay): " + (" | ".join(f"{k} {v:.1f} us" for k, v in rec.items()) if rec
                                          else f"no whole-row launch with {heads_per_program} heads per program "
                                               f"at B={B} in this run"))
    if live and mode() == "cuda":
        from ..kernels.decode import head_batched
        from ..kernels.decode.planning import STORY_TILES
        inp = decode_inputs(B, H, K, context)
        if heads_per_program == 1:
            from ..api import sparse_decode
            fn = lambda: sparse_decode(inp.q, inp.cache, inp.indices, impl=_simt())  # noqa: E731
        else:
            tiles_cfg = dataclasses.replace(STORY_TILES, block_h=heads_per_program)
            fn = lambda: head_batched.sparse_decode_story(inp.q, inp.cache, inp.indices, topk_len=None,  # noqa: E731
                                                          sm_scale=512 ** -0.5, attn_sink=None, tiles=tiles_cfg)
        print(f"live on this GPU at B={B}: {time_us(fn):.1f} us per call (graph replay)")
    res, what = _heads_live(heads_per_program, live_shape)
    print(live_line(res, what, live_shape))


def explore_heads_per_program(decode: pd.DataFrame, tiles: pd.DataFrame | None = None, H=64, K=512, sms=None,
                              context=8192, live_shape=(1, 64, 40), batch=32):
    """Heads per program (1 = the SIMT grid (B, H); more = the head-batched grid) and B: who reads
    each gathered KV tile, bytes served vs the floor, recorded times of launches with that many
    heads per program, and one such kernel run live at ``live_shape`` (B, H, K) against the float64
    reference (interpreter on a CPU; a live timing at the full shape on a GPU). ``batch``: the B shown first."""
    batches = sorted(int(b) for b in decode["B"].unique())

    def show(heads_per_program, B, live):
        heads_per_program_view(heads_per_program, B, live, decode=decode, tiles=tiles, H=H, K=K, sms=sms,
                               context=context, live_shape=live_shape)

    return w.interactive(show, heads_per_program=slider(HEADS_PER_PROGRAM, 1, "heads/prog"),
                         B=slider(batches, batch, "B"), live=live_box())
