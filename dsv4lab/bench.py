"""Timing on the GPU: do_bench medians, eager and CUDA-graph replay, and the
decode benchmark table that notebooks and recorded runs share.

Timings are only taken in cuda mode; the interpreter has no clock worth reading.
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import statistics
import time

import pandas as pd
import torch
import triton
import triton.language as tl

from . import api, roofline
from .config import PAGE_SIZE
from .device import VERSIONED, ceilings, info, mode
from .registry import impl_info, registered


def capture(fn):
    """Capture ``fn()`` in a CUDA graph (after warm-up on a side stream); return (graph, result)."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = fn()
    torch.cuda.synchronize()
    return g, res


def time_ms(fn, *, graph=False, warmup=25, rep=100) -> float:
    """Median milliseconds of ``fn`` (do_bench: L2 flushed between runs, CUDA events)."""
    if mode() != "cuda":
        raise RuntimeError("timings need a CUDA GPU; in interpret mode read the recorded runs in data/runs/")
    from triton.testing import do_bench
    if graph:
        g, _ = capture(fn)
        fn = g.replay
    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def back_to_back_us(fn, *, batches: int = 7, calls: int = 50) -> dict:
    """An eager loop's cost per call: ``calls`` calls issued back to back between two CUDA events,
    ``batches`` times; the medians of the GPU time per call (events: whichever of the host and the
    GPU is slower sets it) and of the host's wall time per call. do_bench flushes L2 before each
    call, and the host issues the next call while the flush runs, so its median hides the host;
    one event pair per call would add the events' own host cost to every call."""
    if mode() != "cuda":
        raise RuntimeError("timings need a CUDA GPU; in interpret mode read the recorded runs in data/runs/")
    for _ in range(10):
        fn()
    gpu, host = [], []
    for _ in range(batches):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        t = time.perf_counter()
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        host.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
        gpu.append(a.elapsed_time(b) / calls * 1e3)
    return dict(per_call_us=statistics.median(gpu), host_us=statistics.median(host))


#: calls per graph for the in-graph time per call (time_per_call_in_graph_ms), as in a captured
#: decode step: DSv4-Flash has 43 layers; 8 copies of the inputs already make the graph launch a
#: small share of the step and keep B=128's copies at ~5 GB
LAYERS = 8


def time_per_call_in_graph_ms(fns, *, warmup=25, rep=100) -> float:
    """Median milliseconds per call of one CUDA graph that runs ``fns[0](), fns[1](), ...`` back
    to back, L2 flushed before each replay (do_bench). Each fn works on its own buffers, like the
    layers of one captured decode step (SGLang captures the whole step): the graph's launch is
    paid once for all of them, where a one-call graph pays it every call (launch_floor_us)."""
    if mode() != "cuda":
        raise RuntimeError("timings need a CUDA GPU; in interpret mode read the recorded runs in data/runs/")
    from triton.testing import do_bench

    def step():
        for fn in fns:
            fn()
    g, _ = capture(step)
    return float(do_bench(g.replay, warmup=warmup, rep=rep, return_mode="median")) / len(fns)


def layer_copies(inp, layers: int) -> list:
    """``layers`` input sets for in-graph timing: ``inp`` and copies of it in new memory (the cache,
    q, indices cloned), so no call reads bytes an earlier call of the step left in L2."""
    from dataclasses import replace
    out = [inp]
    for _ in range(layers - 1):
        out.append(replace(inp, q=inp.q.clone(), indices=inp.indices.clone(),
                           cache=replace(inp.cache, buffer=inp.cache.buffer.clone())))
    return out


@triton.jit
def _empty_kernel(X):
    if tl.program_id(0) < 0:          # never true: a launch that does no work
        tl.store(X, 0)


