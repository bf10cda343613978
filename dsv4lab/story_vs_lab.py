"""The story's published figures beside the lab's own: the one builder of that table,
:func:`story_vs_lab_rows`, for a recorded replay with the recorded kernel runs (:func:`story_vs_lab_table`:
docs/story_vs_lab.md's block through dsv4lab.report, notebooks 07 and 07a) and for the replay's own run
(story_vs_here.csv, dsv4lab.replay.tables). The story's numbers are never mixed into the lab's.
"""
from __future__ import annotations

import re

from . import runs
from .registry import registered
from .stages import stage

STORY_DEVICE = "NVIDIA RTX PRO 6000 Blackwell"
#: the lab's Hopper kernel: beyond the story, no stage of its own
HOPPER = "hopper"


def _x(a, b) -> float | None:
    """a / b, or None where either is missing or b is 0."""
    return None if a is None or b is None or a != a or b != b or not b else a / b


def _arrow(a, b, unit="", fmt="{:.3g}") -> str:
    return "n/a" if a is None or b is None else f"{fmt.format(a)} -> {fmt.format(b)}{unit}"


def _times(x, fmt: str) -> str:
    """' (x.xx)' after a figure, where its change ``x`` is known."""
    return "" if x is None else f" ({x:{fmt}}x)"


class _Replay:
    """Read-only accessors to a replay's results dict."""

    def __init__(self, d: dict):
        self.d = d
        self.B = d.get("profile_batch", 32)

    def prof(self, stage, C=None):
        C = self.B if C is None else C
        return self.d["stages"].get(stage, {}).get("profiles", {}).get(str(C))

    def ms(self, stage, cat, C=None):
        p = self.prof(stage, C)
        return None if p is None else p["by_category"].get(cat, 0.0) / 1e3

    def share(self, stage, cat, C=None):
        p = self.prof(stage, C)
        return None if p is None or not p["total_us"] else 100 * p["by_category"].get(cat, 0.0) / p["total_us"]

    def total(self, stage, C=None):
        p = self.prof(stage, C)
        return None if p is None else p["total_us"] / 1e3

    def tok(self, stage, C):
        r = next((r for r in self.d["stages"].get(stage, {}).get("steps", []) if r["C"] == C and "tok_s" in r), None)
        return None if r is None else r["tok_s"]

    def fit(self, stage, key):
        f = self.d["stages"].get(stage, {}).get("fit")
        return None if not f else f[key]


def story_vs_lab_table(run: str = runs.REPLAY_RUN, kernel_run: str = runs.KERNEL_RUN) -> "pd.DataFrame":
    """Every figure the story published (data/campaign: story_profile, story_throughput, story_facts)
    beside the lab's own figure on its recorded devices: the campaign replay (``runs.replay(run)``) and
    the recorded decode, indexer and check runs of ``kernel_run`` (each row names the device it was
    measured on). Columns: group, figure, story, lab, "lab: measured as",
    "why they differ", "beyond the story" (the lab's Hopper kernel, impl ``hopper``, where it has a
    figure), and the change each side reports as one factor (story x, lab x: > 1 is faster) where the
    figure is a change. The story's numbers are never mixed into the lab's. :func:`story_vs_lab_rows`
    builds the rows."""
    import pandas as pd

    return pd.DataFrame(story_vs_lab_rows(runs.replay(run), kernel_run))


