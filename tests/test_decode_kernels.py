"""Every sparse-decode implementation against the float64 reference (Triton interpreter on CPU).

Outputs are poisoned with NaN before each run; fresh random inputs each case;
odd sizes on purpose. Tolerances and why: dsv4lab/testing.py.
"""
import math

import pytest
import torch

import dsv4lab
from dsv4lab.testing import (LSE_TOL, OUT_TOL, VS_SIMT_TOL, check_decode, make_decode_inputs,
                             poisoned, rel_err)

IMPLS = ["simt", "mma_story", "mma_story_stop", "mma", "splitk", "splitk_auto", "auto", "sglang"]

# (B, H, K, context, page_size, pad_frac, topk_len, sink)
CASES = [
    pytest.param(1, 1, 1, 1, 64, 0.0, False, False, id="B1-H1-K1-one-token"),
    pytest.param(2, 3, 17, 40, 64, 0.2, False, False, id="H3-K17-padding"),
    pytest.param(1, 16, 40, 130, 64, 0.0, True, True, id="B1-topklen-sink-3pages"),
    pytest.param(3, 8, 33, 300, 256, 0.3, True, False, id="page256-padding-topklen"),
    pytest.param(2, 5, 64, 64, 64, 0.0, False, True, id="one-full-page-K-equals-tile-multiple"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("B,H,K,ctx,ps,pad,tlen,sink", CASES)
def test_matches_reference(impl, B, H, K, ctx, ps, pad, tlen, sink):
    inp = make_decode_inputs(B, H, K, context=ctx, page_size=ps, pad_frac=pad, topk_len=tlen, sink=sink)
    e_out, e_lse = check_decode(impl, inp)
    assert e_out <= OUT_TOL, f"{impl}: out rel. error {e_out:.2e} > {OUT_TOL}"
    assert e_lse <= LSE_TOL, f"{impl}: lse rel. error {e_lse:.2e} > {LSE_TOL}"


@pytest.mark.parametrize("impl", ["mma_story", "mma_story_stop", "mma", "splitk", "splitk_auto"])
def test_tensor_core_kernels_match_simt(impl):
    inp = make_decode_inputs(2, 16, 48, context=100, pad_frac=0.1, topk_len=True)
    assert check_decode(impl, inp, against="simt")[0] <= VS_SIMT_TOL


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_rows_give_zero_and_minus_inf(impl, dev):
    """topk_len 0, and a row of only -1: out 0 and lse -inf without a sink, never NaN."""
    inp = make_decode_inputs(3, 4, 20, context=50)
    inp.indices[1] = -1
    inp.topk_len = torch.tensor([0, 20, 7], dtype=torch.int32, device=dev)
    with poisoned():
        out, lse = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, topk_len=inp.topk_len)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert (out[:2] == 0).all() and (lse[:2] == -math.inf).all()
    assert torch.isfinite(lse[2]).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_empty_rows_with_sink_give_sink_lse(impl, dev):
    inp = make_decode_inputs(2, 4, 16, context=32, sink=True)
    inp.indices[0] = -1
    out, lse = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, attn_sink=inp.attn_sink)
    assert (out[0] == 0).all() and torch.allclose(lse[0], inp.attn_sink.float())


@pytest.mark.parametrize("impl", ["simt", "mma", "splitk"])
def test_page_boundary_tokens(impl, dev):
    """Tokens on both sides of every page boundary, in one row."""
    ctx = 4 * 64
    inp = make_decode_inputs(1, 4, 8, context=ctx)
    inp.indices[0] = torch.tensor([63, 64, 127, 128, 191, 192, 0, 255], dtype=torch.int32, device=dev)
    e_out, e_lse = check_decode(impl, inp)
    assert e_out <= OUT_TOL and e_lse <= LSE_TOL


