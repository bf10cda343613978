"""Sentences of the committed notebooks against the data they were generated from, and the lab's
vocabulary: the checks that would have caught prose drifting from its outputs. Reads the stored
notebooks and the recorded data; runs no notebook."""
from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

import dsv4lab  # noqa: F401  (first: sets the mode before anything imports triton)
from dsv4lab import profile, runs, stages, story, widgets

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def _nb(name: str) -> dict:
    return json.loads((NOTEBOOKS / name).read_text())


def _generated(name: str) -> str:
    """Every markdown a notebook's cells generated, as stored."""
    return "\n".join("".join(o.get("data", {}).get("text/markdown", "")) for c in _nb(name)["cells"]
                     if c["cell_type"] == "code" for o in c.get("outputs", []))


def _markdown(name: str) -> str:
    return "\n".join("".join(c["source"]) for c in _nb(name)["cells"] if c["cell_type"] == "markdown")


def _main_path() -> list[str]:
    return sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


# ---- 06: "every other category moved by at most X%" ------------------------------------------------

def test_06_other_categories_moved_at_most_what_the_record_says():
    """From the milliseconds of the record the notebook reads: a category that empties (e.g. 'other'
    0.279 -> 0) is a 100% move, not a NaN speedup that a .max() skips."""
    text = _generated("06_profile_shift_and_throughput.ipynb")
    m = re.search(r"every other category of at least 1% of S0's time \((\d+)\) moved its milliseconds by at most "
                  r"([\d.]+)%", text)
    assert m, "06's sentence on the other categories is gone or reworded: update this test"
    code = "".join("".join(c["source"]) for c in _nb("06_profile_shift_and_throughput.ipynb")["cells"])
    run = re.search(r'^RUN = "(\w+)"', code, re.M).group(1)
    cats = {s: runs.replay(run)["stages"][s]["profiles"][str(runs.replay(run)["profile_batch"])]["by_category"]
            for s in ("S0", "S1")}
    total = sum(cats["S0"].values())
    moved = {c: abs(cats["S1"].get(c, 0.0) / v - 1) for c, v in cats["S0"].items()
             if c != profile.DECODE and v >= 0.01 * total}
    assert int(m.group(1)) == len(moved)
    assert float(m.group(2)) == pytest.approx(100 * max(moved.values()), abs=0.05)


# ---- 06a: a logit difference printed at the digits that make it true ---------------------------------

def test_06a_logit_differences_are_printed_as_recorded():
    text = _generated("06a_profile_shift_appendix.ipynb")
    printed = [float(v) for v in re.findall(r"its logits at most ([\d.e+-]+) from the uncompiled", text)]
    rec = runs.replay("h100")
    want = [v["max_abs_logit_diff"] for lesson in (*rec.get("compile_lessons", {}).values(),
                                                   runs.experiment("compile_lesson_s1", "h100_s1_after_launch_fix"))
            for v in lesson.get("variants", []) if v.get("ok") and not v["variant"].startswith("no compile")]
    assert printed and len(printed) == len(want)
    for p, w in zip(printed, want):
        assert p == float(f"{w:.3g}"), (p, w)          # 0.203 is not "within 0.2"
    assert "baseline, captured and timed in the lesson's own process" in text


# ---- 08a: the sanitizer's count is the count racecheck printed --------------------------------------

def test_08a_racecheck_counts_match_its_report():
    race = next(t for t in runs.experiment("compute_sanitizer", "h200_run1")["tools"] if t["tool"] == "racecheck")
    pairs = [int(n) for n in re.findall(r"\[(\d+) hazards\]", race["tail"])]
    text = _generated("08a_hopper_in_depth.ipynb")
    m = re.search(r"\*\*(\d+) race reports\*\* \(its summary counts (\d+) errors\), between (\d+) pairs of accesses "
                  r"and (\d+) hazards in all", text)
    assert m, "08a's racecheck sentence is gone or reworded: update this test"
    assert [int(g) for g in m.groups()] == [race["tail"].count("Race reported"), race["errors"], len(pairs), sum(pairs)]
    for name in ("08_beyond_the_story_hopper.ipynb", "08a_hopper_in_depth.ipynb"):
        assert not re.search(r"\d+ shared-memory hazards", _generated(name)), name


