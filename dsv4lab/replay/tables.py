"""The replay's tables, built from its results dict: throughput, fits, kernel time by category, the
stage transitions, the glue by op, the decode inside the step, the story beside the run and the
C = 1 question (results["tables"] keeps them; tables.md and the CSVs print them)."""
from __future__ import annotations

from pathlib import Path

from .. import profile, runs
from ..stages import STAGES, TRANSITIONS, stage
from .isolated import isolated_per_step
from .plan import PROFILE_BATCH


def _story_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "data" / "campaign"



def stage_profile(results: dict, stage_name: str, C: int | None = None) -> dict | None:
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
        p = stage_profile(results, s)
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
    tot = [(stage_profile(results, s) or {}).get("total_us") for s in ("S0", "S1")]

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
    glue = {o["op"]: 100 * o["share"] for o in ((stage_profile(results, "S1") or {}).get("glue_ops", {}).get("ops", []))}
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
    results["tables"] = dict(throughput=thr, fits=fits, profile=prof_rows, glue_ops=glue, decode=decode_time_in_step(results),
                             transitions=trans, story=story_comparison(results),
                             c1=c1_question(results) if results.get("isolated_decode") else [])
    return results["tables"]