def story_vs_lab_rows(rep: dict, kernel_run: str | None = runs.KERNEL_RUN) -> list[dict]:
    """The rows of :func:`story_vs_lab_table` for the replay results ``rep`` (a recorded run's
    reproduce.json, or the replay's own run writing story_vs_here.csv); ``kernel_run`` None leaves out
    the figures only the recorded kernel runs give (the kernel alone, the checks, the indexer alone).
    A figure the run did not measure (a stage it skipped) reads "n/a"."""
    from . import profile
    from .device import KNOWN_DEVICES
    from .kernels.decode.planning import STORY_TILES
    from .replay.isolated import isolated_per_step

    R = _Replay(rep)
    B = R.B
    # the kernels the figures name, as the stage table names them
    sglang, story_kernel, mma, splitk_auto = (stage(n).decode_impl for n in ("S0", "S1", "S1best", "S2"))
    fallback, triton_indexer = stage("S0").indexer_impl, stage("S4").indexer_impl
    cfg = rep["config"]
    dev = rep["environment"]["device"]
    story_sms = KNOWN_DEVICES[STORY_DEVICE]["sm_count"]
    story_gpus = int(re.match(r"(\d+)x", runs.story_fact("node")).group(1))
    here = f"one {dev['name']} ({dev.get('sm_count') or 'no'} SMs)"
    prof = runs.campaign("story_profile")
    thr = runs.campaign("story_throughput").set_index("concurrency")

    def story_row(prefix):
        return prof[prof.kernel.str.startswith(prefix)].iloc[0]

    window = (f"story: GPU kernel time summed over a profiling window of its server (the whole model on "
              f"{story_gpus} GPUs, sm_120, {story_sms} SMs); here: the kernels of one decode step of one GPU's "
              f"share on {here}, replayed from a CUDA graph")
    model = ("the story's step has collectives, FP8 projections and FP4 MoE kernels; the replay has no collectives, "
             "bf16 projections and a bf16 MoE stand-in reading FP4's bytes (dsv4lab.model.ASSUMPTIONS): the other "
             "categories' shares differ with them")
    server = (f"story: the tok/s of an {story_gpus}-GPU server (scheduler, sampling, all-reduce included); here: "
              f"C / step time of one GPU's share (the step only)")
    fit_how = (f"here the least-squares fit step = a + b C over C in {tuple(rep['concurrency'])}; "
               f"the story's points and method were not published")
    rows = []

    def add(group, figure, story, lab, how, why, story_x=None, lab_x=None, beyond="-"):
        rows.append({"group": group, "figure": figure, "story": story, "lab": lab, "lab: measured as": how,
                     "why they differ": why, "beyond the story": beyond, "story x": story_x, "lab x": lab_x})

    # -- the profile shift (story_profile), S0 -> S1 at the story's batch ----------------------------
    grp = f"profile shift S0 -> S1 (batch {B})"
    how = f"campaign replay S0 -> S1, C = {B}, one step (CUDA-graph replay)"
    d = story_row("sparse-MLA")
    iso = isolated_per_step(rep)
    i32 = iso[iso.B == B].set_index(["impl", "kind"])
    wide = ("ratio 128" if (sglang, "ratio 128") in i32.index else None)
    dec = (R.ms("S0", profile.DECODE), R.ms("S1", profile.DECODE))
    why = window
    if wide:
        c128 = i32.loc[(sglang, wide)]
        why += (f"; on the ratio-128 layers both kernels walk every entry of an index row {int(c128.entries)} wide "
                f"({int(c128.valid)} valid), as SGLang's loop does")
    why += _bridge_why(rep)
    add(grp, "sparse-MLA decode kernel time, in the model", f"{d.before_ms:g} -> {d.after_ms:g} ms "
        f"({d.before_ms / d.after_ms:.1f}x)", _arrow(*dec, " ms per step") + _times(_x(*dec), ".0f"), how, why,
        _x(d.before_ms, d.after_ms), _x(*dec))
    # the kernel alone, full 512-entry rows, from the kernel runs (on their own device)
    if kernel_run is not None:
        hop = _hopper_times()
        kdev = runs.load("decode", kernel_run)["device"]
        here_k = f"one {kdev['name']} ({kdev['sm_count']} SMs)"
        dt = runs.table("decode", kernel_run)
        t = dt.pivot_table(index="B", columns="impl", values="graph_us")
        story_alone = i32.loc[(story_kernel, "ratio 4")].us_per_call if (story_kernel, "ratio 4") in i32.index else None
        sg_alone = i32.loc[(sglang, "ratio 4")].us_per_call if (sglang, "ratio 4") in i32.index else None
        lab_alone = (f"{kdev['name'].removeprefix('NVIDIA ')}: SGLang's kernel {t.loc[B, sglang]:.0f} us per call; "
                     f"the lab's {mma} {t.loc[B, mma]:.1f} ({t.loc[B, sglang] / t.loc[B, mma]:.0f}x), {splitk_auto} "
                     f"{t.loc[B, splitk_auto]:.1f} ({t.loc[B, sglang] / t.loc[B, splitk_auto]:.0f}x)")
        if story_alone and sg_alone:
            lab_alone += (f"; {here}: the story's kernel {story_alone:.0f} us vs SGLang's {sg_alone:.0f} in the "
                          f"replay's ratio-4 call ({sg_alone / story_alone:.0f}x)")
        beyond = "-"
        if hop is not None and B in hop.index:
            beyond = (f"{HOPPER} {hop.loc[B, HOPPER]:.1f} us at B = {B} vs {splitk_auto} "
                      f"{hop.loc[B, splitk_auto]:.1f} (same run)")
            big = max(hop.index)
            if mma in hop and big != B:
                beyond += f"; B = {big}: {hop.loc[big, HOPPER]:.1f} vs {mma} {hop.loc[big, mma]:.1f} us"
        add(grp, f"sparse-MLA decode, the kernel alone (B = {B}, {cfg['index_topk']} valid entries)",
            f"not published (in the model: {d.before_ms / d.after_ms:.1f}x)", lab_alone,
            f"recorded decode run, one call per CUDA graph, B = {B}, on {here_k}; the replay's calls on {here}",
            f"the story measured its kernels inside its server only; here every kernel on the same rows; the story's "
            f"first MMA kernel (BLOCK_H {STORY_TILES.block_h}, no prefetch, no split) is not the "
            f"lab's tuned one",
            None, _x(t.loc[B, sglang], t.loc[B, splitk_auto]), beyond)
    for cat, extra in ((profile.DECODE, ""), (profile.FP32_GEMM, "; both: its ms unchanged, its share grew with "
                                                                  "the smaller total"),
                       (profile.GLUE, "; both: the indexer's fallback over the max context"), (profile.MOE, "")):
        s = story_row(profile.STORY_CATEGORY[cat])
        after = f" ({'~' if str(s.note).startswith('approximate') else ''}{s.after_ms:g} ms)" if s.after_ms == s.after_ms else ""
        lab = _arrow(R.share("S0", cat), R.share("S1", cat), " %", "{:.1f}")
        if cat != profile.DECODE:
            lab += f" ({_arrow(R.ms('S0', cat), R.ms('S1', cat), ' ms', '{:.3g}')})"
        name = profile.STORY_CATEGORY[cat] + (" (here: the stand-in)" if cat == profile.MOE else "")
        add(grp, f"share of kernel time: {name}", f"{s.before_share_pct:g}% -> {s.after_share_pct:g}%{after}", lab,
            how, model + extra)
    s = story_row("total")
    tot = (R.total("S0"), R.total("S1"))
    add(grp, "total kernel time", f"{s.before_ms:g} -> {s.after_ms:g} ms ({s.before_ms / s.after_ms:.2f}x)",
        _arrow(*tot, " ms per step", "{:.1f}") + _times(_x(*tot), ".2f"), how, window + "; " + model,
        _x(s.before_ms, s.after_ms), _x(*tot))

    # -- throughput (story_throughput), S0 -> S1 -------------------------------------------------------
    grp = "throughput S0 -> S1"
    for C, r in thr.iterrows():
        a, b = R.tok("S0", C), R.tok("S1", C)
        story = (f"{r.before_tok_s:g} -> {r.after_tok_s:g} tok/s ({r.change_pct:+g}%)" if r.before_tok_s == r.before_tok_s
                 else f"{r.change_pct:+g}% (only the change was published)")
        why = server
        beyond = "-"
        if C == 1:
            why += (f"; at B = 1 the story's kernel launches {-(-cfg['kernel_heads'] // STORY_TILES.block_h)} "
                    f"programs a call, SGLang's {cfg['kernel_heads']}: both leave most of either chip's SMs idle"
                    + _c1_why(rep))
            s2 = R.tok("S2", 1)
            beyond = f"S2 (split-K, built by the lab): {s2:.1f} tok/s ({100 * (s2 / a - 1):+.0f}% vs S0)" if s2 and a else "-"
        add(grp, f"tok/s at concurrency {C}", story, _arrow(a, b, " tok/s", "{:.1f}") +
            (f" ({100 * (b / a - 1):+.0f}%)" if a and b else ""), f"campaign replay, C = {C}, median of graph replays",
            why, 1 + r.change_pct / 100, _x(b, a), beyond)
    c0, c1 = runs.story_pair("marginal per-request decode cost")
    add(grp, "marginal per-request cost b", runs.story_fact("marginal per-request decode cost"),
        _arrow(R.fit("S0", "b_ms"), R.fit("S1", "b_ms"), " ms", "{:.2f}"), "fit of the replay's step times",
        server + "; " + fit_how, _x(c0, c1), _x(R.fit("S0", "b_ms"), R.fit("S1", "b_ms")))
    a0, a1 = runs.story_pair("throughput asymptote")
    add(grp, "throughput asymptote 1000 / b", runs.story_fact("throughput asymptote"),
        _arrow(R.fit("S0", "asymptote_tok_s"), R.fit("S1", "asymptote_tok_s"), " tok/s", "{:.0f}"),
        "fit of the replay's step times", server + "; " + fit_how, _x(a1, a0),
        _x(R.fit("S1", "asymptote_tok_s"), R.fit("S0", "asymptote_tok_s")))

    # -- the other published figures (story_facts) -----------------------------------------------------
    grp = "other published figures"
    if kernel_run is not None:
        ch = runs.table("checks", kernel_run)
        split_k = [i.name for i in registered() if i.stage == "S2"]             # both split-K kernels
        tc = ch[ch.impl.isin([mma, *split_k])].vs_simt_err.dropna()
        add(grp, "MMA vs SIMT kernel, relative error", runs.story_fact("MMA vs SIMT kernel rel. error"),
            f"<= {tc.max():.1e} ({', '.join([mma, *split_k])} vs the lab's SIMT kernel, {tc.size} checks)",
            f"recorded checks on {here_k}: fresh random inputs, odd sizes, padding, sinks",
            "story: its MMA kernel against SGLang's on its GPU; here the lab's tensor-core kernels against its SIMT "
            "kernel (both also checked against a float64 reference)",
            beyond=_hopper_check())
    ops = runs.story_glue_ops()
    s1 = R.prof("S1") or {}
    glue = {o["op"]: 100 * o["share"] for o in s1.get("glue_ops", {}).get("ops", [])}
    add(grp, "the glue by aten op (after the MMA kernel)", runs.story_fact("glue breakdown (op share of glue)"),
        ", ".join(f"{k.removeprefix('aten::')} {glue.get(k, 0.0):.1f}%" for k in ops),
        f"one eager S1 step at C = {B}, kernels charged to the aten op that launched them",
        "here the base is the glue + FP32 GEMM kernels (the story counts the indexer's bmm in the glue; its base "
        "is not published); same ops, the fallback's bmm heavier here")
    gs = rep.get("glue_scaling", {})
    L, live = cfg["index_max_seq_len"], cfg["live_context"]
    lab = []
    if gs.get("fit"):
        f = gs["fit"]
        lab.append(f"S0's glue = {f['glue_fixed_ms']:.1f} ms + {f['glue_per_ratio4_layer_ms']:.1f} ms per ratio-4 "
                   f"layer (r2 {f['r2']:.3f})")
    counts = [r["ratio4_layers"] for r in gs.get("rows", [])]
    how = (f"the replay's S0 with {min(counts)}..{max(counts)} ratio-4 layers (C = {gs['C']})" if counts
           else "the replay's S0 glue scaling: not run")
    if kernel_run is not None:
        ix = runs.table("indexer", kernel_run)
        ix = ix[(ix.kind == "time") & (ix.B == B)].pivot_table(index="max_seq_len", columns="impl", values="graph_us")
        if L in ix.index and live in ix.index:
            lab.append(f"the fallback alone at B = {B} on {here_k}: {ix.loc[L, fallback] / 1e3:.1f} ms at width "
                       f"{L} vs {ix.loc[live, fallback] / 1e3:.2f} ms at {live}; the Triton indexer "
                       f"{ix.loc[L, triton_indexer]:.1f} us")
        how += "; the recorded indexer run (graph replay)"
    add(grp, "root cause of the glue", runs.story_fact("root cause of glue"), "; ".join(lab), how,
        "the same fallback and width (the lab's config follows SGLang's max context); the story found it in its "
        "op profile, the lab measures it directly")
    capped, base = ("S1cap", "S1") if "S1cap" in rep["stages"] else ("S0cap", "S0")
    cap = [(C, _x(R.tok(capped, C), R.tok(base, C))) for C in (B, max(rep["concurrency"]))]
    story_cap = float(re.match(r"[\d.]+", runs.story_fact("cap context to 8192")).group(0))
    where = ("here S1cap / S1: the story capped after its MMA kernel" if base == "S1" else
             "here on S0, SGLang's decode kernel still in: this run has no S1cap")
    add(grp, "cap the context to 8192", runs.story_fact("cap context to 8192"),
        ", ".join(f"{x:.1f}x at C = {C}" for C, x in cap if x), f"campaign replay {capped} / {base} (tok/s)",
        server + f"; the story's concurrency for this figure was not published ({where})", story_cap, cap[0][1])
    dec1 = [(n, R.ms(n, profile.DECODE, 1), fmt) for n, fmt in (("S0", ".1f"), ("S1", ".2f"), ("S2", ".2f"))]
    add(grp, "the B = 1 regression's cause", runs.story_fact("B=1 regression cause"),
        f"the same 2-program grid on {dev.get('sm_count') or 'no'} SMs; decode per step at C = 1: "
        + ", ".join(f"{n} {'n/a' if v is None else format(v, fmt)}" for n, v, fmt in dec1) + " ms",
        "campaign replay profiles at C = 1",
        "the story's kernel at B = 1 against SGLang's on sm_120 is not published" + _c1_why(rep))
    add(grp, "the machine", runs.story_fact("node"),
        f"{here}: {cfg['name']}, random weights at the real shapes, live context {live}",
        "recorded device", "the lab replays one GPU's work of the story's 8; numbers compare in direction and "
        "size, never as equals")
    return rows


