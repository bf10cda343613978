"""impl "reference" of the sparse decode: the float64 judge (dsv4lab.reference), registered beside the
kernels it judges. It takes every argument the kernels take, through the same device-side guard as the
code the lab does not own (kernels/guards.py), and keeps the same non-finite contract."""
from __future__ import annotations

import torch

from ... import reference
from ...registry import register
from ..guards import peer_rows, sanitize_decode


@register("sparse_decode", "reference", description="float64, the judge (dsv4lab.reference)", graph_safe=False)
def sparse_decode_reference(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    indices, topk_len = sanitize_decode(indices, topk_len, attn_sink, cache.num_tokens)
    out, lse = peer_rows(*reference.sparse_decode_float64(q, cache, indices, topk_len, sm_scale), indices, topk_len)
    if attn_sink is not None:
        out, lse = reference.sink_float64(out, lse, attn_sink)
    return out.to(torch.bfloat16), lse.float()
