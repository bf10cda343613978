"""What every decode kernel shares: reading a tile of tokens out of the DSv4 cache.

The cache is one byte buffer seen through three typed views (fp8 for nope
values, uint8 for UE8M0 scales, bf16 for rope), as in SGLang. ``gather_kv_tile``
returns the BLOCK_N tokens named by ``tok`` as one dequantized [BLOCK_N, 512]
fp32 tile whose columns are exactly the 512 model dims: 0..447 from fp8 * scale,
448..511 from bf16 rope. So q . k is one 512-wide product; nothing is padded.
"""
from __future__ import annotations

import contextlib
import functools
import operator
import threading
import types

import torch
import triton
import triton.language as tl

from .. import concurrency
from ..cache import DATA_BYTES, HEAD_DIM, NOPE_DIM, SCALE_BYTES
from ..device import is_interpret
from .. import errors
from ..errors import Flag

LOG2E = 1.4426950408889634

if is_interpret():
    concurrency.serialize_interpreter()      # the interpreter's state is global: one launch at a time

#: the error word's bits (dsv4lab.errors.Flag), as kernels read them
INDEX_FLAG = tl.constexpr(int(Flag.INDEX))
TOPK_LEN_FLAG = tl.constexpr(int(Flag.TOPK_LEN))
SINK_FLAG = tl.constexpr(int(Flag.SINK))
NONFINITE_FLAG = tl.constexpr(int(Flag.NONFINITE))
SEQ_LEN_FLAG = tl.constexpr(int(Flag.SEQ_LEN))
PAGE_FLAG = tl.constexpr(int(Flag.PAGE))
INDEXER_NONFINITE_FLAG = tl.constexpr(int(Flag.INDEXER_NONFINITE))


@triton.jit
def in_cache(tok, num_tokens):
    """tok is a token of the cache: 0 <= tok < num_tokens, in one unsigned compare (a negative
    index, the padding, wraps to >= 2^31). Entries that fail it are padding: never read."""
    return tok.to(tl.uint32) < num_tokens


@triton.jit
def track_tokens_init(BLOCK: tl.constexpr):
    """The start of :func:`track_tokens`' record: (largest index -1, smallest index as unsigned 2^32 - 1)."""
    top = tl.full([BLOCK], -1, dtype=tl.int32)
    return top, top.to(tl.uint32, bitcast=True)


@triton.jit
def track_tokens(top, low, tok):
    """A decode loop's record of the indices ``tok`` it loaded (-1 past its row), one max and one min
    an index: the largest (one past the cache is flagged after the loop) and the smallest as unsigned
    (padding wraps above every token, so ``min(low) < num_tokens`` says the loop read a token of the
    cache). A row whose softmax then weighed nothing although a token was read lost every score below
    the running max's finite starting value or to -inf (an extreme sm_scale or q): it is NaN, never
    "no token"."""
    return tl.maximum(top, tok), tl.minimum(low, tok.to(tl.uint32, bitcast=True))


@triton.jit
def row_length(TOPK_LEN, b, K, HAS_TOPK_LEN: tl.constexpr):
    """(entries of row b to read, error bits): topk_len[b] clamped to [0, K] (TOPK_LEN_FLAG if it lay
    outside), or K without a topk_len."""
    n = K
    flags = tl.full([], 0, tl.int32)
    if HAS_TOPK_LEN:
        raw = tl.load(TOPK_LEN + b)
        n = tl.minimum(tl.maximum(raw, 0), K)
        flags = tl.where(raw.to(tl.uint32) > K, TOPK_LEN_FLAG, 0)
    return n, flags


@triton.jit
def live_length(SEQ, PT, b, max_seq_len, num_pages, stride_pb, PAGE: tl.constexpr, BLOCK: tl.constexpr):
    """(row b's length the indexer may read, error bits): seq_lens[b] clamped to [0, max_seq_len]
    (SEQ_LEN_FLAG if it lay outside), then cut before its first live page whose id lies outside
    [0, num_pages) (PAGE_FLAG). Reads the row's live page-table entries only."""
    raw = tl.load(SEQ + b)
    flags = tl.where(raw.to(tl.uint32) > max_seq_len, SEQ_LEN_FLAG, 0)
    seq = tl.minimum(tl.maximum(raw, 0), max_seq_len)
    live = (seq + PAGE - 1) // PAGE
    first = live                                     # the first live page whose id is outside the cache
    c = tl.arange(0, BLOCK)
    row = PT + b * stride_pb
    for p0 in range(0, live, BLOCK):
        p = p0 + c
        page = tl.load(row + p, mask=p < live, other=0)
        bad = ~in_cache(page, num_pages) & (p < live)
        first = tl.minimum(first, tl.min(tl.where(bad, p, live), axis=0))
    flags |= tl.where(first < live, PAGE_FLAG, 0)
    return tl.minimum(seq, first * PAGE), flags


