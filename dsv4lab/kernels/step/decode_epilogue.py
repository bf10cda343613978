"""After a layer's sparse decode, in one launch (S5): merge the window cache's and the compressed
cache's partial attentions by their log-sum-exp, apply the attention sink, undo the rope on the
output's last dims and keep this GPU's heads, rounding once to bf16. S4 runs
merged_decode.merge_by_lse / apply_sink, a bf16 cast and step_glue.rope(inverse=True): ~25 torch
kernels a layer. The math and its "no valid token" rule are merged_decode's."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...config import HEAD_DIM
from ..buffers import alloc
from .rounding import rne_bf16


@triton.jit
def _nan_max(a, b):
    """max that is NaN when either is (tl.maximum may return the other operand)."""
    return tl.where((a != a) | (b != b), a + b, tl.maximum(a, b))


@triton.jit
def _decode_epilogue_kernel(O1, L1, O2, L2, SINK, COS, SIN, OUT, heads, stride_o1b, stride_o1h, stride_l1b,
                            stride_o2b, stride_o2h, stride_l2b, D: tl.constexpr, ROPE: tl.constexpr,
                            TWO: tl.constexpr, HAS_SINK: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    NOPE: tl.constexpr = D - ROPE
    c = tl.arange(0, D)
    l1 = tl.load(L1 + b * stride_l1b + h)
    o = tl.load(O1 + b.to(tl.int64) * stride_o1b + h * stride_o1h + c).to(tl.float32)
    lse = l1
    if TWO:
        l2 = tl.load(L2 + b * stride_l2b + h)
        o2 = tl.load(O2 + b.to(tl.int64) * stride_o2b + h * stride_o2h + c).to(tl.float32)
        m = _nan_max(l1, l2)
        m_safe = tl.where(m == -float("inf"), 0.0, m)                 # both empty: weights 0, not NaN
        w1 = tl.exp(l1 - m_safe)
        w2 = tl.exp(l2 - m_safe)
        total = w1 + w2
        div = tl.where(total != total, total, tl.maximum(total, 1.0))
        o = (w1 * o + w2 * o2) / div
        lse = m + tl.log(div)
    if HAS_SINK:
        s = tl.load(SINK + h)
        mx = _nan_max(lse, s)
        new = mx + tl.log(tl.exp(lse - mx) + tl.exp(s - mx))
        w = tl.where(lse == -float("inf"), 0.0, tl.exp(lse - new))
        o = o * w
    # inverse rope on the last ROPE dims, in pairs (2i, 2i+1): rotate by -angle
    p = tl.arange(0, ROPE // 2)
    out_row = OUT + (b.to(tl.int64) * heads + h) * D
    tl.store(out_row + c, rne_bf16(o).to(OUT.dtype.element_ty), mask=c < NOPE)
    # the rope dims again, as pairs (re-read: registers hold o by column, not by pair)
    oe = tl.load(O1 + b.to(tl.int64) * stride_o1b + h * stride_o1h + NOPE + 2 * p).to(tl.float32)
    oo = tl.load(O1 + b.to(tl.int64) * stride_o1b + h * stride_o1h + NOPE + 2 * p + 1).to(tl.float32)
    if TWO:
        ee = tl.load(O2 + b.to(tl.int64) * stride_o2b + h * stride_o2h + NOPE + 2 * p).to(tl.float32)
        eo = tl.load(O2 + b.to(tl.int64) * stride_o2b + h * stride_o2h + NOPE + 2 * p + 1).to(tl.float32)
        oe = (w1 * oe + w2 * ee) / div
        oo = (w1 * oo + w2 * eo) / div
    if HAS_SINK:
        oe = oe * w
        oo = oo * w
    cs = tl.load(COS + b * (ROPE // 2) + p)
    sn = -tl.load(SIN + b * (ROPE // 2) + p)
    tl.store(out_row + NOPE + 2 * p, rne_bf16(oe * cs - oo * sn).to(OUT.dtype.element_ty))
    tl.store(out_row + NOPE + 2 * p + 1, rne_bf16(oe * sn + oo * cs).to(OUT.dtype.element_ty))


def decode_epilogue(parts, attn_sink, cos, sin, heads: int):
    """parts: one or two (out [B, H, 512], lse float32 [B, H]) of the per-cache decodes; attn_sink [H]
    float32 or None; cos/sin [B, rope/2] float32 -> bf16 [B, heads, 512]: the merged, sunk attention
    of the first ``heads`` heads with the rope undone (merged_decode + step_glue.rope(inverse=True))."""
    (o1, l1), *rest = parts
    o2, l2 = rest[0] if rest else (o1, l1)
    B, H, D = o1.shape
    if D != HEAD_DIM or not 0 < heads <= H or o1.stride(2) != 1 or o2.stride(2) != 1:
        raise ValueError(f"the decode outputs must be [B, H >= heads={heads}, {HEAD_DIM}] with contiguous rows, "
                         f"got {list(o1.shape)}")
    out = alloc((B, heads, D), torch.bfloat16, o1.device)
    if B:
        _decode_epilogue_kernel[(B, heads)](
            o1, l1, o2, l2, o1 if attn_sink is None else attn_sink, cos, sin, out, heads, o1.stride(0), o1.stride(1),
            l1.stride(0), o2.stride(0), o2.stride(1), l2.stride(0), D=D, ROPE=2 * cos.shape[1], TWO=bool(rest),
            HAS_SINK=attn_sink is not None, num_warps=4)
    return out
