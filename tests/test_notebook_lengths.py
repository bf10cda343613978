"""Every numbered notebook (00_, 01_, ... without a letter suffix) is a 15-minute read: at most 2,000
words a reader reads (markdown cells plus the markdown the notebook generates) and at most 220 non-blank
lines of code, the cell that defines a stage kernel (@triton.jit) not counted. Depth goes to the
appendices (NNa_). Reads the .ipynb files only."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
MAX_WORDS, MAX_CODE_LINES = 2000, 220
NUMBERED = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def reading_length(name: str) -> tuple:
    nb = json.loads((NOTEBOOKS / name).read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    words = sum(len("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")
    words += sum(len("".join(o.get("data", {}).get("text/markdown", "")).split()) for c in code
                 for o in c.get("outputs", []))
    lines = sum(1 for c in code if "@triton.jit" not in "".join(c["source"])
                for line in "".join(c["source"]).splitlines() if line.strip())
    return words, lines


def test_there_are_numbered_notebooks():
    assert len(NUMBERED) >= 9 and all(not n[2].isalpha() for n in NUMBERED)


@pytest.mark.parametrize("name", NUMBERED)
def test_main_path_is_a_15_minute_read(name):
    words, lines = reading_length(name)
    assert words <= MAX_WORDS, f"{name}: {words} words a reader reads (limit {MAX_WORDS}): move depth to an appendix"
    assert lines <= MAX_CODE_LINES, f"{name}: {lines} lines of code (limit {MAX_CODE_LINES}): move depth to an appendix"
