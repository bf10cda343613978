"""Everything a layer does with its input projection's output before the query GEMM, in one launch
(S5). With the projections concatenated (q LoRA | kv | compressor | indexer weights | indexer
compressor: one GEMM of the normed residual), program (b, job) of this kernel does
    job 0: the q LoRA row's RMS norm -> bf16 (the query GEMMs' input)
    job 1: the new token's kv: RMS norm, rope, bf16, then SGLang's cache bytes (448 fp8 e4m3 values,
           one UE8M0 scale per 64, 64 bf16 rope values) stored at the window cache's byte offsets
    job 2: the compressor outputs into their state rings (float32) and the indexer's head weights
S4 runs these as ~45 torch kernels (step_glue.rms_norm / rope / kv_cache_bytes, index_put, casts)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...config import FP8_MAX, NOPE_DIM, NUM_SCALES, QUANT_TILE
from ..buffers import alloc
from ..launch import next_power_of_2
from .norm_rope import norm_rope_row
from .rounding import e4m3_bits, rne_bf16

RING_BLOCK = 512


@triton.jit
def _bf16_bytes(DST, OFF, x, mask):
    """Store the bf16 values x (exactly representable) as two little-endian bytes at DST[OFF[i]], DST[OFF[i]+1]."""
    bits = (x.to(tl.int32, bitcast=True) >> 16) & 0xFFFF
    tl.store(DST + OFF, (bits & 0xFF).to(tl.uint8), mask=mask)
    tl.store(DST + OFF + 1, ((bits >> 8) & 0xFF).to(tl.uint8), mask=mask)


@triton.jit
def _to_ring(P, col, width, DST, slot, stride_db, stride_ds, b, scale, BLOCK: tl.constexpr):
    """DST[b, slot, :width] = float(P[b, col:col + width]) * scale."""
    for c0 in range(0, width, BLOCK):
        c = c0 + tl.arange(0, BLOCK)
        v = tl.load(P + col + c, mask=c < width, other=0.0).to(tl.float32)
        tl.store(DST + b.to(tl.int64) * stride_db + slot * stride_ds + c, v * scale, mask=c < width)


@triton.jit
def _attn_input_kernel(P, QN_W, QL, KV_W, COS, SIN, CACHE, DATA_OFF, SCALE_OFF,
                       STATE, RING, IDX_STATE, IDX_RING, IDX_W, stride_pb, stride_qb,
                       stride_sb, stride_ss, stride_ib, stride_is, eps, idx_scale,
                       Q_LORA: tl.constexpr, Q_LORA_P: tl.constexpr, ROPE: tl.constexpr,
                       STATE_W: tl.constexpr, IDX_HEADS: tl.constexpr, IDX_STATE_W: tl.constexpr,
                       NOPE: tl.constexpr, TILE: tl.constexpr, TILES_P: tl.constexpr, NUM_TILES: tl.constexpr,
                       FP8: tl.constexpr, RING_BLOCK: tl.constexpr):
    b = tl.program_id(0)
    job = tl.program_id(1)
    row = P + b.to(tl.int64) * stride_pb
    if job == 0:
        norm_rope_row(row, QN_W, COS, SIN, QL + b.to(tl.int64) * stride_qb, b, eps, Q_LORA, Q_LORA_P, 0,
                      True, True, False)
    elif job == 1:
        kv = row + Q_LORA
        t = tl.arange(0, TILES_P)
        c = tl.arange(0, TILE)
        nope_at = t[:, None] * TILE + c[None, :]
        tm = t[:, None] < NUM_TILES
        xn = tl.load(kv + nope_at, mask=tm, other=0.0).to(tl.float32)
        p = tl.arange(0, ROPE // 2)
        xe = tl.load(kv + NOPE + 2 * p).to(tl.float32)
        xo = tl.load(kv + NOPE + 2 * p + 1).to(tl.float32)
        ss = tl.sum(tl.sum(xn * xn, axis=1), axis=0) + tl.sum(xe * xe, axis=0) + tl.sum(xo * xo, axis=0)
        inv = 1.0 / tl.sqrt(ss / (NOPE + ROPE) + eps)
        # S4's order: the norm rounded to bf16, rope on that, rounded again; then the cache bytes
        xn = rne_bf16(xn * inv * tl.load(KV_W + nope_at, mask=tm, other=0.0).to(tl.float32))
        xe = rne_bf16(xe * inv * tl.load(KV_W + NOPE + 2 * p).to(tl.float32))
        xo = rne_bf16(xo * inv * tl.load(KV_W + NOPE + 2 * p + 1).to(tl.float32))
        cs = tl.load(COS + b * (ROPE // 2) + p)
        sn = tl.load(SIN + b * (ROPE // 2) + p)
        re = rne_bf16(xe * cs - xo * sn)
        ro = rne_bf16(xe * sn + xo * cs)
        # UE8M0 scale per tile: e = ceil(log2(amax / FP8)), exact from the ratio's bits
        ratio = tl.maximum(tl.max(tl.abs(xn), axis=1), 1e-8) / FP8
        rb = ratio.to(tl.int32, bitcast=True)
        e = ((rb >> 23) & 0xFF) - 127 + ((rb & 0x7FFFFF) != 0).to(tl.int32)
        inv_scale = ((127 - e) << 23).to(tl.float32, bitcast=True)                # 2^-e
        q = tl.minimum(tl.maximum(xn * inv_scale[:, None], -FP8), FP8)
        doff = DATA_OFF + b.to(tl.int64) * (NOPE + 2 * ROPE)
        tl.store(CACHE + tl.load(doff + nope_at, mask=tm, other=0), e4m3_bits(q), mask=tm)
        tl.store(CACHE + tl.load(SCALE_OFF + b.to(tl.int64) * NUM_TILES + t, mask=t < NUM_TILES, other=0),
                 (e + 127).to(tl.uint8), mask=t < NUM_TILES)
        _bf16_bytes(CACHE, tl.load(doff + NOPE + 4 * p), re, p >= 0)
        _bf16_bytes(CACHE, tl.load(doff + NOPE + 4 * p + 2), ro, p >= 0)
    else:
        col = Q_LORA + NOPE + ROPE
        if STATE_W > 0:
            _to_ring(row, col, STATE_W, STATE, tl.load(RING + b), stride_sb, stride_ss, b, 1.0, RING_BLOCK)
        if IDX_HEADS > 0:
            h = tl.arange(0, IDX_HEADS)
            w = tl.load(row + col + STATE_W + h).to(tl.float32)
            tl.store(IDX_W + b * IDX_HEADS + h, w * idx_scale)
            _to_ring(row, col + STATE_W + IDX_HEADS, IDX_STATE_W, IDX_STATE, tl.load(IDX_RING + b),
                     stride_ib, stride_is, b, 1.0, RING_BLOCK)


def attn_input(p, q_norm, kv_norm, cos, sin, cache, data_off, scale_off, *, q_lora: int, eps: float,
               state=None, ring=None, index_state=None, index_ring=None, index_heads: int = 0,
               index_scale: float = 1.0):
    """p bf16 [B, q_lora + 512 + state width + index_heads + index state width] (the concatenated
    projection) -> (q LoRA normed bf16 [B, q_lora], the indexer's head weights float32 [B, index_heads]
    or None); the new token's kv stored into the window cache (uint8 buffer ``cache`` at byte offsets
    data_off [B, 576] / scale_off [B, 7]), the compressor columns into state[b, ring[b]] and
    index_state[b, index_ring[b]]."""
    B = p.shape[0]
    rope = 2 * cos.shape[1]
    state_w = 0 if state is None else state.shape[2]
    idx_state_w = 0 if index_state is None else index_state.shape[2]
    width = q_lora + NOPE_DIM + rope + state_w + index_heads + idx_state_w
    if p.dim() != 2 or p.shape[1] != width or p.stride(1) != 1 or p.dtype != torch.bfloat16:
        raise ValueError(f"p must be bf16 [B, {width}] with contiguous rows, got {p.dtype} {list(p.shape)}")
    if data_off.shape != (B, NOPE_DIM + 2 * rope) or scale_off.shape != (B, NUM_SCALES) \
            or not data_off.is_contiguous() or not scale_off.is_contiguous():
        raise ValueError(f"data_off / scale_off must be contiguous [B, {NOPE_DIM + 2 * rope}] / [B, {NUM_SCALES}]")
    ql = alloc((B, q_lora), torch.bfloat16, p.device)
    idx_w = alloc((B, index_heads), torch.float32, p.device) if index_heads else None
    jobs = 3 if state_w or index_heads else 2
    st = state if state is not None else p
    ist = index_state if index_state is not None else p
    _attn_input_kernel[(B, jobs)](
        p, q_norm, ql, kv_norm, cos, sin, cache, data_off, scale_off, st, ring if ring is not None else data_off,
        ist, index_ring if index_ring is not None else data_off, idx_w if idx_w is not None else p,
        p.stride(0), ql.stride(0), st.stride(0), st.stride(1) if state is not None else 0,
        ist.stride(0), ist.stride(1) if index_state is not None else 0, eps, index_scale,
        Q_LORA=q_lora, Q_LORA_P=next_power_of_2(q_lora), ROPE=rope, STATE_W=state_w, IDX_HEADS=index_heads,
        IDX_STATE_W=idx_state_w, NOPE=NOPE_DIM, TILE=QUANT_TILE, TILES_P=next_power_of_2(NUM_SCALES),
        NUM_TILES=NUM_SCALES, FP8=FP8_MAX, RING_BLOCK=RING_BLOCK, num_warps=4)
    return ql, idx_w
