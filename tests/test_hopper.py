"""impl "hopper", the Gluon kernel for sm_90: on CPU it refuses with a reason and auto never reaches it;
where it can run, auto picks it by shape (kernels/auto.py); on the GPU (``pytest -m gpu``) it is judged like every other kernel (float64 reference, poisoned
outputs, odd shapes, determinism, graph replay)."""
import math
from dataclasses import replace

import pytest
import torch

import dsv4lab
from dsv4lab import api, bench, checks
from dsv4lab.device import mode
from dsv4lab.kernels.decode import auto, hopper, split_k
from dsv4lab.testing import LSE_TOL, OUT_TOL, check_decode, make_decode_inputs, poisoned, probe
from dsv4lab import registry


def test_registered_with_what_it_needs():
    entry = registry.impl_info("sparse_decode", "hopper")
    assert set(entry.needs) == {"gpu", "sm_90"}
    assert entry.max_scale_byte(1, 64, 512) == 134           # the "bits" dequant's limit, checked by the API


@pytest.mark.skipif(mode() == "cuda", reason="the refusal is for processes without a GPU")
def test_refuses_without_a_gpu_naming_what_it_needs():
    inp = make_decode_inputs(1, 4, 16, context=32, seed=0)
    with pytest.raises(ValueError, match=r"impl='hopper' needs a CUDA GPU with sm_90.*interpreter.*impl='auto'"):
        dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="hopper")
    assert "interpreter" in hopper.unavailable_reason()


@pytest.mark.skipif(mode() == "cuda", reason="the refusal is for processes without a GPU")
def test_probe_reports_what_the_child_process_said():
    got = probe("hopper", timeout_s=120)
    assert got["ok"] is False and "sm_90" in got["error"]


def test_bad_arguments_are_refused_before_the_kernel():
    inp = make_decode_inputs(1, 4, 16, context=32, seed=0)
    with pytest.raises(ValueError, match="q must have shape"):
        dsv4lab.sparse_decode(inp.q[..., :256], inp.cache, inp.indices, impl="hopper")


def test_auto_never_dispatches_to_hopper_where_it_cannot_run(monkeypatch):
    """auto over its whole range of plans in this process (no sm_90 GPU here), with the hopper impl
    and launcher replaced by a tripwire."""
    if auto.hopper_here():
        pytest.skip("this process runs the Hopper kernel")
    def tripwire(*a, **k):
        raise AssertionError("auto reached the hopper kernel")
    table = registry._IMPLS["sparse_decode"]
    monkeypatch.setitem(table, "hopper", replace(table["hopper"], fn=tripwire))
    monkeypatch.setattr(hopper, "launch", tripwire)
    monkeypatch.setattr(hopper, "sparse_decode_hopper", tripwire)
    for B in (1, 3, 8):
        inp = make_decode_inputs(B, 64 if B == 8 else 8, 40, context=64, topk_len=True, sink=True, seed=B)
        e_out, e_lse = check_decode("auto", inp)
        assert e_out <= OUT_TOL and e_lse <= LSE_TOL


@pytest.mark.parametrize("B,H,K,want", [(1, 64, 512, "splitk_auto"), (7, 64, 512, "splitk_auto"),
                                        (8, 64, 512, "hopper"), (128, 64, 512, "hopper"), (4, 128, 512, "hopper"),
                                        (3, 128, 512, "splitk_auto"), (64, 32, 512, "splitk_auto"),
                                        (8, 65, 512, "hopper"), (8, 64, 2048, "hopper"),
                                        (8, 64, 128, "splitk_auto"), (32, 64, 128, "splitk_auto"),
                                        (63, 64, 256, "splitk_auto"), (64, 64, 128, "hopper"),
                                        (32, 128, 128, "hopper"), (128, 64, 127, "splitk_auto")])
def test_auto_rule_on_an_sm90_gpu(B, H, K, want):
    """Where the Hopper kernel measured ahead: from 8 programs of 64 heads at K >= 512, from 64 for
    128 <= K < 512 (at K = 128 it lost up to B = 32); never below K = 128 or 64 heads."""
    assert auto.on_hopper(B, H, K) == want
    assert auto.on_hopper(B, H) == auto.on_hopper(B, H, 512)


def test_auto_runs_what_its_rule_picks(monkeypatch):
    """With the Hopper kernel declared runnable, auto hands it exactly the shapes its rule picks,
    with the checked arguments, and splitk_auto the rest; the scale-byte limit follows the pick."""
    calls = []
    def fake_hopper(q, cache, indices, **kw):
        calls.append((q.shape[0], sorted(kw)))
        return split_k.sparse_decode_splitk_auto(q, cache, indices, **kw)
    monkeypatch.setattr(auto, "hopper_here", lambda: True)
    auto.picks_hopper.cache_clear()
    monkeypatch.setattr(hopper, "sparse_decode_hopper", fake_hopper)
    try:
        for B, K in ((7, 512), (8, 512), (8, 128)):
            inp = make_decode_inputs(B, 64, K, context=K + 64, topk_len=True, sink=True, seed=B)
            e_out, e_lse = check_decode("auto", inp)
            assert e_out <= OUT_TOL and e_lse <= LSE_TOL
        assert calls == [(8, ["attn_sink", "sm_scale", "topk_len"])]          # only B = 8 at K = 512
        info = registry.impl_info("sparse_decode", "auto")
        assert info.max_scale_byte(8, 64, 512) == hopper.MAX_SCALE_BYTE
        assert info.max_scale_byte(7, 64, 512) == registry.impl_info("sparse_decode", "splitk_auto").max_scale_byte(7, 64, 512)
    finally:
        auto.picks_hopper.cache_clear()


