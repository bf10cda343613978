"""From the story's numbers to this device's: named factors, and what the story's unpublished
parameters do to its tables.

The story measured its head-batched kernel's gain inside its server on 8 RTX PRO 6000 Blackwell GPUs
(sm_120, 188 SMs); the replay measures the same change on this device. :func:`factors` writes the
difference as one product,

    story's attention speedup x GPU factor x layer-mix factor x in-step factor x residue
        = this device's S0 -> S1 decode speedup in the step (measured)

* **GPU factor**: each decode call's time moved to the story's GPU by what bounds it. Neither kernel
  is near a byte or FLOP ceiling (the run's evidence columns say how far); both are bound by the
  instruction stream of their loops, so a call scales with the CUDA-core rate of one SM (datasheet
  FP32 / SMs: the clock times the lanes) times how many SMs its programs can fill
  (:func:`speed_ratio`). SGLang's kernel launches B x H programs and fills both chips at the story's
  batch; the story's kernel launches B x 2 and fills neither, so it gains less from the bigger chip.
* **layer-mix factor**: the step's speedup is a call-weighted mean over layer kinds, and the story's
  mix of window-only, ratio-4 and ratio-128 layers is not published: a range over plausible mixes.
* **in-step factor**: the decode inside the captured step against the same calls timed alone.
* **residue**: what is left, printed as such.

:func:`sensitivity` moves the parameters the replay had to choose (the layer mix, the live context,
the served maximum) over a range with a cost model built from the run's own per-layer measurements
(:func:`cost_model`), validated against the run's measured points that the model was not fitted to.
"""
from __future__ import annotations

import math
from dataclasses import fields

from . import profile, runs
from .config import HEAD_DIM, TOKEN_BYTES
from .device import KNOWN_DEVICES
from .registry import impl_info

STORY_GPU = "NVIDIA RTX PRO 6000 Blackwell"
#: whose datasheet figures stand in for a device without any (a CPU run)
ASSUMED_HERE = "NVIDIA H200"
KINDS = ("window", "ratio 4", "ratio 128")
#: the stages whose change the story published (its kernel before and after), and the capped variants
BEFORE, AFTER = "S0", "S1"
CAPPED = {"S0": "S0cap", "S1": "S1cap"}
#: plausible layer mixes of the 43 layers: window-only layers, and the ratio-4 share of the rest
MIX_WINDOW = (0, 1, 2, 3, 4)
MIX_RATIO4_SHARE = (0.25, 0.375, 0.5, 0.625, 0.75)
#: the sensitivity's one-at-a-time ranges
SENS_RATIO4 = (0, 5, 10, 15, 21, 26, 31, 36, 41)
SENS_LIVE = (2048, 4096, 8192, 32768, 131072)
SENS_MAX = (8192, 32768, 131072, 262144, 1048576)
#: how close (percentage points) every after-S1 share must come to call a setting a reproduction
SHARE_TOLERANCE_PTS = 2.5


def story_attention_speedup() -> float:
    row = runs.campaign("story_profile").set_index("kernel").filter(like="sparse-MLA", axis=0).iloc[0]
    return float(row.before_ms) / float(row.after_ms)


def story_c1_ratio() -> float:
    """The story's tok/s after / before its MMA kernel at concurrency 1 (11.47 -> 8.13)."""
    r = runs.campaign("story_throughput").set_index("concurrency").loc[1]
    return float(r.after_tok_s) / float(r.before_tok_s)


def story_after_shares() -> dict:
    """The story's published shares after its kernel (%), by dsv4lab.profile category."""
    return {c: v for c, v in runs.story_shares()["story\nafter"].items() if c != profile.OTHER}


def spec(name: str) -> dict:
    if name not in KNOWN_DEVICES or not KNOWN_DEVICES[name].get("fp32_tflops_datasheet"):
        raise KeyError(f"no datasheet figures for {name!r} in dsv4lab.device.KNOWN_DEVICES "
                       f"(it has {sorted(KNOWN_DEVICES)})")
    return KNOWN_DEVICES[name]


