"""S1's kernel, head-batched tensor cores: gather each KV tile once, reuse it for BLOCK_H heads.

Grid (B, cdiv(H, BLOCK_H)). A program gathers BLOCK_N tokens into one dequantized
[BLOCK_N, 512] tile (fp8 nope * UE8M0 scale | bf16 rope: the 448 + 64 split disappears in the
gather, so both products are exactly 512 wide), then

    S = Q[BLOCK_H, 512] @ K^T      (tl.dot, tensor cores)
    online softmax on S in fp32, base 2
    O += P[BLOCK_H, BLOCK_N] @ K   (tl.dot; K = V in MLA)

The KV bytes are read once per head block instead of once per head.

Two kernels share that body:

* ``_story_kernel`` is S1 as the lab reconstructs it (the story published its grid, head block
  and numbers, not its source): SGLang's SIMT kernel with the heads
  batched and the loop above, nothing else. Like SGLang's kernel it walks the whole padded index
  row: every tile of the K entries is visited and its indices loaded; entries past ``topk_len``
  are masked (no KV bytes gathered, never used, never flagged). ``impl="mma_story"`` launches it
  with the story's BLOCK_H = 32 (two programs per request). ``impl="mma_story_stop"`` is the
  same kernel stopping each row at its ``topk_len`` (``STOP_AT_LEN``): the lab's first change,
  which the story never made (the replay's S1stop). On a ratio-128 row (8256 wide, 64 live) it is
  the difference between 258 tiles and 2.
* ``_head_batched_kernel`` is the lab's tuned version (``impl="mma"``, the replay's S1best, and every
  split-K slice in split_k.py): the next tile's loads issued before this tile's math (``loop``), the fp8
  dequant by integer ops (``dequant="bits"``), the softmax scale folded into exp2's FMA, and
  one slice of the top-k row per program for split-K. Notebook 03 shows it as a diff of the first.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ... import errors
from ...config import NOPE_DIM
from ...device import is_interpret
from ...registry import register
from ..buffers import alloc, finish, out_dtype
from ..launch import cdiv, dot_dtype, launch_kernel
from ..rows import INDEX_FLAG, NONFINITE_FLAG, SINK_FLAG, in_cache, row_length, token_limit, track_tokens, track_tokens_init
from .kv_tiles import (LOG2E, MAX_SCALE_BYTE, cache_views, decode_call, dequant_kv, gather_kv_tile, load_kv_raw,
                       prefetch_kv_l2_bulk)
from .planning import STORY_TILES, Launch, choose_tiles, launch_for, per_shape


@triton.jit
def _tile_scores(q, kv, valid, qk_scale, FOLD_SCALE: tl.constexpr):
    """S = q @ kv^T [BLOCK_H, BLOCK_N], -inf where ~valid; in log2 units unless FOLD_SCALE
    (then unscaled: _tile_update applies qk_scale inside exp2's fused multiply-add)."""
    if FOLD_SCALE:
        return tl.where(valid[None, :], tl.dot(q, tl.trans(kv)), float("-inf"))
    s = tl.dot(q, tl.trans(kv)) * qk_scale
    return tl.where(valid[None, :], s, float("-inf"))


@triton.jit
def _tile_update(s, kv, m_i, l_i, acc, qk_scale, FOLD_SCALE: tl.constexpr):
    """Online softmax on one tile's scores s, then acc += P @ kv. FOLD_SCALE: the row max is
    taken on the unscaled S (qk_scale > 0) and the scale is applied inside exp2's argument,
    s * qk_scale - m, one fused multiply-add instead of a multiply and a subtract (the running
    max m_i is in scaled units either way)."""
    if FOLD_SCALE:
        m_tile = tl.max(s, axis=1) * qk_scale
    else:
        m_tile = tl.max(s, axis=1)
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
def _attend_tile(q, kv, valid, m_i, l_i, acc, qk_scale, FOLD_SCALE: tl.constexpr = False):
    """One tile of online softmax: S = q @ kv^T, rescale, acc += P @ kv (kv = K = V)."""
    s = _tile_scores(q, kv, valid, qk_scale, FOLD_SCALE)
    return _tile_update(s, kv, m_i, l_i, acc, qk_scale, FOLD_SCALE)


@triton.jit
def _finish_rows(m_i, l_i, acc, SINK, heads, hmask, read, HAS_SINK: tl.constexpr, CHECK_OUT: tl.constexpr = True):
    """(out, lse, error bits) of a block of rows from the running max (log2 units), sum and
    accumulator; a row with no valid token gives out 0 and lse -inf (or the sink). The sink adds
    exp(sink[h]) to the softmax denominator: lse' = logaddexp(lse, sink), out' = out * exp(lse - lse').
    A row that cannot be computed is NaN in out and lse, never "no token": a NaN or infinite sum (a
    non-finite q, score or cache value; a term past float32), or a sum of 0 although the block ``read``
    a token of the cache (every score below the running max's starting value or -inf: an extreme
    sm_scale or q; track_tokens). Bits:
    SINK_FLAG for a non-finite sink, NONFINITE_FLAG (CHECK_OUT) for a non-finite output."""
    empty = l_i == 0.0                       # NaN is not empty: its row comes out NaN
    # an infinite sum cannot be computed either: with the scale folded into exp2's FMA, a score near
    # float32's range differs from the rounded running max by more than exp2 can take (sm_scale 1e30)
    lost = (empty & read) | (l_i == float("inf"))
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) / 1.4426950408889634)
    # one scale a row, applied to the tile once; a lost row's is NaN, so its whole row is (one select on
    # a row vector, not on the tile: the tile-wide select and division cost ~1.4 us a split-K call on an
    # H100, experiments/eager_host_path)
    scale = tl.where(lost, float("nan"), 1.0 / l_safe)
    flags = tl.full([], 0, tl.int32)
    if HAS_SINK:
        sink = tl.load(SINK + heads, mask=hmask, other=0.0).to(tl.float32)
        new_lse = tl.maximum(lse, sink) + tl.log(1.0 + tl.exp(-tl.abs(lse - sink)))
        new_lse = tl.where(empty, sink, new_lse)
        scale = scale * tl.exp(lse - new_lse)
        lse = new_lse
        flags |= tl.where(tl.min((tl.abs(sink) < float("inf")).to(tl.int32), axis=0) == 1, 0, SINK_FLAG)
    lse = tl.where(lost, float("nan"), lse)
    out = acc * scale[:, None]
    if CHECK_OUT:
        # one reduction over the block after the loop (NaN fails the compare). Over the whole block,
        # not row sums then rows: Triton 3.6 cannot reduce a row vector of an sm_100 (tcgen05)
        # accumulator to a scalar (experiments/other_gpus_compile)
        ok = (tl.abs(out) < float("inf")) | ~hmask[:, None]
        flags |= tl.where(tl.min(ok.to(tl.int32)) == 1, 0, NONFINITE_FLAG)
    return out, lse, flags