@pytest.mark.parametrize("B,K,want", [(1, 512, 8), (16, 512, 8), (32, 512, 4), (64, 512, 2), (128, 512, 1),
                                      (200, 512, 1), (1, 37, 1), (1, 4096, 16)])
def test_nsplit_covers_the_sms_once(B, K, want):
    """Shapes only: programs x NSPLIT <= SMs (one ~200 KB program per SM), no slice shorter than a
    tile, at most planning.MAX_SPLIT slices."""
    n = hopper.nsplit_for(B, 64, K, 132)
    assert n == want
    assert B * n <= max(132, B) and (n - 1) * hopper.BLOCK_N < K


def test_pdl_where_the_split_grid_leaves_half_the_sms_idle(monkeypatch):
    from dsv4lab.kernels.decode import planning
    monkeypatch.setattr(planning, "pdl_supported", lambda: True)
    assert hopper.pdl_for(1, 64, 8, 132) and hopper.pdl_for(8, 64, 8, 132)
    assert not hopper.pdl_for(16, 64, 8, 132) and not hopper.pdl_for(1, 64, 1, 132)
    monkeypatch.setattr(planning, "pdl_supported", lambda: False)
    assert not hopper.pdl_for(1, 64, 8, 132)


# --- GPU: the kernel itself -------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs_at_all():
    """One small decode in a child process first (testing.probe): if the kernel hangs or faults,
    every test here fails at once instead of hanging the GPU test run."""
    got = probe("hopper")
    if "error" in got:
        pytest.fail(f"impl 'hopper' did not run: {got['error']}")
    return got


@pytest.mark.gpu
def test_probe_matches_reference(runs_at_all):
    assert runs_at_all["ok"], runs_at_all


@pytest.mark.gpu
@pytest.mark.parametrize("case", checks.CHECK_CASES, ids=str)
def test_matches_reference_on_the_gpu(case, runs_at_all):
    B, H, K, ctx, ps, pad, tl_, sink = case
    inp = make_decode_inputs(B, H, K, context=ctx, page_size=ps, pad_frac=pad, topk_len=tl_, sink=sink, seed=11)
    e_out, e_lse = check_decode("hopper", inp)
    assert e_out <= OUT_TOL and e_lse <= LSE_TOL, (e_out, e_lse)


@pytest.mark.gpu
def test_empty_rows_on_the_gpu(dev, runs_at_all):
    inp = make_decode_inputs(3, 64, 100, context=200, seed=5)
    inp.indices[1] = -1
    topk_len = torch.tensor([0, 100, 7], dtype=torch.int32, device=dev)
    with poisoned():
        out, lse = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="hopper", topk_len=topk_len)
    assert not torch.isnan(out).any() and (out[:2] == 0).all() and (lse[:2] == -math.inf).all()


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 136])              # split + merge, split, whole rows in two waves
def test_bitwise_over_reruns_and_graph_replay(B, runs_at_all):
    inp = make_decode_inputs(B, 64, 512, context=1024, topk_len=True, sink=True, seed=7)
    fn = lambda: dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="hopper", checks="device",  # noqa: E731
                                       **inp.kwargs())
    first = fn()
    for _ in range(19):
        o, l = fn()
        assert torch.equal(o, first[0]) and torch.equal(l, first[1])
    g, res = bench.capture(fn)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(res[0], first[0]) and torch.equal(res[1], first[1])


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 32])
def test_auto_on_the_gpu(B, runs_at_all, monkeypatch):
    """auto on this GPU: the Hopper kernel from B = 8 on sm_90, split-K below (the kernel it ran,
    seen by a spy), judged against the float64 reference either way."""
    ran = []
    real = hopper.sparse_decode_hopper
    monkeypatch.setattr(hopper, "sparse_decode_hopper", lambda *a, **k: ran.append(B) or real(*a, **k))
    inp = make_decode_inputs(B, 64, 512, context=1024, topk_len=True, sink=True, pad_frac=0.1, seed=B)
    e_out, e_lse = check_decode("auto", inp)
    assert e_out <= OUT_TOL and e_lse <= LSE_TOL, (e_out, e_lse)
    assert bool(ran) == (B >= 8)          # runs_at_all: this GPU runs the Hopper kernel


def test_bytes_served_count_the_heads_of_the_kernel_auto_runs(monkeypatch):
    """bench's bytes served per call: auto reads as the kernel it runs (64 heads a gather for hopper)."""
    heads = lambda impl, H, B: registry.impl_info("sparse_decode", impl).heads_per_read(B, H, 512)  # noqa: E731
    assert heads("hopper", 64, 8) == 64 and heads("hopper", 16, 8) == 16
    assert heads("auto", 64, 1) == heads("splitk_auto", 64, 1)
    monkeypatch.setattr(auto, "hopper_here", lambda: True)
    auto.picks_hopper.cache_clear()
    try:
        assert heads("auto", 64, 8) == 64
    finally:
        auto.picks_hopper.cache_clear()
