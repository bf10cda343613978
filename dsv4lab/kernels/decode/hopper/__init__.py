"""A Hopper-native sparse decode kernel in Gluon: a producer warp group gathers and dequantizes,
two consumer warp groups run wgmma and the online softmax.

Written in Triton's Gluon dialect (``triton.experimental.gluon``, the API of triton 3.6), where the
kernel states what Triton's ``tl.dot`` lowering decides on its own: shared-memory buffers and their
layouts, mbarriers between warp groups, asynchronous wgmma, registers per warp group. One program
owns 64 heads of one request (or one slice of its top-k row, for split-K) and runs two partitions
at once (``gl.warp_specialize``):

* **producer** (1 warp group, few registers): for each tile of BLOCK_N tokens, load the indices,
  gather the tokens' bytes with 16-byte loads (fp8 nope, the UE8M0 scale bytes, bf16 rope),
  dequantize to bf16 with integer ops (``kv_tiles.E4M3_TO_BF16_ASM``), store the [BLOCK_N, 512] tile
  into a ring of NUM_BUF shared-memory buffers, and arrive on the buffer's ``ready`` mbarrier.
  It waits on the buffer's ``empty`` mbarrier before overwriting it, after it has issued the next
  tile's loads, so the gather of tile i+1 overlaps the consumers' work on tile i.
* **consumers** (the default partition, 2 warp groups): S = Q K^T with wgmma (Q stays in shared
  memory for the whole row, K is the ring buffer seen transposed), mask, base-2 online softmax
  with the softmax scale folded into exp2's argument, O += P V with P from registers and V = K the
  same buffer, then arrive on ``empty``. The [64, 512] fp32 accumulator is split by columns across
  the two warp groups (128 registers a thread each).

Shapes-only launch (CUDA-graph safe): grid (B, ceil(H / 64), NSPLIT). With NSPLIT > 1 each program
writes a bf16 partial and split_k.combine merges them (the lab's combine launch, as split-K does,
with PDL by the same rule).
The design, the byte and cycle budget and what is left to do are in
experiments/hopper_decode/README.md. Gluon has no interpreter: on CPU this impl refuses with a
ValueError; it is registered with needs=("gpu", "sm_90"), and ``auto`` picks it where it can run and
measured faster (auto.py).
"""
from __future__ import annotations

import functools

import torch
import triton

from .... import errors
from ....config import NOPE_DIM
from ....device import info, is_interpret, mode
from ....registry import register
from ...buffers import alloc, finish
from ...launch import launch_kernel
from ...rows import token_limit
from .. import split_k
from ..kv_tiles import LOG2E, MAX_SCALE_BYTE, cache_views
from .. import planning
from ..planning import MAX_SPLIT
from .kernel import GLUON_ERROR, _hopper_decode_kernel

#: tile and pipeline choices of the launch (see the README's budget): 64 heads a program (one
#: wgmma M), 64 tokens a tile, two ring buffers (Q 64 KB + 2 x 64 KB of shared memory)
BLOCK_H = 64
BLOCK_N = 64
NUM_BUF = 2
CHUNK = 16                  # tokens the producer gathers and dequantizes at a time (32 would not fit its registers)
NUM_WARPS = 8               # the consumers (default partition): two warp groups
PRODUCER_WARPS = 4
PRODUCER_REGS = 104         # setmaxnreg for the producer warp group (96: its indices carried ahead spill)
MAXNREG = 168               # 12 warps x 32 x 168 <= 65536: the consumers get what the producer gives up


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """Why this process cannot run the kernel, or None when it can (CUDA, sm_90, Gluon); asked once
    (the process's mode and device do not change), so an eager call does not pay for it."""
    if GLUON_ERROR is not None:
        return f"triton.experimental.gluon could not be imported ({GLUON_ERROR})"
    if is_interpret() or mode() != "cuda":
        return (f"this process runs {mode()} mode; the kernel is written in Gluon, which Triton's CPU "
                f"interpreter cannot run")
    cap = info().capability
    if cap != "9.0":
        return f"it uses Hopper's wgmma, warp specialization and setmaxnreg (sm_90); this GPU is sm_{cap}"
    return None