def _bridge_why(rep: dict) -> str:
    """The measured factors between the story's decode speedup and the run's (dsv4lab.bridge), as a
    clause; empty for a run recorded without them."""
    f = {r["factor"]: r for r in rep.get("factors", {}).get("step", {}).get("factors", [])}
    if not f:
        return ""
    mix, res = f["layer-mix factor"], f["residue"]
    return (f"; the bridge (reproduce.json 'factors'): GPU factor {f['GPU factor']['value']:.2f} (SGLang's "
            f"kernel fills either chip at this batch, the story's fills neither), layer-mix factor "
            f"{mix['low']:.2f}-{mix['high']:.2f} over plausible mixes, in-step factor "
            f"{f['in-step factor']['value']:.2f}, residue {res['value']:.2f} ({min(res['low'], res['high']):.2f}-"
            f"{max(res['low'], res['high']):.2f})")


def _c1_why(rep: dict) -> str:
    c1 = rep.get("factors", {}).get("c1", {})
    if "factors" not in c1:
        return ""
    res = c1["factors"][-1]["value"]
    return (f"; from this run's calls at B = 1 moved to the story's GPU (reproduce.json 'factors'), the change "
            f"would be {c1['change_story_gpu_predicted_pct']:+.0f}% there, against {c1['change_published_pct']:+.0f}% "
            f"published: a residue of {res:.2f}")


