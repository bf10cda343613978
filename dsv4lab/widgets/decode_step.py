"""Notebooks 06 and 06a's widgets: the whole decode step, stage by stage."""
from __future__ import annotations

import functools

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from ..device import mode
from .live import slider


@functools.lru_cache(maxsize=1)
def _tiny_model():
    from ..model import CPU_MODEL, Model
    return Model(CPU_MODEL)


def tiny_batch(C: int) -> int:
    """The batch the tiny replay runs for concurrency C: C, at most the small preset's max_batch."""
    from ..model import CPU_MODEL
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

    from .. import replay
    from ..kernels.decode import sglang_peer
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
    from ..testing import STEP_TOL, rel_err
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
    from .. import profile
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
    from .. import profile, replay
    from ..testing import STEP_TOL, rel_err
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
                         C=slider(conc, results.get("profile_batch", conc[-1]), "C"))
