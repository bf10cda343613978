"""ipywidgets explorers, one knob each. Every function returns the widget (an
``ipywidgets.interactive``), which also works headless: the view is drawn once
on creation, so nbval can execute the cells without a frontend.

Recorded numbers come from a table the notebook passes in (data/runs); on a CUDA
GPU a "time live" box also times the selected configuration with dsv4lab.bench.
"""
from __future__ import annotations

import functools

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from . import plots, roofline
from .device import mode

_LIVE_HELP = "time live on this GPU (dsv4lab.bench)"


def _live_box():
    live = mode() == "cuda"
    return w.Checkbox(value=False, description=_LIVE_HELP if live else "live timing needs a CUDA GPU",
                      disabled=not live, indent=False)


def _slider(options, value, description):
    options = list(options)
    return w.SelectionSlider(options=options, value=value if value in options else options[0], description=description,
                             continuous_update=False)


@functools.lru_cache(maxsize=2)
def _inputs(B, H, K, context):
    from .testing import make_decode_inputs
    return make_decode_inputs(B, H, K, context=context, seed=B)


def _time_us(fn) -> float:
    from . import bench
    return bench.time_ms(fn, graph=True, warmup=10, rep=40) * 1e3


def _tile_config(row, source="live"):
    """The TileConfig a sweep row ran (rows recorded before the loop had a name carry its number)."""
    from .planning import LOOP_OF_PREFETCH, TileConfig
    dequant, fold = row.get("dequant"), row.get("fold_scale")
    loop = row.get("loop")
    if not isinstance(loop, str):
        loop = LOOP_OF_PREFETCH.get(int(row.get("prefetch", 0) or 0), "plain")
    return TileConfig(block_h=int(row["block_h"]), block_n=int(row["block_n"]), num_warps=int(row["num_warps"]),
                      num_stages=int(row["num_stages"]), source=source, loop=loop,
                      dequant=dequant if isinstance(dequant, str) else "cvt",
                      fold_scale=bool(fold) if fold is not None and fold == fold else False)


def time_tile_live(row, B, H=64, K=512, context=8192) -> float:
    """Graph-replay time (us) of the head-batched kernel with one tile config (GPU)."""
    from .kernels import split_k
    from .planning import launch_for
    inp, opts = _inputs(B, H, K, context), launch_for(_tile_config(row))
    return _time_us(lambda: split_k.run(inp.q, inp.cache, inp.indices, None, 512 ** -0.5, None, opts))


