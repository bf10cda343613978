"""Exact top-k over the live prefix of each row, graph-safe: the indexer's selection step.

``torch.topk`` over a [B, max_seq_len] row reads and sorts the whole row, dead tail included,
so its cost follows the maximum context. Here the grid is fixed by the shapes; each program
reads its row's length ``n = seq_lens[b]`` on the device and uses only positions < n. One
program per row (``split`` S = 1), or S per row: each takes the exact top-k of its chunk of the
row (ties to the lower position) as k candidates in chunk order, then one program per row selects
among the S*k candidates the same way: the row's last chunk program to finish, in the same launch
(it takes the last ticket of the row's counter), or a second launch (``merge="launch"``). A
candidate's index grows with its position and every position of the row's top-k is in its chunk's
top-k, so both steps together give the contract below exactly. The select is a radix select on
order-preserving integer keys:

    key(x) = bits(x) with the sign bit flipped for x >= 0 and all bits flipped for x < 0
             (an unsigned key that orders exactly like the float; -0.0 and +0.0 share one key),
             and 0xFFFFFFFF, above +inf's, for every NaN

    pass 0: the row's largest key anchors 2^RADIX buckets (32): the 31 ``ANCHOR``-bit key prefixes
            at and below the largest one's (1/4 octave each for 11 bits: almost eight octaves of
            values) and one for everything lower. The bucket holding the k-th largest fixes the
            first ``ANCHOR`` bits of the threshold, unless it is the lowest one (a miss: the k-th
            largest lies below them all, e.g. negative under a positive maximum). Then the row's
            smallest key anchors the buckets upwards (``rebase``), and only if the k-th largest
            is in the top one of those too do the passes start from the top bit.
    pass p: histogram of the next RADIX bits of the keys that match the prefix fixed so far,
            then the digit d holding the k_rem-th largest: keys above d are in, keys below are
            out, d is appended to the prefix and only its bucket is refined next pass.

The passes stop as soon as the bucket of the threshold is needed whole (or all 32 bits are
fixed): on the lab's random indexer inputs (8192 live, k = 512) a numpy replay of the passes takes 3
in all, against 4-5 without the anchor. A grid's time is its slowest program's, and a miss cost a
chunk 4-6 passes from the top bit (the same replay); the second anchor costs a miss one reduction
and one histogram, then the usual refining passes.
A last pass writes the chosen positions: one scan of the tile gives every chosen key its slot, and
what it stores (its logit, or the position a candidate stands for) was loaded with its key, so
nothing waits on a second trip to L2; the scan's totals, a block-wide reduction, are paid only by a
row of more than one tile. The fused merge anchors its pass 0 at the largest of the chunks' largest
keys (each chunk writes its own before its ticket), not at a reduction over its candidates, and its
refining passes go on in the chunk's rotation of shared histograms. These changes together took 2-3%
off the top-k at B = 32, 8192 live (H100, experiments/indexer_topk, lean runs 12-13). Each pass
reads the row from registers when it fits in one tile of ``TILE`` positions, else streams the rest
of it tile by tile (the first tile stays in registers). Every pass costs a histogram over the whole
tile (Triton's, pass 0's everywhere, is built from warp ballots, ~45 instructions a key at 32 bins,
then the warps' counts meet in shared memory: two barriers) and a handful of scans and reductions
over its 32 bins, which compile to warp-level shuffles and ``redux`` (ptxas, sm_90). The GPU's clock
inside the programs (H200, experiments/topk_clocks) prices a pass at ~0.8 us over 2048 keys and ~2.2
us over 8192: the time is passes x (a fixed part + the tile), which is why copying the threshold's
bucket out to refine or rank it alone measured slower (the copy is a scan over the tile), and why
what paid was fewer misses on the slowest program: pass 0 over eight octaves instead of four (-1.6
us at B = 32, 8192 live), and where one still misses, the second anchor (-1.2 to -2.7 us at B = 8,
64, 128 and 5000 live; experiments/indexer_topk, lean runs). On a GPU the refining passes count in
shared memory instead (``TopkLaunch.histogram`` says where ballots remain; one barrier a pass):
after pass 0 only the keys of one bucket still match, and a ballot histogram pays for every key of
the tile whether it matches or not, where atomics pay little for a key that does not (lean run 10:
-1.5 us at B = 32, -27% at 65536 live, on an H100; run 11 found pass 0 itself slower in shared
memory).

The contract (``reference.topk_positions`` is the same in float64):

* the k largest logits among the positions t < seq_len whose logit is not -inf (a dead or
  unreadable position is never chosen); ties at the k-th value go to the lower positions; a NaN
  counts as larger than every number, as in ``torch.topk`` (so a NaN read past seq_len would be
  chosen first: the lab's tests write NaN there);
* output int32 [B, k], the chosen positions in **ascending position order**, then -1 for
  the rest of the row when fewer than k positions qualify (seq_len < k, seq_len 0, -inf);
* ``seq_lens`` are clamped to [0, width], as the logits kernel clamps them;
* in the indexer step (``pages``) a live logit that is NaN or +inf (pass 0's largest key, free) or
  -inf where the row chose fewer than min(k, live) positions is flagged in the error word
  (INDEXER_NONFINITE): such a row's positions are not an answer.

Ascending positions, not descending logits: the sparse decode reads the chosen tokens as a set
(one softmax over all of them), and in position order its gathers walk the paged cache forward.

The kernel's ``ROLE`` says what a program does: 0 the top-k of a whole row, 1 the top-k of one chunk
of a row (its candidates), 2 the merge of a row's candidates, 3 a chunk that also merges its row when
it is the row's last to finish. The launches and their options are in topk.py beside this file.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ...config import PAGE_SIZE
from ..rows import INDEXER_NONFINITE_FLAG, live_length

#: output positions one store of the -1 padding covers
OUT_BLOCK = 1024
#: +inf's key (order_keys): a key at or above it is a +inf or NaN logit
INF_KEY = tl.constexpr(0xFF800000)


@triton.jit
def order_keys(x, n_ok):
    """uint32 keys ordered like the float32 ``x``, every NaN above +inf (one key, whatever its sign
    and payload: as torch.topk orders them); 0 (no float has it) where ``~n_ok`` or x is -inf."""
    i = tl.where(x == 0.0, 0, x.to(tl.int32, bitcast=True))           # -0.0 -> +0.0
    i = tl.where(x != x, 0x7FFFFFFF, i)                              # NaN -> the largest key
    s = i ^ ((i >> 31) & 0x7FFFFFFF)                                 # signed key: negatives reversed
    u = (s ^ -2147483648).to(tl.uint32, bitcast=True)                # flip the sign bit: unsigned order
    return tl.where(n_ok & (x != float("-inf")), u, 0)


@triton.jit
def _digit(key, himask, prefix, lo, dmask):
    """A refining pass's buckets: the digit (key >> lo) & dmask, and which keys count (valid, and
    their fixed bits match prefix)."""
    return ((key >> lo) & dmask).to(tl.int32), (key != 0) & ((key & himask) == prefix)


@triton.jit
def _anchored(key, base, SH: tl.constexpr, NB: tl.constexpr):
    """Pass 0's buckets: the key prefix (key >> SH) - base clamped to [0, NB - 1], and which keys
    count (the valid ones)."""
    return tl.minimum(tl.maximum((key >> SH).to(tl.int32) - base, 0), NB - 1), key != 0


@triton.jit
def _hist_words():
    """Shared-memory address of the passes' three rotating histograms of up to 256 bins (a static
    array of 4 x 256 words the PTX declares: Triton has no shared-memory atomics)."""
    return tl.inline_asm_elementwise("{ .shared .align 16 .b32 dsv4lab_topk_hist[1024]; mov.u32 $0, dsv4lab_topk_hist; }",
                                     "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _count(h, bucket, ok, words, p, SHARED: tl.constexpr, NB: tl.constexpr):
    """Add one tile's keys (``bucket`` where ``ok``) to pass p's histogram: ``h`` + a ballot
    histogram (``tl.histogram``), or (SHARED) atomics on shared histogram p % 3 at ``words``, where
    the lanes of a warp with the same bucket first agree on it (match.any) and one of them adds
    their count: a bucket most keys share costs one atomic a warp, not 32 in a row."""
    if SHARED:
        addr = words + (p % 3) * (4 * NB) + bucket * 4
        tl.inline_asm_elementwise(
            "{ .reg .pred p, l; .reg .b32 a, m, lt, c; setp.ne.s32 p, $2, 0; selp.b32 a, $1, -1, p; "
            "match.any.sync.b32 m, a, -1; mov.u32 lt, %lanemask_lt; and.b32 lt, lt, m; "
            "setp.eq.and.b32 l, lt, 0, p; popc.b32 c, m; @l red.shared.add.u32 [a], c; mov.u32 $0, 0; }",
            "=r,r,r", [addr, ok.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
        return h
    return h + tl.histogram(bucket, NB, mask=ok)


@triton.jit
def _counted(h, words, p, SHARED: tl.constexpr, NB: tl.constexpr):
    """Pass p's histogram once every tile is counted. SHARED: a barrier, then every thread reads
    histogram p % 3 and clears (p + 2) % 3, whose last read was pass p - 1's (before this barrier)
    and whose next count is pass p + 2's (after the next): one barrier a pass."""
    if SHARED:
        bins = tl.arange(0, NB) * 4
        tl.debug_barrier()
        h = tl.inline_asm_elementwise("ld.shared.u32 $0, [$1];", "=r,r", [words + (p % 3) * (4 * NB) + bins],
                                      dtype=tl.int32, is_pure=False, pack=1)
        _clear(words + ((p + 2) % 3) * (4 * NB) + bins)
    return h


