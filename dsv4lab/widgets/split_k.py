"""Notebooks 03 and 03a's widgets: split-K at one NSPLIT next to the recorded NSPLIT sweep; the tile entries."""
from __future__ import annotations

import functools

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from .. import plots
from ..device import mode
from .live import checked, decode_inputs, live_box, occupancy, slider, time_us


def _tile_config(row, source="live"):
    """The TileConfig a sweep row (or a recorded tile-table entry) ran, costs included where the
    entry has them (rows recorded before the loop had a name carry its number)."""
    from ..kernels.decode.planning import TileConfig
    dequant, fold = row.get("dequant"), row.get("fold_scale")
    costs = {k: float(row[k]) for k in ("us_per_tile", "fixed_us", "merge_us")
             if row.get(k) is not None and row.get(k) == row.get(k)}
    return TileConfig(block_h=int(row["block_h"]), block_n=int(row["block_n"]), num_warps=int(row["num_warps"]),
                      num_stages=int(row["num_stages"]), source=source, loop=plots.loop_name(row),
                      dequant=dequant if isinstance(dequant, str) else "cvt",
                      fold_scale=bool(fold) if fold is not None and fold == fold else False, **costs)


def recorded_tiles(use: str, run: str = "h200"):
    """The recorded run's tile-table entry for ``use`` (runs.tile_choice's) as a planning.TileConfig."""
    from .. import runs
    return _tile_config(runs.tile_choice(use, run), source=f"recorded run {run!r}")


