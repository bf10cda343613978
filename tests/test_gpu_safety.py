"""On the GPU (the recorded run: pytest -m gpu; skipped with a reason elsewhere): every graph-safe impl
of every op is bitwise the same over 20 reruns and between eager calls and CUDA-graph replay, issues
no host sync when called eagerly in the default checks="device" mode nor while it is captured
(torch.cuda.set_sync_debug_mode("error")), and the error word is set on purpose, eagerly and from a
replayed graph, with the answers the device-mode contract gives (the "bits" dequant's NaN included)."""
import contextlib
import math

import pytest
import torch

import dsv4lab
from dsv4lab import api, errors, reference
from dsv4lab.cache import scale_view
from dsv4lab.errors import Flag
from dsv4lab.testing import (LSE_TOL, OUT_TOL, make_decode_inputs, make_indexer_inputs, make_merged_decode_inputs,
                             rel_err)
from dsv4lab import registry

pytestmark = pytest.mark.gpu

GPU = dsv4lab.device.mode() == "cuda"


def _available(op, impl) -> bool:
    if "sglang" not in registry.impl_info(op, impl).needs:
        return True
    from dsv4lab.kernels.decode import sglang_peer
    from dsv4lab.kernels.indexer import fallback
    try:
        sglang_peer.module() if op == "sparse_decode" else fallback.sglang_function()
    except ImportError:
        return False
    return True


def _graph_safe(op):
    """The impls of ``op`` that capture in a CUDA graph (and whose code this machine has)."""
    if not GPU:
        return ["-"]
    return [i for i in dsv4lab.impls(op) if registry.impl_info(op, i).graph_safe and _available(op, i)]


