"""Float64 references: the functions every kernel in the lab is judged against.

They work on the *dequantized* caches, so a kernel's error against them is its
own arithmetic error, not the fp8 quantization (which both sides share).
Written for clarity, not speed; notebooks call them on small shapes.
"""
from __future__ import annotations

import math

import torch

from .cache import IndexKCache, KVCache, as_kv_cache, dequant_index_k, dequant_kv
from .config import HEAD_DIM


def sparse_decode(q, cache: KVCache, indices, topk_len=None, sm_scale=None, attn_sink=None):
    """Sparse MLA decode over the top-k tokens of each query, in float64.

    q [B,H,512]; indices int32 [B,K] token ids, any entry < 0 is padding;
    topk_len [B] keeps only each row's first topk_len entries; attn_sink [H]
    adds exp(sink[h]) to the softmax denominator.
    Returns (out float32 [B,H,512], lse float32 [B,H]); a row with no valid
    token gives out 0 and lse -inf (or lse = sink with a sink), never NaN.
    """
    out, lse = sparse_decode_float64(q, cache, indices, topk_len, sm_scale)
    if attn_sink is not None:
        out, lse = sink_float64(out, lse, attn_sink)
    return out.float(), lse.float()


def sparse_decode_float64(q, cache: KVCache, indices, topk_len=None, sm_scale=None):
    """:func:`sparse_decode` without a sink, in float64: (out [B,H,512], lse [B,H]) float64."""
    B, H, D = q.shape
    K = indices.shape[1]
    scale = D ** -0.5 if sm_scale is None else float(sm_scale)
    dev = q.device
    valid = indices >= 0
    if topk_len is not None:
        valid &= torch.arange(K, device=dev)[None, :] < topk_len.to(dev).long()[:, None]
    kv = _gather(cache, indices, valid)
    s = torch.einsum("bhd,bkd->bhk", q.double(), kv) * scale
    s = s.masked_fill(~valid[:, None, :], -math.inf)
    lse = torch.logsumexp(s, dim=-1)                                    # -inf on empty rows
    p = torch.where(valid[:, None, :], torch.exp(s - lse[..., None].nan_to_num(neginf=0.0)),
                    torch.zeros((), dtype=s.dtype, device=dev))
    return torch.einsum("bhk,bkd->bhd", p, kv), lse


def sink_float64(out, lse, attn_sink):
    """The attention sink on float64 (out [B,H,512], lse [B,H]): exp(sink[h]) joins each row's softmax
    denominator, lse' = logaddexp(lse, sink), out' = out * exp(lse - lse') (0 on empty rows)."""
    sink = attn_sink.to(lse.device).double()[None, :].expand_as(lse)
    new_lse = torch.logaddexp(lse, sink)
    return out * torch.exp(lse - new_lse)[..., None], new_lse


def _gather(cache: KVCache, indices, valid):
    """The dequantized tokens of ``indices`` [B, K] where ``valid``, zeros elsewhere: float64 [B, K, 512]
    (a call whose entries are all padding reads nothing, so an empty cache answers it too)."""
    kv = torch.zeros(*indices.shape, HEAD_DIM, dtype=torch.float64, device=valid.device)
    kv[valid] = dequant_kv(cache, indices.to(valid.device)[valid]).double()
    return kv


