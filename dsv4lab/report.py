"""The README's measured tables, rendered from the recorded data so the text cannot drift, and the
story's published figures beside the lab's own (:func:`story_vs_lab_table`, notebook 07).

Each table lives in README.md between ``<!-- dsv4lab:NAME -->`` and ``<!-- /dsv4lab:NAME -->``;
``python -m dsv4lab readme`` rewrites those blocks from data/, ``--check`` exits 1 if any
differs (a test runs the check).
"""
from __future__ import annotations

import re
from pathlib import Path

from . import runs
from .registry import registered
from .stages import STORY_STEPS, stage


def _fmt(v, digits=1):
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def _markdown(head, rows) -> str:
    """A markdown table: the header cells, the rule, one line per row of cells (text)."""
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(cells) + " |" for cells in rows])


def run_line(part: str = "decode", run: str = "h200") -> str:
    """'Run <date> on one <device> (<SMs> SMs; torch, triton; measured ceilings)' of a recorded part."""
    d = runs.load(part, run)
    dev = d["device"]
    c = d.get("ceilings") or runs.load("device", run).get("ceilings", {})
    ceil = f"; measured ceilings {c['copy_tb_s']:.2f} TB/s copy, {c['bf16_tflops']:.0f} TFLOP/s bf16 matmul" if c else ""
    return (f"Run {d['date'][:16]}Z (device clock) on one {dev['name']} ({dev['sm_count']} SMs; "
            f"{runs.versions(d)}{ceil}).")


def decode_run_table(run: str = "h200") -> str:
    """Time per call (us, one-call CUDA graph) of every recorded decode impl in the recorded run (the
    registry's order), the lab's pick's speedup over the baseline (SGLang's kernel; the pick: the
    dispatcher where the run has it, else S2's kernel), the pick per call inside a graph of 8 calls, and
    the pick called eagerly back to back (bench.back_to_back_us: the host's issue time included) where
    the run has it."""
    df = runs.table("decode", run)
    df = df[df["graph_us"].notna()] if "graph_us" in df else df
    impls = [i.name for i in registered(tag="recorded") if i.name in set(df.impl)]
    base = registered(tag="baseline")[0].name
    lead = next((i.name for i in registered(tag="dispatcher") if i.name in impls), stage("S2").decode_impl)
    t = df.pivot_table(index="B", columns="impl", values="graph_us")
    layer = df.pivot_table(index="B", columns="impl", values="graph_layer_us") if "graph_layer_us" in df else None
    head = ["B", *impls, f"{lead} vs {base}"]
    has_layer = layer is not None and lead in layer
    if has_layer:
        head += [f"{lead}, 8-call graph", f"vs {base}, same"]
    eager = (df[df.impl == lead].groupby("B")["back_to_back_us"].median()
             if "back_to_back_us" in df and df.loc[df.impl == lead, "back_to_back_us"].notna().any() else None)
    if eager is not None:
        head += [f"{lead}, eager back to back"]
    rows = []
    for B, r in t.iterrows():
        cells = [str(int(B)), *(_fmt(r.get(i)) for i in impls)]
        cells.append(f"{r[base] / r[lead]:.0f}x" if {base, lead} <= set(r.index) else "-")
        if has_layer:
            lr = layer.loc[B]
            cells += [_fmt(lr.get(lead)), f"{lr[base] / lr[lead]:.0f}x" if base in lr else "-"]
        if eager is not None:
            cells.append(_fmt(eager.get(B)))
        rows.append(cells)
    return _markdown(head, rows)


def indexer_table(run: str = "h200") -> str:
    """The indexer step at B = 32 against the max context (us, graph replay)."""
    df = runs.table("indexer", run)
    tm = df[(df["kind"] == "time") & (df["B"] == 32)]
    t = tm.pivot_table(index="max_seq_len", columns="impl", values="graph_us")
    recorded = [i.name for i in registered("indexer_logits", tag="recorded")]
    cols = [c for c in recorded if c in t] + [c for c in t.columns if c not in recorded]
    rows = ([str(int(L)), *(_fmt(r[c]) for c in cols)] for L, r in t.iterrows())
    return _markdown(["max context", *cols], rows)


