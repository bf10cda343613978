"""ipywidgets explorers, one knob each. Every function returns the widget (an
``ipywidgets.interactive``), which also works headless: the view is drawn once
on creation, so nbval can execute the cells without a frontend.

Recorded numbers come from a table the notebook passes in (data/runs); on a CUDA
GPU a "time live" box also times the selected configuration with dsv4lab.bench.
"""
from __future__ import annotations

import dataclasses
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


# ---- notebooks 00 and 01: recorded decode times against the floors, live checks on a small shape

def recorded_us(decode: pd.DataFrame, impl: str, B: int, col: str = "graph_us") -> float | None:
    """The recorded time (us) of ``impl`` at batch ``B``, or None (not run, or a row with an error)."""
    if col not in decode:
        return None
    d = decode[(decode["impl"] == impl) & (decode["B"] == B)][col].dropna()
    return float(d.iloc[0]) if len(d) else None


def recorded_impls(decode: pd.DataFrame) -> list[str]:
    """Sparse-decode impls with at least one recorded time, in the table's order (the campaign's)."""
    from .api import impls
    have = set(decode.dropna(subset=["graph_us"])["impl"]) if "graph_us" in decode else set()
    known = set(impls()) - {"reference"}
    return [i for i in dict.fromkeys(decode["impl"]) if i in have and i in known]


@functools.lru_cache(maxsize=32)
def live_check(impl: str, B: int, H: int, K: int, block_h: int | None = None) -> dict:
    """Run ``impl`` once in this process's mode (Triton's interpreter on a CPU) on fresh inputs
    (seed 0, request b attends to K of its 3K tokens) with NaN-poisoned outputs: relative errors
    of out and lse against the float64 reference, and whether they are within the tolerances.
    ``block_h`` (impl "mma_story" only): the heads per program of the story's kernel, instead of
    its BLOCK_H = 32. Returns {"error": message} when the impl cannot run here (no sglang wheel)."""
    from . import reference
    from .kernels import head_batched, sglang_peer
    from .planning import STORY_TILES
    from .testing import LSE_TOL, OUT_TOL, check_decode, make_decode_inputs, poisoned, rel_err
    if block_h is not None and impl != "mma_story":
        raise ValueError(f"block_h applies to impl 'mma_story' only, got impl {impl!r}")
    inp = make_decode_inputs(B, H, K, context=3 * K, seed=0)
    try:
        if block_h is None:
            out_err, lse_err = check_decode(impl, inp)
        else:
            tiles = dataclasses.replace(STORY_TILES, block_h=block_h)
            with poisoned():
                out, lse = head_batched.sparse_decode_story(inp.q, inp.cache, inp.indices, topk_len=None,
                                                            sm_scale=512 ** -0.5, attn_sink=None, tiles=tiles)
            ref_out, ref_lse = reference.sparse_decode(inp.q, inp.cache, inp.indices)
            out_err, lse_err = rel_err(out.float(), ref_out.float()), rel_err(lse, ref_lse)
    except sglang_peer.SGLangMissing as e:
        return {"error": str(e)}
    return {"out_err": out_err, "lse_err": lse_err, "ok": out_err <= OUT_TOL and lse_err <= LSE_TOL}


def _live_line(res: dict, what: str, shape: tuple) -> str:
    B, H, K = shape
    if "error" in res:
        return f"live here: {what} cannot run: {res['error']}"
    verdict = "within tolerance" if res["ok"] else "OUTSIDE tolerance"
    return (f"live here ({mode()}, B={B}, H={H}, K={K}): {what}: out rel. err {res['out_err']:.2g}, "
            f"lse {res['lse_err']:.2g} vs the float64 reference: {verdict}")


def _decode_floor(model, B, ceilings) -> dict:
    nbytes = roofline.decode_floor_bytes(B, model.heads, model.topk, model.head_dim)
    flops = roofline.decode_flops(B, model.heads, model.topk, model.head_dim)
    return {"bytes": nbytes, "flops": flops, **roofline.floor_us(nbytes, flops, ceilings.copy_tb_s, ceilings.bf16_tflops)}


def kernels_vs_floor(decode: pd.DataFrame, ceilings, model, B: int, live_shape=(2, 8, 80)) -> pd.DataFrame:
    """One row per recorded impl at batch ``B``: its campaign stage, recorded time against the
    floor of ``model``'s work at ``ceilings``, the TFLOP/s that time means, and the impl's live
    check at ``live_shape`` (B, H, K) in this process."""
    from .api import impl_info
    fl = _decode_floor(model, B, ceilings)
    rows = []
    for impl in recorded_impls(decode):
        us = recorded_us(decode, impl, B)
        live = live_check(impl, *live_shape)
        rows.append({"impl": impl, "stage": impl_info("sparse_decode", impl).stage,
                     "recorded us": us, "floor us": fl["floor_us"],
                     "x floor": us / fl["floor_us"] if us else None,
                     "TFLOP/s": fl["flops"] / (us * 1e-6) / 1e12 if us else None,
                     "live out err": live.get("out_err"), "live ok": live.get("ok")})
    return pd.DataFrame(rows).set_index("impl")


