"""The MoE stand-in's routed experts in three launches (S5): the up GEMM with the dispatch gather and
SiLU-and-multiply in its epilogue, the down GEMM with each row's router weight in its epilogue, and
one combine that sums each token's rows (deterministic: no atomics) with the shared expert's output.
S4 runs the gather, two grouped GEMMs, silu_mul's three kernels, the weight gather and products, a
zero fill and index_add_ (atomics), and the shared expert's add and cast."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..buffers import alloc
from ..launch import cdiv, dot_dtype, next_power_of_2
from .rounding import rne_bf16

UP_BLOCK_N, UP_BLOCK_K, DOWN_BLOCK_N, BLOCK_K, COMBINE_BLOCK_D = 32, 128, 64, 64, 256
#: the most programs one up GEMM's K is split over
MAX_UP_SPLIT = 8


def moe_launch(E: int, I: int, D: int, sms: int) -> tuple[int, int, int]:
    """(moe_up's block_n, its split, moe_down's block_n) for E experts' weights [K, 2I] and [I, D] on
    ``sms`` SMs: few experts' weights spread over about one program an SM (the up GEMM 64 wide and K split
    while E x I / 64 x 2 fits the SMs), many experts' read in wide tiles (128 once the programs fill the
    chip twice). From an H100 sweep over C = 1 to 64 (E = 1 to 25; experiments/s5_fused_glue): within
    0.22 us of the best shape at every C, 22.8 -> 12.9 us for the up GEMM at C = 1 and 118.5 -> 95.3 us
    at C = 64 against the fixed 32-wide tile."""
    up_n = 128 if 2 * E * cdiv(I, 128) >= sms else 64
    split = 1
    while 2 * split <= MAX_UP_SPLIT and 2 * split * E * cdiv(I, up_n) <= sms:
        split *= 2
    return up_n, split, 128 if E * cdiv(D, 128) >= 2 * sms else 64


@triton.jit
def _moe_up_kernel(X, TOK, W13, HMID, PART, M, K, I, K_PER, stride_xb, stride_te, stride_tm, stride_we, stride_wk,
                   stride_he, stride_hm,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                   DOT: tl.constexpr):
    """HMID[e, m, n] = silu(x[tok] @ W13[e][:, n]) * (x[tok] @ W13[e][:, I + n]) in bf16; x rows gathered.
    With SPLIT > 1, program (e, n, s) sums K rows [s K_PER, (s + 1) K_PER) into PART[s, e, m, :] (gate,
    then up; float32) and _moe_up_reduce_kernel finishes."""
    e = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    s = tl.program_id(2)
    rm = tl.arange(0, BLOCK_M)
    tok = tl.load(TOK + e * stride_te + rm * stride_tm, mask=rm < M, other=0)
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(s * K_PER, tl.minimum(s * K_PER + K_PER, K), BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(X + tok[:, None] * stride_xb + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        wm = (kk[:, None] < K) & (rn[None, :] < I)
        wg = tl.load(W13 + e * stride_we + kk[:, None] * stride_wk + rn[None, :], mask=wm, other=0.0)
        wu = tl.load(W13 + e * stride_we + kk[:, None] * stride_wk + I + rn[None, :], mask=wm, other=0.0)
        gate = tl.dot(a.to(DOT), wg.to(DOT), gate)
        up = tl.dot(a.to(DOT), wu.to(DOT), up)
    mask = (rm[:, None] < M) & (rn[None, :] < I)
    if SPLIT == 1:
        hmid = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(HMID + e * stride_he + rm[:, None] * stride_hm + rn[None, :],
                 rne_bf16(hmid).to(HMID.dtype.element_ty), mask=mask)
    else:
        row = (s * tl.num_programs(0) + e) * M + rm                         # PART is [SPLIT, E, M, 2I]
        tl.store(PART + row[:, None] * (2 * I) + rn[None, :], gate, mask=mask)
        tl.store(PART + row[:, None] * (2 * I) + I + rn[None, :], up, mask=mask)


@triton.jit
def _moe_up_reduce_kernel(PART, HMID, EM, I, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """HMID[r] = bf16(silu(sum_s gate) * sum_s up) for row r = e M + m of PART [SPLIT, E M, 2I], s in order."""
    r = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    gate = tl.zeros([BLOCK], dtype=tl.float32)
    up = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        gate += tl.load(PART + (s * EM + r) * (2 * I) + n, mask=n < I, other=0.0)
        up += tl.load(PART + (s * EM + r) * (2 * I) + I + n, mask=n < I, other=0.0)
    tl.store(HMID + r * I + n, rne_bf16(gate / (1.0 + tl.exp(-gate)) * up).to(HMID.dtype.element_ty), mask=n < I)


@triton.jit
def _moe_down_kernel(HMID, W2, TOPW, TOK, COL, VALID, YD, M, K, N, stride_he, stride_hm, stride_we, stride_wk,
                     stride_ye, stride_ym, stride_te, stride_tm, stride_ce, stride_cm, stride_ve, stride_vm, stride_tw,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, DOT: tl.constexpr):
    """YD[e, m] = (HMID[e, m] @ W2[e]) * topw[tok, col] * valid (float32)."""
    e = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(HMID + e * stride_he + rm[:, None] * stride_hm + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(W2 + e * stride_we + kk[:, None] * stride_wk + rn[None, :],
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a.to(DOT), w.to(DOT), acc)
    tok = tl.load(TOK + e * stride_te + rm * stride_tm, mask=rm < M, other=0)
    col = tl.load(COL + e * stride_ce + rm * stride_cm, mask=rm < M, other=0)
    valid = tl.load(VALID + e * stride_ve + rm * stride_vm, mask=rm < M, other=0.0)
    wt = tl.load(TOPW + tok * stride_tw + col, mask=rm < M, other=0.0) * valid
    tl.store(YD + e * stride_ye + rm[:, None] * stride_ym + rn[None, :], acc * wt[:, None],
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _moe_sum_kernel(YD, ROWS, SHARED, OUT, D, stride_rb, stride_sb, S: tl.constexpr, BLOCK_D: tl.constexpr):
    """OUT[b] = bf16(shared[b] + sum of token b's routed rows ROWS[b, :] (-1: none)), in a fixed order."""
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for s in tl.static_range(S):
        r = tl.load(ROWS + b * stride_rb + s)
        v = tl.load(YD + tl.maximum(r, 0) * D + d, mask=(d < D) & ((d * 0 + r) >= 0), other=0.0)
        acc += v
    acc += tl.load(SHARED + b.to(tl.int64) * stride_sb + d, mask=d < D, other=0.0).to(tl.float32)
    tl.store(OUT + b.to(tl.int64) * D + d, rne_bf16(acc).to(OUT.dtype.element_ty), mask=d < D)


@triton.jit
def _silu_mul_kernel(X, OUT, I, stride_xb, BLOCK: tl.constexpr):
    """OUT[b] = bf16(silu(X[b, :I]) * X[b, I:2I]) (the shared expert's activation)."""
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(X + b.to(tl.int64) * stride_xb + c, mask=c < I, other=0.0).to(tl.float32)
    g = tl.load(X + b.to(tl.int64) * stride_xb + I + c, mask=c < I, other=0.0).to(tl.float32)
    tl.store(OUT + b.to(tl.int64) * I + c, rne_bf16(a / (1.0 + tl.exp(-a)) * g).to(OUT.dtype.element_ty), mask=c < I)


def silu_mul(x):
    """x [B, 2I] (rows contiguous) -> bf16 [B, I]: silu(first half) * second half, rounded once."""
    B, I2 = x.shape
    if x.stride(1) != 1 or I2 % 2:
        raise ValueError(f"x must be [B, 2I] with contiguous rows, got {list(x.shape)}")
    out = alloc((B, I2 // 2), torch.bfloat16, x.device)
    if B:
        _silu_mul_kernel[(B, cdiv(I2 // 2, 512))](x, out, I2 // 2, x.stride(0), BLOCK=512, num_warps=4)
    return out


def moe_up(x, tok, w13, *, block_n: int = UP_BLOCK_N, split: int = 1):
    """x bf16 [B, K], tok int64 [E, M] (the dispatch: row m of expert e is token tok[e, m]), w13 bf16
    [E', K, 2I] -> bf16 [E, M, I]: silu(gate) * up of the gathered rows. ``block_n`` columns of gate and of
    up a program; ``split`` > 1 splits K over that many programs too (float32 partials, then one reduce
    launch that applies the SiLU), for few experts' weights over many SMs."""
    E, M = tok.shape
    K, I2 = w13.shape[1], w13.shape[2]
    I = I2 // 2
    if split < 1 or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"split must be >= 1 and block_n a power of two >= 16, got split={split}, block_n={block_n}")
    hmid = alloc((E, M, I), torch.bfloat16, x.device)
    k_per = cdiv(cdiv(K, split), UP_BLOCK_K) * UP_BLOCK_K
    split = cdiv(K, k_per)                       # no program without K rows
    part = alloc((split, E, M, I2), torch.float32, x.device) if split > 1 else hmid
    _moe_up_kernel[(E, cdiv(I, block_n), split)](
        x, tok, w13, hmid, part, M, K, I, k_per, x.stride(0), tok.stride(0), tok.stride(1), w13.stride(0),
        w13.stride(1), hmid.stride(0), hmid.stride(1), BLOCK_M=max(16, next_power_of_2(M)), BLOCK_N=block_n,
        BLOCK_K=UP_BLOCK_K, SPLIT=split, DOT=dot_dtype(), num_warps=4, num_stages=3)
    if split > 1 and E * M:
        _moe_up_reduce_kernel[(E * M, cdiv(I, 256))](part, hmid, E * M, I, SPLIT=split, BLOCK=256, num_warps=4)
    return hmid


def moe_down(hmid, w2, topw, tok, col, valid, *, block_n: int = DOWN_BLOCK_N):
    """hmid bf16 [E, M, I], w2 bf16 [E', I, D] -> float32 [E, M, D], each row times its token's router
    weight topw[tok, col] (0 for padding rows, valid = 0); ``block_n`` output columns a program."""
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    E, M, I = hmid.shape
    D = w2.shape[2]
    yd = alloc((E, M, D), torch.float32, hmid.device)
    _moe_down_kernel[(E, cdiv(D, block_n))](
        hmid, w2, topw, tok, col, valid, yd, M, I, D, hmid.stride(0), hmid.stride(1), w2.stride(0), w2.stride(1),
        yd.stride(0), yd.stride(1), tok.stride(0), tok.stride(1), col.stride(0), col.stride(1), valid.stride(0),
        valid.stride(1), topw.stride(0), BLOCK_M=max(16, next_power_of_2(M)),
        BLOCK_N=block_n, BLOCK_K=BLOCK_K, DOT=dot_dtype(), num_warps=4, num_stages=3)
    return yd


def moe_routed(x, tok, col, valid, w13, w2, topw, sms: int):
    """moe_up then moe_down (float32 [E, M, D], each row times its router weight) in the launch shape
    moe_launch picks for E = tok.shape[0] experts on ``sms`` SMs."""
    up_n, split, down_n = moe_launch(tok.shape[0], w2.shape[1], w2.shape[2], sms)
    return moe_down(moe_up(x, tok, w13, block_n=up_n, split=split), w2, topw, tok, col, valid, block_n=down_n)


def moe_combine(yd, rows, shared):
    """yd float32 [E, M, D], rows int64 [B, S] (flat row e * M + m of each of token b's routed rows, -1
    past them), shared [B, D] (the shared expert) -> bf16 [B, D]."""
    B, S = rows.shape
    D = yd.shape[2]
    out = alloc((B, D), torch.bfloat16, yd.device)
    if B:
        _moe_sum_kernel[(B, cdiv(D, COMBINE_BLOCK_D))](yd, rows, shared, out, D, rows.stride(0), shared.stride(0),
                                                           S=S, BLOCK_D=COMBINE_BLOCK_D, num_warps=4)
    return out
