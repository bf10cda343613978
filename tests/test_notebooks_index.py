"""Notebook 00's index of the lab's notebooks: every notebook file in notebooks/ has a line in its
NOTEBOOKS dict (the table is generated from the folder and that dict) and is in its stored table."""
import ast
import json
import re
from pathlib import Path

import pytest

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
INDEX_NOTEBOOK = "00_setup_and_roofline.ipynb"
NAME = re.compile(r"^(\d\d[a-z]?)_[a-z0-9_]+\.ipynb$")


def _index_cell():
    nb = json.loads((NOTEBOOKS_DIR / INDEX_NOTEBOOK).read_text())
    cells = [c for c in nb["cells"] if c["cell_type"] == "code" and "NOTEBOOKS = {" in "".join(c["source"])]
    assert len(cells) == 1, f"{INDEX_NOTEBOOK} must define NOTEBOOKS in exactly one code cell, found {len(cells)}"
    return cells[0]


def _index_dict() -> dict:
    tree = ast.parse("".join(_index_cell()["source"]))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NOTEBOOKS" for t in node.targets):
            return ast.literal_eval(node.value)
    pytest.fail(f"no assignment to NOTEBOOKS in {INDEX_NOTEBOOK}")


def _notebooks():
    files = sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb"))
    assert INDEX_NOTEBOOK in files
    return files


def test_every_notebook_file_is_named_by_its_number():
    bad = [f for f in _notebooks() if not NAME.match(f)]
    assert not bad, f"notebooks must be named NN_topic.ipynb or NNa_topic.ipynb (an appendix), got {bad}"


def test_every_notebook_has_a_line_in_the_index():
    index = _index_dict()
    missing = [f for f in _notebooks() if NAME.match(f) and NAME.match(f).group(1) not in index]
    assert not missing, (f"add a one-line description of {missing} to NOTEBOOKS in {INDEX_NOTEBOOK} "
                         f"(keyed by the number the file name starts with), then re-execute it")
    for key, line in index.items():
        assert re.fullmatch(r"\d\d[a-z]?", key), f"NOTEBOOKS key {key!r} must be a notebook number like '02' or '02a'"
        assert isinstance(line, str) and line.strip(), f"NOTEBOOKS[{key!r}] must be a non-empty line"
        if not key.isdigit():
            assert key[:2] in index, f"appendix {key!r} needs its main notebook {key[:2]!r} in NOTEBOOKS"


def test_stored_index_lists_every_notebook():
    shown = "".join("".join(o.get("data", {}).get("text/markdown", "")) for o in _index_cell().get("outputs", []))
    missing = [f for f in _notebooks() if f"]({f})" not in shown]
    assert not missing, f"the stored index in {INDEX_NOTEBOOK} does not list {missing}: re-execute the notebook"