def test_outputs_shape_dtype(dev):
    inp = make_decode_inputs(2, 4, 8, context=16)
    for impl in IMPLS + ["reference"]:
        out, lse = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl)
        assert out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 4, 512)
        assert lse.dtype == torch.float32 and tuple(lse.shape) == (2, 4)


def test_rel_err_rejects_nan_and_mismatched_inf():
    ref = torch.tensor([1.0, 2.0, -math.inf])
    assert rel_err(ref, ref) == 0
    assert rel_err(torch.tensor([1.0, float("nan"), -math.inf]), ref) == math.inf
    assert rel_err(torch.tensor([1.0, 2.0, 0.0]), ref) == math.inf
    assert rel_err(torch.tensor([1.1, 2.0, -math.inf]), ref) == pytest.approx(0.1 / math.sqrt(5))


def test_poison_catches_unwritten_output(dev):
    """A launch that skips rows must fail the check, not pass on leftover memory."""
    from dsv4lab import reference
    from dsv4lab.kernels.decode import head_batched
    from dsv4lab.kernels import buffers, launch
    inp = make_decode_inputs(2, 4, 8, context=16)
    with poisoned():
        out = buffers.alloc((2, 4, 512), buffers.out_dtype(), dev)
        lse = buffers.alloc((2, 4), torch.float32, dev)
    # a buggy launch: only batch row 0 is computed
    head_batched.launch(inp.q[:1], inp.cache, inp.indices[:1], None, 512**-0.5, None, out, lse,
                        head_batched.mma_launch(1, 4, 8))
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices)
    assert rel_err(out.float(), ro) == math.inf and rel_err(lse, rl) == math.inf
    assert rel_err(out[:1].float(), ro[:1]) <= OUT_TOL


def _launch(loop, nsplit=1, fold=False, partials="float32", block_h=16):
    from dsv4lab.kernels.decode.planning import Launch, TileConfig
    return Launch(TileConfig(block_h, 16, 4, 1, "test", loop=loop), nsplit, fold_scale=fold, partials=partials)


@pytest.mark.parametrize("loop,nsplit,fold", [(lp, n, f) for lp in ("plain", "registers", "l2_hint")
                                              for n in (1, 2, 3) for f in (False, True)])
def test_every_loop_of_the_tuned_kernel(loop, nsplit, fold):
    # the tuned kernel's loops (planning.LOOPS; l2_hint runs without its hint in the interpreter)
    # on 3 tiles of 16 + a partial one, padding and topk_len, whole rows and split slices (a slice
    # may start past topk_len, or hold one partial tile); ``fold``: the softmax scale folded into
    # exp2's FMA (the H200 64-head entry's)
    from dsv4lab import reference
    from dsv4lab.kernels.decode import split_k
    inp = make_decode_inputs(3, 16, 53, context=200, pad_frac=0.2, topk_len=True, sink=True)
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, **inp.kwargs())
    with poisoned():
        out, lse = split_k.run(inp.q, inp.cache, inp.indices, inp.topk_len, 512**-0.5, inp.attn_sink,
                               _launch(loop, nsplit, fold))
    assert rel_err(out.float(), ro) <= OUT_TOL
    assert rel_err(lse, rl) <= LSE_TOL


@pytest.mark.parametrize("block_h", [16, 32, 64])
def test_story_kernel_tiles(block_h):
    # the story's stage-2 kernel at several head blocks, heads not a multiple of the block
    from dsv4lab import reference
    from dsv4lab.kernels.decode import head_batched
    from dsv4lab.kernels.decode.planning import TileConfig
    inp = make_decode_inputs(2, 40, 45, context=120, pad_frac=0.2, topk_len=True, sink=True)
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, **inp.kwargs())
    with poisoned():
        out, lse = head_batched.sparse_decode_story(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5,
                                                    tiles=TileConfig(block_h, 16, 4, 1, "test"), **inp.kwargs())
    assert rel_err(out.float(), ro) <= OUT_TOL and rel_err(lse, rl) <= LSE_TOL


