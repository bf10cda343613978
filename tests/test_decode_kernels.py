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

IMPLS = ["simt", "mma", "splitk", "auto", "sglang"]

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


@pytest.mark.parametrize("impl", ["mma", "splitk", "auto"])
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
    from dsv4lab.kernels import common, head_batched
    inp = make_decode_inputs(2, 4, 8, context=16)
    with poisoned():
        out = common.alloc((2, 4, 512), common.out_dtype(), dev)
        lse = common.alloc((2, 4), torch.float32, dev)
    # a buggy launch: only batch row 0 is computed
    head_batched.launch(inp.q[:1], inp.cache, inp.indices[:1], None, 512**-0.5, None, out, lse)
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices)
    assert rel_err(out.float(), ro) == math.inf and rel_err(lse, rl) == math.inf
    assert rel_err(out[:1].float(), ro[:1]) <= OUT_TOL


@pytest.mark.parametrize("prefetch,nsplit,merge,fold", [(p, 1, "launch", False) for p in (0, 2, 4)] +
                         [(p, n, m, False) for p in (0, 2, 4) for n in (2, 3) for m in ("fused", "launch")] +
                         [(p, 1, "launch", True) for p in (0, 2, 4)] + [(2, 3, "fused", True)] +
                         [(p, n, "coop", False) for p, n in ((0, 2), (2, 3), (4, 5))])
def test_every_loop_of_the_head_batched_kernel(prefetch, nsplit, merge, fold, monkeypatch):
    # the kernel's loops (head_batched.py: 0 = plain, 2 = register pipeline, 4 = indices ahead; 1 is a GPU-only
    # L2 hint over loop 0) on 3 tiles of 16 + a partial one, padding and topk_len, whole rows
    # and split slices (a slice may start past topk_len, or hold one partial tile); ``fold``: the
    # softmax scale folded into exp2's FMA (TileConfig.fold_scale, the H200 64-head entry's)
    from dsv4lab import reference
    from dsv4lab.kernels import head_batched, split_k
    monkeypatch.setattr(head_batched, "FOLD_SCALE", None)        # the entry decides, whatever the env says
    inp = make_decode_inputs(3, 16, 53, context=200, pad_frac=0.2, topk_len=True, sink=True)
    cfg = head_batched.TileConfig(16, 16, 4, 1, "test", prefetch=prefetch, fold_scale=fold)
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, **inp.kwargs())
    with poisoned():
        out, lse = split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5,
                                               nsplit=nsplit, cfg=cfg, merge=merge, **inp.kwargs())
    assert rel_err(out.float(), ro) <= OUT_TOL
    assert rel_err(lse, rl) <= LSE_TOL
    if merge != "launch":   # in-launch merges leave their arrival counts at zero (coop: two launches here, untouched)
        assert not split_k.workspace(3, 16, nsplit, inp.q.device, split_k.partials_dtype())[2][0::2].any()


def _only_workspace(split_k):
    """The one workspace key a call created (the cache starts empty): its partials dtype."""
    (key,) = split_k._WORKSPACE
    return key[-1]


def test_coop_merge_shares_and_grid_limit(monkeypatch):
    # each slice's share of the columns: the smallest power of two whose n shares cover 512
    from dsv4lab.kernels import common, head_batched, split_k
    for n in range(2, 17):
        ncol = common.coop_columns(n)
        assert ncol & (ncol - 1) == 0 and n * ncol >= 512 and n * (ncol // 2) < 512
    # on the GPU every program must be resident (they wait for each other): a bigger grid is refused
    inp = make_decode_inputs(3, 16, 53, context=200)
    cfg = head_batched.TileConfig(16, 16, 4, 1, "test", prefetch=2)
    monkeypatch.setattr(head_batched, "is_interpret", lambda: False)
    monkeypatch.setattr(head_batched, "sm_count", lambda: 8)
    assert head_batched.coop_fits(2, 16, 4, cfg) and not head_batched.coop_fits(3, 16, 3, cfg)
    with pytest.raises(ValueError, match="coop.*resident.*9 programs > 8 SMs"):
        split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, nsplit=3, cfg=cfg,
                                    merge="coop", topk_len=None, attn_sink=None)
    # chosen by the environment (DSV4LAB_MERGE=coop) instead: the combine launch where coop cannot run
    launched = []
    monkeypatch.setattr(split_k, "MERGE", "coop")
    monkeypatch.setattr(split_k, "combine", lambda *a, **k: launched.append(1))
    monkeypatch.setattr(head_batched, "launch", lambda *a, **k: launched.append(k.get("merge_into")))
    split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, nsplit=3, cfg=cfg,
                                topk_len=None, attn_sink=None)
    assert launched == [None, 1]                                 # split launch without merge_into, then the combine


