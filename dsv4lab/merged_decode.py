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
with ``impl=`` choosing the per-cache kernel (any ``dsv4lab.impls()`` name). SGLang's kernel (the
registry's tag "peer") calls SGLang's own function from its wheel, so the two can be compared on the
same inputs.
"""
from __future__ import annotations

import math

import torch

from .cache import as_kv_cache
from .config import HEAD_DIM
from .contracts import check_sink, check_sparse_decode_args, checks_mode, refuse_check_ranges
from .registry import impl_info

def merge_by_lse(out1, lse1, out2, lse2):
    """Two partial attentions over disjoint token sets -> one, as SGLang merges them, except that "no
    valid token" is lse = -inf exactly: SGLang's merge reads any lse <= -1e20 as empty, which drops real
    tokens when every lse of a row is that low (an extreme but finite sm_scale or q). A NaN lse (a
    part that could not be computed) makes the row NaN. out [..., H, D] (any float dtype), lse [..., H]
    float32 -> (out float32, lse float32): the caller rounds once at the end (SGLang rounds to bf16
    after the merge and again after the sink)."""
    m = torch.maximum(lse1, lse2)                                   # NaN if either is
    m_safe = torch.where(m == -math.inf, 0.0, m)                    # both empty: weights 0, not NaN
    w1, w2 = torch.exp(lse1 - m_safe), torch.exp(lse2 - m_safe)
    total = w1 + w2
    out = (w1.unsqueeze(-1) * out1.float() + w2.unsqueeze(-1) * out2.float()) / total.clamp(min=1.0).unsqueeze(-1)
    return out, m + torch.log(total.clamp(min=1.0))


def apply_sink(out, lse, attn_sink):
    """The attention sink adds exp(sink[h]) to every row's softmax denominator, as SGLang applies
    it, with "no token" only at lse = -inf (see merge_by_lse): (out float32, lse float32)."""
    new_lse = torch.logaddexp(lse, attn_sink.float().expand_as(lse))
    w = torch.where(lse == -math.inf, 0.0, torch.exp(lse - new_lse))
    return out.float() * w.unsqueeze(-1), new_lse


def _query(q):
    """q [B, 1, H, 512] or [B, H, 512] -> [B, H, 512]."""
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    if q.dim() == 4 and q.shape[1] == 1:
        return q[:, 0]
    if q.dim() == 3:
        return q
    raise ValueError(f"q must be [B, 1, H, {HEAD_DIM}] (one query token per request) or [B, H, {HEAD_DIM}], "
                     f"got {list(q.shape)}")


def _indices(name, x, B):
    """indices [B, K] or SGLang's [B, 1, K] -> [B, K] (a view)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 3 and x.shape[1] == 1:
        x = x[:, 0]
    if x.dim() != 2 or x.shape[0] != B:
        raise ValueError(f"{name} must be [B={B}, K] or [B={B}, 1, K] int32 token ids, got {list(x.shape)}")
    return x


def _checked_parts(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale, extra_k_cache,
                   extra_indices, extra_topk_length, impl, checks, check_ranges):
    """The arguments checked as flash_mla_sparse_decode documents -> (q [B, H, 512], the per-cache
    (cache, indices, topk_length, names), the impl's registry entry, the softmax scale)."""
    q3 = _query(q)
    if head_dim_v != HEAD_DIM:
        raise ValueError(f"head_dim_v must be {HEAD_DIM} (K = V in DSv4's MLA), got {head_dim_v!r}")
    if (extra_k_cache is None) != (extra_indices is None):
        raise ValueError("extra_k_cache and extra_indices go together: pass both or neither")
    if extra_k_cache is None and extra_topk_length is not None:
        raise ValueError("extra_topk_length needs extra_k_cache and extra_indices")
    refuse_check_ranges(check_ranges)
    mode = checks_mode(checks)
    entry = impl_info("sparse_decode", impl)
    B = q3.shape[0]
    parts = [(as_kv_cache(k_cache, "k_cache"), _indices("indices", indices, B), topk_length, _NAMES)]
    if extra_k_cache is not None:
        parts.append((as_kv_cache(extra_k_cache, "extra_k_cache"), _indices("extra_indices", extra_indices, B),
                      extra_topk_length, _EXTRA_NAMES))
    for cache, idx, tlen, names in parts:
        scale = check_sparse_decode_args(q3, cache, idx, tlen, softmax_scale, None, mode,
                                         entry.max_scale_byte, names=names, empty_batch_ok=True)
    if attn_sink is not None:
        check_sink(attn_sink, q3, mode)
    return q3, parts, entry, scale


