"""The Hopper decode kernel's Gluon code (see the package's docstring, hopper/__init__.py, for the design):
the producer partition (gather + dequant into a shared-memory ring), the consumers (wgmma + online
softmax), and ``_hopper_decode_kernel``, which allocates the ring and its mbarriers and specializes the
warps. The launch configuration and the launch are beside it, in hopper/__init__.py. ``TRACED`` (the
program's clocks) and ``ABLATE`` (one partition alone) are compile-time switches the studies of
experiments/hopper_decode turn on; the lab's launch leaves them off, so they compile out."""
from __future__ import annotations

from ....config import DATA_BYTES, SCALE_BYTES
from ....errors import Flag
from ..kv_tiles import E4M3_BAD_SCALE, E4M3_TO_BF16_ASM, L2_PREFETCH_ASM

try:                                    # Gluon exists on triton >= 3.4; the lab must import without it
    import triton.language as tl
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    GLUON_ERROR = None
except Exception as e:  # noqa: BLE001  (any failure to import means: no Gluon here)
    gluon = gl = None
    GLUON_ERROR = f"{type(e).__name__}: {e}"

if gluon is not None:
    _E4M3_ASM = gl.constexpr(E4M3_TO_BF16_ASM)
    _E4M3_BAD = gl.constexpr(E4M3_BAD_SCALE)
    _L2_PREFETCH_ASM = gl.constexpr(L2_PREFETCH_ASM)
    _DATA_BYTES = gl.constexpr(DATA_BYTES)
    _SCALE_BYTES = gl.constexpr(SCALE_BYTES)
    _INDEX_FLAG = gl.constexpr(int(Flag.INDEX))
    _TOPK_LEN_FLAG = gl.constexpr(int(Flag.TOPK_LEN))
    _SINK_FLAG = gl.constexpr(int(Flag.SINK))
    _NONFINITE_FLAG = gl.constexpr(int(Flag.NONFINITE))

    @gluon.constexpr_function
    def _chunk_layout():
        """A chunk's fp8 bytes [CHUNK, 8, 64] over the producer's 128 threads: 16 bytes a thread."""
        return gl.BlockedLayout([1, 1, 16], [1, 8, 4], [4, 1, 1], [2, 1, 0])

    @gluon.constexpr_function
    def _rope_layout(chunk):
        """A chunk's bf16 rope [CHUNK, 64] in a layout of its own (in the fp8 layout every thread would
        hold rope registers for one group in eight): CHUNK / 2 values a thread."""
        rv = chunk // 2
        return gl.BlockedLayout([1, rv], [32 * rv // 64, 64 // rv], [4, 1], [1, 0])

    @gluon.jit
    def _clock(trace, slot: gl.constexpr, TRACED: gl.constexpr):
        """TRACE row [slot] = %globaltimer (experiments/hopper_decode's clocks; compiled out when off)."""
        if TRACED:
            t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
            gl.store(trace + slot, t)

    @gluon.jit
    def _tokens(IDX, row, start, hi, layout: gl.constexpr, N: gl.constexpr):
        """The slice's indices start .. start + N - 1 (-1 from its end ``hi`` on)."""
        pos = start + gl.arange(0, N, layout=layout)
        return gl.load(IDX + row + pos, mask=pos < hi, other=-1)

    @gluon.jit
    def _any_token(IDX, row, lo, hi, num_tokens, layout: gl.constexpr, N: gl.constexpr):
        """Whether entries lo .. hi-1 of the index row name a token of the cache: what rows.track_tokens
        records in the Triton kernels' loops, scanned here after the loop and only for a block holding a
        row that weighed nothing (the consumers' registers are spent)."""
        found = gl.zeros([N], gl.int32, layout)
        for s in range(lo, hi, N):
            tok = _tokens(IDX, row, s, hi, layout, N)
            found = gl.maximum(found, (tok.to(gl.uint32) < num_tokens).to(gl.int32))
        return gl.max(found, axis=0) > 0

    @gluon.jit
    def _token_offsets(tok, num_tokens, PAGE_SIZE: gl.constexpr, PAGE_BYTES: gl.constexpr):
        """Byte offsets of tokens' data and scale bytes in the cache, and which are valid (a token of
        the cache: padding (-1), or an index past the cache, is never read)."""
        valid = tok.to(gl.uint32) < num_tokens                  # one unsigned compare: -1 wraps high
        safe = gl.where(valid, tok, 0).to(gl.int64)
        page = safe // PAGE_SIZE
        slot = safe % PAGE_SIZE
        data = gl.multiple_of(page * PAGE_BYTES + slot * _DATA_BYTES, 64)
        scl = gl.multiple_of(page * PAGE_BYTES + PAGE_SIZE * _DATA_BYTES + slot * _SCALE_BYTES, 8)
        return data, scl, valid

    @gluon.jit
    def _chunk_tokens(IDX, row, start, hi, CHUNK: gl.constexpr):
        """A chunk's indices in the two layouts its loads take (fp8 and scales; rope)."""
        L3: gl.constexpr = _chunk_layout()
        LR: gl.constexpr = _rope_layout(CHUNK)
        return (_tokens(IDX, row, start, hi, gl.SliceLayout(1, gl.SliceLayout(2, L3)), CHUNK),
                _tokens(IDX, row, start, hi, gl.SliceLayout(1, LR), CHUNK))

    @gluon.jit
    def _tile_tokens(IDX, row, start, hi, BLOCK_N: gl.constexpr):
        """A tile's indices in the layout of its L2 prefetch."""
        return _tokens(IDX, row, start, hi, gl.BlockedLayout([1], [32], [4], [0]), BLOCK_N)

    @gluon.jit
    def _load_chunk(KV_U8, KV_BF16, te, tr, num_tokens, PAGE_SIZE: gl.constexpr, PAGE_BYTES: gl.constexpr,
                    CHUNK: gl.constexpr, NOPE: gl.constexpr, GATHER: gl.constexpr = True):
        """The raw bytes of CHUNK tokens (their indices ``te``, ``tr``: _chunk_tokens): fp8 as
        [CHUNK, 8, 64] (group 7 is never read: rope's columns), the 8 scale bytes [CHUNK, 8], and the
        bf16 rope [CHUNK, 64] (_rope_layout). 16-byte loads of fp8; invalid tokens read nothing.
        Without GATHER (an ablation) nothing is read: the "bytes" are the low bits of their would-be
        offsets, so the index loads and the dequant of varying bytes stay in the code."""
        L3: gl.constexpr = _chunk_layout()
        LE: gl.constexpr = gl.SliceLayout(2, L3)
        LR: gl.constexpr = _rope_layout(CHUNK)
        data, scl, valid = _token_offsets(te, num_tokens, PAGE_SIZE, PAGE_BYTES)
        g = gl.arange(0, 8, layout=gl.SliceLayout(0, LE))
        j = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
        g3 = gl.expand_dims(gl.expand_dims(g, 0), 2)                      # [1, 8, 1]
        j3 = gl.expand_dims(gl.expand_dims(j, 0), 1)                      # [1, 1, 64]
        data3 = gl.expand_dims(gl.expand_dims(data, 1), 2)                # [CHUNK, 1, 1]
        valid3 = gl.expand_dims(gl.expand_dims(valid, 1), 2)
        if GATHER:
            x = gl.load(KV_U8 + data3 + g3 * 64 + j3, mask=valid3 & (g3 < NOPE // 64), other=0)
            e = gl.load(KV_U8 + gl.expand_dims(scl, 1) + gl.expand_dims(g, 0), mask=gl.expand_dims(valid, 1),
                        other=127)
        else:
            x = (data3 + g3 * 64 + j3).to(gl.uint8)
            e = (gl.expand_dims(scl, 1) + gl.expand_dims(g, 0)).to(gl.uint8) & 127
        rdata, _, rvalid = _token_offsets(tr, num_tokens, PAGE_SIZE, PAGE_BYTES)
        jr = gl.arange(0, 64, layout=gl.SliceLayout(0, LR))
        if GATHER:
            r = gl.load(KV_BF16 + gl.expand_dims((rdata + NOPE) // 2, 1) + gl.expand_dims(jr, 0),
                        mask=gl.expand_dims(rvalid, 1), other=0.0)
        else:
            r = (gl.expand_dims(rdata, 1) + gl.expand_dims(jr, 0)).to(gl.int16).to(gl.bfloat16, bitcast=True)
        return x, e, r

    @gluon.jit
    def _dequant_chunk(x, e, CHUNK: gl.constexpr):
        """[CHUNK, 8, 64] fp8 bytes -> [CHUNK, 512] bf16, x * 2^(e-127) by integer ops (group 7 is
        garbage: the rope's columns, stored over it). A scale byte past kv_tiles.MAX_SCALE_BYTE
        gives NaN (as head_batched's "bits" dequant)."""
        ei = e.to(gl.int32) + 120
        sc = gl.where(ei <= 254, ei << 7, _E4M3_BAD).to(gl.int16).to(gl.bfloat16, bitcast=True)   # 2^(e-7)
        sc3 = gl.broadcast(gl.expand_dims(sc, 2), x)[0]
        y = gl.inline_asm_elementwise(_E4M3_ASM, "=r,=r,r,r,r", [x, sc3], dtype=gl.bfloat16, is_pure=True, pack=4)
        return gl.reshape(y, [CHUNK, 8 * 64])

    @gluon.jit
    def _prefetch_tile_l2(KV_U8, tp, num_tokens, PAGE_SIZE: gl.constexpr, PAGE_BYTES: gl.constexpr):
        """Ask L2 for a tile's bytes without waiting (kv_tiles.L2_PREFETCH_ASM, one per token; ``tp``:
        its indices, _tile_tokens), so its chunk loads a tile later hit L2 instead of HBM (padding
        asks for token 0's bytes: harmless)."""
        data, scl, _ = _token_offsets(tp, num_tokens, PAGE_SIZE, PAGE_BYTES)
        gl.inline_asm_elementwise(_L2_PREFETCH_ASM, "=r,l,l", [KV_U8 + data, KV_U8 + scl],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _producer(IDX, KV_U8, KV_BF16, kv_bufs, ready, empty, row, lo, hi, num_tokens, trace,
                  PAGE_SIZE: gl.constexpr, PAGE_BYTES: gl.constexpr, BLOCK_N: gl.constexpr,
                  CHUNK: gl.constexpr, NUM_BUF: gl.constexpr, NOPE: gl.constexpr, TRACED: gl.constexpr,
                  PART: gl.constexpr = 0):
        """Worker partition: fill the ring, one BLOCK_N tile a step, CHUNK tokens at a time. The
        next chunk's loads are issued before this chunk's dequant and stores, and the next tile's
        bytes are asked into L2 once this tile's first loads are out (only one chunk is in flight
        in registers, so each chunk's load latency is paid: an L2 hit's, not HBM's); the first
        tile's own bytes likewise, after its first chunk's loads. ``PART`` (ablations, see the
        kernel's ABLATE): 1 the indices, dequant and stores without the gather (bytes made from
        the offsets, _load_chunk), 2 the gather without the dequant and stores (the bytes folded
        into registers by XOR, then a store that never happens)."""
        GATHER: gl.constexpr = PART != 1
        STORE: gl.constexpr = PART != 2
        if not STORE:       # the gather alone: its bytes are folded into registers, stored once, never
            kx = gl.zeros([CHUNK, 8, 64], gl.uint8, _chunk_layout())
            ke = gl.zeros([CHUNK, 8], gl.uint8, gl.SliceLayout(2, _chunk_layout()))
            kr = gl.zeros([CHUNK, 64], gl.int16, _rope_layout(CHUNK))
        NCH: gl.constexpr = BLOCK_N // CHUNK
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        # indices travel ahead of the bytes they address, so no load waits on an index load: two
        # chunks' (te0/tr0 the next chunk's, te1/tr1 the one after) and the next tile's (for its L2
        # prefetch, a tile before its loads)
        te0, tr0 = _chunk_tokens(IDX, row, lo, hi, CHUNK)
        te1, tr1 = _chunk_tokens(IDX, row, lo + CHUNK, hi, CHUNK)
        tp = _tile_tokens(IDX, row, lo + BLOCK_N, hi, BLOCK_N)
        for i in range(n_tiles):
            s = i % NUM_BUF
            phase = (i // NUM_BUF) & 1
            start = lo + i * BLOCK_N
            buf = kv_bufs.index(s)
            x, e, r = _load_chunk(KV_U8, KV_BF16, te0, tr0, num_tokens, PAGE_SIZE, PAGE_BYTES, CHUNK, NOPE, GATHER)
            te0, tr0 = te1, tr1
            te1, tr1 = _chunk_tokens(IDX, row, start + 2 * CHUNK, hi, CHUNK)
            if i == 0 and GATHER:
                # the first tile's other chunks: no bytes beyond the tile's own, only asked for
                # sooner (a slice of one tile, B <= 16, has nothing else to overlap them with)
                _prefetch_tile_l2(KV_U8, _tile_tokens(IDX, row, start, hi, BLOCK_N), num_tokens, PAGE_SIZE,
                                  PAGE_BYTES)
            if i + 1 < n_tiles and GATHER:
                _prefetch_tile_l2(KV_U8, tp, num_tokens, PAGE_SIZE, PAGE_BYTES)
                tp = _tile_tokens(IDX, row, start + 2 * BLOCK_N, hi, BLOCK_N)
            # the buffer is free once the consumers' P @ V of the tile NUM_BUF steps back completed
            # (mbarriers start in phase 1 complete, so the first NUM_BUF waits pass at once)
            mbarrier.wait(empty.index(s), phase ^ 1)
            for c in gl.static_range(NCH):
                if c + 1 < NCH:
                    xn, en, rn = _load_chunk(KV_U8, KV_BF16, te0, tr0, num_tokens, PAGE_SIZE, PAGE_BYTES, CHUNK,
                                             NOPE, GATHER)
                    te0, tr0 = te1, tr1          # at c = NCH - 2: the next tile's first chunk, then its second
                    te1, tr1 = _chunk_tokens(IDX, row, start + (c + 3) * CHUNK, hi, CHUNK)
                if STORE:
                    rows = buf.slice(c * CHUNK, CHUNK, dim=0)
                    rows.store(_dequant_chunk(x, e, CHUNK))
                    # the rope overwrites columns 448..511 of the same rows (the compiler orders the
                    # two stores with a barrier of the producer's warps)
                    rows.slice(NOPE, 64, dim=1).store(r)
                else:
                    kx = kx ^ x
                    ke = ke ^ e
                    kr = kr ^ r.to(gl.int16, bitcast=True)
                if i == 0 and c == 0:
                    _clock(trace, 2, TRACED)
                if c + 1 < NCH:
                    x, e, r = xn, en, rn
            # generic-proxy stores -> async-proxy reads (wgmma): fence, then publish the tile
            fence_async_shared()
            mbarrier.arrive(ready.index(s), count=1)
            if i == 0:
                _clock(trace, 3, TRACED)
        if not STORE:       # the loads must land somewhere: a store no program makes (num_tokens > 0)
            never = num_tokens < 0
            gl.store(KV_U8 + kx.to(gl.int32) * 0, kx, mask=never)
            gl.store(KV_U8 + ke.to(gl.int32) * 0, ke, mask=never)
            gl.store(KV_BF16 + kr.to(gl.int32) * 0, kr.to(gl.bfloat16, bitcast=True), mask=never)
        _clock(trace, 4, TRACED)

    @gluon.jit
    def _idle(kv_bufs, ready, empty, lo, hi, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr, PRODUCER: gl.constexpr):
        """An ablation's stand-in for one partition: the ring's hand-offs without the work."""
        for i in range(gl.cdiv(hi - lo, BLOCK_N)):
            s = i % NUM_BUF
            phase = (i // NUM_BUF) & 1
            if PRODUCER:
                mbarrier.wait(empty.index(s), phase ^ 1)
                fence_async_shared()
                mbarrier.arrive(ready.index(s), count=1)
            else:
                mbarrier.wait(ready.index(s), phase)
                mbarrier.arrive(empty.index(s), count=1)

    @gluon.jit
    def _consumer(Q, q_smem, kv_bufs, ready, empty, IDX, row, lo, hi, num_tokens, flags, ERR, qk_scale, SINK, O, LSE,
                  b, hb, sp, H, stride_qb, stride_qh, stride_ob, stride_oh, stride_os, nsplit, trace,
                  HAS_SINK: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr,
                  D: gl.constexpr, TRACED: gl.constexpr):
        """Default partition (2 warp groups): Q into shared memory, wgmma + online softmax over the
        ring, then the rows' output and lse (final, or this slice's partial), and the error bits
        (``flags`` from the row's length, an index past the cache, a non-finite sink) into ERR."""
        # Q [BLOCK_H, 512] -> shared memory once, here rather than before the split into partitions,
        # so the producer's first gather does not wait for it; every tile's Q @ K^T reads it there
        rowmajor: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [gl.num_warps(), 1], [1, 0])
        heads_ld = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, rowmajor))
        col_ld = gl.arange(0, D, layout=gl.SliceLayout(0, rowmajor))
        q = gl.load(Q + b * stride_qb + gl.expand_dims(heads_ld, 1) * stride_qh + gl.expand_dims(col_ld, 0),
                    mask=gl.expand_dims(heads_ld < H, 1), other=0.0)
        q_smem.store(q.to(gl.bfloat16))
        fence_async_shared()
        _clock(trace, 1, TRACED)
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, BLOCK_N // 2, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, D // 2, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
        rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        m_i = gl.full([BLOCK_H], -1e30, gl.float32, rows_s)
        l_i = gl.zeros([BLOCK_H], gl.float32, rows_s)
        acc = gl.zeros([BLOCK_H, D], gl.float32, o_layout)
        s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout)
        t = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        top = gl.full([BLOCK_N], -1, gl.int32, gl.SliceLayout(0, s_layout))    # the largest index read (flagged)
        n_tiles = gl.cdiv(hi - lo, BLOCK_N)
        for i in range(n_tiles):
            s = i % NUM_BUF
            phase = (i // NUM_BUF) & 1
            pos = lo + i * BLOCK_N + t
            tok = gl.load(IDX + row + pos, mask=pos < hi, other=-1)      # issued before the wait
            valid = gl.expand_dims((pos < hi) & (tok.to(gl.uint32) < num_tokens), 0)
            top = gl.maximum(top, tok)
            kv = kv_bufs.index(s)
            mbarrier.wait(ready.index(s), phase)
            if i == 0:
                _clock(trace, 5, TRACED)
            sc = warpgroup_mma(q_smem, kv.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            sc = warpgroup_mma_wait(num_outstanding=0, deps=(sc,))
            sc = gl.where(valid, sc, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(sc, axis=1) * qk_scale)
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(sc * qk_scale - gl.expand_dims(m_new, 1))
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, rows_o), 1)
            p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
            acc = warpgroup_mma(p_op, kv, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index(s), count=1)
            if i == 0:
                _clock(trace, 6, TRACED)
        _clock(trace, 7, TRACED)
        # the rows' output and lse (head_batched._finish_rows, in this layout): a NaN sum gives a NaN row,
        # and so does a sum of 0 after reading a token (every score lost: an extreme sm_scale or q)
        heads = hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=rows_o)
        hmask = heads < H
        l_o = gl.convert_layout(l_i, rows_o)
        m_o = gl.convert_layout(m_i, rows_o)
        empty = l_o == 0.0
        lost = gl.zeros_like(empty)
        if gl.min(l_o, axis=0) == 0.0:
            lost = empty & _any_token(IDX, row, lo, hi, num_tokens, gl.SliceLayout(0, s_layout), BLOCK_N)
        l_safe = gl.where(empty, 1.0, l_o)
        lse = gl.where(empty, float("-inf"), (m_o + gl.log2(l_safe)) / 1.4426950408889634)
        # one factor a row (1 / l, and the sink's rescale), multiplied into the row's values
        inv = 1.0 / l_safe
        if HAS_SINK:
            sink = gl.load(SINK + heads, mask=hmask, other=0.0).to(gl.float32)
            new_lse = gl.maximum(lse, sink) + gl.log(1.0 + gl.exp(-gl.abs(lse - sink)))
            new_lse = gl.where(empty, sink, new_lse)
            inv = inv * gl.exp(lse - new_lse)
            lse = new_lse
            flags |= gl.where(gl.min((gl.abs(sink) < float("inf")).to(gl.int32), axis=0) == 1, 0, _SINK_FLAG)
        lost = lost | (l_o == float("inf"))          # a term overflowed (see head_batched._finish_rows)
        lse = gl.where(lost, float("nan"), lse)
        inv = gl.where(lost, float("nan"), inv)
        # out through shared memory (Q's buffer: the last Q K^T has completed), so each thread
        # stores 16 bytes of a row instead of the MMA layout's scattered 4-byte pieces
        q_smem.store((acc * gl.expand_dims(inv, 1)).to(gl.bfloat16))
        out = q_smem.load(rowmajor)
        o_ptr = (O + b * stride_ob + gl.expand_dims(heads_ld, 1) * stride_oh + sp * stride_os
                 + gl.expand_dims(col_ld, 0))
        gl.store(o_ptr, out.to(O.dtype.element_ty), mask=gl.expand_dims(heads_ld < H, 1))
        gl.store(LSE + (b * H + heads) * nsplit + sp, lse, mask=hmask)
        flags |= gl.where(gl.max(top, axis=0) >= num_tokens, _INDEX_FLAG, 0)
        # a non-finite output (NaN fails the compare), over the whole block
        ok = (gl.abs(out.to(gl.float32)) < float("inf")) | gl.expand_dims(heads_ld >= H, 1)
        flags |= gl.where(gl.min(gl.min(ok.to(gl.int32), axis=1), axis=0) == 1, 0, _NONFINITE_FLAG)
        gl.atomic_or(ERR, flags, mask=flags != 0)
        _clock(trace, 8, TRACED)

    @gluon.jit
    def _hopper_decode_kernel(Q, KV_U8, KV_BF16, IDX, TOPK_LEN, SINK, O, LSE, ERR,
                              TRACE, qk_scale, K, H, split_len, num_tokens,
                              stride_qb, stride_qh, stride_ib, stride_ob, stride_oh, stride_os,
                              PAGE_SIZE: gl.constexpr, PAGE_BYTES: gl.constexpr,
                              HAS_TOPK_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
                              BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, NUM_BUF: gl.constexpr,
                              CHUNK: gl.constexpr, PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                              D: gl.constexpr, NOPE: gl.constexpr, num_warps: gl.constexpr,
                              LAUNCH_DEPENDENTS: gl.constexpr = False, TRACED: gl.constexpr = False,
                              ABLATE: gl.constexpr = 0):
        trace = TRACE + ((gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(2)
                         + gl.program_id(2)) * 10
        _clock(trace, 0, TRACED)
        if TRACED:
            sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
            gl.store(trace + 9, sm.to(gl.int64))
        if LAUNCH_DEPENDENTS:
            tl.extra.cuda.gdc_launch_dependents()      # let the combine launch now (it waits on the GPU)
        b = gl.program_id(0)
        hb = gl.program_id(1)
        sp = gl.program_id(2)
        nsplit = gl.num_programs(2)
        # the row's length: topk_len[b] clamped to [0, K], flagged when it lay outside
        n_valid = K
        flags = gl.to_tensor(0)
        if HAS_TOPK_LEN:
            raw = gl.load(TOPK_LEN + b)
            n_valid = gl.minimum(gl.maximum(raw, 0), K)
            flags = gl.where(raw.to(gl.uint32) > K, _TOPK_LEN_FLAG, 0)
        lo = sp * split_len
        hi = gl.minimum(lo + split_len, n_valid)
        row = b * stride_ib

        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, D], gl.bfloat16)
        kv_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.bfloat16)
        q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D], q_layout)
        kv_bufs = gl.allocate_shared_memory(gl.bfloat16, [NUM_BUF, BLOCK_N, D], kv_layout)
        ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_BUF):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        fence_async_shared()

        # (each branch writes the partitions' arguments out: held in tuples, they did not compile
        # with triton 3.6's Gluon)
        if ABLATE == 1 or ABLATE == 3 or ABLATE == 4:
            # consumers that only pass the buffers back: the producer alone (3: without its gather,
            # 4: without its dequant and stores)
            PART: gl.constexpr = 0 if ABLATE == 1 else ABLATE - 2
            gl.warp_specialize([
                (_idle, (kv_bufs, ready, empty, lo, hi, BLOCK_N, NUM_BUF, False)),
                (_producer, (IDX, KV_U8, KV_BF16, kv_bufs, ready, empty, row, lo, hi, num_tokens, trace,
                             PAGE_SIZE, PAGE_BYTES, BLOCK_N, CHUNK, NUM_BUF, NOPE, TRACED, PART)),
            ], [PRODUCER_WARPS], [PRODUCER_REGS])
        elif ABLATE == 2:       # a producer that only publishes the buffers: the consumers alone
            gl.warp_specialize([
                (_consumer, (Q, q_smem, kv_bufs, ready, empty, IDX, row, lo, hi, num_tokens, flags, ERR, qk_scale, SINK,
                             O, LSE, b, hb, sp, H, stride_qb, stride_qh, stride_ob, stride_oh, stride_os, nsplit,
                             trace, HAS_SINK, BLOCK_H, BLOCK_N, NUM_BUF, D, TRACED)),
                (_idle, (kv_bufs, ready, empty, lo, hi, BLOCK_N, NUM_BUF, True)),
            ], [PRODUCER_WARPS], [PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_consumer, (Q, q_smem, kv_bufs, ready, empty, IDX, row, lo, hi, num_tokens, flags, ERR, qk_scale, SINK,
                             O, LSE, b, hb, sp, H, stride_qb, stride_qh, stride_ob, stride_oh, stride_os, nsplit,
                             trace, HAS_SINK, BLOCK_H, BLOCK_N, NUM_BUF, D, TRACED)),
                (_producer, (IDX, KV_U8, KV_BF16, kv_bufs, ready, empty, row, lo, hi, num_tokens, trace,
                             PAGE_SIZE, PAGE_BYTES, BLOCK_N, CHUNK, NUM_BUF, NOPE, TRACED)),
            ], [PRODUCER_WARPS], [PRODUCER_REGS])

if gluon is None:
    _hopper_decode_kernel = None          # no Gluon here: the impl refuses (hopper.unavailable_reason)