@triton.jit
def nonfinite_query(Q, W, b, stride_qb, stride_qh, stride_wb, H, HP: tl.constexpr, D: tl.constexpr):
    """INDEXER_NONFINITE_FLAG where request b's indexer q [H, D] or weights [H] hold a NaN or inf (no
    kernel may rank positions by them: relu on the GPU even drops a NaN score), else 0."""
    h = tl.arange(0, HP)
    d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + h[:, None] * stride_qh + d[None, :], mask=h[:, None] < H, other=0.0)
    w = tl.load(W + b * stride_wb + h, mask=h < H, other=0.0)
    ok = tl.min(tl.min((tl.abs(q.to(tl.float32)) < float("inf")).to(tl.int32), axis=1), axis=0)
    ok = ok & tl.min((tl.abs(w.to(tl.float32)) < float("inf")).to(tl.int32), axis=0)
    return tl.where(ok == 1, 0, INDEXER_NONFINITE_FLAG)


def decode_call(q, cache, indices, topk_len, attn_sink, sm_scale):
    """What the one-pass decode kernels (SIMT and the story's head-batched one) share: contiguous q
    and indices, fresh out / lse, and their common arguments in kernel order
    ``(args, constexprs)``; absent topk_len / sink are replaced by a dummy pointer (lse) that a
    False HAS_* flag never reads."""
    B, H, D = q.shape
    q, indices = q.contiguous(), indices.contiguous()
    out = alloc((B, H, D), out_dtype(), q.device)
    lse = alloc((B, H), torch.float32, q.device)
    fp8, u8, bf16 = cache_views(cache)
    args = (q, fp8, u8, bf16, indices, topk_len if topk_len is not None else lse,
            attn_sink if attn_sink is not None else lse, out, lse, errors.word(q.device), sm_scale * LOG2E,
            indices.shape[1], H, token_limit(cache),
            q.stride(0), q.stride(1), indices.stride(0), out.stride(0), out.stride(1))
    constexprs = dict(PAGE_SIZE=cache.page_size, PAGE_BYTES=cache.page_bytes, HAS_TOPK_LEN=topk_len is not None,
                      HAS_SINK=attn_sink is not None, D=D, NOPE=448)
    return args, constexprs, out, lse


def token_limit(cache) -> int:
    """num_tokens as the kernels compare it (indices are int32: anything past 2^31 - 1 is moot)."""
    return min(cache.num_tokens, 2**31 - 1)