def test_story_launch_is_two_programs_per_request_at_64_heads():
    # the story's C=1 regression: its head-batched grid had H / BLOCK_H = 2 programs at B=1
    from dsv4lab.kernels.decode.planning import STORY_TILES
    assert -(-64 // STORY_TILES.block_h) == 2


def test_the_story_tiles_comment_says_what_the_code_launches():
    """planning's comment on STORY_TILES names its tile, warps and stages and the shared memory it compiles
    to on the story's GPU: each figure is the TileConfig's, and the recorded sm_120 compile's."""
    import inspect
    import json
    import re
    from pathlib import Path

    from dsv4lab.kernels.decode import planning
    src = inspect.getsource(planning)
    comment = src[:src.index("STORY_TILES = ")].rsplit("\n\n", 1)[-1]
    t = planning.STORY_TILES
    said = {k: int(v) for v, k in re.findall(r"(\d+) (tokens|warps|stage)", comment)}
    assert said == {"tokens": t.block_n, "warps": t.num_warps, "stage": t.num_stages}, said
    runs = Path(__file__).resolve().parent.parent / "experiments" / "other_gpus_compile" / "run_triton39.json"
    (story,) = [r for r in json.loads(runs.read_text())["rows"] if r.get("kind") == "launch"
                and r.get("kernel") == "_story_kernel" and r.get("target") == "RTX PRO 6000"]
    assert (story["constexprs"]["BLOCK_N"], story["num_warps"], story["num_stages"]) == (t.block_n, t.num_warps, t.num_stages)
    assert story["fits"]
    assert f"{story['shared_bytes']:,} B" in comment and f"{story['smem_limit']:,} B" in comment


def test_split_launch_refuses_a_sink():
    from dsv4lab.kernels.decode import head_batched, split_k
    inp = make_decode_inputs(2, 16, 53, context=200, sink=True)
    o_part, lse_part = split_k.workspace(2, 16, 3, inp.q.device)
    with pytest.raises(ValueError, match="attn_sink.*merge"):
        head_batched.launch(inp.q, inp.cache, inp.indices, None, 512**-0.5, inp.attn_sink, o_part, lse_part,
                            _launch("plain", 3))


def test_bf16_partials(monkeypatch):
    # split-K with bf16 partial outputs (half the workspace bytes): one more rounding, same bound
    from dsv4lab import reference
    from dsv4lab.kernels.decode import split_k
    inp = make_decode_inputs(2, 16, 70, context=300, pad_frac=0.2, topk_len=True, sink=True)
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, **inp.kwargs())
    import threading
    from dsv4lab import concurrency
    monkeypatch.setattr(concurrency, "_LOCAL", threading.local())        # this caller's workspaces: none yet
    with poisoned():
        out, lse = split_k.run(inp.q, inp.cache, inp.indices, inp.topk_len, 512**-0.5, inp.attn_sink,
                               _launch("registers", 3, partials="bfloat16"))
    (ws,) = [ws for k, ws in concurrency.scope(inp.q.device)[0].items() if k[0][0] == "split_k"]  # (o, lse)
    assert ws[0].dtype == torch.bfloat16
    assert rel_err(out.float(), ro) <= OUT_TOL
    assert rel_err(lse, rl) <= LSE_TOL


@pytest.mark.parametrize("heads,num_warps", [(1, 4), (4, 2), (16, 8)])
def test_combine_launch_shapes(heads, num_warps):
    # the combine launch with several heads per program: the same merge (split_k.merge_partials)
    from dsv4lab import reference
    from dsv4lab.kernels.decode import head_batched, split_k
    inp = make_decode_inputs(2, 12, 70, context=300, pad_frac=0.2, topk_len=True, sink=True)
    inp.topk_len[1] = 0                                          # a row with no token at all
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, **inp.kwargs())
    o_part, lse_part = split_k.workspace(2, 12, 3, inp.q.device)
    for buf in (o_part, lse_part):                               # poisoned: every element must be written
        buf.fill_(float("nan"))
    out = torch.full((2, 12, 512), float("nan"), device=inp.q.device)
    lse = torch.full((2, 12), float("nan"), device=inp.q.device)
    head_batched.launch(inp.q, inp.cache, inp.indices, inp.topk_len, 512**-0.5, None, o_part, lse_part,
                        _launch("registers", 3))
    split_k.combine(o_part, lse_part, inp.attn_sink, out, lse, heads=heads, num_warps=num_warps)
    assert rel_err(out, ro) <= OUT_TOL
    assert rel_err(lse, rl) <= LSE_TOL


