"""The lab's entry points: argument checks, then dispatch on ``impl``.

Every implementation of a stage registers itself here with :func:`register`;
the checks live once, in this file, so a kernel never sees a bad argument and
a user never gets a crash deep inside Triton. Checks that read device data
(index range, topk_len range, a finite sink) are skipped while a CUDA graph is being captured,
because they would need a host sync; shapes, dtypes and devices are always checked.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable

import torch

from . import reference
from .cache import HEAD_DIM, INDEX_DIM, IndexKCache, KVCache, scale_bytes

@dataclass(frozen=True)
class Impl:
    """One registered implementation of an op: what ``impl=`` names, and its properties."""
    op: str
    name: str
    fn: Callable
    stage: str = ""                  # the campaign stage it stands for (S0..S4); "" for references
    description: str = ""
    needs: tuple = ()                # what it needs beyond the lab: "sglang" (its wheel), "gpu"
    graph_safe: bool = True          # captures in a CUDA graph (no host sync, shapes-only launches)
    max_scale_byte: Callable | None = None   # (B, H, K) -> largest UE8M0 scale byte it reads right, or None


OPS = ("sparse_decode", "indexer_logits", "indexer_topk")
_IMPLS: dict[str, dict[str, Impl]] = {op: {} for op in OPS}


def register(op: str, name: str, **props):
    """Decorator: register ``fn`` as implementation ``name`` of ``op`` (props: the Impl fields).
    The function takes the op's checked arguments (see the reference registered for the op)."""
    if op not in _IMPLS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")

    def deco(fn):
        _IMPLS[op][name] = Impl(op, name, fn, **props)
        return fn
    return deco


def impls(op: str = "sparse_decode") -> list[str]:
    """Names accepted by ``impl=`` for ``op``."""
    _load_kernels()
    if op not in _IMPLS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return sorted(_IMPLS[op])


def impl_info(op: str, name: str) -> Impl:
    """The registered :class:`Impl` ``name`` of ``op``."""
    return _pick(op, name)


def _load_kernels():
    from . import kernels  # noqa: F401  (importing registers the implementations)


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _tensor(name, x, *, dim=None, dtypes=None, device=None, shape=None):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {list(x.shape)}")
    if shape is not None:
        for i, (got, want) in enumerate(zip(x.shape, shape)):
            if want is not None and got != want:
                want_s = ", ".join("*" if s is None else str(s) for s in shape)
                raise ValueError(f"{name} must have shape [{want_s}], got {list(x.shape)} (dim {i})")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device} (the cache's device), got {x.device}")


_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def check_sparse_decode_args(q, cache, indices, topk_len, sm_scale, attn_sink, check_ranges=True,
                             max_scale_byte=None, *, names=None, empty_batch_ok=False):
    """Raise a ValueError/TypeError naming the argument and what was expected. ``max_scale_byte``:
    the impl's ``(B, H, K) -> largest scale byte it reads correctly, or None`` (an impl attribute).
    ``names``: what the caller calls ``cache``, ``indices``, ``topk_len`` and ``sm_scale`` (for
    the messages); ``empty_batch_ok``: accept B = 0 (nothing to range-check)."""
    n = {"cache": "cache", "indices": "indices", "topk_len": "topk_len", "sm_scale": "sm_scale", **(names or {})}
    if not isinstance(cache, KVCache):
        raise TypeError(f"{n['cache']} must be a dsv4lab.cache.KVCache (from pack_kv), got {type(cache).__name__}")
    dev = cache.device
    _tensor("q", q, dim=3, dtypes=_FLOATS, device=dev)
    B, H, D = q.shape
    if D != HEAD_DIM:
        raise ValueError(f"q must have shape [B, H, {HEAD_DIM}], got {list(q.shape)}")
    if H < 1 or (B < 1 and not empty_batch_ok):
        raise ValueError(f"q must have B >= 1 and H >= 1, got {list(q.shape)}")
    _tensor(n["indices"], indices, dim=2, dtypes=(torch.int32,), device=dev, shape=(B, None))
    K = indices.shape[1]
    if K < 1:
        raise ValueError(f"{n['indices']} must have at least one column (K >= 1)")
    if topk_len is not None:
        _tensor(n["topk_len"], topk_len, dim=1, dtypes=(torch.int32,), device=dev, shape=(B,))
    if attn_sink is not None:
        _tensor("attn_sink", attn_sink, dim=1, dtypes=_FLOATS, device=dev, shape=(H,))
    if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and sm_scale > 0):
        raise ValueError(f"{n['sm_scale']} must be a positive float, got {sm_scale!r}")
    if check_ranges and B > 0 and not _capturing(q):
        if int(indices.max()) >= cache.num_tokens:
            raise ValueError(f"{n['indices']} must be < {n['cache']}.num_tokens ({cache.num_tokens}) or < 0 "
                             f"for padding; got max {int(indices.max())}")
        if topk_len is not None and (int(topk_len.min()) < 0 or int(topk_len.max()) > K):
            raise ValueError(f"{n['topk_len']} must lie in [0, K={K}], got range "
                             f"[{int(topk_len.min())}, {int(topk_len.max())}]")
        # the launch this shape gets may apply the UE8M0 scale as a bf16 factor (head_batched's
        # "bits" dequant: finite in bf16 only up to a byte): check the tokens this call reads
        limit = max_scale_byte(B, H, K) if max_scale_byte is not None else None
        if limit is not None:
            ids = indices[indices >= 0]
            if ids.numel():
                worst = int(scale_bytes(cache, ids).max())
                if worst > limit:
                    raise ValueError(f"{n['cache']} scale bytes of the indexed tokens must be <= {limit} "
                                     f"(scale <= 2^{limit - 127}) for this impl at this shape; got {worst}. "
                                     f"Use impl='simt' or 'mma_story' (their dequant has no limit)")
        if attn_sink is not None and not bool(torch.isfinite(attn_sink).all()):
            raise ValueError("attn_sink must be finite (no sink for a head: pass attn_sink=None); "
                             f"got {attn_sink.tolist()[:8]}")


