"""RMS norm and DeepSeek's rope (interleaved pairs over the last ``rope`` dims) of many rows in one
launch (S5): the query heads into the decode's padded query, the indexer's query heads, the q LoRA
row. S4 runs each as several torch kernels (F.rms_norm, then step_glue.rope: a float copy, four
products, a stack, a cast and a cat)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..buffers import alloc
from ..launch import next_power_of_2
from .rounding import rne_bf16


@triton.jit
def norm_rope_row(X, W, COS, SIN, Y, b, eps, WIDTH: tl.constexpr, WIDTH_P: tl.constexpr, ROPE: tl.constexpr,
                  NORM: tl.constexpr, HAS_W: tl.constexpr, INVERSE: tl.constexpr):
    """One row of WIDTH values at X -> Y (bf16, rounded once): optionally rms-normed (times W), then
    its last ROPE dims rotated in pairs (2i, 2i+1) by row b's cos/sin [ROPE / 2] (inverse: by -sin)."""
    NOPE: tl.constexpr = WIDTH - ROPE
    c = tl.arange(0, WIDTH_P)
    cm = c < NOPE
    xn = tl.load(X + c, mask=cm, other=0.0).to(tl.float32)
    ss = tl.sum(xn * xn, axis=0)
    if ROPE > 0:
        p = tl.arange(0, ROPE // 2)
        xe = tl.load(X + NOPE + 2 * p).to(tl.float32)
        xo = tl.load(X + NOPE + 2 * p + 1).to(tl.float32)
        ss += tl.sum(xe * xe, axis=0) + tl.sum(xo * xo, axis=0)
    if NORM:
        inv = 1.0 / tl.sqrt(ss / WIDTH + eps)
        xn = xn * inv
        if HAS_W:
            xn = xn * tl.load(W + c, mask=cm, other=0.0).to(tl.float32)
    tl.store(Y + c, rne_bf16(xn).to(Y.dtype.element_ty), mask=cm)
    if ROPE > 0:
        if NORM:
            xe = xe * inv
            xo = xo * inv
            if HAS_W:
                xe = xe * tl.load(W + NOPE + 2 * p).to(tl.float32)
                xo = xo * tl.load(W + NOPE + 2 * p + 1).to(tl.float32)
        cs = tl.load(COS + b * (ROPE // 2) + p)
        sn = tl.load(SIN + b * (ROPE // 2) + p)
        if INVERSE:
            sn = -sn
        tl.store(Y + NOPE + 2 * p, rne_bf16(xe * cs - xo * sn).to(Y.dtype.element_ty))
        tl.store(Y + NOPE + 2 * p + 1, rne_bf16(xe * sn + xo * cs).to(Y.dtype.element_ty))


@triton.jit
def _norm_rope_kernel(X, W, COS, SIN, Y, heads, stride_xb, stride_xh, stride_yb, stride_yh, eps,
                      WIDTH: tl.constexpr, WIDTH_P: tl.constexpr, ROPE: tl.constexpr, NORM: tl.constexpr,
                      HAS_W: tl.constexpr, INVERSE: tl.constexpr):
    r = tl.program_id(0)
    b = r // heads
    hd = r % heads
    norm_rope_row(X + b.to(tl.int64) * stride_xb + hd * stride_xh, W, COS, SIN,
                  Y + b.to(tl.int64) * stride_yb + hd * stride_yh, b, eps, WIDTH, WIDTH_P, ROPE, NORM, HAS_W, INVERSE)


def norm_rope(x, out, *, cos=None, sin=None, weight=None, norm: bool = True, eps: float = 1e-6,
              inverse: bool = False):
    """x [B, heads, width] (any strides; the last dim contiguous) -> out (bf16, same shape, written in
    place, e.g. a slice of a bigger buffer): rms_norm over width (times ``weight`` [width]) if
    ``norm``, then rope on the last 2 * cos.shape[1] dims with cos/sin [B, rope/2] float32 (none if
    cos is None). Returns out."""
    if x.dim() != 3 or x.stride(2) != 1 or out.shape != x.shape or out.stride(2) != 1:
        raise ValueError(f"x and out must be [B, heads, width] with a contiguous last dim, got "
                         f"{list(x.shape)} and {list(out.shape)}")
    if out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bf16, got {out.dtype}")
    B, heads, width = x.shape
    rope = 0 if cos is None else 2 * cos.shape[1]
    if rope and (cos.shape != (B, rope // 2) or sin.shape != cos.shape or not cos.is_contiguous()
                 or not sin.is_contiguous() or rope > width):
        raise ValueError(f"cos and sin must be contiguous [B={B}, rope/2] with rope <= width={width}, "
                         f"got {list(cos.shape)} and {list(sin.shape)}")
    if weight is not None and weight.shape != (width,):
        raise ValueError(f"weight must be [width={width}], got {list(weight.shape)}")
    if B * heads:
        _norm_rope_kernel[(B * heads,)](
            x, x if weight is None else weight, x if cos is None else cos, x if sin is None else sin, out, heads,
            x.stride(0), x.stride(1), out.stride(0), out.stride(1), eps, WIDTH=width,
            WIDTH_P=max(16, next_power_of_2(width - rope)), ROPE=rope, NORM=norm, HAS_W=weight is not None, INVERSE=inverse,
            num_warps=4)
    return out


def norm_rope_new(x, **kw):
    """norm_rope into a new contiguous bf16 tensor."""
    return norm_rope(x, alloc(tuple(x.shape), torch.bfloat16, x.device), **kw)
