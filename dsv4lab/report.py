"""The measured tables of the README and the docs pages, rendered from the recorded data so the text
cannot drift. The story's figures beside the lab's own are built in dsv4lab.story_vs_lab; notebooks 07,
07a and 08 read its names here.

Each table lives in README.md or a page of docs/ between ``<!-- dsv4lab:NAME -->`` and
``<!-- /dsv4lab:NAME -->``; ``python -m dsv4lab readme`` rewrites those blocks from data/ wherever they
are, ``--check`` exits 1 if any differs (a test runs the check).
"""
from __future__ import annotations

import re
from pathlib import Path

from . import roofline, runs
from .registry import registered
from .stages import stage
from .story_vs_lab import (HOPPER_RUN, STORY_DEVICE, hopper_time_rows,  # noqa: F401  (notebooks read them here)
                           story_vs_lab_markdown, story_vs_lab_table)


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


def after_the_story_table(run: str = runs.REPLAY_RUN, before: str = "S4", after: str = "S5") -> str:
    """S4 (the story's last step) beside S5 (the glue fused): step ms and kernels a step at C = 1, tok/s at
    each recorded C, how far above the byte floor, and the two stages' agreement on one path."""
    d = runs.replay(run)
    st = d["stages"]
    if before not in st or after not in st:
        return f"(the record `{run}` has no {before} and {after})"
    above = {(r["stage"], r["C"]): r["x_above_floor"] for r in roofline.above_floor(d)}
    cs = [r["C"] for r in st[after]["steps"]]
    ends = [c for c in (cs[0], cs[-1]) if (after, c) in above]

    def row(name):
        steps = {r["C"]: r for r in st[name]["steps"]}
        kernels = sum(k["calls"] for k in st[name]["profiles"]["1"]["kernels"])
        return [name, _fmt(steps[1]["step_ms"], 2), f"{kernels:,.0f}", *(_fmt(steps[c]["tok_s"]) for c in cs),
                *(f"{above[name, c]:.1f}x" for c in ends)]
    table = _markdown(["stage", "step ms C=1", "kernels a step C=1", *(f"tok/s C={c}" for c in cs),
                       *(f"above the floor C={c}" for c in ends)], [row(before), row(after)])
    agree = [a for a in d.get("stage_agreement", []) if "rel_err" in a]
    if agree:
        table += ("\n\n" + f"{after} against {before} on one path ({before}'s top-k and experts replayed): "
                  + "logits within "
                  + ", ".join(f"{a['rel_err']:.3f} at C = {a['B']}" for a in agree)
                  + f" of {before}'s (bound {agree[0]['tolerance']:.3f}).")
    return table


def bad_input_table() -> str:
    from . import bad_input
    return bad_input.render()


def recorded_devices() -> str:
    """One line per recorded run under data/runs/: the kernel runs and the replays, device and date."""
    lines = [f"- `data/runs/{run}/`: the kernel runs (`python -m dsv4lab record`) on one "
             f"{runs.load('device', run)['device']['name']}, {runs.load('device', run)['date'][:10]}"
             for run in runs.available()]
    for run in runs.replays():
        env = runs.replay(run)["environment"]
        lines.append(f"- `data/runs/{run}/reproduce/`: the campaign replay (`python -m dsv4lab reproduce`) on one "
                     f"{env['device']['name']}, {env['date'][:10]}")
    return "\n".join(lines)


SECTIONS = {"decode-run": lambda: run_line("decode"), "decode-table": decode_run_table,
            "indexer-run": lambda: run_line("indexer"), "indexer-table": indexer_table,
            "indexer-step": indexer_step_targets,
            "story-vs-lab": lambda: story_vs_lab_markdown(),
            "replay-run": replay_run_line, "replay-throughput": replay_throughput_table,
            "replay-shift": replay_shift_table, "replay-devices": replay_devices_table, "bad-input": bad_input_table,
            "after-the-story": after_the_story_table,
            "recorded-devices": recorded_devices}


def render(name: str) -> str:
    return SECTIONS[name]()


def pages() -> list[Path]:
    """The files whose marked blocks the renderer keeps: README.md and every page of docs/."""
    root = runs.data_dir().parent
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


BLOCK = re.compile(r"<!-- dsv4lab:([\w-]+) -->\n(.*?)<!-- /dsv4lab:\1 -->", re.S)


def sync_readme(path=None, write: bool = True) -> list[str]:
    """Rewrite (or, write=False, compare) every marked block of README.md and the docs pages (or of
    ``path``: one file or a list of files); returns the names of the blocks that differed."""
    paths = pages() if path is None else [Path(p) for p in ([path] if isinstance(path, (str, Path)) else path)]
    stale = []

    def fill(m):
        name = m.group(1)
        body = render(name)
        if m.group(2).strip() != body.strip():
            stale.append(name)
        return f"<!-- dsv4lab:{name} -->\n{body}\n<!-- /dsv4lab:{name} -->"
    for p in paths:
        text = p.read_text()
        new = BLOCK.sub(fill, text)
        if write and new != text:
            p.write_text(new)
    return stale
