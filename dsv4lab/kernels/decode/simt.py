"""S0's kernel, the SIMT baseline: one program per (batch, head), CUDA cores only.

Each program walks its row of top-k indices BLOCK_T tokens at a time, gathers
and dequantizes them from the paged fp8 cache, scores them against its one
query head with multiply + sum (no tl.dot), runs a base-2 online softmax and
accumulates p * V. The gathered KV is re-read by all H programs of a query:
64x the bytes the math needs. That redundancy is what S1 (head_batched.py) removes.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ...registry import register
from ..buffers import finish
from ..rows import INDEX_FLAG, NONFINITE_FLAG, SINK_FLAG, in_cache, row_length, track_tokens, track_tokens_init
from .kv_tiles import decode_call, gather_kv_tile

BLOCK_T = 16
NUM_WARPS = 4


@triton.jit
def _simt_decode_kernel(Q, KV_FP8, KV_U8, KV_BF16, IDX, TOPK_LEN, SINK, O, LSE, ERR,
                        qk_scale, K, H, num_tokens,
                        stride_qb, stride_qh, stride_ib, stride_ob, stride_oh,
                        PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr,
                        HAS_TOPK_LEN: tl.constexpr, HAS_SINK: tl.constexpr,
                        BLOCK_T: tl.constexpr, D: tl.constexpr, NOPE: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    col = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + col).to(tl.float32) * qk_scale  # log2 units
    n_valid, flags = row_length(TOPK_LEN, b, K, HAS_TOPK_LEN)
    m_i = -1e30
    l_i = 0.0
    acc = tl.zeros([D], dtype=tl.float32)
    t = tl.arange(0, BLOCK_T)
    top, low = track_tokens_init(BLOCK_T)            # largest index seen: > num_tokens - 1 is flagged
    for start in range(0, n_valid, BLOCK_T):        # stops at topk_len: no work past it
        pos = start + t
        tok = tl.load(IDX + b * stride_ib + pos, mask=pos < n_valid, other=-1)
        top, low = track_tokens(top, low, tok)
        valid = (pos < n_valid) & in_cache(tok, num_tokens)
        kv = gather_kv_tile(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D, tl.float32)
        s = tl.sum(q[None, :] * kv, axis=1)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * kv, axis=0)
        m_i = m_new
    # as head_batched._finish_rows: a NaN sum gives a NaN row, a sum of 0 after reading a token a NaN row
    empty = l_i == 0.0
    lost = empty & (tl.min(low, axis=0) < num_tokens)
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) / 1.4426950408889634)
    out = acc / l_safe
    flags |= tl.where(tl.max(top, axis=0) >= num_tokens, INDEX_FLAG, 0)
    if HAS_SINK:
        sink = tl.load(SINK + h).to(tl.float32)
        flags |= tl.where(tl.abs(sink) < float("inf"), 0, SINK_FLAG)
        new_lse = tl.maximum(lse, sink) + tl.log(1.0 + tl.exp(-tl.abs(lse - sink)))
        new_lse = tl.where(empty, sink, new_lse)
        out = out * tl.exp(lse - new_lse)
        lse = new_lse
    lse = tl.where(lost, float("nan"), lse)
    out = tl.where(lost, float("nan"), out)
    flags |= tl.where(tl.sum((tl.abs(out) < float("inf")).to(tl.int32), axis=0) == D, 0, NONFINITE_FLAG)
    tl.store(O + b * stride_ob + h * stride_oh + col, out.to(O.dtype.element_ty))
    tl.store(LSE + b * H + h, lse)
    tl.atomic_or(ERR, flags, mask=flags != 0)


@register("sparse_decode", "simt", stage="S0", tags=("recorded", "simt", "whole_row"),
          description="the lab's SIMT kernel: one program per (batch, head), CUDA cores")
def sparse_decode_simt(q, cache, indices, *, topk_len, sm_scale, attn_sink, block_t=BLOCK_T, kernel=None):
    """``kernel``: a jitted kernel with _simt_decode_kernel's signature to launch instead (notebook 01's
    own copy); ``block_t``: tokens a tile."""
    B, H, _ = q.shape
    args, constexprs, out, lse = decode_call(q, cache, indices, topk_len, attn_sink, sm_scale)
    (kernel or _simt_decode_kernel)[(B, H)](*args, **constexprs, BLOCK_T=block_t, num_warps=NUM_WARPS)
    return finish(out), lse
