"""The float64 judges of the step's kernels, beside them as kernels/decode/reference.py and
kernels/indexer/reference.py are beside theirs: SGLang's torch formulas, rounding nowhere."""
from __future__ import annotations

import torch


def mhc_sinkhorn_float64(mixes, hc_scale, hc_base, hc_mult: int, iters: int, eps: float):
    """SGLang's _mhc_pre_torch split + Sinkhorn: what mhc.mhc_sinkhorn computes, in float64."""
    n = hc_mult
    m, s, b = mixes.double(), hc_scale.double(), hc_base.double()
    pre = torch.sigmoid(m[:, :n] * s[0] + b[:n]) + eps
    post = 2 * torch.sigmoid(m[:, n:2 * n] * s[1] + b[n:2 * n])
    comb = (m[:, 2 * n:].view(-1, n, n) * s[2] + b[2 * n:].view(n, n)).softmax(-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def moe_grouped_gemm_float64(x, w):
    """What moe.moe_grouped_gemm computes, in float64: x [E, M, K] @ w[:E] [E, K, N]."""
    return torch.einsum("emk,ekn->emn", x.double(), w[:x.shape[0]].double())
