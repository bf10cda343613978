"""One DSv4 attention decode: the sliding-window cache and the compressed cache, merged.

A DeepSeek-V4-Flash layer attends to two caches: the last ``sliding_window`` (128) tokens in the
window cache (pages of 256) and, on compressed layers, the compressed cache (pages of 64: the
indexer's top-512 on ratio-4 layers, every compressed token on ratio-128 layers). SGLang's
``flash_mla_sparse_decode_triton`` runs one sparse decode per cache and merges the two by
log-sum-exp, then applies the attention sink::

    w_i = exp(lse_i - max(lse_1, lse_2))            (0 for a cache with no valid token)
    out = (w_1 * out_1 + w_2 * out_2) / (w_1 + w_2),  lse = max + log(w_1 + w_2)
    sink: lse' = logaddexp(lse, sink[h]),  out' = out * exp(lse - lse')

:func:`flash_mla_sparse_decode` takes SGLang's arguments in SGLang's order and does exactly that,
with ``impl=`` choosing the per-cache kernel (any ``dsv4lab.impls()`` name). ``impl="sglang"``
calls SGLang's own function from its wheel, so the two can be compared on the same inputs.
"""
from __future__ import annotations

import torch

from . import api
from .cache import HEAD_DIM, KVCache, as_kv_cache

_EMPTY_LSE = -1e20            # SGLang's threshold: an lse at or below it is "no valid token"


def merge_by_lse(out1, lse1, out2, lse2):
    """Two partial attentions over disjoint token sets -> one, as SGLang merges them.
    out [..., H, D] (any float dtype), lse [..., H] float32 -> (out bf16, lse float32)."""
    m = torch.maximum(lse1, lse2)
    w1 = torch.where(lse1 > _EMPTY_LSE, torch.exp(lse1 - m), torch.zeros_like(lse1))
    w2 = torch.where(lse2 > _EMPTY_LSE, torch.exp(lse2 - m), torch.zeros_like(lse2))
    total = (w1 + w2).clamp(min=1e-20)
    out = (w1.unsqueeze(-1) * out1.float() + w2.unsqueeze(-1) * out2.float()) / total.unsqueeze(-1)
    return out.to(torch.bfloat16), m + torch.log(total)


def apply_sink(out, lse, attn_sink):
    """The attention sink adds exp(sink[h]) to every row's softmax denominator, as SGLang applies it."""
    new_lse = torch.logaddexp(lse, attn_sink.float().expand_as(lse))
    w = torch.where(lse > _EMPTY_LSE, torch.exp(lse - new_lse), torch.zeros_like(lse))
    return (out.float() * w.unsqueeze(-1)).to(torch.bfloat16), new_lse


def _indices_2d(name, x, B):
    if isinstance(x, torch.Tensor) and x.dim() == 3 and x.shape[0] == B and x.shape[1] == 1:
        return x.reshape(B, -1)
    return x


def flash_mla_sparse_decode(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
                            extra_k_cache=None, extra_indices=None, extra_topk_length=None, *,
                            impl: str = "reference", check_ranges: bool = True):
    """SGLang's ``flash_mla_sparse_decode_triton`` with the lab's kernels.

    q [B, 1, H, 512] (SGLang's layout; [B, H, 512] is accepted too); ``k_cache`` /
    ``extra_k_cache``: a :class:`dsv4lab.cache.KVCache` or SGLang's fp8 view
    [num_pages, page_size, 1, 584] (read in place, never copied); indices [B, K] or [B, 1, K] int32
    token ids (-1 padding), ``topk_length`` [B] int32 or None; ``attn_sink`` [H] or None;
    ``head_dim_v`` must be 512. Returns SGLang's layout: out bf16 [B, 1, H, 512], lse float32
    [B, H, 1] (for a 3-D q: [B, H, 512] and [B, H]).
    """
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    squeeze = q.dim() == 3
    if q.dim() == 4:
        if q.shape[1] != 1:
            raise ValueError(f"q must be [B, 1, H, {HEAD_DIM}] (one query token per request), got {list(q.shape)}")
        q3 = q[:, 0]
    elif squeeze:
        q3 = q
    else:
        raise ValueError(f"q must be [B, 1, H, {HEAD_DIM}] or [B, H, {HEAD_DIM}], got {list(q.shape)}")
    if head_dim_v != HEAD_DIM:
        raise ValueError(f"head_dim_v must be {HEAD_DIM} (K = V in DSv4's MLA), got {head_dim_v!r}")
    if (extra_k_cache is None) != (extra_indices is None):
        raise ValueError("extra_k_cache and extra_indices go together: pass both or neither")
    if extra_k_cache is None and extra_topk_length is not None:
        raise ValueError("extra_topk_length needs extra_k_cache and extra_indices")
    B = q3.shape[0]
    kw = dict(sm_scale=softmax_scale, impl=impl, check_ranges=check_ranges)
    if impl == "sglang":
        out, lse = _sglang(q3, as_kv_cache(k_cache, "k_cache"), _indices_2d("indices", indices, B), topk_length,
                           attn_sink, softmax_scale, extra_k_cache, _indices_2d("extra_indices", extra_indices, B),
                           extra_topk_length, check_ranges)
    else:
        out, lse = api.sparse_decode(q3, as_kv_cache(k_cache, "k_cache"), _indices_2d("indices", indices, B),
                                     topk_len=topk_length, **kw)
        if extra_k_cache is not None:
            o2, l2 = api.sparse_decode(q3, as_kv_cache(extra_k_cache, "extra_k_cache"),
                                       _indices_2d("extra_indices", extra_indices, B), topk_len=extra_topk_length, **kw)
            out, lse = merge_by_lse(out, lse, o2, l2)
        if attn_sink is not None:
            api.check_sink(attn_sink, q3, check_ranges)
            out, lse = apply_sink(out, lse, attn_sink)
        out = out.to(torch.bfloat16)
    if squeeze:
        return out, lse
    return out.unsqueeze(1), lse.unsqueeze(-1)


def _sglang(q3, cache: KVCache, indices, topk_length, attn_sink, softmax_scale, extra_k_cache, extra_indices,
            extra_topk_length, check_ranges):
    """SGLang's own public function, from its wheel, after the lab's argument checks."""
    from .kernels import sglang_peer
    api.check_sparse_decode_args(q3, cache, indices, topk_length, softmax_scale, None, check_ranges)
    extra = None
    if extra_k_cache is not None:
        extra = as_kv_cache(extra_k_cache, "extra_k_cache")
        api.check_sparse_decode_args(q3, extra, extra_indices, extra_topk_length, softmax_scale, None, check_ranges)
    if attn_sink is not None:
        api.check_sink(attn_sink, q3, check_ranges)
    scale = HEAD_DIM ** -0.5 if softmax_scale is None else float(softmax_scale)
    with sglang_peer.one_config_when_interpreting():
        out, lse = sglang_peer.module().flash_mla_sparse_decode_triton(
            q3.unsqueeze(1), cache.k_cache, indices, topk_length,
            None if attn_sink is None else attn_sink.float(), HEAD_DIM, scale,
            None if extra is None else extra.k_cache, extra_indices, extra_topk_length)
    return out[:, 0], lse[..., 0]