def indexer_step_targets(run: str = "h200") -> str:
    """The whole indexer step's recorded run (logits + top-k, ``experiments/indexer_topk/run.py``):
    its provenance and every target it was measured against."""
    d = runs.load("indexer_step", run)
    dev = d["device"]
    rows = [[r["metric"], "-" if r.get("value") is None else f"{r['value']:.4g}", f"{r['cmp']} {r['target']:g}",
             "yes" if r["meets"] else "**no**"] for r in d["rows"] if r["kind"] == "target"]
    return (f"Run {d['date'][:16]}Z on one {dev['name']} ({runs.versions(d)}), `data/runs/{run}/indexer_step.json`:"
            "\n\n" + _markdown(["B = 32, 8192 live tokens a request unless said", "measured", "target", "met"], rows))


def replay_run_line(run: str = runs.REPLAY_RUN) -> str:
    """What the recorded replay ran: date, device, versions, the model's share and layer mix."""
    d = runs.replay(run)
    env, cfg = d["environment"], d["config"]
    return (f"Run {env['date'][:16]}Z on one {env['device']['name']} ({runs.versions(env)}): "
            f"{cfg['name']}, {cfg['layers_window']} window-only + {cfg['layers_c4']} ratio-4 + {cfg['layers_c128']} "
            f"ratio-128 layers, {cfg['live_context']} live tokens a request, max context {cfg['max_context']}; "
            f"each step one CUDA graph per C, {d['elapsed_s']:.0f} s in all.")


def replay_throughput_table(run: str = runs.REPLAY_RUN) -> str:
    """tok/s per stage at each C, the fit's marginal cost b and asymptote 1000 / b."""
    d = runs.replay(run)["tables"]
    import pandas as pd
    tp = pd.DataFrame(d["throughput"])
    fits = {f["stage"]: f for f in d["fits"]}
    t = tp.pivot_table(index="stage", columns="C", values="tok_s", sort=False)
    cs = list(t.columns)
    rows = []
    for stage, r in t.iterrows():
        f = fits.get(stage, {})
        rows.append([stage, *(_fmt(r[c]) for c in cs), _fmt(f.get("b_ms"), 2), _fmt(f.get("asymptote_tok_s"), 0)])
    return _markdown(["stage", *(f"tok/s C={c}" for c in cs), "marginal ms per request", "asymptote tok/s"], rows)


def replay_devices_table(C=(1, 32, 64)) -> str:
    """tok/s per stage at a few C in every recorded replay, device beside device (the same command,
    the same model; each run's own date and versions in its line above the table)."""
    import pandas as pd
    names = runs.replays()
    if not names:
        return "(no recorded replay under data/runs/*/reproduce/)"
    lines, tok, stages = [], {}, []
    for run in names:
        d = runs.replay(run)
        env = d["environment"]
        lines.append(f"- `{run}`: {env['device']['name']}, {env['date'][:16]}Z, {runs.versions(env)}, "
                     f"{d['elapsed_s']:.0f} s")
        tp = pd.DataFrame(d.get("tables", {}).get("throughput", []), columns=["stage", "C", "tok_s"])
        tok[run] = tp.pivot_table(index="stage", columns="C", values="tok_s", sort=False)
        stages += [st for st in tok[run].index if st not in stages]
    rows = [[stage, *(_fmt(tok[run].loc[stage, c]) if stage in tok[run].index and c in tok[run].columns else "-"
                      for c in C for run in names)] for stage in stages]
    lines += ["", _markdown(["stage", *(f"tok/s C={c} {run}" for c in C for run in names)], rows)]
    titles = {run: {s["name"]: f"{s['decode_impl']}: {s['title']}" for s in runs.replay(run).get("stages_run", [])}
              for run in names}
    differ = [st for st in stages if len({titles[run].get(st) for run in names if st in titles[run]}) > 1]
    if differ:
        rows = [[st, *(titles[run].get(st, "-").replace("|", "\\|") for run in names)] for st in differ]
        lines += ["", "The records define these stages differently (decode impl: the stage as each run recorded it):",
                  "", _markdown(["stage", *names], rows)]
    return "\n".join(lines)


