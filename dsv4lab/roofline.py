"""Byte and FLOP counts of each stage, and the floors they imply.

A "floor" is the time the work would take at a ceiling: bytes / copy bandwidth
or FLOPs / matmul rate; the larger of the two bounds any implementation.
``served`` bytes count what a kernel makes the memory system deliver, re-reads
included (they mostly hit L2, which is why SIMT is not 64x slower than its floor).
"""
from __future__ import annotations

import math

from .cache import INDEX_TOKEN_BYTES, TOKEN_BYTES


def decode_floor_bytes(B, H, K, D=512) -> int:
    """Each gathered token once + indices + bf16 q and out + fp32 lse."""
    return B * K * (TOKEN_BYTES + 4) + B * H * (2 * D * 2 + 4)


def decode_served_bytes(B, H, K, heads_per_read: int, D=512) -> int:
    """KV gathered once per group of ``heads_per_read`` heads (1 for SIMT, BLOCK_H for mma)."""
    reads = math.ceil(H / heads_per_read)
    return B * reads * K * (TOKEN_BYTES + 4) + B * H * (2 * D * 2 + 4)


def decode_flops(B, H, K, D=512) -> int:
    """QK^T and PV, 2 FLOPs per multiply-add: 4 * H * K * D per query."""
    return 4 * B * H * K * D


def indexer_bytes(B, seq_len, Hi=64, Di=128) -> int:
    """Live keys once (132 B/token) + q (bf16) + weights + fp32 logits out."""
    return B * seq_len * (INDEX_TOKEN_BYTES + 4) + B * Hi * (Di * 2 + 4)


def indexer_flops(B, seq_len, Hi=64, Di=128) -> int:
    """q . k for every head and token (2*Hi*Di) plus relu, weight and sum (~3*Hi)."""
    return B * seq_len * Hi * (2 * Di + 3)


def floor_us(nbytes, flops, copy_tb_s, tflops) -> dict:
    t_mem = nbytes / (copy_tb_s * 1e12) * 1e6
    t_math = flops / (tflops * 1e12) * 1e6
    return {"mem_us": t_mem, "math_us": t_math, "floor_us": max(t_mem, t_math),
            "bound": "memory" if t_mem >= t_math else "compute",
            "intensity": flops / nbytes}
