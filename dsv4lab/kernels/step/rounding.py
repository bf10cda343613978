"""Rounding the fused step kernels do by hand, the same on the GPU and in Triton's interpreter (whose
fp32 -> bf16 and fp32 -> fp8 casts truncate instead of rounding to nearest even): a value rounded
here is exactly representable, so the cast that stores it is exact everywhere."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rne_bf16(x):
    """fp32 -> the fp32 value of the nearest bf16 (ties to even), as torch's .to(torch.bfloat16).
    NaN stays NaN; inf stays inf."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536           # -65536 = 0xFFFF0000
    y = rounded.to(tl.float32, bitcast=True)
    return tl.where(x != x, x, y)


@triton.jit
def e4m3_bits(v):
    """fp32 v with |v| <= 448 -> the byte of the nearest fp8 e4m3fn (ties to even), as torch's
    .to(torch.float8_e4m3fn).view(torch.uint8). Exponent from the float's bits (exact), the rounding
    as floor(t + 1/2) minus one on an odd tie."""
    bits = v.to(tl.int32, bitcast=True)
    sign = ((bits >> 24) & 0x80).to(tl.int32)
    a = tl.abs(v)
    e = ((bits >> 23) & 0xFF) - 127                                   # floor(log2 |v|) of a normal float
    normal = a >= 0.015625                                            # 2^-6, e4m3's smallest normal
    e_c = tl.where(normal, e, -6)
    step = ((e_c - 3 + 127) << 23).to(tl.float32, bitcast=True)       # 2^(e_c - 3) from its bits: t is exact
    t = a / step
    r = tl.floor(t + 0.5)
    odd = (r - 2.0 * tl.floor(r * 0.5)) == 1.0
    r = tl.where(((r - t) == 0.5) & odd, r - 1.0, r)
    # normal: exponent field e + 7, mantissa r - 8 (r = 16 carries into the exponent by itself);
    # subnormal: the byte is r (r = 8 is the smallest normal's byte)
    byte = tl.where(normal, (e_c + 6) * 8 + r.to(tl.int32), r.to(tl.int32))
    return tl.where(v != v, 0x7F, byte | sign).to(tl.uint8)         # NaN: e4m3fn's NaN byte