def speed_ratio(programs: int, here: dict, story: dict) -> float:
    """How much faster a call of ``programs`` programs runs on ``story`` than on ``here`` (datasheet
    dicts) when its loops' instruction stream bounds it: per-SM CUDA-core rate, over the waves of
    programs each SM runs (a call with fewer programs than SMs gains only the per-SM rate)."""
    def rate(d):
        return d["fp32_tflops_datasheet"] / d["sm_count"] / max(1.0, programs / d["sm_count"])
    return rate(story) / rate(here)


# ---------------------------------------------------------------------------------------------
# reading a run
# ---------------------------------------------------------------------------------------------

def _iso(results: dict) -> dict:
    """{(impl, B, kind): isolated row} of the run's one-call-per-graph decode timings."""
    return {(r["impl"], r["B"], r["call"].split(" (")[0]): r for r in results.get("isolated_decode", [])
            if r.get("graph_us") is not None}


def _calls(results: dict) -> dict:
    ratios = results["config"]["layer_ratios"]
    return {"window": len(ratios), "ratio 4": ratios.count(4), "ratio 128": ratios.count(128)}


def _decode_ms(results: dict, stage: str, C: int) -> float | None:
    p = results.get("stages", {}).get(stage, {}).get("profiles", {}).get(str(C))
    return p["by_category"].get(profile.DECODE, 0.0) / 1e3 if p else None


def _impl(results: dict, stage: str) -> str:
    return results["stages"][stage]["stage"]["decode_impl"]


def _step(results: dict, stage: str, C: int) -> float | None:
    for r in results.get("stages", {}).get(stage, {}).get("steps", []):
        if r["C"] == C and "step_ms" in r:
            return r["step_ms"]
    return None


def _mix_calls(window_only: int, ratio4: int, layers: int) -> dict:
    return {"window": layers, "ratio 4": ratio4, "ratio 128": layers - window_only - ratio4}


def plausible_mixes(layers: int) -> list[dict]:
    """Window-only layers in MIX_WINDOW, the ratio-4 share of the others in MIX_RATIO4_SHARE (each mix
    once; a model of fewer layers keeps at least one compressed layer)."""
    out = []
    for w in MIX_WINDOW:
        for share in MIX_RATIO4_SHARE:
            if w >= layers:
                continue
            n4 = round(share * (layers - w))
            m = dict(window_only=w, ratio4=n4, ratio128=layers - w - n4)
            if m not in out:
                out.append(m)
    return out


# ---------------------------------------------------------------------------------------------
# the bridge
# ---------------------------------------------------------------------------------------------

def _bound_evidence(row: dict, impl: str, B: int, H: int, valid: int, ceilings: dict) -> dict:
    """How far a measured call is from this device's ceilings: the SMs its programs fill, its bytes
    (each live token's 584 bytes once) against the copy ceiling, its arithmetic (the loop's products
    over every walked entry: tensor-core bf16 for an impl tagged "tensor_core", else CUDA-core FP32)."""
    tensor_core = "tensor_core" in impl_info("sparse_decode", impl).tags
    us = row["graph_us"]
    walked = (row.get("tiles") or 0) * (row.get("tile") or 0)
    flops = 4 * B * H * walked * HEAD_DIM
    out = dict(dram_share_pct=None, math_share_pct=None)
    if ceilings.get("copy_tb_s"):
        out["dram_share_pct"] = 100 * B * valid * TOKEN_BYTES / (us * 1e-6) / (ceilings["copy_tb_s"] * 1e12)
    ceil = ceilings.get("bf16_tflops") if tensor_core else ceilings.get("fp32_tflops")
    if ceil and walked:
        out["math_share_pct"] = 100 * flops / (us * 1e-6) / (ceil * 1e12)
    out["math_unit"] = "tensor-core bf16" if tensor_core else "CUDA-core FP32"
    return out