def replay_shift_table(run: str = runs.REPLAY_RUN, before: str = "S0", after: str = "S1") -> str:
    """The story's table, measured: kernel time by category before and after the MMA kernel at C = 32,
    beside the story's published shares."""
    d = runs.replay(run)["tables"]
    from .profile import STORY_CATEGORY
    rows = next(t["rows"] for t in d["transitions"] if t["before"] == before and t["after"] == after)
    story = runs.campaign("story_profile").set_index("kernel")
    names = {**STORY_CATEGORY, "total kernel time": "total GPU kernel time"}    # the story's row prefixes

    def story_of(cat):
        r = next((story.loc[i] for i in story.index if cat in names and i.startswith(names[cat])), None)
        return "" if r is None else f"{r.before_share_pct:g}% -> {r.after_share_pct:g}%"
    cols = [f"{before} ms", f"{before} %", f"{after} ms", f"{after} %"]
    return _markdown(["kernel category", *cols, "speedup", "the story (% of kernel time)"],
                     ([r["kernel category"], *(_fmt(r[c]) for c in cols), f"{_fmt(r['speedup'], 2)}x",
                       story_of(r["kernel category"])] for r in rows))


def bad_input_table() -> str:
    from . import bad_input
    return bad_input.render()


SECTIONS = {"decode-run": lambda: run_line("decode"), "decode-table": decode_run_table,
            "indexer-run": lambda: run_line("indexer"), "indexer-table": indexer_table,
            "indexer-step": indexer_step_targets,
            "story-vs-lab": lambda: story_vs_lab_markdown(),
            "replay-run": replay_run_line, "replay-throughput": replay_throughput_table,
            "replay-shift": replay_shift_table, "replay-devices": replay_devices_table, "bad-input": bad_input_table}


def render(name: str) -> str:
    return SECTIONS[name]()


def sync_readme(path=None, write: bool = True) -> list[str]:
    """Rewrite (or, write=False, compare) every marked block of README.md; returns the names
    of the blocks that differed."""
    path = Path(path or runs.data_dir().parent / "README.md")
    text = path.read_text()
    stale = []

    def fill(m):
        name = m.group(1)
        body = render(name)
        if m.group(2).strip() != body.strip():
            stale.append(name)
        return f"<!-- dsv4lab:{name} -->\n{body}\n<!-- /dsv4lab:{name} -->"
    new = re.sub(r"<!-- dsv4lab:([\w-]+) -->\n(.*?)<!-- /dsv4lab:\1 -->", fill, text, flags=re.S)
    if write and new != text:
        path.write_text(new)
    return stale


# ---- the story's published figures beside the lab's own ------------------------------------------

STORY_DEVICE = "NVIDIA RTX PRO 6000 Blackwell"


def _x(a, b) -> float | None:
    """a / b, or None where either is missing or b is 0."""
    return None if a is None or b is None or a != a or b != b or not b else a / b


def _arrow(a, b, unit="", fmt="{:.3g}") -> str:
    return "n/a" if a is None or b is None else f"{fmt.format(a)} -> {fmt.format(b)}{unit}"