@contextlib.contextmanager
def no_sync():
    """Any synchronizing CUDA call inside the block raises (torch's sync debug mode)."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _capture(fn):
    """(graph, result): fn run once eagerly (compiles), once more eagerly with syncs forbidden, then
    captured with syncs forbidden."""
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), no_sync():
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with no_sync(), torch.cuda.graph(g):
        res = fn()
    torch.cuda.synchronize()
    return g, res


def _bitwise(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _same_20_times_and_in_a_graph(fn):
    first = fn()
    for _ in range(19):
        assert _bitwise(fn(), first), "reruns differ"
    g, res = _capture(fn)
    g.replay()
    torch.cuda.synchronize()
    assert _bitwise(res, first), "graph replay differs from the eager call"


@pytest.mark.parametrize("impl", _graph_safe("sparse_decode"))
@pytest.mark.parametrize("B", [1, 32, 136])
def test_decode_bitwise_reruns_graph_and_no_sync(impl, B):
    inp = make_decode_inputs(B, 64, 512, context=1024, pad_frac=0.05, topk_len=True, sink=True, seed=B)
    _same_20_times_and_in_a_graph(lambda: dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl,
                                                                **inp.kwargs()))
    dsv4lab.check_errors()


@pytest.mark.parametrize("impl", _graph_safe("sparse_decode"))
def test_merged_decode_bitwise_and_no_sync(impl):
    inp = make_merged_decode_inputs(8, 64, 128, 512, window_context=256, compressed_context=2048, topk_len=True,
                                    sink=True, seed=5)
    args = inp.sglang_args()
    _same_20_times_and_in_a_graph(lambda: dsv4lab.flash_mla_sparse_decode(*args, impl=impl, checks="device"))
    dsv4lab.check_errors()


@pytest.mark.parametrize("op", ["indexer_logits", "indexer_topk"])
@pytest.mark.parametrize("impl", _graph_safe("indexer_logits"))
def test_indexer_bitwise_reruns_graph_and_no_sync(op, impl):
    inp = make_indexer_inputs(8, 64, 8192, seed=3)
    kw = dict(topk=512) if op == "indexer_topk" else {}
    fn = getattr(dsv4lab, op)
    _same_20_times_and_in_a_graph(lambda: fn(*inp.args(), max_seq_len=inp.max_seq_len, impl=impl, **kw))
    dsv4lab.check_errors()


@pytest.mark.parametrize("impl", _graph_safe("sparse_decode"))
def test_decode_error_word_eager_and_replayed(impl):
    """Bad values on purpose: eagerly, then written into the buffers of a graph captured on good data
    and replayed (the way a serving step feeds a graph); answers as the contract says, flags set."""
    inp = make_decode_inputs(4, 64, 512, context=1024, topk_len=True, sink=True, seed=11)
    inp.topk_len[0] = 512                                    # row 0 reads the entries made bad below
    n = inp.cache.num_tokens
    fn = lambda: dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs())  # noqa: E731
    errors.read()
    g, res = _capture(fn)
    assert errors.read() == Flag(0)
    good_idx, good_tl = inp.indices.clone(), inp.topk_len.clone()
    inp.indices[0, :5] = n + 7
    inp.topk_len[1] = 600
    inp.topk_len[2] = -1
    want_idx = torch.where(inp.indices < n, inp.indices, -1)
    want_tl = inp.topk_len.clamp(0, 512)
    for run in ("eager", "replay"):
        if run == "eager":
            out, lse = fn()
        else:
            g.replay()
            out, lse = res
        torch.cuda.synchronize()
        ro, rl = reference.sparse_decode(inp.q, inp.cache, want_idx, want_tl, None, inp.attn_sink)
        assert rel_err(out.float(), ro) <= OUT_TOL and rel_err(lse, rl) <= LSE_TOL, run
        assert errors.read() == Flag.INDEX | Flag.TOPK_LEN, run
    inp.indices.copy_(good_idx)
    inp.topk_len.copy_(good_tl)
    inp.attn_sink[3] = math.nan
    g.replay()
    torch.cuda.synchronize()
    assert torch.isnan(res[0][:, 3].float()).all() and errors.read() & Flag.SINK
    with pytest.raises(RuntimeError, match="outside CUDA-graph capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            dsv4lab.check_errors()


def test_bits_dequant_past_byte_134_is_nan_and_flagged():
    """The "bits" launch (64-head tiles, B = 136) reads a scale byte 140 as a NaN factor: the row that
    reads it is NaN, every other row right, and the output check flags it; checks="sync" names it."""
    from dsv4lab.kernels.decode import head_batched
    inp = make_decode_inputs(136, 64, 512, context=1024, seed=9)
    assert head_batched.max_scale_byte(head_batched.mma_launch(136, 64, 512)) is not None, "not a bits launch"
    tok = int(inp.indices[0, 0])
    ps = inp.cache.page_size
    scale_view(inp.cache)[tok // ps, tok % ps, 3] = 140
    errors.read()
    out, _ = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="mma")
    assert torch.isnan(out[0].float()).all() and torch.isfinite(out[1:].float()).all()
    assert errors.read() == Flag.NONFINITE
    with pytest.raises(ValueError, match="has 140 in nope group 3.*'bits' dequant"):
        dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="mma", checks="sync")


@pytest.mark.parametrize("impl", _graph_safe("indexer_logits"))
def test_indexer_error_word_replayed(impl):
    inp = make_indexer_inputs(4, 64, 4096, seq_lens=[4096, 1000, 64, 0], seed=12)
    fn = lambda: dsv4lab.indexer_logits(*inp.args(), max_seq_len=4096, impl=impl)  # noqa: E731
    errors.read()
    g, res = _capture(fn)
    inp.page_table[0, 3] = inp.cache.num_pages + 5           # a live page of request 0
    inp.seq_lens[1] = 5000                                   # past max_seq_len
    g.replay()
    torch.cuda.synchronize()
    assert errors.read() == Flag.PAGE | Flag.SEQ_LEN
    assert torch.isneginf(res[0, 3 * 64:]).all() and torch.isfinite(res[0, : 3 * 64]).all()
    # request 1: 4096 live tokens now, but its table holds -1 past its 16 pages: cut there
    assert torch.isfinite(res[1, :1024]).all() and torch.isneginf(res[1, 1024:]).all()
    assert torch.isfinite(res[2, :64]).all() and torch.isneginf(res[3]).all()


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU: the interpreter always takes Triton's launch path")
def test_direct_launch_equals_triton_launch_and_misaligned_takes_triton_path():
    """launch_kernel's direct path gives Triton's answers bitwise, and a q 2 bytes past a 16-byte
    boundary takes Triton's path (which specializes on 16-byte alignment), with the same answers."""
    from dsv4lab.kernels.decode import head_batched
    from dsv4lab.kernels import launch
    inp = make_decode_inputs(32, 64, 512, context=4096, seed=3)
    run = lambda q: dsv4lab.sparse_decode(q, inp.cache, inp.indices, impl="mma")  # noqa: E731
    with launch.triton_launches():
        want = run(inp.q)
    for _ in range(3):                                  # the first may compile; the rest go direct
        got = run(inp.q)
        assert all(torch.equal(a, b) for a, b in zip(want, got))
    import triton
    hits = [h for h in launch._LAUNCHES.values() if h[1] is head_batched._head_batched_kernel]
    # on a Triton whose wrapper was read, the C launch itself (not compiled.run) gave those answers
    c_launch = triton.__version__.startswith(launch.C_LAUNCH_TRITON)
    assert hits and all((h[4] is not h[2].run) == c_launch for h in hits)
    buf = torch.empty(inp.q.numel() + 1, dtype=inp.q.dtype, device=inp.q.device)
    q_odd = buf[1:].view(inp.q.shape)
    q_odd.copy_(inp.q)
    assert q_odd.data_ptr() % 16 != 0 and q_odd.is_contiguous()
    cached = lambda: sum(hit[1] is head_batched._head_batched_kernel for hit in launch._LAUNCHES.values())  # noqa: E731
    before = cached()
    assert before >= 1
    for _ in range(2):                                  # Triton's path, specialized for the misaligned q
        got = run(q_odd)
        assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert cached() == before                           # never cached for the direct path
    inp_i = make_indexer_inputs(4, 64, 4096, seq_lens=[1, 700, 4096, 2049], seed=5)
    step = lambda: dsv4lab.indexer_topk(*inp_i.args(), max_seq_len=4096, topk=512, impl="triton")  # noqa: E731
    with launch.triton_launches():
        want_i = step()
    for _ in range(3):
        assert torch.equal(step(), want_i)
    assert int(errors.read()) == 0


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("histogram", ["ballot", "shared"])
@pytest.mark.parametrize("split,merge", [(1, "launch"), (2, "launch"), (None, "launch"), (2, "fused"), (None, "fused"),
                                         (8, "fused")])
