"""The campaign replayed end to end: a synthetic decode step (dsv4lab.model) through every stage,
with the kernel-time profile shifting stage by stage and the throughput moving with it.

``python -m dsv4lab reproduce [--quick] [--stages S0 S1 ...] [--out DIR]`` runs :func:`main`:

* each stage's step is captured in one CUDA graph per concurrency C (batch = C, one token per
  request per step) and replayed: step time, tokens/s, and the fit step = a + b x C
  (b: the marginal per-request cost, 1000 / b: the asymptote in tok/s), as the story reports;
* at the story's batch (32) the replays are profiled (torch.profiler): every kernel by name,
  sorted into the story's categories (dsv4lab.profile.RULES); one eager step gives the glue's
  breakdown by aten op and each kernel's launching region (decode time per layer kind);
* the before/after table of every stage transition, a stacked-bar plot of the shift, the
  story's published numbers beside this device's, isolated decode calls (one call per graph)
  for the in-model vs isolated ratio, and the torch.compile lesson (compile the glue, capture
  the step, record what works and what fails, with the error text).

Stages are cumulative (:data:`STAGES`) and follow the story's order: S0 the story's start (SGLang's
SIMT decode kernel, the indexer's torch fallback with an fp32 bmm over the max context, fp32 mHC
pre-linear), S1 the head-batched MMA kernel as the story changed SGLang's (BLOCK_H 32, the same loop
over the whole padded index row), S2 split-K (``splitk_auto``), S3 bf16 GEMMs for the indexer and
mHC, S4 the Triton indexer. Variants, each one change away from the stage it names: "S1stop" (the
lab's: S1's kernel stopping each row at ``topk_length``), "S1best" (the lab's tuned MMA kernel),
"S1cap" (the story's "cap the context to 8192", where the story made it: after its MMA kernel), and
the same cap on S0 and S3.

On a CPU (``--quick`` or no GPU) the same code runs the small preset (model.CPU_MODEL) through
Triton's interpreter, times eager steps on the wall clock and profiles CPU time per region/op:
the numbers mean nothing, every path and file is exercised.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from . import bench, bridge, profile, run_folder, runs
from .device import ceilings, mode
from .model import (ASSUMPTIONS, CPU_MODEL, DSV4_FLASH_TP8, GLUE, INDEXER_TOPK, Model, ModelConfig,
                    assumptions_markdown, weight_bytes)
from .api import sparse_decode
from .registry import impl_info
from .stages import STAGES, STORY_STEPS, TRANSITIONS, Stage, stage  # noqa: F401  (STORY_STEPS: notebooks read it here)

def _repo_relative(text: str) -> str:
    """Error text with this machine's paths to the package cut to ``dsv4lab/...``."""
    return re.sub(r"(/[^\s\"']*)?/(dsv4lab/[\w/.]+)", r"\2", text)


CONCURRENCY = (1, 16, 32, 64)
PROFILE_BATCH = 32            # the story's steady-state batch
CONCURRENCY_CPU = (1, 2)
PROFILE_BATCH_CPU = 2
#: the decode impls timed alone (one call per graph): those of S0, S1, S1stop, S1best and S2
ISOLATED_IMPLS = tuple(dict.fromkeys(stage(n).decode_impl for n in ("S0", "S1", "S1stop", "S1best", "S2")))
#: the lesson's compile modes, least to most likely to clash with an outer capture
COMPILE_VARIANTS = ("default", "reduce-overhead", "default, first call inside the capture")
#: the lessons: (stage, whether its indexer top-k is compiled too). S1 is where the story tried
#: torch.compile (the glue then included the indexer's torch fallback); S4 after the story's fixes
COMPILE_LESSONS = (("S1", True), ("S4", False))
#: ratio-4 layer counts for S0's glue scaling (the other compressed layers ratio 128)
GLUE_SCALING_COUNTS = (0, 7, 14, 21)
DEFAULT_BUDGET_S = 520        # of the 600 s one GPU command may run (imports and the files come on top)


def stage_for(s: Stage, cfg: ModelConfig) -> Stage:
    """The stage for this config: a context cap at or above the config's maximum (the CPU preset
    serves less than 8192) becomes the live context, so the cap still caps."""
    if s.max_context is not None and s.max_context >= cfg.max_context:
        return replace(s, max_context=cfg.live_context)
    return s


# ---------------------------------------------------------------------------------------------
# throughput fit
# ---------------------------------------------------------------------------------------------

def fit_step_time(concurrency, step_ms) -> dict:
    """Least squares step_ms = a + b x C: a (ms, the fixed cost of a step), b (ms per request,
    the marginal cost), r2, and the asymptote 1000 / b tok/s (what the story calls ~33 -> ~77)."""
    import numpy as np
    C, y = np.asarray(concurrency, dtype=float), np.asarray(step_ms, dtype=float)
    if C.shape != y.shape or C.ndim != 1 or len(set(C.tolist())) < 2:
        raise ValueError(f"need >= 2 distinct concurrencies with one step time each, got {concurrency} / {step_ms}")
    b, a = np.polyfit(C, y, 1)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - a - b * C) ** 2).sum())
    return dict(a_ms=float(a), b_ms=float(b), r2=1 - ss_res / ss_tot if ss_tot else 1.0,
                asymptote_tok_s=1000.0 / float(b) if b > 0 else None)


def tokens_per_s(C: int, step_ms: float) -> float:
    return C / (step_ms / 1000.0)


# ---------------------------------------------------------------------------------------------
# a rough up-front time model (H200) for the printed budget; repeats adapt to measured steps
# ---------------------------------------------------------------------------------------------

