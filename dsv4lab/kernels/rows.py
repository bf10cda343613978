"""What every kernel reads of a row before its work: the row's length (a decode row's topk_len, an
indexer request's seq_len and live pages), whether an index names a token of the cache, and the error
word's bits (dsv4lab.errors.Flag) for the values only the device sees. Shared by the decode kernels,
the indexer's kernels and the guards (kernels/guards.py)."""
from __future__ import annotations

import triton
import triton.language as tl

from ..errors import Flag

#: the error word's bits (dsv4lab.errors.Flag), as kernels read them
INDEX_FLAG = tl.constexpr(int(Flag.INDEX))
TOPK_LEN_FLAG = tl.constexpr(int(Flag.TOPK_LEN))
SINK_FLAG = tl.constexpr(int(Flag.SINK))
NONFINITE_FLAG = tl.constexpr(int(Flag.NONFINITE))
SEQ_LEN_FLAG = tl.constexpr(int(Flag.SEQ_LEN))
PAGE_FLAG = tl.constexpr(int(Flag.PAGE))
INDEXER_NONFINITE_FLAG = tl.constexpr(int(Flag.INDEXER_NONFINITE))


@triton.jit
def in_cache(tok, num_tokens):
    """tok is a token of the cache: 0 <= tok < num_tokens, in one unsigned compare (a negative
    index, the padding, wraps to >= 2^31). Entries that fail it are padding: never read."""
    return tok.to(tl.uint32) < num_tokens


@triton.jit
def track_tokens_init(BLOCK: tl.constexpr):
    """The start of :func:`track_tokens`' record: (largest index -1, smallest index as unsigned 2^32 - 1)."""
    top = tl.full([BLOCK], -1, dtype=tl.int32)
    return top, top.to(tl.uint32, bitcast=True)


@triton.jit
def track_tokens(top, low, tok):
    """A decode loop's record of the indices ``tok`` it loaded (-1 past its row), one max and one min
    an index: the largest (one past the cache is flagged after the loop) and the smallest as unsigned
    (padding wraps above every token, so ``min(low) < num_tokens`` says the loop read a token of the
    cache). A row whose softmax then weighed nothing although a token was read lost every score below
    the running max's finite starting value or to -inf (an extreme sm_scale or q): it is NaN, never
    "no token"."""
    return tl.maximum(top, tok), tl.minimum(low, tok.to(tl.uint32, bitcast=True))


@triton.jit
def row_length(TOPK_LEN, b, K, HAS_TOPK_LEN: tl.constexpr):
    """(entries of row b to read, error bits): topk_len[b] clamped to [0, K] (TOPK_LEN_FLAG if it lay
    outside), or K without a topk_len."""
    n = K
    flags = tl.full([], 0, tl.int32)
    if HAS_TOPK_LEN:
        raw = tl.load(TOPK_LEN + b)
        n = tl.minimum(tl.maximum(raw, 0), K)
        flags = tl.where(raw.to(tl.uint32) > K, TOPK_LEN_FLAG, 0)
    return n, flags


@triton.jit
def live_length(SEQ, PT, b, max_seq_len, num_pages, stride_pb, PAGE: tl.constexpr, BLOCK: tl.constexpr):
    """(row b's length the indexer may read, error bits): seq_lens[b] clamped to [0, max_seq_len]
    (SEQ_LEN_FLAG if it lay outside), then cut before its first live page whose id lies outside
    [0, num_pages) (PAGE_FLAG). Reads the row's live page-table entries only."""
    raw = tl.load(SEQ + b)
    flags = tl.where(raw.to(tl.uint32) > max_seq_len, SEQ_LEN_FLAG, 0)
    seq = tl.minimum(tl.maximum(raw, 0), max_seq_len)
    live = (seq + PAGE - 1) // PAGE
    first = live                                     # the first live page whose id is outside the cache
    c = tl.arange(0, BLOCK)
    row = PT + b * stride_pb
    for p0 in range(0, live, BLOCK):
        p = p0 + c
        page = tl.load(row + p, mask=p < live, other=0)
        bad = ~in_cache(page, num_pages) & (p < live)
        first = tl.minimum(first, tl.min(tl.where(bad, p, live), axis=0))
    flags |= tl.where(first < live, PAGE_FLAG, 0)
    return tl.minimum(seq, first * PAGE), flags


@triton.jit
def nonfinite_query(Q, W, b, stride_qb, stride_qh, stride_wb, H, HP: tl.constexpr, D: tl.constexpr):
    """INDEXER_NONFINITE_FLAG where request b's indexer q [H, D] or weights [H] hold a NaN or inf (no
    kernel may rank positions by them: relu on the GPU even drops a NaN score), else 0."""
    h = tl.arange(0, HP)
    d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h[:, None] * stride_qh + d[None, :], mask=h[:, None] < H, other=0.0)
    w = tl.load(W + b * stride_wb + h, mask=h < H, other=0.0)
    ok = tl.min(tl.min((tl.abs(q.to(tl.float32)) < float("inf")).to(tl.int32), axis=1), axis=0)
    ok = ok & tl.min((tl.abs(w.to(tl.float32)) < float("inf")).to(tl.int32), axis=0)
    return tl.where(ok == 1, 0, INDEXER_NONFINITE_FLAG)


def token_limit(cache) -> int:
    """num_tokens as the kernels compare it (indices are int32: anything past 2^31 - 1 is moot)."""
    return min(cache.num_tokens, 2**31 - 1)
