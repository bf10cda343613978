"""The lab's entry points: arguments -> contracts -> registry -> kernel -> error word.

Each op checks its arguments once (dsv4lab.contracts: ``checks="device"`` or ``"sync"``), picks the
implementation ``impl=`` names from the registry (dsv4lab.registry) and calls it inside its op's
guard; values only the device can see are flagged in the device's error word (dsv4lab.errors), which
:func:`dsv4lab.check_errors` reads. Every impl of an op keeps one non-finite contract: what it
cannot compute it flags and gives as NaN (a decode row's out and lse), never a plausible answer
(kernels.guards.peer_rows keeps it for code the lab does not own). Concurrent callers:
dsv4lab.concurrency.
"""
from __future__ import annotations

import torch

from . import concurrency
from .contracts import (check_indexer_args, check_sparse_decode_args, checks_mode, refuse_check_ranges,
                        topk_arg)
from .registry import impl_info


def sparse_decode(q, cache, indices, *, topk_len=None, sm_scale=None, attn_sink=None,
                  impl: str = "reference", checks: str | None = None, check_ranges: bool | None = None):
    """Sparse MLA decode: (out bf16 [B,H,512], lse float32 [B,H]).

    ``impl`` names the implementation (see ``dsv4lab.impls()``); all share the semantics of
    :func:`dsv4lab.reference.sparse_decode`. q [B, H, 512] float, cache a KVCache, indices [B, K]
    int32 token ids (< 0: padding), topk_len [B] int32 (each row reads its first topk_len entries),
    attn_sink [H] float, sm_scale a finite positive number (default 1/sqrt(512)); any strides. B = 0
    gives empty outputs; K = 0 (or a row with no valid entry) gives out 0 and lse -inf (the sink
    with a sink).

    ``checks="device"`` (default; no host sync, graph-safe): an index >= cache.num_tokens is read as
    padding, a topk_len outside [0, K] is clamped, and each is flagged in the device's error word, as
    are a non-finite sink and a non-finite output (``dsv4lab.check_errors()`` raises naming them). A
    row no impl can compute (a non-finite q or cache value, or an extreme but finite sm_scale or q
    whose scores all overflow or underflow float32) is NaN in out and in lse, flagged, never out 0
    with lse -inf ("no token"): every impl either answers a row as the float64 reference does or
    gives it NaN.
    Scale bytes above 134, which the packers never write, are not looked at: launches with the
    "bits" dequant give NaN in the rows that read them (flagged), the others the value 2^(byte-127).
    ``checks="sync"`` also checks the data before launching and names the first offending value:
    q finite, topk_len in [0, K], indices < cache.num_tokens, a finite sink, scale bytes <= 134 and
    no fp8 NaN byte or non-finite rope value in the tokens read. ``check_ranges=``, its older spelling,
    is refused.
    """
    refuse_check_ranges(check_ranges)
    entry = impl_info("sparse_decode", impl)
    scale = check_sparse_decode_args(q, cache, indices, topk_len, sm_scale, attn_sink, checks_mode(checks),
                                     entry.max_scale_byte)
    return entry.fn(q, cache, indices, topk_len=topk_len, sm_scale=scale, attn_sink=attn_sink)


def indexer_logits(q, index_cache, weights, seq_lens, page_table, *, max_seq_len: int,
                   impl: str = "reference", checks: str | None = None, check_ranges: bool | None = None):
    """Lightning-indexer logits float32 [B, max_seq_len] (-inf past each seq_len).

    q [B, H_i, 128] (bf16/fp16/fp32/fp8), weights [B, H_i] float, seq_lens [B] int32, page_table
    [B, >= ceil(max_seq_len / 64)] int32 (entries past a request's live pages are never read and
    may hold anything), max_seq_len a positive int (numpy/torch integers too); any strides; B = 0
    gives [0, max_seq_len]. ``checks="device"`` (default, no host sync): a seq_len outside
    [0, max_seq_len] is clamped, a request whose live pages hold an id outside [0, num_pages) is cut
    at that page (its positions from there on are -inf), each flagged for ``dsv4lab.check_errors()``,
    as are non-finite q or weights (the logits are what the arithmetic gives: NaN or inf). ``checks="sync"``
    refuses all of these before launching, naming the value (and live pages holding bytes the packer
    never writes). ``check_ranges=``, the decode's older spelling of ``checks=``, is refused here too.
    """
    refuse_check_ranges(check_ranges)
    entry = impl_info("indexer_logits", impl)
    L = check_indexer_args(q, index_cache, weights, seq_lens, page_table, max_seq_len, checks_mode(checks))
    return entry.fn(q, index_cache, weights, seq_lens, page_table, max_seq_len=L)