def nsplit_for(B: int, H: int, K: int, sms: int) -> int:
    """Slices of the top-k row: enough programs to cover the SMs once (one program per SM: the
    ring and Q take ~200 KB of shared memory), never a slice shorter than a tile. Shapes only."""
    programs = B * triton.cdiv(H, BLOCK_H)
    return max(1, min(triton.cdiv(K, BLOCK_N), sms // programs, MAX_SPLIT))


def pdl_for(B: int, H: int, nsplit: int, sms: int) -> bool:
    """The combine as a programmatic dependent launch where the split grid leaves at least half the
    SMs idle (its programs wait on SMs nobody else needs): the lab's rule for split-K
    (planning.launch_for, measured there: B = 1 13.8 -> 13.0 us, slower on fuller grids)."""
    return nsplit > 1 and 2 * B * triton.cdiv(H, BLOCK_H) * nsplit <= sms and planning.pdl_supported()


def launch_args(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, nsplit: int, pdl: bool = False,
                trace=None) -> tuple:
    """(grid, tensors, scalars, constexprs and options) of one launch (see :func:`launch`); ``trace``:
    the clocks' buffer of a traced launch (experiments/hopper_decode), else the kernel's TRACE pointer
    is a dummy it never reads."""
    B, H, D = q.shape
    K = indices.shape[1]
    if nsplit > 1 and attn_sink is not None:
        raise ValueError("attn_sink: a split launch writes partials; the sink is applied by the merge")
    split_len = triton.cdiv(triton.cdiv(K, nsplit), BLOCK_N) * BLOCK_N
    _, u8, bf16 = cache_views(cache)
    tensors = (q, u8, bf16, indices, topk_len if topk_len is not None else lse,
               attn_sink if attn_sink is not None else lse, out, lse, errors.word(q.device),
               trace if trace is not None else lse)
    scalars = (sm_scale * LOG2E, K, H, split_len, token_limit(cache), q.stride(0), q.stride(1), indices.stride(0),
               out.stride(0), out.stride(1), out.stride(2) if nsplit > 1 else 0)
    consts = _consts(cache.page_size, cache.page_bytes, topk_len is not None, attn_sink is not None, D, pdl)
    return (B, triton.cdiv(H, BLOCK_H), nsplit), tensors, scalars, consts


def launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, nsplit: int, pdl: bool = False):
    """One launch of the kernel. nsplit > 1: ``out`` / ``lse`` are the partial workspaces
    [B, H, NSPLIT, 512] (bf16) / [B, H, NSPLIT] and ``attn_sink`` must be None (the merge applies it).
    ``pdl``: the kernel lets a programmatic dependent launch (the combine) start early."""
    grid, tensors, scalars, consts = launch_args(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, nsplit, pdl)
    return launch_kernel(_hopper_decode_kernel, grid, tensors, scalars, consts)


@functools.lru_cache(maxsize=256)
def _consts(page_size, page_bytes, has_topk_len, has_sink, D, pdl) -> dict:
    """The constexprs and launch options of one launch, one dict object per set (launch_kernel keys
    its cache of launchers by the dict's identity)."""
    return dict(PAGE_SIZE=page_size, PAGE_BYTES=page_bytes, HAS_TOPK_LEN=has_topk_len, HAS_SINK=has_sink,
                BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, NUM_BUF=NUM_BUF, CHUNK=CHUNK, PRODUCER_WARPS=PRODUCER_WARPS,
                PRODUCER_REGS=PRODUCER_REGS, D=D, NOPE=NOPE_DIM, num_warps=NUM_WARPS, maxnreg=MAXNREG,
                LAUNCH_DEPENDENTS=pdl, TRACED=False, ABLATE=0)


@functools.lru_cache(maxsize=1024)
def _plan(B: int, H: int, K: int) -> tuple:
    """(NSPLIT, PDL) for a shape on this device: shapes only, decided once per shape."""
    sms = info().sm_count
    nsplit = nsplit_for(B, H, K, sms)
    return nsplit, pdl_for(B, H, nsplit, sms)


@register("sparse_decode", "hopper", tags=("tensor_core", "beyond_story"), available=unavailable_reason,
          heads=lambda B, H, K: min(H, BLOCK_H),
          description="Gluon, sm_90: producer warp group (gather + dequant) and two wgmma consumer warp groups",
          needs=("gpu", "sm_90"), max_scale_byte=lambda B, H, K: MAX_SCALE_BYTE)
def sparse_decode_hopper(q, cache, indices, *, topk_len, sm_scale, attn_sink, nsplit: int | None = None):
    """``nsplit``: slices of the top-k row (default nsplit_for's rule), for A/B runs."""
    if nsplit is not None and not 1 <= nsplit <= MAX_SPLIT:
        raise ValueError(f"nsplit must lie in [1, {MAX_SPLIT}], got {nsplit}")
    why = unavailable_reason()
    if why is not None:
        raise ValueError(f"impl='hopper' needs a CUDA GPU with sm_90 (Hopper) and triton's Gluon: {why}. "
                         f"Use impl='auto' instead")
    B, H, D = q.shape
    q = q.contiguous()
    if nsplit is None:
        nsplit, pdl = _plan(B, H, indices.shape[1])
    else:
        pdl = pdl_for(B, H, nsplit, info().sm_count)
    out = alloc((B, H, D), torch.bfloat16, q.device)
    lse = alloc((B, H), torch.float32, q.device)
    if nsplit == 1:
        launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, 1)
        return finish(out), lse
    o_part, lse_part = split_k.partials_for(B, H, nsplit, q.device, "bfloat16")
    launch(q, cache, indices, topk_len, sm_scale, None, o_part, lse_part, nsplit, pdl)
    split_k.combine(o_part, lse_part, attn_sink, out, lse, pdl=pdl)
    return finish(out), lse