def check_sink(attn_sink, q, check_ranges=True):
    """attn_sink: [H] float, finite (checked on the data unless capturing or check_ranges=False)."""
    H = q.shape[-2]
    _tensor("attn_sink", attn_sink, dim=1, dtypes=_FLOATS, device=q.device, shape=(H,))
    if check_ranges and not _capturing(q) and not bool(torch.isfinite(attn_sink).all()):
        raise ValueError("attn_sink must be finite (no sink for a head: pass attn_sink=None); "
                         f"got {attn_sink.tolist()[:8]}")


def _pick(op, impl) -> Impl:
    _load_kernels()
    table = _IMPLS[op]
    if impl not in table:
        raise ValueError(f"impl must be one of {sorted(table)}, got {impl!r}")
    return table[impl]


def sparse_decode(q, cache, indices, *, topk_len=None, sm_scale=None, attn_sink=None,
                  impl: str = "reference", check_ranges: bool = True):
    """Sparse MLA decode: (out bf16 [B,H,512], lse float32 [B,H]).

    ``impl`` names the implementation (see ``dsv4lab.impls()``); all share the
    semantics of :func:`dsv4lab.reference.sparse_decode`. ``check_ranges=False`` skips
    the checks that read the GPU (a host sync per call), as CUDA-graph capture does: index
    and topk_len ranges, a finite sink, and, for launches with the "bits" dequant, scale
    bytes <= 134 on the tokens read. For timing eager launches, or where the inputs come
    from kernels known to be in range. An out-of-range index is then not caught; a scale
    byte past the limit gives NaN outputs (never a wrong finite number).
    """
    entry = _pick("sparse_decode", impl)
    check_sparse_decode_args(q, cache, indices, topk_len, sm_scale, attn_sink, check_ranges, entry.max_scale_byte)
    if sm_scale is None:
        sm_scale = HEAD_DIM ** -0.5
    return entry.fn(q, cache, indices, topk_len=topk_len, sm_scale=float(sm_scale), attn_sink=attn_sink)


