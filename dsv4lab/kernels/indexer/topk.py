"""The exact top-k over the live prefix of each row (the indexer's selection step): its launch options
(:class:`TopkLaunch`, the shipped ``TOPK``), how a row is split over programs, and the launches. The
kernel and its algorithm (a radix select on order-preserving keys) are in topk_kernel.py; the contract
(``reference.topk_positions`` is the same in float64): the k largest logits among positions t < seq_len
that are not -inf, ties to the lower position, NaN above every number, int32 [B, k] in ascending
position order, -1 padded.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch

from ... import errors
from ...config import PAGE_SIZE
from ...contracts import MAX_TOPK
from ...device import info, is_interpret
from .. import buffers
from ..buffers import alloc
from ..launch import bind_launch, launch_kernel, next_power_of_2
from .topk_kernel import OUT_BLOCK, _topk_kernel


@dataclass(frozen=True)
class TopkLaunch:
    """The top-k kernel's launch options (experiments/indexer_topk times variants of them).

    ``tile``: positions a program holds in registers at once (8192: the campaign's live length
    in one tile); ``radix``: key bits resolved per pass (5: 32 bins, the fewest Triton's
    histogram takes, one per lane of a warp; the cost per key of its ballot-based histogram grows
    with the bins); ``num_warps``: per program (16 warps hold a tile of 8192 keys as 16 a thread);
    ``anchor``: the key bits of pass 0's buckets (0: no pass 0, the radix starts at the top bit);
    ``split``: programs per row S (a power of two; None: ``split_for`` from the shapes; 1: the
    one-launch path). With S > 1 chunk s of a row of n live positions is [s*ceil(n/S), ...), each
    chunk program holds ``tile / S`` positions at once, and the row's S*k candidates are selected
    among the same way (a tile of min(``tile``, S*k rounded up to a power of two)). While a row
    fits S tiles of ``tile / S`` its chunks are those tiles instead (chunk s starts at s*tile/S
    whatever seq_len says, so the chunk's load is issued beside seq_len's, not after it; the
    positions it loads past seq_len are never used). ``merge``
    (S > 1): "fused", the row's last chunk program to finish does that in the chunk launch (one
    launch in all); "launch", a second launch of B programs does it. ``rebase``: after a miss of
    pass 0, anchor its buckets again at the smallest key. ``histogram``: how the refining passes
    count ("ballot": ``tl.histogram``, ~45 instructions a key whether it still matches or not;
    "shared": shared-memory atomics by inline PTX, one per distinct digit of a warp's matching
    keys, ~10 instructions a key; a GPU only: the interpreter, and launches whose tiles are smaller
    than their programs' threads, count by ballots, ``counts_in_shared``). Pass 0 counts by
    ballots either way."""
    tile: int = 8192
    radix: int = 5
    num_warps: int = 16
    anchor: int = 11
    split: int | None = None
    merge: str = "fused"
    rebase: bool = True
    histogram: str = "shared"

    def as_dict(self) -> dict:
        return asdict(self)


#: the shipped launch: tile 8192, 5-bit passes, split from ``split_for``, the merge fused into
#: the chunk launch (H200, B = 32, live 8192: 18.8 us, against 20.5 us with a merge launch and
#: 22.6 us with S = 1; experiments/indexer_topk, run 8), pass 0 over eight octaves with a second
#: anchor after a miss, each chunk's tile loaded beside seq_len (16.6-16.7 us; 18.3-18.7 for four
#: octaves and no second anchor; experiments/indexer_topk, lean runs 3-6), the refining passes
#: counted in shared memory by 16 warps (H100, lean run 10: 15.6 us against 17.1 with ballots and
#: 8 warps in the same run; pass 0 in shared memory too was slower, lean run 11; H200, run 15:
#: 15.3 us, where run 13 timed the ballot launch at 16.8), no reloads in the emit and the merge
#: anchored at the chunks' maxima (H100, lean run 13: 14.9-15.1 us against 15.3-15.5 for run 15's
#: kernel in the same run; runs 17-18: 15.0 / 15.0-15.2 us at max 262208 / 1M)
TOPK = TopkLaunch()
def split_for(B: int, width: int, k: int, sm_count: int, tile: int = 8192, most: int = 4) -> int:
    """The programs a row is split over (a power of two, 1: the one-launch path), from shapes only
    (one captured graph serves every step): doubled while the (B, S) grid fits one wave of
    ``sm_count`` programs, S*k candidates fit one ``tile`` and each chunk of a full-width row holds
    >= 2k positions; at most ``most`` (the merge's S*k candidates cost what a row of that length does:
    experiments/indexer_topk's prediction puts the best at 4 for B = 32, k = 512, 8192 live)."""
    s = 1
    while 2 * s <= most and B * 2 * s <= sm_count and 2 * s * k <= tile and width >= 4 * s * k:
        s *= 2
    return s


def topk_triton(logits: torch.Tensor, seq_lens: torch.Tensor, k: int, *, launch: TopkLaunch | None = None,
                pages=None) -> torch.Tensor:
    """Positions int32 [B, k] of the k largest logits among positions < seq_lens[b] (the module's
    contract: ascending positions, ties to the lower position, -1 padded, -inf never chosen).

    ``logits`` float32 [B, width] with unit stride along the row (positions >= seq_lens[b] are
    never used, so they may hold anything; a chunk may load some of the row's first ``tile``
    positions past seq_lens[b] before it knows seq_lens[b]); ``seq_lens`` int32 [B] on the same device. ``pages``:
    (page_table [B, P] int32 with unit column stride, num_pages, page_size) for the indexer step:
    each row is then cut before its first live page id outside [0, num_pages), and a seq_len
    outside [0, width] or such a page id is flagged in the error word (dsv4lab.errors), as the
    API's guard would. No host sync: one launch of B programs (``launch.split`` S = 1) or of B x S
    chunk programs whose last per row merges the row (``merge="launch"``: the merge as a second
    launch of B programs), whatever the lengths."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32 \
            or (logits.shape[1] > 1 and logits.stride(1) != 1):
        raise ValueError(f"logits must be a float32 [B, width] tensor with unit stride along rows, got "
                         f"{getattr(logits, 'dtype', type(logits).__name__)} {list(getattr(logits, 'shape', []))}")
    B, width = logits.shape
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (B,) \
            or seq_lens.device != logits.device:
        raise ValueError(f"seq_lens must be int32 [{B}] on {logits.device}, got "
                         f"{getattr(seq_lens, 'dtype', type(seq_lens).__name__)} {list(getattr(seq_lens, 'shape', []))}")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_TOPK:
        raise ValueError(f"k must be a positive int of at most 2**31 - 1 (positions are int32), got {k!r}")
    return select(logits, seq_lens, k, launch or TOPK, pages)


def select(logits, seq_lens, k: int, launch: TopkLaunch, pages=None) -> torch.Tensor:
    """topk_triton after its argument checks (the indexer step calls it directly). The split's
    candidates go to a workspace kept per shape, as split-K's partials."""
    B, width = logits.shape
    out = alloc((B, k), torch.int32, logits.device)
    if B == 0:
        return out
    table, meta = (seq_lens, None) if pages is None else (pages[0], (pages[1], pages[2], pages[0].stride(0)))
    launches(B, width, logits.stride(0), k, launch, meta, logits.device)(logits, seq_lens, table, out)
    return out


def launches(B: int, width: int, stride_xb: int, k: int, launch: TopkLaunch, pages, device, bound: bool = False):
    """The top-k's launches for one shape (B > 0), as a function ``run(logits, seq_lens, table, out)``
    that makes them: one launch of B programs, the chunk launch with its merge fused, or the chunks
    then the merge. ``pages``: (num_pages, page_size, the page table's row stride) for the indexer
    step's guard (``table`` is then its page table, int32), or None. The workspaces it launches on
    (the chunks' candidates, the rows' counters and largest keys) are fetched here, once: ``select``
    makes it on every call, the indexer's prepared step (triton_indexer.py) once per signature, with
    ``bound`` launches (kernels.launch.bind_launch: made after this shape's first launches)."""
    guard = pages is not None
    num_pages, page_size, pt_stride = pages if guard else (0, PAGE_SIZE, 0)
    S, single, chunks, merge = _topk_args(launch, B, width, k, page_size, guard)
    err = errors.word(device) if guard else None
    i32, f32 = torch.int32, torch.float32

    def launcher(grid, scalars, consts, dtypes):
        if bound:
            return bind_launch(_topk_kernel, grid, scalars, consts, dtypes)
        return lambda *tensors: launch_kernel(_topk_kernel, grid, tensors, scalars, consts)
    if S == 1:
        one = launcher((B, 1), (width, k, stride_xb, k, 0, num_pages, pt_stride), single, (f32,) + (i32,) * 8)

        def run(logits, seq_lens, table, out):
            one(logits, seq_lens, out, out, table, err if guard else seq_lens, out, seq_lens, seq_lens)
        return run
    # the chunks' candidates, the caller's own, kept per shape (buffers.workspaces); their rows are S*k
    # wide, the answer's k wide: strides from the shapes, not stride() calls on every call. The fused
    # merge's rows' ticket counters: zero when made, and back to zero after every launch (poisoned
    # never); each chunk's largest key (written before every read)
    fused_merge = launch.merge == "fused"
    pos, val, count, kmax = buffers.workspaces(("topk", B, S, k, fused_merge, device), device, lambda: (
        torch.empty((B, S * k), dtype=i32, device=device), torch.empty((B, S * k), dtype=f32, device=device),
        buffers.counters(B, device) if fused_merge else None,
        torch.empty((B, S), dtype=i32, device=device) if fused_merge else None))
    buffers.poison_all(pos, val, kmax)
    if fused_merge:
        fused = launcher((B, S), (width, k, stride_xb, S * k, k, num_pages, pt_stride), chunks,
                         (f32, i32, i32, f32) + (i32,) * 5)

        def run(logits, seq_lens, table, out):
            fused(logits, seq_lens, pos, val, table, err if guard else seq_lens, out, count, kmax)
        return run
    chunk = launcher((B, S), (width, k, stride_xb, S * k, 0, num_pages, pt_stride), chunks,
                     (f32, i32, i32, f32) + (i32,) * 5)
    final = launcher((B, 1), (S * k, k, S * k, k, 0, num_pages, 0), merge, (f32,) + (i32,) * 8)

    def run(logits, seq_lens, table, out):
        e = err if guard else seq_lens
        chunk(logits, seq_lens, pos, val, table, e, out, seq_lens, seq_lens)
        final(val, seq_lens, out, pos, table, e, out, seq_lens, seq_lens)
    return run


@functools.lru_cache(maxsize=1024)
def _topk_args(launch: TopkLaunch, B, width, k, page_size, guard):
    """(S, constexprs and options of the one-launch path, of the chunks and of the merge) for a
    shape, after checking ``launch``: shapes and options only, decided once per shape rather than
    on every eager call."""
    if launch.tile & (launch.tile - 1) or not 32 <= launch.tile <= 32768 or launch.radix not in (5, 6, 7, 8) \
            or not 0 <= launch.anchor <= 16:
        raise ValueError(f"tile must be a power of two in [32, 32768], radix in 5..8 and anchor in 0..16, got {launch}")
    S = launch.split or split_for(B, width, k, 2 if is_interpret() else info().sm_count, launch.tile)
    if S & (S - 1) or not 1 <= S <= launch.tile // 32:
        raise ValueError(f"split must be a power of two in [1, tile / 32 = {launch.tile // 32}], got {S}")
    if launch.merge not in ("launch", "fused"):
        raise ValueError(f"merge must be 'launch' or 'fused', got {launch.merge!r}")
    if launch.histogram not in ("ballot", "shared"):
        raise ValueError(f"histogram must be 'ballot' or 'shared', got {launch.histogram!r}")
    opts = dict(RADIX=launch.radix, OUT_BLOCK=min(OUT_BLOCK, next_power_of_2(k)), ANCHOR=launch.anchor,
                PAGE=page_size, num_warps=launch.num_warps,
                REBASE=launch.rebase)
    merge_tile = min(launch.tile, next_power_of_2(S * k))
    fused = launch.merge == "fused"
    shared = lambda *tiles: counts_in_shared(launch, tiles, is_interpret())  # noqa: E731
    return (S, dict(opts, TILE=launch.tile, ROLE=0, GUARD=guard, SHARED_HIST=shared(launch.tile)),
            dict(opts, TILE=launch.tile // S, ROLE=3 if fused else 1, GUARD=guard, MERGE_TILE=merge_tile,
                 SPLIT=S, SHARED_HIST=shared(launch.tile // S, merge_tile)),
            dict(opts, TILE=merge_tile, ROLE=2, SHARED_HIST=shared(merge_tile)))


def counts_in_shared(launch: TopkLaunch, tiles, interpret: bool) -> bool:
    """Whether a launch of ``launch`` whose programs hold these tiles counts in shared memory:
    histogram "shared", on a GPU (the interpreter cannot run inline PTX), and every tile at least
    one key a thread (a smaller tile is held twice over the program's threads, and each copy's
    atomic would count; such a launch counts by ballots)."""
    return launch.histogram == "shared" and not interpret and min(tiles) >= 32 * launch.num_warps
