"""The mHC glue of one layer in four kernels (S5): the pre-linear's partial GEMM with the row's sum of
squares, one program (one warp) a row for the mixing weights (Sinkhorn), one for the streams' combine
and the RMS norm, and the post (new residual streams). S4 runs the same math as ~20 torch kernels a layer
(step_glue.mhc_flat / mhc_combine / mhc_post, F.rms_norm, the GEMM, the Sinkhorn kernel)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..buffers import alloc
from ..launch import cdiv, dot_dtype, next_power_of_2
from .mhc import sinkhorn
from .rounding import rne_bf16

#: columns of the flattened streams (n x hidden) one program of the pre-linear reads, and its tile
MIX_SPLIT_COLS, MIX_BLOCK_K, MIX_BLOCK_B = 512, 128, 16


@triton.jit
def _mhc_mix_partial_kernel(H, FN, PART, SQ, B, K, stride_hb, stride_fn, cols,
                            MIX: tl.constexpr, MIX_P: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
                            DOT: tl.constexpr):
    """Partial pre-linear of rows [BLOCK_B block] over columns [split * cols, +cols) of h flattened
    [B, K]: PART[split, b, m] = sum_k h[b, k] FN[m, k], SQ[split, b] = sum_k h[b, k]^2 (fp32)."""
    pb = tl.program_id(0)
    s = tl.program_id(1)
    rb = pb * BLOCK_B + tl.arange(0, BLOCK_B)
    rm = tl.arange(0, MIX_P)
    acc = tl.zeros([BLOCK_B, MIX_P], dtype=tl.float32)
    sq = tl.zeros([BLOCK_B], dtype=tl.float32)
    for k0 in range(s * cols, s * cols + cols, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(H + rb[:, None].to(tl.int64) * stride_hb + kk[None, :],
                    mask=(rb[:, None] < B) & (kk[None, :] < K), other=0.0).to(tl.float32)
        w = tl.load(FN + rm[None, :] * stride_fn + kk[:, None], mask=(rm[None, :] < MIX) & (kk[:, None] < K),
                    other=0.0).to(tl.float32)
        acc = tl.dot(x.to(DOT), w.to(DOT), acc)
        sq += tl.sum(x * x, axis=1)
    tl.store(PART + (s * B + rb[:, None]) * MIX_P + rm[None, :], acc, mask=rb[:, None] < B)
    tl.store(SQ + s * B + rb, sq, mask=rb < B)


@triton.jit
def _mhc_mix_kernel(PART, SQ, SCALE, BASE, PRE, POST, COMB, B, nsplit, K, eps_hc, eps_rms, HC: tl.constexpr,
                    MIX_P: tl.constexpr, SPLIT_P: tl.constexpr, ITERS: tl.constexpr, SINKHORN: tl.constexpr):
    """One row b (one warp: the 4 x 4 Sinkhorn is all reductions, which more warps only synchronize):
    mixes = (sum of the partials) * rsqrt(mean(h^2) + eps); pre = sigmoid + eps and, with SINKHORN (a
    layer; the head has pre only), post = 2 sigmoid and the doubly stochastic comb, as kernels/step/mhc.py."""
    b = tl.program_id(0)
    sp = tl.arange(0, SPLIT_P)
    j = tl.arange(0, HC)
    live = sp < nsplit
    rows = (sp * B + b) * MIX_P
    sq = tl.sum(tl.load(SQ + sp * B + b, mask=live, other=0.0), axis=0)
    r = 1.0 / tl.sqrt(sq / K + eps_rms)
    s0 = tl.load(SCALE)
    raw = tl.sum(tl.load(PART + rows[:, None] + j[None, :], mask=live[:, None], other=0.0), axis=0) * r
    tl.store(PRE + b * HC + j, tl.sigmoid(raw * s0 + tl.load(BASE + j)) + eps_hc)
    if SINKHORN:
        s1 = tl.load(SCALE + 1)
        s2 = tl.load(SCALE + 2)
        raw = tl.sum(tl.load(PART + rows[:, None] + HC + j[None, :], mask=live[:, None], other=0.0), axis=0) * r
        post = 2.0 * tl.sigmoid(raw * s1 + tl.load(BASE + HC + j))
        off = 2 * HC + j[:, None] * HC + j[None, :]
        raw = tl.sum(tl.load(PART + rows[:, None, None] + off[None, :, :], mask=live[:, None, None], other=0.0),
                     axis=0) * r
        c = sinkhorn(raw * s2 + tl.load(BASE + off), ITERS, eps_hc)
        tl.store(POST + b * HC + j, post)
        tl.store(COMB + b * HC * HC + j[:, None] * HC + j[None, :], c)


@triton.jit
def _mhc_combine_norm_kernel(PRE, H, NORM_W, Y, D, stride_hb, stride_hn, stride_yb, eps_rms, HC: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    """y = rms_norm(sum_k pre[k] h[k]) * NORM_W of row b, rounded once to bf16: one pass for the norm,
    one to write it (h is re-read from L2)."""
    b = tl.program_id(0)
    j = tl.arange(0, HC)
    pre = tl.load(PRE + b * HC + j)
    hrow = H + b.to(tl.int64) * stride_hb + j[:, None] * stride_hn
    ss = tl.zeros([BLOCK_D], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        y = tl.sum(pre[:, None] * tl.load(hrow + d[None, :], mask=d[None, :] < D, other=0.0).to(tl.float32), axis=0)
        ss += y * y
    inv = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / D + eps_rms)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        y = tl.sum(pre[:, None] * tl.load(hrow + d[None, :], mask=d[None, :] < D, other=0.0).to(tl.float32), axis=0)
        w = tl.load(NORM_W + d, mask=d < D, other=0.0).to(tl.float32)
        tl.store(Y + b * stride_yb + d, rne_bf16(y * inv * w).to(Y.dtype.element_ty), mask=d < D)


@triton.jit
def _mhc_post_kernel(O, H, POST, COMB, OUT, D, stride_ob, stride_hb, stride_hn, HC: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """New residual streams of row b, columns of this program: out[i] = post[i] o + sum_j comb[j, i] h[j]."""
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    j = tl.arange(0, HC)
    dm = d[None, :] < D
    h = tl.load(H + b.to(tl.int64) * stride_hb + j[:, None] * stride_hn + d[None, :], mask=dm, other=0.0)
    comb = tl.load(COMB + b * HC * HC + j[:, None] * HC + j[None, :])                 # [j, i]
    post = tl.load(POST + b * HC + j)
    o = tl.load(O + b * stride_ob + d, mask=d < D, other=0.0).to(tl.float32)
    mixed = tl.sum(comb[:, :, None] * h.to(tl.float32)[:, None, :], axis=0)           # [i, d]
    out = post[:, None] * o[None, :] + mixed
    tl.store(OUT + b.to(tl.int64) * HC * D + j[:, None] * D + d[None, :], rne_bf16(out).to(OUT.dtype.element_ty),
             mask=dm)


def _mix_partials(h, hc_fn):
    B, n, D = h.shape
    K = n * D
    mix = hc_fn.shape[0]
    mix_p = max(16, next_power_of_2(mix))
    nsplit = cdiv(K, MIX_SPLIT_COLS)
    part = torch.empty(nsplit, B, mix_p, dtype=torch.float32, device=h.device)
    sq = torch.empty(nsplit, B, dtype=torch.float32, device=h.device)
    _mhc_mix_partial_kernel[(cdiv(B, MIX_BLOCK_B), nsplit)](
        h, hc_fn, part, sq, B, K, h.stride(0), hc_fn.stride(0), MIX_SPLIT_COLS, MIX=mix, MIX_P=mix_p,
        BLOCK_B=MIX_BLOCK_B, BLOCK_K=MIX_BLOCK_K, DOT=dot_dtype(), num_warps=4)
    return part, sq, nsplit, mix_p


def _check_streams(h, hc_fn):
    if h.dim() != 3 or h.dtype != torch.bfloat16 or h.stride(2) != 1 or h.stride(1) != h.shape[2]:
        raise ValueError(f"h must be bf16 [B, n, D] with rows of n*D contiguous values, got {h.dtype} "
                         f"{list(h.shape)} strides {list(h.stride())}")
    if hc_fn.dim() != 2 or hc_fn.shape[1] != h.shape[1] * h.shape[2] or hc_fn.stride(1) != 1:
        raise ValueError(f"hc_fn must be [mix, n*D={h.shape[1] * h.shape[2]}] with contiguous rows, "
                         f"got {list(hc_fn.shape)}")


def _finish(h, hc_fn, hc_scale, hc_base, norm_w, iters, eps_hc, eps_rms, sinkhorn: bool):
    B, n, D = h.shape
    part, sq, nsplit, mix_p = _mix_partials(h, hc_fn)
    pre = alloc((B, n), torch.float32, h.device)
    post = alloc((B, n), torch.float32, h.device) if sinkhorn else pre
    comb = alloc((B, n, n), torch.float32, h.device) if sinkhorn else pre
    _mhc_mix_kernel[(B,)](part, sq, hc_scale, hc_base, pre, post, comb, B, nsplit, n * D, eps_hc, eps_rms, HC=n,
                          MIX_P=mix_p, SPLIT_P=next_power_of_2(nsplit), ITERS=iters, SINKHORN=sinkhorn, num_warps=1)
    y = alloc((B, D), torch.bfloat16, h.device)
    _mhc_combine_norm_kernel[(B,)](pre, h, norm_w, y, D, h.stride(0), h.stride(1), y.stride(0), eps_rms, HC=n,
                                   BLOCK_D=min(1024, next_power_of_2(D)), num_warps=4)
    return y, post, comb


def mhc_pre(h, hc_fn, hc_scale, hc_base, norm_w, iters: int, eps_hc: float, eps_rms: float):
    """A layer's mHC pre, fused: h bf16 [B, n, D] -> (y bf16 [B, D], post [B, n], comb [B, n, n] fp32);
    y = rms_norm(sum_k pre[k] h[k]) * norm_w, the mixing weights from hc_fn [(2+n)n, nD] as
    step_glue.mhc_flat + the pre-linear + mhc.mhc_sinkhorn + step_glue.mhc_combine + rms_norm. Three
    launches (the partial pre-linear, the mixing weights, the combine and norm); hc_fn in the GEMM's
    dtype (bf16 from S3 on)."""
    _check_streams(h, hc_fn)
    B, n, D = h.shape
    if hc_fn.shape[0] != (2 + n) * n:
        raise ValueError(f"hc_fn must have (2 + n) * n = {(2 + n) * n} rows for a layer, got {hc_fn.shape[0]}")
    return _finish(h, hc_fn, hc_scale, hc_base, norm_w, iters, eps_hc, eps_rms, sinkhorn=True)


def mhc_head_pre(h, hc_fn, hc_scale, hc_base, norm_w, eps_hc: float, eps_rms: float):
    """The head's mHC pre, fused: pre = sigmoid(mixes * scale + base) + eps from hc_fn [n, nD], then
    y = rms_norm(sum_k pre[k] h[k]) * norm_w -> bf16 [B, D]."""
    _check_streams(h, hc_fn)
    return _finish(h, hc_fn, hc_scale, hc_base, norm_w, 1, eps_hc, eps_rms, sinkhorn=False)[0]


MHC_POST_BLOCK_D = 256


def mhc_post(o, h, post, comb):
    """New residual streams, fused: h'[i] = post[i] * o + sum_j comb[j, i] * h[j] -> bf16 [B, n, D]
    (step_glue.mhc_post in one launch). o [B, D] (rows contiguous), h bf16 [B, n, D]."""
    B, n, D = h.shape
    if o.shape != (B, D) or o.stride(1) != 1:
        raise ValueError(f"o must be [B={B}, D={D}] with contiguous rows, got {list(o.shape)}")
    out = alloc((B, n, D), torch.bfloat16, h.device)
    _mhc_post_kernel[(B, cdiv(D, MHC_POST_BLOCK_D))](o, h, post, comb, out, D, o.stride(0), h.stride(0), h.stride(1),
                                                     HC=n, BLOCK_D=MHC_POST_BLOCK_D, num_warps=4)
    return out
