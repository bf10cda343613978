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


def indexer_step_bytes(B, live, Hi=64, Di=128, k=512, q_bytes=2) -> int:
    """The indexer step over the live context (logits of live pages, then the top-k of each live
    prefix): live keys once (132 B/token), each live logit written and read back (8 B), q and the
    head weights, the k positions written. Nothing here grows with the max context."""
    return B * live * (INDEX_TOKEN_BYTES + 8) + B * Hi * (Di * q_bytes + 4) + B * k * 4


def indexer_torch_steps(B, max_seq_len, Hi=64, Di=128, gemm_bytes=2, page=64) -> list[dict]:
    """Stage 4's torch fallback, kernel by kernel, over the max context (every page of
    ceil(max_seq_len / 64), live or not): bytes read and written and FLOPs of each step as
    SGLang runs them (indexer_gemm.logits_torch). ``gemm_bytes``: 2 for the bf16 bmm, 4 for fp32."""
    L = -(-max_seq_len // page) * page
    t, g = B * L, gemm_bytes
    steps = [
        ("gather pages (page_table -> [B, pages, 64*132])", t * (Di + 4), t * (Di + 4), 0),
        ("values .contiguous()", t * Di, t * Di, 0),
        ("fp8 -> gemm dtype", t * Di, t * Di * g, 0),
        ("scales .contiguous()", t * 4, t * 4, 0),
        ("bmm  k @ q^T -> [B, L, H]", t * Di * g, t * Hi * g, 2 * t * Hi * Di),
        ("relu", t * Hi * g, t * Hi * g, t * Hi),
        ("* weights (-> fp32)", t * Hi * g, t * Hi * 4, t * Hi),
        ("sum over heads", t * Hi * 4, t * 4, t * Hi),
        ("* k_scale", 2 * t * 4, t * 4, t),
        ("-inf fill + copy + mask", 2 * t * 4, 3 * t * 4, 0),
    ]
    return [dict(step=n, read=r, written=w, flops=f) for n, r, w, f in steps]


def floor_us(nbytes, flops, copy_tb_s, tflops) -> dict:
    t_mem = nbytes / (copy_tb_s * 1e12) * 1e6
    t_math = flops / (tflops * 1e12) * 1e6
    return {"mem_us": t_mem, "math_us": t_math, "floor_us": max(t_mem, t_math),
            "bound": "memory" if t_mem >= t_math else "compute",
            "intensity": flops / nbytes}