def indexer_topk(q, index_cache, weights, seq_lens, page_table, *, max_seq_len: int, topk: int = 512,
                 impl: str = "reference", checks: str | None = None, check_ranges: bool | None = None):
    """Top-k token positions int32 [B, topk] of the indexer logits, -1 padded (a row has fewer
    than ``topk`` positions < seq_len); arguments and ``checks`` as :func:`indexer_logits`, topk a
    positive int of at most max(max_seq_len, 2048). A live logit that came out NaN or inf (non-finite
    q or weights, an overflow) is flagged by every impl: NaN and +inf rank first, -inf is never chosen,
    so that row's positions are not an answer. The positions are a set for the sparse decode; their
    order is the impl's: descending logit for the torch paths and the reference, ascending position for the
    Triton indexer (whose ties at the k-th value go to the lower position: ``reference.topk_positions`` is
    its exact contract). An impl with ``Impl.prepare`` (the Triton indexer) keeps what a call's checks and
    launch planning decided under its argument signature (shapes, strides, dtypes, devices, the
    cache object, max_seq_len, topk): an eager loop's later calls of that signature go straight to
    the launches."""
    refuse_check_ranges(check_ranges)
    known = _known("indexer_topk", impl)
    key = (_signature(impl, checks, q, index_cache, weights, seq_lens, page_table, max_seq_len, topk)
           if known is not None and known.prepare is not None else None)
    calls = concurrency.prepared_calls()
    prepared = calls.get(key) if key is not None else None
    if prepared is not None:
        out = prepared(q, index_cache, weights, seq_lens, page_table)
        if out is not None:
            return out
    entry = impl_info("indexer_topk", impl)
    L = check_indexer_args(q, index_cache, weights, seq_lens, page_table, max_seq_len, checks_mode(checks))
    k = topk_arg(topk, L)
    out = entry.fn(q, index_cache, weights, seq_lens, page_table, max_seq_len=L, topk=k)
    if key is not None and prepared is None:
        prepared = entry.prepare(q, index_cache, weights, seq_lens, page_table, L, k)
        if prepared is not None:
            if len(calls) >= 256:
                calls.clear()
            calls[key] = prepared
    return out


def prepared_calls() -> dict:
    """indexer_topk's prepared calls (Impl.prepare) of this caller (this thread; keyed by argument
    signature and CUDA stream, dsv4lab.concurrency): an eager call that repeats a signature whose checks
    passed goes straight to its launches (experiments/eager_host_path), on workspaces of its own."""
    return concurrency.prepared_calls()


def _signature(impl, checks, q, index_cache, weights, seq_lens, page_table, max_seq_len, topk):
    """What indexer_topk's checks and planning depend on, and the caller's stream, as a key, or None
    where a call is not to be prepared: checks other than the default "device", scalars that are not
    plain ints (a numpy or torch integer, a bool), tensors of a subclass, a CUDA-graph capture (whose
    workspaces are its own). The cache is keyed by its id (the prepared call also holds a weak
    reference and compares the object)."""
    T = torch.Tensor
    if (checks not in (None, "device") or type(max_seq_len) is not int or type(topk) is not int
            or type(q) is not T or type(weights) is not T or type(seq_lens) is not T or type(page_table) is not T):
        return None
    stream = concurrency.stream_key(q.device)
    if stream is concurrency.CAPTURING:
        return None
    return (impl, max_seq_len, topk, id(index_cache), q.shape, q.dtype, q.device, q.stride(), weights.shape,
            weights.dtype, weights.device, weights.stride(), seq_lens.shape, seq_lens.dtype, seq_lens.device,
            seq_lens.stride(), page_table.shape, page_table.dtype, page_table.device, page_table.stride(), stream)


def _known(op, impl):
    """The registered impl ``impl`` of ``op``, or None (no error: the full path raises it)."""
    try:
        return impl_info(op, impl)
    except ValueError:
        return None