def test_combine_warps_keep_a_slice_row_in_one_thread_group():
    # Triton loads 16 bytes a thread: 4 warps x 32 x 4 fp32 = 512 = one partial row, and for
    # bf16 that takes 2 warps; more warps would spread the slices over warps (a cross-warp sum)
    from dsv4lab.kernels.decode import split_k
    for dt in (torch.float32, torch.bfloat16):
        w = split_k.combine_warps(dt)
        assert w * 32 * (16 // dt.itemsize) == 512, (dt, w)


def test_launch_defaults_in_the_interpreter():
    # the interpreter truncates fp32->bf16 casts and runs no PTX: fp32 partials, "cvt", no PDL;
    # a Launch asking for the GPU-only options is refused there, naming them
    from dsv4lab.device import is_interpret
    from dsv4lab.kernels.decode.planning import TILE_TABLE, Launch, launch_for
    opts = launch_for(TILE_TABLE[("9.0", "mma")], 4, programs=4)
    if not is_interpret():
        pytest.skip("GPU: the defaults follow the tile entry")
    assert (opts.partials, opts.dequant, opts.pdl, opts.fold_scale) == ("float32", "cvt", False, False)
    with pytest.raises(ValueError, match="interpreter.*bits"):
        Launch(TILE_TABLE[("9.0", "mma")], dequant="bits")


def test_layer_copies_are_new_memory_with_the_same_values():
    # in-graph timing runs each "layer" on its own copy: no call may read bytes another left in L2
    from dsv4lab import bench
    inp = make_decode_inputs(2, 16, 40, context=100, topk_len=True, sink=True, seed=5)
    copies = bench.layer_copies(inp, 3)
    assert len(copies) == 3 and copies[0] is inp
    ptrs = {(x.q.data_ptr(), x.indices.data_ptr(), x.cache.buffer.data_ptr()) for x in copies}
    assert len({p for t in ptrs for p in t}) == 9                      # nine distinct buffers
    for x in copies[1:]:
        assert torch.equal(x.q, inp.q) and torch.equal(x.indices, inp.indices)
        assert torch.equal(x.cache.buffer, inp.cache.buffer) and x.cache.page_size == inp.cache.page_size
        out = dsv4lab.sparse_decode(x.q, x.cache, x.indices, impl="mma", **x.kwargs())
        ref = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="mma", **inp.kwargs())
        assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_in_graph_timing_refuses_the_interpreter():
    from dsv4lab import bench
    from dsv4lab.device import mode
    if mode() == "cuda":
        pytest.skip("on a GPU it times")
    with pytest.raises(RuntimeError, match="timings need a CUDA GPU"):
        bench.time_per_call_in_graph_ms([lambda: None])
    with pytest.raises(RuntimeError, match="timings need a CUDA GPU"):
        bench.back_to_back_us(lambda: None)


def test_host_cdiv_and_next_power_of_2_match_triton():
    # the launchers' host arithmetic (kernels.common) gives what triton.cdiv / next_power_of_2 give
    import triton
    from dsv4lab.kernels import buffers, launch
    for a in range(0, 200):
        for b in (1, 2, 3, 16, 64, 128):
            assert launch.cdiv(a, b) == triton.cdiv(a, b), (a, b)
    for n in list(range(0, 1100)) + [2**20 - 1, 2**20, 2**20 + 1, 262208]:
        assert launch.next_power_of_2(n) == triton.next_power_of_2(n), n


