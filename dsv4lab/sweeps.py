"""The GPU sweeps behind the tile table (planning.TILE_TABLE): tiles x B, then NSPLIT x B.

``tile_sweep`` checks and times each candidate tile config of the tuned head-batched kernel;
``split_sweep`` times NSPLIT x B for the table's 64-head entry and the 16-head configs fastest
at B = 1, and :func:`fit_costs` fits each config's launch-time figures (planning.model_us) to its
B = 1 rows. The record CLI (record.py) runs them and writes what they return.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import triton

from . import bench
from .kernels.decode import head_batched, split_k
from .kernels.decode.planning import TileConfig, launch_for
from .testing import check_decode, make_decode_inputs

#: (BLOCK_H, BLOCK_N, warps, stages, loop[, dequant, fold the scale]): configs the offline compiler
#: report (dsv4lab.compile_report, sm_90a) shows with no or few spills; the rest spill kilobytes per
#: thread and were not timed. 64x64 plain with 2 stages is the first stage-2 kernel, kept as the
#: reference point.
TILE_CANDIDATES = [(64, 64, 8, 2, "plain"), (64, 32, 8, 1, "plain"), (64, 32, 8, 3, "plain"),
                   (64, 32, 8, 1, "registers"), (64, 16, 8, 1, "registers"), (64, 128, 8, 1, "plain"),
                   (16, 16, 4, 1, "plain"), (16, 32, 8, 2, "plain"), (16, 32, 4, 1, "registers"),
                   (16, 64, 8, 1, "plain"), (16, 64, 8, 1, "registers"),
                   (64, 128, 8, 1, "l2_hint", "cvt", False), (64, 128, 8, 1, "l2_hint", "bits", True)]
CFG_KEYS = ("block_h", "block_n", "num_warps", "num_stages", "loop", "dequant", "fold_scale")


def candidate(spec) -> TileConfig:
    bh, bn, nw, ns, loop, *rest = spec
    dq, fold = rest or ("cvt", False)
    return TileConfig(bh, bn, nw, ns, "sweep", loop=loop, dequant=dq, fold_scale=fold)


def _graph_us(fn, **kw) -> float:
    return bench.time_ms(fn, graph=True, **kw) * 1e3


def tile_sweep(candidates=TILE_CANDIDATES, batches=(1, 8, 32, 128), H=64, K=512, context=8192, log=print,
               timer=None) -> list[dict]:
    """Each candidate, checked against the float64 reference (poisoned outputs, topk_len, sink),
    then timed with graph replay at each B (whole-row launches). One row per config; errors are rows.
    ``timer(fn)`` -> us replaces the graph-replay timing (an experiment's smoke mode calls fn once)."""
    timer = timer or (lambda fn: _graph_us(fn, warmup=10, rep=40))
    rows = []
    inputs = {B: make_decode_inputs(B, H, K, context=context, seed=100 + B) for B in batches}
    chk = make_decode_inputs(4, H, K, context=1024, topk_len=True, sink=True, pad_frac=0.1, seed=5)
    for spec in candidates:
        cfg = candidate(spec)
        opts = launch_for(cfg)
        row = opts.as_dict()
        try:
            out_err, lse_err = check_decode(lambda i: head_batched.sparse_decode_mma(
                i.q, i.cache, i.indices, sm_scale=512**-0.5, opts=opts, **i.kwargs()), chk)
            row.update(out_err=out_err, lse_err=lse_err, tiles=triton.cdiv(K, cfg.block_n))
            for B, inp in inputs.items():
                fn = lambda: head_batched.sparse_decode_mma(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5,  # noqa: E731
                                                            topk_len=None, attn_sink=None, opts=opts)
                row[f"us_B{B}"] = timer(fn)
        except Exception as e:
            row["error"] = repr(e)[:200]
        rows.append(row)
        log("tile", row)
    return rows


def from_row(row, source) -> TileConfig:
    """TileConfig of a sweep row (costs: the B=1 time spread over the tiles, until fit_costs)."""
    per = row["us_B1"] / row["tiles"] if row.get("us_B1") else None
    return TileConfig(row["block_h"], row["block_n"], row["num_warps"], row["num_stages"], source,
                      loop=row["loop"], us_per_tile=per, dequant=row.get("dequant", "cvt"),
                      fold_scale=bool(row.get("fold_scale", False)))


def same_tiles(row, cfg) -> bool:
    """Whether a sweep row has ``cfg``'s tiles and loop (dequant and fold aside)."""
    return all(row[k] == getattr(cfg, k) for k in CFG_KEYS[:5] if k in row)


def ran(row, cfg) -> bool:
    """Whether a sweep row ran ``cfg``: its tiles, and the dequant/fold a launch of it takes."""
    opts = launch_for(cfg, row.get("nsplit", 1))
    return same_tiles(row, cfg) and row.get("dequant", opts.dequant) == opts.dequant \
        and bool(row.get("fold_scale", opts.fold_scale)) == opts.fold_scale


def split_sweep(cands, batches=(1, 2, 4, 8, 16, 32, 64, 128), splits=(1, 2, 4, 8, 16), H=64, K=512, context=8192,
                log=print, timer=None) -> list[dict]:
    """NSPLIT x B for each TileConfig in ``cands`` (graph replay; each launch takes planning.launch_for's
    options for its slices, PDL where the grid leaves half the SMs idle). ``timer`` as in tile_sweep."""
    timer = timer or (lambda fn: _graph_us(fn, warmup=10, rep=50))
    rows = []
    for B in batches:
        inp = make_decode_inputs(B, H, K, context=context, seed=200 + B)
        for cfg in cands:
            for ns in splits:
                if ns > triton.cdiv(K, cfg.block_n):
                    continue
                progs = B * triton.cdiv(H, cfg.block_h) * ns
                opts = launch_for(cfg, ns, progs)
                fn = lambda: split_k.run(inp.q, inp.cache, inp.indices, None, 512**-0.5, None, opts)  # noqa: E731
                row = {"B": B, **opts.as_dict()}
                try:
                    row["us"] = timer(fn)
                except Exception as e:
                    row["error"] = repr(e)[:200]
                rows.append(row)
                log("split", row)
        del inp
        torch.cuda.empty_cache()
    return rows


def fit_costs(rows, cfg: TileConfig) -> TileConfig:
    """cfg with us_per_tile, fixed_us and merge_us fitted to its B=1 rows of the NSPLIT sweep: one
    program per slice, all in one wave, so time = fixed + tiles per slice x us_per_tile (+ the merge
    when NSPLIT > 1). The slope comes from the split rows (same merge cost), fixed from the single
    launch, the merge from the split rows' intercept."""
    pts = [(triton.cdiv(triton.cdiv(512, cfg.block_n), r["nsplit"]), r["us"], r["nsplit"])
           for r in rows if r["B"] == 1 and r.get("us") is not None and ran(r, cfg)]
    split = [(x, y) for x, y, n in pts if n > 1]
    one = [(x, y) for x, y, n in pts if n == 1]
    if len(split) < 2 or not one or len({x for x, _ in split}) < 2:
        return cfg
    mx = sum(x for x, _ in split) / len(split)
    my = sum(y for _, y in split) / len(split)
    slope = sum((x - mx) * (y - my) for x, y in split) / sum((x - mx) ** 2 for x, _ in split)
    x1, y1 = one[0]
    fixed = y1 - x1 * slope
    return replace(cfg, us_per_tile=round(slope, 3), fixed_us=round(fixed, 2),
                   merge_us=round(max(0.0, my - mx * slope - fixed), 2),
                   source=cfg.source + "; costs fitted to this run's NSPLIT sweep")


def best_at(rows, cfg, B=1) -> float:
    return min(r["us"] for r in rows if r["B"] == B and r.get("us") is not None and ran(r, cfg))

