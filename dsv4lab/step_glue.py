"""The decode step's glue: plain torch functions between the kernels (norms, rope, the mHC combine and
post, the window cache's fp8 store, the router). They are the torch.compile targets of the compile
lesson: :data:`GLUE` names them, and ``Model.use_glue`` swaps in compiled ones by name.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import FP8_MAX, NOPE_DIM, NUM_SCALES, QUANT_TILE


def rms_norm(x, weight, eps: float):
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def rope(x, cos, sin, inverse: bool = False):
    """Rotate the last 2 * cos.shape[-1] dims of x [B, ..., D] in interleaved pairs (DeepSeek's
    rope, is_neox_style=False); cos/sin [B, R/2] float32. Returns a new tensor in x's dtype."""
    r = 2 * cos.shape[-1]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    c, s = cos.view(shape), sin.view(shape)
    if inverse:
        s = -s
    xr = x[..., -r:].float().unflatten(-1, (-1, 2))
    x0, x1 = xr[..., 0], xr[..., 1]
    rot = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)
    return torch.cat([x[..., :-r], rot.to(x.dtype)], dim=-1)


def mhc_flat(h, eps: float):
    """h [B, n, D] -> (x float32 [B, nD], rsqrt(mean(x^2) + eps) [B, 1]): the pre-linear's input."""
    x = h.flatten(1).float()
    return x, torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


def mhc_combine(x_flat, pre, n: int, dtype):
    """sum_k pre[:, k] * stream k: [B, nD] float32 -> [B, D] in ``dtype``."""
    return (pre.unsqueeze(-1) * x_flat.unflatten(-1, (n, -1))).sum(1).to(dtype)


def mhc_post(o, h, post, comb):
    """New residual streams: h'[i] = post[i] * o + sum_j comb[j, i] * h[j]."""
    return (post.unsqueeze(-1) * o.float().unsqueeze(1)
            + (comb.unsqueeze(-1) * h.float().unsqueeze(2)).sum(1)).to(h.dtype)


def kv_cache_bytes(kv):
    """kv [B, 512] -> (data bytes uint8 [B, 576], UE8M0 scale bytes uint8 [B, 7]) in SGLang's
    layout: 448 fp8 e4m3 nope values (one power-of-two scale per 64) + 64 bf16 rope values.
    The graph-safe twin of cache.quantize_nope (no finiteness check: that needs a host sync)."""
    B = kv.shape[0]
    nope = kv[:, :NOPE_DIM].float().unflatten(-1, (NUM_SCALES, QUANT_TILE))
    e = torch.ceil(torch.log2(nope.abs().amax(-1).clamp_min(1e-8) / FP8_MAX))
    q = (nope / torch.exp2(e).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    rope_bytes = kv[:, NOPE_DIM:].to(torch.bfloat16).contiguous().view(torch.uint8)
    data = torch.cat([q.view(torch.uint8).reshape(B, NOPE_DIM), rope_bytes], dim=1)
    return data, (e + 127).to(torch.uint8)


def route(logits, bias, k: int, scale: float, ids=None):
    """DSv4's router on fp32 logits [B, E]: scores sqrt(softplus(.)), top-k of scores + bias,
    weights = the chosen scores renormalized x scale -> (ids int64 [B, k], weights float32 [B, k]).
    ``ids`` given (a fixed selection, dsv4lab.step_compare) skips the choice."""
    scores = torch.sqrt(F.softplus(logits))
    if ids is None:
        ids = torch.topk(scores + bias, k, dim=-1).indices
    w = scores.gather(1, ids)
    return ids, w / w.sum(-1, keepdim=True) * scale


def silu_mul(x):
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


#: the glue functions the torch.compile lesson compiles (names of this module's functions)
GLUE = ("rms_norm", "rope", "mhc_flat", "mhc_combine", "mhc_post", "kv_cache_bytes", "route", "silu_mul")
#: what Model.use_glue may also replace: the stage's indexer top-k (the compile lesson compiles the
#: torch fallback the story ran at S1)
INDEXER_TOPK = "indexer_topk"
