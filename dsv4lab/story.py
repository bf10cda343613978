"""The story's chronology: the steps the campaign took, in the order it took them, and where the lab
replays each.

The lab's stages (:mod:`dsv4lab.stages`) are ordered by what builds on what, not by when the story did
it: the story's own steps are S1 (its head-batched kernel) and S1cap (its cap on the context), and its
Triton indexer sits in S4, on top of the lab's split-K (S2) and bf16 GEMMs (S3), which the story
proposed or never built. This table is the one place that order is written; notebook 00 draws it
(``plots.story_timeline``) and every campaign notebook links to it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StoryStep:
    """One step of the story, and where the lab replays it."""
    what: str            # the step, as the story took it
    outcome: str         # what came of it in the story
    stages: tuple        # the lab's stages that replay it (dsv4lab.stages names); () for none
    notebook: str        # the lab's notebook that takes it apart ("02", "06a")


#: the story's steps, in its order
TIMELINE = (
    StoryStep("the head-batched MMA decode kernel", "built: its decode 6.3x faster", ("S0", "S1"), "02"),
    StoryStep("torch.compile on the glue", "tried: at odds with the CUDA-graph capture", (), "06a"),
    StoryStep("an op-level profile of the glue", "the indexer's torch fallback over the max context", (), "04"),
    StoryStep("cap the context to 8192", "built: a stopgap", ("S1cap",), "06"),
    StoryStep("the Triton indexer", "built: the indexer's work follows the live context", ("S4",), "05"),
)
#: what the story proposed and did not build; the lab builds both
NOT_TAKEN = (
    StoryStep("the indexer's bmm in bf16", "proposed only", ("S3",), "04"),
    StoryStep("split-K decode", "never built", ("S2",), "03"),
)


def timeline_rows() -> list[dict]:
    """The timeline and the steps not taken as rows: order (1.. for the story's steps, '-' else)."""
    return ([dict(order=i, step=s.what, in_the_story=s.outcome, lab=", ".join(s.stages) or "-", notebook=s.notebook)
             for i, s in enumerate(TIMELINE, 1)]
            + [dict(order="-", step=s.what, in_the_story=s.outcome, lab=", ".join(s.stages), notebook=s.notebook)
               for s in NOT_TAKEN])