def kernel_floor_view(impl, B, live=False, *, decode, ceilings, model, live_shape=(2, 8, 80)):
    """What :func:`explore_kernels_vs_floor` draws for one setting: ``impl``'s recorded time vs
    batch against the floor, its point on the roofline at ``B``, and its live check."""
    from .api import impl_info
    batches = sorted(int(b) for b in decode["B"].unique())
    floor = pd.Series({b: _decode_floor(model, b, ceilings)["floor_us"] for b in batches})
    fl = _decode_floor(model, B, ceilings)
    us = recorded_us(decode, impl, B)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    fig.subplots_adjust(wspace=0.3)       # the roofline's legend goes right of its axes
    plots.time_vs_batch_floors(axes[0], decode, [impl], {"floor (bytes or FLOPs at the ceilings)": floor})
    if us:
        axes[0].plot([B], [us], "*", ms=14, color="C3")
    axes[0].set_title(f"{impl}: recorded time per call vs batch", fontsize=9)
    pts = [dict(label=f"the work at B={B}, at the roof", intensity=fl["intensity"])]
    if us:
        pts.append(dict(label=f"{impl} at B={B}, recorded", intensity=fl["intensity"],
                        tflops=fl["flops"] / (us * 1e-6) / 1e12))
    plots.roofline(axes[1], ceilings, pts)
    axes[1].set_title("where that time sits under the roof", fontsize=9)
    plt.show()
    info = impl_info("sparse_decode", impl)
    print(f"{impl} (stage {info.stage or '-'}): {info.description}")
    if us:
        print(f"recorded at B={B}: {us:.1f} us per call (graph replay) = {us / fl['floor_us']:.0f}x the floor "
              f"{fl['floor_us']:.2f} us ({fl['bound']}-bound work: {fl['bytes'] / 1e6:.2f} MB, "
              f"{fl['flops'] / 1e9:.2f} GFLOP)")
    else:
        print(f"the recorded run has no time for {impl} at B={B}")
    if live and mode() == "cuda":
        from .runs import measure_decode
        live_us = measure_decode([impl], [B], model, layers=0)["graph_us"].iloc[0]
        print(f"live on this GPU at B={B}: {live_us:.1f} us per call (graph replay)")
    print(_live_line(live_check(impl, *live_shape), impl, live_shape))


def explore_kernels_vs_floor(decode: pd.DataFrame, ceilings, model, live_shape=(2, 8, 80)):
    """Impl and B over a recorded decode table: recorded time against the floor of ``model``'s
    work at ``ceilings`` (time vs batch and the roofline), and the impl run live at
    ``live_shape`` (B, H, K) against the float64 reference (interpreter on a CPU)."""
    names = recorded_impls(decode)
    batches = sorted(int(b) for b in decode["B"].unique())

    def show(impl, B, live):
        kernel_floor_view(impl, B, live, decode=decode, ceilings=ceilings, model=model, live_shape=live_shape)

    return w.interactive(show, impl=w.Dropdown(options=names, value=names[0], description="impl"),
                         B=_slider(batches, model.batch, "B"), live=_live_box())


def _row_block_h(row) -> int | None:
    """The heads per program a recorded decode row launched with (its launch dict, or the
    tiles column of older runs)."""
    launch = row.get("launch")
    if isinstance(launch, dict) and launch.get("block_h"):
        return int(launch["block_h"])
    bh = row.get("tiles_block_h")
    return int(bh) if bh is not None and bh == bh else None


def recorded_at_heads(decode: pd.DataFrame, tiles: pd.DataFrame | None, heads_per_program: int, B: int) -> dict:
    """{label: recorded us} of whole-row launches at ``B`` whose programs own ``heads_per_program``
    heads: the SIMT kernels for 1; for more, the head-batched rows of the decode table launched
    with that BLOCK_H and the fastest tile-sweep config with it (when the sweep ran this B)."""
    out = {}
    if heads_per_program == 1:
        for impl in ("simt", "sglang"):
            us = recorded_us(decode, impl, B)
            if us:
                out[impl] = us
        return out
    d = decode[(decode["B"] == B) & decode["impl"].isin(["mma_story", "mma"])]
    for _, row in d.iterrows():
        if _row_block_h(row) == heads_per_program and row.get("graph_us") == row.get("graph_us"):
            out[f"{row['impl']} (BLOCK_H {heads_per_program})"] = float(row["graph_us"])
    col = f"us_B{B}"
    if tiles is not None and col in tiles:
        t = tiles[tiles["block_h"] == heads_per_program][col].dropna()
        if len(t):
            out[f"tile sweep, fastest with BLOCK_H {heads_per_program}"] = float(t.min())
    return out


HEADS_PER_PROGRAM = (1, 16, 32, 64)   # 1: the SIMT grid; tl.dot needs >= 16 rows


def _heads_live(heads_per_program, live_shape):
    if heads_per_program == 1:
        return live_check("simt", *live_shape), "impl 'simt' (1 head per program)"
    return (live_check("mma_story", *live_shape, block_h=heads_per_program),
            f"the story's head-batched kernel (impl 'mma_story') with BLOCK_H {heads_per_program}")


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
        from .kernels import head_batched
        from .planning import STORY_TILES
        inp = _inputs(B, H, K, context)
        if heads_per_program == 1:
            from .api import sparse_decode
            fn = lambda: sparse_decode(inp.q, inp.cache, inp.indices, impl="simt", check_ranges=False)  # noqa: E731
        else:
            tiles_cfg = dataclasses.replace(STORY_TILES, block_h=heads_per_program)
            fn = lambda: head_batched.sparse_decode_story(inp.q, inp.cache, inp.indices, topk_len=None,  # noqa: E731
                                                          sm_scale=512 ** -0.5, attn_sink=None, tiles=tiles_cfg)
        print(f"live on this GPU at B={B}: {_time_us(fn):.1f} us per call (graph replay)")
    res, what = _heads_live(heads_per_program, live_shape)
    print(_live_line(res, what, live_shape))


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

    return w.interactive(show, heads_per_program=_slider(HEADS_PER_PROGRAM, 1, "heads/prog"),
                         B=_slider(batches, batch, "B"), live=_live_box())
