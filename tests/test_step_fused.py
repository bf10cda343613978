"""S5's fused step kernels (kernels/step/), each against its float64 judge or against the torch glue S4
runs, with outputs poisoned (NaN) before the run, odd sizes (a hidden size that is no multiple of the
tiles, one and three rows), strided inputs; then S5's step against S4's on one path
(dsv4lab.step_compare) and its tolerance shown to catch a broken kernel. On a GPU, S5's captured step
replays bitwise equal to its eager step.

Tolerances: bf16 outputs rounded once carry <= 2^-9 relative error per element, so a kernel that rounds
once is held to 4e-3 (rel_err over the tensor) against float64; float32 outputs to 1e-5 (their sums'
order); the cache bytes and the router's choice exactly.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from dsv4lab import step_fused, step_glue
from dsv4lab.kernels.step import reference as R
from dsv4lab.kernels.step.attn_input import attn_input
from dsv4lab.kernels.step.cache_ids import cache_ids
from dsv4lab.kernels.step.decode_epilogue import decode_epilogue
from dsv4lab.kernels.step.mhc_fused import mhc_head_pre, mhc_post, mhc_pre
from dsv4lab.kernels.step.moe_fused import MAX_UP_SPLIT, moe_combine, moe_down, moe_launch, moe_up, silu_mul
from dsv4lab.kernels.step.norm_rope import norm_rope, norm_rope_new
from dsv4lab.kernels.step.router import route
from dsv4lab.merged_decode import apply_sink, merge_by_lse, sparse_decode_per_cache
from dsv4lab.model import CPU_MODEL, Model
from dsv4lab.step_compare import compare_stages, tolerance
from dsv4lab.testing import make_merged_decode_inputs, poisoned, rel_err

BF16_ONCE = 4e-3
F32 = 1e-5


def _bf(*shape, dev, scale=1.0):
    return (torch.randn(*shape, device=dev) * scale).to(torch.bfloat16)


def _rope_tables(B, half, dev):
    ang = torch.rand(B, half, device=dev) * 6.0
    return ang.cos(), ang.sin()


@pytest.mark.parametrize("B,n,D", [(1, 4, 256), (3, 4, 200), (2, 2, 96)])
def test_mhc_pre_matches_float64(B, n, D, dev):
    h = _bf(B, n, D, dev=dev)
    mix = (2 + n) * n
    fn = _bf(mix, n * D, dev=dev, scale=(n * D) ** -0.5)
    scale, base = torch.rand(3, device=dev) + 0.5, torch.randn(mix, device=dev) * 0.5
    w = _bf(D, dev=dev) + 1
    with poisoned():
        y, post, comb = mhc_pre(h, fn, scale, base, w, 20, 1e-6, 1e-6)
    x = h.double().flatten(1)
    mixes = (x @ fn.double().T) * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    pre_r, post_r, comb_r = R.mhc_sinkhorn_float64(mixes, scale, base, n, 20, 1e-6)
    yr = (pre_r.unsqueeze(-1) * h.double()).sum(1)
    yr = yr * torch.rsqrt(yr.square().mean(-1, keepdim=True) + 1e-6) * w.double()
    assert rel_err(y.float(), yr) < BF16_ONCE and y.dtype == torch.bfloat16
    assert rel_err(post, post_r) < F32 and rel_err(comb, comb_r) < F32


def test_mhc_head_pre_matches_float64(dev):
    B, n, D = 3, 4, 200
    h, fn = _bf(B, n, D, dev=dev), _bf(n, n * D, dev=dev, scale=(n * D) ** -0.5)
    scale, base, w = torch.ones(1, device=dev) * 0.7, torch.randn(n, device=dev), _bf(D, dev=dev) + 1
    with poisoned():
        y = mhc_head_pre(h, fn, scale, base, w, 1e-6, 1e-6)
    x = h.double().flatten(1)
    mixes = (x @ fn.double().T) * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    pre = torch.sigmoid(mixes * 0.7 + base.double()) + 1e-6
    yr = (pre.unsqueeze(-1) * h.double()).sum(1)
    yr = yr * torch.rsqrt(yr.square().mean(-1, keepdim=True) + 1e-6) * w.double()
    assert rel_err(y.float(), yr) < BF16_ONCE


@pytest.mark.parametrize("B,D", [(1, 256), (3, 300)])
def test_mhc_post_matches_float64(B, D, dev):
    n = 4
    h, o = _bf(B, n, D, dev=dev), _bf(B, D, dev=dev)
    post, comb = torch.rand(B, n, device=dev) * 2, torch.rand(B, n, n, device=dev)
    with poisoned():
        out = mhc_post(o, h, post, comb)
    ref = post.double().unsqueeze(-1) * o.double().unsqueeze(1) + (comb.double().unsqueeze(-1) * h.double().unsqueeze(2)).sum(1)
    assert rel_err(out.float(), ref) < BF16_ONCE


def _norm_rope64(x, w, cos, sin, norm, inverse, eps=1e-6):
    x = x.double()
    if norm:
        x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        if w is not None:
            x = x * w.double()
    if cos is None:
        return x
    half = cos.shape[1]
    c, s = cos.double()[:, None, :], sin.double()[:, None, :] * (-1 if inverse else 1)
    r = x[..., -2 * half:].unflatten(-1, (-1, 2))
    rot = torch.stack([r[..., 0] * c - r[..., 1] * s, r[..., 0] * s + r[..., 1] * c], -1).flatten(-2)
    return torch.cat([x[..., :-2 * half], rot], -1)


@pytest.mark.parametrize("norm,weight,inverse,rope", [(True, False, False, 64), (False, False, True, 64),
                                                      (True, True, False, 0), (False, False, False, 32)])
def test_norm_rope_matches_float64(norm, weight, inverse, rope, dev):
    B, heads, width = 3, 5, 96 if rope != 64 else 512
    big = _bf(B, heads + 2, width + 64, dev=dev)
    x = big[:, 1:1 + heads, 32:32 + width]                       # strided rows
    w = _bf(width, dev=dev) + 1 if weight else None
    cos, sin = _rope_tables(B, rope // 2, dev) if rope else (None, None)
    dst = torch.full((B, heads + 3, width), float("nan"), dtype=torch.bfloat16, device=dev)
    out = norm_rope(x, dst[:, 2:2 + heads], cos=cos, sin=sin, weight=w, norm=norm, inverse=inverse)
    ref = _norm_rope64(x, w, cos, sin, norm, inverse)
    assert rel_err(out.float(), ref) < BF16_ONCE
    assert dst[:, :2].isnan().all() and dst[:, 2 + heads:].isnan().all()          # nothing outside the slice
    with poisoned():
        assert rel_err(norm_rope_new(x, cos=cos, sin=sin, weight=w, norm=norm, inverse=inverse).float(), ref) < BF16_ONCE


@pytest.mark.parametrize("ratio", [0, 4, 128])
def test_attn_input_equals_the_torch_glue(ratio, dev):
    """Bitwise: the window cache's bytes, the q LoRA norm, the rings and the indexer weights as S4's ops give them."""
    m = Model(CPU_MODEL, device=dev)
    cfg = m.cfg
    i = m.ratios.index(ratio)
    lw, c = m.weights[i], m.caches[i]
    inp = m.inputs(2)
    p = F.linear(_bf(2, cfg.hidden, dev=dev), lw.w_y)
    base = cfg.compress_rope_theta if ratio else cfg.rope_theta
    cos, sin = inp.cos[base], inp.sin[base]
    ring = inp.ring_pos[cfg.ring_c4 if ratio == 4 else cfg.ring_c128]
    q0 = cfg.q_lora_rank
    kv = step_glue.rope(step_glue.rms_norm(p[:, q0:q0 + 512], lw.kv_norm, cfg.rms_eps), cos, sin)
    data, scales = step_glue.kv_cache_bytes(kv)
    buf = c.window.buffer.view(-1)
    state = None if c.state is None else torch.full_like(c.state, float("nan"))
    istate = None if c.index_state is None else torch.full_like(c.index_state, float("nan"))
    with poisoned():
        ql, w = attn_input(p, lw.q_norm, lw.kv_norm, cos, sin, buf, inp.window_data_off, inp.window_scale_off,
                           q_lora=q0, eps=cfg.rms_eps, state=state, ring=ring if ratio else None,
                           index_state=istate, index_ring=ring if ratio == 4 else None,
                           index_heads=cfg.index_heads if ratio == 4 else 0, index_scale=0.25)
    assert torch.equal(buf[inp.window_data_off], data) and torch.equal(buf[inp.window_scale_off], scales)
    assert torch.equal(ql, step_glue.rms_norm(p[:, :q0], lw.q_norm, cfg.rms_eps))
    col = q0 + 512
    if ratio:
        b = torch.arange(2, device=dev)
        width = state.shape[2]
        assert torch.equal(state[b, ring], p[:, col:col + width].float())
        col += width
    if ratio == 4:
        assert torch.equal(w, p[:, col:col + cfg.index_heads].float() * 0.25)
        col += cfg.index_heads
        assert torch.equal(istate[b, ring], p[:, col:].float())


def test_decode_epilogue_matches_the_merge_sink_and_inverse_rope(dev):
    """Against merged_decode's merge and sink in float64, then the inverse rope; rows with no token in
    one cache, in both, and a NaN row."""
    B, H, heads = 4, 8, 3
    o1, o2 = _bf(B, H, 512, dev=dev), _bf(B, H, 512, dev=dev)
    l1, l2 = torch.randn(B, H, device=dev) * 3, torch.randn(B, H, device=dev) * 3
    l1[0, :] = -math.inf                                   # row 0: the window cache empty
    l1[1, 1] = l2[1, 1] = -math.inf                        # row 1 head 1: no token anywhere
    l2[2, 2] = float("nan")                                # row 2 head 2: a part that could not be computed
    sink = torch.randn(H, device=dev)
    cos, sin = _rope_tables(B, 32, dev)
    with poisoned():
        out = decode_epilogue([(o1, l1), (o2, l2)], sink, cos, sin, heads)
        one = decode_epilogue([(o1[1:], l2[1:])], None, cos[1:], sin[1:], heads)
    o, lse = merge_by_lse(o1.double(), l1.double(), o2.double(), l2.double())
    o, _ = apply_sink(o, lse, sink.double())
    ref = _norm_rope64(o[:, :heads], None, cos, sin, False, True)
    assert torch.isnan(out[2, 2]).all() and torch.isnan(ref[2, 2]).all()
    ok = torch.ones(B, heads, dtype=torch.bool)
    ok[2, 2] = False
    assert rel_err(out[ok].float(), ref[ok]) < BF16_ONCE
    assert (out[1, 1] == 0).all()
    assert rel_err(one.float(), _norm_rope64(o1[1:, :heads], None, cos[1:], sin[1:], False, True)) < BF16_ONCE


@pytest.mark.parametrize("E,k", [(16, 2), (256, 6), (20, 3)])
def test_router_matches_the_torch_glue(E, k, dev):
    B = 5
    logits = _bf(B, E + 7, dev=dev, scale=2.0)[:, 3:3 + E]            # strided rows, as S5's concatenated GEMM
    bias = torch.randn(E, device=dev) * 0.01
    with poisoned():
        ids, w = route(logits, bias, k, 1.5)
    ids_r, w_r = step_glue.route(logits.float(), bias, k, 1.5)
    assert torch.equal(ids, ids_r) and rel_err(w, w_r) < F32
    fixed = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(B)])
    ids_f, w_f = route(logits, bias, k, 1.5, ids=fixed)
    assert torch.equal(ids_f, fixed) and rel_err(w_f, step_glue.route(logits.float(), bias, k, 1.5, ids=fixed)[1]) < F32


@pytest.mark.parametrize("K,up_n,split,down_n", [(96, 32, 1, 64), (300, 16, 3, 16), (300, 64, 2, 32)])
def test_moe_kernels_match_float64(K, up_n, split, down_n, dev):
    B, I, D, E, M = 3, 40, 72, 5, 3
    x = _bf(B, K, dev=dev)
    # the dispatch tables strided, as the step builds them (a transposed view): rows m of expert e apart
    tok = torch.randint(0, B, (M, E), device=dev).t()
    col = torch.randint(0, 2, (M, E), device=dev).t()
    valid = (torch.rand(M, E, device=dev) > 0.3).float().t()
    w13, w2 = _bf(E + 1, K, 2 * I, dev=dev, scale=K ** -0.5), _bf(E + 1, I, D, dev=dev, scale=I ** -0.5)
    topw = torch.rand(B, 2, device=dev)
    with poisoned():
        hmid = moe_up(x, tok, w13, block_n=up_n, split=split)
        yd = moe_down(hmid, w2, topw, tok, col, valid, block_n=down_n)
    a = torch.einsum("emk,ekn->emn", x[tok].double(), w13[:E].double())
    ref_h = F.silu(a[..., :I]) * a[..., I:]
    assert rel_err(hmid.float(), ref_h) < BF16_ONCE
    ref_y = R.moe_grouped_gemm_float64(hmid, w2) * (topw[tok, col] * valid).double().unsqueeze(-1)
    assert rel_err(yd, ref_y) < F32
    rows = torch.full((B, E * M), -1, dtype=torch.int64, device=dev)
    for b in range(B):
        mine = (tok.flatten() == b).nonzero().flatten()
        rows[b, :mine.numel()] = mine
    shared = _bf(B, D, dev=dev)
    with poisoned():
        out = moe_combine(yd, rows, shared)
    ref = torch.zeros(B, D, dtype=torch.float64, device=dev).index_add_(0, tok.flatten(), yd.flatten(0, 1).double())
    assert rel_err(out.float(), ref + shared.double()) < BF16_ONCE
    g = _bf(B, 2 * I, dev=dev)
    with poisoned():
        s = silu_mul(g)
    assert rel_err(s.float(), F.silu(g[:, :I].double()) * g[:, I:].double()) < BF16_ONCE


def test_moe_launch_options_are_checked(dev):
    x, tok, w13 = _bf(2, 64, dev=dev), torch.zeros(1, 2, dtype=torch.int64, device=dev), _bf(1, 64, 32, dev=dev)
    with pytest.raises(ValueError, match="block_n a power of two"):
        moe_up(x, tok, w13, block_n=24)
    with pytest.raises(ValueError, match="split must be >= 1"):
        moe_up(x, tok, w13, split=0)


@given(E=st.integers(1, 64), I=st.integers(1, 4096), D=st.integers(1, 8192), sms=st.integers(1, 256))
def test_moe_launch_picks_valid_shapes_that_fill_at_most_the_chip_when_split(E, I, D, sms):
    up_n, split, down_n = moe_launch(E, I, D, sms)
    assert up_n in (64, 128) and down_n in (64, 128) and split in (1, 2, 4, MAX_UP_SPLIT)
    assert split == 1 or split * E * -(-I // up_n) <= sms          # K is split only while the programs fit


def test_cache_ids_follow_the_page_table(dev):
    B, K, rows = 3, 37, 16
    pt = torch.randperm(40, device=dev)[:B * 5].view(B, 5).to(torch.int32)
    top = torch.randint(-1, 5 * rows, (B, K), device=dev, dtype=torch.int32)
    with poisoned():
        ids = cache_ids(top, pt, rows)
    safe = top.clamp(min=0).long()
    ref = pt.long().gather(1, safe // rows) * rows + safe % rows
    assert torch.equal(ids, torch.where(top >= 0, ref, -1).to(torch.int32))


# --- S5's step against S4's --------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return Model(CPU_MODEL)


@pytest.fixture(scope="module")
def wide_model():
    from dataclasses import replace as _replace
    return Model(_replace(CPU_MODEL, max_batch=8))


@pytest.mark.parametrize("B", [1, 2, 8])
def test_s5_step_equals_s4_within_the_rounding_bound(model, wide_model, B):
    """B = 8 on a config that serves 8: several stand-in rows per expert (the dispatch's second row)."""
    model = wide_model if B > model.cfg.max_batch else model
    r = compare_stages(model, B)
    assert r["finite"] and r["rel_err"] < r["tolerance"] == tolerance(model.cfg.num_layers)
    assert r["choices_fixed"] == {"indexer": model.ratios.count(4), "route": model.cfg.num_layers}


def test_the_bound_catches_a_broken_kernel(model, monkeypatch):
    """The tolerance is no formality: the inverse rope left out of the decode epilogue (one wrong flag)
    moves the logits past it."""
    from dsv4lab.kernels.step import decode_epilogue as DE
    real = DE._decode_epilogue_kernel

    def no_inverse(parts, sink, cos, sin, heads):
        return DE.decode_epilogue(parts, sink, cos, -sin, heads)        # rotates forward, not back
    monkeypatch.setattr(step_fused, "decode_epilogue", no_inverse)
    r = compare_stages(model, 2)
    assert real is DE._decode_epilogue_kernel and r["rel_err"] > 3 * r["tolerance"]


@pytest.fixture
def fusions_restored(model):
    yield model
    model.fusions = step_fused.FUSIONS


@pytest.mark.parametrize("off", step_fused.FUSIONS)
def test_each_fusion_off_still_agrees_with_s4(fusions_restored, off):
    """One fusion switched off runs S4's torch ops for that part inside S5's step: still S4's step
    within the rounding bound (the parts meet: a fused part beside an S4 one)."""
    model = fusions_restored
    model.fusions = set(step_fused.FUSIONS) - {off}
    r = compare_stages(model, 2)
    assert r["finite"] and r["rel_err"] < r["tolerance"]


def test_every_fusion_off_is_s4_bit_for_bit(fusions_restored):
    """With no fusion on, S5's step runs S4's ops in S4's order: the same logits, bit for bit (in the
    interpreter; on a GPU the MoE sum's index_add_ adds in atomics' order, which varies run to run)."""
    model = fusions_restored
    model.fusions = ()
    r = compare_stages(model, 2)
    assert r["finite"] and (r["rel_err"] == 0.0 if model.device.type == "cpu" else r["rel_err"] < 1e-3)


def test_an_unknown_fusion_is_refused(model):
    with pytest.raises(ValueError, match=r"unknown fusion\(s\) \['mhc_pre'\].*must be among"):
        model.fusions = {"mhc", "mhc_pre"}
    with pytest.raises(TypeError, match="a set of names"):
        model.fusions = "mhc"
    assert model.fusions == frozenset(step_fused.FUSIONS)


@pytest.mark.gpu
def test_s5_graph_replay_is_bitwise_the_eager_step():
    from dataclasses import replace as _replace

    from dsv4lab import bench
    from dsv4lab.model import DSV4_FLASH_TP8
    from dsv4lab.stages import stage
    m = Model(_replace(DSV4_FLASH_TP8, layers_window=1, layers_c4=1, layers_c128=1, max_batch=4))
    s5 = stage("S5")
    for B in (1, 3):
        inp = m.inputs(B)
        m.check(inp)
        g, out = bench.capture(lambda: m.step(inp, s5))
        g.replay()
        torch.cuda.synchronize()
        replayed = out.clone()
        assert torch.equal(replayed, m.step(inp, s5)) and torch.isfinite(replayed).all()


def test_the_step_checks_its_sinks_once_outside_the_graph():
    """S5 checks no sink inside the step (a weight, not an input): Model.check refuses a non-finite one."""
    m = Model(CPU_MODEL)
    inp = m.inputs(1)
    m.check(inp)
    m.weights[0].attn_sink[1] = float("nan")
    with pytest.raises(ValueError, match=r"attn_sink\[1\]"):
        m.check(inp)


def test_per_cache_decode_refuses_a_sink_it_would_not_apply():
    args = list(make_merged_decode_inputs(2, 4, 16, window_context=40, sink=True).sglang_args())
    assert args[4] is not None                       # the sink, which the per-cache outputs leave out
    with pytest.raises(ValueError, match="attn_sink must be None here"):
        sparse_decode_per_cache(*args, impl="mma")
    args[4] = None
    assert len(sparse_decode_per_cache(*args, impl="mma")) == 1
