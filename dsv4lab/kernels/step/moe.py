"""The MoE stand-in's grouped GEMM: one bf16 GEMM per expert over the few rows routed to it (dsv4lab.model's
stand-in reads FP4's bytes in bf16; see model.ASSUMPTIONS)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..launch import dot_dtype


@triton.jit
def _moe_grouped_gemm_kernel(X, W, Y, M, N, K, stride_xe, stride_xm, stride_we, stride_wk, stride_ye, stride_ym,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             DOT: tl.constexpr):
    """Y[e] = X[e] @ W[e] for each expert e: X [E, M, K] (M <= BLOCK_M rows per expert),
    W [E, K, N] (N contiguous), Y [E, M, N] float32. Grid (E, cdiv(N, BLOCK_N))."""
    e = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(X + e * stride_xe + rm[:, None] * stride_xm + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(W + e * stride_we + kk[:, None] * stride_wk + rn[None, :],
                    mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a.to(DOT), b.to(DOT), acc)
    tl.store(Y + e * stride_ye + rm[:, None] * stride_ym + rn[None, :], acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


MOE_BLOCK_M, MOE_BLOCK_N, MOE_BLOCK_K = 16, 64, 64


def moe_grouped_gemm(x, w):
    """x [E, M, K] bf16, w [E', K, N] bf16 (the first E experts are used) -> float32 [E, M, N]."""
    E, M, K = x.shape
    N = w.shape[2]
    if M > MOE_BLOCK_M:
        raise ValueError(f"the stand-in grouped GEMM takes at most {MOE_BLOCK_M} rows per expert, got {M}")
    y = torch.empty(E, M, N, dtype=torch.float32, device=x.device)
    _moe_grouped_gemm_kernel[(E, triton.cdiv(N, MOE_BLOCK_N))](
        x, w, y, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1),
        BLOCK_M=MOE_BLOCK_M, BLOCK_N=MOE_BLOCK_N, BLOCK_K=MOE_BLOCK_K, DOT=dot_dtype(), num_warps=4, num_stages=3)
    return y