class _Replay:
    """Read-only accessors to the recorded replay's results dict."""

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
    "why they differ", "beyond the story" (the lab's Hopper kernel, tag "beyond_story", where it has a
    figure), and the change each side reports as one factor (story x, lab x: > 1 is faster) where the
    figure is a change. The story's numbers are never mixed into the lab's."""
    import pandas as pd

    from . import profile
    from .device import KNOWN_DEVICES
    from .kernels.decode.planning import STORY_TILES
    from .replay import isolated_per_step

    rep = runs.replay(run)
    R = _Replay(rep)
    B = R.B
    cfg = rep["config"]
    dev = rep["environment"]["device"]
    story_sms = KNOWN_DEVICES[STORY_DEVICE]["sm_count"]
    story_gpus = int(re.match(r"(\d+)x", runs.story_fact("node")).group(1))
    here = f"one {dev['name']} ({dev['sm_count']} SMs)"
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
    base, story_k = registered(tag="baseline")[0].name, stage("S1").decode_impl
    wide = ("ratio 128" if (base, "ratio 128") in i32.index else None)
    dec = (R.ms("S0", profile.DECODE), R.ms("S1", profile.DECODE))
    why = window
    if wide:
        c128 = i32.loc[(base, wide)]
        why += (f"; on the ratio-128 layers both kernels walk every entry of an index row {int(c128.entries)} wide "
                f"({int(c128.valid)} valid), as SGLang's loop does")
    why += _bridge_why(rep)
    hop = _hopper_times()
    add(grp, "sparse-MLA decode kernel time, in the model", f"{d.before_ms:g} -> {d.after_ms:g} ms "
        f"({d.before_ms / d.after_ms:.1f}x)", _arrow(*dec, " ms per step") + f" ({_x(*dec):.0f}x)", how, why,
        _x(d.before_ms, d.after_ms), _x(*dec))
    # the kernel alone, full 512-entry rows, from the kernel runs (on their own device)
    kdev = runs.load("decode", kernel_run)["device"]
    here_k = f"one {kdev['name']} ({kdev['sm_count']} SMs)"
    dt = runs.table("decode", kernel_run)
    t = dt.pivot_table(index="B", columns="impl", values="graph_us")
    tuned, split = stage("S1best").decode_impl, stage("S2").decode_impl
    story_alone = i32.loc[(story_k, "ratio 4")].us_per_call if (story_k, "ratio 4") in i32.index else None
    sg_alone = i32.loc[(base, "ratio 4")].us_per_call if (base, "ratio 4") in i32.index else None
    lab_alone = (f"{kdev['name'].removeprefix('NVIDIA ')}: SGLang's kernel {t.loc[B, base]:.0f} us per call; the lab's {tuned} {t.loc[B, tuned]:.1f} "
                 f"({t.loc[B, base] / t.loc[B, tuned]:.0f}x), {split} {t.loc[B, split]:.1f} "
                 f"({t.loc[B, base] / t.loc[B, split]:.0f}x)")
    if story_alone and sg_alone:
        lab_alone += (f"; {here}: the story's kernel {story_alone:.0f} us vs SGLang's {sg_alone:.0f} in the "
                      f"replay's ratio-4 call ({sg_alone / story_alone:.0f}x)")
    beyond = "-"
    if hop is not None and B in hop.index:
        hopper = registered(tag="beyond_story")[0].name
        beyond = (f"{hopper} {hop.loc[B, hopper]:.1f} us at B = {B} vs {split} {hop.loc[B, split]:.1f} "
                  f"(same run)")
        big = max(hop.index)
        if tuned in hop and big != B:
            beyond += f"; B = {big}: {hop.loc[big, hopper]:.1f} vs {tuned} {hop.loc[big, tuned]:.1f} us"
    add(grp, f"sparse-MLA decode, the kernel alone (B = {B}, {cfg['index_topk']} valid entries)",
        f"not published (in the model: {d.before_ms / d.after_ms:.1f}x)", lab_alone,
        f"recorded decode run, one call per CUDA graph, B = {B}, on {here_k}; the replay's calls on {here}",
        f"the story measured its kernels inside its server only; here every kernel on the same rows; the story's "
        f"first MMA kernel (BLOCK_H {STORY_TILES.block_h}, no prefetch, no split) is not the "
        f"lab's tuned one",
        None, _x(t.loc[B, base], t.loc[B, split]), beyond)
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
        _arrow(*tot, " ms per step", "{:.1f}") + f" ({_x(*tot):.2f}x)", how, window + "; " + model,
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
    ch = runs.table("checks", kernel_run)
    lab_tc = [i for i in _lab_tensor_core() if i in set(ch.impl)]
    tc = ch[ch.impl.isin(lab_tc)].vs_simt_err.dropna()
    add(grp, "MMA vs SIMT kernel, relative error", runs.story_fact("MMA vs SIMT kernel rel. error"),
        f"<= {tc.max():.1e} ({', '.join(lab_tc)} vs the lab's SIMT kernel, {tc.size} checks)",
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
    ix = runs.table("indexer", kernel_run)
    ix = ix[(ix.kind == "time") & (ix.B == B)].pivot_table(index="max_seq_len", columns="impl", values="graph_us")
    L, live = cfg["index_max_seq_len"], cfg["live_context"]
    lab = ""
    if gs.get("fit"):
        f = gs["fit"]
        lab = (f"S0's glue = {f['glue_fixed_ms']:.1f} ms + {f['glue_per_ratio4_layer_ms']:.1f} ms per ratio-4 "
               f"layer (r2 {f['r2']:.3f}); ")
    fallback, live_only = stage("S0").indexer_impl, stage("S4").indexer_impl
    if L in ix.index and live in ix.index:
        lab += (f"the fallback alone at B = {B} on {here_k}: {ix.loc[L, fallback] / 1e3:.1f} ms at width {L} vs "
                f"{ix.loc[live, fallback] / 1e3:.2f} ms at {live}; the Triton indexer {ix.loc[L, live_only]:.1f} us")
    add(grp, "root cause of the glue", runs.story_fact("root cause of glue"), lab,
        "the replay's S0 with 0..21 ratio-4 layers (C = 32); the recorded indexer run (graph replay)",
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
    dec1 = (R.ms("S0", profile.DECODE, 1), R.ms("S1", profile.DECODE, 1), R.ms("S2", profile.DECODE, 1))
    add(grp, "the B = 1 regression's cause", runs.story_fact("B=1 regression cause"),
        f"the same 2-program grid on {dev['sm_count']} SMs; decode per step at C = 1: S0 {dec1[0]:.1f}, "
        f"S1 {dec1[1]:.2f}, S2 {dec1[2]:.2f} ms", "campaign replay profiles at C = 1",
        "the story's kernel at B = 1 against SGLang's on sm_120 is not published" + _c1_why(rep))
    add(grp, "the machine", runs.story_fact("node"),
        f"{here}: {cfg['name']}, random weights at the real shapes, live context {live}",
        "recorded device", "the lab replays one GPU's work of the story's 8; numbers compare in direction and "
        "size, never as equals")
    return pd.DataFrame(rows)


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


def _lab_tensor_core() -> list[str]:
    """The lab's own tensor-core decode kernels (tag "tensor_core" and a stage the story did not take)."""
    return [i.name for i in registered(tag="tensor_core") if i.stage and i.stage not in STORY_STEPS]