@triton.jit
def load_kv_raw(kv_fp8, kv_u8, kv_bf16, tok, valid, PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr,
                NOPE: tl.constexpr, D: tl.constexpr):
    """The raw bytes of BLOCK_N tokens: (fp8 [BLOCK_N, 8, 64], scale bytes [BLOCK_N, 8],
    rope bf16 [BLOCK_N, 64]); rows where ~valid read nothing. Split from the dequant so a
    kernel can issue the next tile's loads before it computes on this one (prefetch).

    Groups 0..6 of the fp8 tensor are the nope groups; group 7 is never loaded (the rope
    bytes are read as bf16). Each load touches only the bytes it needs."""
    G: tl.constexpr = D // 64
    safe = tl.where(valid, tok, 0).to(tl.int64)
    page = safe // PAGE_SIZE          # constexpr: shifts for 64/256, not a division subroutine
    slot = safe % PAGE_SIZE
    # page bytes and PAGE_SIZE*576 are multiples of 576: tell the compiler, so the
    # gathers become 16-byte vector loads instead of one byte per pointer
    data = tl.multiple_of(page * PAGE_BYTES + slot * 576, 64)     # token's data bytes
    scl = tl.multiple_of(page * PAGE_BYTES + PAGE_SIZE * 576 + slot * 8, 8)  # its 8 scale bytes
    g = tl.arange(0, G)
    j = tl.arange(0, 64)
    is_nope = g < NOPE // 64
    x = tl.load(kv_fp8 + data[:, None, None] + (g * 64)[None, :, None] + j[None, None, :],
                mask=valid[:, None, None] & is_nope[None, :, None], other=0.0)
    # all 8 scale bytes (7 scales + 1 pad byte, never used): one unmasked-by-group 8-byte load
    e = tl.load(kv_u8 + scl[:, None] + g[None, :], mask=valid[:, None], other=127)
    r = tl.load(kv_bf16 + (data[:, None] + NOPE) // 2 + j[None, :], mask=valid[:, None], other=0.0)
    return x, e, r


#: one token's bytes asked into L2: its 576 data bytes by the bulk-copy engine, its scale bytes by a line hint
L2_PREFETCH_ASM = "cp.async.bulk.prefetch.L2.global [$1], 576; prefetch.global.L2 [$2]; mov.u32 $0, 0;"
_L2_PREFETCH = tl.constexpr(L2_PREFETCH_ASM)          # what a @triton.jit function may read


@triton.jit
def prefetch_kv_l2_bulk(kv_u8, tok, valid, PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr):
    """Ask L2 for the bytes of BLOCK_N tokens without waiting: one ``cp.async.bulk.prefetch.L2``
    per token for its 576 data bytes (Hopper's bulk-copy engine; 16-byte aligned, a multiple of 16
    bytes long) and one ``prefetch.global.L2`` for its scale bytes. A hint, not a load: nothing
    comes back to registers, and the later gather of these tokens hits L2 instead of HBM.
    GPU (sm_90+) only: the interpreter cannot run PTX."""
    safe = tl.where(valid, tok, 0).to(tl.int64)
    page = safe // PAGE_SIZE
    slot = safe % PAGE_SIZE
    data = page * PAGE_BYTES + slot * 576
    scl = page * PAGE_BYTES + PAGE_SIZE * 576 + slot * 8
    tl.inline_asm_elementwise(_L2_PREFETCH, "=r,l,l", [kv_u8 + data, kv_u8 + scl], dtype=tl.int32, is_pure=False,
                              pack=1)


#: fp8 e4m3 -> bf16 without conversion instructions (DEQUANT="bits"). Hopper runs F2FP, the
#: conversion instruction, at a fraction of the arithmetic rate (Triton PR 4563 replaced it for
#: s8 -> bf16 for the same reason). A byte permute puts two e4m3 bytes in the top bytes of two
#: 16-bit lanes; masking off the sign and shifting right by 4 moves exponent and mantissa into
#: bf16's low exponent bits and top mantissa bits, then the sign goes back: the lane now reads
#: as the e4m3 value times 2^-120, subnormals included (they land on bf16 subnormals). One bf16x2
#: multiply by 2^(e-7) (bf16 bits (e+120) << 7) applies the UE8M0 scale 2^(e-127) exactly.
#: 5 integer/bf16x2 instructions per pair of values instead of 6 of which 2 are conversions.
#: Needs e <= MAX_SCALE_BYTE (2^(e-7) must be a finite bf16): scale <= 2^7, amax <= 57344. A larger
#: byte gets a NaN factor (E4M3_BAD_SCALE), so the values it scales, and every output that reads
#: them, come out NaN (and the kernel flags a non-finite output in the error word): a visible
#: failure where the host check of checks="sync" does not run, never a wrong finite number. The
#: packers never write such a byte (cache.MAX_PACKED_SCALE_BYTE). e4m3 NaN bytes (0x7f/0xff, never
#: written by a packer either) come out finite here: 480 x the scale.
E4M3_SEL = (0x1404, 0x3424)           # prmt selectors: [x1 0 x0 0], [x3 0 x2 0]
E4M3_BODY, E4M3_SIGN, E4M3_SHIFT = 0x7F007F00, 0x80008000, 4
MAX_SCALE_BYTE = 254 - 120
E4M3_BAD_SCALE = 0x7FC0               # bf16 NaN: the factor past MAX_SCALE_BYTE
_E4M3_PAIR = ("prmt.b32 a, $2, 0, {sel}; and.b32 t, a, {body}; shr.b32 t, t, {shift}; "
              "lop3.b32 t, t, a, {sign}, 0xF8; mul.rn.bf16x2 ${out}, t, ${sc};")
E4M3_TO_BF16_ASM = "{ .reg .b32 a, t; " + " ".join(
    _E4M3_PAIR.format(sel=hex(sel), body=hex(E4M3_BODY), shift=E4M3_SHIFT, sign=hex(E4M3_SIGN), out=i, sc=3 + i)
    for i, sel in enumerate(E4M3_SEL)) + " }"
_E4M3_ASM = tl.constexpr(E4M3_TO_BF16_ASM)      # what a @triton.jit function may read
_E4M3_BAD = tl.constexpr(E4M3_BAD_SCALE)


def e4m3_bits_to_bf16_model(x: "np.ndarray", e: "np.ndarray"):
    """numpy model of E4M3_TO_BF16_ASM for one pair lane (same constants): uint8 e4m3 bytes x and
    UE8M0 bytes e -> float32 values (what the bf16 lanes hold). Tests check it against
    e4m3 * 2^(e-127) for every byte; the GPU checks run the assembly itself."""
    import numpy as np
    a = (x.astype(np.uint32) << 8)                                  # the byte in a lane's top byte
    t = ((a & (E4M3_BODY & 0xFFFF)) >> E4M3_SHIFT) | (a & (E4M3_SIGN & 0xFFFF))
    val = (t.astype(np.uint32) << 16).view(np.float32)              # bf16 bits -> float32
    ei = e.astype(np.uint32) + 120
    sc = (np.where(ei <= 254, ei << 7, E4M3_BAD_SCALE).astype(np.uint32) << 16).view(np.float32)   # bf16 2^(e-7)
    return val * sc


@triton.jit
def dequant_kv_bits(x, e, r, NOPE: tl.constexpr, D: tl.constexpr):
    """dequant_kv for bf16 tiles on the GPU with integer ops (E4M3_TO_BF16_ASM): x may be
    fp8 or uint8 (the same bytes)."""
    G: tl.constexpr = D // 64
    is_nope = tl.arange(0, G) < NOPE // 64
    ei = e.to(tl.int32) + 120
    sc = tl.where(ei <= 254, ei << 7, _E4M3_BAD).to(tl.int16).to(tl.bfloat16, bitcast=True)  # 2^(e-7); NaN past 134
    xb = x.to(tl.uint8, bitcast=True)
    y = tl.inline_asm_elementwise(_E4M3_ASM, "=r,=r,r,r,r", [xb, tl.broadcast_to(sc[:, :, None], xb.shape)],
                                  dtype=tl.bfloat16, is_pure=True, pack=4)
    y = tl.where(is_nope[None, :, None], y, r[:, None, :])
    return tl.reshape(y, (y.shape[0], D))


@triton.jit
def dequant_kv(x, e, r, NOPE: tl.constexpr, D: tl.constexpr, OUT: tl.constexpr, BITS: tl.constexpr = False):
    """Raw bytes from load_kv_raw -> OUT [BLOCK_N, D]: fp8 nope * 2^(e-127) | bf16 rope.

    OUT = bfloat16 is exact: an e4m3 value times a power of two fits bf16 (8 exponent
    bits), and rope is stored in bf16. Building the tile in bf16 rather than fp32 halves
    its registers, which is what decides whether the head-batched kernel spills.
    e4m3 -> f16 is one instruction per pair; f16 -> f32 is full rate, and the UE8M0
    scale is applied in f32 before the single pack to bf16 (a direct e4m3 -> bf16 cast
    goes through a quarter-rate f16 -> bf16 conversion per element). BITS (GPU, OUT = bf16):
    dequant_kv_bits, the same values from integer ops."""
    if BITS:
        return dequant_kv_bits(x, e, r, NOPE, D)
    G: tl.constexpr = D // 64
    is_nope = tl.arange(0, G) < NOPE // 64
    y = (x.to(tl.float16).to(tl.float32) * tl.math.exp2(e.to(tl.float32) - 127.0)[:, :, None]).to(OUT)
    y = tl.where(is_nope[None, :, None], y, r.to(OUT)[:, None, :])
    return tl.reshape(y, (y.shape[0], D))


@triton.jit
def gather_kv_tile(kv_fp8, kv_u8, kv_bf16, tok, valid, PAGE_SIZE: tl.constexpr, PAGE_BYTES: tl.constexpr,
                   NOPE: tl.constexpr, D: tl.constexpr, OUT: tl.constexpr, BITS: tl.constexpr = False):
    """tok [BLOCK_N] int token ids (any value where ~valid) -> OUT [BLOCK_N, D]; invalid rows are 0.

    The tile is built as [BLOCK_N, 8, 64]: groups 0..6 are the fp8 nope groups times their
    UE8M0 scale, group 7 is the bf16 rope (see load_kv_raw and dequant_kv)."""
    x, e, r = load_kv_raw(kv_fp8, kv_u8, kv_bf16, tok, valid, PAGE_SIZE, PAGE_BYTES, NOPE, D)
    return dequant_kv(x, e, r, NOPE, D, OUT, BITS)


def cache_views(cache):
    """(fp8, uint8, bf16) flat views of the cache bytes, the kernel's three pointers."""
    return cache.byte_views


def dot_dtype():
    """tl.dot operand type: bf16 on the GPU; fp32 in the interpreter, whose bf16 dot is wrong."""
    return tl.float32 if is_interpret() else tl.bfloat16


def out_dtype() -> torch.dtype:
    """Kernels store bf16 on the GPU. The interpreter truncates fp32->bf16 casts (2x the
    rounding error of the GPU's round-to-nearest), so there they store fp32 and torch rounds."""
    return torch.float32 if is_interpret() else torch.bfloat16


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host ints. Host code around a launch uses this, not triton.cdiv: in recent
    Triton that is a constexpr function costing microseconds a call on the host."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n = 0, as triton.next_power_of_2), for host ints."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


#: launch_kernel() goes through Triton's compiled launcher after a signature's first call; False: every
#: launch through ``kernel[grid](...)`` (experiments/eager_host_path measures one against the other)
_DIRECT = [True]
_LAUNCHES: dict = {}
_FIRST_LAUNCH = threading.Lock()


_DTYPE = operator.attrgetter("dtype")
_DATA_PTR = torch.Tensor.data_ptr          # the unbound C method: half the host time of methodcaller


def launch_kernel(kernel, grid: tuple, tensors: tuple, scalars: tuple, consts: dict):
    """``kernel[grid](*tensors, *scalars, **consts)`` with the host cost of a C call after the first time.

    Triton's launch binds and specializes every argument, builds its cache key from the
    constexprs and options and checks the kernel's globals on every call: twice the host time of
    the launch itself on the H200 nodes (experiments/eager_host_path), more than many decode
    launches take on the GPU. Here the first call of a signature goes through Triton, which
    compiles and returns the kernel; later calls hand that kernel's launcher the arguments
    directly. The signature is what Triton specializes on, or finer: the tensors' dtypes, the
    scalars' values and types (Triton looks at an int's ``== 1``, ``% 16 == 0`` and range, and
    never at a float's), the grid, the device and ``consts``, with every tensor 16-byte aligned.
    It is taken with C-level loops (``map``): a Python loop over twenty arguments costs as much as
    the launch.
    ``tensors`` are the kernel's leading parameters, ``scalars`` the hashable ones after them;
    ``consts`` (constexprs and launch options) must be one dict object per shape, as the per-shape
    ``lru_cache`` helpers return. The interpreter, a Triton launch hook (the proton profiler's),
    a tensor off 16-byte alignment (Triton specializes each pointer on it) or ``triton_launches()``
    take Triton's own path."""
    if _takes_triton_path(tensors):
        return kernel[grid](*tensors, *scalars, **consts)
    current_device, current_stream = _DRIVER or _driver()
    device = current_device()
    key = _launch_key(kernel, device, grid, consts, scalars, tuple(map(_DTYPE, tensors)))
    hit = _LAUNCHES.get(key)
    if hit is None:
        with _FIRST_LAUNCH:                  # one thread compiles a signature; the entry serves every caller
            compiled = kernel[grid](*tensors, *scalars, **consts)
            # the launcher takes every parameter in signature order, constexprs included
            tail = tuple(consts.get(p.name, p.default) for p in kernel.params[len(tensors) + len(scalars):])
            if len(_LAUNCHES) >= 4096:
                _LAUNCHES.clear()
            _LAUNCHES[key] = (consts, kernel, compiled, tuple(grid) + (1,) * (3 - len(grid)), *_launcher(compiled),
                              tail)
        return compiled
    _, _, compiled, (g0, g1, g2), call, head, tail = hit
    call(g0, g1, g2, current_stream(device), *head, *tensors, *scalars, *tail)
    return compiled


def _takes_triton_path(tensors) -> bool:
    """A launch that takes Triton's own path: switched there (``triton_launches``), the interpreter,
    a launch hook, or a tensor off 16-byte alignment (Triton specializes each pointer on it)."""
    return (not _DIRECT[0] or is_interpret() or _launch_hooked()
            or functools.reduce(operator.or_, map(_DATA_PTR, tensors), 0) & 15)


def _launch_key(kernel, device, grid, consts, scalars, dtypes) -> tuple:
    """launch_kernel's cache key. Values and types: 16 == 16.0 == hash(16.0) and True == 1, but Triton
    compiles each differently. id(kernel), not the kernel: a JITFunction's __hash__ is Python (its
    cache key), ~1 us a launch. The entry holds consts and the kernel, so while it exists their ids
    in its key stay theirs."""
    return id(kernel), device, grid, id(consts), scalars, tuple(map(type, scalars)), dtypes


def bind_launch(kernel, grid: tuple, scalars: tuple, consts: dict, dtypes: tuple):
    """``launch(*tensors)``: launch_kernel for a launch whose grid, scalars and constexprs are fixed and
    whose tensors always have these ``dtypes`` (a prepared call: kernels/indexer.PreparedStep). Where
    launch_kernel has already launched that signature on this device by its direct path, the
    launch hands the compiled kernel's launcher the arguments without building and looking up the
    signature's key each time; it takes launch_kernel whenever launch_kernel would not go direct
    (Triton's path switched on, a launch hook, another current device, a tensor off 16-byte
    alignment). Anywhere else (the interpreter, a signature not launched yet) it is launch_kernel."""
    def through_triton(*tensors):
        return launch_kernel(kernel, grid, tensors, scalars, consts)
    if not _DIRECT[0] or is_interpret() or not _DRIVER:
        return through_triton
    current_device, current_stream = _DRIVER
    device = current_device()
    hit = _LAUNCHES.get(_launch_key(kernel, device, grid, consts, scalars, dtypes))
    if hit is None:
        return through_triton
    _, _, _, (g0, g1, g2), call, head, tail = hit

    def launch(*tensors):
        if _takes_triton_path(tensors) or current_device() != device:
            return through_triton(*tensors)
        call(g0, g1, g2, current_stream(device), *head, *tensors, *scalars, *tail)
    return launch


#: Triton versions whose CudaLauncher.__call__ was read and its C launch's arguments checked (3.6:
#: grid, stream, function, cooperative, pdl, two scratch buffers, then what __call__ receives)
C_LAUNCH_TRITON = ("3.6.",)


def _launcher(compiled) -> tuple:
    """(callable, leading arguments after the grid and stream) of a compiled kernel's launch.
    Triton's ``compiled.run`` (a CudaLauncher) is a Python wrapper that makes a closure and allocates
    scratch buffers on every call before its C launch; where the kernel needs no scratch and this
    Triton's wrapper is one of C_LAUNCH_TRITON, the C launch is called directly (about a microsecond
    less host time a launch on the H200 nodes). Anything else goes through ``compiled.run``."""
    run = compiled.run
    c_launch = getattr(run, "launch", None)
    if (triton.__version__.startswith(C_LAUNCH_TRITON) and type(run).__name__ == "CudaLauncher"
            and callable(c_launch) and not isinstance(c_launch, types.FunctionType)   # not the tensor-descriptor wrapper
            and not run.global_scratch_size and not run.profile_scratch_size):
        return c_launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                          compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


@contextlib.contextmanager
def triton_launches():
    """Inside the block every launch_kernel call takes Triton's own ``kernel[grid](...)`` path (the
    A/B of experiments/eager_host_path and the GPU tests)."""
    before, _DIRECT[0] = _DIRECT[0], False
    try:
        yield
    finally:
        _DIRECT[0] = before


_DRIVER: list = []


def _driver():
    """(current device, current raw stream) functions of Triton's driver, looked up once. Where the
    driver's device function is torch.cuda.current_device, torch's C getter behind it is used: a
    CUDA tensor is at hand, so torch's lazy init (the Python half of that function) has run."""
    from triton.runtime import driver
    get_device = driver.active.get_current_device
    if get_device is torch.cuda.current_device:
        get_device = torch._C._cuda_getDevice
    _DRIVER[:] = [get_device, driver.active.get_current_stream]
    return _DRIVER


def _launch_hooked() -> bool:
    """A launch-enter or -exit hook is installed (Triton 3.6+ keeps them in a HookChain, older ones a
    callable): the direct path passes neither, so a hooked launch goes through Triton."""
    rt = triton.knobs.runtime
    enter, leave = rt.launch_enter_hook, getattr(rt, "launch_exit_hook", None)
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))