@triton.jit
def _story_kernel(Q, KV_FP8, KV_U8, KV_BF16, IDX, TOPK_LEN, SINK, O, LSE, ERR,
                  qk_scale, K, H, num_tokens, stride_qb, stride_qh, stride_ib, stride_ob, stride_oh,
                  PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr, HAS_TOPK_LEN: tl.constexpr,
                  HAS_SINK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                  D: tl.constexpr, NOPE: tl.constexpr, DOT: tl.constexpr, STOP_AT_LEN: tl.constexpr = False):
    b = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    col = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + col[None, :],
                mask=hmask[:, None], other=0.0).to(DOT)
    n_valid, flags = row_length(TOPK_LEN, b, K, HAS_TOPK_LEN)
    m_i = tl.full([BLOCK_H], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, D], dtype=tl.float32)
    t = tl.arange(0, BLOCK_N)
    top, low = track_tokens_init(BLOCK_N)            # the live indices seen (one past the cache is flagged)
    end = K                                           # SGLang's loop: the whole padded row
    if STOP_AT_LEN:
        end = n_valid                                 # the lab's early stop (impl "mma_story_stop")
    for start in range(0, end, BLOCK_N):
        pos = start + t
        tok = tl.load(IDX + b * stride_ib + pos, mask=pos < K, other=-1)
        live = pos < n_valid                          # entries past topk_len: loaded, masked, not flagged
        top, low = track_tokens(top, low, tl.where(live, tok, -1))
        valid = live & in_cache(tok, num_tokens)
        kv = gather_kv_tile(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D, DOT)
        m_i, l_i, acc = _attend_tile(q, kv, valid, m_i, l_i, acc, qk_scale)
    out, lse, fin = _finish_rows(m_i, l_i, acc, SINK, heads, hmask, tl.min(low, axis=0) < num_tokens, HAS_SINK)
    tl.store(O + b * stride_ob + heads[:, None] * stride_oh + col[None, :], out.to(O.dtype.element_ty),
             mask=hmask[:, None])
    tl.store(LSE + b * H + heads, lse, mask=hmask)
    flags |= fin | tl.where(tl.max(top, axis=0) >= num_tokens, INDEX_FLAG, 0)
    tl.atomic_or(ERR, flags, mask=flags != 0)