@pytest.mark.parametrize("impl", ["simt", "mma_story", "mma", "splitk", "splitk_auto"])
def test_a_non_finite_output_is_flagged_and_a_finite_one_is_not(impl):
    """An inf in one head of q makes that output row NaN: the kernel (or split-K's merge) sets
    NONFINITE in the error word, and leaves it clear on the same call with a finite q (odd H, so head blocks are padded)."""
    from dsv4lab import errors
    inp = make_decode_inputs(2, 5, 24, context=60, topk_len=True, sink=True)
    errors.read()
    dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, topk_len=inp.topk_len, attn_sink=inp.attn_sink, impl=impl)
    assert not errors.read() & errors.Flag.NONFINITE
    inp.topk_len.fill_(24)
    inp.q[1, 3, 7] = math.inf
    out, _ = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, topk_len=inp.topk_len, attn_sink=inp.attn_sink,
                                   impl=impl)
    assert not torch.isfinite(out[1, 3].float()).all() and torch.isfinite(out[0].float()).all()
    assert errors.read() & errors.Flag.NONFINITE


def _index_tile_loads(impl, inp, block_n):
    """Run ``impl`` under the interpreter, counting the loads of one index tile (int32, BLOCK_N lanes)
    each program makes, and whether any KV byte was read from an entry past its row's topk_len."""
    import triton.language as tl
    from triton.runtime import interpreter
    builder = interpreter.interpreter_builder
    real = builder.create_masked_load
    loads = []

    def counting(ptrs, mask, other, *a, **k):
        if ptrs.get_element_ty() == tl.int32 and ptrs.data.size == block_n:
            loads.append(int(mask.data.sum()))
        return real(ptrs, mask, other, *a, **k)
    builder.create_masked_load = counting
    try:
        out, lse = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs())
    finally:
        builder.create_masked_load = real
    return loads, out, lse


@pytest.mark.skipif(not dsv4lab.device.is_interpret(), reason="counts loads through Triton's interpreter")
@pytest.mark.parametrize("impl", ["mma_story", "mma_story_stop"])
def test_story_kernel_walks_the_padded_row(impl, dev):
    """SGLang's loop, kept by the story's kernel: every program loads cdiv(K, BLOCK_N) index tiles whatever
    topk_len is (a ratio-128 row is 8256 wide with 64 live); the early stop (mma_story_stop) loads only
    the tiles up to topk_len. Both match the float64 reference, and an entry past topk_len that points
    past the cache is read as padding and never flagged."""
    from dsv4lab import reference
    from dsv4lab.kernels.decode.planning import STORY_TILES
    B, H, K = 3, 40, 5 * STORY_TILES.block_n + 7                 # 6 tiles, the last partial; 2 head blocks
    inp = make_decode_inputs(B, H, K, context=300, pad_frac=0.1, sink=True)
    inp.topk_len = torch.tensor([3, 0, STORY_TILES.block_n + 1], dtype=torch.int32, device=dev)
    inp.indices[:, 40:] = 1 << 30                                 # past the cache, but past every topk_len too
    dsv4lab.errors.read()                                          # start clean
    with poisoned():
        loads, out, lse = _index_tile_loads(impl, inp, STORY_TILES.block_n)
    programs = B * -(-H // STORY_TILES.block_h)
    tiles = -(-K // STORY_TILES.block_n)
    if impl == "mma_story":
        assert len(loads) == programs * tiles
    else:
        per_row = [-(-int(n) // STORY_TILES.block_n) for n in inp.topk_len]
        assert len(loads) == sum(per_row) * -(-H // STORY_TILES.block_h)
    dsv4lab.check_errors()                                          # nothing flagged
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, **inp.kwargs())
    assert rel_err(out.float(), ro) <= OUT_TOL and rel_err(lse, rl) <= LSE_TOL
