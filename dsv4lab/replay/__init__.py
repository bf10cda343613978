"""The campaign replayed end to end: a synthetic decode step (dsv4lab.model) through every stage,
with the kernel-time profile shifting stage by stage and the throughput moving with it.

``python -m dsv4lab reproduce [--quick] [--stages S0 S1 ...] [--out DIR]`` runs :func:`main`:

* each stage's step is captured in one CUDA graph per concurrency C (batch = C, one token per
  request per step) and replayed: step time, tokens/s, and the fit step = a + b x C
  (b: the marginal per-request cost, 1000 / b: the asymptote in tok/s), as the story reports;
* at the story's batch (32) the replays are profiled (torch.profiler): every kernel by name,
  sorted into the story's categories (dsv4lab.profile.RULES); one eager step gives the glue's
  breakdown by aten op and each kernel's launching region (decode time per layer kind);
* the before/after table of every stage transition, a stacked-bar plot of the shift, the
  story's published numbers beside this device's, isolated decode calls (one call per graph)
  for the in-model vs isolated ratio, and the torch.compile lesson (compile the glue, capture
  the step, record what works and what fails, with the error text).

The stages (S0..S4 and the variants S1stop, S1best, S1cap, S0cap, S3cap) are the lab's one stage
table, dsv4lab.stages; the replay walks them in its order. One module a part: ``plan`` (what runs,
the budget's time model), ``fit`` (step = a + b x C), ``measure`` (a stage's steps), ``profiling``
(a cell's kernel profile), ``isolated`` (the decode calls alone), ``compile_lesson`` (in a child
process: ``python -m dsv4lab.replay --compile-lesson``), ``tables``, ``markdown``, ``figures`` and
``outputs`` (the run folder), ``run`` (:func:`main`, :func:`cli`).

On a CPU (``--quick`` or no GPU) the same code runs the small preset (model.CPU_MODEL) through
Triton's interpreter, times eager steps on the wall clock and profiles CPU time per region/op:
the numbers mean nothing, every path and file is exercised.
"""
from ..stages import STAGES, STORY_STEPS, stage
from .compile_lesson import COMPILE_VARIANTS
from .figures import story_change_lines, story_throughput_points, throughput_lines, with_story_bars
from .fit import fit_step_time, tokens_per_s
from .isolated import decode_calls_per_step, isolated_per_step
from .outputs import write_outputs
from .plan import (CONCURRENCY, CONCURRENCY_CPU, GLUE_SCALING_COUNTS, PROFILE_BATCH, PROFILE_BATCH_CPU,
                   budget_plan, estimate_step_ms, glue_scaling_counts, stage_for)
from .profiling import category_by_region, decode_by_kind, decode_regions
from .run import cli, main

#: what notebooks, tests and the lab's other modules read here
__all__ = ["STAGES", "STORY_STEPS", "stage", "COMPILE_VARIANTS", "story_change_lines", "story_throughput_points",
           "throughput_lines", "with_story_bars", "fit_step_time", "tokens_per_s", "decode_calls_per_step",
           "isolated_per_step", "write_outputs", "CONCURRENCY", "CONCURRENCY_CPU", "GLUE_SCALING_COUNTS",
           "PROFILE_BATCH", "PROFILE_BATCH_CPU", "budget_plan", "estimate_step_ms", "glue_scaling_counts",
           "stage_for", "category_by_region", "decode_by_kind", "decode_regions", "cli", "main"]