def time_split_live(row, B, nsplit, H=64, K=512, context=8192) -> float:
    """Graph-replay time (us) of split-K with one tile config and NSPLIT (GPU)."""
    from .kernels import split_k
    from .planning import launch_for
    cfg = _tile_config(row)
    inp, opts = _inputs(B, H, K, context), launch_for(cfg, nsplit, B * -(-H // cfg.block_h) * nsplit)
    return _time_us(lambda: split_k.run(inp.q, inp.cache, inp.indices, None, 512 ** -0.5, None, opts))


def explore_tiles(df: pd.DataFrame, chosen: dict | None = None, H=64, K=512, context=8192):
    """BLOCK_H and B over the recorded tile sweep (rows with us_B<batch> columns):
    the configs with that BLOCK_H, fastest first, at that batch."""
    batches = sorted(int(c[4:]) for c in df.columns if c.startswith("us_B"))
    block_hs = sorted(int(h) for h in df["block_h"].unique())

    def show(block_h, B, live):
        d = df[df["block_h"] == block_h].copy()
        col = f"us_B{B}"
        if live:
            d[col] = [time_tile_live(r, B, H, K, context) for _, r in d.iterrows()]
        d = d.dropna(subset=[col])
        fig, ax = plt.subplots(figsize=(6, 0.35 * len(d) + 1.2))
        plots.tile_bars(ax, d, col, chosen)
        ax.set_title(f"BLOCK_H={block_h}, B={B}: {'live' if live else 'recorded'}; "
                     f"{B * -(-H // block_h)} programs per launch", fontsize=9)
        plt.show()
        best = d.loc[d[col].idxmin()]
        print(f"fastest at B={B} with BLOCK_H={block_h}: {plots.tile_label(best)}, {best[col]:.1f} us")

    return w.interactive(show, block_h=w.Dropdown(options=block_hs, value=block_hs[-1], description="BLOCK_H"),
                         B=_slider(batches, batches[-1], "B"), live=_live_box())


def explore_split(df: pd.DataFrame, H=64, K=512, context=8192):
    """NSPLIT and B over a recorded split sweep of one tile config (rows B, nsplit, us,
    model_choice): time vs NSPLIT at that B, the selected point and the model's choice."""
    batches = sorted(int(b) for b in df["B"].unique())
    splits = sorted(int(n) for n in df["nsplit"].unique())
    cfg_row = df.iloc[0]

    def show(B, nsplit, live):
        d = df[df["B"] == B].sort_values("nsplit")
        fig, ax = plt.subplots(figsize=(5.5, 3))
        ax.plot(d["nsplit"], d["us"], "o-", label="recorded")
        pick = d[d["nsplit"] == nsplit]
        model = d[d["model_choice"].astype(bool)]
        ax.plot(model["nsplit"], model["us"], "s", ms=12, mfc="none", mec="red", label="model's choice")
        if len(pick):
            ax.plot(pick["nsplit"], pick["us"], "*", ms=14, color="C1", label="selected")
        if live and nsplit <= -(-K // int(cfg_row["block_n"])):
            us = time_split_live(cfg_row, B, nsplit, H, K, context)
            ax.plot([nsplit], [us], "^", ms=10, color="C2", label=f"live {us:.1f} us")
        ax.set_xscale("log", base=2)
        ax.set_xticks(splits, [str(s) for s in splits])
        ax.set_xlabel("NSPLIT")
        ax.set_ylabel("time per call (us)")
        ax.set_title(f"B={B}: {B * -(-H // int(cfg_row['block_h'])) * nsplit} programs at NSPLIT={nsplit}",
                     fontsize=9)
        ax.legend(fontsize=8)
        plt.show()
        if len(pick):
            best = d.loc[d["us"].idxmin()]
            print(f"B={B}, NSPLIT={nsplit}: {pick['us'].iloc[0]:.1f} us; best here NSPLIT={best['nsplit']} "
                  f"({best['us']:.1f} us); model chose {model['nsplit'].tolist()}")
        else:
            print(f"NSPLIT={nsplit} was not swept at B={B} (more slices than tiles)")

    return w.interactive(show, B=_slider(batches, batches[0], "B"), nsplit=_slider(splits, splits[0], "NSPLIT"),
                         live=_live_box())


def explore_traffic(H=64, K=512, D=512):
    """Heads per program (1 = SIMT; BLOCK_H for head-batched) and B: who reads each KV tile,
    and the bytes served vs the byte floor."""
    per = [p for p in (1, 2, 4, 8, 16, 32, 64) if p <= H]

    def show(heads_per_program, B):
        fig, axes = plt.subplots(1, 2, figsize=(8, 3))
        plots.traffic_diagram(axes, H, heads_per_program)
        plt.tight_layout()
        plt.show()
        served = roofline.decode_served_bytes(B, H, K, heads_per_program, D)
        floor = roofline.decode_floor_bytes(B, H, K, D)
        print(f"B={B}: {B * -(-H // heads_per_program)} programs; bytes served {served / 1e6:.2f} MB "
              f"= {served / floor:.1f}x the floor {floor / 1e6:.2f} MB")

    return w.interactive(show, heads_per_program=_slider(per, 1, "heads/prog"),
                         B=_slider([1, 4, 16, 32, 64, 128], 32, "B"))


def explore_floors(ceilings, shapes):
    """Batch (sparse decode) and context (indexer): bytes, FLOPs and floor time at ``ceilings``."""
    bw, peak = ceilings.copy_tb_s, ceilings.bf16_tflops
    s = shapes

    def show(B, context):
        rows = {
            "sparse decode": (roofline.decode_floor_bytes(B, s.heads, s.topk, s.head_dim),
                              roofline.decode_flops(B, s.heads, s.topk, s.head_dim)),
            "indexer (live context)": (roofline.indexer_bytes(B, context, s.index_heads, s.index_dim),
                                       roofline.indexer_flops(B, context, s.index_heads, s.index_dim)),
        }
        out = pd.DataFrame({k: {"MB": b / 1e6, "GFLOP": f / 1e9, **roofline.floor_us(b, f, bw, peak)}
                            for k, (b, f) in rows.items()}).T
        print(out.to_string(float_format=lambda v: f"{v:.3g}"))

    return w.interactive(show, B=_slider([1, 2, 4, 8, 16, 32, 64, 128], s.batch, "B"),
                         context=_slider([1024, 4096, 8192, 65536, 262208, 1048576], s.context, "context"))


@functools.lru_cache(maxsize=1)
def _indexer_inputs(B, H, max_seq_len, live):
    from .testing import make_indexer_inputs
    return make_indexer_inputs(B, H, max_seq_len, seq_lens=live, seed=13)


def explore_indexer(df: pd.DataFrame, impls, B=32, H=64, live=8192):
    """The max context (the live context fixed at ``live`` tokens): each indexer impl's time,
    recorded (rows kind="time" of data/runs/*/indexer.json) or live on a GPU, against the
    floor of what the live context needs (keys once, q, and the logits written)."""
    d0 = df[(df["kind"] == "time") & (df["B"] == B) & df["impl"].isin(impls)]
    lens = sorted(int(v) for v in d0["max_seq_len"].unique())

    def show(max_seq_len, live_timing):
        d = d0[d0["max_seq_len"] == max_seq_len].set_index("impl").reindex(impls)
        us = d["graph_us"].copy()
        if live_timing:
            from . import bench
            inp = _indexer_inputs(B, H, max_seq_len, live)
            us = pd.Series({i: bench.indexer_row(i, inp, eager=False)["graph_us"] for i in impls})
        fig, ax = plt.subplots(figsize=(6.5, 2.8))
        ax.barh(list(us.index), us.values, color=[f"C{i}" for i in range(len(us))])
        ax.axvline(d["floor_us"].dropna().iloc[0], color="black", ls="--", lw=1, label="floor of the live bytes")
        ax.set_xscale("log")
        ax.set_xlabel("us per call (graph replay), log scale")
        ax.set_title(f"B={B}, {live} live tokens, max context {max_seq_len}: "
                     f"{'live' if live_timing else 'recorded'}", fontsize=9)
        ax.legend(fontsize=8)
        plt.show()
        print(" | ".join(f"{i} {v:,.1f} us" for i, v in us.items()))

    return w.interactive(show, max_seq_len=_slider(lens, lens[-1], "max context"), live_timing=_live_box())
