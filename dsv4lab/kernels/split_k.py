"""Stage 3, split-K: more programs for small batches, merged by log-sum-exp.

At batch 1 the head-batched grid has B * H / BLOCK_H programs (1 for H=64,
BLOCK_H=64) on a chip with 132 SMs. Split the top-k row into NSPLIT slices:
each program runs the stage-2 kernel body on its slice and writes an fp32
partial (o_i, lse_i); a combine kernel merges them:

    lse = log(sum_i exp(lse_i)),   o = sum_i exp(lse_i - lse) * o_i

Slices with no valid token have lse_i = -inf and weigh 0; a row with none at all
gives o = 0, lse = -inf; the sink is applied once, after the merge.
NSPLIT depends only on (B, H, K) and the SM count, never on data, and the
workspace is allocated once per shape, so both launches capture in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..api import register
from ..device import info, is_interpret
from . import common, head_batched
from .common import alloc, finish, out_dtype

#: programs per SM the split aims for: one full wave
WAVES = 1.0
MAX_SPLIT = 16


def sm_count() -> int:
    return 4 if is_interpret() else info().sm_count


def choose_nsplit(B: int, H: int, K: int, *, sms: int | None = None, cfg=None) -> int:
    """Slices per (batch, head block): enough programs for WAVES waves on the SMs, each slice
    a whole number of BLOCK_N tiles, at most MAX_SPLIT. Depends on shapes only (graph-safe)."""
    cfg = cfg or head_batched.tile_config(H, split=True)
    sms = sms or sm_count()
    base = B * triton.cdiv(H, cfg.block_h)
    tiles = triton.cdiv(K, cfg.block_n)
    want = triton.cdiv(int(sms * WAVES), base)
    n = max(1, min(want, MAX_SPLIT, tiles))
    return triton.cdiv(tiles, triton.cdiv(tiles, n))     # no empty trailing slice


@triton.jit
def _combine_kernel(O_PART, LSE_PART, SINK, O, LSE, H, NSPLIT,
                    stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
                    HAS_SINK: tl.constexpr, SPLIT_P2: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, SPLIT_P2)
    smask = s < NSPLIT
    lse_i = tl.load(LSE_PART + (b * H + h) * NSPLIT + s, mask=smask, other=float("-inf"))
    m = tl.max(lse_i, axis=0)
    has = m > float("-inf")
    w = tl.where(lse_i > float("-inf"), tl.exp(lse_i - tl.where(has, m, 0.0)), 0.0)
    wsum = tl.sum(w, axis=0)
    col = tl.arange(0, D)
    o_i = tl.load(O_PART + b * stride_pb + h * stride_ph + s[:, None] * stride_ps + col[None, :],
                  mask=smask[:, None], other=0.0)
    out = tl.sum(w[:, None] * o_i, axis=0) / tl.where(has, wsum, 1.0)
    lse = tl.where(has, m + tl.log(tl.where(has, wsum, 1.0)), float("-inf"))
    if HAS_SINK:
        sink = tl.load(SINK + h).to(tl.float32)
        new_lse = tl.where(has, tl.maximum(lse, sink) + tl.log(1.0 + tl.exp(-tl.abs(lse - sink))), sink)
        out = out * tl.exp(lse - new_lse)
        lse = new_lse
    tl.store(O + b * stride_ob + h * stride_oh + col, out.to(O.dtype.element_ty))
    tl.store(LSE + b * H + h, lse)


_WORKSPACE: dict = {}


def workspace(B, H, nsplit, device):
    """fp32 partials (o [B,H,NSPLIT,512], lse [B,H,NSPLIT]), allocated once per shape."""
    key = (str(device), B, H, nsplit)
    if key not in _WORKSPACE:
        _WORKSPACE[key] = (torch.empty(B, H, nsplit, 512, dtype=torch.float32, device=device),
                           torch.empty(B, H, nsplit, dtype=torch.float32, device=device))
    return _WORKSPACE[key]


def sparse_decode_split(q, cache, indices, *, topk_len, sm_scale, attn_sink, nsplit=None, cfg=None):
    B, H, D = q.shape
    q = q.contiguous()
    indices = indices.contiguous()
    cfg = cfg or head_batched.tile_config(H, split=True)
    nsplit = nsplit or choose_nsplit(B, H, indices.shape[1], cfg=cfg)
    out = alloc((B, H, D), out_dtype(), q.device)
    lse = alloc((B, H), torch.float32, q.device)
    if nsplit == 1:   # nothing to merge: the stage-2 kernel (with its own tiles) writes the answer
        head_batched.launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse)
        return finish(out), lse
    o_part, lse_part = workspace(B, H, nsplit, q.device)
    if common._POISON[0]:
        o_part.fill_(float("nan"))
        lse_part.fill_(float("nan"))
    head_batched.launch(q, cache, indices, topk_len, sm_scale, None, o_part, lse_part,
                        nsplit=nsplit, cfg=cfg)
    _combine_kernel[(B, H)](
        o_part, lse_part, attn_sink if attn_sink is not None else lse, out, lse, H, nsplit,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), out.stride(0), out.stride(1),
        HAS_SINK=attn_sink is not None, SPLIT_P2=triton.next_power_of_2(nsplit), D=D, num_warps=4)
    return finish(out), lse


@register("sparse_decode", "splitk")
def sparse_decode_splitk(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    # always split (at least 2 slices) so that this impl exercises the merge path
    K = indices.shape[1]
    nsplit = max(2, choose_nsplit(q.shape[0], q.shape[1], K)) if K > 1 else 1
    return sparse_decode_split(q, cache, indices, topk_len=topk_len, sm_scale=sm_scale,
                               attn_sink=attn_sink, nsplit=nsplit)


@register("sparse_decode", "auto")
def sparse_decode_auto(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    """mma when one wave is already full (choose_nsplit == 1), else split-K."""
    return sparse_decode_split(q, cache, indices, topk_len=topk_len, sm_scale=sm_scale,
                               attn_sink=attn_sink)
