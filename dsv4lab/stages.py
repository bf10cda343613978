"""The campaign's stages: the one vocabulary of the lab's stage names, and what each switches in the step.

The replay (dsv4lab.replay) walks them; an impl's ``Impl.stage`` (dsv4lab.registry) names the one it stands
for; the notebooks, the README and the docs use the same names. S0 the story's start (SGLang's SIMT decode
kernel, the indexer's torch fallback with an fp32 bmm over the max context, fp32 mHC pre-linear), S1 the
head-batched MMA kernel as the story changed SGLang's (BLOCK_H 32, the same loop over the whole padded
index row), S2 split-K (``splitk_auto``), S3 bf16 GEMMs for the indexer and mHC, S4 the Triton indexer,
S5 (after the story, the lab's) S4 with the glue between the kernels fused into Triton kernels.
Variants, each one change away from the stage it names: S1stop (the lab's: S1's kernel stopping each row
at ``topk_length``), S1best (the lab's tuned MMA kernel), S1cap (the story's "cap the context to 8192",
where the story made it: after its MMA kernel), and the same cap on S0 (S0cap) and S3 (S3cap). The table
is data: each stage is the one before it with what it changes, and what it changes is the first impl the
registry has for the stage (S0's decode: the one tagged "baseline"), except where the stage runs a later
one (S2's ``splitk_auto``). A code path that needs "the story's kernel" or "the Triton indexer" asks the
table (``stage("S1").decode_impl``, ``stage("S4").indexer_impl``) instead of naming one. Importing it
needs the kernels registered (``import dsv4lab`` does it).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch

from .registry import impls, registered


@dataclass(frozen=True)
class Stage:
    """What one campaign stage switches in the step (the rest of the step is the same)."""
    name: str
    title: str
    decode_impl: str                  # dsv4lab.impls("sparse_decode")
    indexer_impl: str                 # dsv4lab.impls("indexer_topk")
    mhc_gemm: str = "float32"         # dtype of the mHC pre-linear (and head) GEMM: "float32" or "bfloat16"
    max_context: int | None = None    # None: the config's; an int caps the served context (the story's variant)
    glue: str = "torch"               # the step's glue: "torch" (torch ops, S0..S4) or "fused" (Triton kernels, S5)

    def __post_init__(self):
        if self.mhc_gemm not in ("float32", "bfloat16"):
            raise ValueError(f"Stage.mhc_gemm must be 'float32' or 'bfloat16', got {self.mhc_gemm!r}")
        if self.glue not in ("torch", "fused"):
            raise ValueError(f"Stage.glue must be 'torch' or 'fused', got {self.glue!r}")
        if self.glue == "fused" and self.mhc_gemm != "bfloat16":
            raise ValueError("Stage.glue 'fused' runs the mHC pre-linear on tensor cores: it needs mhc_gemm 'bfloat16'")
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


def _registered_for(op: str, name: str, tag: str | None = None) -> str:
    """The first impl of ``op`` (with ``tag``) registered for stage ``name`` (Impl.stage). The registry keeps
    the campaign's order, so a stage's own impl comes before those the lab (or a new kernel) added for it."""
    found = [i.name for i in registered(op, tag) if i.stage == name]
    if not found:
        raise LookupError(f"no impl of {op} is registered for stage {name}")
    return found[0]


def _then(before: Stage, name: str, title: str, **change) -> Stage:
    """Stage ``name``: ``before`` with ``change`` (the stages are cumulative; a variant is one change away)."""
    return replace(before, name=name, title=title, **change)


_DECODE, _TOPK = "sparse_decode", "indexer_topk"
_CAP = 8192                           # the story's "cap the context to 8192"
_S0 = Stage("S0", "story start: SGLang's SIMT decode, fp32 indexer fallback over the max context, fp32 mHC",
            decode_impl=_registered_for(_DECODE, "S0", tag="baseline"), indexer_impl=_registered_for(_TOPK, "S0"))
_S1 = _then(_S0, "S1", "the story's head-batched MMA decode (BLOCK_H 32): SGLang's loop over the whole padded row",
            decode_impl=_registered_for(_DECODE, "S1"))
# S2 runs the shape-tuned split-K, registered for it after the fixed-tile one
_S2 = _then(_S1, "S2", "split-K decode (splitk_auto: tiles and NSPLIT per shape)", decode_impl="splitk_auto")
_S3 = _then(_S2, "S3", "bf16 GEMMs for the indexer and the mHC pre-linear",
            indexer_impl=_registered_for(_TOPK, "S3"), mhc_gemm="bfloat16")
_S4 = _then(_S3, "S4", "the Triton indexer: work follows the live context", indexer_impl=_registered_for(_TOPK, "S4"))
# after the story: the same kernels, the glue between them fused into Triton kernels (kernels/step/)
_S5 = _then(_S4, "S5", "after the story (the lab's): the step's glue fused into Triton kernels", glue="fused")

#: the campaign's stages, cumulative; variants at the end
STAGES = (
    _S0, _S1, _S2, _S3, _S4, _S5,
    _then(_S1, "S1stop", "variant of S1 (the lab's): the story's kernel stopping each row at topk_length",
          decode_impl=_registered_for(_DECODE, "S1stop")),
    _then(_S1, "S1best", "variant of S1 (the lab's): the lab's tuned head-batched kernel (mma)",
          decode_impl=_registered_for(_DECODE, "S1best")),
    _then(_S1, "S1cap", "variant of S1: the story's 'cap the context to 8192', where the story made it",
          max_context=_CAP),
    _then(_S0, "S0cap", "variant of S0: the context capped to 8192 before the MMA kernel", max_context=_CAP),
    _then(_S3, "S3cap", "variant of S3: context capped to 8192", max_context=_CAP),
)
#: the steps the story took (the rest are the lab's own, or the story's change applied elsewhere)
STORY_STEPS = ("S0", "S1", "S1cap")
STAGE_BY_NAME = {s.name: s for s in STAGES}
#: (before, after) pairs that get the story's before/after table
TRANSITIONS = (("S0", "S1"), ("S1", "S1stop"), ("S1stop", "S2"), ("S2", "S3"), ("S3", "S4"), ("S1", "S1cap"),
               ("S1stop", "S1best"), ("S0", "S0cap"), ("S3", "S3cap"), ("S0", "S4"),
               ("S4", "S5"))


def stage(name: str) -> Stage:
    if name not in STAGE_BY_NAME:
        raise ValueError(f"stage must be one of {list(STAGE_BY_NAME)}, got {name!r}")
    return STAGE_BY_NAME[name]
