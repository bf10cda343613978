"""S2's kernel, split-K: more programs for small batches, merged by log-sum-exp.

At batch 1 the head-batched grid has B * H / BLOCK_H programs (1 for H=64, BLOCK_H=64) on a
chip with 132 SMs. Split the top-k row into NSPLIT slices: each program runs the head-batched
kernel's body (head_batched._head_batched_kernel with SPLIT) on its slice and writes a partial (o_i in
bf16 on the GPU, fp32 in the interpreter; lse_i fp32); a second launch merges them:

    lse = log(sum_i exp(lse_i)),   o = sum_i exp(lse_i - lse) * o_i

Slices with no valid token have lse_i = -inf and weigh 0; a row with none at all gives o = 0,
lse = -inf; the sink is applied once, after the merge. NSPLIT depends only on (B, H, K) and the
SM count (planning.py beside it), never on data, and the workspace is kept per shape for each caller (per
thread and stream) and allocated afresh in a CUDA-graph capture (dsv4lab.concurrency), so both
launches capture in a CUDA graph and concurrent callers never read each other's partials. ``splitk_auto`` picks tiles and NSPLIT (1 = the head-batched
launch alone) with the launch-time model in planning.plans; it is the replay's S2, and what ``auto``
runs wherever the Hopper kernel does not (auto.py).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ... import errors
from ...config import HEAD_DIM
from ...registry import register
from .. import buffers
from ..buffers import alloc, finish, out_dtype
from ..launch import cdiv, launch_kernel, next_power_of_2
from ..rows import NONFINITE_FLAG, SINK_FLAG
from . import head_batched
from .planning import Launch, choose, choose_split, launch_of_plan, per_shape


@triton.jit
def merge_partials(O_PART, LSE_PART, SINK, O, LSE, ERR, b, heads, hmask, H, nsplit,
                   stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
                   HAS_SINK: tl.constexpr, SPLIT_P2: tl.constexpr, DCHUNK: tl.constexpr, D: tl.constexpr):
    """Split-K's merge for the rows ``heads`` of batch ``b``, by log-sum-exp:

        lse = log(sum_i exp(lse_i)),   o = sum_i exp(lse_i - lse) * o_i

    Splits with lse_i = -inf (no valid token) weigh 0; a row with none at all gives o = 0,
    lse = -inf; the sink is applied once, here. A row with a NaN partial lse (a slice that could not
    be computed) or a non-finite output is NaN in lse too, never "no token". All NSPLIT partials of a
    column chunk are loaded in one [heads, splits, DCHUNK] tensor so the loads overlap. Loads bypass
    L1 (.cg). A non-finite sink or output sets its bit in the error word ERR (dsv4lab.errors)."""
    s = tl.arange(0, SPLIT_P2)
    smask = s < nsplit
    lse_i = tl.load(LSE_PART + (b * H + heads)[:, None] * nsplit + s[None, :],
                    mask=hmask[:, None] & smask[None, :], other=float("-inf"), cache_modifier=".cg")
    bad = tl.max((lse_i != lse_i).to(tl.int32), axis=1) > 0         # a NaN partial: the row cannot be computed
    m = tl.max(lse_i, axis=1)
    has = m > float("-inf")
    w = tl.where(lse_i > float("-inf"), tl.exp(lse_i - tl.where(has, m, 0.0)[:, None]), 0.0)
    wsum = tl.where(has, tl.sum(w, axis=1), 1.0)
    lse = tl.where(has, m + tl.log(wsum), float("-inf"))
    scale = 1.0 / wsum
    flags = tl.full([], 0, tl.int32)
    if HAS_SINK:
        sink = tl.load(SINK + heads, mask=hmask, other=0.0).to(tl.float32)
        flags |= tl.where(tl.min((tl.abs(sink) < float("inf")).to(tl.int32), axis=0) == 1, 0, SINK_FLAG)
        new_lse = tl.where(has, tl.maximum(lse, sink) + tl.log(1.0 + tl.exp(-tl.abs(lse - sink))), sink)
        scale = scale * tl.exp(lse - new_lse)
        lse = new_lse
    w = w * scale[:, None]
    for c in tl.static_range(0, D, DCHUNK):
        col = c + tl.arange(0, DCHUNK)
        cmask = col < D
        o_i = tl.load(O_PART + b * stride_pb + heads[:, None, None] * stride_ph + s[None, :, None] * stride_ps
                      + col[None, None, :], mask=hmask[:, None, None] & smask[None, :, None] & cmask[None, None, :],
                      other=0.0, cache_modifier=".cg")
        out = tl.where(bad[:, None], float("nan"), tl.sum(w[:, :, None] * o_i, axis=1))
        finite = (tl.abs(out) < float("inf")) | ~(hmask[:, None] & cmask[None, :])
        bad |= tl.min(finite.to(tl.int32), axis=1) == 0
        tl.store(O + b * stride_ob + heads[:, None] * stride_oh + col[None, :], out.to(O.dtype.element_ty),
                 mask=hmask[:, None] & cmask[None, :])
    flags |= tl.where(tl.max(bad.to(tl.int32), axis=0) > 0, NONFINITE_FLAG, 0)
    tl.store(LSE + b * H + heads, tl.where(bad, float("nan"), lse), mask=hmask)
    tl.atomic_or(ERR, flags, mask=flags != 0)


@triton.jit
def _combine_kernel(O_PART, LSE_PART, SINK, O, LSE, ERR, H, NSPLIT,
                    stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
                    HAS_SINK: tl.constexpr, SPLIT_P2: tl.constexpr, D: tl.constexpr,
                    HEADS: tl.constexpr = 1, DCHUNK: tl.constexpr = HEAD_DIM, USE_GDC: tl.constexpr = False):
    """The merge as its own launch: program (b, j) merges heads j*HEADS .. j*HEADS+HEADS-1 of row b."""
    if USE_GDC:
        tl.extra.cuda.gdc_wait()      # launched early (PDL): wait until the partials are written
    b = tl.program_id(0)
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    merge_partials(O_PART, LSE_PART, SINK, O, LSE, ERR, b, heads, heads < H, H, NSPLIT,
                   stride_pb, stride_ph, stride_ps, stride_ob, stride_oh, HAS_SINK, SPLIT_P2, DCHUNK, D)


#: the combine launch: one head a program, 4 warps for fp32 partials (combine_warps)
COMBINE_HEADS = 1
COMBINE_WARPS = 4


def merge_chunk(heads: int, split_p2: int, num_warps: int, d: int = HEAD_DIM, per_thread: int = 32) -> int:
    """merge_partials' column chunk: a program holds heads x SPLIT_P2 x DCHUNK partial values at a
    time, sized to ~per_thread a thread (at least 16 columns). All factors are powers of two, so
    the chunk is one too and divides D."""
    for name, v in (("heads", heads), ("split_p2", split_p2), ("num_warps", num_warps)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    return max(16, min(d, per_thread * 32 * num_warps // (heads * split_p2)))


def combine_warps(partials: torch.dtype) -> int:
    """Warps of the combine launch: COMBINE_WARPS for fp32 partials, half for bf16. Triton loads 16
    bytes a thread, so 4 warps cover a 512-wide fp32 row but two bf16 rows; the sum over slices
    then crosses warps (shared memory and barriers) instead of staying in each thread's registers."""
    return max(1, COMBINE_WARPS * partials.itemsize // 4)


def combine(o_part, lse_part, attn_sink, out, lse, *, pdl=False, heads=None, num_warps=None, kernel=None):
    """The merge's launch. ``kernel``: a jitted kernel with _combine_kernel's signature to launch instead
    (notebook 03's own copy)."""
    B, H, nsplit, D = o_part.shape
    grid, consts = _combine_args(B, H, nsplit, D, o_part.dtype, attn_sink is not None, pdl, heads, num_warps)
    sp, so = o_part.stride(), out.stride()
    launch_kernel(kernel or _combine_kernel, grid, (
        o_part, lse_part, attn_sink if attn_sink is not None else lse, out, lse, errors.word(out.device)),
        (H, nsplit, sp[0], sp[1], sp[2], so[0], so[1]), consts)


@functools.lru_cache(maxsize=1024)
def _combine_args(B, H, nsplit, D, partials: torch.dtype, has_sink, pdl, heads, num_warps):
    """(grid, constexprs and launch options) of the combine: shapes only, decided once per shape."""
    heads = heads or COMBINE_HEADS
    num_warps = num_warps or combine_warps(partials)
    split_p2 = next_power_of_2(nsplit)
    vec = 16 // partials.itemsize                  # elements a thread loads at once
    # a slice's chunk spans every thread, so the sum over slices stays in registers (not shared memory)
    dchunk = max(merge_chunk(heads, split_p2, num_warps, D, per_thread=128 // partials.itemsize),
                 min(D, 32 * num_warps * vec // heads))
    return (B, cdiv(H, heads)), dict(HAS_SINK=has_sink, SPLIT_P2=split_p2, D=D, HEADS=heads, DCHUNK=dchunk,
                                     num_warps=num_warps, **(dict(USE_GDC=True, launch_pdl=True) if pdl else {}))


def workspace(B, H, nsplit, device, partials: str = "float32", *, poison: bool = False):
    """Partials (o [B, H, NSPLIT, 512] in ``partials``, lse [B, H, NSPLIT] fp32): the caller's own,
    kept per shape and reused on its every call; fresh while a CUDA graph is captured
    (buffers.workspaces)."""
    ws = buffers.workspaces(("split_k", B, H, nsplit, partials, device), device, lambda: (
        torch.empty((B, H, nsplit, HEAD_DIM), dtype=getattr(torch, partials), device=device),
        torch.empty((B, H, nsplit), dtype=torch.float32, device=device)))
    if poison:
        buffers.poison_all(*ws)
    return ws


def partials_for(B, H, nsplit, device, partials: str):
    """The workspace of one split launch; under testing.poisoned() refilled with NaN first, so a
    partial the split launch forgets to write fails the check."""
    return workspace(B, H, nsplit, device, partials, poison=True)


def run(q, cache, indices, topk_len, sm_scale, attn_sink, opts: Launch, *, combine_kernel=None, combine_heads=None):
    """The tuned head-batched kernel on ``opts.nsplit`` slices of each top-k row, then the merge.
    With nsplit == 1 the kernel writes the answer directly (no workspace, no combine).
    ``combine_kernel`` / ``combine_heads``: the merge's kernel and heads a program (``combine``)."""
    B, H, D = q.shape
    q = q.contiguous()
    indices = indices.contiguous()
    out = alloc((B, H, D), out_dtype(), q.device)
    lse = alloc((B, H), torch.float32, q.device)
    if opts.nsplit == 1:
        head_batched.launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, opts)
        return finish(out), lse
    o_part, lse_part = partials_for(B, H, opts.nsplit, q.device, opts.partials)
    head_batched.launch(q, cache, indices, topk_len, sm_scale, None, o_part, lse_part, opts)
    combine(o_part, lse_part, attn_sink, out, lse, pdl=opts.pdl, heads=combine_heads, kernel=combine_kernel)
    return finish(out), lse


@per_shape
def splitk_launch(B: int, H: int, K: int) -> Launch:
    """impl "splitk": always at least 2 slices (when K allows), so it always exercises the merge."""
    return launch_of_plan(choose_split(B, H, K))


@per_shape
def auto_launch(B: int, H: int, K: int) -> Launch:
    """impl "splitk_auto": the plan with the smallest modeled time, either tile entry, NSPLIT >= 1."""
    return launch_of_plan(choose(B, H, K))


@register("sparse_decode", "splitk", stage="S2", tags=("recorded", "tensor_core"), launch=splitk_launch,
          description="split-K: slices of the top-k row + an LSE merge",
          max_scale_byte=lambda B, H, K: head_batched.max_scale_byte(splitk_launch(B, H, K)))
def sparse_decode_splitk(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    return run(q, cache, indices, topk_len, sm_scale, attn_sink, splitk_launch(q.shape[0], q.shape[1], indices.shape[1]))


@register("sparse_decode", "splitk_auto", stage="S2", tags=("recorded", "tensor_core"), launch=auto_launch,
          description="split-K with tiles and NSPLIT picked per shape by the launch-time model",
          max_scale_byte=lambda B, H, K: head_batched.max_scale_byte(auto_launch(B, H, K)))
def sparse_decode_splitk_auto(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    return run(q, cache, indices, topk_len, sm_scale, attn_sink, auto_launch(q.shape[0], q.shape[1], indices.shape[1]))