def test_topk_splits_on_the_gpu_are_the_contract_bitwise_and_graph_safe(split, merge, histogram):
    """Each top-k split on the GPU: the contract's positions on indexer logits of random lengths
    (empty, shorter than k, one tile, two tiles), bitwise over 20 reruns and in a replayed graph."""
    from dsv4lab.kernels.indexer.topk import TOPK, topk_triton
    from dataclasses import replace
    inp = make_indexer_inputs(32, 64, 16384, seq_lens=[0, 1, 511, 512, 513] + [8192] * 20 + [16384] * 7, seed=8)
    x = dsv4lab.indexer_logits(*inp.args(), max_seq_len=16384, impl="triton")
    launch = replace(TOPK, split=split, merge=merge, histogram=histogram)
    got = topk_triton(x, inp.seq_lens, 512, launch=launch)
    assert torch.equal(got.cpu(), reference.topk_positions(x.cpu(), 512))
    _same_20_times_and_in_a_graph(lambda: topk_triton(x, inp.seq_lens, 512, launch=launch))


def _hard_rows(width, seed):
    """Rows every select must get right: ties, -inf, negatives under a positive maximum, one huge
    value, values spread over sixty decades, fp32's edges, signed zeros, NaN past seq_len, and the
    whole top-k in one chunk."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(12, width, generator=g)
    x[1] = torch.randint(0, 3, (width,), generator=g).float()
    x[2, 5:width - 11] = -math.inf
    x[3] -= 3.0
    x[4, width // 2] = 1e6
    x[5] = torch.exp(torch.linspace(-69, 69, width))[torch.randperm(width, generator=g)]
    x[6, 3], x[6, 9] = 3e38, -3e38
    x[7, :20], x[7, 20:40] = -0.0, 0.0
    x[8, ::7] = -1e30
    x[9, width - width // 8:] += 1e4
    x[10] = 0.25
    n = torch.tensor([width, width, width, width, width - 1, width, 613, 41, width, width, 0, width // 3 + 1],
                     dtype=torch.int32)
    x[11, int(n[11]):] = float("nan")
    return x, n


def _live(x, n):
    return x.cpu().masked_fill(torch.arange(x.shape[1]) >= n.cpu()[:, None].long(), -math.inf)


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("tile,split,merge", [(8192, None, "fused"), (1024, 1, "fused"), (256, 2, "fused"),
                                              (1024, 4, "fused"), (2048, 8, "launch")])
@pytest.mark.parametrize("histogram,warps", [("ballot", 8), ("shared", 8), ("shared", 16)])
def test_topk_on_hard_rows_and_replayed_on_new_data(tile, split, merge, histogram, warps):
    """The top-k's launches on the GPU on rows that miss either anchor, ties across chunk edges,
    chunks longer than their tile, empty and short rows: the contract at several k, bitwise over
    reruns, and one captured graph replayed on other rows and lengths."""
    from dsv4lab.kernels.indexer.topk import TopkLaunch, topk_triton
    launch = TopkLaunch(tile=tile, split=split, merge=merge, histogram=histogram, num_warps=warps)
    x, n = _hard_rows(3000, 3)
    x, n = x.cuda(), n.cuda()
    for k in (1, 37, 512, 2999):
        assert torch.equal(topk_triton(x, n, k, launch=launch).cpu(), reference.topk_positions(_live(x, n), k)), k
    _same_20_times_and_in_a_graph(lambda: topk_triton(x, n, 512, launch=launch))
    g, res = _capture(lambda: topk_triton(x, n, 512, launch=launch))
    for seed in (4, 5):
        y, m = _hard_rows(3000, seed)
        y, m = y.roll(seed, 0), m.roll(seed, 0)          # other rows' lengths (NaN stays past each)
        x.copy_(y.cuda())
        n.copy_(m.cuda())
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(res.cpu(), reference.topk_positions(_live(y, m), 512)), seed
