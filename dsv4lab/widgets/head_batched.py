"""Notebook 02's widget: the story's head-batched kernel at one BLOCK_H, next to the recorded sweep."""
from __future__ import annotations

import functools

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from .. import plots, roofline
from ..device import mode
from ..stages import stage
from .live import checked, decode_inputs, live_box, occupancy, slider, time_us


#: the head blocks notebook 02's widget offers: tl.dot needs 16 rows; 32 is the story's; 64 = all heads
STORY_BLOCK_HS = (16, 32, 64)


def story_shape(B: int) -> tuple:
    """(B, H, K, context) the story-kernel widget runs live: the model's shapes on a GPU; in the
    interpreter H = 64 as well (BLOCK_H then sets the programs per request as it does on the GPU),
    at most 4 requests and 64 top-k tokens."""
    return (B, 64, 512, 2048) if mode() == "cuda" else (min(B, 4), 64, 64, 256)


def _story_call(block_h):
    from dataclasses import replace

    from ..kernels.decode import head_batched
    from ..kernels.decode.planning import STORY_TILES
    tiles = replace(STORY_TILES, block_h=block_h, source=f"the story's kernel with BLOCK_H={block_h}")
    return lambda x: head_batched.sparse_decode_story(x.q, x.cache, x.indices, sm_scale=512 ** -0.5, tiles=tiles,
                                                      **x.kwargs())


def story_check(block_h: int, B: int) -> dict:
    """The story's stage-2 kernel (head_batched._story_kernel) launched with BLOCK_H = ``block_h``
    once at story_shape(B), on fresh random inputs with padding, topk_len and a sink, outputs
    poisoned: its programs and its errors against the float64 reference."""
    return _story_check(block_h, *story_shape(B))


@functools.lru_cache(maxsize=32)
def _story_check(block_h, B, H, K, context) -> dict:
    from ..testing import make_decode_inputs
    inp = make_decode_inputs(B, H, K, context=context, pad_frac=0.1, topk_len=True, sink=True, seed=1000 * B + block_h)
    return dict(B=B, H=H, K=K, block_h=block_h, programs=B * -(-H // block_h), **checked(_story_call(block_h), inp))


def time_story_live(block_h: int, B: int) -> float:
    """Graph-replay time (us) of the story's kernel with BLOCK_H = ``block_h`` at B (GPU)."""
    inp = decode_inputs(B, 64, 512, 8192)
    call = _story_call(block_h)
    return time_us(lambda: call(inp))


def recorded_head_block(tiles: pd.DataFrame, decode: pd.DataFrame | None, block_h: int, B: int) -> pd.DataFrame:
    """(label, us) of every recorded launch with this BLOCK_H at batch B: the tile sweep's configs of
    the tuned kernel (``tiles``, columns us_B<batch>) and, from the decode table, the story's kernel
    (stage S1's decode impl) when it ran with this BLOCK_H."""
    from ..kernels.decode.planning import STORY_TILES
    rows = []
    col = f"us_B{B}"
    if col in tiles:
        for _, r in tiles[tiles["block_h"] == block_h].dropna(subset=[col]).iterrows():
            rows.append(dict(label="tuned " + plots.config_label(r), us=float(r[col])))
    if decode is not None and "impl" in decode:
        story = decode[(decode["impl"] == stage("S1").decode_impl) & (decode["B"] == B)].dropna(subset=["graph_us"])
        for _, r in story.iterrows():
            launch = r.get("launch")
            bh = launch["block_h"] if isinstance(launch, dict) else STORY_TILES.block_h
            if bh == block_h:
                rows.append(dict(label=f"the story's kernel {bh}x{STORY_TILES.block_n}", us=float(r["graph_us"])))
    return pd.DataFrame(rows, columns=["label", "us"]).sort_values("us", ascending=False, ignore_index=True)


def tiles_view(tiles: pd.DataFrame, block_h: int, B: int, live: bool = False, decode: pd.DataFrame | None = None,
               sms: int | None = None) -> dict:
    """What explore_tiles draws for one setting: the recorded launches with this BLOCK_H at B (bars),
    the story's kernel with this BLOCK_H run and checked now (story_check), and on a GPU with
    ``live`` its time at B. Returns the check's row."""
    rec = recorded_head_block(tiles, decode, block_h, B)
    chk = story_check(block_h, B)
    live_us = time_story_live(block_h, B) if live and mode() == "cuda" else None
    if live_us is not None:
        rec = pd.concat([rec, pd.DataFrame([dict(label=f"LIVE: the story's kernel, BLOCK_H={block_h}", us=live_us)])],
                        ignore_index=True)
    fig, ax = plt.subplots(figsize=(6.5, 0.3 * max(len(rec), 1) + 1.3))
    if len(rec):
        ax.barh(rec["label"], rec["us"], color=["C2" if lb.startswith("LIVE") else "C0" for lb in rec["label"]])
        for y, v in enumerate(rec["us"]):
            ax.text(v, y, f" {v:.1f}", va="center", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    else:
        ax.text(0.5, 0.5, f"no recorded launch with BLOCK_H={block_h} at B={B}", ha="center", va="center")
        ax.set_yticks([])
    ax.set_xlabel(f"time per call at B={B} (us, graph replay)")
    ax.set_title(f"BLOCK_H={block_h}, B={B}: recorded" + (" and live" if live_us is not None else ""), fontsize=9)
    plt.show()
    progs = B * -(-64 // block_h)
    where = f" ({occupancy(progs, sms)})" if sms else ""
    served = roofline.decode_served_bytes(1, 64, 512, block_h) / 1e6
    print(f"H=64, BLOCK_H={block_h}: {progs} programs at B={B}{where}; each KV tile is gathered "
          f"{-(-64 // block_h)}x per query ({served:.2f} MB served per query at top-k 512)")
    print(f"checked now ({mode()}): the story's kernel with BLOCK_H={block_h} at B={chk['B']}, H={chk['H']}, "
          f"K={chk['K']} ({chk['programs']} programs): out error {chk['out_err']:.1e}, lse error "
          f"{chk['lse_err']:.1e} -> {'ok' if chk['ok'] else 'FAILS the bounds'}")
    return chk


def explore_tiles(tiles: pd.DataFrame, decode: pd.DataFrame | None = None, sms: int | None = None):
    """BLOCK_H x B for the head-batched kernel (tiles_view): the recorded launches with that head
    block at that batch (the tile sweep's ``tiles``, the story's kernel from ``decode``), next to
    the story's kernel with that BLOCK_H run and checked against the reference now (a small shape
    in the interpreter); on a GPU "time live" times it at B."""
    batches = sorted(int(c[4:]) for c in tiles.columns if c.startswith("us_B"))
    def show(block_h, B, live):
        tiles_view(tiles, block_h, B, live, decode, sms)
    return w.interactive(show, block_h=w.Dropdown(options=STORY_BLOCK_HS, value=32, description="BLOCK_H"),
                         B=slider(batches, 1, "B"), live=live_box())
