"""README.md's measured tables are rendered from data/ (dsv4lab.report): they must match it."""
from dsv4lab import report


def test_readme_tables_match_the_recorded_data():
    stale = report.sync_readme(write=False)
    assert not stale, f"README.md blocks differ from data/: {stale}; run `python -m dsv4lab readme`"


def test_every_readme_block_has_a_renderer():
    import re
    text = (report.runs.data_dir().parent / "README.md").read_text()
    names = set(re.findall(r"<!-- dsv4lab:([\w-]+) -->", text))
    assert names and names <= set(report.SECTIONS), names - set(report.SECTIONS)


def test_the_add_your_own_kernel_example_runs():
    """README's "Add your own kernel" code block, run as it stands in a process of its own (it
    registers an impl): the example is a test, so it cannot go stale."""
    import subprocess
    import sys
    text = (report.runs.data_dir().parent / "README.md").read_text()
    section = text[text.index("### Add your own kernel"):]
    code = section[section.index("```python") + len("```python"):section.index("```\n", section.index("```python") + 9)]
    assert "register(" in code and "check_decode" in code
    code = "import dsv4lab\n" + code + "\nassert 'torch_gather' in dsv4lab.impls()\nprint('ok', out_err, lse_err)\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-2000:]
