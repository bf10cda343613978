"""Bad input and what it gets: every case of dsv4lab.contracts does what docs/bad_input.md's table says,
and the table is the rendering of those cases."""
import pytest

from dsv4lab import bad_input, report


@pytest.mark.parametrize("case", bad_input.CASES, ids=lambda c: f"{c.entry}: {c.bad} [{c.checks}]")
def test_case_gets_what_the_table_says(case):
    if case.raises is None:
        case.run()                                  # answers; the case checks its answer itself
        return
    with pytest.raises(case.raises) as e:
        case.run()
    assert case.says in str(e.value), f"message: {e.value}"


def test_docs_table_is_the_rendering():
    assert len(bad_input.CASES) >= 30
    assert "bad-input" in report.SECTIONS
    assert report.render("bad-input") == bad_input.render()
    assert "bad-input" not in report.sync_readme(write=False), "run `python -m dsv4lab readme`"
