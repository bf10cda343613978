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
