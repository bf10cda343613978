"""Stage 2, head-batched tensor cores: gather each KV tile once, reuse it for BLOCK_H heads.

Grid (B, cdiv(H, BLOCK_H)[, NSPLIT]). A program gathers BLOCK_N tokens into one
dequantized [BLOCK_N, 512] tile (fp8 nope * UE8M0 scale | bf16 rope: the 448+64
split disappears in the gather, so both products are exactly 512 wide), then

    S = Q[BLOCK_H, 512] @ K^T      (tl.dot, tensor cores)
    online softmax on S in fp32, base 2
    O += P[BLOCK_H, BLOCK_N] @ K   (tl.dot; K = V in MLA)

The KV bytes are read once per head block instead of once per head.
The same kernel body serves stage 3 (split-K): with SPLIT it handles one slice
of the top-k row and writes partials (bf16 by default on the GPU, or fp32) for the combine kernel in
split_k.py, or, with MERGE, the last slice of each row to finish merges them itself.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from ..api import register
from ..device import info, is_interpret
from .common import (LOG2E, MAX_SCALE_BYTE, alloc, cache_views, coop_columns, coop_merge_share, dequant_kv, dot_dtype,
                     finish, gather_kv_tile, load_kv_raw, merge_chunk, merge_partials, out_dtype, prefetch_kv_l2,
                     prefetch_kv_l2_bulk, trace_point, use_pdl)


@triton.jit
def _attend_tile(q, kv, valid, m_i, l_i, acc, qk_scale, LAZY_RESCALE: tl.constexpr, FOLD_SCALE: tl.constexpr = False):
    """One tile of online softmax: S = q @ kv^T, rescale, acc += P @ kv (kv = K = V)."""
    s = _tile_scores(q, kv, valid, qk_scale, FOLD_SCALE)
    return _tile_update(s, kv, m_i, l_i, acc, qk_scale, LAZY_RESCALE, FOLD_SCALE)


@triton.jit
def _tile_scores(q, kv, valid, qk_scale, FOLD_SCALE: tl.constexpr):
    """S = q @ kv^T [BLOCK_H, BLOCK_N], -inf where ~valid; in log2 units unless FOLD_SCALE
    (then unscaled: _tile_update applies qk_scale inside exp2's fused multiply-add)."""
    if FOLD_SCALE:
        return tl.where(valid[None, :], tl.dot(q, tl.trans(kv)), float("-inf"))
    s = tl.dot(q, tl.trans(kv)) * qk_scale
    return tl.where(valid[None, :], s, float("-inf"))


@triton.jit
def _tile_update(s, kv, m_i, l_i, acc, qk_scale, LAZY_RESCALE: tl.constexpr, FOLD_SCALE: tl.constexpr):
    """Online softmax on one tile's scores s, then acc += P @ kv. FOLD_SCALE: the row max is
    taken on the unscaled S (qk_scale > 0) and the scale is applied inside exp2's argument,
    s * qk_scale - m, one fused multiply-add instead of a multiply and a subtract (the running
    max m_i is in scaled units either way)."""
    if FOLD_SCALE:
        m_tile = tl.max(s, axis=1) * qk_scale
    else:
        m_tile = tl.max(s, axis=1)
    if LAZY_RESCALE:
        # FlashAttention-3's trick: keep a stale running max unless a row's max grows by
        # more than 2^8; p <= 256 stays exact enough in fp32 and the [BLOCK_H, 512]
        # rescale of acc is skipped on almost every tile.
        grow = m_tile > m_i + 8.0
        if tl.sum(grow.to(tl.int32), axis=0) > 0:
            m_new = tl.where(grow, m_tile, m_i)
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
    else:
        m_new = tl.maximum(m_i, m_tile)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha
        acc = acc * alpha[:, None]
        m_i = m_new
    if FOLD_SCALE:
        p = tl.math.exp2(s * qk_scale - m_i[:, None])
    else:
        p = tl.math.exp2(s - m_i[:, None])
    l_i = l_i + tl.sum(p, axis=1)
    acc = tl.dot(p.to(kv.dtype), kv, acc)          # accumulate in place: no second [BLOCK_H, 512]
    return m_i, l_i, acc


@triton.jit
def _head_batched_kernel(Q, KV_FP8, KV_U8, KV_BF16, IDX, TOPK_LEN, SINK, O, LSE,
                         qk_scale, K, H, split_len,
                         stride_qb, stride_qh, stride_ib, stride_ob, stride_oh, stride_os,
                         PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr,
                         HAS_TOPK_LEN: tl.constexpr, HAS_SINK: tl.constexpr, SPLIT: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                         D: tl.constexpr, NOPE: tl.constexpr, DOT: tl.constexpr,
                         LAZY_RESCALE: tl.constexpr = False, PREFETCH: tl.constexpr = 0,
                         LAUNCH_DEPENDENTS: tl.constexpr = False,
                         DEQUANT_BITS: tl.constexpr = False, FOLD_SCALE: tl.constexpr = False,
                         CNT=None, O_FINAL=None, LSE_FINAL=None, stride_fb=0, stride_fh=0,
                         MERGE: tl.constexpr = 0, SPLIT_P2: tl.constexpr = 1, DCHUNK: tl.constexpr = 64,
                         NCOL: tl.constexpr = 0, WAIT_PRIOR: tl.constexpr = False, TRACE=None):
    if WAIT_PRIOR:
        tl.extra.cuda.gdc_wait()                   # launched early (PDL): the previous kernel's results first
    if TRACE is not None:
        trace_point(TRACE, 0)                       # program start (after the PDL wait, if any)
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()      # let the combine kernel launch now (it waits on the GPU)
    b = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    col = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + col[None, :],
                mask=hmask[:, None], other=0.0).to(DOT)
    n_valid = K
    if HAS_TOPK_LEN:
        n_valid = tl.minimum(tl.load(TOPK_LEN + b), K)
    lo = 0
    hi = n_valid
    if SPLIT:
        lo = sp * split_len
        hi = tl.minimum(lo + split_len, n_valid)
    m_i = tl.full([BLOCK_H], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D], dtype=tl.float32)
    t = tl.arange(0, BLOCK_N)
    row = IDX + b * stride_ib
    if PREFETCH == 2:
        # Software pipeline in registers: the raw bytes of tile i+1 are loaded (not waited
        # on) before tile i is multiplied, its indices one tile earlier still, and tile i+1
        # is dequantized after tile i's P @ V is issued, so the scheduler can interleave
        # the conversions with the matrix instructions. Costs the registers of one raw tile.
        tok = tl.load(row + lo + t, mask=lo + t < hi, other=-1)
        valid = (lo + t < hi) & (tok >= 0)
        x, e, r = load_kv_raw(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D)
        kv = dequant_kv(x, e, r, NOPE, D, DOT, DEQUANT_BITS)
        tok_next = tl.load(row + lo + BLOCK_N + t, mask=lo + BLOCK_N + t < hi, other=-1)
        for start in range(lo, hi, BLOCK_N):
            valid_next = (start + BLOCK_N + t < hi) & (tok_next >= 0)
            x, e, r = load_kv_raw(KV_FP8, KV_U8, KV_BF16, tok_next, valid_next, PAGE_SIZE, PAGE_BYTES, NOPE, D)
            tok_next = tl.load(row + start + 2 * BLOCK_N + t, mask=start + 2 * BLOCK_N + t < hi, other=-1)
            m_i, l_i, acc = _attend_tile(q, kv, valid, m_i, l_i, acc, qk_scale, LAZY_RESCALE, FOLD_SCALE)
            if BLOCK_H < 64:
                if start + BLOCK_N < hi:
                    # no dequant of a tile past the slice: on a one-tile slice (split-K at small B)
                    # it would sit between the only tile and the stores (16x64: B=1 mma 37.5 -> 35.8
                    # us). Not on the 64-head tiles: the branch keeps the raw tile and kv live across
                    # it, and at 255 registers 64x32 then spills 428 B instead of 32 (compiler
                    # report; its sweep time went 71.0 -> 85.2 us at B=128, tiles.json 13:4xZ)
                    kv = dequant_kv(x, e, r, NOPE, D, DOT, DEQUANT_BITS)
            else:
                kv = dequant_kv(x, e, r, NOPE, D, DOT, DEQUANT_BITS)
            valid = valid_next
    elif PREFETCH == 1 or PREFETCH == 3:
        # Indices run two tiles ahead of the gather and the bytes of the next tile are
        # requested into L2 (GPU only) while this one is computed: a tile then waits on an
        # L2 hit instead of an index load followed by a dependent HBM gather.
        tok_next = tl.load(row + lo + t, mask=lo + t < hi, other=-1)
        tok_next2 = tl.load(row + lo + BLOCK_N + t, mask=lo + BLOCK_N + t < hi, other=-1)
        for start in range(lo, hi, BLOCK_N):
            pos = start + t
            tok = tok_next
            valid = (pos < hi) & (tok >= 0)
            tok_next = tok_next2
            if PREFETCH == 3:
                prefetch_kv_l2_bulk(KV_U8, tok_next, tok_next >= 0, PAGE_SIZE, PAGE_BYTES)
            else:
                prefetch_kv_l2(KV_U8, tok_next, tok_next >= 0, PAGE_SIZE, PAGE_BYTES)
            tok_next2 = tl.load(row + pos + 2 * BLOCK_N, mask=pos + 2 * BLOCK_N < hi, other=-1)
            kv = gather_kv_tile(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D, DOT, DEQUANT_BITS)
            m_i, l_i, acc = _attend_tile(q, kv, valid, m_i, l_i, acc, qk_scale, LAZY_RESCALE, FOLD_SCALE)
    elif PREFETCH == 4:
        # Indices one tile ahead, nothing else: the next tile's index load (1 register a
        # thread) overlaps this tile's work, so each tile waits on one dependent load (the
        # gather) instead of two (indices, then the gather they address).
        tok_next = tl.load(row + lo + t, mask=lo + t < hi, other=-1)
        for start in range(lo, hi, BLOCK_N):
            pos = start + t
            tok = tok_next
            valid = (pos < hi) & (tok >= 0)
            tok_next = tl.load(row + pos + BLOCK_N, mask=pos + BLOCK_N < hi, other=-1)
            kv = gather_kv_tile(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D, DOT, DEQUANT_BITS)
            m_i, l_i, acc = _attend_tile(q, kv, valid, m_i, l_i, acc, qk_scale, LAZY_RESCALE, FOLD_SCALE)
    elif PREFETCH >= 5:
        # Indices one tile ahead (as 4), and the next tile's bytes requested into L2 once this
        # tile's gather has been consumed (after Q @ K^T is issued): they arrive during this
        # tile's softmax and P @ V. Prefetching at the top of the iteration (1, 3) instead added
        # to the burst of every program's gather at the same moment. 5: one bulk L2 prefetch
        # per token (cp.async.bulk.prefetch), 6: one prefetch per 128-byte line, 7: bulk, two
        # tiles ahead (tile i + 2 after tile i's Q @ K^T; tile 1 after tile 0's), so a tile's
        # bytes have a whole tile's time to arrive. GPU only; no hint past the slice's end.
        tok_next = tl.load(row + lo + t, mask=lo + t < hi, other=-1)
        if PREFETCH == 8:
            # as 5, and tile 1's bytes requested at the start (before tile 0's gather is issued)
            # instead of after tile 0's Q @ K^T; measured slower at B=128 (the first burst grows)
            if lo + BLOCK_N < hi:
                tok1 = tl.load(row + lo + BLOCK_N + t, mask=lo + BLOCK_N + t < hi, other=-1)
                prefetch_kv_l2_bulk(KV_U8, tok1, tok1 >= 0, PAGE_SIZE, PAGE_BYTES)
        if PREFETCH == 7:
            tok_next2 = tl.load(row + lo + BLOCK_N + t, mask=lo + BLOCK_N + t < hi, other=-1)
        for start in range(lo, hi, BLOCK_N):
            pos = start + t
            tok = tok_next
            valid = (pos < hi) & (tok >= 0)
            if PREFETCH == 7:
                tok_next = tok_next2
                tok_next2 = tl.load(row + pos + 2 * BLOCK_N, mask=pos + 2 * BLOCK_N < hi, other=-1)
            else:
                tok_next = tl.load(row + pos + BLOCK_N, mask=pos + BLOCK_N < hi, other=-1)
            kv = gather_kv_tile(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D, DOT, DEQUANT_BITS)
            s = _tile_scores(q, kv, valid, qk_scale, FOLD_SCALE)
            if PREFETCH == 7:
                if (start == lo) & (start + BLOCK_N < hi):
                    prefetch_kv_l2_bulk(KV_U8, tok_next, tok_next >= 0, PAGE_SIZE, PAGE_BYTES)
                if start + 2 * BLOCK_N < hi:
                    prefetch_kv_l2_bulk(KV_U8, tok_next2, tok_next2 >= 0, PAGE_SIZE, PAGE_BYTES)
            elif start + BLOCK_N < hi:
                if PREFETCH == 5:
                    prefetch_kv_l2_bulk(KV_U8, tok_next, tok_next >= 0, PAGE_SIZE, PAGE_BYTES)
                elif PREFETCH == 8:
                    if start > lo:                      # tile 1's went out at the start
                        prefetch_kv_l2_bulk(KV_U8, tok_next, tok_next >= 0, PAGE_SIZE, PAGE_BYTES)
                elif PREFETCH == 6:
                    prefetch_kv_l2(KV_U8, tok_next, tok_next >= 0, PAGE_SIZE, PAGE_BYTES)
            m_i, l_i, acc = _tile_update(s, kv, m_i, l_i, acc, qk_scale, LAZY_RESCALE, FOLD_SCALE)
    else:
        # indices and bytes loaded in the iteration that uses them. With num_stages > 1
        # Triton 3.6 turns the gathers into cp.async copies, but issues them at the end of
        # the previous iteration and waits at the top of this one: little is overlapped.
        for start in range(lo, hi, BLOCK_N):             # empty when the slice is past topk_len
            pos = start + t
            tok = tl.load(row + pos, mask=pos < hi, other=-1)
            valid = (pos < hi) & (tok >= 0)
            kv = gather_kv_tile(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D, DOT, DEQUANT_BITS)
            m_i, l_i, acc = _attend_tile(q, kv, valid, m_i, l_i, acc, qk_scale, LAZY_RESCALE, FOLD_SCALE)
    if TRACE is not None:
        trace_point(TRACE, 1, l_i)                  # the last tile's softmax sums exist
    has = l_i > 0.0
    lse = tl.where(has, (m_i + tl.math.log2(tl.where(has, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    if HAS_SINK and not SPLIT:
        sink = tl.load(SINK + heads, mask=hmask, other=0.0).to(tl.float32)
        new_lse = tl.maximum(lse, sink) + tl.log(1.0 + tl.exp(-tl.abs(lse - sink)))
        new_lse = tl.where(has, new_lse, sink)
        out = out * tl.exp(lse - new_lse)[:, None]
        lse = new_lse
    o_ptr = O + b * stride_ob + heads[:, None] * stride_oh + sp * stride_os + col[None, :]
    tl.store(o_ptr, out.to(O.dtype.element_ty), mask=hmask[:, None])
    # LSE is [B, H] (final) or [B, H, NSPLIT] (partials), contiguous
    tl.store(LSE + (b * H + heads) * tl.num_programs(2) + sp, lse, mask=hmask)
    if TRACE is not None:
        trace_point(TRACE, 2, lse)                  # stores issued
    if MERGE == 1:
        # Split-K without a second launch: the last slice of (b, head block) to finish
        # merges all of them. Every thread's partial stores are ordered before the
        # counter's release (barrier + acq_rel atomic, CUTLASS's semaphore pattern); the
        # last program resets the counter, so a CUDA graph replays from zero.
        tl.debug_barrier()
        cnt = CNT + 2 * (b * tl.num_programs(1) + hb)
        arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if arrived == tl.num_programs(2) - 1:
            merge_partials(O, LSE, SINK, O_FINAL, LSE_FINAL, b, heads, hmask, H, tl.num_programs(2),
                           stride_ob, stride_oh, stride_os, stride_fb, stride_fh,
                           HAS_SINK, SPLIT_P2, DCHUNK, D)
            tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
    if MERGE == 2:
        # Cooperative merge (GPU only, every program of the launch resident at once: launch()
        # checks the grid fits the SMs and makes it a cooperative launch): the NSPLIT slices of
        # (b, head block) meet at a barrier, then each merges its own share of the 512 columns
        # from all NSPLIT partials. A generation word makes the barrier reusable: read before
        # arriving, bumped (release) by the last to arrive, after it resets the count; the others
        # spin (acquire) until it moves.
        tl.debug_barrier()
        cnt = CNT + 2 * (b * tl.num_programs(1) + hb)
        gen = tl.atomic_add(cnt + 1, 0, sem="relaxed", scope="gpu")
        arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if arrived == tl.num_programs(2) - 1:
            tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
            tl.atomic_add(cnt + 1, 1, sem="release", scope="gpu")
        else:
            now = tl.atomic_add(cnt + 1, 0, sem="acquire", scope="gpu")
            while now == gen:
                now = tl.atomic_add(cnt + 1, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()
        coop_merge_share(O, LSE, SINK, O_FINAL, LSE_FINAL, b, heads, hmask, H, sp, tl.num_programs(2),
                         stride_ob, stride_oh, stride_os, stride_fb, stride_fh, HAS_SINK, SPLIT_P2, DCHUNK, D, NCOL)


#: How a tile's fp8 bytes become bf16 on the GPU: "cvt" (the conversion instructions) or "bits"
#: (integer ops and one bf16x2 multiply, common.dequant_kv_bits; bitwise equal, needs scale
#: bytes <= MAX_SCALE_BYTE). Chosen per tile entry (TileConfig.dequant); env DSV4LAB_DEQUANT=cvt
#: or =bits overrides every entry (the A/B tools). The interpreter always takes "cvt" (no inline
#: assembly there). What was measured (graph replay, H200): with loop 4 "bits" was no faster
#: (ab_dequant.json: B=128 62.2 -> 61.6 us, 16-head tiles at B=1 14.1 -> 14.8): the kernel then
#: waited on memory. With loop 5 (less memory wait) "bits" + FOLD_SCALE took the 64-head tiles
#: from 58.6 to 57.5 us at B=128 (ab_prefetch.json), so the H200 "mma" entry uses both; the
#: 16-head "split" entry stays "cvt". An entry's choice applies to launches whose programs walk
#: whole rows (NSPLIT 1): split launches take "cvt" and no fold, which an NSPLIT sweep measured
#: faster for the same 64-head tiles on 1-2 tiles a slice (split_bits_on_slices.json, us, cvt vs
#: bits + fold: B=16 x4 22.1 vs 23.1, B=32 x4 26.2 vs 26.8, B=64 x2 40.3 vs 41.0; unsplit B=128
#: 58.2 vs 57.3): on a short slice the conversion sits on the dependent chain, and the integer
#: sequence is one step longer per value.
DEQUANT = os.environ.get("DSV4LAB_DEQUANT") or None
if DEQUANT not in (None, "bits", "cvt"):
    raise ValueError(f"DSV4LAB_DEQUANT must be 'bits' or 'cvt' (or unset: per tile entry), got {DEQUANT!r}")
#: apply the softmax scale inside exp2's fused multiply-add (_tile_update): per tile entry
#: (TileConfig.fold_scale); env DSV4LAB_FOLD_SCALE=1 or =0 overrides every entry
FOLD_SCALE = {"1": True, "0": False, "": None}.get(os.environ.get("DSV4LAB_FOLD_SCALE", ""), "bad")
if FOLD_SCALE == "bad":
    raise ValueError(f"DSV4LAB_FOLD_SCALE must be 0 or 1 (or unset: per tile entry), "
                     f"got {os.environ['DSV4LAB_FOLD_SCALE']!r}")


def dequant_bits(cfg=None, nsplit: int = 1) -> bool:
    """Whether a launch of ``cfg`` (default: this device's "mma" entry) in ``nsplit`` slices takes
    the "bits" dequant: DEQUANT if set, else the entry's choice for whole rows, "cvt" for slices."""
    if is_interpret():
        return False
    if DEQUANT:
        return DEQUANT == "bits"
    return nsplit == 1 and (cfg or tile_config()).dequant == "bits"


def fold_scale(cfg=None, nsplit: int = 1) -> bool:
    """Whether a launch of ``cfg`` in ``nsplit`` slices folds the scale into exp2's FMA (as dequant_bits)."""
    if FOLD_SCALE is not None:
        return FOLD_SCALE
    return nsplit == 1 and (cfg or tile_config()).fold_scale


def ran_with(cfg=None, nsplit: int = 1) -> dict:
    """What a launch of ``cfg`` in ``nsplit`` slices takes in this process, as recorded runs
    write it: {"dequant": "bits" | "cvt", "fold_scale": bool}."""
    return {"dequant": "bits" if dequant_bits(cfg, nsplit) else "cvt", "fold_scale": fold_scale(cfg, nsplit)}


@dataclass(frozen=True)
class TileConfig:
    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    source: str = ""
    lazy_rescale: bool = False
    prefetch: int = 0                  # 0: Triton's pipeliner, 1: L2 hint, 2: registers, 3: bulk L2 hint,
                                       # 4: indices one tile ahead, 5/6: 4 + bulk/line L2 hint after QK,
                                       # 7: 5 two tiles ahead, 8: 5 + tile 1's hint at the start
    us_per_tile: float | None = None   # measured: a program's time per BLOCK_N tile (the slope)
    fixed_us: float = 0.0              # measured: a launch's time beyond its tiles (the intercept)
    merge_us: float = 3.0              # measured: what split-K's merge adds to a launch of these tiles
    dequant: str = "cvt"               # "cvt" or "bits" (DEQUANT), for launches of whole rows
    fold_scale: bool = False           # FOLD_SCALE, for launches of whole rows

    def __post_init__(self):
        if self.dequant not in ("cvt", "bits"):
            raise ValueError(f"TileConfig.dequant must be 'cvt' or 'bits', got {self.dequant!r}")


#: Tile choices per (device, use). "mma": the throughput tiles (64 heads per program: the
#: KV tile is read once for all heads); "split": latency tiles (16 heads: 4x the programs),
#: used by split-K and by the stage-2 launch when its grid would leave SMs idle
#: (choose_tiles). H200 entries come from the recorded sweep (data/runs/h200/tiles.json,
#: split.json; notebooks 02-03) over candidates the offline compiler report
#: (dsv4lab.compile_report) showed with few spills. The sm_120 entries are worked out on
#: paper for the story's RTX PRO 6000 (188 SMs, ~99 KB shared memory per block) and NOT
#: measured: the H200 choices need 84-98 KB of shared memory per program (compile_report),
#: at that budget's edge; BLOCK_H 64 x BLOCK_N 16 with one stage needs ~82 KB on sm_90.
#: us_per_tile and fixed_us (the launch-time model, model_us) are fitted to the B = 1 rows
#: of the NSPLIT sweep: time = fixed_us + tiles per program x us_per_tile (+ merge).
TILE_TABLE = {
    ("9.0", "mma"): TileConfig(64, 128, 8, 1, "H200 sweep, data/runs/h200/tiles.json (fastest at B=128); "
                               "loop 5 from ab_prefetch.json (B=128 62.1 -> 58.6 us), bits + fold from the "
                               "same run (58.6 -> 57.5 us); costs from split.json",
                               prefetch=5, us_per_tile=9.76, fixed_us=9.66, merge_us=0.83,
                               dequant="bits", fold_scale=True),
    ("9.0", "split"): TileConfig(16, 64, 8, 1, "H200 sweep, data/runs/h200/split.json (fastest at B=1)",
                                 prefetch=2, us_per_tile=3.287, fixed_us=10.09, merge_us=0.0),
    ("12.0", "mma"): TileConfig(64, 16, 8, 1, "paper estimate for RTX PRO 6000 (sm_120): not measured"),
    ("12.0", "split"): TileConfig(64, 16, 8, 1, "paper estimate for RTX PRO 6000 (sm_120): not measured"),
    ("interpret", "mma"): TileConfig(16, 16, 4, 1, "interpreter: small tiles keep numpy fast"),
    ("interpret", "split"): TileConfig(16, 16, 4, 1, "interpreter: small tiles keep numpy fast"),
    ("default", "mma"): TileConfig(64, 32, 8, 2, "fallback for other GPUs: not measured"),
    ("default", "split"): TileConfig(64, 16, 8, 2, "fallback for other GPUs: not measured"),
}


def tile_config(num_heads: int | None = None, *, split: bool = False) -> TileConfig:
    use = "split" if split else "mma"
    key = "interpret" if is_interpret() else info().capability
    cfg = TILE_TABLE.get((key, use), TILE_TABLE[("default", use)])
    if num_heads is not None and num_heads < cfg.block_h:
        # fewer heads than a block (tensor parallelism): shrink, tl.dot needs >= 16 rows
        cfg = replace(cfg, block_h=max(16, triton.next_power_of_2(num_heads)),
                      source=cfg.source + " (shrunk to H)")
    return cfg


def sm_count() -> int:
    return 4 if is_interpret() else info().sm_count


def model_us(cfg: TileConfig, B: int, H: int, K: int, nsplit: int = 1, sms: int | None = None):
    """(programs, waves, tiles per program, modeled us) of one launch of ``cfg``:

        fixed_us + waves x tiles per program x us_per_tile,   waves = ceil(programs / SMs)

    Programs of one wave run side by side, so a launch lasts as long as its longest
    chain of tiles, once per wave, plus what any launch costs (start, the first loads,
    the stores). Both figures are measured (TileConfig); the split-K merge is added in
    split_k.plans."""
    per = triton.cdiv(triton.cdiv(K, cfg.block_n), nsplit)
    progs = B * triton.cdiv(H, cfg.block_h) * nsplit
    waves = triton.cdiv(progs, sms or sm_count())
    return progs, waves, per, cfg.fixed_us + waves * per * (cfg.us_per_tile or 1.0)


def choose_tiles(B: int, H: int, K: int, sms: int | None = None) -> TileConfig:
    """The stage-2 launch's tiles for this shape: the throughput tiles ("mma", 64 heads per
    program) unless the grid they give leaves SMs idle and the model says the small-head
    tiles ("split" entry, 16 heads: 4x the programs) finish sooner. Shapes only, so a
    CUDA graph captured for a batch size keeps its launch."""
    big, small = tile_config(H), tile_config(H, split=True)
    return min((big, small), key=lambda c: model_us(c, B, H, K, sms=sms)[3])


@triton.jit
def _coop_merge_kernel(O_PART, LSE_PART, SINK, O, LSE, H, stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
                       HAS_SINK: tl.constexpr, BLOCK_H: tl.constexpr, SPLIT_P2: tl.constexpr,
                       DCHUNK: tl.constexpr, D: tl.constexpr, NCOL: tl.constexpr):
    """The cooperative merge's second half as its own launch, same grid and code
    (common.coop_merge_share): the interpreter runs programs one after another, so a barrier
    inside one launch would wait forever there."""
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    coop_merge_share(O_PART, LSE_PART, SINK, O, LSE, tl.program_id(0), heads, heads < H, H,
                     tl.program_id(2), tl.num_programs(2), stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
                     HAS_SINK, SPLIT_P2, DCHUNK, D, NCOL)


def coop_fits(B: int, H: int, nsplit: int, cfg: TileConfig) -> bool:
    """The cooperative merge waits inside the launch for every slice of a row, so on the GPU every
    program must be resident at once: at most one program per SM (a program always fits one SM).
    launch() also makes it a cooperative launch, so the driver refuses a grid that cannot be
    co-resident (another kernel holding SMs, an MPS share) instead of the programs waiting forever.
    The interpreter runs it as two launches (launch()), so any grid fits there."""
    return is_interpret() or B * triton.cdiv(H, cfg.block_h) * nsplit <= sm_count()


def launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, *, nsplit=1, split_len=None,
           cfg: TileConfig | None = None, pdl: bool = False, merge_into=None, merge: str = "fused",
           pdl_in: bool = False, trace=None):
    """Launch the head-batched kernel; with nsplit > 1, ``out``/``lse`` are the partial
    workspaces [B, H, NSPLIT, 512] (fp32 or bf16) / [B, H, NSPLIT] fp32.
    ``merge_into=(out, lse, counters)``: the split launch merges the partials itself and
    applies ``attn_sink`` (counters: int32 zeros, >= 2 x B x head blocks; each launch leaves
    the counts zero), ``merge`` "fused" (the last slice of each row to finish merges it) or
    "coop" (all slices of a row meet at a barrier and each merges a share of the columns; needs
    coop_fits); otherwise split_k's combine kernel merges and ``attn_sink`` must be None here.
    ``pdl``: the next launch (split-K's combine) is a programmatic dependent launch.
    ``pdl_in``: this launch is one (of whatever kernel precedes it on the stream): it may start
    while that kernel drains and waits (griddepcontrol.wait) before reading anything.
    ``trace``: int64 [programs, 4] (GPU only): per program the %globaltimer ns at its start, after
    its last tile, after its stores, and its SM id (common.trace_point; tools/trace_decode.py)."""
    B, H, D = q.shape
    K = indices.shape[1]
    cfg = cfg or tile_config(H)
    split = nsplit > 1
    assert not (split and attn_sink is not None and merge_into is None), "the sink belongs to the merge"
    assert not (pdl and merge_into is not None), "PDL would let the next launch start before the counters reset"
    if split_len is None:
        split_len = triton.cdiv(triton.cdiv(K, nsplit), cfg.block_n) * cfg.block_n
    fp8, u8, bf16 = cache_views(cache)
    grid = (B, triton.cdiv(H, cfg.block_h), nsplit)
    merge_kw = _merge_args(merge_into, merge, B, H, nsplit, cfg)
    two_step = merge_kw.get("MERGE") == 2 and is_interpret()      # the interpreter: merge in a second launch
    _head_batched_kernel[grid](
        q, fp8, u8, bf16, indices,
        topk_len if topk_len is not None else lse,
        attn_sink if attn_sink is not None else lse,
        out, lse, sm_scale * LOG2E, K, H, split_len,
        q.stride(0), q.stride(1), indices.stride(0), out.stride(0), out.stride(1),
        out.stride(2) if split else 0,
        PAGE_SIZE=cache.page_size, PAGE_BYTES=cache.page_bytes,
        HAS_TOPK_LEN=topk_len is not None, HAS_SINK=attn_sink is not None, SPLIT=split,
        BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, D=D, NOPE=448, DOT=dot_dtype(),
        LAZY_RESCALE=cfg.lazy_rescale, PREFETCH=_prefetch_mode(cfg.prefetch),
        LAUNCH_DEPENDENTS=pdl, DEQUANT_BITS=dequant_bits(cfg, nsplit),
        FOLD_SCALE=fold_scale(cfg, nsplit), TRACE=trace, **({} if two_step else merge_kw),
        **(dict(WAIT_PRIOR=True, launch_pdl=True) if pdl_in and use_pdl() else {}),
        **(dict(launch_cooperative_grid=True) if merge_kw.get("MERGE") == 2 and not two_step else {}),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if two_step:
        _coop_merge_kernel[grid](out, lse, attn_sink if attn_sink is not None else lse, merge_kw["O_FINAL"],
                                 merge_kw["LSE_FINAL"], H, out.stride(0), out.stride(1), out.stride(2),
                                 merge_kw["stride_fb"], merge_kw["stride_fh"], HAS_SINK=attn_sink is not None,
                                 BLOCK_H=cfg.block_h, SPLIT_P2=merge_kw["SPLIT_P2"], DCHUNK=merge_kw["DCHUNK"],
                                 D=D, NCOL=merge_kw["NCOL"], num_warps=cfg.num_warps)


def _prefetch_mode(prefetch: int) -> int:
    """The interpreter cannot run the L2 hints (PTX): it takes the same loop without them."""
    if is_interpret():
        return {1: 0, 3: 0, 5: 4, 6: 4, 7: 4, 8: 4}.get(prefetch, prefetch)
    return prefetch


def _merge_args(merge_into, merge, B, H, nsplit, cfg):
    if merge_into is None:
        return {}
    if merge not in ("fused", "coop"):
        raise ValueError(f"merge must be 'fused' or 'coop' with merge_into, got {merge!r}")
    out, lse, counters = merge_into
    groups = B * triton.cdiv(H, cfg.block_h)
    if nsplit < 2 or counters.dtype != torch.int32 or counters.numel() < 2 * groups:
        raise ValueError(f"merge_into: an in-launch merge needs nsplit >= 2 (got {nsplit}) and int32 counters of "
                         f">= 2 x {groups} (batch x head blocks) words, got {counters.dtype} [{counters.numel()}]")
    split_p2 = triton.next_power_of_2(nsplit)
    dchunk = merge_chunk(cfg.block_h, split_p2, cfg.num_warps, per_thread=64)
    kw = dict(CNT=counters, O_FINAL=out, LSE_FINAL=lse, stride_fb=out.stride(0), stride_fh=out.stride(1),
              MERGE=1, SPLIT_P2=split_p2, DCHUNK=dchunk)
    if merge == "coop":
        if not coop_fits(B, H, nsplit, cfg):
            nhb = triton.cdiv(H, cfg.block_h)
            raise ValueError(f"merge='coop' needs every program resident at once: B={B} x {nhb} head blocks "
                             f"x nsplit={nsplit} = {B * nhb * nsplit} programs > {sm_count()} SMs")
        ncol = coop_columns(nsplit, out.shape[-1])
        kw.update(MERGE=2, NCOL=ncol, DCHUNK=min(ncol, dchunk))
    return kw


@register("sparse_decode", "mma")
def sparse_decode_mma(q, cache, indices, *, topk_len, sm_scale, attn_sink, cfg=None):
    B, H, D = q.shape
    cfg = cfg or choose_tiles(B, H, indices.shape[1])
    q = q.contiguous()
    indices = indices.contiguous()
    out = alloc((B, H, D), out_dtype(), q.device)
    lse = alloc((B, H), torch.float32, q.device)
    launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, cfg=cfg)
    return finish(out), lse


def max_scale_byte(cfg=None, nsplit: int = 1):
    """The largest UE8M0 scale byte a launch of ``cfg`` in ``nsplit`` slices reads correctly:
    common.MAX_SCALE_BYTE with the "bits" dequant (2^(e-7) must be a finite bf16), None (any) with "cvt"."""
    return MAX_SCALE_BYTE if dequant_bits(cfg, nsplit) else None


sparse_decode_mma.max_scale_byte = lambda B, H, K: max_scale_byte(choose_tiles(B, H, K))