#: the recorded run of the Hopper kernel the tables read (experiments/hopper_decode)
HOPPER_RUN = "h200_run5"
#: recorded impl name -> today's: before the dispatcher (kernels/decode/auto.py) took the name, split-K had it
_RENAMED = {"auto": "splitk_auto"}


def _hopper_run() -> dict:
    """The recorded Hopper-kernel run (experiments/hopper_decode); no rows where it is not recorded."""
    try:
        return runs.experiment("hopper_decode", HOPPER_RUN)
    except FileNotFoundError:
        return {"rows": []}


def _hopper_times():
    """B x impl graph_us of the recorded Hopper-kernel run, or None."""
    df = hopper_time_rows(_hopper_run())
    return None if df.empty else df.pivot_table(index="B", columns="impl", values="graph_us")


def hopper_time_rows(d: dict):
    """The timing rows of a recorded hopper_decode run as a DataFrame, the impls under their names of
    today (_RENAMED)."""
    import pandas as pd
    df = pd.DataFrame([r for r in d["rows"] if r.get("kind") == "time"])
    if not df.empty and not set(_RENAMED.values()) & set(df["impl"]):
        df["impl"] = df["impl"].replace(_RENAMED)
    return df


def _hopper_check() -> str:
    hopper = registered(tag="beyond_story")[0].name
    errs = [r["out_err"] for r in _hopper_run()["rows"] if r.get("kind") == "check" and r.get("impl") == hopper]
    return f"{hopper} vs the float64 reference: out error <= {max(errs):.1e} ({len(errs)} checks)" if errs else "-"


STORY_VS_LAB_COLUMNS = ("figure", "story", "lab", "why they differ", "beyond the story")


def story_vs_lab_markdown(run: str = runs.REPLAY_RUN, columns=STORY_VS_LAB_COLUMNS,
                         kernel_run: str = runs.KERNEL_RUN) -> str:
    """:func:`story_vs_lab_table`'s ``columns`` as a markdown table (the README's block)."""
    df = story_vs_lab_table(run, kernel_run)
    return _markdown(columns, ([str(r[c]).replace("|", "\\|") for c in columns] for _, r in df.iterrows()))
