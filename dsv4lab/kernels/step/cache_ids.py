"""The indexer's top-k (logical compressed positions, -1 padding) -> the compressed cache's token ids
through the page table, in one launch (S5; S4 runs clamp, gather, floor-divide, remainder, products,
where and casts: ~10 torch kernels)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..buffers import alloc
from ..launch import next_power_of_2


@triton.jit
def _cache_ids_kernel(TOP, PT, OUT, K, stride_tb, stride_pb, stride_ob, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    for k0 in range(0, K, BLOCK):
        k = k0 + tl.arange(0, BLOCK)
        t = tl.load(TOP + b * stride_tb + k, mask=k < K, other=-1)
        safe = tl.maximum(t, 0)
        page = tl.load(PT + b * stride_pb + safe // ROWS, mask=(k < K) & (t >= 0), other=0)
        phys = page * ROWS + safe % ROWS
        tl.store(OUT + b * stride_ob + k, tl.where(t >= 0, phys, -1).to(tl.int32), mask=k < K)


def cache_ids(top, page_table, rows_per_page: int):
    """top int32 [B, K] logical positions (< 0: none), page_table int32 [B, pages] -> int32 [B, K]
    cache token ids page_table[b, t // rows] * rows + t % rows (-1 where top is)."""
    B, K = top.shape
    out = alloc((B, K), torch.int32, top.device)
    if B and K:
        _cache_ids_kernel[(B,)](top, page_table, out, K, top.stride(0), page_table.stride(0), out.stride(0),
                                ROWS=rows_per_page, BLOCK=min(1024, next_power_of_2(K)), num_warps=4)
    return out