def factors(results: dict, B: int | None = None, story_gpu: str = STORY_GPU) -> dict:
    """The bridge from the story's attention speedup to this run's S0 -> S1 decode speedup at the
    story's batch: per layer kind and for the whole step (``step``), each factor with its source, and
    the same for the change in tok/s at C = 1 (``c1``). Empty when the run lacks the measurements.
    ``story_gpu`` (a name in KNOWN_DEVICES with datasheet figures): the GPU the story's figures are taken
    to come from; another one asks what the same published figures would imply had they come from it."""
    B = B or results.get("profile_batch", 32)
    dev = dict(results.get("environment", {}).get("device", {}))
    if not {BEFORE, AFTER} <= set(results.get("stages", {})):
        return dict(note=f"needs the stages {BEFORE} and {AFTER}")
    assumed = None
    if dev.get("name") not in KNOWN_DEVICES:            # a CPU run: every path, numbers that mean nothing
        assumed = (f"{dev.get('name')} has no datasheet entry: its figures are taken as {ASSUMED_HERE}'s, "
                   f"and interpreter times are not GPU times")
        dev["name"] = ASSUMED_HERE
    iso, calls = _iso(results), _calls(results)
    i0, i1 = _impl(results, BEFORE), _impl(results, AFTER)
    if not all((i, b, k) in iso for i in (i0, i1) for b in (1, B) for k in KINDS if calls[k]):
        return dict(note="needs the isolated decode calls of both stages' impls at B = 1 and the story's batch")
    here, story = spec(dev["name"]), spec(story_gpu)
    H = results["config"]["kernel_heads"]
    cfg = results["config"]
    valid = {"window": cfg["window"], "ratio 4": cfg["index_topk"], "ratio 128": cfg["live_context"] // 128}
    ceilings = results.get("ceilings") or {}
    spec_src = f"datasheets (dsv4lab.device.KNOWN_DEVICES): {dev['name']}, {story_gpu}"
    kinds = []
    for k in KINDS:
        if not calls[k]:
            continue
        r0, r1 = iso[(i0, B, k)], iso[(i1, B, k)]
        f0, f1 = speed_ratio(r0["programs"], here, story), speed_ratio(r1["programs"], here, story)
        ratio = r0["graph_us"] / r1["graph_us"]
        kinds.append(dict(kind=k, calls_per_step=calls[k], before_us=r0["graph_us"], after_us=r1["graph_us"],
                          speedup_here=ratio, before_programs=r0["programs"], after_programs=r1["programs"],
                          before_on_story_gpu=f0, after_on_story_gpu=f1, gpu_factor=f0 / f1,
                          speedup_story_gpu_predicted=ratio / (f0 / f1),
                          residue_if_all_calls_this_kind=ratio / (f0 / f1) / story_attention_speedup(),
                          before_bound=_bound_evidence(r0, i0, B, H, valid[k], ceilings),
                          after_bound=_bound_evidence(r1, i1, B, H, valid[k], ceilings)))
    by = {r["kind"]: r for r in kinds}

    def speedup(mix_calls, gpu: bool) -> float:
        num = sum(n * by[k]["before_us"] / (by[k]["before_on_story_gpu"] if gpu else 1) for k, n in mix_calls.items() if n)
        den = sum(n * by[k]["after_us"] / (by[k]["after_on_story_gpu"] if gpu else 1) for k, n in mix_calls.items() if n)
        return num / den

    measured = _decode_ms(results, BEFORE, B) / _decode_ms(results, AFTER, B)
    iso_lab, story_lab = speedup(calls, False), speedup(calls, True)
    mixes = []
    for m in plausible_mixes(len(cfg["layer_ratios"])):
        mix = _mix_calls(m["window_only"], m["ratio4"], len(cfg["layer_ratios"]))
        if any(n and k not in by for k, n in mix.items()):
            continue                                          # a kind this run's model has no layer of
        s = speedup(mix, True)
        mixes.append(dict(m, speedup_story_gpu_predicted=s, mix_factor=story_lab / s,
                          residue=s / story_attention_speedup()))
    if not mixes:
        return dict(note="the run's model lacks a layer kind every plausible mix has: no layer-mix factor")
    lo = min(mixes, key=lambda m: m["mix_factor"])
    hi = max(mixes, key=lambda m: m["mix_factor"])
    table = [
        dict(factor="story's attention speedup", value=story_attention_speedup(),
             source="published: the story's sparse-MLA decode 5350 -> 850 ms (data/campaign/story_profile.csv)"),
        dict(factor="GPU factor", value=iso_lab / story_lab,
             source=f"{spec_src}; programs per call from each kernel's grid in this run; the loop-bound model "
                    f"(dsv4lab.bridge.speed_ratio) checked against this run's evidence columns"),
        dict(factor="layer-mix factor", value=1.0, low=lo["mix_factor"], high=hi["mix_factor"],
             source=f"this run's per-kind call times over {len(mixes)} plausible mixes (1.0: the story's mix = the "
                    f"replay's); low {lo['window_only']}/{lo['ratio4']}/{lo['ratio128']}, high "
                    f"{hi['window_only']}/{hi['ratio4']}/{hi['ratio128']} window-only/ratio-4/ratio-128 layers"),
        dict(factor="in-step factor", value=measured / iso_lab,
             source=f"measured in this run: decode time in the captured step at C = {B} (profile) over the same "
                    f"calls timed alone (one call per CUDA graph)"),
        dict(factor="residue", value=story_lab / story_attention_speedup(),
             low=lo["residue"], high=hi["residue"],
             source="what is left: the story's GPU ran its kernels at a speed this model does not predict, its "
                    "mix differed, or its totals counted what one step here does not"),
    ]
    product = math.prod(r["value"] for r in table)
    step = dict(measured=measured, product=product, isolated_speedup_here=iso_lab,
                speedup_story_gpu_predicted=story_lab, factors=table, mixes=mixes,
                equation="story's attention speedup x GPU factor x layer-mix factor x in-step factor x residue "
                         f"= this device's {BEFORE} -> {AFTER} decode speedup in the step (C = {B})")
    return dict(batch=B, device=dev["name"], assumed=assumed, story_gpu=story_gpu, kinds=kinds, step=step,
                c1=_c1_bridge(results, iso, calls, i0, i1, here, story))


def _c1_bridge(results, iso, calls, i0, i1, here, story) -> dict:
    """The C = 1 change in tok/s, S0 -> S1: this device's, and the story's GPU's predicted from this
    run's per-kind calls at B = 1 moved by the GPU factor, the rest of the step by memory bandwidth."""
    step0, step1 = _step(results, BEFORE, 1), _step(results, AFTER, 1)
    d0, d1 = _decode_ms(results, BEFORE, 1), _decode_ms(results, AFTER, 1)
    if None in (step0, step1, d0, d1):
        return dict(note="needs both stages' steps and profiles at C = 1")

    def moved(impl):
        here_ms = sum(n * iso[(impl, 1, k)]["graph_us"] for k, n in calls.items() if n) / 1e3
        story_ms = sum(n * iso[(impl, 1, k)]["graph_us"] / speed_ratio(iso[(impl, 1, k)]["programs"], here, story)
                       for k, n in calls.items() if n) / 1e3
        return story_ms / here_ms
    rest = 0.5 * ((step0 - d0) + (step1 - d1))
    bw = here["hbm_tb_s_datasheet"] / story["hbm_tb_s_datasheet"]
    s0, s1 = rest * bw + d0 * moved(i0), rest * bw + d1 * moved(i1)
    ratio_here, ratio_story = step0 / step1, s0 / s1
    published = story_c1_ratio()
    table = [
        dict(factor="story's tok/s after / before at C = 1", value=published,
             source="published: 11.47 -> 8.13 tok/s (data/campaign/story_throughput.csv)"),
        dict(factor="GPU factor", value=ratio_here / ratio_story,
             source=f"datasheets (dsv4lab.device.KNOWN_DEVICES); this run's calls at B = 1 moved by "
                    f"dsv4lab.bridge.speed_ratio ({i0}: {moved(i0):.2f}x the time, {i1}: {moved(i1):.2f}x), "
                    f"the rest of the step ({rest:.1f} ms here) by memory bandwidth ({bw:.2f}x)"),
        dict(factor="residue", value=ratio_story / published,
             source="what is left: the story's server and kernels at B = 1, beyond this model"),
    ]
    return dict(measured=ratio_here, product=math.prod(r["value"] for r in table), factors=table,
                change_here_pct=100 * (ratio_here - 1), change_story_gpu_predicted_pct=100 * (ratio_story - 1),
                change_published_pct=100 * (published - 1),
                predicted_a_fall=ratio_story < 1, published_a_fall=published < 1,
                equation="story's tok/s after / before x GPU factor x residue = this device's, at C = 1")


# ---------------------------------------------------------------------------------------------
# sensitivity: the replay's chosen parameters moved over a range
# ---------------------------------------------------------------------------------------------

def _config(results: dict):
    from .model import ModelConfig
    names = {f.name for f in fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in results["config"].items() if k in names})