def estimate_step_ms(cfg: ModelConfig, s: Stage, C: int) -> float:
    """Rough H200 step time (ms), from the recorded runs in data/runs/h200: the torch indexer
    fallback costs ~1.6e-6 ms per (request x max-width position) in fp32, 1.4e-6 in bf16; the
    Triton indexer's top-k ~2e-8; SGLang's SIMT kernel ~1.8e-4 ms per (request x index entry),
    masked entries ~1/6 of that; the lab's kernels ~20 us a call; the rest ~0.35 ms a layer."""
    L = cfg.index_max_seq_len(s.max_context)
    idx = {"torch_fp32": 1.65e-6, "torch_bf16": 1.37e-6, "sglang": 1.37e-6}.get(s.indexer_impl)
    indexer = C * L * idx if idx else 0.03 + 2.1e-8 * C * L
    wide = cfg.c128_width(s.max_context)
    if s.decode_impl in ("sglang", "simt"):
        per = 1.8e-4 if s.decode_impl == "sglang" else 0.65e-4
        window = per * C * cfg.window
        c4 = per * C * cfg.index_topk
        c128 = per * C * (cfg.live_context // 128) + per / 6 * C * wide
    elif s.decode_impl in ("mma_story", "mma_story_stop"):
        # ~7 us a 32-entry tile of one program's loop; programs beyond one wave of 132 SMs queue
        tile = 0.007 * -(-2 * C // 132)
        c128_entries = wide if s.decode_impl == "mma_story" else cfg.live_context // 128
        window, c4, c128 = (tile * -(-k // 32) for k in (cfg.window, cfg.index_topk, c128_entries))
    else:
        window = c4 = c128 = 0.02 + 2e-6 * C * cfg.index_topk
    n0, n4, n128 = cfg.layers_window, cfg.layers_c4, cfg.layers_c128
    decode = n0 * window + n4 * (window + c4) + n128 * (window + c128)
    return n4 * indexer + decode + cfg.num_layers * (0.35 + 0.004 * C)


def estimate_stage_s(cfg, s, concurrency, profile_at) -> float:
    """Seconds one stage takes: Triton compiles (~10 s), per C three eager warm-ups + capture +
    ~max(3, 1 s worth of) replays; where profiled 3 replays (~1.5 s to read the profile) and, at
    the last profiled C, a profiled eager step (~4 s to read)."""
    t = 10.0
    for C in concurrency:
        ms = estimate_step_ms(cfg, s, C)
        t += (4 * ms + max(3 * ms, 1000.0)) / 1e3 + 0.5
        if C in profile_at:
            t += 3 * ms / 1e3 + 1.5
        if C == profile_at[-1]:
            t += 2 * ms / 1e3 + 4.0
    return t


# ---------------------------------------------------------------------------------------------
# measuring one stage
# ---------------------------------------------------------------------------------------------

class Deadline:
    def __init__(self, budget_s: float):
        self.t0 = time.time()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.time() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()


def replay_ms(g, n: int) -> list:
    """Milliseconds of each of n replays of graph g (CUDA events)."""
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return out


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def decode_regions(kp: profile.KernelProfile, br: profile.EagerBreakdown) -> dict:
    """Decode-kernel time per ``dsv4::decode[impl,cR]`` region of one eager step (a GPU run:
    the kernels' launching regions; the interpreter: the regions' own CPU time)."""
    out = {}
    if br.regions:
        for name, regs in br.regions.items():
            if profile.classify(name) == profile.DECODE:
                for reg, us in regs.items():
                    if reg.startswith("dsv4::decode["):
                        out[reg] = out.get(reg, 0.0) + us
    else:
        for r in kp.rows:
            reg = r["name"].split("/")[0]
            if reg.startswith("dsv4::decode[") and profile.classify(r["name"]) == profile.DECODE:
                out[reg] = out.get(reg, 0.0) + r["us"]
    return out


def category_by_region(kp: profile.KernelProfile, br: profile.EagerBreakdown) -> dict:
    """{region: {category: us}} of one eager step (GPU: kernels by launching region; the
    interpreter: the CPU rows' regions)."""
    out = {}
    if br.regions:
        for name, regs in br.regions.items():
            c = profile.classify(name)
            for reg, us in regs.items():
                out.setdefault(reg, {}).setdefault(c, 0.0)
                out[reg][c] += us
    else:
        for r in kp.rows:
            reg = r["name"].split("/")[0]
            if reg.startswith("dsv4::"):                    # the interpreter's rows
                c = profile.classify(r["name"])
                out.setdefault(reg, {}).setdefault(c, 0.0)
                out[reg][c] += r["us"]
    return out


def decode_by_kind(per_region: dict, ratios: list) -> list:
    """Rows per layer kind: a dsv4::decode[impl,cR] region holds both decodes of a layer (window +
    compressed cache) and their merge; only decode-category time counts."""
    rows = []
    for reg, us in sorted(per_region.items()):
        ratio = int(reg.rsplit(",c", 1)[1].rstrip("]"))
        n = ratios.count(ratio)
        rows.append(dict(region=reg, layer_kind=f"ratio {ratio}" if ratio else "window only", layers=n,
                         decode_us_per_layer=us / n, decode_us_all_layers=us))
    return rows


def profile_cell(model: Model, fn, run_once, gpu: bool, C: int, eager: bool = True) -> dict:
    """The kernel profile of one (stage, C): graph replays by kernel name (GPU; the interpreter:
    CPU time per region/op), and with ``eager`` one eager step for the glue by op and the
    kernels' launching regions (decode time per layer kind, the classifier's region check)."""
    if gpu:
        prof, runs = profile.profile_runs(run_once, 3)
        kp = profile.kernel_profile(prof, runs, "graph replay")
        if not kp.rows:                                      # no kernel activity seen in graph replays
            prof, runs = profile.profile_runs(fn, 1)
            kp = profile.kernel_profile(prof, runs, "eager (graph replays showed no kernels)")
        br = (profile.eager_breakdown(profile.profile_runs(fn, 1)[0]) if eager
              else profile.EagerBreakdown([], {}, {}, 0.0))
    else:
        kp = profile.cpu_rows(profile.profile_runs(fn, 1)[0], 1)
        br = profile.cpu_breakdown(kp)
    kp.regions = br.regions
    kernels = kp.kernels()
    return dict(C=C, source=kp.source, runs=kp.runs, total_us=kp.total_us, by_category=kp.by_category(),
                category_by_region=category_by_region(kp, br),
                unclassified_share=kp.unclassified_share(), region_mismatches=profile.region_mismatches(kernels),
                kernels=kernels, decode_by_kind=decode_by_kind(decode_regions(kp, br), model.ratios),
                glue_ops=dict(source="one eager step" + ("" if gpu else ", CPU time"), total_us=br.total_us,
                              ops=br.ops, region_us=br.region_us))


def measure_stage(model: Model, s: Stage, concurrency, profile_at, *, deadline: Deadline, log=print) -> dict:
    """Step time per C (graph replay on a GPU, eager wall clock on a CPU); a kernel profile at
    each C in ``profile_at`` (res["profiles"][str(C)]), with the eager step at the last of them."""
    gpu = mode() == "cuda"
    res = dict(stage=s.as_dict(), steps=[], errors=[], profiles={})
    for C in concurrency:
        row = dict(C=C)
        g = out = run_once = None
        try:
            inp = model.inputs(C, s.max_context)
            model.check(inp)
            fn = lambda: model.step(inp, s)  # noqa: E731
            t0 = time.time()
            if gpu:
                g, out = bench.capture(fn)
                row["capture_s"] = time.time() - t0
                first = replay_ms(g, 1)[0]
                n = int(max(3, min(20, 1000.0 / max(first, 1e-3))))
                if deadline.left() < 60:
                    n = 3
                times = replay_ms(g, n)
                run_once = g.replay
            else:                                            # the interpreter compiles nothing: no warm-up
                out = fn()
                times = [(time.time() - t0) * 1e3]
            row.update(step_ms=_median(times), step_ms_all=times, replays=len(times),
                       tok_s=tokens_per_s(C, _median(times)), finite=bool(torch.isfinite(out).all()),
                       how="CUDA-graph replay, CUDA events, median" if gpu else "eager wall clock (interpreter)")
            if C in profile_at:
                res["profiles"][str(C)] = profile_cell(model, fn, run_once, gpu, C, eager=C == profile_at[-1])
        except Exception as e:                               # a failing cell is a row, not the end of the run
            row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
            res["errors"].append(dict(C=C, error=row["error"]))
        finally:
            g = out = run_once = None                        # the graph's memory pool goes with it
            if gpu:
                torch.cuda.empty_cache()
        res["steps"].append(row)
        log(f"  {s.name} C={C}: " + (f"{row['step_ms']:.2f} ms/step, {row['tok_s']:.1f} tok/s"
                                     if "step_ms" in row else row.get("error", "")))
    ok = [r for r in res["steps"] if "step_ms" in r]
    if len({r["C"] for r in ok}) >= 2:
        res["fit"] = fit_step_time([r["C"] for r in ok], [r["step_ms"] for r in ok])
    return res


def _with_ratio4(cfg: ModelConfig, n: int) -> ModelConfig:
    """cfg with n ratio-4 layers, the rest of its compressed layers ratio 128."""
    return replace(cfg, layers_c4=n, layers_c128=cfg.layers_c4 + cfg.layers_c128 - n)


def glue_scaling(cfg: ModelConfig, s: Stage, C: int, counts, log=print) -> dict:
    """Stage ``s`` at concurrency C with n ratio-4 layers for n in ``counts`` (the other compressed
    layers ratio 128, the same total): kernel time by category from graph replays, and the fit
    glue = g0 + g1 x n (g1: the glue one ratio-4 layer adds, mostly the indexer's fallback)."""
    gpu = mode() == "cuda"
    compressed = cfg.layers_c4 + cfg.layers_c128
    rows = []
    for n in counts:
        if n > compressed:
            continue
        row = dict(ratio4_layers=n, ratio128_layers=compressed - n, window_layers=cfg.layers_window, C=C)
        m = g = run_once = None
        try:
            m = Model(_with_ratio4(cfg, n))
            inp = m.inputs(C, s.max_context)
            m.check(inp)
            fn = lambda: m.step(inp, s)  # noqa: E731
            if gpu:
                g, _ = bench.capture(fn)
                row["step_ms"] = _median(replay_ms(g, 3))
                run_once = g.replay
                kp = profile.kernel_profile(profile.profile_runs(run_once, 2)[0], 2, "graph replay")
            else:                                            # one profiled step (its wall time, profiler included)
                t = time.perf_counter()
                kp = profile.cpu_rows(profile.profile_runs(fn, 1)[0], 1)
                row["step_ms"] = (time.perf_counter() - t) * 1e3
            cats = kp.by_category()
            row.update(kernel_ms=kp.total_us / 1e3, glue_ms=cats[profile.GLUE] / 1e3,
                       fp32_gemm_ms=cats[profile.FP32_GEMM] / 1e3, topk_ms=cats[profile.TOPK] / 1e3)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            m = g = run_once = None
            if gpu:
                torch.cuda.empty_cache()
        rows.append(row)
        log(f"  glue scaling {s.name} C={C}, {n} ratio-4 layers: " +
            (f"glue {row['glue_ms']:.1f} of {row['kernel_ms']:.1f} ms" if "glue_ms" in row else row.get("error", "")))
    ok = [r for r in rows if "glue_ms" in r]
    res = dict(stage=s.name, C=C, rows=rows)
    if len({r["ratio4_layers"] for r in ok}) >= 2:
        f = fit_step_time([r["ratio4_layers"] for r in ok], [r["glue_ms"] for r in ok])
        res["fit"] = dict(glue_fixed_ms=f["a_ms"], glue_per_ratio4_layer_ms=f["b_ms"], r2=f["r2"])
    return res


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
        from .kernels.decode import sglang_peer
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


# ---------------------------------------------------------------------------------------------
# the torch.compile lesson (GPU, in a child process: a failed capture must not poison the run)
# ---------------------------------------------------------------------------------------------

def compile_lesson(out_json: str, stage_name: str = "S4", C: int = PROFILE_BATCH, indexer: bool = False):
    """Compile the glue functions (model.GLUE) with torch.compile, and with ``indexer`` the stage's
    indexer top-k too (the torch fallback, as the story's S1 ran it), capture the whole step in one
    CUDA graph, replay: per variant whether it worked, the error text if not, compile and step
    times, and the largest logit difference from the uncompiled step. Writes ``out_json``."""
    import torch._dynamo as dynamo

    from . import model as model_mod
    rows = []
    s = stage(stage_name)
    compiled = list(GLUE) + ([f"{INDEXER_TOPK}[{s.indexer_impl}]"] if indexer else [])

    def save():
        bench.save(out_json, dict(stage=stage_name, C=C, glue=compiled, torch=torch.__version__, variants=rows))

    m = Model(DSV4_FLASH_TP8)
    inp = m.inputs(C, s.max_context)
    m.check(inp)
    fn = lambda: m.step(inp, s)  # noqa: E731
    g, ref = bench.capture(fn)
    base = _median(replay_ms(g, 10))
    ref = ref.clone()
    del g
    rows.append(dict(variant="no compile (baseline)", ok=True, step_ms=base))
    save()
    for variant in COMPILE_VARIANTS:
        row = dict(variant=variant)
        dynamo.reset()
        compile_mode = variant.split(",")[0]
        mode_arg = None if compile_mode == "default" else compile_mode
        fns = {name: torch.compile(getattr(model_mod, name), mode=mode_arg) for name in GLUE}
        if indexer:
            fns[INDEXER_TOPK] = torch.compile(impl_info("indexer_topk", s.indexer_impl).fn, mode=mode_arg)
        m.use_glue(fns)
        t0 = time.time()
        try:
            if "inside the capture" in variant:
                row["phase"] = "capture (the first call compiles inside it)"
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out = fn()
            else:
                row["phase"] = "compile (two eager calls)"
                fn()
                fn()
                torch.cuda.synchronize()
                row["compile_s"] = time.time() - t0
                row["phase"] = "capture (bench.capture: warm-ups, then the capture)"
                g, out = bench.capture(fn)
            row["phase"] = "replay"
            times = replay_ms(g, 10)
            row.update(ok=True, phase="done", step_ms=_median(times), speedup_vs_baseline=base / _median(times),
                       max_abs_logit_diff=float((out - ref).abs().max()),
                       finite=bool(torch.isfinite(out).all()))
            del g
        except Exception as e:
            row.update(ok=False, error_type=type(e).__name__, error=_repo_relative(str(e))[:1500])
            if e.__context__ is not None:                    # e.g. the capture's end failing after the first error
                row["error_during"] = f"{type(e.__context__).__name__}: {str(e.__context__)[:800]}"
            try:
                torch.cuda.synchronize()
            except Exception as e2:                              # a sticky CUDA error: stop here
                row["after_error"] = f"{type(e2).__name__}: {str(e2)[:300]}"
                rows.append(row)
                save()
                return
        row["seconds"] = time.time() - t0
        rows.append(row)
        save()
        m.use_glue(None)
        torch.cuda.empty_cache()


def _run_compile_lesson(out_dir: Path, stage_name: str, indexer: bool, timeout_s: float, log=print) -> dict:
    path = out_dir / f".compile_lesson_{stage_name}.json"          # merged into reproduce.json, then removed
    cmd = [sys.executable, "-m", "dsv4lab.replay", "--compile-lesson", str(path), "--stage", stage_name]
    cmd += ["--indexer"] if indexer else []
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        tail = (p.stdout + p.stderr)[-2000:]
        rc = p.returncode
    except subprocess.TimeoutExpired as e:
        tail, rc = f"timed out after {timeout_s:.0f} s: {str(e)[-500:]}", "timeout"
    res = json.loads(path.read_text()) if path.exists() else {}
    path.unlink(missing_ok=True)
    res.update(returncode=rc, seconds=time.time() - t0, log_tail=tail)
    log(f"  compile lesson {stage_name}: rc={rc}, " + "; ".join(
        f"{v['variant']}: {'ok %.2f ms' % v['step_ms'] if v.get('ok') else 'FAILED ' + v.get('error_type', '')}"
        for v in res.get("variants", [])))
    return res


# ---------------------------------------------------------------------------------------------
# tables, plots, files
# ---------------------------------------------------------------------------------------------

def _story_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / "campaign"


def _cell(v, floatfmt):
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, float):
        return format(v, floatfmt)
    if isinstance(v, (list, dict)):
        v = json.dumps(v, default=str)
    return str(v).replace("|", "\\|").replace("\n", " ")


def _md(rows, floatfmt=".4g") -> str:
    """A markdown table of dict rows (columns in order of first appearance)."""
    if not rows:
        return "(none)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c), floatfmt) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def _profile(results: dict, stage_name: str, C: int | None = None) -> dict | None:
    """A stage's kernel profile at C (default: the story's batch)."""
    C = results.get("profile_batch", PROFILE_BATCH) if C is None else C
    return results.get("stages", {}).get(stage_name, {}).get("profiles", {}).get(str(C))


def story_comparison(results: dict) -> list:
    """The story's published figures beside this run's synthetic ones, with what differs."""
    import csv
    d = _story_dir()
    if not (d / "story_profile.csv").exists():
        return []
    prof = {r["kernel"]: r for r in csv.DictReader(open(d / "story_profile.csv"))}
    thr = {int(r["concurrency"]): r for r in csv.DictReader(open(d / "story_throughput.csv"))}
    st = results.get("stages", {})
    B = results.get("profile_batch", PROFILE_BATCH)

    def cat(s, c, share=True):
        p = _profile(results, s)
        if not p:
            return None
        v = p["by_category"].get(c, 0.0)
        return 100 * v / p["total_us"] if share else v / 1e3

    def tok(s, C):
        for r in st.get(s, {}).get("steps", []):
            if r["C"] == C and "tok_s" in r:
                return r["tok_s"]
        return None

    def fit(s, k):
        f = st.get(s, {}).get("fit")
        return f[k] if f else None

    def pair(a, b, fmt="{:.3g}"):
        return "n/a" if a is None or b is None else f"{fmt.format(a)} -> {fmt.format(b)}"

    def ratio(a, b):
        return None if a is None or b is None or not b else a / b

    def row(name):
        return prof.get(next((k for k in prof if k.startswith(name)), ""), {})

    dec = (cat("S0", profile.DECODE, False), cat("S1", profile.DECODE, False))
    tot = [(_profile(results, s) or {}).get("total_us") for s in ("S0", "S1")]

    def unit(txt, u):
        return txt if txt == "n/a" else f"{txt} {u}"

    per_step = "story: summed over its profiling window; here: one step's kernels (CUDA-graph replay)"
    shares = ("story: the whole model with collectives, FP8 projections and FP4 MoE kernels; here: no collectives, "
              "bf16 projections, a bf16 MoE stand-in reading FP4's bytes")
    tput = ("story: an 8-GPU server's tok/s (scheduler, sampling, all-reduce included); here: one GPU's share, "
            "C / step time")
    t = row("total")
    out = [
        dict(figure=f"total kernel time S0 -> S1 (batch {B})",
             story=f"{t.get('before_ms')} -> {t.get('after_ms')} ms "
                   f"({float(t.get('before_ms') or 1) / float(t.get('after_ms') or 1):.2f}x)",
             here=unit(pair(*(x / 1e3 if x else None for x in tot), fmt="{:.1f}"), "ms per step")
                  + (f" ({tot[0] / tot[1]:.2f}x)" if all(tot) else ""), differences=per_step),
        dict(figure="sparse-MLA decode kernel time S0 -> S1 (in the model)", story="5350 -> 850 ms (6.3x)",
             here=unit(pair(*dec, fmt="{:.2f}"), "ms per step") + (f" ({dec[0] / dec[1]:.1f}x)" if all(dec) else ""),
             differences=per_step + "; story's kernels on sm_120 (188 SMs), here on this device"),
    ]
    for c, name in ((profile.DECODE, "sparse-MLA decode"), (profile.FP32_GEMM, "FP32 SIMT GEMM"),
                    (profile.GLUE, "elementwise/copy/reduce glue"), (profile.MOE, "FP4 MoE GEMM")):
        r = row(name)
        out.append(dict(figure=f"share: {name} S0 -> S1",
                        story=f"{r.get('before_share_pct')}% -> {r.get('after_share_pct')}%",
                        here=unit(pair(cat("S0", c), cat("S1", c), fmt="{:.1f}"), "%"), differences=shares))
    glue = {o["op"]: 100 * o["share"] for o in ((_profile(results, "S1") or {}).get("glue_ops", {}).get("ops", []))}
    story_ops = runs.story_glue_ops()
    out.append(dict(figure="glue by op after the MMA kernel (S1; % of glue + FP32 GEMM kernel time)",
                    story=", ".join(f"{k.removeprefix('aten::')} {v:g}%" for k, v in story_ops.items()),
                    here=", ".join(f"{k.removeprefix('aten::')} {glue.get(k, 0.0):.1f}%" for k in story_ops)
                    if glue else "n/a",
                    differences="here from one eager step by aten op (graph replays carry no op); the set is the "
                                "kernels the rules call glue or FP32 GEMM"))
    for C in (1, 16, 64):
        r = thr.get(C, {})
        s_txt = (f"{r.get('before_tok_s')} -> {r.get('after_tok_s')} tok/s ({r.get('change_pct')}%)"
                 if r.get("before_tok_s") else f"{r.get('change_pct')}% (only the change was published)")
        a, b = tok("S0", C), tok("S1", C)
        out.append(dict(figure=f"throughput C={C}, S0 -> S1", story=s_txt,
                        here=unit(pair(a, b, fmt="{:.1f}"), "tok/s") + (f" ({100 * (b / a - 1):+.0f}%)" if a and b else ""),
                        differences=tput))
    out.append(dict(figure="marginal per-request cost b, S0 -> S1", story="~30 -> ~13 ms",
                    here=unit(pair(fit("S0", "b_ms"), fit("S1", "b_ms"), fmt="{:.2f}"), "ms"), differences=tput))
    out.append(dict(figure="asymptote 1000/b, S0 -> S1", story="~33 -> ~77 tok/s",
                    here=unit(pair(fit("S0", "asymptote_tok_s"), fit("S1", "asymptote_tok_s"), fmt="{:.0f}"), "tok/s"),
                    differences=tput))
    Cmax = max(results.get("concurrency", [B]))
    for before, after, where in (("S1", "S1cap", "the story's: after its MMA kernel"),
                                 ("S0", "S0cap", "the lab's variant: before the MMA kernel")):
        cap = [ratio(tok(after, C), tok(before, C)) for C in (B, Cmax)]
        out.append(dict(figure=f"cap context to 8192: throughput {after} / {before} (C={B}, C={Cmax}; {where})",
                        story="17.9x" if before == "S1" else "n/a (the story capped after its MMA kernel)",
                        here=", ".join("n/a" if x is None else f"{x:.1f}x" for x in cap),
                        differences=tput + "; the story's concurrency for this figure was not published"))
    c1, c2 = ratio(tok("S1", 1), tok("S0", 1)), ratio(tok("S2", 1), tok("S0", 1))
    sms = results.get("environment", {}).get("device", {}).get("sm_count")
    out.append(dict(figure="C=1: S1 vs S0 (and S2 vs S0) tok/s", story="-29% (S1's grid: 2 programs at B=1)",
                    here="n/a" if c1 is None else f"{100 * (c1 - 1):+.0f}% (S2: "
                    + ("n/a" if c2 is None else f"{100 * (c2 - 1):+.0f}%") + ")",
                    differences=f"{tput}; at B=1 S1 launches 2 programs a call: on the story's 188 SMs, here on "
                                f"{sms or 'no'} SMs (the C = 1 table: programs, tiles and time per layer kind)"))
    for r in out:
        r["setup differences"] = r.pop("differences")
    return out


def c1_question(results: dict, stages=("S0", "S1")) -> list:
    """The story's C = 1 question, answered per layer kind with programs against SMs: for each stage's
    decode impl, each decode call at B = 1 alone (one call per CUDA graph): the programs it launches,
    the share of the SMs they can fill, the tiles the busiest program walks, its time, the time per
    tile of one program's loop, and the call's ms per step; then each stage's whole step at C = 1."""
    sms = results.get("environment", {}).get("device", {}).get("sm_count")
    per = isolated_per_step(results)
    grid = {(r["impl"], r["B"], r["call"].split(" (")[0]): r for r in results.get("isolated_decode", [])}
    rows = []
    for n in stages:
        impl = results.get("stages", {}).get(n, {}).get("stage", {}).get("decode_impl") or stage(n).decode_impl
        for _, r in per[(per.impl == impl) & (per.B == 1)].iterrows():
            g = grid.get((impl, 1, r.kind), {})
            progs, tiles = g.get("programs"), g.get("tiles")
            rows.append(dict(stage=n, impl=impl, what=f"{r.kind} call (K={r.entries}, {r.valid} valid)",
                             programs=progs, sms=sms,
                             sm_share_pct=100 * min(progs, sms) / sms if progs and sms else None,
                             tiles_per_program=tiles, us_per_call=r.us_per_call,
                             us_per_tile=r.us_per_call / tiles if tiles else None,
                             calls_per_step=r.calls, ms_per_step=r.ms_per_step))
        step = next((x for x in results.get("stages", {}).get(n, {}).get("steps", []) if x["C"] == 1), {})
        prof = _profile(results, n, 1)
        rows.append(dict(stage=n, impl=impl, what="the whole step at C = 1 (graph replay)",
                         ms_per_step=step.get("step_ms"), tok_s=step.get("tok_s"),
                         decode_ms_per_step=prof["by_category"].get(profile.DECODE, 0.0) / 1e3 if prof else None))
    return rows


#: what every row of the story table shares (tables.md prints it once above the table)
STORY_SETUP = ("The story: 8x RTX PRO 6000 Blackwell (sm_120, 188 SMs, GDDR7 ~1.8 TB/s), DeepSeek-V4-Flash with its "
               "weights in an SGLang server at a steady batch of 32. Here: one GPU's share of the same shapes on this "
               "device, random weights, no collectives, the MoE stand-in (dsv4lab.model.ASSUMPTIONS).")


def throughput_lines(ax, results: dict, names, colors: dict | None = None):
    """tok/s vs C per stage (markers: measured; lines: C / (a + b C) from the fit); ``colors``:
    stage -> matplotlib color (default: the cycle, in the order of ``names``)."""
    for i, n in enumerate(names):
        color = (colors or {}).get(n, f"C{i % 10}")
        st = results["stages"].get(n, {})
        pts = [(r["C"], r["tok_s"]) for r in st.get("steps", []) if "tok_s" in r]
        if not pts:
            continue
        C, t = zip(*pts)
        ax.plot(C, t, "o", color=color, label=n)
        f = st.get("fit")
        if f:
            xs = [1 + k * (max(C) - 1) / 60 for k in range(61)]
            ax.plot(xs, [x / ((f["a_ms"] + f["b_ms"] * x) / 1e3) for x in xs], "-", color=color, alpha=0.6)
    ax.set_xlabel("concurrency C (batch = C)")
    ax.set_ylabel("tokens / s (one GPU's step)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def story_throughput_points(ax, colors: dict | None = None):
    """The story's published tok/s before (S0) and after (S1) its MMA kernel, on a second y axis of
    ``ax`` (an 8-GPU server's tok/s, not one GPU's share: their scales differ, so they get their own)."""
    thr = runs.campaign("story_throughput")
    twin = ax.twinx()
    for col, n, marker in (("before_tok_s", "S0", "*"), ("after_tok_s", "S1", "P")):
        pts = thr.dropna(subset=[col])
        twin.plot(pts.concurrency, pts[col], marker, ms=11, mfc="none", color=(colors or {}).get(n, "k"),
                  label=f"story, {'before' if n == 'S0' else 'after'} its MMA kernel ({n})")
    twin.set_ylabel("story's tokens / s (8-GPU server; right axis)", fontsize=8)
    twin.legend(fontsize=7, loc="lower right")
    return twin


def story_change_lines(ax, results: dict, pairs=(("S0", "S1"), ("S0", "S1stop")), colors: dict | None = None):
    """tok/s after / before against C: the lab's measured ratio for each (before, after) pair, and the
    story's published change S0 -> S1 (C = 1, 16, 64; C = 16 was published only as this ratio)."""
    import matplotlib.ticker
    st = results.get("stages", {})
    for before, after in pairs:
        a = {r["C"]: r["tok_s"] for r in st.get(before, {}).get("steps", []) if "tok_s" in r}
        b = {r["C"]: r["tok_s"] for r in st.get(after, {}).get("steps", []) if "tok_s" in r}
        Cs = sorted(set(a) & set(b))
        if Cs:
            ax.plot(Cs, [b[C] / a[C] for C in Cs], "o-", color=(colors or {}).get(after), label=f"here: {after} / {before}")
    thr = runs.campaign("story_throughput")
    ax.plot(thr.concurrency, 1 + thr.change_pct / 100, "*", ms=12, color="k", label="story: after / before its MMA kernel")
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_xlabel("concurrency C (batch = C)")
    ax.set_ylabel("tok/s after / before (log)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return ax


def bridge_markdown(f: dict) -> list:
    """tables.md lines of :func:`dsv4lab.bridge.factors`."""
    if "step" not in f:
        return [f.get("note", "(not computed)")]
    lines = [f"Story's GPU: {f['story_gpu']}; this run's: {f['device']}." + (f" {f['assumed']}." if f.get("assumed") else ""),
             "", f"Per layer kind (each call alone at B = {f['batch']}):", "",
             _md([{k: v for k, v in r.items() if not k.endswith("_bound")} for r in f["kinds"]]),
             "", "What bounds each call here (shares of this run's measured ceilings):", "",
             _md([dict(kind=r["kind"], when=w, **r[f"{w}_bound"]) for r in f["kinds"] for w in ("before", "after")])]
    for part in ("step", "c1"):
        p = f.get(part, {})
        if "factors" not in p:
            lines += ["", p.get("note", "")]
            continue
        lines += ["", f"**{p['equation']}**: measured {p['measured']:.4g}, product of the factors {p['product']:.4g}",
                  "", _md(p["factors"])]
    return lines


def sensitivity_markdown(s: dict) -> list:
    """tables.md lines of :func:`dsv4lab.bridge.sensitivity`."""
    if "rows" not in s:
        return [s.get("note", "(not computed)")]
    fit = s["story_fit"]
    return ["The model against measured points it was not fitted to:", "", _md(s["validation"]),
            "", "Each parameter moved alone (the rest at the replay's setting):", "", _md(s["rows"]),
            "", f"Closest setting to the story's after-S1 shares over the whole grid (largest miss "
                f"{fit['largest_miss_pts']:.1f} points; all within {fit['tolerance_pts']} points: "
                f"{fit['reproduces_all_shares']}):", "", _md([fit])]


def with_story_bars(per_stage: dict) -> dict:
    """``per_stage`` ({stage: {category: us}}) with the story's published shares as a bar just before
    S0 ("story\nbefore") and before S1 ("story\nafter"), for a share plot (the story's ms are not all
    published)."""
    story = runs.story_shares()
    out = {}
    for n, v in per_stage.items():
        if n in ("S0", "S1"):
            key = "story\nbefore" if n == "S0" else "story\nafter"
            out[key] = story[key]
        out[n] = v
    return out


def decode_table(results: dict) -> list:
    """Decode kernel time inside the step, per stage and profiled C: all layers (graph replay) and
    per layer kind (one eager step's regions: both caches of a layer and the merge's kernels)."""
    rows = []
    for n, st in results.get("stages", {}).items():
        for C, p in sorted(st.get("profiles", {}).items(), key=lambda kv: int(kv[0])):
            rows.append(dict(stage=n, C=int(C), what=f"all layers ({p['source'].split(':')[0]})", calls=2 * len(results["config"]["layer_ratios"])
                             - results["config"]["layer_ratios"].count(0), decode_ms=p["by_category"].get(profile.DECODE, 0) / 1e3,
                             share_pct=100 * p["by_category"].get(profile.DECODE, 0) / p["total_us"] if p["total_us"] else 0))
            for r in p.get("decode_by_kind", []):
                rows.append(dict(stage=n, C=int(C), what=f"per {r['layer_kind']} layer (eager)", calls=r["layers"],
                                 decode_ms=r["decode_us_per_layer"] / 1e3))
    return rows


def write_outputs(out: Path, results: dict, quick: bool):
    """reproduce.json, tables.md, throughput.csv, profile.csv, kernels.json, two PNGs and one
    .tar.gz of everything (at most 8 files, one folder; the smaller CSVs only in the .tar.gz).
    reproduce.json is written after the others and names each with its SHA-256 (``output``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    st = results.get("stages", {})
    B = results["profile_batch"]
    order = [s.name for s in STAGES if s.name in st]
    main = {n: _profile(results, n) for n in order if _profile(results, n)}
    thr = [dict(stage=n, C=r["C"], step_ms=r.get("step_ms"), tok_s=r.get("tok_s"), replays=r.get("replays"),
                finite=r.get("finite"), error=r.get("error")) for n in order for r in st[n]["steps"]]
    fits = [dict(stage=n, **st[n]["fit"]) for n in order if st[n].get("fit")]
    prof_rows = [dict(stage=n, C=p["C"], category=c, ms=us / 1e3, share_pct=100 * us / p["total_us"] if p["total_us"] else 0)
                 for n in order for p in st[n].get("profiles", {}).values() for c, us in p["by_category"].items()]
    per_stage_cat = {n: p["by_category"] for n, p in main.items()}
    trans = [(a, b, profile.transition_table(per_stage_cat[a], per_stage_cat[b], a, b))
             for a, b in TRANSITIONS if a in per_stage_cat and b in per_stage_cat]
    glue = [dict(stage=n, **o) for n, p in main.items() for o in p["glue_ops"]["ops"][:12]]
    dec = decode_table(results)
    story = story_comparison(results)
    c1 = c1_question(results) if results.get("isolated_decode") else []
    gs = results.get("glue_scaling", {})
    results["tables"] = dict(throughput=thr, fits=fits, profile=prof_rows, glue_ops=glue, decode=dec,
                             transitions=[dict(before=a, after=b, rows=t) for a, b, t in trans], story=story,
                             c1=c1)
    files = {"reproduce.json": out / "reproduce.json", "kernels.json": out / "kernels.json",
             "throughput.csv": out / "throughput.csv", "profile.csv": out / "profile.csv",
             "tables.md": out / "tables.md", "profile_shift.png": out / "profile_shift.png",
             "throughput.png": out / "throughput.png"}
    bench.save(files["kernels.json"], dict(
        device=results["environment"]["device"], torch=results["environment"]["torch"], rules=profile.RULES,
        stages={n: {C: dict(source=p["source"], kernels=p["kernels"], region_mismatches=p["region_mismatches"])
                    for C, p in st[n].get("profiles", {}).items()} for n in order}))
    pd.DataFrame(thr).to_csv(files["throughput.csv"], index=False)
    pd.DataFrame(prof_rows).to_csv(files["profile.csv"], index=False)
    extra = {"fits.csv": fits, "transitions.csv": [dict(before=a, after=b, **r) for a, b, t in trans for r in t],
             "glue_ops.csv": glue, "decode.csv": dec, "story_vs_here.csv": story,
             "glue_scaling.csv": gs.get("rows", []), "isolated_decode.csv": results.get("isolated_decode", []),
             "c1.csv": c1, "factors.csv": [dict(part=part, **r) for part in ("step", "c1")
                                            for r in results.get("factors", {}).get(part, {}).get("factors", [])],
             "sensitivity.csv": results.get("sensitivity", {}).get("rows", [])}
    unit = "ms of CPU time (interpreter: meaningless as GPU time)" if results["mode"] != "cuda" else "ms"
    cfg = results["config"]
    md = [f"# Campaign replay on {results['environment']['device']['name']} ({results['environment']['date']})",
          "", f"Config: {cfg['name']}; layers {cfg['layer_ratios'].count(0)} window-only, "
          f"{cfg['layer_ratios'].count(4)} ratio-4, {cfg['layer_ratios'].count(128)} ratio-128; live context "
          f"{cfg['live_context']}, max context {cfg['max_context']}. Units: {unit}." + (" QUICK (CPU preset)." if quick else ""),
          "", "## Stages", "", _md([dict(stage=s.name, title=s.title, decode=s.decode_impl, indexer=s.indexer_impl,
                                          mhc=s.mhc_gemm, max_context=s.max_context or "config")
                                     for s in STAGES if s.name in st]),
          "", "## Throughput (step = one token per request)", "", _md(thr), "", "## Fit: step_ms = a + b x C", "",
          _md(fits), "", "## Kernel time by category", "", _md(prof_rows)]
    for a, b, t in trans:
        md += ["", f"## {a} -> {b} (C = {B})", "", _md(t, ".4g")]
    md += ["", f"## Glue breakdown by op (one eager step at C = {B}; glue + FP32 GEMM kernels; top 12)", "", _md(glue),
           "", "## Decode kernel time inside the step", "", _md(dec),
           "", "## Isolated decode calls (one call per CUDA graph)", "", _md(results.get("isolated_decode", [])),
           "", f"## S0's glue vs the number of ratio-4 layers (C = {gs.get('C')})", "", _md(gs.get("rows", [])),
           "", _md([gs["fit"]]) if gs.get("fit") else "",
           "", "## The story beside this run", "", STORY_SETUP, "", _md(story),
           "", "## C = 1: programs against SMs, per layer kind (each call alone at B = 1; then the step)", "", _md(c1),
           "", "## From the story's numbers to this run's: the bridge", ""] + bridge_markdown(results.get("factors", {})) + [
           "", "## What the replay's chosen parameters do (sensitivity)", ""] + sensitivity_markdown(
               results.get("sensitivity", {})) + [
           "", "## torch.compile lessons", ""] + [
               line for name, lesson in results.get("compile_lessons", {}).items()
               for line in (f"### {name} (compiled: {', '.join(lesson.get('glue', []))})", "",
                            _md(lesson.get("variants", [])), "")] + [
           "", "## The classifier: unclassified share, and kernels launched where their category says they cannot be",
           "", _md([dict(stage=n, C=p["C"], unclassified_pct=100 * p["unclassified_share"],
                         region_mismatches=len(p["region_mismatches"]))
                    for n in order for p in st[n].get("profiles", {}).values()]),
           "", "## Skipped", "", _md(results.get("skipped", [])), "", "## Assumptions", "", assumptions_markdown(), ""]
    files["tables.md"].write_text("\n".join(md))
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.8))
    profile.category_bars(axes[0], per_stage_cat, title=f"kernel time per step at C={B} ({unit})")
    profile.category_bars(axes[1], with_story_bars(per_stage_cat), share=True,
                          title="share of kernel time (story's published shares beside S0 and S1)")
    if axes[0].get_legend() is not None:
        axes[0].get_legend().remove()
    fig.tight_layout()
    fig.savefig(files["profile_shift.png"], dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    colors = {n: f"C{i % 10}" for i, n in enumerate(order)}
    throughput_lines(axes[0], results, order, colors)
    story_throughput_points(axes[0], colors)
    axes[0].set_title("tokens/s vs concurrency (markers measured, lines: the a + b C fit)", fontsize=9)
    story_change_lines(axes[1], results, colors=colors)
    axes[1].set_title("the change at the MMA kernel, here and in the story", fontsize=9)
    fig.tight_layout()
    fig.savefig(files["throughput.png"], dpi=110)
    plt.close(fig)
    # reproduce.json last but the tar: it names every other file with its hash (run_folder.verify)
    results["output"] = run_folder.manifest(out, [n for n in files if n != "reproduce.json"],
                                            results.get("run_id", "unnamed"))
    bench.save(files["reproduce.json"], results)
    tar = out / "reproduce.tar.gz"                   # everything, with the smaller CSVs only here
    with tarfile.open(tar, "w:gz") as t:
        for p in files.values():
            t.add(p, arcname=f"reproduce/{p.name}")
        for name, rows in extra.items():
            data = pd.DataFrame(rows).to_csv(index=False).encode()
            info = tarfile.TarInfo(f"reproduce/{name}")
            info.size, info.mtime = len(data), int(time.time())
            t.addfile(info, io.BytesIO(data))
    files["reproduce.tar.gz"] = tar
    return files


# ---------------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------------

def glue_scaling_counts(cfg: ModelConfig, counts) -> list:
    """The ratio-4 layer counts the glue scaling can build from ``cfg`` (no more than its compressed
    layers): the same list for its run and for the budget's estimate of it."""
    return [n for n in counts if n <= cfg.layers_c4 + cfg.layers_c128]


def budget_plan(cfg: ModelConfig, todo, concurrency, profile_at, scaling_counts, compile_glue: bool) -> dict:
    """Seconds each part of a GPU run should take (estimates for an H200; the run adapts its repeats
    and skips what no longer fits); built from the same configurations the run builds."""
    s0 = stage_for(stage("S0"), cfg)
    B = profile_at[-1]
    return dict(setup_s=20.0, stages_s={s.name: estimate_stage_s(cfg, s, concurrency, profile_at) for s in todo},
                glue_scaling_s=sum(8.0 + 8 * estimate_step_ms(_with_ratio4(cfg, n), s0, B) / 1e3
                                   for n in glue_scaling_counts(cfg, scaling_counts)),
                isolated_decode_s=35.0, compile_lesson_s=140.0 if compile_glue else 0.0, outputs_s=10.0)


def main(out="reproduce", quick: bool = False, stages=None, budget_s: float | None = None,
         compile_glue: bool = True, config: dict | None = None, log=print) -> dict:
    """Run the replay and write its files to ``out`` (dsv4lab.run_folder: into a fresh folder moved
    into place at the end, so ``out`` is always one whole run); returns the results dict. ``config``:
    ModelConfig fields to change (e.g. the layer mix, live_context)."""
    gpu = mode() == "cuda"
    if quick and gpu:
        log("--quick on a GPU: the CPU preset's small shapes, compiled kernels")
    small = quick or not gpu
    cfg = replace(CPU_MODEL if small else DSV4_FLASH_TP8, **(config or {}))
    concurrency = CONCURRENCY_CPU if small else CONCURRENCY
    profile_batch = PROFILE_BATCH_CPU if small else PROFILE_BATCH
    profile_at = (1, profile_batch)               # the story's batch, and C = 1 (its regression)
    scaling_counts = glue_scaling_counts(cfg, (0, 2) if small else GLUE_SCALING_COUNTS)
    names = list(stages) if stages else [s.name for s in STAGES]
    todo = [stage_for(stage(n), cfg) for n in names]
    out = run_folder.check_out(out)
    plan = budget_plan(cfg, todo, concurrency, profile_at, scaling_counts, compile_glue)
    with run_folder.writing(out) as stage_dir:
        results = _run(stage_dir, cfg, todo, concurrency, profile_at, scaling_counts, plan, quick, budget_s,
                       compile_glue, log)
    log(f"wrote {', '.join(results['output']['files'])}, reproduce.json and reproduce.tar.gz to {out} "
        f"in {results['elapsed_s']:.0f} s")
    return results


def _run(out: Path, cfg, todo, concurrency, profile_at, scaling_counts, plan, quick, budget_s, compile_glue,
         log) -> dict:
    from tqdm.auto import tqdm
    gpu = mode() == "cuda"
    profile_batch = profile_at[-1]
    deadline = Deadline(budget_s or (DEFAULT_BUDGET_S if gpu else 1e9))
    results = dict(environment=bench.environment(), mode=mode(), quick=quick, config=cfg.as_dict(),
                   assumptions=[dict(topic=t, replay=r, source=s) for t, r, s in ASSUMPTIONS],
                   stages_run=[s.as_dict() for s in todo], concurrency=list(concurrency), profile_batch=profile_batch,
                   profiled_at=list(profile_at), budget_s=deadline.budget_s, stages={}, skipped=[],
                   run_id=f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    est = plan["stages_s"] if gpu else {}
    results["budget_plan"] = plan
    if gpu:
        log(f"time budget (estimates for an H200; no new work starts after {deadline.budget_s:.0f} s):")
        parts = [("setup", plan["setup_s"])] + list(est.items()) + [
            ("glue scaling", plan["glue_scaling_s"]), ("isolated decode", plan["isolated_decode_s"]),
            ("compile lesson", plan["compile_lesson_s"]), ("outputs", plan["outputs_s"])]
        for k, v in parts:
            log(f"  {k:>16}: {v:6.0f} s")
        log(f"  {'total':>16}: {sum(v for _, v in parts):6.0f} s")
    t0 = time.time()
    model = Model(cfg)
    results["setup_s"] = time.time() - t0
    results["weight_bytes"] = weight_bytes(model)
    log(f"model built in {results['setup_s']:.1f} s: {cfg.num_layers} layers, C in {concurrency}")
    reserve = plan["outputs_s"] + 15
    if not gpu and todo:                 # one untimed step first: the interpreter's and torch's one-time costs
        model.step(model.inputs(profile_batch, todo[0].max_context), todo[0])
    for s in tqdm(todo, desc="stages", unit="stage"):
        need = est.get(s.name, 0.0)
        if gpu and deadline.left() - reserve < 0.6 * need:
            results["skipped"].append(dict(part=s.name, reason=f"budget: {deadline.left():.0f} s left, ~{need:.0f} s needed"))
            log(f"skip {s.name}: budget")
            continue
        t1 = time.time()
        results["stages"][s.name] = measure_stage(model, s, concurrency, profile_at, deadline=deadline, log=log)
        results["stages"][s.name]["seconds"] = time.time() - t1
        bench.save(out / "reproduce.json", results)          # partial results survive a kill (never 'complete')
    if not gpu or deadline.left() > reserve + plan["isolated_decode_s"]:
        results["isolated_decode"] = isolated_decode(model, batches=(1, profile_batch), log=log)
    else:
        results["skipped"].append(dict(part="isolated decode", reason="budget"))
    del model
    if gpu:
        torch.cuda.empty_cache()
    s0 = stage_for(stage("S0"), cfg)
    if not scaling_counts:
        results["skipped"].append(dict(part="glue scaling", reason="the config has no compressed layer"))
    elif not gpu or deadline.left() > reserve + plan["glue_scaling_s"]:
        results["glue_scaling"] = glue_scaling(cfg, s0, profile_batch, scaling_counts, log=log)
        bench.save(out / "reproduce.json", results)
    else:
        results["skipped"].append(dict(part="glue scaling", reason="budget"))
    results["compile_lessons"] = {}
    for name, indexer in COMPILE_LESSONS if compile_glue else ():
        left = deadline.left() - reserve
        if not gpu:
            results["compile_lessons"][name] = dict(stage=name, variants=[], note="not run: CUDA-graph capture needs a GPU")
        elif left > 90:
            results["compile_lessons"][name] = _run_compile_lesson(out, name, indexer, timeout_s=min(180.0, left), log=log)
        else:
            results["skipped"].append(dict(part=f"compile lesson {name}", reason=f"budget: {left:.0f} s left"))
    results["ceilings"] = ceilings().as_dict()
    results["factors"] = bridge.factors(results)
    results["sensitivity"] = bridge.sensitivity(results)
    results["elapsed_s"] = deadline.elapsed()
    write_outputs(out, results, quick)
    return results


def cli(args) -> dict:
    """``python -m dsv4lab reproduce``'s arguments -> main()."""
    config = {}
    if args.layers:
        config.update(zip(("layers_window", "layers_c4", "layers_c128"), args.layers))
    if args.live_context:
        config["live_context"] = args.live_context
    return main(args.out, args.quick, args.stages, args.budget_s, not args.no_compile, config)


def _child(argv=None):
    p = argparse.ArgumentParser(prog="python -m dsv4lab.replay")
    p.add_argument("--compile-lesson", required=True, help="write the torch.compile lesson's JSON here")
    p.add_argument("--stage", default="S4")
    p.add_argument("--indexer", action="store_true", help="compile the stage's indexer top-k too")
    a = p.parse_args(argv)
    compile_lesson(a.compile_lesson, a.stage, indexer=a.indexer)


if __name__ == "__main__":
    import dsv4lab  # noqa: F401  (sets the mode before triton is imported)
    _child()
