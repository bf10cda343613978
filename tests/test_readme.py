"""The measured tables of README.md and the docs pages are rendered from data/ (dsv4lab.report): they
must match it, wherever a block lives."""
from dsv4lab import report


def _names(path) -> list[str]:
    """The names of the marked blocks (an opening marker and its closing one) of a page."""
    return [name for name, _ in report.BLOCK.findall(path.read_text())]


def test_readme_and_docs_tables_match_the_recorded_data():
    stale = report.sync_readme(write=False)
    assert not stale, f"README.md / docs/*.md blocks differ from data/: {stale}; run `python -m dsv4lab readme`"


def test_the_renderer_covers_the_readme_and_every_docs_page():
    root = report.runs.data_dir().parent
    assert set(report.pages()) == {root / "README.md", *(root / "docs").glob("*.md")}


def test_every_block_has_a_renderer_and_every_renderer_a_block():
    found = [n for p in report.pages() for n in _names(p)]
    assert set(found) <= set(report.SECTIONS), set(found) - set(report.SECTIONS)
    assert set(found) == set(report.SECTIONS), f"no page holds {set(report.SECTIONS) - set(found)}"
    assert len(found) == len(set(found)), "a block appears twice"
    assert _names(report.pages()[0]), "the README holds no block"


def test_the_check_fails_on_a_stale_block_in_a_docs_page(tmp_path):
    """The check reads docs pages, not only the README: a changed cell of a moved table is caught."""
    src = report.runs.data_dir().parent / "docs" / "measured.md"
    page = tmp_path / "measured.md"
    text = src.read_text()
    start = text.index("<!-- dsv4lab:decode-table -->")
    page.write_text(text[:start] + text[start:].replace("| 1 |", "| 1 | 0.0 |", 1))
    assert report.sync_readme(page, write=False) == ["decode-table"]
    assert report.sync_readme(page, write=True) == ["decode-table"]
    assert page.read_text() == text and report.sync_readme(page, write=False) == []


def test_the_add_your_own_kernel_example_runs():
    """docs/api.md's "Add your own kernel" code block, run as it stands in a process of its own (it
    registers an impl): the example is a test, so it cannot go stale."""
    import subprocess
    import sys
    text = (report.runs.data_dir().parent / "docs" / "api.md").read_text()
    section = text[text.index("## Add your own kernel"):]
    code = section[section.index("```python") + len("```python"):section.index("```\n", section.index("```python") + 9)]
    assert "register(" in code and "check_decode" in code
    code = "import dsv4lab\n" + code + "\nassert 'torch_gather' in dsv4lab.impls()\nprint('ok', out_err, lse_err)\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]


def test_the_readme_links_to_every_docs_page():
    root = report.runs.data_dir().parent
    readme = (root / "README.md").read_text()
    missing = [p.name for p in sorted((root / "docs").glob("*.md")) if f"](docs/{p.name})" not in readme]
    assert not missing, f"README.md does not link to {missing}"
