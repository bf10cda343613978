"""The replay's tables, built from its results dict: throughput, fits, kernel time by category, the
stage transitions, the glue by op, the decode inside the step, the story beside the run (the lab's one
story-vs-lab builder, dsv4lab.story_vs_lab, on this run) and the C = 1 question
(results["tables"] keeps them; tables.md and the CSVs print them)."""
from __future__ import annotations

from .. import profile, roofline
from ..story_vs_lab import story_vs_lab_rows
from ..stages import STAGES, TRANSITIONS, stage
from .isolated import isolated_per_step
from .plan import PROFILE_BATCH


def stage_profile(results: dict, stage_name: str, C: int | None = None) -> dict | None:
    """A stage's kernel profile at C (default: the story's batch)."""
    C = results.get("profile_batch", PROFILE_BATCH) if C is None else C
    return results.get("stages", {}).get(stage_name, {}).get("profiles", {}).get(str(C))


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
        prof = stage_profile(results, n, 1)
        rows.append(dict(stage=n, impl=impl, what="the whole step at C = 1 (graph replay)",
                         ms_per_step=step.get("step_ms"), tok_s=step.get("tok_s"),
                         decode_ms_per_step=prof["by_category"].get(profile.DECODE, 0.0) / 1e3 if prof else None))
    return rows


#: what every row of the story table shares (tables.md prints it once above the table)
STORY_SETUP = ("The story: 8x RTX PRO 6000 Blackwell (sm_120, 188 SMs, GDDR7 ~1.8 TB/s), DeepSeek-V4-Flash with its "
               "weights in an SGLang server at a steady batch of 32. Here: one GPU's share of the same shapes on this "
               "device, random weights, no collectives, the MoE stand-in (dsv4lab.model.ASSUMPTIONS).")


def decode_time_in_step(results: dict) -> list:
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


def stages_run(results: dict) -> list:
    """The names of the stages the run measured, in the stage table's order."""
    st = results.get("stages", {})
    return [s.name for s in STAGES if s.name in st]


def categories_by_stage(results: dict) -> dict:
    """{stage: {category: us}} of every stage profiled at the story's batch."""
    profiles = {n: stage_profile(results, n) for n in stages_run(results)}
    return {n: p["by_category"] for n, p in profiles.items() if p}


def time_unit(results: dict) -> str:
    return "ms of CPU time (interpreter: meaningless as GPU time)" if results["mode"] != "cuda" else "ms"


def build_tables(results: dict) -> dict:
    """Every table of the replay's files, kept in ``results["tables"]`` (and returned)."""
    st = results.get("stages", {})
    order = stages_run(results)
    thr = [dict(stage=n, C=r["C"], step_ms=r.get("step_ms"), tok_s=r.get("tok_s"), replays=r.get("replays"),
                finite=r.get("finite"), error=r.get("error")) for n in order for r in st[n]["steps"]]
    fits = [dict(stage=n, **st[n]["fit"]) for n in order if st[n].get("fit")]
    prof_rows = [dict(stage=n, C=p["C"], category=c, ms=us / 1e3, share_pct=100 * us / p["total_us"] if p["total_us"] else 0)
                 for n in order for p in st[n].get("profiles", {}).values() for c, us in p["by_category"].items()]
    cats = categories_by_stage(results)
    trans = [dict(before=a, after=b, rows=profile.transition_table(cats[a], cats[b], a, b))
             for a, b in TRANSITIONS if a in cats and b in cats]
    glue = [dict(stage=n, **o) for n in cats for o in stage_profile(results, n)["glue_ops"]["ops"][:12]]
    results["tables"] = dict(throughput=thr, fits=fits, profile=prof_rows, glue_ops=glue,
                             decode=decode_time_in_step(results), transitions=trans,
                             story=story_vs_lab_rows(results, kernel_run=None),      # no recorded kernel runs
                             c1=c1_question(results) if results.get("isolated_decode") else [],
                             above_floor=roofline.above_floor(results) if results.get("byte_floor") else [])
    return results["tables"]
