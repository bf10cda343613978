"""Device-side guards for code that cannot check its own inputs: SGLang's decode kernel (its wheel's
code, run unchanged), the float64 reference, and the indexer's kernels.

One small launch per call, grid (B,), shapes only (so it captures in a CUDA graph), no host sync:
it writes safe copies of the values only the device can see and ORs what it found into the error
word (dsv4lab.errors), exactly as the lab's decode kernels treat the same values themselves:

* decode: an index >= num_tokens becomes -1 (padding), topk_len is clamped to [0, K], a
  non-finite sink is flagged (its rows then come out NaN, or 0 with lse +inf, as the math says);
* indexer: seq_lens is clamped to [0, max_seq_len], and a request whose live pages hold a page id
  outside [0, num_pages) is cut at the first such page (its positions from there on are -inf:
  never read, never chosen); ``whole_table``: a copy of the page table with every entry outside
  the cache replaced by page 0, for code that gathers the whole table (the torch fallbacks); a
  non-finite q or weight is flagged (INDEXER_NONFINITE).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import errors
from .common import (INDEX_FLAG, SINK_FLAG, in_cache, launch_kernel, live_length, next_power_of_2, nonfinite_query,
                     row_length)

BLOCK = 1024


@triton.jit
def _decode_guard_kernel(IDX, TOPK_LEN, SINK, IDX_OUT, TOPK_OUT, ERR, K, H, num_tokens, stride_ib,
                         HAS_TOPK_LEN: tl.constexpr, HAS_SINK: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    n, flags = row_length(TOPK_LEN, b, K, HAS_TOPK_LEN)
    if HAS_TOPK_LEN:
        tl.store(TOPK_OUT + b, n)
    c = tl.arange(0, BLOCK)
    for k0 in range(0, K, BLOCK):
        k = k0 + c
        tok = tl.load(IDX + b * stride_ib + k, mask=k < K, other=-1)
        ok = in_cache(tok, num_tokens)
        past = (~ok & (tok >= 0) & (k < n)).to(tl.int32)          # past the cache, inside the row's length
        flags |= tl.where(tl.max(past, axis=0) > 0, INDEX_FLAG, 0)
        tl.store(IDX_OUT + b * K + k, tl.where(ok, tok, -1), mask=k < K)
    if HAS_SINK:
        if b == 0:
            for h0 in range(0, H, BLOCK):
                s = tl.load(SINK + h0 + c, mask=h0 + c < H, other=0.0).to(tl.float32)
                flags |= tl.where(tl.min((tl.abs(s) < float("inf")).to(tl.int32), axis=0) == 1, 0, SINK_FLAG)
    tl.atomic_or(ERR, flags, mask=flags != 0)


def sanitize_decode(indices, topk_len, attn_sink, num_tokens: int):
    """(indices, topk_len) safe to hand to code that trusts them: indices [B, K] (rows of any stride;
    topk_len [B] and attn_sink [H] contiguous) ->
    a new contiguous int32 copy with entries >= num_tokens set to -1; topk_len clamped to [0, K]
    (None stays None). Flags INDEX / TOPK_LEN / SINK in the error word."""
    B, K = indices.shape
    if B == 0:
        return indices, topk_len
    out = torch.empty((B, K), dtype=torch.int32, device=indices.device)
    tlen = torch.empty_like(topk_len) if topk_len is not None else None
    H = attn_sink.shape[0] if attn_sink is not None else 0
    launch_kernel(_decode_guard_kernel, (B,), (
        indices, topk_len if topk_len is not None else out, attn_sink if attn_sink is not None else out,
        out, tlen if tlen is not None else out, errors.word(indices.device)), (K, H, min(num_tokens, 2**31 - 1),
        indices.stride(0)), _consts(HAS_TOPK_LEN=topk_len is not None, HAS_SINK=attn_sink is not None, BLOCK=BLOCK))
    return out, tlen


@triton.jit
def _indexer_guard_kernel(SEQ, PT, SEQ_OUT, PT_OUT, ERR, Q, W, max_seq_len, num_pages, P, stride_pb,
                          stride_qb, stride_qh, stride_wb, H, PAGE: tl.constexpr, BLOCK: tl.constexpr,
                          WHOLE_TABLE: tl.constexpr, HP: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    seq, flags = live_length(SEQ, PT, b, max_seq_len, num_pages, stride_pb, PAGE, BLOCK)
    flags |= nonfinite_query(Q, W, b, stride_qb, stride_qh, stride_wb, H, HP, D)
    tl.store(SEQ_OUT + b, seq)
    c = tl.arange(0, BLOCK)
    row = PT + b * stride_pb
    if WHOLE_TABLE:
        for p0 in range(0, P, BLOCK):
            p = p0 + c
            page = tl.load(row + p, mask=p < P, other=0)
            tl.store(PT_OUT + b * P + p, tl.where(in_cache(page, num_pages), page, 0), mask=p < P)
    tl.atomic_or(ERR, flags, mask=flags != 0)


def sanitize_indexer(seq_lens, page_table, max_seq_len: int, num_pages: int, page_size: int, *,
                     whole_table: bool, q, weights):
    """(seq_lens, page_table) safe for the indexer: seq_lens [B] int32 (contiguous) -> a new copy clamped to
    [0, max_seq_len] and cut before a request's first live page id outside [0, num_pages);
    ``whole_table``: also a copy of page_table [B, P] with every entry outside the cache set to 0
    (else page_table itself: entries below the new lengths all lie in the cache). Flags SEQ_LEN / PAGE,
    and INDEXER_NONFINITE for a non-finite ``q`` [B, H, 128] or ``weights`` [B, H] (unit last strides)."""
    B, P = page_table.shape
    if B == 0:
        return seq_lens, page_table
    seq = torch.empty_like(seq_lens)
    table = torch.empty((B, P), dtype=torch.int32, device=page_table.device) if whole_table else page_table
    H = q.shape[1]
    launch_kernel(_indexer_guard_kernel, (B,), (
        seq_lens, page_table, seq, table, errors.word(seq_lens.device), q, weights), (max_seq_len, num_pages, P,
        page_table.stride(0), q.stride(0), q.stride(1), weights.stride(0), H),
        _consts(PAGE=page_size, BLOCK=BLOCK, WHOLE_TABLE=whole_table, HP=next_power_of_2(H), D=q.shape[2]))
    return seq, table


@functools.lru_cache(maxsize=256)
def _cached_consts(items: tuple) -> dict:
    return dict(items)


def _consts(**kw) -> dict:
    """One dict object per set of constexprs, as launch_kernel wants."""
    return _cached_consts(tuple(kw.items()))