@triton.jit
def _clear(addr):
    """Set the shared-memory words at ``addr`` to 0."""
    tl.inline_asm_elementwise("st.shared.u32 [$1], 0; mov.u32 $0, 0;", "=r,r", [addr], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def _select_digit(h, bins, k_rem):
    """For a histogram ``h`` of the candidates: (the digit holding the k_rem-th largest, how many
    are above it, how many are in it, k_rem capped at the candidates' count)."""
    tot = tl.sum(h, 0)
    k_rem = tl.minimum(k_rem, tot)                                 # fewer valid keys than k: all of them
    at_or_above = tot - tl.cumsum(h, 0) + h                        # keys with digit >= d
    d = tl.max(tl.where(at_or_above >= k_rem, bins, 0), 0)         # (bin 0 always qualifies)
    above = tl.sum(tl.where(bins > d, h, 0), 0)
    in_d = tl.sum(tl.where(bins == d, h, 0), 0)
    return d, above, in_d, k_rem


@triton.jit
def _refine(h, bins, k_rem, prefix, himask, new_lo, dmask):
    """One pass's outcome from its histogram ``h`` of bits new_lo.. of the matching keys: the digit
    of the k_rem-th largest appended to the prefix, k_rem less the keys above it, and whether
    another pass is needed (not once the digit's bucket is wanted whole, or every bit is fixed)."""
    d, above, in_d, k_rem = _select_digit(h, bins, k_rem)
    k_rem = k_rem - above
    prefix = prefix | (d.to(tl.uint32) << new_lo)
    himask = himask | (dmask << new_lo)
    return prefix, himask, k_rem, (new_lo > 0) & (in_d > k_rem)


@triton.jit
def _load_keys(row, c, offs, n):
    """Keys of positions c + offs of a row of n live logits (0 past n)."""
    pos = c + offs
    return order_keys(tl.load(row + pos, mask=pos < n, other=float("-inf")), pos < n)


@triton.jit
def _load_tile(row, aux, c, offs, n, ROLE: tl.constexpr):
    """Tile c of a row: its keys, and what its chosen keys store besides their slots (_store): role 1
    the logits themselves, role 2 the positions the candidates stand for (from ``aux``)."""
    pos = c + offs
    x = tl.load(row + pos, mask=pos < n, other=float("-inf"))
    key = order_keys(x, pos < n)
    if ROLE == 1:
        held = x
    elif ROLE == 2:
        held = tl.load(aux + pos, mask=pos < n, other=-1)
    else:
        held = pos
    return key, held


@triton.jit
def _emit(key, himask, prefix, k_rem, eq_seen, taken):
    """Which keys of one tile are chosen, their output slots, and the keys' counts packed for
    _tally. One scan for both counts: keys above the threshold in the high 16 bits, keys at it in
    the low 16 of a uint32 (a tile holds at most 2^15 keys: a tile all above the threshold fills bit
    31, which an int32 would sign). ``eq_seen``, ``taken``: keys equal to the threshold seen and
    positions stored in the row's tiles before this one."""
    top = key & himask
    ok = key != 0
    gt = (ok & (top > prefix)).to(tl.int32)
    eq = (ok & (top == prefix)).to(tl.int32)
    packed = (gt.to(tl.uint32) << 16) | eq.to(tl.uint32)
    c = tl.cumsum(packed, 0)
    gt_before = (c >> 16).to(tl.int32) - gt                          # in this tile, exclusive
    eq_before = eq_seen + (c & 0xFFFF).to(tl.int32) - eq             # in the row, exclusive
    sel = (gt != 0) | ((eq != 0) & (eq_before < k_rem))              # ties: the lower positions first
    slot = taken + gt_before + tl.minimum(eq_before, k_rem) - tl.minimum(eq_seen, k_rem)
    return sel, slot, packed


@triton.jit
def _tally(packed, k_rem, eq_seen, taken):
    """The running counts (eq_seen, taken) after a tile _emit packed: both in one reduction, which
    only a row of more than one tile pays."""
    tot = tl.sum(packed, 0)
    n_gt = (tot >> 16).to(tl.int32)
    n_eq = (tot & 0xFFFF).to(tl.int32)
    return eq_seen + n_eq, taken + n_gt + tl.minimum(eq_seen + n_eq, k_rem) - tl.minimum(eq_seen, k_rem)


@triton.jit
def _store(out, aux, sel, slot, pos, start, held, ROLE: tl.constexpr):
    """Store one tile's chosen keys (``held``: from _load_tile): role 0 their positions; role 1 the
    candidates (position start + pos in ``out``, its logit in ``aux``); role 2 the positions the
    candidates stand for. Nothing is loaded again: a load here would wait a round trip to L2."""
    if ROLE == 0:
        tl.store(out + slot, pos, mask=sel)
    elif ROLE == 1:
        tl.store(out + slot, start + pos, mask=sel)
        tl.store(aux + slot, held, mask=sel)
    else:
        tl.store(out + slot, held, mask=sel)


@triton.jit
def _topk_kernel(X, SEQ, OUT, AUX, PT, ERR, FINAL, CNT, MAXK, width, k, stride_xb, stride_ob, stride_fb, num_pages,
                 stride_pb, TILE: tl.constexpr, RADIX: tl.constexpr, OUT_BLOCK: tl.constexpr,
                 ANCHOR: tl.constexpr = 11, ROLE: tl.constexpr = 0, GUARD: tl.constexpr = False,
                 PAGE: tl.constexpr = PAGE_SIZE, MERGE_TILE: tl.constexpr = 32, REBASE: tl.constexpr = True,
                 SHARED_HIST: tl.constexpr = False, SPLIT: tl.constexpr = 1):
    """ROLE 0: the top-k of row b's live prefix. ROLE 1 (grid (B, S)): the top-k of chunk s of
    it, written as k candidates (positions to OUT, logits to AUX: [B, S*k], chunk s at s*k, -1 /
    -inf padded). ROLE 2: the top-k of a row's S*k candidates (X), emitted as the positions AUX
    holds for them. ROLE 3 (S = SPLIT): role 1, then the row's last chunk to finish (a ticket from
    the row's counter CNT[b]) runs role 2 on the row's candidates into FINAL, in tiles of
    MERGE_TILE, anchored at the largest of the chunks' largest keys (MAXK [B, S]).
    GUARD (roles 0, 1 and 3): seq_lens[b] is checked and cut as the indexer's contract says
    (rows.live_length) and flagged in the error word ERR. SHARED_HIST: the refining passes count
    by shared-memory atomics (``TopkLaunch.histogram``)."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    offs = tl.arange(0, TILE)
    start = 0
    if ROLE == 2:
        n = width                                                      # every candidate (padding is -inf)
        aux = AUX + b * stride_xb
    elif ROLE % 2 == 1:
        # chunks of TILE positions while the row fits S of them: chunk s starts at s * TILE whatever
        # seq_len says, so its tile's load goes out beside seq_len's instead of after it
        first = s * TILE + offs
        x0 = tl.load(X + b * stride_xb + first, mask=first < width, other=float("-inf"))
        n = tl.minimum(tl.maximum(tl.load(SEQ + b), 0), width)
        aux = AUX + b * stride_ob + s * k
        chunk = tl.maximum((n + tl.num_programs(1) - 1) // tl.num_programs(1), TILE)
        start = s * chunk
        n = tl.maximum(tl.minimum(n - start, chunk), 0)
        longer = chunk > TILE                                          # a longer row: chunks of ceil(n / S)
        x1 = tl.load(X + b * stride_xb + start + offs, mask=offs < tl.where(longer, n, 0), other=float("-inf"))
        x0 = tl.where(longer, x1, x0)
    else:
        n = tl.minimum(tl.maximum(tl.load(SEQ + b), 0), width)
        aux = AUX + b * stride_ob + s * k
    row = X + b * stride_xb + start
    out = OUT + b * stride_ob + s * k
    if ROLE % 2 == 1:
        key0 = order_keys(x0, offs < n)
        held0 = x0
    else:
        key0, held0 = _load_tile(row, aux, 0, offs, n, ROLE)          # the first tile stays in registers
    words = 0
    if SHARED_HIST:
        words = _hist_words()
        _clear(words + tl.arange(0, 4 * (1 << RADIX)) * 4)            # every pass of the program counts from here
        tl.debug_barrier()
    if GUARD:
        # the cut needs the row's live page ids: the first tile's load does not wait for it
        cut, flags = live_length(SEQ, PT, b, width, num_pages, stride_pb, PAGE, 1024)
        n = tl.maximum(tl.minimum(n, cut - start), 0)
        key0 = tl.where(offs < n, key0, 0)
        tl.atomic_or(ERR, flags, mask=(flags != 0) & (s == 0))
    SEL: tl.constexpr = 1 if ROLE == 3 else ROLE                    # role 3's chunks store as role 1's
    p, kmax, k_all = _select(row, out, aux, n, key0, held0, k, start, words, tl.zeros([], tl.int32),
                             tl.zeros([], tl.uint32), TILE, RADIX, OUT_BLOCK, ANCHOR, SEL, REBASE, SHARED_HIST, False)
    if GUARD:
        # a live logit NaN or +inf (ranked first: pass 0's largest key, ANCHOR > 0), or -inf where fewer
        # than k were chosen (never chosen, as a dead position): a logit the indexer could not compute
        bad = k_all < tl.minimum(k, n)
        if ANCHOR > 0:
            bad |= kmax >= INF_KEY
        tl.atomic_or(ERR, INDEXER_NONFINITE_FLAG, mask=bad)
    if ROLE == 3:
        tl.store(MAXK + b * SPLIT + s, kmax.to(tl.int32, bitcast=True))
        # every thread's candidate stores before the ticket's release (barrier + acq_rel atomic);
        # the last ticket resets the counter, so a CUDA graph replays from zero
        tl.debug_barrier()
        ticket = tl.atomic_add(CNT + b, 1, sem="acq_rel", scope="gpu")
        if ticket == tl.num_programs(1) - 1:
            tl.atomic_xchg(CNT + b, 0, sem="relaxed", scope="gpu")
            m = tl.num_programs(1) * k
            mo = tl.arange(0, MERGE_TILE)
            mkey, mheld = _load_tile(AUX + b * stride_ob, OUT + b * stride_ob, 0, mo, m, 2)
            # the candidates' largest key is the largest chunk's: no reduction over the candidates
            mmax = tl.max(tl.load(MAXK + b * SPLIT + tl.arange(0, SPLIT)).to(tl.uint32, bitcast=True), 0)
            # the passes go on counting in the chunk's histograms (_counted's rotation): none to clear
            _select(AUX + b * stride_ob, FINAL + b * stride_fb, OUT + b * stride_ob, m, mkey, mheld, k, 0, words, p,
                    mmax, MERGE_TILE, RADIX, OUT_BLOCK, ANCHOR, 2, REBASE, SHARED_HIST, True)


@triton.jit
def _select(row, out, aux, n, key0, held0, k, start, words, p, kmax, TILE: tl.constexpr, RADIX: tl.constexpr,
            OUT_BLOCK: tl.constexpr, ANCHOR: tl.constexpr, ROLE: tl.constexpr, REBASE: tl.constexpr,
            SHARED_HIST: tl.constexpr, KMAX_GIVEN: tl.constexpr):
    """The top-k of the n keys at ``row`` (``key0``, ``held0``: its first tile, _load_tile), stored as
    ``ROLE`` says (_store), then the -1 (and, role 1, -inf) padding of the k output slots.
    Refining pass p counts (_count, _counted) by ballots, or (SHARED_HIST) in shared histogram p % 3
    at ``words``, from the ``p`` given. ``kmax`` (KMAX_GIVEN): the keys' largest, known already.
    Returns the passes counted, the keys' largest (0 if ANCHOR is 0) and how many keys were chosen."""
    offs = tl.arange(0, TILE)
    NB: tl.constexpr = 1 << RADIX
    bins = tl.arange(0, NB)
    zero = tl.zeros([NB], tl.int32)
    prefix = tl.zeros([], tl.uint32)       # the key bits fixed so far (bits below lo are 0)
    himask = tl.zeros([], tl.uint32)       # which bits those are
    lo = tl.full([], 32, tl.int32)         # bits lo..31 are fixed
    k_rem = k                              # how many keys equal to the prefix are still wanted
    k_all = k                              # how many are chosen in all: k capped at the valid keys
    busy = lo > 0
    if ANCHOR > 0:
        SH: tl.constexpr = 32 - ANCHOR
        if not KMAX_GIVEN:
            kmax = tl.max(key0, 0)
            for c in range(TILE, n, TILE):
                kmax = tl.maximum(kmax, tl.max(_load_keys(row, c, offs, n), 0))
        base = (kmax >> SH).to(tl.int32) - (NB - 1)
        # pass 0 counts by ballots in either form: most keys share a few of its buckets, and its
        # atomics measured slower (experiments/indexer_topk, lean run 11)
        bucket, ok = _anchored(key0, base, SH, NB)
        h = _count(zero, bucket, ok, words, p, False, NB)
        for c in range(TILE, n, TILE):
            bucket, ok = _anchored(_load_keys(row, c, offs, n), base, SH, NB)
            h = _count(h, bucket, ok, words, p, False, NB)
        d, above, in_d, k_rem = _select_digit(h, bins, k_rem)
        k_all = k_rem
        hit = d > 0                        # the lowest bucket holds every lower prefix: a miss
        if REBASE:
            if d == 0:
                # the k-th largest is over NB - 1 buckets below the largest key: anchor the buckets
                # at the smallest key instead, upwards (bucket 0 is then exact, the top one takes
                # every higher prefix); a miss of both starts from the top bit
                kmin = tl.min(tl.where(key0 != 0, key0, 0xFFFFFFFF), 0)
                for c in range(TILE, n, TILE):
                    kt = _load_keys(row, c, offs, n)
                    kmin = tl.minimum(kmin, tl.min(tl.where(kt != 0, kt, 0xFFFFFFFF), 0))
                base = (kmin >> SH).to(tl.int32)
                bucket, ok = _anchored(key0, base, SH, NB)
                h = _count(zero, bucket, ok, words, p, False, NB)
                for c in range(TILE, n, TILE):
                    bucket, ok = _anchored(_load_keys(row, c, offs, n), base, SH, NB)
                    h = _count(h, bucket, ok, words, p, False, NB)
                d, above, in_d, k_rem = _select_digit(h, bins, k_rem)
                hit = d < NB - 1
        prefix = tl.where(hit, (base + d).to(tl.uint32) << SH, prefix)      # shifted unsigned: no overflow
        himask = tl.where(hit, ~tl.zeros([], tl.uint32) << SH, himask)
        lo = tl.where(hit, SH, lo)
        k_rem = tl.where(hit, k_rem - above, k_rem)
        busy = tl.where(hit, in_d > k_rem, busy)
    while busy:
        new_lo = tl.maximum(lo - RADIX, 0)
        dmask = ((1 << (lo - new_lo)) - 1).to(tl.uint32)
        bucket, ok = _digit(key0, himask, prefix, new_lo, dmask)
        h = _count(zero, bucket, ok, words, p, SHARED_HIST, NB)
        for c in range(TILE, n, TILE):
            bucket, ok = _digit(_load_keys(row, c, offs, n), himask, prefix, new_lo, dmask)
            h = _count(h, bucket, ok, words, p, SHARED_HIST, NB)
        h = _counted(h, words, p, SHARED_HIST, NB)
        if ANCHOR == 0:
            k_all = tl.where(p == 0, tl.minimum(k_all, tl.sum(h, 0)), k_all)
        p += 1
        prefix, himask, k_rem, busy = _refine(h, bins, k_rem, prefix, himask, new_lo, dmask)
        lo = new_lo
    sel, slot, packed = _emit(key0, himask, prefix, k_rem, 0, 0)
    _store(out, aux, sel, slot, offs, start, held0, ROLE)
    if n > TILE:                           # the running counts, for the tiles after the first
        eq_seen, taken = _tally(packed, k_rem, 0, 0)
        for c in range(TILE, n, TILE):
            key, held = _load_tile(row, aux, c, offs, n, ROLE)
            sel, slot, packed = _emit(key, himask, prefix, k_rem, eq_seen, taken)
            eq_seen, taken = _tally(packed, k_rem, eq_seen, taken)
            _store(out, aux, sel, slot, c + offs, start, held, ROLE)
    o = tl.arange(0, OUT_BLOCK)
    for c in range(0, k, OUT_BLOCK):
        pad = (c + o >= k_all) & (c + o < k)
        tl.store(out + c + o, tl.full([OUT_BLOCK], -1, tl.int32), mask=pad)
        if ROLE == 1:
            tl.store(aux + c + o, tl.full([OUT_BLOCK], float("-inf"), tl.float32), mask=pad)
    return p, kmax, k_all
