"""Stage 1, the SIMT baseline: one program per (batch, head), CUDA cores only.

Each program walks its row of top-k indices BLOCK_T tokens at a time, gathers
and dequantizes them from the paged fp8 cache, scores them against its one
query head with multiply + sum (no tl.dot), runs a base-2 online softmax and
accumulates p * V. The gathered KV is re-read by all H programs of a query:
64x the bytes the math needs. That redundancy is what stage 2 removes.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..api import register
from .common import LOG2E, alloc, cache_views, finish, gather_kv_tile, out_dtype

BLOCK_T = 16
NUM_WARPS = 4


@triton.jit
def _simt_decode_kernel(Q, KV_FP8, KV_U8, KV_BF16, IDX, TOPK_LEN, SINK, O, LSE,
                        qk_scale, K, H,
                        stride_qb, stride_qh, stride_ib, stride_ob, stride_oh,
                        PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr,
                         HAS_TOPK_LEN: tl.constexpr, HAS_SINK: tl.constexpr,
                        BLOCK_T: tl.constexpr, D: tl.constexpr, NOPE: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    col = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h * stride_qh + col).to(tl.float32) * qk_scale  # log2 units
    n_valid = K
    if HAS_TOPK_LEN:
        n_valid = tl.minimum(tl.load(TOPK_LEN + b), K)
    m_i = -1e30
    l_i = 0.0
    acc = tl.zeros([D], dtype=tl.float32)
    t = tl.arange(0, BLOCK_T)
    for start in range(0, n_valid, BLOCK_T):        # stops at topk_len: no work past it
        pos = start + t
        tok = tl.load(IDX + b * stride_ib + pos, mask=pos < n_valid, other=-1)
        valid = (pos < n_valid) & (tok >= 0)
        kv = gather_kv_tile(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D, tl.float32)
        s = tl.sum(q[None, :] * kv, axis=1)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * kv, axis=0)
        m_i = m_new
    has = l_i > 0.0
    lse = tl.where(has, (m_i + tl.math.log2(tl.where(has, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
    out = acc / tl.where(has, l_i, 1.0)
    if HAS_SINK:
        sink = tl.load(SINK + h).to(tl.float32)
        new_lse = tl.maximum(lse, sink) + tl.log(1.0 + tl.exp(-tl.abs(lse - sink)))
        new_lse = tl.where(has, new_lse, sink)
        out = out * tl.exp(lse - new_lse)
        lse = new_lse
    tl.store(O + b * stride_ob + h * stride_oh + col, out.to(O.dtype.element_ty))
    tl.store(LSE + b * H + h, lse)


@register("sparse_decode", "simt", stage="S0",
          description="the lab's SIMT kernel: one program per (batch, head), CUDA cores")
def sparse_decode_simt(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    B, H, D = q.shape
    q = q.contiguous()
    indices = indices.contiguous()
    out = alloc((B, H, D), out_dtype(), q.device)
    lse = alloc((B, H), torch.float32, q.device)
    fp8, u8, bf16 = cache_views(cache)
    dummy = lse
    _simt_decode_kernel[(B, H)](
        q, fp8, u8, bf16, indices,
        topk_len if topk_len is not None else dummy,
        attn_sink if attn_sink is not None else dummy,
        out, lse, sm_scale * LOG2E, indices.shape[1], H,
        q.stride(0), q.stride(1), indices.stride(0), out.stride(0), out.stride(1),
        PAGE_SIZE=cache.page_size, PAGE_BYTES=cache.page_bytes,
        HAS_TOPK_LEN=topk_len is not None, HAS_SINK=attn_sink is not None,
        BLOCK_T=BLOCK_T, D=D, NOPE=448, num_warps=NUM_WARPS)
    return finish(out), lse