def time_split_live(row, B, nsplit, H=64, K=512, context=8192) -> float:
    """Graph-replay time (us) of split-K with one sweep row's tile config and NSPLIT (GPU)."""
    from ..kernels.decode import split_k
    from ..kernels.decode.planning import launch_for
    cfg = _tile_config(row)
    inp, opts = decode_inputs(B, H, K, context), launch_for(cfg, nsplit, B * -(-H // cfg.block_h) * nsplit)
    return time_us(lambda: split_k.run(inp.q, inp.cache, inp.indices, None, 512 ** -0.5, None, opts))


def split_shape(B: int) -> tuple:
    """(B, H, K, context) the split-K widget runs live: the model's shapes on a GPU; in the
    interpreter one 16-head block, at most 2 requests and 128 top-k tokens (8 tiles of 16, so
    NSPLIT 16 leaves slices with no token)."""
    return (B, 64, 512, 2048) if mode() == "cuda" else (min(B, 2), 16, 128, 256)


def split_check(nsplit: int, B: int) -> dict:
    """Split-K (split_k.run: the tuned kernel on NSPLIT slices of each row, then the LSE merge) with
    this device's "split" tile entry and ``nsplit`` slices, once at split_shape(B), on fresh random
    inputs with padding, topk_len and a sink, outputs and partials poisoned: its programs, how many
    of them had no valid token in their slice, and its errors against the float64 reference."""
    return _split_check(nsplit, *split_shape(B))


@functools.lru_cache(maxsize=64)
def _split_check(nsplit, b, H, K, ctx) -> dict:
    import torch
    import triton

    from ..kernels.decode import split_k
    from ..kernels.decode.planning import launch_for, tile_config
    from ..testing import make_decode_inputs
    inp = make_decode_inputs(b, H, K, context=ctx, pad_frac=0.1, topk_len=True, sink=True, seed=100 * b + nsplit)
    cfg = tile_config(H, split=True)
    programs = b * triton.cdiv(H, cfg.block_h) * nsplit
    opts = launch_for(cfg, nsplit, programs)
    # the slices the kernel cuts (head_batched.launch): split_len tokens each, whole tiles
    split_len = triton.cdiv(triton.cdiv(K, nsplit), cfg.block_n) * cfg.block_n
    pos = torch.arange(K, device=inp.indices.device)
    valid = (pos[None, :] < inp.topk_len[:, None]) & (inp.indices >= 0)
    with_token = sum(len(set((pos[valid[r]] // split_len).tolist())) for r in range(b))
    res = checked(lambda x: split_k.run(x.q, x.cache, x.indices, x.topk_len, 512 ** -0.5, x.attn_sink, opts), inp)
    return dict(B=b, H=H, K=K, nsplit=nsplit, tiles=f"{cfg.block_h}x{cfg.block_n}", programs=programs,
                empty_programs=(b * nsplit - with_token) * triton.cdiv(H, cfg.block_h), **res)


def split_view(split: pd.DataFrame, B: int, nsplit: int, live: bool = False, H: int = 64, K: int = 512,
               sms: int | None = None) -> dict:
    """What explore_split draws for one setting: time vs NSPLIT at B for every tile config of the
    recorded sweep ``split`` (rows B, nsplit, tile columns, us, model_choice), the model's choice and
    the fastest cell over all of them, the selected NSPLIT; split-K at that NSPLIT run and checked
    now (split_check); on a GPU with ``live`` each config timed at (B, NSPLIT). Returns the check's row."""
    d = split[split["B"] == B].dropna(subset=["us"]).copy()
    d["config"] = d.apply(plots.config_label, axis=1, dequant=False)
    chk = split_check(nsplit, B)
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for i, (cfg, g) in enumerate(d.sort_values("nsplit").groupby("config", sort=True)):
        ax.plot(g["nsplit"], g["us"], "o-", color=f"C{i}", label=cfg)
        if live and mode() == "cuda" and nsplit <= -(-K // int(g["block_n"].iloc[0])):
            us = time_split_live(g.iloc[0], B, nsplit, H, K)
            ax.plot([nsplit], [us], "^", ms=10, color=f"C{i}", mec="black", label=f"LIVE {cfg}: {us:.1f} us")
    model = d[d["model_choice"].astype(bool)] if "model_choice" in d else d.iloc[:0]
    ax.plot(model["nsplit"], model["us"], "s", ms=14, mfc="none", mec="red", mew=2, label="the model's choice")
    best = d.loc[d["us"].idxmin()] if len(d) else None
    if best is not None:
        ax.plot([best["nsplit"]], [best["us"]], "o", ms=5, color="black", label="fastest cell")
    ax.axvline(nsplit, color="gray", ls="--", lw=1)
    ax.set_xscale("log", base=2)
    ticks = sorted(set(int(n) for n in split["nsplit"]) | {nsplit})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("NSPLIT")
    ax.set_ylabel("time per call (us, graph replay)")
    ax.set_title(f"B={B}: recorded NSPLIT sweep; dashed: NSPLIT={nsplit}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    plt.show()
    for cfg, g in d.groupby("config", sort=True):
        cell = g[g["nsplit"] == nsplit]
        bh = int(g["block_h"].iloc[0])
        progs = B * -(-H // bh) * nsplit
        on = f" ({occupancy(progs, sms)})" if sms else ""
        if len(cell):
            print(f"{cfg} x{nsplit}: {cell['us'].iloc[0]:.1f} us, {progs} programs{on}")
        else:
            print(f"{cfg} x{nsplit}: not swept (its row has {-(-K // int(g['block_n'].iloc[0]))} tiles)")
    if best is not None:
        print(f"fastest at B={B}: {best['config']} x{int(best['nsplit'])}, {best['us']:.1f} us")
    print(f"the model's choice at B={B}: " + ("; ".join(f"{r.config} x{int(r.nsplit)}, {r.us:.1f} us" for r in
                                                       model.itertuples()) or "none recorded"))
    print(f"checked now ({mode()}): split-K {chk['tiles']} x{nsplit} at B={chk['B']}, H={chk['H']}, K={chk['K']} "
          f"({chk['programs']} programs, {chk['empty_programs']} of them with no valid token): out error "
          f"{chk['out_err']:.1e}, lse error {chk['lse_err']:.1e} -> {'ok' if chk['ok'] else 'FAILS the bounds'}")
    return chk


def explore_split(split: pd.DataFrame, H: int = 64, K: int = 512, sms: int | None = None):
    """NSPLIT x B for split-K (split_view): the recorded NSPLIT sweep at that B, every tile config,
    the model's choice and the fastest cell marked, next to split-K at that NSPLIT run and checked
    against the reference now (a small shape in the interpreter); on a GPU "time live" times each
    config at (B, NSPLIT)."""
    batches = sorted(int(b) for b in split["B"].unique())
    splits = sorted(set(int(n) for n in split["nsplit"].unique()) | {16})
    def show(B, nsplit, live):
        split_view(split, B, nsplit, live, H, K, sms)
    return w.interactive(show, B=slider(batches, batches[0], "B"), nsplit=slider(splits, 4, "NSPLIT"),
                         live=live_box())
