"""The README's measured tables, rendered from the recorded data so the text cannot drift.

Each table lives in README.md between ``<!-- dsv4lab:NAME -->`` and ``<!-- /dsv4lab:NAME -->``;
``python -m dsv4lab readme`` rewrites those blocks from data/, ``--check`` exits 1 if any
differs (a test runs the check).
"""
from __future__ import annotations

import re
from pathlib import Path

from . import runs

DECODE_IMPLS = ("sglang", "simt", "mma_story", "mma", "splitk", "auto")


def _fmt(v, digits=1):
    return "-" if v is None or v != v else f"{v:.{digits}f}"


def run_line(part: str = "decode", run: str = "h200") -> str:
    """'Run <date> on one <device> (<SMs> SMs; torch, triton; measured ceilings)' of a recorded part."""
    d = runs.load(part, run)
    dev = d["device"]
    c = d.get("ceilings") or runs.load("device", run).get("ceilings", {})
    ceil = f"; measured ceilings {c['copy_tb_s']:.2f} TB/s copy, {c['bf16_tflops']:.0f} TFLOP/s bf16 matmul" if c else ""
    return (f"Run {d['date'][:16]}Z (device clock) on one {dev['name']} ({dev['sm_count']} SMs; torch {d['torch']}, "
            f"triton {d['triton']}{ceil}).")


def decode_table(run: str = "h200") -> str:
    """Time per call (us, one-call CUDA graph) of every decode impl in the recorded run, auto's
    speedup over SGLang's kernel, and auto per call inside a graph of 8 calls."""
    df = runs.table("decode", run)
    df = df[df["graph_us"].notna()] if "graph_us" in df else df
    impls = [i for i in DECODE_IMPLS if i in set(df.impl)]
    t = df.pivot_table(index="B", columns="impl", values="graph_us")
    layer = df.pivot_table(index="B", columns="impl", values="graph_layer_us") if "graph_layer_us" in df else None
    head = ["B", *impls, "auto vs sglang"]
    if layer is not None and "auto" in layer:
        head += ["auto, 8-call graph", "vs sglang, same"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for B, r in t.iterrows():
        cells = [str(int(B)), *(_fmt(r.get(i)) for i in impls)]
        cells.append(f"{r['sglang'] / r['auto']:.0f}x" if {"sglang", "auto"} <= set(r.index) else "-")
        if len(head) > len(cells):
            lr = layer.loc[B]
            cells += [_fmt(lr.get("auto")), f"{lr['sglang'] / lr['auto']:.0f}x" if "sglang" in lr else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def indexer_table(run: str = "h200") -> str:
    """The indexer step at B = 32 against the max context (us, graph replay)."""
    df = runs.table("indexer", run)
    tm = df[(df["kind"] == "time") & (df["B"] == 32)]
    t = tm.pivot_table(index="max_seq_len", columns="impl", values="graph_us")
    cols = [c for c in ("torch_fp32", "torch_bf16", "sglang", "triton") if c in t] + \
           [c for c in t.columns if c not in ("torch_fp32", "torch_bf16", "sglang", "triton")]
    lines = ["| max context | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for L, r in t.iterrows():
        lines.append(f"| {int(L)} | " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(lines)


def _replay(run: str = "h200") -> dict:
    import json
    path = runs.data_dir() / "runs" / run / "reproduce" / "reproduce.json"
    return json.loads(path.read_text())


def replay_run_line(run: str = "h200") -> str:
    """What the recorded replay ran: date, device, versions, the model's share and layer mix."""
    d = _replay(run)
    env, cfg = d["environment"], d["config"]
    return (f"Run {env['date'][:16]}Z on one {env['device']['name']} (torch {env['torch']}, triton {env['triton']}): "
            f"{cfg['name']}, {cfg['layers_window']} window-only + {cfg['layers_c4']} ratio-4 + {cfg['layers_c128']} "
            f"ratio-128 layers, {cfg['live_context']} live tokens a request, max context {cfg['max_context']}; "
            f"each step one CUDA graph per C, {d['elapsed_s']:.0f} s in all.")


def replay_throughput_table(run: str = "h200") -> str:
    """tok/s per stage at each C, the fit's marginal cost b and asymptote 1000 / b."""
    d = _replay(run)["tables"]
    import pandas as pd
    tp = pd.DataFrame(d["throughput"])
    fits = {f["stage"]: f for f in d["fits"]}
    t = tp.pivot_table(index="stage", columns="C", values="tok_s", sort=False)
    cs = list(t.columns)
    lines = ["| stage | " + " | ".join(f"tok/s C={c}" for c in cs) + " | marginal ms per request | asymptote tok/s |",
             "|---|" + "---|" * (len(cs) + 2)]
    for stage, r in t.iterrows():
        f = fits.get(stage, {})
        lines.append(f"| {stage} | " + " | ".join(_fmt(r[c]) for c in cs)
                     + f" | {_fmt(f.get('b_ms'), 2)} | {_fmt(f.get('asymptote_tok_s'), 0)} |")
    return "\n".join(lines)


def replay_shift_table(run: str = "h200", before: str = "S0", after: str = "S1") -> str:
    """The story's table, measured: kernel time by category before and after the MMA kernel at C = 32,
    beside the story's published shares."""
    d = _replay(run)["tables"]
    rows = next(t["rows"] for t in d["transitions"] if t["before"] == before and t["after"] == after)
    story = runs.campaign("story_profile").set_index("kernel")
    key = {"sparse-MLA decode": "sparse-MLA decode", "FP32 SIMT GEMM": "FP32 SIMT GEMM",
           "elementwise/copy/reduce glue": "elementwise/copy/reduce glue", "MoE GEMM": "FP4 MoE GEMM",
           "total kernel time": "total GPU kernel time"}

    def story_of(cat):
        for k, v in key.items():
            if cat.startswith(k):
                hit = [i for i in story.index if i.startswith(v)]
                if hit:
                    r = story.loc[hit[0]]
                    return f"{r.before_share_pct:g}% -> {r.after_share_pct:g}%"
        return ""
    lines = [f"| kernel category | {before} ms | {before} % | {after} ms | {after} % | speedup | the story (% of kernel time) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        cat = r["kernel category"]
        lines.append(f"| {cat} | {_fmt(r[f'{before} ms'])} | {_fmt(r[f'{before} %'])} | {_fmt(r[f'{after} ms'])} | "
                     f"{_fmt(r[f'{after} %'])} | {_fmt(r['speedup'], 2)}x | {story_of(cat)} |")
    return "\n".join(lines)


def bad_input_table() -> str:
    from . import contracts
    return contracts.render()


SECTIONS = {"decode-run": lambda: run_line("decode"), "decode-table": decode_table,
            "indexer-run": lambda: run_line("indexer"), "indexer-table": indexer_table,
            "replay-run": replay_run_line, "replay-throughput": replay_throughput_table,
            "replay-shift": replay_shift_table, "bad-input": bad_input_table}


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