def flash_mla_sparse_decode(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
                            extra_k_cache=None, extra_indices=None, extra_topk_length=None, *,
                            impl: str = "reference", checks: str | None = None, check_ranges: bool | None = None):
    """SGLang's ``flash_mla_sparse_decode_triton`` with the lab's kernels.

    q [B, 1, H, 512] (SGLang's layout; [B, H, 512] is accepted too); ``k_cache`` /
    ``extra_k_cache``: a :class:`dsv4lab.cache.KVCache` or SGLang's fp8 view
    [num_pages, page_size, 1, 584] (read in place, never copied); indices [B, K] or [B, 1, K] int32
    token ids (-1 padding), ``topk_length`` [B] int32 or None; ``attn_sink`` [H] or None;
    ``head_dim_v`` must be 512; ``softmax_scale`` None means 512 ** -0.5. Returns SGLang's layout:
    out bf16 [B, 1, H, 512], lse float32 [B, H, 1] (for a 3-D q: [B, H, 512] and [B, H]); a row
    with no valid token in either cache gives out 0 and lse -inf (the sink's value with a sink).
    B = 0 gives empty outputs (SGLang's own function cannot take an empty batch). ``checks`` as in
    :func:`dsv4lab.sparse_decode` ("device", the default: no host sync; "sync": the data checked
    on the host, naming the offending value; ``check_ranges=``, its older spelling, is refused).
    The lab's impls merge and apply the sink in float32 and round once; SGLang's (tag "peer")
    rounds as SGLang does (after each cache, the merge and the sink).
    """
    q3, parts, entry, scale = _checked_parts(q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                                             softmax_scale, extra_k_cache, extra_indices, extra_topk_length,
                                             impl, checks, check_ranges)
    fn, B = entry.fn, q3.shape[0]
    H = q3.shape[1]
    if B == 0:
        out = torch.zeros(0, H, HEAD_DIM, dtype=torch.bfloat16, device=q3.device)
        lse = torch.zeros(0, H, dtype=torch.float32, device=q3.device)
    elif "peer" in entry.tags:
        out, lse = _sglang(q3, parts, attn_sink, scale)
    else:
        runs = _per_cache(fn, q3, parts, scale)
        out, lse = runs[0]
        if len(runs) == 2:
            out, lse = merge_by_lse(out, lse, *runs[1])
        if attn_sink is not None:
            out, lse = apply_sink(out, lse, attn_sink)
        out = out.to(torch.bfloat16)
    if q.dim() == 3:
        return out, lse
    return out.unsqueeze(1), lse.unsqueeze(-1)


def _per_cache(fn, q3, parts, scale) -> list:
    """(out, lse) of ``fn`` over each cache of ``parts``, no sink (it goes on after the merge)."""
    return [fn(q3, cache, idx, topk_len=tlen, sm_scale=scale, attn_sink=None) for cache, idx, tlen, _ in parts]


_NAMES = {"cache": "k_cache", "indices": "indices", "topk_len": "topk_length", "sm_scale": "softmax_scale"}
_EXTRA_NAMES = {"cache": "extra_k_cache", "indices": "extra_indices", "topk_len": "extra_topk_length",
                "sm_scale": "softmax_scale"}


def _sglang(q3, parts, attn_sink, scale):
    """SGLang's own public function, from its wheel (the lab has checked the arguments)."""
    from .kernels.decode import sglang_peer
    (cache, idx, tlen, _), *extra = parts
    e_cache, e_idx, e_tlen = (extra[0][:3] if extra else (None, None, None))
    with sglang_peer.one_config_when_interpreting():
        out, lse = sglang_peer.module().flash_mla_sparse_decode_triton(
            q3.unsqueeze(1), cache.k_cache, idx, tlen, None if attn_sink is None else attn_sink.float(),
            HEAD_DIM, scale, None if e_cache is None else e_cache.k_cache, e_idx, e_tlen)
    return out[:, 0], lse[..., 0]


def sparse_decode_per_cache(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale,
                            extra_k_cache=None, extra_indices=None, extra_topk_length=None, *,
                            impl: str, checks: str | None = None):
    """flash_mla_sparse_decode's arguments and checks, without the merge and the sink: the per-cache
    (out [B, H, 512], lse float32 [B, H]) of a lab impl, for a caller that fuses the merge, the sink
    and what comes after them into one kernel (the step's S5: kernels/step/decode_epilogue.py)."""
    q3, parts, entry, scale = _checked_parts(q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                                             softmax_scale, extra_k_cache, extra_indices, extra_topk_length,
                                             impl, checks, None)
    if "peer" in entry.tags:
        raise ValueError(f"impl {impl!r} is a peer: its merge and sink are its own; use flash_mla_sparse_decode")
    if attn_sink is not None:
        raise ValueError("attn_sink must be None here: the per-cache outputs come without the sink, which the "
                         "caller applies after the merge (decode_epilogue); pass it to flash_mla_sparse_decode "
                         "to have it applied")
    if q3.shape[0] == 0:
        empty = (torch.zeros(0, q3.shape[1], HEAD_DIM, dtype=torch.bfloat16, device=q3.device),
                 torch.zeros(0, q3.shape[1], dtype=torch.float32, device=q3.device))
        return [empty for _ in parts]
    return _per_cache(entry.fn, q3, parts, scale)