def launch_floor_us(programs: int | None = None, *, in_graph: bool = False) -> dict:
    """What launches that do nothing cost as every decode time here is taken (do_bench median,
    L2 flushed, CUDA-graph replay; also eager): one launch of ``programs`` (default: one per SM)
    and two back to back, like split-K's pair; with ``in_graph`` also the time per launch in one
    graph of LAYERS launches (time_per_call_in_graph_ms). The floor of the launch mechanism: the
    empty kernel has 4 warps and no shared memory, so real kernels (8 warps, ~100-200 KB of
    shared memory a block) cost somewhat more to start."""
    x = torch.zeros(1, device="cuda")
    grid = (programs or info().sm_count,)
    one = lambda: _empty_kernel[grid](x)  # noqa: E731

    def two():
        _empty_kernel[grid](x)
        _empty_kernel[grid](x)
    two()
    torch.cuda.synchronize()
    # a first pass in a process once measured one launch above two (10.3 vs 5.3 us): warm up,
    # interleave the shapes over three passes and keep each one's lowest median
    runs = {"one_launch_graph_us": [], "two_launches_graph_us": [], "one_launch_eager_us": []}
    if in_graph:
        runs["per_launch_in_graph_us"] = []
    for _ in range(3):
        runs["one_launch_graph_us"].append(time_ms(one, graph=True) * 1e3)
        runs["two_launches_graph_us"].append(time_ms(two, graph=True) * 1e3)
        runs["one_launch_eager_us"].append(time_ms(one) * 1e3)
        if in_graph:
            runs["per_launch_in_graph_us"].append(time_per_call_in_graph_ms([one] * LAYERS) * 1e3)
    return {**{k: min(v) for k, v in runs.items()},
            "how": f"empty kernel (4 warps, no shared memory), {grid[0]} programs; do_bench median, L2 flushed; "
                   f"lowest of 3 interleaved passes"}


def decode_row(impl, inp, *, graph=True, eager=True, baseline_us=None, layer_inputs=None,
               baseline_layer_us=None, **kw) -> dict:
    """Time one impl on one input set and derive bytes, FLOP/s and shares of the ceilings.
    ``eager_us`` is do_bench's median without a graph: L2 is flushed before each call and the host
    issues the call meanwhile, so it is the GPU's time when the host keeps up; ``back_to_back_us``
    is what a loop of eager calls pays a call, the host's issue time included. ``layer_inputs``
    (layer_copies): also graph_layer_us, the time per call inside one graph of len(layer_inputs)
    calls (time_per_call_in_graph_ms), and its TFLOP/s and speedup."""
    B, H, _ = inp.q.shape
    K = inp.indices.shape[1]
    fn = lambda **c: api.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs(), **kw, **c)  # noqa: E731
    row = {"impl": impl, "B": B, "H": H, "K": K}
    if eager:
        row["eager_us"] = time_ms(fn) * 1e3                   # checks="device": no host sync
        _add_back_to_back(row, fn)
        # the same launches after the host checks of checks="sync" (a few host syncs a call)
        row["eager_sync_checks_us"] = time_ms(lambda: fn(checks="sync")) * 1e3
    if graph:
        row["graph_us"] = time_ms(fn, graph=True) * 1e3
    if layer_inputs:
        calls = [lambda x=x: api.sparse_decode(x.q, x.cache, x.indices, impl=impl, **x.kwargs(), **kw)
                 for x in layer_inputs]
        try:                               # a failure here keeps the times above
            row["graph_layer_us"] = time_per_call_in_graph_ms(calls) * 1e3
        except Exception as e:
            row["graph_layer_error"] = repr(e)[:300]
        else:
            row["layers"] = len(layer_inputs)
            row["tflops_layer"] = roofline.decode_flops(B, H, K) / (row["graph_layer_us"] * 1e-6) / 1e12
            if baseline_layer_us:
                row["speedup_vs_baseline_layer"] = baseline_layer_us / row["graph_layer_us"]
    us = row.get("graph_us", row.get("eager_us"))
    served = roofline.decode_served_bytes(B, H, K, impl_info("sparse_decode", impl).heads_per_read(B, H, K))
    floor = roofline.decode_floor_bytes(B, H, K)
    flops = roofline.decode_flops(B, H, K)
    c = ceilings()
    row.update(served_bytes=served, floor_bytes=floor, flops=flops,
               served_tb_s=served / (us * 1e-6) / 1e12, floor_tb_s=floor / (us * 1e-6) / 1e12,
               tflops=flops / (us * 1e-6) / 1e12)
    if c.copy_tb_s:
        fl = roofline.floor_us(floor, flops, c.copy_tb_s, c.bf16_tflops)
        row.update(floor_us=fl["floor_us"], bw_share=row["floor_tb_s"] / c.copy_tb_s,
                   mma_share=row["tflops"] / c.bf16_tflops)
    if baseline_us:
        row["speedup_vs_baseline"] = baseline_us / us
    return row


