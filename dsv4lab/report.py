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


def bad_input_table() -> str:
    from . import contracts
    return contracts.render()


SECTIONS = {"decode-run": lambda: run_line("decode"), "decode-table": decode_table,
            "indexer-run": lambda: run_line("indexer"), "indexer-table": indexer_table,
            "bad-input": bad_input_table}


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
