"""The campaign's stages: the one vocabulary of the lab's stage names, and what each switches in the step.

The replay (dsv4lab.replay) walks them; an impl's ``Impl.stage`` (dsv4lab.registry) names the one it stands
for; the notebooks, the README and the docs use the same names. S0 the story's start (SGLang's SIMT decode
kernel, the indexer's torch fallback with an fp32 bmm over the max context, fp32 mHC pre-linear), S1 the
head-batched MMA kernel as the story changed SGLang's (BLOCK_H 32, the same loop over the whole padded
index row), S2 split-K (``splitk_auto``), S3 bf16 GEMMs for the indexer and mHC, S4 the Triton indexer.
Variants, each one change away from the stage it names: S1stop (the lab's: S1's kernel stopping each row
at ``topk_length``), S1best (the lab's tuned MMA kernel), S1cap (the story's "cap the context to 8192",
where the story made it: after its MMA kernel), and the same cap on S0 (S0cap) and S3 (S3cap). The table
is data: it names each stage's impls, and a code path that needs "the story's kernel" or "the Triton
indexer" asks it (``stage("S1").decode_impl``, ``stage("S4").indexer_impl``) instead of naming one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .registry import impls


@dataclass(frozen=True)
class Stage:
    """What one campaign stage switches in the step (the rest of the step is the same)."""
    name: str
    title: str
    decode_impl: str                  # dsv4lab.impls("sparse_decode")
    indexer_impl: str                 # dsv4lab.impls("indexer_topk")
    mhc_gemm: str = "float32"         # dtype of the mHC pre-linear (and head) GEMM: "float32" or "bfloat16"
    max_context: int | None = None    # None: the config's; an int caps the served context (the story's variant)

    def __post_init__(self):
        if self.mhc_gemm not in ("float32", "bfloat16"):
            raise ValueError(f"Stage.mhc_gemm must be 'float32' or 'bfloat16', got {self.mhc_gemm!r}")
        if self.decode_impl not in impls("sparse_decode"):
            raise ValueError(f"Stage.decode_impl must be one of {impls('sparse_decode')}, got {self.decode_impl!r}")
        if self.indexer_impl not in impls("indexer_topk"):
            raise ValueError(f"Stage.indexer_impl must be one of {impls('indexer_topk')}, "
                             f"got {self.indexer_impl!r}")

    @property
    def mhc_dtype(self) -> torch.dtype:
        return getattr(torch, self.mhc_gemm)

    def as_dict(self) -> dict:
        return asdict(self)


#: the campaign's stages, cumulative; variants at the end
STAGES = (
    Stage("S0", "story start: SGLang's SIMT decode, fp32 indexer fallback over the max context, fp32 mHC",
          decode_impl="sglang", indexer_impl="torch_fp32", mhc_gemm="float32"),
    Stage("S1", "the story's head-batched MMA decode (BLOCK_H 32): SGLang's loop over the whole padded row",
          decode_impl="mma_story", indexer_impl="torch_fp32", mhc_gemm="float32"),
    Stage("S2", "split-K decode (splitk_auto: tiles and NSPLIT per shape)",
          decode_impl="splitk_auto", indexer_impl="torch_fp32", mhc_gemm="float32"),
    Stage("S3", "bf16 GEMMs for the indexer and the mHC pre-linear",
          decode_impl="splitk_auto", indexer_impl="torch_bf16", mhc_gemm="bfloat16"),
    Stage("S4", "the Triton indexer: work follows the live context",
          decode_impl="splitk_auto", indexer_impl="triton", mhc_gemm="bfloat16"),
    Stage("S1stop", "variant of S1 (the lab's): the story's kernel stopping each row at topk_length",
          decode_impl="mma_story_stop", indexer_impl="torch_fp32", mhc_gemm="float32"),
    Stage("S1best", "variant of S1 (the lab's): the lab's tuned head-batched kernel (mma)",
          decode_impl="mma", indexer_impl="torch_fp32", mhc_gemm="float32"),
    Stage("S1cap", "variant of S1: the story's 'cap the context to 8192', where the story made it",
          decode_impl="mma_story", indexer_impl="torch_fp32", mhc_gemm="float32", max_context=8192),
    Stage("S0cap", "variant of S0: the context capped to 8192 before the MMA kernel",
          decode_impl="sglang", indexer_impl="torch_fp32", mhc_gemm="float32", max_context=8192),
    Stage("S3cap", "variant of S3: context capped to 8192",
          decode_impl="splitk_auto", indexer_impl="torch_bf16", mhc_gemm="bfloat16", max_context=8192),
)
#: the steps the story took (the rest are the lab's own, or the story's change applied elsewhere)
STORY_STEPS = ("S0", "S1", "S1cap")
STAGE_BY_NAME = {s.name: s for s in STAGES}
#: (before, after) pairs that get the story's before/after table
TRANSITIONS = (("S0", "S1"), ("S1", "S1stop"), ("S1stop", "S2"), ("S2", "S3"), ("S3", "S4"), ("S1", "S1cap"),
               ("S1stop", "S1best"), ("S0", "S0cap"), ("S3", "S3cap"), ("S0", "S4"))


def stage(name: str) -> Stage:
    if name not in STAGE_BY_NAME:
        raise ValueError(f"stage must be one of {list(STAGE_BY_NAME)}, got {name!r}")
    return STAGE_BY_NAME[name]