#: TileConfig.loop -> the tuned kernel's LOOP constexpr
LOOP_CODE = {"plain": 0, "registers": 2, "l2_hint": 5}


@triton.jit
def _head_batched_kernel(Q, KV_FP8, KV_U8, KV_BF16, IDX, TOPK_LEN, SINK, O, LSE, ERR,
                         qk_scale, K, H, split_len, num_tokens,
                         stride_qb, stride_qh, stride_ib, stride_ob, stride_oh, stride_os,
                         PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr,
                         HAS_TOPK_LEN: tl.constexpr, HAS_SINK: tl.constexpr, SPLIT: tl.constexpr,
                         BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                         D: tl.constexpr, NOPE: tl.constexpr, DOT: tl.constexpr,
                         LOOP: tl.constexpr = 0, L2_HINT: tl.constexpr = False,
                         LAUNCH_DEPENDENTS: tl.constexpr = False,
                         DEQUANT_BITS: tl.constexpr = False, FOLD_SCALE: tl.constexpr = False):
    if LAUNCH_DEPENDENTS:
        tl.extra.cuda.gdc_launch_dependents()      # let split-K's combine launch now (it waits on the GPU)
    b = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    col = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + col[None, :],
                mask=hmask[:, None], other=0.0).to(DOT)
    n_valid, flags = row_length(TOPK_LEN, b, K, HAS_TOPK_LEN)
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
    # Bad input costs the loop one max and one min per index, in registers (track_tokens): the largest
    # index a program saw, so an index past the cache (read as padding by in_cache's compare, which
    # replaces the "< 0" test) is flagged once, after the loop, and whether it read a token at all
    top, low = track_tokens_init(BLOCK_N)
    if LOOP == 2:
        # Software pipeline in registers: the raw bytes of tile i+1 are loaded (not waited
        # on) before tile i is multiplied, its indices one tile earlier still, and tile i+1
        # is dequantized after tile i's P @ V is issued, so the scheduler can interleave
        # the conversions with the matrix instructions. Costs the registers of one raw tile.
        tok = tl.load(row + lo + t, mask=lo + t < hi, other=-1)
        top, low = track_tokens(top, low, tok)
        valid = (lo + t < hi) & in_cache(tok, num_tokens)
        x, e, r = load_kv_raw(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D)
        kv = dequant_kv(x, e, r, NOPE, D, DOT, DEQUANT_BITS)
        tok_next = tl.load(row + lo + BLOCK_N + t, mask=lo + BLOCK_N + t < hi, other=-1)
        for start in range(lo, hi, BLOCK_N):
            top, low = track_tokens(top, low, tok_next)
            valid_next = (start + BLOCK_N + t < hi) & in_cache(tok_next, num_tokens)
            x, e, r = load_kv_raw(KV_FP8, KV_U8, KV_BF16, tok_next, valid_next, PAGE_SIZE, PAGE_BYTES, NOPE, D)
            tok_next = tl.load(row + start + 2 * BLOCK_N + t, mask=start + 2 * BLOCK_N + t < hi, other=-1)
            m_i, l_i, acc = _attend_tile(q, kv, valid, m_i, l_i, acc, qk_scale, FOLD_SCALE)
            if BLOCK_H < 64:
                if start + BLOCK_N < hi:
                    # no dequant of a tile past the slice: on a one-tile slice (split-K at small B)
                    # it would sit between the only tile and the stores (16x64: B=1 37.5 -> 35.8 us).
                    # Not on 64-head tiles: the branch keeps the raw tile and kv live across it, and
                    # at 255 registers 64x32 then spilled 428 B instead of 32 (71.0 -> 85.2 us, B=128)
                    kv = dequant_kv(x, e, r, NOPE, D, DOT, DEQUANT_BITS)
            else:
                kv = dequant_kv(x, e, r, NOPE, D, DOT, DEQUANT_BITS)
            valid = valid_next
    elif LOOP == 5:
        # Indices one tile ahead, and the next tile's bytes requested into L2 once this tile's
        # gather has been consumed (after Q @ K^T is issued): they arrive during this tile's
        # softmax and P @ V. One bulk L2 prefetch per token (cp.async.bulk.prefetch); GPU only
        # (L2_HINT), no hint past the slice's end. Prefetching at the top of the iteration
        # instead added to the burst of every program's gather at the same moment.
        tok_next = tl.load(row + lo + t, mask=lo + t < hi, other=-1)
        for start in range(lo, hi, BLOCK_N):
            pos = start + t
            tok = tok_next
            top, low = track_tokens(top, low, tok)
            valid = (pos < hi) & in_cache(tok, num_tokens)
            tok_next = tl.load(row + pos + BLOCK_N, mask=pos + BLOCK_N < hi, other=-1)
            kv = gather_kv_tile(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D, DOT, DEQUANT_BITS)
            s = _tile_scores(q, kv, valid, qk_scale, FOLD_SCALE)
            if L2_HINT:
                if start + BLOCK_N < hi:
                    prefetch_kv_l2_bulk(KV_U8, tok_next, in_cache(tok_next, num_tokens), PAGE_SIZE, PAGE_BYTES)
            m_i, l_i, acc = _tile_update(s, kv, m_i, l_i, acc, qk_scale, FOLD_SCALE)
    else:
        # indices and bytes loaded in the iteration that uses them, as in _story_kernel
        for start in range(lo, hi, BLOCK_N):             # empty when the slice is past topk_len
            pos = start + t
            tok = tl.load(row + pos, mask=pos < hi, other=-1)
            top, low = track_tokens(top, low, tok)
            valid = (pos < hi) & in_cache(tok, num_tokens)
            kv = gather_kv_tile(KV_FP8, KV_U8, KV_BF16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D, DOT, DEQUANT_BITS)
            m_i, l_i, acc = _attend_tile(q, kv, valid, m_i, l_i, acc, qk_scale, FOLD_SCALE)
    # split slices leave the sink and the check of the output to the merge (split_k.py)
    out, lse, fin = _finish_rows(m_i, l_i, acc, SINK, heads, hmask, tl.min(low, axis=0) < num_tokens,
                                 HAS_SINK and not SPLIT, not SPLIT)
    o_ptr = O + b * stride_ob + heads[:, None] * stride_oh + sp * stride_os + col[None, :]
    tl.store(o_ptr, out.to(O.dtype.element_ty), mask=hmask[:, None])
    # LSE is [B, H] (final) or [B, H, NSPLIT] (partials), contiguous
    tl.store(LSE + (b * H + heads) * tl.num_programs(2) + sp, lse, mask=hmask)
    flags |= fin | tl.where(tl.max(top, axis=0) >= num_tokens, INDEX_FLAG, 0)
    tl.atomic_or(ERR, flags, mask=flags != 0)


def launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, opts: Launch, *, split_len=None):
    """Launch the tuned kernel with ``opts`` (planning.Launch). With opts.nsplit > 1, ``out`` /
    ``lse`` are split-K's partial workspaces [B, H, NSPLIT, 512] / [B, H, NSPLIT] and the sink
    belongs to the merge (``attn_sink`` must be None here)."""
    B, H, D = q.shape
    K = indices.shape[1]
    split = opts.nsplit > 1
    if split and attn_sink is not None:
        raise ValueError("attn_sink: a split launch writes partials; the sink is applied by the merge")
    grid, split_len, consts = _launch_args(opts, B, H, K, D, cache.page_size, cache.page_bytes,
                                           topk_len is not None, attn_sink is not None, split_len)
    fp8, u8, bf16 = cache_views(cache)
    sq, so = q.stride(), out.stride()              # one call each: every stride() call costs host time
    launch_kernel(_head_batched_kernel, grid, (
        q, fp8, u8, bf16, indices,
        topk_len if topk_len is not None else lse,
        attn_sink if attn_sink is not None else lse,
        out, lse, errors.word(q.device)), (sm_scale * LOG2E, K, H, split_len, token_limit(cache),
        sq[0], sq[1], indices.stride(0), so[0], so[1], so[2] if split else 0), consts)


