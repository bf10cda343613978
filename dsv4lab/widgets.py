"""ipywidgets explorers, one knob each. Every function returns the widget (an
``ipywidgets.interactive``), which also works headless: the view is drawn once
on creation, so nbval can execute the cells without a frontend.

Recorded numbers come from a table the notebook passes in (data/runs); on a CUDA
GPU a "time live" box also times the selected configuration with dsv4lab.bench.
Where a widget runs a kernel at its setting (notebooks 02 and 03), it does so in every
mode: through Triton's interpreter at a small shape on a CPU, and checks the result
against the float64 reference. Each widget's view is a plain function of its settings
(``tiles_view``, ``split_view``), which tests call at every setting.
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
    """The TileConfig a sweep row (or a recorded tile-table entry) ran, costs included where the
    entry has them (rows recorded before the loop had a name carry its number)."""
    from .planning import TileConfig
    dequant, fold = row.get("dequant"), row.get("fold_scale")
    costs = {k: float(row[k]) for k in ("us_per_tile", "fixed_us", "merge_us")
             if row.get(k) is not None and row.get(k) == row.get(k)}
    return TileConfig(block_h=int(row["block_h"]), block_n=int(row["block_n"]), num_warps=int(row["num_warps"]),
                      num_stages=int(row["num_stages"]), source=source, loop=plots.loop_name(row),
                      dequant=dequant if isinstance(dequant, str) else "cvt",
                      fold_scale=bool(fold) if fold is not None and fold == fold else False, **costs)


def recorded_tiles(use: str, run: str = "h200"):
    """The recorded run's tile-table entry for ``use`` ("mma" or "split") as a planning.TileConfig."""
    from . import runs
    return _tile_config(runs.tile_choice(use, run), source=f"recorded run {run!r}")


def time_split_live(row, B, nsplit, H=64, K=512, context=8192) -> float:
    """Graph-replay time (us) of split-K with one sweep row's tile config and NSPLIT (GPU)."""
    from .kernels import split_k
    from .planning import launch_for
    cfg = _tile_config(row)
    inp, opts = _inputs(B, H, K, context), launch_for(cfg, nsplit, B * -(-H // cfg.block_h) * nsplit)
    return _time_us(lambda: split_k.run(inp.q, inp.cache, inp.indices, None, 512 ** -0.5, None, opts))


def _occupancy(programs: int, sms: int) -> str:
    """'3 of 132 SMs busy' or '4 waves' for a launch of ``programs`` programs on ``sms`` SMs."""
    if programs <= sms:
        return f"{programs} of {sms} SMs busy"
    return f"{-(-programs // sms)} waves on {sms} SMs"


def _checked(run, inp) -> dict:
    """``run(inp)`` -> (out, lse) with outputs poisoned (NaN) first, against the float64 reference."""
    from . import reference
    from .testing import LSE_TOL, OUT_TOL, poisoned, rel_err
    with poisoned():
        out, lse = run(inp)
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512 ** -0.5, **inp.kwargs())
    e_out, e_lse = rel_err(out.float(), ro), rel_err(lse, rl)
    return dict(out_err=e_out, lse_err=e_lse, ok=e_out <= OUT_TOL and e_lse <= LSE_TOL)


# ---- notebook 02: the story's kernel at one BLOCK_H, next to the recorded sweep ----------------

#: the head blocks notebook 02's widget offers: tl.dot needs 16 rows; 32 is the story's; 64 = all heads
STORY_BLOCK_HS = (16, 32, 64)


def story_shape(B: int) -> tuple:
    """(B, H, K, context) the story-kernel widget runs live: the model's shapes on a GPU; in the
    interpreter H = 64 as well (BLOCK_H then sets the programs per request as it does on the GPU),
    at most 4 requests and 64 top-k tokens."""
    return (B, 64, 512, 2048) if mode() == "cuda" else (min(B, 4), 64, 64, 256)


def _story_call(block_h):
    from dataclasses import replace

    from .kernels import head_batched
    from .planning import STORY_TILES
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
    from .testing import make_decode_inputs
    inp = make_decode_inputs(B, H, K, context=context, pad_frac=0.1, topk_len=True, sink=True, seed=1000 * B + block_h)
    return dict(B=B, H=H, K=K, block_h=block_h, programs=B * -(-H // block_h), **_checked(_story_call(block_h), inp))


def time_story_live(block_h: int, B: int) -> float:
    """Graph-replay time (us) of the story's kernel with BLOCK_H = ``block_h`` at B (GPU)."""
    inp = _inputs(B, 64, 512, 8192)
    call = _story_call(block_h)
    return _time_us(lambda: call(inp))


def recorded_head_block(tiles: pd.DataFrame, decode: pd.DataFrame | None, block_h: int, B: int) -> pd.DataFrame:
    """(label, us) of every recorded launch with this BLOCK_H at batch B: the tile sweep's configs of
    the tuned kernel (``tiles``, columns us_B<batch>) and, from the decode table, the story's kernel
    (impl "mma_story") when it ran with this BLOCK_H."""
    from .planning import STORY_TILES
    rows = []
    col = f"us_B{B}"
    if col in tiles:
        for _, r in tiles[tiles["block_h"] == block_h].dropna(subset=[col]).iterrows():
            rows.append(dict(label="tuned " + plots.config_label(r), us=float(r[col])))
    if decode is not None and "impl" in decode:
        story = decode[(decode["impl"] == "mma_story") & (decode["B"] == B)].dropna(subset=["graph_us"])
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
    where = f" ({_occupancy(progs, sms)})" if sms else ""
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
                         B=_slider(batches, 1, "B"), live=_live_box())


# ---- notebook 03: split-K at one NSPLIT, next to the recorded NSPLIT sweep ---------------------

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

    from .kernels import split_k
    from .planning import launch_for, tile_config
    from .testing import make_decode_inputs
    inp = make_decode_inputs(b, H, K, context=ctx, pad_frac=0.1, topk_len=True, sink=True, seed=100 * b + nsplit)
    cfg = tile_config(H, split=True)
    programs = b * triton.cdiv(H, cfg.block_h) * nsplit
    opts = launch_for(cfg, nsplit, programs)
    # the slices the kernel cuts (head_batched.launch): split_len tokens each, whole tiles
    split_len = triton.cdiv(triton.cdiv(K, nsplit), cfg.block_n) * cfg.block_n
    pos = torch.arange(K, device=inp.indices.device)
    valid = (pos[None, :] < inp.topk_len[:, None]) & (inp.indices >= 0)
    with_token = sum(len(set((pos[valid[r]] // split_len).tolist())) for r in range(b))
    res = _checked(lambda x: split_k.run(x.q, x.cache, x.indices, x.topk_len, 512 ** -0.5, x.attn_sink, opts), inp)
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
        on = f" ({_occupancy(progs, sms)})" if sms else ""
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
    return w.interactive(show, B=_slider(batches, batches[0], "B"), nsplit=_slider(splits, 4, "NSPLIT"),
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