def indexer_row(impl, inp, *, graph=True, eager=True) -> dict:
    """Time one indexer_logits impl on one input set (testing.IndexerInputs) through its registered
    function (no API checks, so no host sync; ``eager_us`` and ``back_to_back_us`` as in
    decode_row), with the bytes the live context needs (keys once, q, weights) and writes (the [B, max_seq_len] fp32 logits), and the floor they imply."""
    from .config import INDEX_TOKEN_BYTES
    fn = impl_info("indexer_logits", impl).fn
    B, H, _ = inp.q.shape
    L = inp.max_seq_len
    read = int(inp.seq_lens.sum()) * INDEX_TOKEN_BYTES + inp.q.numel() * inp.q.element_size() + B * H * 4
    row = dict(impl=impl, B=B, H=H, live=int(inp.seq_lens.max()), max_seq_len=L, live_bytes=read, out_bytes=B * L * 4)
    c = ceilings()
    if c.copy_tb_s:
        row["floor_us"] = (read + B * L * 4) / (c.copy_tb_s * 1e12) * 1e6
    call = lambda: fn(*inp.args(), max_seq_len=L)  # noqa: E731
    if graph:
        row["graph_us"] = time_ms(call, graph=True) * 1e3
    if eager:
        row["eager_us"] = time_ms(call) * 1e3
        _add_back_to_back(row, call)
    return row


def _add_back_to_back(row: dict, fn):
    """row["back_to_back_us"] of ``fn``; a failure is recorded beside the times already measured."""
    try:
        row["back_to_back_us"] = back_to_back_us(fn)["per_call_us"]
    except Exception as e:
        row["back_to_back_error"] = repr(e)[:300]


def indexer_topk_row(inp, topk=512) -> dict:
    """Time the top-k that follows the logits (torch.topk over the max-wide rows of the Triton
    indexer's logits; graph replay): the same columns as indexer_row."""
    from .kernels.indexer.fallback import topk_from_logits
    from .stages import stage
    B, H, _ = inp.q.shape
    L = inp.max_seq_len
    logits = impl_info("indexer_logits", stage("S4").indexer_impl).fn(*inp.args(), max_seq_len=L)
    return dict(impl="topk (torch.topk on the logits)", B=B, H=H, live=int(inp.seq_lens.max()), max_seq_len=L,
                graph_us=time_ms(lambda: topk_from_logits(logits, topk), graph=True) * 1e3)


def decode_table(impls, batches, *, H=64, K=512, context=8192, page_size=PAGE_SIZE, baseline=None,
                 graph=True, log=None, layers=0) -> list[dict]:
    """Time ``impls`` at each batch size on the campaign's inputs (request b owns ``context``
    tokens of one paged cache, seed = B); one row per (impl, B), errors recorded, not raised.
    ``baseline`` (an impl in ``impls``, timed first) sets speedup_vs_baseline; rows of impls with a
    launch description (Impl.launch) carry the launch they took, a dispatcher's rows the impl it ran. ``layers`` > 1: also the time per call inside
    a graph of that many calls on copies of the inputs (decode_row). `record`, the CLI and the
    notebooks share this."""
    from .testing import make_decode_inputs
    impls = sorted(impls, key=lambda i: i != baseline)              # the baseline first: the others divide by it
    rows = []
    for B in batches:
        inp = make_decode_inputs(B, H, K, context=context, page_size=page_size, seed=B)
        copies = layer_copies(inp, layers) if graph and layers > 1 else None
        base = base_layer = None
        for impl in impls:
            try:
                row = decode_row(impl, inp, graph=graph, baseline_us=base, layer_inputs=copies,
                                 baseline_layer_us=base_layer)
            except Exception as e:  # a failing impl is a row, not the end of the table
                row = dict(impl=impl, B=B, error=repr(e)[:300])
            if impl == baseline:
                base = row.get("graph_us", row.get("eager_us"))
                base_layer = row.get("graph_layer_us")
            info_ = impl_info("sparse_decode", impl)
            if info_.launch is not None:
                row["launch"] = info_.launch(B, H, K).as_dict()
            elif info_.dispatch is not None:
                row["ran"] = info_.runs(B, H, K).name
            rows.append(row)
            if log:
                log(row)
        del inp, copies
        torch.cuda.empty_cache()
    return rows


#: the indexer's max contexts the recorded run times (the story's setting: 32 requests with 8192 live
#: tokens each, a max context of 262208)
INDEXER_MAX_LENS = [8192, 32768, 131072, 262208]


def measure_decode(impls, batches, shapes=None, layers=None) -> pd.DataFrame:
    """Time ``impls`` at each batch size live (GPU only), with the recorded table's columns.

    Same inputs as the recorded run: ``shapes.context`` tokens per request, pages of 64, and
    the time per call in a graph of ``layers`` calls (default LAYERS; 0: skip it).
    The first impl in ``impls`` is the baseline for ``speedup_vs_baseline``.
    """
    from .config import shapes as _shapes
    s = shapes or _shapes()
    rows = decode_table(impls, batches, H=s.heads, K=s.topk, context=s.context, page_size=s.page_size,
                        baseline=impls[0], layers=LAYERS if layers is None else layers)
    return pd.DataFrame(rows)


