"""The launch options each device actually ships (planning.TILE_TABLE and launch_for), run as shipped.

On CPU the interpreter runs every device's tiles and loop with the options it can run ("cvt", no
PDL); the tests marked ``gpu`` run this device's exact launches (the "bits" dequant and PDL included)
in the recorded GPU run, against the float64 reference, and check CUDA-graph replay and reruns bitwise.
"""
import dataclasses

import pytest
import torch

import dsv4lab
from dsv4lab import bench
from dsv4lab.kernels.decode import planning
from dsv4lab.kernels.decode import head_batched, split_k
from dsv4lab.testing import LSE_TOL, OUT_TOL, check_decode, make_decode_inputs

ENTRIES = sorted(k for k in planning.TILE_TABLE if k[0] != "default")


def _check(opts, inp):
    return check_decode(lambda i: split_k.run(i.q, i.cache, i.indices, i.topk_len, 512**-0.5, i.attn_sink, opts), inp)


@pytest.mark.parametrize("key", ENTRIES, ids=lambda k: f"{k[0]}-{k[1]}")
@pytest.mark.parametrize("nsplit", [1, 2])
def test_every_device_entry_runs_here(key, nsplit):
    # each device's tiles, loop and fold, whole rows and split slices; the dequant this machine runs
    cfg = planning.TILE_TABLE[key]
    opts = planning.launch_for(cfg, nsplit)
    H = max(cfg.block_h, 16) + 3                                     # a partial head block
    inp = make_decode_inputs(2, H, 2 * cfg.block_n + 5, context=4 * cfg.block_n, pad_frac=0.1, topk_len=True,
                             sink=True, seed=7)
    e_out, e_lse = _check(opts, inp)
    assert e_out <= OUT_TOL and e_lse <= LSE_TOL, (key, opts)


def _shipped_launches():
    """This device's launches for impls mma / splitk / splitk_auto at the campaign's batch sizes."""
    out = {}
    for B in (1, 4, 16, 32, 64, 128):
        out[f"mma B={B}"] = (B, head_batched.mma_launch(B, 64, 512))
        out[f"splitk B={B}"] = (B, split_k.splitk_launch(B, 64, 512))
        out[f"splitk_auto B={B}"] = (B, split_k.auto_launch(B, 64, 512))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(_shipped_launches()) if dsv4lab.device.mode() == "cuda" else ["-"])
def test_shipped_launch_on_the_gpu(name):
    B, opts = _shipped_launches()[name]
    inp = make_decode_inputs(B, 64, 512, context=1024, pad_frac=0.05, topk_len=True, sink=True, seed=B)
    e_out, e_lse = _check(opts, inp)
    assert e_out <= OUT_TOL and e_lse <= LSE_TOL, opts
    fn = lambda: split_k.run(inp.q, inp.cache, inp.indices, inp.topk_len, 512**-0.5, inp.attn_sink, opts)  # noqa: E731
    first = fn()
    for _ in range(19):                                              # bitwise over 20 runs
        again = fn()
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    g, res = bench.capture(fn)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(res[0], first[0]) and torch.equal(res[1], first[1])


@pytest.mark.gpu
def test_bits_dequant_equals_cvt_on_the_gpu():
    # the integer dequant is bitwise the conversion path on every launch that ships it
    B, opts = 128, head_batched.mma_launch(128, 64, 512)
    inp = make_decode_inputs(B, 64, 512, context=1024, seed=3)
    cvt = dataclasses.replace(opts, dequant="cvt")
    a = split_k.run(inp.q, inp.cache, inp.indices, None, 512**-0.5, None, opts)
    b = split_k.run(inp.q, inp.cache, inp.indices, None, 512**-0.5, None, cvt)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
