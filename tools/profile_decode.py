"""Run one decode impl a few times at one batch size: a target for ncu.

    ncu --clock-control none -k regex:head_batched --launch-skip 2 --launch-count 1 \
        python tools/profile_decode.py mma 128
"""
import sys

import torch

import dsv4lab
from dsv4lab.testing import make_decode_inputs

impl, B = sys.argv[1], int(sys.argv[2])
inp = make_decode_inputs(B, 64, 512, context=8192, seed=1)
for _ in range(4):
    dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl)
torch.cuda.synchronize()
