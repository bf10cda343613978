"""DSv4's MoE router in one launch (S5): scores sqrt(softplus(logits)), the top-k experts by score +
bias, their scores renormalized x scale. S4 runs step_glue.route as ~10 torch kernels (softplus, sqrt,
add, topk's two, gather, sum, div, mul). Ties go to the lower expert id; ``ids`` given (a fixed
selection, for comparing two stages on one path) skips the choice."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..buffers import alloc
from ..launch import next_power_of_2


@triton.jit
def _router_kernel(LOGITS, BIAS, IDS_IN, IDS, W, E, stride_lb, scale, K: tl.constexpr, K_P: tl.constexpr,
                   E_P: tl.constexpr, FIXED: tl.constexpr):
    b = tl.program_id(0)
    e = tl.arange(0, E_P)
    x = tl.load(LOGITS + b.to(tl.int64) * stride_lb + e, mask=e < E, other=0.0).to(tl.float32)
    # softplus as torch computes it (threshold 20: x itself above)
    sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    scores = tl.sqrt(sp)
    biased = tl.where(e < E, scores + tl.load(BIAS + e, mask=e < E, other=0.0), -float("inf"))
    k = tl.arange(0, K_P)
    picked = tl.zeros([K_P], dtype=tl.int32)
    ws = tl.zeros([K_P], dtype=tl.float32)
    for i in tl.static_range(K):
        if FIXED:
            top = tl.load(IDS_IN + b * K + i).to(tl.int32)
        else:
            best = tl.max(biased, axis=0)
            top = tl.min(tl.where(biased == best, e, E_P), axis=0)          # the lowest id among ties
        picked = tl.where(k == i, top, picked)
        ws = tl.where(k == i, tl.sum(tl.where(e == top, scores, 0.0), axis=0), ws)
        biased = tl.where(e == top, -float("inf"), biased)
    tl.store(IDS + b * K + k, picked.to(tl.int64), mask=k < K)
    tl.store(W + b * K + k, ws / tl.sum(ws, axis=0) * scale, mask=k < K)


def route(logits, bias, k: int, scale: float, ids=None, *, kernel=None):
    """logits [B, E] (rows contiguous; bf16 or float32), bias [E] float32 -> (ids int64 [B, k], weights
    float32 [B, k]) as step_glue.route; ``ids`` [B, k] fixes the choice. ``kernel``: another kernel with
    _router_kernel's signature (notebook 09's copy), launched in its place."""
    B, E = logits.shape
    if logits.stride(1) != 1 or bias.shape != (E,):
        raise ValueError(f"logits must be [B, E={E}] with contiguous rows and bias [E], got {list(bias.shape)}")
    if not 1 <= k <= E:
        raise ValueError(f"k must be in [1, E={E}], got {k}")
    if ids is not None and (ids.shape != (B, k) or not ids.is_contiguous()):
        raise ValueError(f"ids must be contiguous [B={B}, k={k}], got {list(ids.shape)}")
    out_ids = alloc((B, k), torch.int64, logits.device)
    w = alloc((B, k), torch.float32, logits.device)
    if B:
        (kernel or _router_kernel)[(B,)](logits, bias, out_ids if ids is None else ids, out_ids, w, E, logits.stride(0),
                                         scale, K=k, K_P=next_power_of_2(k), E_P=next_power_of_2(E),
                                         FIXED=ids is not None, num_warps=4)
    return out_ids, w
