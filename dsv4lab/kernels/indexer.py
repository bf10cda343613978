"""Stage 5, a CUDA-graph-safe Triton indexer that pays for the live context, not the maximum.

Stage 4's torch path (indexer_gemm.py) gathers, dequantizes and multiplies
ceil(max_seq_len / 64) pages of every request on every decode step. Here the grid is
fixed by shapes only, (B, NPROG) with NPROG from the SM count, so one captured graph
serves every step; each program reads its request's ``seq_len`` on the device and walks
only the *live* pages p = pid, pid + NPROG, ... < ceil(seq_len / 64):

    k8 [64 tokens, 128] fp8 -> bf16 (exact), s = k8 @ q^T  (tl.dot, [64, H])
    logits = k_scale * sum_h w[h] * relu(s[:, h])      (the scale is > 0: it factors out)

Positions past ``seq_len`` get -inf: inside the last live page by a mask, beyond it by a
fill loop that stores -inf and reads nothing. Reads and FLOPs follow the live length;
only those 4-byte stores follow the maximum.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..api import register
from ..cache import INDEX_DIM, IndexKCache
from ..device import info, is_interpret
from .common import alloc, dot_dtype
from .indexer_gemm import topk_from_logits

#: positions one program sets to -inf per store in the dead region
FILL = 1024
#: programs per SM the grid aims at (small CTAs: 4 warps, one page of 64 tokens at a time)
PROGRAMS_PER_SM = 8
#: Triton's software pipelining depth for the page loop (3 is Triton's default)
NUM_STAGES = 3
#: the register pipeline over pages (the kernel's PREFETCH): the recorded run's choice on the H200,
#: 31.7 -> 29.7 us at B=32, max context 262208 (data/runs/h200/indexer.json, indexer_sweep2.json)
PREFETCH = True


@triton.jit
def _score_page(k, k_scale, q, w, row, p, t, seq, max_seq_len, PAGE: tl.constexpr):
    """Logits of one page: k [PAGE, D] (dot dtype), stored at positions p*PAGE + t, -inf past seq."""
    s = tl.maximum(tl.dot(k, tl.trans(q)), 0.0)            # [PAGE, HP]; padded heads have w = 0
    logit = tl.sum(s * w[None, :], axis=1) * k_scale
    pos = p * PAGE + t
    tl.store(row + pos, tl.where(pos < seq, logit, float("-inf")), mask=pos < max_seq_len)


@triton.jit
def _indexer_kernel(Q, W, KV_U8, KV_F32, SEQ, PT, OUT, max_seq_len,
                    stride_qb, stride_qh, stride_wb, stride_pb, stride_ob,
                    H: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    FILL: tl.constexpr, DOT: tl.constexpr, PREFETCH: tl.constexpr = False):
    b = tl.program_id(0).to(tl.int64)                      # b * stride_ob passes 2^31 at B x 1M context
    pid = tl.program_id(1)
    nprog = tl.num_programs(1)
    seq = tl.maximum(tl.minimum(tl.load(SEQ + b), max_seq_len), 0)   # range checks are off under capture
    live_pages = (seq + PAGE - 1) // PAGE
    h = tl.arange(0, HP)
    d = tl.arange(0, D)
    t = tl.arange(0, PAGE)
    q = tl.load(Q + b * stride_qb + h[:, None] * stride_qh + d[None, :], mask=h[:, None] < H, other=0.0).to(DOT)
    w = tl.load(W + b * stride_wb + h, mask=h < H, other=0.0).to(tl.float32)
    row = OUT + b * stride_ob
    PAGE_BYTES: tl.constexpr = PAGE * (D + 4)              # [64 x 128 fp8 | 64 fp32 scales]
    pt = PT + b * stride_pb
    if PREFETCH:
        # Software pipeline in registers: the next page's keys (16 registers a thread) and the
        # page id after it are loaded before this page's dot, so a page waits on neither the
        # page-table load nor the dependent key load that follows it.
        last = tl.maximum(live_pages - 1, 0)               # clamped page-table reads stay in the row
        id_next = tl.load(pt + tl.minimum(pid + nprog, last)).to(tl.int64)
        page = tl.load(pt + tl.minimum(pid, last)).to(tl.int64)
        live = (t * 0 + pid) < live_pages                  # a [PAGE] mask: the interpreter wants tensors
        k_next = tl.load(KV_U8 + page * PAGE_BYTES + t[:, None] * D + d[None, :], mask=live[:, None], other=0)
        sc_next = tl.load(KV_F32 + (page * PAGE_BYTES + PAGE * D) // 4 + t, mask=live, other=0.0)
        for p in range(pid, live_pages, nprog):
            k = k_next.to(tl.float8e4nv, bitcast=True).to(DOT)
            k_scale = sc_next
            pn = p + nprog
            live = (t * 0 + pn) < live_pages
            k_next = tl.load(KV_U8 + id_next * PAGE_BYTES + t[:, None] * D + d[None, :], mask=live[:, None], other=0)
            sc_next = tl.load(KV_F32 + (id_next * PAGE_BYTES + PAGE * D) // 4 + t, mask=live, other=0.0)
            id_next = tl.load(pt + tl.minimum(pn + nprog, last)).to(tl.int64)
            _score_page(k, k_scale, q, w, row, p, t, seq, max_seq_len, PAGE)
    else:
        for p in range(pid, live_pages, nprog):            # live pages only: the early exit
            base = tl.load(pt + p).to(tl.int64) * PAGE_BYTES
            k = tl.load(KV_U8 + base + t[:, None] * D + d[None, :]).to(tl.float8e4nv, bitcast=True).to(DOT)
            k_scale = tl.load(KV_F32 + (base + PAGE * D) // 4 + t)
            _score_page(k, k_scale, q, w, row, p, t, seq, max_seq_len, PAGE)
    f = tl.arange(0, FILL)
    for s0 in range(live_pages * PAGE + pid * FILL, max_seq_len, nprog * FILL):
        tl.store(row + s0 + f, float("-inf"), mask=s0 + f < max_seq_len)


def grid(B: int, max_seq_len: int, page_size: int = 64) -> tuple[int, int]:
    """(B, NPROG): about PROGRAMS_PER_SM programs per SM in all, at most one per page of the
    maximum context. Shapes only: the same launch for every step of a captured graph."""
    max_pages = -(-max_seq_len // page_size)
    sms = 2 if is_interpret() else info().sm_count
    return B, max(1, min(max_pages, -(-PROGRAMS_PER_SM * sms // B)))


def logits_triton(q, index_cache: IndexKCache, weights, seq_lens, page_table, max_seq_len: int, *, nprog=None,
                  num_stages=NUM_STAGES, prefetch=None):
    B, H, D = q.shape
    if H > 128:
        raise ValueError(f"the Triton indexer holds all heads in one tile: q may have at most 128 heads, got {H}")
    if q.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise TypeError(f"impl='triton' takes q in bfloat16 or float8_e4m3fn (the model's; exact on the tensor "
                        f"cores), got {q.dtype}: cast it (q.to(torch.bfloat16) rounds it) or use impl='torch_fp32'")
    if nprog is not None and nprog < 1:
        raise ValueError(f"nprog must be >= 1, got {nprog}")
    out = alloc((B, max_seq_len), torch.float32, q.device)
    raw = index_cache.kv.reshape(-1)
    g = grid(B, max_seq_len, index_cache.page_size)
    if nprog is not None:
        g = (B, nprog)
    _indexer_kernel[g](
        q, weights, raw, raw.view(torch.float32), seq_lens, page_table, out, max_seq_len,
        q.stride(0), q.stride(1), weights.stride(0), page_table.stride(0), out.stride(0),
        H=H, HP=max(16, triton.next_power_of_2(H)), D=D, PAGE=index_cache.page_size, FILL=FILL, DOT=dot_dtype(),
        PREFETCH=PREFETCH if prefetch is None else prefetch,
        num_warps=4, num_stages=num_stages)
    return out


@register("indexer_logits", "triton", stage="S4", description="the Triton indexer: live pages only")
def _logits(q, index_cache, weights, seq_lens, page_table, *, max_seq_len):
    return logits_triton(q.contiguous(), index_cache, weights.contiguous(), seq_lens.contiguous(), page_table.contiguous(),
                         max_seq_len)


@register("indexer_topk", "triton", stage="S4", description="the Triton indexer: live pages only")
def _topk(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, topk):
    return topk_from_logits(_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len=max_seq_len), topk)


assert INDEX_DIM == 128