def measure_indexer(impls, B=32, max_lens=None, live=8192, H=64, topk=512) -> pd.DataFrame:
    """Time indexer ``impls`` live (GPU only) with the recorded table's columns (kind="time"):
    ``live`` tokens per request at each max context (default: the recorded run's), and
    torch.topk on the Triton logits."""
    from .testing import make_indexer_inputs
    rows = []
    for L in max_lens or INDEXER_MAX_LENS:
        inp = make_indexer_inputs(B, H, L, seq_lens=live, seed=13)
        rows += [dict(kind="time", **indexer_row(i, inp)) for i in impls]
        rows.append(dict(kind="time", **indexer_topk_row(inp, topk)))
    return pd.DataFrame(rows)


def measure_indexer_step(max_lens=(8192, 65536, 262208, 1048576), lives=(1024, 8192, 65536), B=32, live=8192,
                         live_max=1048576, H=64, topk=512, torch_impls=None, torch_max=262208) -> pd.DataFrame:
    """Time the indexer step (logits + top-k, the registered functions a captured graph runs) live
    (GPU only), with the columns of experiments/indexer_topk's rows: kind="step_vs_max" (``live``
    tokens a request at each max context; ``torch_impls`` only up to ``torch_max``) and
    kind="step_vs_live" (the Triton step, S4's, at each live length, max context ``live_max``, with its logits
    and its top-k timed alone); graph replay, and the floor of the bytes at this device's copy ceiling."""
    from .kernels.indexer.triton_indexer import logits_triton
    from .kernels.indexer.topk import topk_triton
    from .roofline import indexer_bytes, indexer_step_bytes
    from .stages import stage
    from .testing import make_indexer_inputs
    triton_impl, torch_impls = stage("S4").indexer_impl, torch_impls or (stage("S3").indexer_impl,)
    copy = ceilings().copy_tb_s * 1e12
    rows = []

    def us(fn):
        return time_ms(fn, graph=True) * 1e3

    def step_row(kind, impl, n, L):
        inp = make_indexer_inputs(B, H, L, seq_lens=n, seed=13)
        fn = impl_info("indexer_topk", impl).fn
        row = dict(kind=kind, impl=impl, B=B, live=n, max_seq_len=L,
                   graph_us=us(lambda: fn(*inp.args(), max_seq_len=L, topk=topk)),
                   floor_us=indexer_step_bytes(B, n, H, k=topk) / copy * 1e6)
        if kind == "step_vs_live":
            x = logits_triton(*inp.args(), L, fill_dead=False)
            row.update(logits_us=us(lambda: logits_triton(*inp.args(), L, fill_dead=False)),
                       topk_us=us(lambda: topk_triton(x, inp.seq_lens, topk)))
            row["logits_share_of_copy"] = indexer_bytes(B, n, H) / (row["logits_us"] * 1e-6) / copy
        rows.append(row)
    for L in max_lens:
        for impl in (triton_impl,) + tuple(torch_impls if L <= torch_max else ()):
            step_row("step_vs_max", impl, live, L)
    for n in lives:
        step_row("step_vs_live", triton_impl, n, live_max)
    return pd.DataFrame(rows)


def environment() -> dict:
    """Device, versions and date: stamped into every recorded run, with the tile table and the
    launch options each recorded impl with a launch description takes at the campaign's B = 1 and 32
    (none in compile mode: no device, so no SM count to plan with)."""
    from .kernels.decode import planning
    d = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "device": info().as_dict(), "python": platform.python_version(),
         **{name: importlib.import_module(name).__version__ for name in VERSIONED},
         "tile_table": planning.table_dict(),
         "launches": {f"{i.name} B={B}": i.launch(B, 64, 512).as_dict() for i in registered(tag="recorded")
                      if i.launch is not None for B in (1, 32)} if mode() != "compile" else None}
    from .kernels.decode import sglang_peer
    try:
        sglang_peer.sglang_file()
        sglang = sglang_peer.SGLANG_VERSION
    except ImportError:
        sglang = None                       # no wheel: its kernel does not run here
    d["sglang"] = sglang
    return d


def save(path, payload: dict):
    """``payload`` as JSON at ``path``, written whole or not at all (a temporary file moved into place:
    a run killed mid-write never leaves a truncated file under the final name)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    os.replace(tmp, path)