#: the recorded run of the Hopper kernel the tables read (experiments/hopper_decode)
HOPPER_RUN = "h200_run5"


def _hopper_times():
    """B x impl graph_us of the recorded Hopper-kernel run (experiments/hopper_decode), or None."""
    try:
        d = runs.experiment("hopper_decode", HOPPER_RUN)
    except FileNotFoundError:
        return None
    df = hopper_time_rows(d)
    if df.empty:
        return None
    return df.pivot_table(index="B", columns="impl", values="graph_us")


def hopper_time_rows(d: dict):
    """The timing rows of a recorded hopper_decode run as a DataFrame. Runs recorded before ``auto``
    became the dispatcher (kernels/auto.py) name the split-K kernel ``auto``: it is ``splitk_auto``
    now, and is renamed so."""
    import pandas as pd
    df = pd.DataFrame([r for r in d["rows"] if r.get("kind") == "time"])
    splitk_auto = stage("S2").decode_impl
    if not df.empty and splitk_auto not in set(df["impl"]):
        df["impl"] = df["impl"].replace({"auto": splitk_auto})
    return df


def _hopper_check() -> str:
    try:
        d = runs.experiment("hopper_decode", HOPPER_RUN)
    except FileNotFoundError:
        return "-"
    errs = [r["out_err"] for r in d["rows"] if r.get("kind") == "check" and r.get("impl") == HOPPER]
    return f"{HOPPER} vs the float64 reference: out error <= {max(errs):.1e} ({len(errs)} checks)" if errs else "-"


STORY_VS_LAB_COLUMNS = ("figure", "story", "lab", "why they differ", "beyond the story")


def story_vs_lab_markdown(run: str = runs.REPLAY_RUN, columns=STORY_VS_LAB_COLUMNS,
                         kernel_run: str = runs.KERNEL_RUN) -> str:
    """:func:`story_vs_lab_table`'s ``columns`` as a markdown table (docs/story_vs_lab.md's block)."""
    df = story_vs_lab_table(run, kernel_run)
    cols = list(columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |")
    return "\n".join(lines)