@pytest.mark.parametrize("merge", ["fused", "coop"])
def test_in_launch_merge_with_one_head(merge):
    # H=1 (one head block of 16 rows, 15 masked): the barrier words must still fit the workspace
    from dsv4lab import reference
    from dsv4lab.kernels import head_batched, split_k
    inp = make_decode_inputs(2, 1, 53, context=200, pad_frac=0.2, topk_len=True, sink=True)
    cfg = head_batched.TileConfig(16, 16, 4, 1, "test", prefetch=2)
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, **inp.kwargs())
    with poisoned():
        out, lse = split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, nsplit=3,
                                               cfg=cfg, merge=merge, **inp.kwargs())
    assert rel_err(out.float(), ro) <= OUT_TOL and rel_err(lse, rl) <= LSE_TOL
    with pytest.raises(ValueError, match="merge_into.*int32 counters of >= 2 x 2"):
        head_batched.launch(inp.q, inp.cache, inp.indices, None, 512**-0.5, None,
                            *split_k.workspace(2, 1, 3, inp.q.device)[:2], nsplit=3, cfg=cfg,
                            merge_into=(out, lse, torch.zeros(3, dtype=torch.int32)), merge=merge)


@pytest.mark.parametrize("merge", ["fused", "launch", "coop"])
def test_bf16_partials(merge, monkeypatch):
    # split-K with bf16 partial outputs (half the workspace bytes): one more rounding, same bound
    from dsv4lab import reference
    from dsv4lab.kernels import head_batched, split_k
    inp = make_decode_inputs(2, 16, 70, context=300, pad_frac=0.2, topk_len=True, sink=True)
    cfg = head_batched.TileConfig(16, 16, 4, 1, "test", prefetch=2)
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, **inp.kwargs())
    monkeypatch.setattr(split_k, "_WORKSPACE", {})
    with poisoned():
        out, lse = split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, nsplit=3,
                                               cfg=cfg, merge=merge, partials=torch.bfloat16, **inp.kwargs())
    assert _only_workspace(split_k) == torch.bfloat16
    assert rel_err(out.float(), ro) <= OUT_TOL
    assert rel_err(lse, rl) <= LSE_TOL


@pytest.mark.parametrize("heads,num_warps", [(1, 4), (4, 2), (16, 8)])
def test_combine_launch_shapes(heads, num_warps):
    # the combine launch with several heads per program: the same merge (common.merge_partials)
    from dsv4lab import reference
    from dsv4lab.kernels import head_batched, split_k
    inp = make_decode_inputs(2, 12, 70, context=300, pad_frac=0.2, topk_len=True, sink=True)
    inp.topk_len[1] = 0                                          # a row with no token at all
    cfg = head_batched.TileConfig(16, 16, 4, 1, "test", prefetch=2)
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, **inp.kwargs())
    o_part, lse_part, _ = split_k.workspace(2, 12, 3, inp.q.device)
    for buf in (o_part, lse_part):                               # poisoned: every element must be written
        buf.fill_(float("nan"))
    out = torch.full((2, 12, 512), float("nan"), device=inp.q.device)
    lse = torch.full((2, 12), float("nan"), device=inp.q.device)
    head_batched.launch(inp.q, inp.cache, inp.indices, inp.topk_len, 512**-0.5, None, o_part, lse_part,
                        nsplit=3, cfg=cfg)
    split_k.combine(o_part, lse_part, inp.attn_sink, out, lse, heads=heads, num_warps=num_warps)
    assert rel_err(out, ro) <= OUT_TOL
    assert rel_err(lse, rl) <= LSE_TOL


def test_combine_warps_keep_a_slice_row_in_one_thread_group():
    # Triton loads 16 bytes a thread: 4 warps x 32 x 4 fp32 = 512 = one partial row, and for
    # bf16 that takes 2 warps; more warps would spread the slices over warps (a cross-warp sum)
    from dsv4lab.kernels import split_k
    for dt in (torch.float32, torch.bfloat16):
        w = split_k.combine_warps(dt)
        assert w * 32 * (16 // dt.itemsize) == 512, (dt, w)


def test_partials_default_is_fp32_in_the_interpreter(monkeypatch):
    # the interpreter truncates fp32->bf16 casts, so its split-K keeps fp32 partials
    from dsv4lab.device import is_interpret
    from dsv4lab.kernels import split_k
    if not is_interpret():
        assert split_k.partials_dtype() == getattr(torch, split_k.PARTIALS)
    else:
        assert split_k.partials_dtype() == torch.float32
    inp = make_decode_inputs(1, 16, 40, context=100)
    cfg = split_k.head_batched.TileConfig(16, 16, 4, 1, "test")
    monkeypatch.setattr(split_k, "_WORKSPACE", {})
    split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, topk_len=None, sm_scale=512**-0.5, attn_sink=None,
                                nsplit=2, cfg=cfg)
    assert _only_workspace(split_k) == split_k.partials_dtype()


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