def indexer_logits(q, index_cache: IndexKCache, weights, seq_lens, page_table, max_seq_len):
    """Lightning-indexer logits in float64.

    logits[b,t] = sum_h weights[b,h] * relu(q[b,h] . k_t) for t < seq_lens[b], -inf beyond,
    where k_t is the dequantized key at physical page page_table[b, t // 64], slot t % 64.
    Page-table entries past a request's live pages are never read (they may be -1).
    """
    B = q.shape[0]
    dev = q.device
    ps = index_cache.page_size
    out = torch.full((B, max_seq_len), -math.inf, dtype=torch.float64, device=dev)
    for b in range(B):
        n = min(int(seq_lens[b]), max_seq_len)
        if n <= 0:
            continue
        t = torch.arange(n, device=dev)
        phys = page_table[b, t // ps].long().to(dev) * ps + t % ps
        k = dequant_index_k(index_cache, phys).double()                 # [n, 128]
        s = torch.relu(q[b].double() @ k.T)                              # [H_i, n]
        out[b, :n] = (weights[b].double()[:, None] * s).sum(0)
    return out.float()


def topk_indices(logits, k: int):
    """Positions of the k largest logits per row that are not -inf (the mask past seq_len), -1
    padded when fewer exist; a NaN ranks above every number and +inf is a number, as torch.topk
    orders them, so a row never loses a slot to them.

    Ties are broken by torch.topk; order within the result is by descending logit.
    """
    B, L = logits.shape
    kk = min(k, L)
    vals, idx = torch.topk(logits.double(), kk, dim=-1)
    idx = torch.where(vals != -math.inf, idx, torch.full_like(idx, -1)).int()
    if kk < k:
        idx = torch.cat([idx, torch.full((B, k - kk), -1, dtype=torch.int32, device=idx.device)], 1)
    return idx


def topk_positions(logits, k: int):
    """The k largest logits per row that are not -inf, as positions in ascending order, ties at
    the k-th value going to the lower positions, a NaN above every number (as torch.topk); -1
    after them when a row has fewer than k such logits. int32 [B, k]. The exact contract of the
    Triton indexer's top-k (kernels/indexer/topk.py), by a stable sort in float64 (which puts NaN
    first when descending)."""
    B, L = logits.shape
    x = logits.double().cpu()
    out = torch.full((B, k), -1, dtype=torch.int32)
    for b in range(B):
        pos = torch.nonzero(x[b] != -math.inf).flatten()
        order = torch.sort(x[b, pos], descending=True, stable=True).indices[:k]   # stable: lower position first
        chosen = torch.sort(pos[order]).values
        out[b, :len(chosen)] = chosen.int()
    return out.to(logits.device)


def flash_mla_sparse_decode(q, cache: KVCache, indices, topk_len=None, attn_sink=None, sm_scale=None,
                            extra_cache: KVCache | None = None, extra_indices=None, extra_topk_len=None):
    """Decode over two caches at once (SGLang's window + compressed caches), in float64: one
    softmax over the union of both caches' valid tokens, plus the sink in its denominator.
    q [B,H,512]; caches: KVCache or SGLang's raw fp8 page views (cache.as_kv_cache); indices
    [B,K] or [B,1,K]; returns (out float32 [B,H,512], lse float32 [B,H])."""
    B, H, D = q.shape
    scale = D ** -0.5 if sm_scale is None else float(sm_scale)
    parts = [(as_kv_cache(cache), indices, topk_len)]
    if extra_cache is not None:
        parts.append((as_kv_cache(extra_cache, "extra_cache"), extra_indices, extra_topk_len))
    scores, values = [], []
    for c, idx, tl_ in parts:
        idx = idx.reshape(B, -1)
        valid = idx >= 0
        if tl_ is not None:
            valid &= torch.arange(idx.shape[1], device=q.device)[None, :] < tl_.to(q.device).long()[:, None]
        kv = _gather(c, idx, valid)
        s = torch.einsum("bhd,bkd->bhk", q.double(), kv) * scale
        scores.append(s.masked_fill(~valid[:, None, :], -math.inf))
        values.append(kv)
    s = torch.cat(scores, dim=-1)
    kv = torch.cat(values, dim=1)
    lse = torch.logsumexp(s, dim=-1)
    if attn_sink is not None:
        lse = torch.logaddexp(lse, attn_sink.to(q.device).double()[None, :].expand(B, H))
    p = torch.exp(s - lse[..., None].nan_to_num(neginf=0.0)).nan_to_num(0.0)
    out = torch.einsum("bhk,bkd->bhd", p, kv)
    return out.float(), lse.float()
