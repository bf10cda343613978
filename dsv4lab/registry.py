"""The impl registry: the one home of what the lab knows about an implementation of an op.

An implementation ("impl") is a function registered for an op with :func:`register`, in the module
that defines it; ``impl=`` of the op names it. Everything the lab's tools need to know about an impl
is a field or a tag of its :class:`Impl`: the campaign stage it stands for (the replay's stage
names), its launch description, the heads that share one read of the cache, whether it captures in
a CUDA graph, whether it runs in this process, whether the recorded run times it. The bench, the
recorded checks, ``record``, the measured tables (docs/measured.md), the CLI, the widgets and the tests ask
:func:`registered` / :func:`impls` (by tag) and :func:`impl_info`; none of them switches on a name.

Registration wraps the function in its op's guard (kernels/guards.py: empty batches, strided views,
and for the indexer the device-side range guard), so code that calls ``Impl.fn`` directly gets what
``impl=`` gets. Adding a kernel is one new module that registers it and one import line in
kernels/decode/__init__.py (or kernels/indexer/__init__.py); docs/ARCHITECTURE.md says more.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .kernels import guards

OPS = ("sparse_decode", "indexer_logits", "indexer_topk")

#: the tags an impl may carry, and who asks for them
TAGS = {
    "recorded": "timed and checked by the recorded GPU run (python -m dsv4lab record); bench's default set",
    "baseline": "the campaign's starting kernel: the recorded speedups are over it",
    "tensor_core": "multiplies on tensor cores in bf16: the checks also hold it to the story's bound against SIMT; "
                   "the bridge sets its math against the bf16 ceiling (else CUDA-core FP32)",
    "simt": "the lab's SIMT decode: what the tensor-core kernels are checked against (the story's bound)",
    "exact": "indexer: q . k exact in fp32, judged by the tight logits bound (testing.INDEXER_TOL)",
    "dispatcher": "runs another impl per shape (Impl.dispatch): the SGLang integration's decode",
    "peer": "SGLang's own code, run from its wheel (tagged by register where needs names the wheel): run as "
            "SGLang runs it (merged_decode calls SGLang's whole two-cache function for it)",
    "beyond_story": "the lab's kernel past the story's campaign (no stage): the story-vs-lab table's "
                    "'beyond the story' figures",
    "whole_row": "decode: one program a (request, head block) walks the whole top-k row, no split; notebook 01 "
                 "compares these launches by heads per program",
}


@dataclass(frozen=True)
class Impl:
    """One registered implementation of an op: what ``impl=`` names, and what the lab knows about it."""
    op: str
    name: str
    fn: Callable                     # the implementation inside its op's guard (see register)
    stage: str = ""                  # the replay's stage it stands for ("S0", "S1best", ...); "" for none
    description: str = ""
    tags: frozenset = frozenset()    # see TAGS
    needs: tuple = ()                # what it needs beyond the lab: "sglang" (its wheel), "gpu", "sm_90"
    available: Callable | None = None    # () -> why it cannot run in this process, or None (None: always runs)
    graph_safe: bool = True          # captures in a CUDA graph (no host sync, shapes-only launches)
    launch: Callable | None = None   # (B, H, K) -> the kernels.decode.plan.Launch it takes for the shape
    heads: Callable | None = None    # (B, H, K) -> heads sharing one gather of a KV tile (default: the
                                     # launch's BLOCK_H; 1 without a launch)
    dispatch: Callable | None = None     # (B, H, K) -> the name of the impl it runs for the shape
    max_scale_byte: Callable | None = None   # (B, H, K) -> largest UE8M0 scale byte it reads right, or None
    reads_dead_pages: bool = False   # indexer: gathers every page-table entry, not only the live ones
    guards_inputs: bool = False      # indexer: clamps seq_lens, cuts at a bad live page id and flags both itself
    prepare: Callable | None = None  # indexer_topk: (checked args, max_seq_len, topk) -> a callable for
                                     # later calls of the same signature, or None (api.prepared_calls)

    def runs(self, B: int, H: int, K: int) -> "Impl":
        """The impl that runs for the shape: a dispatcher's pick, else this one."""
        return impl_info(self.op, self.dispatch(B, H, K)) if self.dispatch else self

    def heads_per_read(self, B: int, H: int, K: int) -> int:
        """How many heads share one gather of a KV tile at this shape (1 for the SIMT grids)."""
        ran = self.runs(B, H, K)
        if ran.heads is not None:
            return ran.heads(B, H, K)
        return min(H, ran.launch(B, H, K).tiles.block_h) if ran.launch is not None else 1

    def unavailable(self) -> str | None:
        """Why this process cannot run the impl (a missing wheel, another GPU), or None."""
        return self.available() if self.available is not None else None


_IMPLS: dict[str, dict[str, Impl]] = {op: {} for op in OPS}


def register(op: str, name: str, *, tags=(), **props):
    """Decorator: register ``fn`` as implementation ``name`` of ``op`` (``tags``: see TAGS; props: the
    other Impl fields). The function takes the op's checked arguments (see the float64 reference
    registered for the op, kernels/decode/reference.py and kernels/indexer/reference.py); the registry
    holds it inside the op's guard (``Impl.fn``), which handles an empty batch (and, for the decode,
    K = 0) without calling it, and hands it tensors it may index as contiguous."""
    if op not in _IMPLS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    unknown = set(tags) - set(TAGS)
    if unknown:
        raise ValueError(f"tags must be among {sorted(TAGS)}, got {sorted(unknown)}")

    def deco(fn):
        if op == "sparse_decode":
            guarded = guards.decode_entry(fn)
        else:
            guarded = guards.indexer_entry(fn, op=op, dead_pages=props.get("reads_dead_pages", False),
                                           guarded=props.get("guards_inputs", False))
        tagged = (set(tags) | ({"dispatcher"} if props.get("dispatch") else set())
                  | ({"peer"} if "sglang" in props.get("needs", ()) else set()))
        _IMPLS[op][name] = Impl(op, name, guarded, tags=frozenset(tagged), **props)
        return fn
    return deco


def registered(op: str = "sparse_decode", tag: str | None = None) -> list[Impl]:
    """The impls of ``op`` (with ``tag``) in the order they registered: the campaign's order, as
    kernels/decode/__init__.py and kernels/indexer/__init__.py import them."""
    if op not in _IMPLS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if tag is not None and tag not in TAGS:
        raise ValueError(f"tag must be one of {sorted(TAGS)}, got {tag!r}")
    return [i for i in _IMPLS[op].values() if tag is None or tag in i.tags]


def impls(op: str = "sparse_decode", tag: str | None = None) -> list[str]:
    """Names accepted by ``impl=`` for ``op`` (those with ``tag``), sorted."""
    return sorted(i.name for i in registered(op, tag))


def impl_info(op: str, name) -> Impl:
    """The registered :class:`Impl` ``name`` of ``op``; a ValueError listing the names otherwise."""
    table = _IMPLS.get(op)
    if table is None:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"impl must be one of {sorted(table)}, got {name!r}")
    return table[name]
