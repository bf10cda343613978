"""What every decode kernel shares: reading a tile of tokens out of the DSv4 cache.

The cache is one byte buffer seen through three typed views (fp8 for nope
values, uint8 for UE8M0 scales, bf16 for rope), as in SGLang. ``gather_kv_tile``
returns the BLOCK_N tokens named by ``tok`` as one dequantized [BLOCK_N, 512]
fp32 tile whose columns are exactly the 512 model dims: 0..447 from fp8 * scale,
448..511 from bf16 rope. So q . k is one 512-wide product; nothing is padded.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import errors
from ...config import DATA_BYTES, HEAD_DIM, NOPE_DIM, QUANT_TILE, ROPE_DIM, SCALE_BYTES
from ..buffers import alloc, out_dtype
from ..rows import token_limit

LOG2E = 1.4426950408889634


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
                      HAS_SINK=attn_sink is not None, D=D, NOPE=NOPE_DIM)
    return args, constexprs, out, lse


# the layout's byte counts as the jitted code may read them
_DATA_BYTES = tl.constexpr(DATA_BYTES)
_SCALE_BYTES = tl.constexpr(SCALE_BYTES)


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
    data = tl.multiple_of(page * PAGE_BYTES + slot * _DATA_BYTES, 64)     # token's data bytes
    scl = tl.multiple_of(page * PAGE_BYTES + PAGE_SIZE * _DATA_BYTES + slot * _SCALE_BYTES, 8)  # its 8 scale bytes
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
L2_PREFETCH_ASM = f"cp.async.bulk.prefetch.L2.global [$1], {DATA_BYTES}; prefetch.global.L2 [$2]; mov.u32 $0, 0;"
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
    data = page * PAGE_BYTES + slot * _DATA_BYTES
    scl = page * PAGE_BYTES + PAGE_SIZE * _DATA_BYTES + slot * _SCALE_BYTES
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


# the tiles' 64-wide groups (one scale byte each) and the loads' 64-byte alignment hint
assert QUANT_TILE == ROPE_DIM == 64 and SCALE_BYTES == HEAD_DIM // 64 and DATA_BYTES % 64 == 0
