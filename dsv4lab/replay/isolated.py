"""The decode kernels timed alone (one call per CUDA graph) on the step's own caches and index
tables, how each call spreads over the chip, and those calls scaled to one step."""
from __future__ import annotations

import re
import time

import torch

from .. import bench
from ..api import sparse_decode
from ..device import mode
from ..model import Model
from ..registry import impl_info
from ..stages import stage
from .plan import PROFILE_BATCH

#: the decode impls timed alone (one call per graph): those of S0, S1, S1stop, S1best and S2
ISOLATED_IMPLS = tuple(dict.fromkeys(stage(n).decode_impl for n in ("S0", "S1", "S1stop", "S1best", "S2")))


def _wall_ms(fn) -> float:
    """One call's wall time after a first call (the interpreter: meaningless as GPU time)."""
    fn()
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def isolated_decode(model: Model, impls=ISOLATED_IMPLS, batches=(1, PROFILE_BATCH), log=print) -> list:
    """One decode call per CUDA graph (bench.time_ms, do_bench median), on the first layer of each
    kind's caches and the step's own index tables: the kernel alone, to set beside its time
    inside the step. The ratio-4 call uses 512 distinct live compressed tokens per request. On a CPU
    one interpreted call's wall time ("how" says so; ``graph_us`` keeps the column's name)."""
    gpu = mode() == "cuda"
    timer = (lambda fn: bench.time_ms(fn, graph=True)) if gpu else _wall_ms
    how = "CUDA graph of one call, do_bench median" if gpu else "one interpreted call, CPU wall clock"
    rows = []
    cfg = model.cfg
    for B in batches:
        if B > cfg.max_batch:
            continue
        inp = model.inputs(B)
        g = torch.Generator().manual_seed(B)
        q = torch.randn(B, cfg.kernel_heads, 512, generator=g).to(torch.bfloat16).to(model.device)
        calls = {}
        for r in (0, 4, 128):
            if r not in model.ratios:
                continue
            c = model.caches[model.ratios.index(r)]
            calls[f"window (K={cfg.window})"] = (c.window, inp.window_idx, inp.window_len)
            if r == 4:
                n4 = cfg.live_context // 4
                pick = torch.rand(B, n4, generator=g).argsort(1)[:, :cfg.index_topk].to(model.device)
                phys = inp.page_table.long().gather(1, pick // 64) * 64 + pick % 64
                calls[f"ratio 4 (K={cfg.index_topk})"] = (c.compressed, phys.to(torch.int32), inp.c4_topk_len)
            if r == 128:
                calls[f"ratio 128 (K={inp.c128_idx.shape[1]}, {cfg.live_context // 128} valid)"] = (
                    c.compressed, inp.c128_idx, inp.c128_len)
        valid = {"window": cfg.window, "ratio 4": cfg.index_topk, "ratio 128": cfg.live_context // 128}
        for impl in impls:
            for kind, (cache, idx, tlen) in calls.items():
                row = dict(impl=impl, B=B, call=kind, how=how)
                try:
                    fn = lambda: sparse_decode(q, cache, idx, topk_len=tlen, impl=impl,  # noqa: E731
                                                   checks="device")
                    row["graph_us"] = timer(fn) * 1e3
                    row.update(decode_grid(impl, B, cfg.kernel_heads, idx.shape[1], valid[kind.split(" (")[0]]))
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
        log(f"  isolated decode B={B}: " + ", ".join(
            f"{r['impl']}/{r['call'].split(' (')[0]} {r.get('graph_us', float('nan')):.1f}us" for r in rows if r["B"] == B))
        if gpu:
            torch.cuda.empty_cache()
    return rows


def decode_grid(impl: str, B: int, H: int, K: int, valid: int) -> dict:
    """How a decode call of ``impl`` spreads over the chip: ``programs`` launched and the ``tiles`` of
    the index row the busiest program's loop walks (``tile`` entries a tile). SGLang's kernel (S0's) and
    the story's (S1's) walk the whole padded row of K entries; the others stop at the ``valid`` ones.
    SGLang's tile is what its autotuner picked for the call just run (None before any GPU call)."""
    if impl == stage("S0").decode_impl:
        from ..kernels.decode import sglang_peer
        best = getattr(sglang_peer.module()._tiled_sparse_decode_kernel, "best_config", None)
        tile = best.kwargs.get("BLOCK_T") if best is not None else None
        return dict(programs=B * H, tile=tile, tiles=-(-K // tile) if tile else None)
    info = impl_info("sparse_decode", impl)
    if info.launch is None:
        return {}
    launch = info.launch(B, H, K)
    t, n = launch.tiles, launch.nsplit
    split_len = -(-(-(-K // n)) // t.block_n) * t.block_n         # split-K's slice of the row
    walked = K if impl == stage("S1").decode_impl else min(valid, split_len)   # by the busiest program
    return dict(programs=B * -(-H // t.block_h) * n, tile=t.block_n, tiles=-(-walked // t.block_n))


def decode_calls_per_step(layer_ratios) -> dict:
    """The decode calls one step makes, by kind: every layer attends over its window cache; a ratio-4
    layer also over the indexer's top-k of its compressed cache, a ratio-128 layer over every
    compressed token (an index row padded to the max context's width, topk_length valid)."""
    ratios = list(layer_ratios)
    return {"window": len(ratios), "ratio 4": ratios.count(4), "ratio 128": ratios.count(128)}


def isolated_per_step(results: dict):
    """The isolated decode calls (:func:`isolated_decode`, one call per CUDA graph) scaled to one step:
    per impl, B and call kind the time of one call, the calls of that kind a step makes and their
    product in ms per step. Rows that recorded an error are left out. A DataFrame."""
    import pandas as pd
    calls = decode_calls_per_step(results["config"]["layer_ratios"])
    rows = []
    for r in results.get("isolated_decode", []):
        if r.get("graph_us") is None:
            continue
        kind = r["call"].split(" (")[0]
        m = re.search(r"K=(\d+)(?:, (\d+) valid)?", r["call"])
        k = int(m.group(1)) if m else None
        rows.append(dict(impl=r["impl"], B=r["B"], kind=kind, entries=k,
                         valid=int(m.group(2)) if m and m.group(2) else k, us_per_call=r["graph_us"],
                         calls=calls.get(kind, 0), ms_per_step=r["graph_us"] * calls.get(kind, 0) / 1e3))
    return pd.DataFrame(rows, columns=["impl", "B", "kind", "entries", "valid", "us_per_call", "calls", "ms_per_step"])
