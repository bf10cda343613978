"""A kernel a notebook defines in a cell, for the reader to edit and rerun, is the package's kernel as
committed: the cell's function source equals the package function's (trailing whitespace aside), so
the two cannot drift. Reads the .ipynb files only (nbformat); runs nothing."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import nbformat
import pytest

from dsv4lab.kernels.decode import head_batched, simt, split_k
from dsv4lab.kernels.indexer import triton_indexer
from dsv4lab.kernels.step import router

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"

#: (notebook, name of the function a cell defines, the package's jitted function)
CELL_KERNELS = [
    ("01_simt_baseline.ipynb", "_simt_decode_kernel", simt._simt_decode_kernel),
    ("02_head_batched_mma.ipynb", "_story_kernel", head_batched._story_kernel),
    ("03_split_k.ipynb", "merge_partials", split_k.merge_partials),
    ("03_split_k.ipynb", "_combine_kernel", split_k._combine_kernel),
    ("05_triton_indexer.ipynb", "_indexer_kernel", triton_indexer._indexer_kernel),
    ("09_after_the_story.ipynb", "_router_kernel", router._router_kernel),
]


def _normalized(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def cell_function_source(notebook: str, name: str) -> str:
    """The source of the one top-level ``def name`` among the notebook's code cells, decorators included."""
    found = []
    for cell in nbformat.read(NOTEBOOK_DIR / notebook, as_version=4).cells:
        if cell.cell_type != "code" or f"def {name}(" not in cell.source:
            continue
        lines = cell.source.splitlines()
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                found.append("\n".join(lines[first - 1:node.end_lineno]))
    assert len(found) == 1, f"{notebook}: {len(found)} cells define {name}"
    return found[0]


@pytest.mark.parametrize("notebook,name,kernel", CELL_KERNELS, ids=[f"{n}:{k}" for n, k, _ in CELL_KERNELS])
def test_the_cell_kernel_is_the_package_kernel(notebook, name, kernel):
    assert _normalized(cell_function_source(notebook, name)) == _normalized(inspect.getsource(kernel.fn))