@register("sparse_decode", "reference", description="float64, the judge (dsv4lab.reference)")
def _sparse_decode_reference(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    out, lse = reference.sparse_decode(q, cache, indices, topk_len, sm_scale, attn_sink)
    return out.to(torch.bfloat16), lse


def check_indexer_args(q, index_cache, weights, seq_lens, page_table, max_seq_len):
    if not isinstance(index_cache, IndexKCache):
        raise TypeError(f"index_cache must be a dsv4lab.cache.IndexKCache (from pack_index_k), "
                        f"got {type(index_cache).__name__}")
    dev = index_cache.device
    _tensor("q", q, dim=3, dtypes=_FLOATS + (torch.float8_e4m3fn,), device=dev)
    B, Hi, D = q.shape
    if D != INDEX_DIM:
        raise ValueError(f"q must have shape [B, H_i, {INDEX_DIM}], got {list(q.shape)}")
    _tensor("weights", weights, dim=2, dtypes=_FLOATS, device=dev, shape=(B, Hi))
    _tensor("seq_lens", seq_lens, dim=1, dtypes=(torch.int32,), device=dev, shape=(B,))
    _tensor("page_table", page_table, dim=2, dtypes=(torch.int32,), device=dev, shape=(B, None))
    if not isinstance(max_seq_len, numbers.Integral) or isinstance(max_seq_len, bool) or max_seq_len < 1:
        raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
    ps = index_cache.page_size
    if page_table.shape[1] * ps < max_seq_len:
        raise ValueError(f"page_table must have at least ceil(max_seq_len/{ps}) = {-(-max_seq_len // ps)} "
                         f"columns, got {page_table.shape[1]}")
    if B > 0 and not _capturing(q):
        if int(seq_lens.min()) < 0 or int(seq_lens.max()) > max_seq_len:
            raise ValueError(f"seq_lens must lie in [0, max_seq_len={max_seq_len}], got range "
                             f"[{int(seq_lens.min())}, {int(seq_lens.max())}]")
        live_pages = (seq_lens.long() + ps - 1) // ps
        live = torch.arange(page_table.shape[1], device=dev)[None, :] < live_pages[:, None]
        bad = live & ((page_table < 0) | (page_table >= index_cache.num_pages))
        if bool(bad.any()):
            b, p = [int(v) for v in bad.nonzero()[0]]
            raise ValueError(f"page_table[{b}, {p}] = {int(page_table[b, p])} is a live page of request {b} "
                             f"and must lie in [0, {index_cache.num_pages})")


def indexer_logits(q, index_cache, weights, seq_lens, page_table, *, max_seq_len: int,
                   impl: str = "reference"):
    """Lightning-indexer logits float32 [B, max_seq_len] (-inf past each seq_len)."""
    fn = _pick("indexer_logits", impl).fn
    check_indexer_args(q, index_cache, weights, seq_lens, page_table, max_seq_len)
    return fn(q, index_cache, weights, seq_lens, page_table, max_seq_len=int(max_seq_len))


@register("indexer_logits", "reference", description="float64, the judge (dsv4lab.reference)")
def _indexer_logits_reference(q, index_cache, weights, seq_lens, page_table, *, max_seq_len):
    return reference.indexer_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len)


def indexer_topk(q, index_cache, weights, seq_lens, page_table, *, max_seq_len: int, topk: int = 512,
                 impl: str = "reference"):
    """Top-k token positions int32 [B, topk] of the indexer logits, -1 padded (a row has fewer
    than ``topk`` positions < seq_len). The positions are a set for the sparse decode; their order
    is the impl's: descending logit for the torch paths and the reference, ascending position for
    impl="triton" (whose ties at the k-th value go to the lower position: ``reference.topk_positions``
    is its exact contract)."""
    fn = _pick("indexer_topk", impl).fn
    check_indexer_args(q, index_cache, weights, seq_lens, page_table, max_seq_len)
    if not isinstance(topk, numbers.Integral) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"topk must be a positive int, got {topk!r}")
    return fn(q, index_cache, weights, seq_lens, page_table, max_seq_len=int(max_seq_len), topk=int(topk))


@register("indexer_topk", "reference", description="float64, the judge (dsv4lab.reference)")
def _indexer_topk_reference(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, topk):
    logits = reference.indexer_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len)
    return reference.topk_indices(logits, topk)
