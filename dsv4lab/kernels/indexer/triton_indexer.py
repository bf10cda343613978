"""S4's indexer: a CUDA-graph-safe Triton indexer that pays for the live context, not the maximum.

The torch path of S0-S3 (fallback.py) gathers, dequantizes and multiplies
ceil(max_seq_len / 64) pages of every request on every decode step. Here the grid is
fixed by shapes only, (B, NPROG) with NPROG from the SM count, so one captured graph
serves every step; each program reads its request's ``seq_len`` on the device and walks
only the *live* pages p = pid, pid + NPROG, ... < ceil(seq_len / 64):

    k8 [64 tokens, 128] fp8 -> bf16 (exact), s = k8 @ q^T  (tl.dot, [64, H])
    logits = k_scale * sum_h w[h] * relu(s[:, h])      (the scale is > 0: it factors out)

Positions past ``seq_len`` get -inf: inside the last live page by a mask, beyond it by a
fill loop that stores -inf and reads nothing (the public ``indexer_logits`` contract).

``indexer_topk(impl="triton")`` runs the same kernel without that fill, then the exact top-k of
topk.py over each row's live prefix: the whole step reads and writes bytes that follow
the live context only. What still scales with max_seq_len there: the [B, max_seq_len] fp32 logits
*allocation* (graph-safe code cannot size a buffer from device data), of which only the live
positions are written and used, and the page table's shape (only live entries are used). The
top-k's chunks load the first min(width, 8192) positions of a row whatever its length (their load
goes out before seq_len arrives; positions past seq_len are dropped unread by the select): a
constant, not a share of max_seq_len. Outside
a captured graph, the API's range check (``contracts.check_indexer_args``) reads the whole page table on
the host; the registered functions, which a graph captures, do not.

Page-table safety (no host check runs under CUDA-graph capture): an entry of a live page outside
[0, num_pages) is never dereferenced; that page's 64 positions get -inf (``_page`` is the one
place that decides it). Entries past a request's live pages are never used to address the cache.
In ``topk_step`` the top-k then cuts the request before that page and flags it (the API's
contract), so the registered step needs no separate guard launch.
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import asdict, dataclass, replace

import torch
import triton
import triton.language as tl

from ... import errors
from ...cache import IndexKCache
from ...config import INDEX_DIM, PAGE_SIZE
from ...device import info, is_interpret
from ...registry import register
from .. import buffers
from ..buffers import alloc
from ..launch import bind_launch, cdiv, dot_dtype, launch_kernel, next_power_of_2
from ..rows import nonfinite_query
from .topk import TOPK, TopkLaunch, launches, select, topk_triton


@dataclass(frozen=True)
class LogitsLaunch:
    """The logits kernel's launch options (experiments/indexer_topk times variants of them).

    ``prefetch``: pages whose keys are in flight, in registers, while a page is multiplied
    (0: the plain loop, pipelined by Triton's ``num_stages``; 1 or 2). ``dot``: the tensor-core
    operand type: "bf16" (fp8 keys -> bf16, exact) or "fp16" (fp8 keys -> fp16 in one
    conversion instruction per pair, exact; q scaled per head by a power of two so it keeps its
    bits in fp16's range, the scale folded back into the head weight: 22% fewer instructions in
    the page loop on sm_90). ``maxnreg``: a register cap per thread (None: the compiler's
    choice), which sets how many programs an SM holds (65536 registers / (threads x cap))."""
    programs_per_sm: int = 8
    prefetch: int = 1
    num_stages: int = 3
    num_warps: int = 4
    dot: str = "bf16"
    maxnreg: int | None = None

    def as_dict(self) -> dict:
        return asdict(self)


#: the shipped launch: the plain loop (Triton's pipeliner, 3 stages), fp16 dot, 64 registers a thread
#: (8 programs an SM). experiments/indexer_topk run 1 (H200, B = 32, 64 heads) picked it by the
#: README's rule over 16 variants: score 1.60 of 2, ~107 us (~63% of copy) at live 65536 against
#: 146 us (46%) for the previous launch, LogitsLaunch(prefetch=1, dot="bf16", maxnreg=None).
LOGITS = LogitsLaunch(prefetch=0, dot="fp16", maxnreg=64)
#: the launch LOGITS replaced (experiments/indexer_topk times both)
LOGITS_RUN1 = LogitsLaunch()
#: positions one program sets to -inf per store in the dead region
FILL = 1024
#: the shipped launch's programs per SM (notebook 05 computes the grid from it)
PROGRAMS_PER_SM = LOGITS.programs_per_sm


@triton.jit
def _page(KV_FP8, KV_F32, entry, live, num_pages, t, d, D: tl.constexpr, PAGE: tl.constexpr):
    """One page's raw keys (u8 [PAGE, D]) and scales (fp32 [PAGE]), and whether it was read.
    ``entry`` is the page-table value; it addresses the cache only if the page is
    ``live`` and the id lies in [0, num_pages) (a device-side error flag would be set here)."""
    PAGE_BYTES: tl.constexpr = PAGE * (D + 4)              # [64 x 128 fp8 | 64 fp32 scales]
    ok = live & (entry >= 0) & (entry < num_pages)
    base = tl.where(ok, entry, 0).to(tl.int64) * PAGE_BYTES
    okv = t < tl.where(ok, PAGE, 0)                        # the same, as a [PAGE] mask
    k8 = tl.load(KV_FP8 + base + t[:, None] * D + d[None, :], mask=okv[:, None], other=0.0)
    sc = tl.load(KV_F32 + (base + PAGE * D) // 4 + t, mask=okv, other=0.0)
    return k8, sc, ok


@triton.jit
def _dot_keys(k8, DOT: tl.constexpr, ROUND_FP16: tl.constexpr):
    """Raw fp8 key bytes -> the dot's operand type (exact: every e4m3 value is a bf16 and an fp16)."""
    k = k8
    if ROUND_FP16:
        k = k.to(tl.float16)                               # on the GPU DOT is fp16: one conversion per pair
    return k.to(DOT)


@triton.jit
def _score_page(k, k_scale, ok, q, w, row, p, t, seq, max_seq_len, PAGE: tl.constexpr):
    """Logits of one page (k in the dot's type), stored at positions p*PAGE + t: -inf past seq and
    where the page was not read."""
    s = tl.maximum(tl.dot(k, tl.trans(q)), 0.0)            # [PAGE, HP]; padded heads have w = 0
    logit = tl.sum(s * w[None, :], axis=1) * k_scale
    pos = p * PAGE + t
    tl.store(row + pos, tl.where(ok & (pos < seq), logit, float("-inf")), mask=pos < max_seq_len)


@triton.jit
def _pow2(e):
    """2**e as fp32 for integer e in [-126, 127], built from its exponent bits (exact)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _indexer_kernel(Q, W, KV_FP8, KV_F32, SEQ, PT, OUT, ERR, max_seq_len, num_pages, pt_cols,
                    stride_qb, stride_qh, stride_wb, stride_pb, stride_ob,
                    H: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
                    FILL: tl.constexpr, DOT: tl.constexpr, PREFETCH: tl.constexpr = 0,
                    FILL_DEAD: tl.constexpr = True, ROUND_FP16: tl.constexpr = False):
    b = tl.program_id(0).to(tl.int64)                      # b * stride_ob passes 2^31 at B x 1M context
    pid = tl.program_id(1)
    nprog = tl.num_programs(1)
    pt = PT + b * stride_pb
    # issued together: this program's first page-table entries do not wait for seq_len (they lie
    # inside the table; they address the cache only once the page is known to be live)
    seq = tl.maximum(tl.minimum(tl.load(SEQ + b), max_seq_len), 0)   # range checks are off under capture
    e0 = tl.load(pt + pid, mask=pid < pt_cols, other=-1)
    e1 = tl.load(pt + pid + nprog, mask=pid + nprog < pt_cols, other=-1)
    live_pages = (seq + PAGE - 1) // PAGE
    h = tl.arange(0, HP)
    d = tl.arange(0, D)
    t = tl.arange(0, PAGE)
    q = tl.load(Q + b * stride_qb + h[:, None] * stride_qh + d[None, :], mask=h[:, None] < H, other=0.0)
    w = tl.load(W + b * stride_wb + h, mask=h < H, other=0.0).to(tl.float32)
    if pid == 0:                                           # one program a request checks its q and weights
        flag = nonfinite_query(Q, W, b, stride_qb, stride_qh, stride_wb, H, HP, D)
        tl.atomic_or(ERR, flag, mask=flag != 0)
    if ROUND_FP16:
        # fp16 holds every bf16 value within 2^31 of a head's largest |q| exactly: scale each head by
        # a power of two that puts its largest at [2^14, 2^15), and the weight by the inverse
        qf = q.to(tl.float32)
        amax = tl.max(tl.abs(qf), axis=1)
        sh = tl.minimum(tl.maximum(141 - ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF), -60), 60)
        q = (qf * _pow2(sh)[:, None]).to(tl.float16)
        w = w * _pow2(-sh)
    q = q.to(DOT)
    row = OUT + b * stride_ob
    if PREFETCH == 0:
        for p in range(pid, live_pages, nprog):            # live pages only: the early exit
            k8, sc, ok = _page(KV_FP8, KV_F32, tl.load(pt + p), p < live_pages, num_pages, t, d, D, PAGE)
            _score_page(_dot_keys(k8, DOT, ROUND_FP16), sc, ok, q, w, row, p, t, seq, max_seq_len, PAGE)
    elif PREFETCH == 1:
        # register pipeline: the next page's keys and the page id after it are loaded before this
        # page's dot, so a page waits on neither the page-table load nor the dependent key load.
        # (Keys are converted before the next loads are issued: raw bytes carried across them
        # would take a register each.)
        k8, sc, ok = _page(KV_FP8, KV_F32, e0, pid < live_pages, num_pages, t, d, D, PAGE)
        e_next = e1
        for p in range(pid, live_pages, nprog):
            k, sc_p, ok_p = _dot_keys(k8, DOT, ROUND_FP16), sc, ok
            pn = p + nprog
            k8, sc, ok = _page(KV_FP8, KV_F32, e_next, pn < live_pages, num_pages, t, d, D, PAGE)
            e_next = tl.load(pt + pn + nprog, mask=pn + nprog < live_pages, other=-1)
            _score_page(k, sc_p, ok_p, q, w, row, p, t, seq, max_seq_len, PAGE)
    else:
        # two pages in flight while one is multiplied
        k8, sc, ok = _page(KV_FP8, KV_F32, e0, pid < live_pages, num_pages, t, d, D, PAGE)
        k8b, scb, okb = _page(KV_FP8, KV_F32, e1, pid + nprog < live_pages, num_pages, t, d, D, PAGE)
        e_next = tl.load(pt + pid + 2 * nprog, mask=pid + 2 * nprog < live_pages, other=-1)
        for p in range(pid, live_pages, nprog):
            k, sc_p, ok_p = _dot_keys(k8, DOT, ROUND_FP16), sc, ok
            k8, sc, ok = k8b, scb, okb
            pn = p + 2 * nprog
            k8b, scb, okb = _page(KV_FP8, KV_F32, e_next, pn < live_pages, num_pages, t, d, D, PAGE)
            e_next = tl.load(pt + pn + nprog, mask=pn + nprog < live_pages, other=-1)
            _score_page(k, sc_p, ok_p, q, w, row, p, t, seq, max_seq_len, PAGE)
    if FILL_DEAD:
        f = tl.arange(0, FILL)
        for s0 in range(live_pages * PAGE + pid * FILL, max_seq_len, nprog * FILL):
            tl.store(row + s0 + f, float("-inf"), mask=s0 + f < max_seq_len)


def grid(B: int, max_seq_len: int, page_size: int = PAGE_SIZE, programs_per_sm: int | None = None) -> tuple[int, int]:
    """(B, NPROG): about ``programs_per_sm`` programs per SM in all (default the shipped launch's),
    at most one per page of the maximum context. Shapes only: the same launch for every step of a
    captured graph."""
    per_sm = LOGITS.programs_per_sm if programs_per_sm is None else programs_per_sm
    max_pages = -(-max_seq_len // page_size)
    sms = 2 if is_interpret() else info().sm_count
    return B, max(1, min(max_pages, -(-per_sm * sms // max(B, 1))))


def _dot(launch: LogitsLaunch):
    """(DOT, ROUND_FP16) for the launch: the interpreter multiplies in fp32 (its bf16 dot is wrong)
    and rounds q and the keys to fp16 first where the GPU would."""
    if launch.dot not in ("bf16", "fp16"):
        raise ValueError(f"dot must be 'bf16' or 'fp16', got {launch.dot!r}")
    fp16 = launch.dot == "fp16"
    if is_interpret():
        return dot_dtype(), fp16
    return (tl.float16 if fp16 else tl.bfloat16), fp16


def logits_triton(q, index_cache: IndexKCache, weights, seq_lens, page_table, max_seq_len: int, *, nprog=None,
                  num_stages=None, prefetch=None, launch: LogitsLaunch | None = None, fill_dead: bool = True,
                  kernel=None):
    """Indexer logits float32 [B, max_seq_len]; with ``fill_dead`` False only positions below each
    row's live pages are written (the rest of the row is left as allocated: what the top-k reads
    never goes there). ``launch`` defaults to LOGITS; ``nprog`` / ``num_stages`` / ``prefetch``
    override single fields of it (prefetch False/True mean 0/1). ``kernel``: a jitted kernel with
    _indexer_kernel's signature to launch instead (notebook 05's own copy)."""
    _check_q(q)
    if nprog is not None and nprog < 1:
        raise ValueError(f"nprog must be >= 1, got {nprog}")
    launch = launch or LOGITS
    if num_stages is not None:
        launch = replace(launch, num_stages=num_stages)
    if prefetch is not None:
        launch = replace(launch, prefetch=int(prefetch))
    if launch.prefetch not in (0, 1, 2):
        raise ValueError(f"prefetch must be 0, 1 or 2, got {launch.prefetch}")
    return _launch_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len, launch, fill_dead, nprog, kernel)


def _check_q(q):
    if q.shape[1] > 128:
        raise ValueError(f"the Triton indexer holds all heads in one tile: q may have at most 128 heads, "
                         f"got {q.shape[1]}")
    if q.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
        raise TypeError(f"impl='triton' takes q in bfloat16 or float8_e4m3fn (the model's; exact on the tensor "
                        f"cores), got {q.dtype}: cast it (q.to(torch.bfloat16) rounds it) or use impl='torch_fp32'")


def _launch_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len, launch, fill_dead, nprog=None,
                   kernel=None):
    """logits_triton after its argument checks (the step calls it directly)."""
    out = alloc((q.shape[0], max_seq_len), torch.float32, q.device)
    if q.shape[0] > 0:
        _run_logits(_logits_plan(q, index_cache, weights, page_table, max_seq_len, launch, fill_dead, nprog),
                    q, index_cache, weights, seq_lens, page_table, out, kernel)
    return out


def _logits_plan(q, index_cache, weights, page_table, max_seq_len, launch, fill_dead, nprog=None) -> tuple:
    """(grid, scalar arguments, constexprs and options) of the logits launch for these arguments'
    shapes and strides, into a fresh contiguous [B, max_seq_len] output."""
    B, H, D = q.shape
    g, consts = _logits_args(launch, B, H, D, max_seq_len, index_cache.page_size, nprog, fill_dead)
    return g, (max_seq_len, index_cache.num_pages, page_table.shape[1], q.stride(0), q.stride(1), weights.stride(0),
               page_table.stride(0), max_seq_len), consts


def _run_logits(plan, q, index_cache, weights, seq_lens, page_table, out, kernel=None):
    g, scalars, consts = plan
    fp8, f32 = index_cache.flat_views
    launch_kernel(kernel or _indexer_kernel, g, (q, weights, fp8, f32, seq_lens, page_table, out, errors.word(q.device)),
                  scalars, consts)


@functools.lru_cache(maxsize=1024)
def _logits_args(launch: LogitsLaunch, B, H, D, max_seq_len, page_size, nprog, fill_dead):
    """(grid, constexprs and launch options) of a logits launch: shapes and options only, decided
    once per shape rather than on every eager call."""
    dot, round16 = _dot(launch)
    g = (B, nprog) if nprog is not None else grid(B, max_seq_len, page_size, launch.programs_per_sm)
    return g, dict(H=H, HP=max(16, next_power_of_2(H)), D=D, PAGE=page_size, FILL=FILL, DOT=dot,
                   PREFETCH=launch.prefetch, FILL_DEAD=fill_dead, ROUND_FP16=round16,
                   num_warps=launch.num_warps, num_stages=launch.num_stages,
                   **({"maxnreg": launch.maxnreg} if launch.maxnreg else {}))


def topk_step(q, index_cache: IndexKCache, weights, seq_lens, page_table, max_seq_len: int, k: int, *,
              launch: LogitsLaunch | None = None, topk_launch: TopkLaunch | None = None, kernel=None):
    """The whole indexer step over the live context: logits of the live pages only (no -inf fill),
    then the exact top-k of topk.py over each row's live prefix. Two launches (three with
    the top-k's ``merge="launch"``), no host sync. Returns positions int32 [B, k]: ascending, ties
    to the lower position, -1 padded. It guards its own inputs as the API's contract says: seq_lens clamped to
    [0, max_seq_len] (both kernels), a request cut before its first live page id outside the cache
    (the logits kernel never reads such a page; the top-k stops before it), each flagged in the
    error word by the top-k. The arguments are taken as the API checked them: only what the
    Triton kernels add (q's dtype and head count, k) is checked here. ``kernel``: the logits kernel to
    launch instead of _indexer_kernel (as logits_triton)."""
    _check_q(q)
    logits = _launch_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len, launch or LOGITS, False,
                            kernel=kernel)
    return select(logits, seq_lens, k, topk_launch or TOPK, (page_table, index_cache.num_pages, index_cache.page_size))


class PreparedStep:
    """``indexer_topk(impl="triton")`` for one signature of its arguments (``api.indexer_topk`` keys
    them: shapes, strides, dtypes, devices, the cache object, max_seq_len, topk), made after a call of
    that signature passed the API's checks. The launches' planning, scalar arguments and workspaces
    are decided here once, so a repeated eager call pays two allocations and two launches of host
    work instead of the checks and the planning every time (experiments/eager_host_path).

    Calling it returns the positions, or None where the full path must run instead: another cache
    object, ``LOGITS`` or ``TOPK`` replaced, or outputs to poison (``testing.poisoned``). Its
    workspaces are its caller's (the thread and stream it was prepared for: api.prepared_calls keys
    it by them)."""

    def __init__(self, q, index_cache, weights, seq_lens, page_table, max_seq_len: int, k: int):
        B = q.shape[0]
        self.cache = weakref.ref(index_cache)   # not the cache itself: a plan must not keep its bytes alive
        self.options = (LOGITS, TOPK)
        self.logits_shape, self.out_shape, self.device = (B, max_seq_len), (B, k), q.device
        g, scalars, consts = _logits_plan(q, index_cache, weights, page_table, max_seq_len, LOGITS, False)
        fp8, f32 = index_cache.flat_views            # the cache's two pointers, as __call__ passes them
        self.logits = bind_launch(_indexer_kernel, g, scalars, consts, (
            q.dtype, weights.dtype, fp8.dtype, f32.dtype, seq_lens.dtype, page_table.dtype, torch.float32, torch.int32))
        self.err = errors.word(q.device)
        self.topk = launches(B, max_seq_len, max_seq_len, k, TOPK,
                             (index_cache.num_pages, index_cache.page_size, page_table.stride(0)), q.device, bound=True)

    @staticmethod
    def make(q, index_cache, weights, seq_lens, page_table, max_seq_len: int, k: int):
        """A PreparedStep for these (checked) arguments, or None where the registered step would copy
        an input first (not contiguous; page-table rows of non-unit stride), B is 0, or outputs are
        being poisoned (its workspaces would be filled again for nothing)."""
        if (q.shape[0] == 0 or buffers._POISON[0]
                or not (q.is_contiguous() and weights.is_contiguous() and seq_lens.is_contiguous())
                or (page_table.shape[1] > 1 and page_table.stride(1) != 1)):
            return None
        return PreparedStep(q, index_cache, weights, seq_lens, page_table, max_seq_len, k)

    def __call__(self, q, index_cache, weights, seq_lens, page_table):
        if (self.cache() is not index_cache or buffers._POISON[0]
                or self.options[0] is not LOGITS or self.options[1] is not TOPK):
            return None
        logits = torch.empty(self.logits_shape, dtype=torch.float32, device=self.device)
        fp8, f32 = index_cache.flat_views
        self.logits(q, weights, fp8, f32, seq_lens, page_table, logits, self.err)
        out = torch.empty(self.out_shape, dtype=torch.int32, device=self.device)
        self.topk(logits, seq_lens, page_table, out)
        return out


@register("indexer_logits", "triton", stage="S4", tags=("recorded", "exact"), description="the Triton indexer: live pages only")
def _logits(q, index_cache, weights, seq_lens, page_table, *, max_seq_len):
    return logits_triton(q.contiguous(), index_cache, weights.contiguous(), seq_lens.contiguous(), page_table.contiguous(),
                         max_seq_len)


@register("indexer_topk", "triton", stage="S4", tags=("recorded", "exact"), guards_inputs=True, prepare=PreparedStep.make,
          description="the Triton indexer and an exact radix top-k, both over the live context only")
def _topk(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, topk):
    return topk_step(q.contiguous(), index_cache, weights.contiguous(), seq_lens.contiguous(), page_table,
                     max_seq_len, topk)


assert INDEX_DIM == 128