@functools.lru_cache(maxsize=1024)
def _launch_args(opts: Launch, B, H, K, D, page_size, page_bytes, has_topk_len, has_sink, split_len):
    """(grid, split_len, constexprs and launch options) of a launch: shapes and options only, so
    decided once per shape rather than rebuilt on every eager call."""
    cfg = opts.tiles
    if split_len is None:
        split_len = cdiv(cdiv(K, opts.nsplit), cfg.block_n) * cfg.block_n
    consts = dict(PAGE_SIZE=page_size, PAGE_BYTES=page_bytes,
                  HAS_TOPK_LEN=has_topk_len, HAS_SINK=has_sink, SPLIT=opts.nsplit > 1,
                  BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, D=D, NOPE=NOPE_DIM, DOT=dot_dtype(),
                  LOOP=LOOP_CODE[cfg.loop], L2_HINT=not is_interpret(),
                  LAUNCH_DEPENDENTS=opts.pdl, DEQUANT_BITS=opts.dequant == "bits", FOLD_SCALE=opts.fold_scale,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return (B, cdiv(H, cfg.block_h), opts.nsplit), split_len, consts


def max_scale_byte(opts: Launch):
    """The largest UE8M0 scale byte a launch reads correctly: kv_tiles.MAX_SCALE_BYTE with the
    "bits" dequant (2^(e-7) must be a finite bf16), None (any) with "cvt"."""
    return MAX_SCALE_BYTE if opts.dequant == "bits" else None


def story_launch(B: int, H: int, K: int) -> Launch:
    """impls "mma_story" and "mma_story_stop": the story's tiles at every shape."""
    return Launch(STORY_TILES)


@per_shape
def mma_launch(B: int, H: int, K: int) -> Launch:
    """impl "mma": one launch of whole rows with the tiles choose_tiles picks for the shape."""
    return launch_for(choose_tiles(B, H, K))


@register("sparse_decode", "mma_story", stage="S1", tags=("recorded", "tensor_core", "whole_row"),
          launch=story_launch,
          description="the story's head-batched kernel: SGLang's loop over the whole padded row, BLOCK_H 32 "
                      "(2 programs per request at H=64)")
def sparse_decode_story(q, cache, indices, *, topk_len, sm_scale, attn_sink, tiles=STORY_TILES,
                        stop_at_len: bool = False, kernel=None):
    """``kernel``: a jitted kernel with _story_kernel's signature to launch instead (notebook 02's own copy)."""
    B, H, _ = q.shape
    args, constexprs, out, lse = decode_call(q, cache, indices, topk_len, attn_sink, sm_scale)
    (kernel or _story_kernel)[(B, cdiv(H, tiles.block_h))](
        *args, **constexprs, BLOCK_H=tiles.block_h, BLOCK_N=tiles.block_n, DOT=dot_dtype(),
        STOP_AT_LEN=stop_at_len, num_warps=tiles.num_warps, num_stages=tiles.num_stages)
    return finish(out), lse


@register("sparse_decode", "mma_story_stop", stage="S1stop", tags=("tensor_core", "whole_row"),
          launch=story_launch,
          description="the story's head-batched kernel stopping each row at its topk_len (the lab's change)")
def sparse_decode_story_stop(q, cache, indices, *, topk_len, sm_scale, attn_sink, tiles=STORY_TILES):
    return sparse_decode_story(q, cache, indices, topk_len=topk_len, sm_scale=sm_scale, attn_sink=attn_sink,
                               tiles=tiles, stop_at_len=True)


@register("sparse_decode", "mma", stage="S1best", tags=("recorded", "tensor_core", "whole_row"), launch=mma_launch,
          description="the lab's tuned head-batched kernel, whole rows",
          max_scale_byte=lambda B, H, K: max_scale_byte(mma_launch(B, H, K)))
def sparse_decode_mma(q, cache, indices, *, topk_len, sm_scale, attn_sink, opts: Launch | None = None):
    B, H, D = q.shape
    opts = opts or mma_launch(B, H, indices.shape[1])
    out = alloc((B, H, D), out_dtype(), q.device)
    lse = alloc((B, H), torch.float32, q.device)
    launch(q.contiguous(), cache, indices.contiguous(), topk_len, sm_scale, attn_sink, out, lse, opts)
    return finish(out), lse