# ---- 00's promise of a "time live" box --------------------------------------------------------------

def _explorers(name: str) -> set:
    code = "".join("".join(c["source"]) for c in _nb(name)["cells"] if c["cell_type"] == "code")
    return set(re.findall(r"widgets\.(explore_\w+)\(", code))


def test_00_names_exactly_the_notebooks_whose_widgets_time_live():
    """00 says the widgets of notebooks 00 to 05 and 09 get a "time live" box on a GPU: exactly the
    notebooks whose explorer builds one (live.live_box)."""
    with_box = sorted(p.name[:3].rstrip("_") for p in NOTEBOOKS.glob("*.ipynb")
                      if any("live_box()" in inspect.getsource(getattr(widgets, e)) for e in _explorers(p.name)))
    assert with_box == ["00", "01", "02", "03", "04", "05", "09"]
    assert re.search(r'\(notebooks 00 to 05,\s+09\) get a "time\s+live" box', _markdown("00_setup_and_roofline.ipynb"))


def test_08s_widget_checks_the_hopper_kernel_where_it_can():
    src = inspect.getsource(widgets.hopper_live_check)
    assert "unavailable()" in src and "BLOCK_H" in src


# ---- the vocabulary: the timeline, the stages, the glossary, and every notebook linking them --------

def test_the_timeline_names_stages_and_notebooks_that_exist():
    names = {s.name for s in stages.STAGES}
    for s in (*story.TIMELINE, *story.NOT_TAKEN):
        assert set(s.stages) <= names, s
        assert list(NOTEBOOKS.glob(f"{s.notebook}_*.ipynb")), s
    in_timeline = {n for s in story.TIMELINE for n in s.stages}
    assert set(stages.STORY_STEPS) <= in_timeline, "a stage marked the story's is missing from story.TIMELINE"
    assert not {n for s in story.NOT_TAKEN for n in s.stages} & set(stages.STORY_STEPS)


def test_00_defines_the_timeline_stages_and_glossary_from_the_package():
    nb = _nb("00_setup_and_roofline.ipynb")
    md = _markdown("00_setup_and_roofline.ipynb")
    for heading in ("## Timeline", "## Stages", "## Glossary"):
        assert re.search(rf"^{heading}$", md, re.M), heading
    for term in ("MLA", "nope / rope", "UE8M0", "lse", "attention sink", "topk_len", "mHC", "window cache",
                 "ratio-4 / ratio-128 layers", "PDL", "Inductor"):
        assert f"**{term}**" in md, term
    stored = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                     for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", []))
    missing = [s.name for s in stages.STAGES if not re.search(rf"^{s.name}\s", stored, re.M)]
    assert not missing, f"00's stored stage table lacks {missing}: re-execute notebook 00"


NUMBERED = sorted(p.name for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not p.name.startswith("00_"))


@pytest.mark.parametrize("name", NUMBERED)
def test_notebooks_say_whose_step_and_link_the_timeline(name):
    """Every numbered notebook after 00 opens with whose step it is, the timeline, the glossary and what it teaches."""
    first = "".join(_nb(name)["cells"][0]["source"])
    assert "**Whose step:**" in first and "00_setup_and_roofline.ipynb#Timeline" in first
    assert "00_setup_and_roofline.ipynb#Glossary" in first
    assert "**You will learn:**" in first


@pytest.mark.parametrize("name", ["00_setup_and_roofline.ipynb", "04_indexer_bf16_gemm.ipynb",
                                  "06_profile_shift_and_throughput.ipynb", "07_story_vs_lab.ipynb",
                                  "08_beyond_the_story_hopper.ipynb"])
def test_no_research_log_residue_on_the_main_path(name):
    """Run names, targets of the A/B work and plans for a next version stay in the appendices."""
    nb = _nb(name)
    text = "\n".join("".join(c["source"]) for c in nb["cells"]) + _generated(name)
    for residue in ("next version's job", "TARGET_", "compressed tokens", "h200_clocks_run", "h200_gather_roofline"):
        assert residue not in text, (name, residue)
