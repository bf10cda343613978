"""The replay's tables.md: markdown tables of dict rows, the bridge's and the sensitivity's sections,
and the whole file from the replay's tables."""
from __future__ import annotations

import json

from ..model import assumptions_markdown
from ..stages import STAGES
from .tables import STORY_SETUP, stages_run, time_unit


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


#: the glue stages S0..S4 run as torch ops, beside what SGLang's DeepSeek-V4 path runs (docs/sglang.md)
UNFAIR_TO_SGLANG = ("S0 to S4 run the step's glue (mHC, norms, rope, the cache's fp8 bytes, the router, the MoE's "
                    "dispatch and combine) as torch ops, about 190 kernels a layer; SGLang's DeepSeek-V4 path fuses "
                    "most of it (about 11 to 16 glue kernels a layer on Hopper, read from its wheel: docs/sglang.md). "
                    "So S0 to S4 are unfair to SGLang in the glue; S5 fuses it in the lab's own Triton kernels.")


def tables_markdown(results: dict, quick: bool) -> str:
    """tables.md: the run's setup, every table of ``results["tables"]`` (tables.build_tables), the
    bridge, the sensitivity, the compile lessons, the classifier's check, what was skipped and the
    model's assumptions."""
    t = results["tables"]
    st = results.get("stages", {})
    B = results["profile_batch"]
    order = stages_run(results)
    gs = results.get("glue_scaling", {})
    cfg = results["config"]
    md = [f"# Campaign replay on {results['environment']['device']['name']} ({results['environment']['date']})",
          "", f"Config: {cfg['name']}; layers {cfg['layer_ratios'].count(0)} window-only, "
          f"{cfg['layer_ratios'].count(4)} ratio-4, {cfg['layer_ratios'].count(128)} ratio-128; live context "
          f"{cfg['live_context']}, max context {cfg['max_context']}. Units: {time_unit(results)}." + (" QUICK (CPU preset)." if quick else ""),
          "", "## Stages", "", _md([dict(stage=s.name, title=s.title, decode=s.decode_impl, indexer=s.indexer_impl,
                                          mhc=s.mhc_gemm, glue=s.glue, max_context=s.max_context or "config")
                                     for s in STAGES if s.name in st]),
          "", "## Throughput (step = one token per request)", "", _md(t["throughput"]), "", UNFAIR_TO_SGLANG, "",
          "", "## S5 against S4 on one path (dsv4lab.step_compare: S4's top-k and experts replayed in S5)", "",
          _md(results.get("stage_agreement", [])), "", "## Fit: step_ms = a + b x C", "",
          _md(t["fits"]), "", "## Kernel time by category", "", _md(t["profile"])]
    for x in t["transitions"]:
        md += ["", f"## {x['before']} -> {x['after']} (C = {B})", "", _md(x["rows"], ".4g")]
    md += ["", f"## Glue breakdown by op (one eager step at C = {B}; glue + FP32 GEMM kernels; top 12)", "", _md(t["glue_ops"]),
           "", "## Decode kernel time inside the step", "", _md(t["decode"]),
           "", "## Isolated decode calls (one call per CUDA graph)", "", _md(results.get("isolated_decode", [])),
           "", f"## S0's glue vs the number of ratio-4 layers (C = {gs.get('C')})", "", _md(gs.get("rows", [])),
           "", _md([gs["fit"]]) if gs.get("fit") else "",
           "", "## The step's floor (bytes it must read, FLOPs of its weight GEMMs; dsv4lab.roofline.step_floor)", "",
           _md(results.get("byte_floor", {}).get("rows", []), ".4g"), "", _md(t["above_floor"], ".4g"),
           "", "## The story beside this run", "", STORY_SETUP, "", _md(t["story"]),
           "", "## C = 1: programs against SMs, per layer kind (each call alone at B = 1; then the step)", "", _md(t["c1"]),
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
    return "\n".join(md)