def _decode_fit(points) -> tuple:
    """(fixed us, us per live entry, us per masked entry) through a call's measured (K, valid, us)."""
    import numpy as np
    A = np.array([[1.0, v, K - v] for K, v, _ in points])
    y = np.array([us for _, _, us in points])
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return tuple(float(c) for c in coef)


def cost_model(results: dict, B: int | None = None) -> dict | str:
    """Per-layer costs measured in this run, for the sensitivity: each of S0's and S1's decode calls
    as fixed + per live entry + per masked entry (through the three call kinds timed alone at B = 1 and
    the story's batch), scaled by the in-step factor; the indexer's fallback per ratio-4 layer, per
    category, proportional to its width (S0 against S0cap, which differ only in the served maximum);
    the rest of each stage's kernel time by category. A string says what is missing."""
    B = B or results.get("profile_batch", 32)
    st = results.get("stages", {})
    need = [BEFORE, AFTER, CAPPED[BEFORE]]
    if not set(need) <= set(st) or not results.get("isolated_decode"):
        return f"needs the stages {need} and the isolated decode calls (a GPU run)"
    cfg = _config(results)
    iso = _iso(results)
    n4 = cfg.layer_ratios().count(4)
    if not n4:
        return "needs ratio-4 layers (the indexer's cost per layer is measured on them)"
    w0, wcap = cfg.index_max_seq_len(), cfg.index_max_seq_len(st[CAPPED[BEFORE]]["stage"]["max_context"])
    valid = {"window": cfg.window, "ratio 4": min(cfg.index_topk, cfg.live_context // 4),
             "ratio 128": cfg.live_context // 128}
    width = {"window": cfg.window, "ratio 4": cfg.index_topk, "ratio 128": cfg.c128_width()}
    out = dict(batch=B, n4=n4, width=w0, decode={}, in_step={}, indexer={}, rest={}, steps={})
    for C in (1, B):
        for s in (BEFORE, AFTER):
            impl = _impl(results, s)
            pts = [(width[k], valid[k], iso[(impl, C, k)]["graph_us"]) for k in KINDS if (impl, C, k) in iso]
            if len(pts) < 3:
                return f"needs the three decode call kinds of {impl} at B = {C}"
            out["decode"][f"{impl} B={C}"] = _decode_fit(pts)
        p0, pc = st[BEFORE]["profiles"].get(str(C)), st[CAPPED[BEFORE]]["profiles"].get(str(C))
        if not p0 or not pc:
            return f"needs the profiles of {BEFORE} and {CAPPED[BEFORE]} at C = {C}"
        out["indexer"][str(C)] = {c: (p0["by_category"].get(c, 0.0) - pc["by_category"].get(c, 0.0)) / 1e3 / n4 / (w0 - wcap)
                                  for c in p0["by_category"] if c != profile.DECODE}
        for s in (BEFORE, AFTER):
            p = st[s]["profiles"][str(C)]
            model_dec = _decode_total(out, _impl(results, s), C, cfg, cfg.layers_c4, cfg.live_context, cfg.max_context)
            out["in_step"][f"{s} C={C}"] = p["by_category"].get(profile.DECODE, 0.0) / 1e3 / model_dec
            out["rest"][f"{s} C={C}"] = {c: v / 1e3 - (n4 * out["indexer"][str(C)].get(c, 0.0) * w0)
                                         for c, v in p["by_category"].items() if c != profile.DECODE}
            out["steps"][f"{s} C={C}"] = _step(results, s, C)
    return out


def _decode_total(costs, impl, C, cfg, n4, live, max_context) -> float:
    """ms a step of the decode calls alone (one call per graph's times), at n4 ratio-4 layers."""
    layers = cfg.num_layers
    n128 = layers - cfg.layers_window - n4
    calls = {"window": layers, "ratio 4": n4, "ratio 128": n128}
    k128 = cfg.c128_width(max_context)
    rows = {"window": (cfg.window, min(cfg.window, live)), "ratio 4": (cfg.index_topk, min(cfg.index_topk, live // 4)),
            "ratio 128": (k128, min(k128, live // 128))}
    a, bv, bm = costs["decode"][f"{impl} B={C}"]
    return sum(n * (a + bv * rows[k][1] + bm * (rows[k][0] - rows[k][1])) for k, n in calls.items() if n) / 1e3


def predict(costs: dict, results: dict, *, ratio4: int | None = None, live: int | None = None,
            max_context: int | None = None) -> dict:
    """S0 and S1 at a setting: kernel time by category at the story's batch, the after-S1 shares, the
    S0 -> S1 decode speedup, and the C = 1 change in tok/s (the step's measured time at the replay's
    setting moved by what the model says changed)."""
    cfg = _config(results)
    n4 = cfg.layers_c4 if ratio4 is None else ratio4
    live = cfg.live_context if live is None else live
    mc = cfg.max_context if max_context is None else max_context
    if not 0 <= n4 <= cfg.layers_c4 + cfg.layers_c128:
        raise ValueError(f"ratio4 must lie in [0, {cfg.layers_c4 + cfg.layers_c128}], got {ratio4}")
    if live > mc:
        raise ValueError(f"live ({live}) must be <= max_context ({mc})")
    w = cfg.index_max_seq_len(mc)
    B = costs["batch"]
    out = {}
    for C in (1, B):
        for s in (BEFORE, AFTER):
            impl = _impl(results, s)
            cats = {c: v + n4 * costs["indexer"][str(C)].get(c, 0.0) * w for c, v in costs["rest"][f"{s} C={C}"].items()}
            cats[profile.DECODE] = costs["in_step"][f"{s} C={C}"] * _decode_total(costs, impl, C, cfg, n4, live, mc)
            lab = {c: v + costs["n4"] * costs["indexer"][str(C)].get(c, 0.0) * costs["width"]
                   for c, v in costs["rest"][f"{s} C={C}"].items()}
            lab[profile.DECODE] = costs["in_step"][f"{s} C={C}"] * _decode_total(
                costs, impl, C, cfg, cfg.layers_c4, cfg.live_context, cfg.max_context)
            out[(s, C)] = dict(cats=cats, kernel_ms=sum(cats.values()),
                               step_ms=costs["steps"][f"{s} C={C}"] + sum(cats.values()) - sum(lab.values()))
    after = out[(AFTER, B)]
    shares = {c: 100 * v / after["kernel_ms"] for c, v in after["cats"].items()}
    return dict(ratio4=n4, live=live, max_context=mc,
                decode_share_after_pct=shares[profile.DECODE], fp32_share_after_pct=shares.get(profile.FP32_GEMM, 0.0),
                glue_share_after_pct=shares.get(profile.GLUE, 0.0),
                attention_speedup=out[(BEFORE, B)]["cats"][profile.DECODE] / after["cats"][profile.DECODE],
                c1_change_pct=100 * (out[(BEFORE, 1)]["step_ms"] / out[(AFTER, 1)]["step_ms"] - 1),
                kernel_ms={f"{s} C={C}": v["kernel_ms"] for (s, C), v in out.items()},
                step_ms={f"{s} C={C}": v["step_ms"] for (s, C), v in out.items()})


def _validation(costs: dict, results: dict) -> list:
    """The model against the run's points it was not fitted to: S1cap (the cap on S1) and S0's
    glue-scaling rows (other layer mixes), kernel time per step, predicted and measured."""
    rows = []
    st = results["stages"]
    B = costs["batch"]
    cap = CAPPED[AFTER]
    if cap in st:
        p = predict(costs, results, max_context=st[cap]["stage"]["max_context"])
        for C in (1, B):
            m = st[cap]["profiles"].get(str(C))
            if m:
                rows.append(dict(point=f"{cap} C={C}", predicted_ms=p["kernel_ms"][f"{AFTER} C={C}"],
                                 measured_ms=m["total_us"] / 1e3))
    gs = results.get("glue_scaling", {})
    if gs.get("stage") == BEFORE and gs.get("C") == B:
        for r in gs.get("rows", []):
            if "kernel_ms" in r:
                p = predict(costs, results, ratio4=r["ratio4_layers"])
                rows.append(dict(point=f"{BEFORE} C={B}, {r['ratio4_layers']} ratio-4 layers",
                                 predicted_ms=p["kernel_ms"][f"{BEFORE} C={B}"], measured_ms=r["kernel_ms"]))
    for r in rows:
        r["error_pct"] = 100 * (r["predicted_ms"] / r["measured_ms"] - 1)
    return rows


def sensitivity(results: dict) -> dict:
    """Each chosen parameter moved alone over its range (``rows``), the model's check against measured
    points it was not fitted to (``validation``), and the setting closest to the story's three after-S1
    shares over the whole grid (``story_fit``)."""
    costs = cost_model(results)
    if isinstance(costs, str):
        return dict(note=costs)
    cfg = _config(results)
    compressed = cfg.layers_c4 + cfg.layers_c128
    rows = []
    for n in SENS_RATIO4:
        if n <= compressed:
            rows.append(dict(parameter="ratio-4 layers", value=n, **_strip(predict(costs, results, ratio4=n))))
    for live in SENS_LIVE:
        if live <= cfg.max_context:
            rows.append(dict(parameter="live tokens a request", value=live, **_strip(predict(costs, results, live=live))))
    for mc in SENS_MAX:
        if mc >= cfg.live_context:
            rows.append(dict(parameter="max context", value=mc, **_strip(predict(costs, results, max_context=mc))))
    target = story_after_shares()
    keys = {profile.DECODE: "decode_share_after_pct", profile.FP32_GEMM: "fp32_share_after_pct",
            profile.GLUE: "glue_share_after_pct"}
    best = None
    for n in range(compressed + 1):
        for mc in SENS_MAX:
            for live in SENS_LIVE:
                if live > mc:
                    continue
                p = predict(costs, results, ratio4=n, live=live, max_context=mc)
                miss = max(abs(p[keys[c]] - target[c]) for c in keys)
                if best is None or miss < best[0]:
                    best = (miss, p)
    miss, p = best
    fit = dict(_strip(p), largest_miss_pts=miss, tolerance_pts=SHARE_TOLERANCE_PTS,
               reproduces_all_shares=miss <= SHARE_TOLERANCE_PTS,
               story={keys[c]: target[c] for c in keys})
    return dict(costs=costs, validation=_validation(costs, results), rows=rows, story_fit=fit,
                replay_setting=_strip(predict(costs, results)))


def _strip(p: dict) -> dict:
    return {k: v for k, v in p.items() if k not in ("kernel_ms", "step_ms")}
