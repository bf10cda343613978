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

Around every registered impl (dsv4lab.registry wraps each in its op's guard): :func:`decode_entry` and
:func:`indexer_entry` answer empty batches without a launch and hand the impl tensors it may index as
contiguous; :func:`peer_rows` and :func:`flag_nonfinite_logits` keep the ops' non-finite contracts for
code that does not keep them itself.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .. import errors
from .launch import launch_kernel, next_power_of_2
from .rows import INDEX_FLAG, SINK_FLAG, in_cache, live_length, nonfinite_query, row_length

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


def rows(x: torch.Tensor) -> torch.Tensor:
    """x with unit stride along its last dim (rows may keep any stride): what the kernels index."""
    return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def no_tokens(q, topk_len, attn_sink):
    """(out, lse) of rows that read nothing (B = 0 or K = 0): out 0, lse -inf, or the sink; a topk_len
    other than 0 or a non-finite sink flagged, as the kernels do."""
    B, H, D = q.shape
    out = torch.zeros(B, H, D, dtype=torch.bfloat16, device=q.device)
    if B and topk_len is not None:
        errors.set_flag(q.device, errors.Flag.TOPK_LEN, (topk_len != 0).any())
    if attn_sink is None:
        return out, torch.full((B, H), -math.inf, dtype=torch.float32, device=q.device)
    if B:
        errors.set_flag(q.device, errors.Flag.SINK, ~torch.isfinite(attn_sink).all())
    return out, attn_sink.float()[None, :].expand(B, H).contiguous()


def decode_entry(fn):
    """The sparse-decode guard around an implementation: B = 0 or K = 0 answered without it, and
    q, topk_len, attn_sink contiguous, indices with unit column stride."""
    @functools.wraps(fn)
    def run(q, cache, indices, *, topk_len, sm_scale, attn_sink, **kw):
        if q.shape[0] == 0 or indices.shape[1] == 0:
            return no_tokens(q, topk_len, attn_sink)
        return fn(q.contiguous(), cache, rows(indices), topk_len=None if topk_len is None else topk_len.contiguous(),
                  sm_scale=sm_scale, attn_sink=None if attn_sink is None else attn_sink.contiguous(), **kw)
    return run


def indexer_entry(fn, *, op, dead_pages, guarded=False):
    """The indexer guard around an implementation: B = 0 answered without it, q / weights / seq_lens
    contiguous, and the device-side guard (:func:`sanitize_indexer`) in front: seq_lens clamped, each
    request cut before a live page id outside the cache, and for code that gathers the whole table
    (``dead_pages``) a copy with every entry in the cache. An impl that does all of that itself
    (``guarded``: Impl.guards_inputs) runs without the guard's launch."""
    @functools.wraps(fn)
    def run(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, **kw):
        B = q.shape[0]
        if B == 0:
            if op == "indexer_topk":
                return torch.empty(0, kw["topk"], dtype=torch.int32, device=q.device)
            return torch.empty(0, max_seq_len, dtype=torch.float32, device=q.device)
        if guarded:
            return fn(q.contiguous(), index_cache, weights.contiguous(), seq_lens.contiguous(), rows(page_table),
                      max_seq_len=max_seq_len, **kw)
        q, weights = q.contiguous(), weights.contiguous()
        seq, table = sanitize_indexer(seq_lens.contiguous(), rows(page_table), max_seq_len, index_cache.num_pages,
                                      index_cache.page_size, whole_table=dead_pages, q=q, weights=weights)
        return fn(q, index_cache, weights, seq, table, max_seq_len=max_seq_len, **kw)
    return run


def peer_rows(out, lse, indices, topk_len, *, empty_at: float = -math.inf):
    """The decode's non-finite contract for code that does not keep it itself (SGLang's kernel, the float64
    reference), on its (out [B, (1,) H, 512], lse [B, (1,) H]) before the sink: a row it could not compute
    is NaN in out and lse, flagged NONFINITE, never a plausible answer. Such a row has a non-finite output,
    a NaN or +inf lse, or (although it read a token: ``indices`` [B, K] and ``topk_len`` as sanitized) an
    lse of "no token": at or below ``empty_at``, as float32 (every score lost below the code's finite
    starting value or to -inf, an extreme sm_scale or q; or a float64 lse past float32's range)."""
    read = indices >= 0
    if topk_len is not None:
        read &= torch.arange(indices.shape[1], device=indices.device)[None, :] < topk_len[:, None]
    has = read.any(1).view(-1, *(1,) * (lse.dim() - 1))
    lse32 = lse.float()
    bad = ~torch.isfinite(out).all(-1) | torch.isnan(lse32) | (lse32 == math.inf) | (has & (lse32 <= empty_at))
    errors.set_flag(out.device, errors.Flag.NONFINITE, bad.any())
    return out.masked_fill(bad[..., None], math.nan), lse.masked_fill(bad, math.nan)


def flag_nonfinite_logits(logits, seq_lens):
    """The top-k's non-finite contract for impls that rank logits made in torch: INDEXER_NONFINITE where a
    live logit (position < seq_lens[b], the guard's sanitized lengths) is NaN or inf, which a top-k would
    rank first (NaN, +inf) or never choose (-inf). One pass over the logits, no host sync."""
    live = torch.arange(logits.shape[1], device=logits.device)[None, :] < seq_lens[:, None]
    errors.set_flag(logits.device, errors.Flag.INDEXER_NONFINITE, (live & ~torch.isfinite(logits)).any())