_POISON = [False]


def _poison_value(dtype: torch.dtype):
    """NaN, or an integer dtype's smallest value: what no kernel writes."""
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


def alloc(shape, dtype, device) -> torch.Tensor:
    """Output buffers of every kernel. Under dsv4lab.testing.poisoned() they come pre-filled
    with NaN (integer buffers: the dtype's smallest value, which no kernel writes), so an element
    a kernel forgets to write fails the check instead of passing on whatever the memory held."""
    if _POISON[0]:
        return torch.full(shape, _poison_value(dtype), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def workspaces(key: tuple, device, make) -> tuple:
    """The caller's workspaces for ``key`` (which names the device): the tensors ``make()`` returns,
    made on the caller's first call (dsv4lab.concurrency: a caller is a thread and, in it, a CUDA
    stream) and handed out again on its later calls, whose launches its stream orders; no other caller
    ever gets them. While a CUDA graph is captured they are made afresh on every call, from the graph's
    private pool, so every graph has its own (``counters`` says how zeroed ones are made there)."""
    store, stream = concurrency.scope(device)
    if stream is concurrency.CAPTURING:
        return make()
    ws = store.get((key, stream))
    if ws is None:
        ws = store[key, stream] = make()
    return ws


def counters(n: int, device) -> torch.Tensor:
    """``n`` int32 counters at zero for a workspace (``make`` of :func:`workspaces`) whose kernels return
    them to zero after every launch: under CUDA-graph capture a slice of a zeroed arena nobody else uses
    (concurrency.zeroed_counters: the graph holds no memset), else zeros, leaving room in the arena
    for this launch's later captures."""
    device = torch.device(device)
    if device.type == "cuda":
        if concurrency.capturing():
            return concurrency.zeroed_counters(n, device)
        concurrency.keep_arena(device, n)
    return torch.zeros(n, dtype=torch.int32, device=device)


def poison_all(*tensors):
    """Under testing.poisoned(): refill reused workspaces (None: none) as ``alloc`` fills outputs, so an
    element a launch forgets to write fails the check."""
    if _POISON[0]:
        for t in tensors:
            if t is not None:
                t.fill_(_poison_value(t.dtype))


def reused(name: str, shape: tuple, dtype: torch.dtype, device, *, poison: bool = True) -> torch.Tensor:
    """One workspace tensor of the caller's (:func:`workspaces`), refilled under testing.poisoned() (``poison``)."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    (t,) = workspaces((name, shape, dtype, device), device,
                      lambda: (torch.empty(shape, dtype=dtype, device=device),))
    if poison:
        poison_all(t)
    return t


@triton.jit(do_not_specialize=["FLAG"])      # one kernel for every bit: none compiles first inside a capture
def _or_word_kernel(ERR, WHEN, FLAG):
    if tl.load(WHEN):
        tl.atomic_or(ERR, FLAG)


@triton.jit
def _swap_word_kernel(ERR, OUT, CLEAR: tl.constexpr):
    if CLEAR:
        tl.store(OUT, tl.atomic_xchg(ERR, 0))
    else:
        tl.store(OUT, tl.atomic_or(ERR, 0))


_NO_CONSTS: dict = {}
_CLEAR, _KEEP = {"CLEAR": True}, {"CLEAR": False}


def or_word(err: torch.Tensor, when: torch.Tensor, flag: int):
    """errors.set_flag on a GPU: ``flag`` ORed into the error word ``err`` by an atomic where the 0-d
    bool ``when`` is true (one launch, no sync)."""
    launch_kernel(_or_word_kernel, (1,), (err, when), (flag,), _NO_CONSTS)


def swap_word(err: torch.Tensor, clear: bool) -> int:
    """errors.read on a GPU: the error word's bits, swapped for 0 (``clear``) in one atomic exchange on
    the current stream (a host sync)."""
    out = torch.empty(1, dtype=torch.int32, device=err.device)
    launch_kernel(_swap_word_kernel, (1,), (err, out), (), _CLEAR if clear else _KEEP)
    return int(out.item())


def finish(out: torch.Tensor) -> torch.Tensor:
    return out if out.dtype == torch.bfloat16 else out.to(torch.bfloat16)


assert DATA_BYTES == 576 and SCALE_BYTES == 8 and HEAD_DIM == 512 and NOPE_DIM == 448
