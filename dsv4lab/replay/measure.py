"""Timing one stage's step per concurrency (CUDA-graph replays on a GPU, the wall clock in the
interpreter), profiled where asked, and S0's glue as the number of ratio-4 layers grows."""
from __future__ import annotations

import time

import torch

from .. import bench, profile
from ..device import mode
from ..model import Model, ModelConfig
from ..stages import Stage
from .fit import fit_step_time, median, tokens_per_s
from .plan import Deadline, with_ratio4
from .profiling import profile_cell


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
            row.update(step_ms=median(times), step_ms_all=times, replays=len(times),
                       tok_s=tokens_per_s(C, median(times)), finite=bool(torch.isfinite(out).all()),
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
            m = Model(with_ratio4(cfg, n))
            inp = m.inputs(C, s.max_context)
            m.check(inp)
            fn = lambda: m.step(inp, s)  # noqa: E731
            if gpu:
                g, _ = bench.capture(fn)
                row["step_ms"] = median(replay_ms(g, 3))
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
