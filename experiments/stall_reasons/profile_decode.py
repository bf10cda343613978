"""Run one decode impl a few times at one batch size: a target for ncu.

    ncu --clock-control none -k regex:head_batched --launch-skip 2 --launch-count 1 \
        python tools/profile_decode.py mma 128 [BLOCK_H,BLOCK_N,warps,stages,prefetch]

With a tile spec, the head-batched kernel runs with that TileConfig instead of the table's.
"""
import sys

import torch

import dsv4lab
from dsv4lab.kernels import head_batched
from dsv4lab.testing import make_decode_inputs

impl, B = sys.argv[1], int(sys.argv[2])
inp = make_decode_inputs(B, 64, 512, context=8192, seed=1)
if len(sys.argv) > 3:
    bh, bn, nw, ns, pf = (int(v) for v in sys.argv[3].split(","))
    cfg = head_batched.TileConfig(bh, bn, nw, ns, "profile", False, pf)
    run = lambda: head_batched.sparse_decode_mma(inp.q, inp.cache, inp.indices, topk_len=None,  # noqa: E731
                                                 sm_scale=512**-0.5, attn_sink=None, cfg=cfg)
else:
    run = lambda: dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl)  # noqa: E731
for _ in range(4):
    run()
torch.cuda.synchronize()
