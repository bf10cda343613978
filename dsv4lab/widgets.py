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
    """The TileConfig a sweep row (or a recorded tile-table entry) ran, costs included where the
    entry has them (rows recorded before the loop had a name carry its number)."""
    from .kernels.decode.planning import TileConfig
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
    from .kernels.decode import split_k
    from .kernels.decode.planning import launch_for
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

    from .kernels.decode import head_batched
    from .kernels.decode.planning import STORY_TILES
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
    from .kernels.decode.planning import STORY_TILES
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

    from .kernels.decode import split_k
    from .kernels.decode.planning import launch_for, tile_config
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


@functools.lru_cache(maxsize=1)
def _indexer_inputs(B, H, max_seq_len, live):
    from .testing import make_indexer_inputs
    return make_indexer_inputs(B, H, max_seq_len, seq_lens=live, seed=13)


# ---- notebooks 00 and 01: recorded decode times against the floors, live checks on a small shape

def recorded_us(decode: pd.DataFrame, impl: str, B: int, col: str = "graph_us") -> float | None:
    """The recorded time (us) of ``impl`` at batch ``B``, or None (not run, or a row with an error)."""
    if col not in decode:
        return None
    d = decode[(decode["impl"] == impl) & (decode["B"] == B)][col].dropna()
    return float(d.iloc[0]) if len(d) else None


def recorded_impls(decode: pd.DataFrame) -> list[str]:
    """Sparse-decode impls with at least one recorded time, in the table's order (the campaign's)."""
    from .registry import impls
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
    from .kernels.decode import head_batched, sglang_peer
    from .kernels.decode.planning import STORY_TILES
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
    from .registry import impl_info
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
    from .registry import impl_info
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
        from .bench import measure_decode
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
        from .kernels.decode import head_batched
        from .kernels.decode.planning import STORY_TILES
        inp = _inputs(B, H, K, context)
        if heads_per_program == 1:
            from .api import sparse_decode
            fn = lambda: sparse_decode(inp.q, inp.cache, inp.indices, impl="simt")  # noqa: E731
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


# ---- notebook 04: the max context, the torch fallback and the Triton indexer checked live --------

#: the impls notebook 04's widget runs live: the story's fallback in fp32, its bf16 fix, the Triton indexer
INDEXER_LIVE_IMPLS = ("torch_fp32", "torch_bf16", "triton")


def indexer_max_shape(max_seq_len: int) -> tuple:
    """(B, H, live, max context, k) notebook 04's widget checks at for a recorded max context (with
    8192 live tokens a request): on a GPU 4 requests at the real lengths; in the interpreter 2
    requests, 16 heads and every length / 64 (the same live : max ratio), a top-16."""
    if mode() == "cuda":
        return 4, 64, 8192, max_seq_len, 512
    return 2, 16, 8192 // 64, -(-max_seq_len // 64), 16


def indexer_max_check(max_seq_len: int) -> dict:
    """Each of INDEXER_LIVE_IMPLS once at indexer_max_shape(max_seq_len), on fresh random inputs with
    outputs poisoned, against the float64 reference (testing.check_indexer: logits error and top-k
    recall; ok: logits within testing.indexer_tol and, where the products are exact, the whole
    selection found), and the positions each computes a request (the fallback: every page of the max
    context; the Triton kernel: the live pages)."""
    return _indexer_max_check(*indexer_max_shape(max_seq_len))


