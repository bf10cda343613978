"""The mHC (manifold-constrained hyper-connections) mixing weights of one token row: the residual streams'
pre / post gates and the doubly stochastic stream-mixing matrix (Sinkhorn), one program a row."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def sinkhorn(c, ITERS: tl.constexpr, eps):
    """The stream-mixing logits [HC, HC] -> row softmax + eps, then alternate column / row normalizations
    (ITERS column steps in all): a doubly stochastic matrix (S5's mixing kernel calls it too)."""
    c = tl.exp(c - tl.max(c, axis=1)[:, None])
    c = c / tl.sum(c, axis=1)[:, None] + eps
    c = c / (tl.sum(c, axis=0)[None, :] + eps)
    for _ in tl.static_range(ITERS - 1):
        c = c / (tl.sum(c, axis=1)[:, None] + eps)
        c = c / (tl.sum(c, axis=0)[None, :] + eps)
    return c


@triton.jit
def _mhc_sinkhorn_kernel(MIX, SCALE, BASE, PRE, POST, COMB, HC: tl.constexpr, ITERS: tl.constexpr,
                         EPS: tl.constexpr):
    """One token row: mixes [(2 + HC) * HC] = [pre | post | comb] -> pre = sigmoid(.) + eps,
    post = 2 sigmoid(.), comb = row softmax + eps, then alternate column / row normalizations
    (ITERS column steps in all) so the stream-mixing matrix is doubly stochastic."""
    row = tl.program_id(0)
    MIX_HC: tl.constexpr = (2 + HC) * HC
    j = tl.arange(0, HC)
    base = MIX + row * MIX_HC
    s0 = tl.load(SCALE)
    s1 = tl.load(SCALE + 1)
    s2 = tl.load(SCALE + 2)
    pre = tl.sigmoid(tl.load(base + j) * s0 + tl.load(BASE + j)) + EPS
    post = 2.0 * tl.sigmoid(tl.load(base + HC + j) * s1 + tl.load(BASE + HC + j))
    off = 2 * HC + j[:, None] * HC + j[None, :]
    c = sinkhorn(tl.load(base + off) * s2 + tl.load(BASE + off), ITERS, EPS)
    tl.store(PRE + row * HC + j, pre)
    tl.store(POST + row * HC + j, post)
    tl.store(COMB + row * HC * HC + j[:, None] * HC + j[None, :], c)


def mhc_sinkhorn(mixes, hc_scale, hc_base, hc_mult: int, iters: int, eps: float):
    """mixes float32 [B, (2+n)n] -> (pre [B, n], post [B, n], comb [B, n, n]) float32."""
    B = mixes.shape[0]
    n = hc_mult
    pre = torch.empty(B, n, dtype=torch.float32, device=mixes.device)
    post = torch.empty_like(pre)
    comb = torch.empty(B, n, n, dtype=torch.float32, device=mixes.device)
    _mhc_sinkhorn_kernel[(B,)](mixes.contiguous(), hc_scale, hc_base, pre, post, comb, HC=n, ITERS=iters,
                               EPS=eps, num_warps=1)
    return pre, post, comb
