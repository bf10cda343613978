"""What a replay runs and how long it should take: the concurrencies, the profiled batch, each stage
for the model's config, and a rough up-front time model (H200) for the printed budget (the run adapts
its repeats to the measured steps and skips what no longer fits)."""
from __future__ import annotations

import time
from dataclasses import replace

from ..model import ModelConfig
from ..registry import impl_info
from ..stages import Stage, stage

CONCURRENCY = (1, 16, 32, 64)
PROFILE_BATCH = 32            # the story's steady-state batch
CONCURRENCY_CPU = (1, 2)
PROFILE_BATCH_CPU = 2
#: ratio-4 layer counts for S0's glue scaling (the other compressed layers ratio 128)
GLUE_SCALING_COUNTS = (0, 7, 14, 21)
DEFAULT_BUDGET_S = 520        # of the 600 s one GPU command may run (imports and the files come on top)


def stage_for(s: Stage, cfg: ModelConfig) -> Stage:
    """The stage for this config: a context cap at or above the config's maximum (the CPU preset
    serves less than 8192) becomes the live context, so the cap still caps."""
    if s.max_context is not None and s.max_context >= cfg.max_context:
        return replace(s, max_context=cfg.live_context)
    return s


def with_ratio4(cfg: ModelConfig, n: int) -> ModelConfig:
    """cfg with n ratio-4 layers, the rest of its compressed layers ratio 128."""
    return replace(cfg, layers_c4=n, layers_c128=cfg.layers_c4 + cfg.layers_c128 - n)


def glue_scaling_counts(cfg: ModelConfig, counts) -> list:
    """The ratio-4 layer counts the glue scaling can build from ``cfg`` (no more than its compressed
    layers): the same list for its run and for the budget's estimate of it."""
    return [n for n in counts if n <= cfg.layers_c4 + cfg.layers_c128]


def estimate_step_ms(cfg: ModelConfig, s: Stage, C: int) -> float:
    """Rough H200 step time (ms), from the recorded runs in data/runs/h200: the torch indexer
    fallback costs ~1.6e-6 ms per (request x max-width position) in fp32, 1.4e-6 in bf16; the
    Triton indexer's top-k ~2e-8; SGLang's SIMT kernel ~1.8e-4 ms per (request x index entry),
    masked entries ~1/6 of that; the lab's kernels ~20 us a call; the rest ~0.35 ms a layer (S5 ~0.12).
    Each impl's cost follows what the registry says of it: its stage, its tags, its dead-page reads."""
    L = cfg.index_max_seq_len(s.max_context)
    topk = impl_info("indexer_topk", s.indexer_impl)
    if topk.reads_dead_pages:                        # the torch fallback: a bmm over the max context
        indexer = C * L * (1.65e-6 if "exact" in topk.tags else 1.37e-6)      # fp32 or bf16
    else:
        indexer = 0.03 + 2.1e-8 * C * L
    wide = cfg.c128_width(s.max_context)
    decode = impl_info("sparse_decode", s.decode_impl)
    if decode.stage == "S0":                         # the SIMT kernels, SGLang's (the baseline) or the lab's
        per = 1.8e-4 if "baseline" in decode.tags else 0.65e-4
        window = per * C * cfg.window
        c4 = per * C * cfg.index_topk
        c128 = per * C * (cfg.live_context // 128) + per / 6 * C * wide
    elif decode.stage in ("S1", "S1stop"):           # the story's kernel: S1's walks the whole padded row
        # ~7 us a 32-entry tile of one program's loop; programs beyond one wave of 132 SMs queue
        tile = 0.007 * -(-2 * C // 132)
        c128_entries = wide if decode.stage == "S1" else cfg.live_context // 128
        window, c4, c128 = (tile * -(-k // 32) for k in (cfg.window, cfg.index_topk, c128_entries))
    else:
        window = c4 = c128 = 0.02 + 2e-6 * C * cfg.index_topk
    n0, n4, n128 = cfg.layers_window, cfg.layers_c4, cfg.layers_c128
    decode_ms = n0 * window + n4 * (window + c4) + n128 * (window + c128)
    rest = 0.35 if s.glue == "torch" else 0.12       # S5's fused glue: ~30 launches a layer, not ~190
    return n4 * indexer + decode_ms + cfg.num_layers * (rest + 0.004 * C)


def estimate_stage_s(cfg, s, concurrency, profile_at) -> float:
    """Seconds one stage takes: Triton compiles (~10 s), per C three eager warm-ups + capture +
    ~max(3, 1 s worth of) replays; where profiled 3 replays (~1.5 s to read the profile) and, at
    the last profiled C, a profiled eager step (~4 s to read)."""
    t = 10.0
    for C in concurrency:
        ms = estimate_step_ms(cfg, s, C)
        t += (4 * ms + max(3 * ms, 1000.0)) / 1e3 + 0.5
        if C in profile_at:
            t += 3 * ms / 1e3 + 1.5
        if C == profile_at[-1]:
            t += 2 * ms / 1e3 + 4.0
    return t


def budget_plan(cfg: ModelConfig, todo, concurrency, profile_at, scaling_counts, compile_glue: bool) -> dict:
    """Seconds each part of a GPU run should take (estimates for an H200; the run adapts its repeats
    and skips what no longer fits); built from the same configurations the run builds."""
    s0 = stage_for(stage("S0"), cfg)
    B = profile_at[-1]
    return dict(setup_s=20.0, stages_s={s.name: estimate_stage_s(cfg, s, concurrency, profile_at) for s in todo},
                glue_scaling_s=sum(8.0 + 8 * estimate_step_ms(with_ratio4(cfg, n), s0, B) / 1e3
                                   for n in glue_scaling_counts(cfg, scaling_counts)),
                isolated_decode_s=35.0, compile_lesson_s=140.0 if compile_glue else 0.0, outputs_s=10.0)


class Deadline:
    """The run's clock against its budget: no new work starts once too little is left."""
    def __init__(self, budget_s: float):
        self.t0 = time.time()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.time() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()