@functools.lru_cache(maxsize=16)
def _indexer_max_check(B, H, live, L, k) -> dict:
    from .testing import INDEXER_TOL, check_indexer, indexer_tol, make_indexer_inputs
    inp = make_indexer_inputs(B, H, L, seq_lens=live, seed=L)
    res = dict(B=B, H=H, live=live, max_seq_len=L, k=k, impls={})
    for impl in INDEXER_LIVE_IMPLS:
        err, recall = check_indexer(impl, inp, topk=k)
        positions = -(-live // 64) * 64 if impl == "triton" else -(-L // 64) * 64
        # the exact impls must find the reference's whole selection; bf16 scores may swap a boundary
        # position (what notebook 05's selection-quality study measures), so only their logits are bounded
        exact = indexer_tol(impl) == INDEXER_TOL
        res["impls"][impl] = dict(logits_err=err, recall=recall, positions=positions,
                                  ok=err <= indexer_tol(impl) and (recall == 1.0 or not exact))
    res["ok"] = all(r["ok"] for r in res["impls"].values())
    return res


def indexer_max_view(df: pd.DataFrame, max_seq_len: int, live_timing: bool = False, impls=None, B=32) -> dict:
    """What explore_indexer_max draws for one max context: the recorded graph-replay time of each
    indexer impl (rows kind="time" at batch B of data/runs/*/indexer.json; on a GPU with
    ``live_timing`` timed now) against the floor of the live bytes, and the fallback and the Triton
    indexer run and checked now (indexer_max_check). Returns the check."""
    d = df[(df["kind"] == "time") & (df["B"] == B) & (df["max_seq_len"] == max_seq_len)].set_index("impl")
    impls = [i for i in (impls or d.index) if i in d.index]
    us = d["graph_us"].reindex(impls)
    live_n = int(d["live"].dropna().iloc[0]) if "live" in d and d["live"].notna().any() else 8192
    timed = live_timing and mode() == "cuda"
    if timed:
        from . import bench
        inp = _indexer_inputs(B, 64, max_seq_len, live_n)
        us = pd.Series({i: bench.indexer_row(i, inp, eager=False)["graph_us"] for i in impls})
    chk = indexer_max_check(max_seq_len)
    fig, ax = plt.subplots(figsize=(6.5, 0.35 * max(len(us), 1) + 1.4))
    if len(us):
        ax.barh(list(us.index), us.values, color=[f"C{i}" for i in range(len(us))])
        for y, v in enumerate(us.values):
            ax.text(v, y, f" {v:,.1f}", va="center", fontsize=7)
        if d["floor_us"].notna().any():
            ax.axvline(d["floor_us"].dropna().iloc[0], color="black", ls="--", lw=1, label="floor of the live bytes")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, f"no recorded time at max context {max_seq_len}", ha="center", va="center")
        ax.set_yticks([])
    ax.set_xlabel("logits, us per call (graph replay), log scale")
    ax.set_title(f"B={B}, {live_n} live tokens a request, max context {max_seq_len}: "
                 f"{'timed live' if timed else 'recorded'}", fontsize=9)
    plt.show()
    pages = -(-max_seq_len // 64)
    print(f"the fallback computes {pages * 64:,} positions a request ({pages * 64 / live_n:.0f}x the {live_n} live), "
          f"its [B, L, H] scores {B} x {pages * 64:,} x 64 = {B * pages * 64 * 64 / 1e6:,.0f} M values; "
          f"the Triton kernel reads the {-(-live_n // 64)} live pages")
    print(f"checked now ({mode()}, B={chk['B']}, H={chk['H']}, {chk['live']} live, max context {chk['max_seq_len']}, "
          f"top-{chk['k']}):")
    for impl, r in chk["impls"].items():
        print(f"  {impl:10s} logits error {r['logits_err']:.1e}, top-k recall {r['recall']:.3f}, "
              f"{r['positions']} positions a request -> {'ok' if r['ok'] else 'FAILS the bounds'}")
    return chk


def explore_indexer_max(df: pd.DataFrame, impls=("torch_fp32", "torch_bf16", "sglang", "triton"), B=32):
    """The max context (the live context fixed): each indexer impl's recorded time (on a GPU "time
    live" times them now) next to the fallback and the Triton indexer run and checked against the
    float64 reference now, at a small shape in the interpreter (indexer_max_view)."""
    lens = sorted(int(v) for v in df[(df["kind"] == "time") & (df["B"] == B)]["max_seq_len"].unique())

    def show(max_seq_len, live_timing):
        indexer_max_view(df, max_seq_len, live_timing, list(impls), B)
    return w.interactive(show, max_seq_len=_slider(lens, lens[-1], "max context"), live_timing=_live_box())


# ---- notebook 05: the indexer step at a live length and a max context -----------------------------

def indexer_step_shape(live: int, max_seq_len: int) -> tuple:
    """(B, H, row lengths, max context, k) notebook 05's widget runs the step at: on a GPU 4 requests at
    the real lengths, top-512; in the interpreter 2 requests, 16 heads, every length / 128 and a
    top-32. The first row holds the live length (at most the max context), the second a third of it."""
    n = min(live, max_seq_len)
    if mode() == "cuda":
        return 4, 64, (n, n, n, n // 3), max_seq_len, 512
    s = max(1, n // 128)
    return 2, 16, (s, s // 3), -(-max_seq_len // 128), 32


def indexer_step_check(live: int, max_seq_len: int) -> dict:
    """The indexer step as a captured graph runs it (indexer_topk's registered Triton function: logits of
    the live pages, then the radix top-k of each live prefix) once at indexer_step_shape(live,
    max_seq_len), outputs poisoned: ``exact``, the positions equal the contract (reference.topk_positions)
    on the kernel's own logits; ``recall``, the share of the float64 reference's selection found (ties
    counted); the positions it read against those of the max context."""
    return _indexer_step_check(*indexer_step_shape(live, max_seq_len))


@functools.lru_cache(maxsize=64)
def _indexer_step_check(B, H, lens, L, k) -> dict:
    from .testing import check_indexer_step, make_indexer_inputs
    inp = make_indexer_inputs(B, H, L, seq_lens=list(lens), seed=sum(lens) + L)
    return dict(B=B, H=H, lens=lens, max_seq_len=L, k=k, read=sum(-(-n // 64) * 64 for n in lens), max_positions=B * L,
                **check_indexer_step(inp, k))


def time_indexer_step_live(live: int, max_seq_len: int, B: int = 32, H: int = 64, k: int = 512) -> float:
    """Graph-replay time (us) of the Triton indexer step at B requests of ``live`` tokens (GPU)."""
    from .registry import impl_info
    from .stages import stage
    inp = _indexer_inputs(B, H, max_seq_len, min(live, max_seq_len))
    fn = impl_info("indexer_topk", stage("S4").indexer_impl).fn
    return _time_us(lambda: fn(*inp.args(), max_seq_len=max_seq_len, topk=k))


def indexer_step_view(rows: pd.DataFrame, live: int, max_seq_len: int, live_timing: bool = False) -> dict:
    """What explore_indexer_step draws for one (live length, max context): the recorded step against
    the max context and against the live length (experiments/indexer_topk rows kind="step_vs_max" and
    "step_vs_live") with this setting marked, on a GPU with ``live_timing`` the step timed now, and
    the step run now and checked exact (indexer_step_check). Returns the check."""
    chk = indexer_step_check(live, max_seq_len)
    vs_max = rows[(rows["kind"] == "step_vs_max") & (rows["impl"] == "triton")].dropna(subset=["graph_us"])
    vs_live = rows[rows["kind"] == "step_vs_live"].dropna(subset=["graph_us"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.3))
    fig.subplots_adjust(wspace=0.3)
    plots.indexer_step_vs_max(axes[0], rows)
    axes[0].axvline(max_seq_len, color="C3", lw=1)
    plots.indexer_step_vs_live(axes[1], rows)
    axes[1].axvline(live, color="C3", lw=1)
    for ax, what in zip(axes, ("max context", "live length")):
        ax.set_title(f"recorded; red: the {what} chosen", fontsize=9)
        ax.legend(fontsize=7)
    timed = time_indexer_step_live(live, max_seq_len) if live_timing and mode() == "cuda" else None
    if timed is not None:
        axes[0].plot([max_seq_len], [timed], "*", ms=12, color="C3", label=f"timed live: {timed:.1f} us")
        axes[0].legend(fontsize=7)
    plt.show()
    at_max = vs_max[vs_max["max_seq_len"] == max_seq_len]
    at_live = vs_live[vs_live["live"] == live]
    if len(at_max):
        r = at_max.iloc[0]
        print(f"recorded: {int(r['live'])} live tokens, max context {max_seq_len}: {r['graph_us']:.1f} us "
              f"(floor {r['floor_us']:.1f} us)")
    if len(at_live):
        r = at_live.iloc[0]
        print(f"recorded: {live} live tokens, max context {int(r['max_seq_len'])}: {r['graph_us']:.1f} us "
              f"(logits {r['logits_us']:.1f}, top-k {r['topk_us']:.1f}; floor {r['floor_us']:.1f} us)")
    if not len(at_max) and not len(at_live):
        print(f"no recorded step at {live} live tokens or max context {max_seq_len}")
    if live > max_seq_len:
        print(f"{live} live tokens do not fit a max context of {max_seq_len}: the rows hold {max_seq_len}")
    if timed is not None:
        print(f"timed live on this GPU: B=32, {min(live, max_seq_len)} live, max context {max_seq_len}: {timed:.1f} us")
    print(f"run now ({mode()}): B={chk['B']}, H={chk['H']}, rows of {', '.join(str(n) for n in chk['lens'])} live tokens, "
          f"max context {chk['max_seq_len']}, top-{chk['k']}: read {chk['read']} of {chk['max_positions']} positions, "
          f"{chk['padded']} outputs padded with -1; exact {chk['exact']}, recall {chk['recall']:.3f}, logits error "
          f"{chk['logits_err']:.1e} -> {'ok' if chk['ok'] else 'FAILS'}")
    return chk


def explore_indexer_step(rows: pd.DataFrame):
    """Live length x max context for the indexer step over the live context: the recorded step
    (experiments/indexer_topk) against both, and the step run now at a small shape in the interpreter
    and checked exact against the contract and the float64 reference (indexer_step_view)."""
    lives = sorted(int(v) for v in rows[rows["kind"] == "step_vs_live"]["live"].unique())
    maxes = sorted(int(v) for v in rows[(rows["kind"] == "step_vs_max") & (rows["impl"] == "triton")]["max_seq_len"].unique())
    first_live = 8192 if 8192 in lives else lives[len(lives) // 2]

    def show(live, max_seq_len, live_timing):
        indexer_step_view(rows, live, max_seq_len, live_timing)
    return w.interactive(show, live=_slider(lives, first_live, "live tokens"),
                         max_seq_len=_slider(maxes, maxes[-1], "max context"), live_timing=_live_box())


# ---- notebook 06: the whole decode step, stage by stage ------------------------------------------

@functools.lru_cache(maxsize=1)
def _tiny_model():
    from .model import CPU_MODEL, Model
    return Model(CPU_MODEL)


def tiny_batch(C: int) -> int:
    """The batch the tiny replay runs for concurrency C: C, at most the small preset's max_batch."""
    from .model import CPU_MODEL
    return max(1, min(int(C), CPU_MODEL.max_batch))


def tiny_step(stage: str, C: int) -> dict:
    """One decode step of ``stage`` (dsv4lab.replay.STAGES) on the small preset (model.CPU_MODEL: one
    layer of each kind, few heads and experts, the real byte layouts) at batch tiny_batch(C), run now:
    through Triton's interpreter on a CPU, compiled on a GPU. Returns its logits (float32, on the
    CPU), whether they are finite, the wall seconds (in the interpreter: not GPU time; on a GPU the
    first call compiles) and what it ran; with "error" instead when it cannot run here (e.g. S0's
    SGLang kernel without the sglang wheel). Cached per (stage, batch)."""
    return _tiny_step(stage, tiny_batch(C))


@functools.lru_cache(maxsize=32)
def _tiny_step(stage: str, b: int) -> dict:
    import time

    import torch

    from . import replay
    from .kernels.decode import sglang_peer
    m = _tiny_model()
    s = replay.stage_for(replay.stage(stage), m.cfg)
    res = dict(stage=stage, B=b, decode=s.decode_impl, indexer=s.indexer_impl, mhc=s.mhc_gemm,
               max_context=s.max_context or m.cfg.max_context)
    try:
        inp = m.inputs(b, s.max_context)
        m.check(inp)
        t0 = time.perf_counter()
        logits = m.step(inp, s).float().cpu()
        res["seconds"] = time.perf_counter() - t0
    except sglang_peer.SGLangMissing as e:
        return dict(res, error=str(e))
    return dict(res, logits=logits, finite=bool(torch.isfinite(logits).all()))


def stage_agreement(stages, C: int = 2, against: str = "S0") -> pd.DataFrame:
    """Every stage's tiny step (tiny_step) against ``against``'s: the stages compute the same decode
    step with other kernels, GEMM dtypes and context caps, so their logits must agree within
    testing.STEP_TOL (relative). One row per stage: what it runs, the relative difference, ok."""
    from .testing import STEP_TOL, rel_err
    ref = tiny_step(against, C)
    rows = []
    for n in stages:
        r = tiny_step(n, C)
        row = {"stage": n, "decode": r["decode"], "indexer": r["indexer"], "mHC GEMM": r["mhc"],
               "max context": r["max_context"]}
        if "error" in r or "error" in ref:
            row.update({f"logits vs {against}": None, "ok": None, "note": r.get("error") or ref.get("error")})
        else:
            err = rel_err(r["logits"].double(), ref["logits"].double())
            row.update({f"logits vs {against}": err, "ok": bool(r["finite"] and err <= STEP_TOL), "note": ""})
        rows.append(row)
    return pd.DataFrame(rows).set_index("stage")


def _nearest_profiled(results: dict, C: int) -> int:
    """The profiled concurrency nearest to C on a log scale (the run profiled only a few)."""
    import math
    have = [int(c) for c in results.get("profiled_at", [])] or [results.get("profile_batch", 32)]
    return min(have, key=lambda c: (abs(math.log2(c) - math.log2(C)), c))


def _step(results: dict, stage: str, C: int) -> dict | None:
    return next((r for r in results["stages"].get(stage, {}).get("steps", []) if r["C"] == C and "step_ms" in r), None)


def recorded_stage_table(results: dict, stages=None) -> pd.DataFrame:
    """What the stage widget shows from the recorded run, every stage at once: step time and tok/s
    at each concurrency, and the decode, FP32 GEMM and glue shares of kernel time where profiled."""
    from . import profile
    stages = list(stages or results["stages"])
    rows = []
    for n in stages:
        row = {"stage": n}
        for C in results["concurrency"]:
            r = _step(results, n, C)
            row[f"ms C={C}"] = r["step_ms"] if r else None
        for C in results["concurrency"]:
            r = _step(results, n, C)
            row[f"tok/s C={C}"] = r["tok_s"] if r else None
        for C in results.get("profiled_at", []):
            p = results["stages"][n].get("profiles", {}).get(str(C))
            for cat, short in ((profile.DECODE, "decode"), (profile.FP32_GEMM, "FP32 GEMM"), (profile.GLUE, "glue")):
                row[f"{short} % C={C}"] = 100 * p["by_category"].get(cat, 0) / p["total_us"] if p and p["total_us"] else None
        rows.append(row)
    return pd.DataFrame(rows).set_index("stage")


def stage_pair_view(results: dict, before: str, after: str, C: int) -> dict:
    """What explore_stages draws for one setting: the recorded kernel time by category of ``before``
    and ``after`` (at the profiled concurrency nearest C), their tok/s against concurrency with the
    a + b C fits and C marked, the story-form before/after table; and both stages' tiny step run now
    (tiny_step), their logits compared. Returns the recorded step rows and the live comparison."""
    from . import profile, replay
    from .testing import STEP_TOL, rel_err
    Cp = _nearest_profiled(results, C)
    cats = {n: results["stages"][n]["profiles"][str(Cp)]["by_category"] for n in dict.fromkeys((before, after))
            if str(Cp) in results["stages"].get(n, {}).get("profiles", {})}
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [1, 1.2]})
    profile.category_bars(axes[0], cats, title=f"kernel time per step at C={Cp} (recorded)")
    axes[0].get_legend().remove()
    replay.throughput_lines(axes[1], results, list(dict.fromkeys((before, after))))
    axes[1].axvline(C, color="gray", ls="--", lw=1)
    axes[1].set_title(f"tokens/s vs C (recorded; dashed: C={C})", fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4, bbox_to_anchor=(0.5, -0.12))
    fig.subplots_adjust(wspace=0.3)
    plt.show()
    dev = results["environment"]["device"]["name"]
    a, b = _step(results, before, C), _step(results, after, C)
    line = f"recorded on {dev} at C={C}: " + "; ".join(
        f"{n} {r['step_ms']:.1f} ms per step, {r['tok_s']:.1f} tok/s" if r else f"{n}: no step recorded"
        for n, r in ((before, a), (after, b)))
    if a and b:
        line += f" ({b['tok_s'] / a['tok_s']:.2f}x tok/s)"
    print(line)
    if before in cats and after in cats:
        note = "" if Cp == C else f" (profiled at C = {', '.join(map(str, results.get('profiled_at', [])))} only)"
        t = pd.DataFrame(profile.transition_table(cats[before], cats[after], before, after)).set_index("kernel category")
        print(f"kernel time by category at C={Cp}{note}:")
        print(t.to_string(float_format=lambda v: f"{v:.3g}"))
    lb, la = tiny_step(before, C), tiny_step(after, C)
    live = {}
    if "error" in lb or "error" in la:
        print(f"live here: cannot run the tiny step: {lb.get('error') or la.get('error')}")
    else:
        err = rel_err(la["logits"].double(), lb["logits"].double())
        live = dict(B=la["B"], rel_diff=err, ok=bool(lb["finite"] and la["finite"] and err <= STEP_TOL))
        print(f"live here ({mode()}, the small preset, batch {la['B']}): {before} took {lb['seconds']:.2f} s, "
              f"{after} {la['seconds']:.2f} s (wall clock{', the interpreter: not GPU time' if mode() != 'cuda' else ''}); "
              f"their logits differ by {err:.1e} (relative; bound {STEP_TOL:g}): "
              + ("the same step" if live["ok"] else "NOT the same step"))
    return dict(before=a, after=b, profiled_C=Cp, live=live)


def explore_stages(results: dict):
    """Two stages of the campaign replay and a concurrency (stage_pair_view): the recorded H200 step
    time, tok/s and kernel-time categories of both, the story-form before/after table, and both
    stages' tiny step run now (the interpreter on a CPU) with their logits compared."""
    names = list(results["stages"])
    conc = [int(c) for c in results["concurrency"]]

    def show(before, after, C):
        stage_pair_view(results, before, after, C)

    return w.interactive(show, before=w.Dropdown(options=names, value=names[0], description="before"),
                         after=w.Dropdown(options=names, value=names[1] if len(names) > 1 else names[0],
                                          description="after"),
                         C=_slider(conc, results.get("profile_batch", conc[-1]), "C"))


# ---- notebook 07: one published figure at a time -------------------------------------------------

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


# ---- notebook 07: the replay's chosen parameters over the recorded per-layer costs -----------------

#: the after-S1 shares the sensitivity reports (bridge.predict's keys), by dsv4lab.profile category
_SHARES = (("decode_share_after_pct", "DECODE", "decode"), ("fp32_share_after_pct", "FP32_GEMM", "FP32 GEMM"),
           ("glue_share_after_pct", "GLUE", "glue"))


def sensitivity_costs(results: dict) -> dict:
    """The per-layer costs a replay recorded for the sensitivity (reproduce.json's
    ``sensitivity.costs``, built by dsv4lab.bridge.cost_model); ValueError naming what is missing."""
    costs = results.get("sensitivity", {}).get("costs")
    if not isinstance(costs, dict):
        why = results.get("sensitivity", {}).get("note", "it was recorded before the sensitivity existed")
        raise ValueError(f"this replay has no recorded per-layer costs (reproduce.json 'sensitivity'): {why}")
    return costs


def sensitivity_options(results: dict) -> dict:
    """The settings explore_sensitivity offers: every count of ratio-4 layers the model's compressed
    layers allow, and the live contexts and served maxima of dsv4lab.bridge's ranges with the replay's own."""
    from . import bridge
    cfg = results["config"]
    return dict(ratio4=list(range(cfg["layers_c4"] + cfg["layers_c128"] + 1)),
                live=sorted(set(bridge.SENS_LIVE) | {cfg["live_context"]}),
                max_context=sorted(set(bridge.SENS_MAX) | {cfg["max_context"]}))


def _story_targets() -> dict:
    from . import bridge, profile
    shares = bridge.story_after_shares()
    out = {key: shares[getattr(profile, cat)] for key, cat, _ in _SHARES}
    out.update(attention_speedup=bridge.story_attention_speedup(), c1_change_pct=100 * (bridge.story_c1_ratio() - 1))
    return out


def sensitivity_grid(results: dict, ratio4=None, live=None, max_context=None) -> pd.DataFrame:
    """bridge.predict over every combination of the given settings (default: the replay's own), the
    points with more live tokens than the served maximum left out: the after-S1 shares, the S0 -> S1
    decode speedup, the C = 1 change in tok/s, and the largest miss against the story's three shares."""
    from . import bridge
    costs, cfg = sensitivity_costs(results), results["config"]
    target = _story_targets()
    rows = []
    for n in ratio4 if ratio4 is not None else [cfg["layers_c4"]]:
        for lv in live if live is not None else [cfg["live_context"]]:
            for mc in max_context if max_context is not None else [cfg["max_context"]]:
                if lv > mc:
                    continue
                p = bridge.predict(costs, results, ratio4=n, live=lv, max_context=mc)
                row = {k: p[k] for k in ("ratio4", "live", "max_context")}
                row.update({k: p[k] for k, _, _ in _SHARES})
                row.update(attention_speedup=p["attention_speedup"], c1_change_pct=p["c1_change_pct"],
                           story_share_miss_pts=max(abs(p[k] - target[k]) for k, _, _ in _SHARES))
                rows.append(row)
    return pd.DataFrame(rows)


def sensitivity_view(results: dict, ratio4: int, live: int, max_context: int) -> dict:
    """What explore_sensitivity draws at one setting: each output of the cost model (the after-S1
    shares, the S0 -> S1 decode speedup, the C = 1 change in tok/s) against each parameter, the other
    two held at this setting; the setting marked, the replay's own setting dotted, the story's published
    value dashed. Returns bridge.predict at the setting ({"error": ...} when live > max_context)."""
    import matplotlib.ticker

    from . import bridge, profile
    costs, cfg = sensitivity_costs(results), results["config"]
    if live > max_context:
        msg = (f"{live} live tokens a request cannot exceed the served maximum of {max_context}: "
               f"pick a larger max context or fewer live tokens")
        print(msg)
        return dict(error=msg)
    p = bridge.predict(costs, results, ratio4=ratio4, live=live, max_context=max_context)
    target = _story_targets()
    opts = sensitivity_options(results)
    at = dict(ratio4=ratio4, live=live, max_context=max_context)
    own = dict(ratio4=cfg["layers_c4"], live=cfg["live_context"], max_context=cfg["max_context"])
    names = dict(ratio4="ratio-4 layers (of the compressed ones)", live="live tokens a request",
                 max_context="served max context")
    fig, axes = plt.subplots(3, 3, figsize=(12, 7.5), sharey="row")
    for j, par in enumerate(("ratio4", "live", "max_context")):
        grid = sensitivity_grid(results, **{k: opts[k] if k == par else [v] for k, v in at.items()})
        for i, ax in enumerate(axes[:, j]):
            if i == 0:
                for key, cat, label in _SHARES:
                    color = profile.COLORS[getattr(profile, cat)]
                    ax.plot(grid[par], grid[key], "-", color=color, label=label)
                    ax.plot([at[par]], [p[key]], "o", color=color)
                    ax.axhline(target[key], color=color, ls="--", lw=0.8)
                ax.set_ylabel("share of kernel time\nafter S1 (%)" if j == 0 else "")
            else:
                key = ("attention_speedup", "c1_change_pct")[i - 1]
                ax.plot(grid[par], grid[key], "-", color="C0")
                ax.plot([at[par]], [p[key]], "o", color="C3")
                ax.axhline(target[key], color="k", ls="--", lw=0.8)
                ax.set_ylabel(("S0 -> S1 decode\nspeedup (x)", "tok/s change at\nC = 1, S0 -> S1 (%)")[i - 1]
                              if j == 0 else "")
            ax.axvline(own[par], color="0.5", ls=":", lw=1)
            if par == "ratio4":
                ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            else:
                ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
        axes[-1, j].set_xlabel(names[par])
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("the cost model at this setting (dots), one parameter moved at a time; dotted: the replay's "
                 "setting; dashed: the story's published value", fontsize=9)
    fig.tight_layout()
    plt.show()
    print(f"ratio-4 layers {ratio4}, live {live}, max context {max_context}: after S1 decode "
          f"{p['decode_share_after_pct']:.1f}%, FP32 GEMM {p['fp32_share_after_pct']:.1f}%, glue "
          f"{p['glue_share_after_pct']:.1f}% (story {target['decode_share_after_pct']:g} / "
          f"{target['fp32_share_after_pct']:g} / {target['glue_share_after_pct']:g}); S0 -> S1 decode "
          f"{p['attention_speedup']:.3g}x (story {target['attention_speedup']:.1f}x); C = 1 tok/s "
          f"{p['c1_change_pct']:+.0f}% (story {target['c1_change_pct']:+.0f}%)"
          + ("; the replay's own setting" if at == own else ""))
    return p


def explore_sensitivity(results: dict):
    """The layer mix, the live context and the served maximum over a replay's recorded per-layer costs
    (sensitivity_view); starts at the replay's own setting."""
    opts, cfg = sensitivity_options(results), results["config"]
    sensitivity_costs(results)

    def show(ratio4, live, max_context):
        sensitivity_view(results, ratio4, live, max_context)

    return w.interactive(show, ratio4=_slider(opts["ratio4"], cfg["layers_c4"], "ratio-4 layers"),
                         live=_slider(opts["live"], cfg["live_context"], "live tokens"),
                         max_context=_slider(opts["max_context"], cfg["max_context"], "max context"))


# ---- notebook 08: the Hopper kernel at one batch ---------------------------------------------------

def hopper_batch_view(times: pd.DataFrame, B: int, ceilings, model, budget: list[dict], cold_us: float = 1.1) -> dict:
    """What explore_hopper shows at batch ``B``: the recorded one-call graph times of hopper, splitk_auto,
    mma (and hopper with half the slices) beside the byte and matmul floors, the launch hopper ran
    (slices, tiles a program) and the per-tile model's kernel time for it; then ``auto`` run now at
    a tiny shape and checked against the float64 reference (hopper itself needs an sm_90 GPU)."""
    from .kernels.decode.auto import on_hopper
    from .kernels.decode.hopper import BLOCK_N
    rows = times[times["B"] == B]
    if rows.empty:
        raise ValueError(f"B must be one of the recorded batches {sorted(times['B'].unique())}, got {B!r}")
    us = {r["impl"]: float(r["graph_us"]) for _, r in rows.iterrows()}
    hop = rows[rows["impl"] == "hopper"].iloc[0]
    nsplit = int(hop["nsplit"])
    tiles = -(-model.topk // (BLOCK_N * nsplit))
    chain_us = sum(r["us"] for r in budget if r["who"] == "consumers")
    model_us = cold_us + tiles * chain_us
    floor = _decode_floor(model, B, ceilings)
    fig, ax = plt.subplots(figsize=(6, 1.9))
    names = list(us)[::-1]
    ax.barh(names, [us[n] for n in names], color=[f"C{i}" for i in range(len(names))])
    for y, n in enumerate(names):
        ax.text(us[n], y, f" {us[n]:.1f}", va="center", fontsize=8)
    ax.axvline(floor["mem_us"], color="black", ls="--", lw=1, label=f"byte floor {floor['mem_us']:.1f} us")
    ax.axvline(floor["math_us"], color="grey", ls=":", lw=1.5, label=f"matmul floor {floor['math_us']:.1f} us")
    ax.set_xlim(0, max(us.values()) * 1.2)
    ax.set_xlabel(f"B = {B}: one-call CUDA-graph time (us, recorded)")
    ax.legend(fontsize=7, loc="lower right")
    plt.show()
    print(f"B = {B}: hopper {us['hopper']:.1f} us ({float(hop['tflops']):.0f} TFLOP/s), splitk_auto "
          f"{us['splitk_auto']:.1f}, mma {us['mma']:.1f}; best of splitk_auto/mma over hopper "
          f"{min(us['splitk_auto'], us['mma']) / us['hopper']:.2f}x; auto runs {on_hopper(B, 64)} there on an sm_90 GPU")
    print(f"hopper's launch: {B} x {nsplit} programs of {tiles} tile(s) of {BLOCK_N} tokens; "
          f"model: {cold_us:.1f} us cold first tile + {tiles} x {chain_us:.2f} us = {model_us:.1f} us of kernel")
    B_live = min(B, 3)
    live = live_check("auto", B_live, 8, 80)
    print(_live_line(live, "auto", (B_live, 8, 80)))
    return {"B": B, "us": us, "nsplit": nsplit, "tiles": tiles, "model_us": model_us, "floor": floor, "live": live}


def explore_hopper(times: pd.DataFrame, ceilings, model, budget: list[dict], cold_us: float = 1.1):
    """One recorded batch at a time (hopper_batch_view)."""
    bs = sorted(int(b) for b in times["B"].unique())

    def show(B):
        hopper_batch_view(times, B, ceilings, model, budget, cold_us)

    return w.interactive(show, B=_slider(bs, 32, "B"))
