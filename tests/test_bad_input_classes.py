"""Issue 46's classes, walked for every registered impl (a new impl is walked as soon as it registers):
one non-finite contract (a row is the float64 answer or NaN in out and lse, flagged; never "no token"
for a row that read one), devices and modes the ops do not run in (refused before anything launches,
check_errors() unharmed), and sizes that cannot work. The CPU runs small shapes through the
interpreter; the gpu-marked tests run DSv4's shapes, where `auto` picks the Hopper kernel."""
import math

import pytest
import torch

import dsv4lab
from dsv4lab import api, errors, reference
from dsv4lab.cache import KVCache, pack_kv, page_bytes
from dsv4lab.errors import Flag
from dsv4lab.merged_decode import flash_mla_sparse_decode
from dsv4lab.testing import make_decode_inputs, make_indexer_inputs, negative_scores_inputs, right_or_nan, runnable_impls

GPU = dsv4lab.device.mode() == "cuda"
DECODE = runnable_impls("sparse_decode")
INDEXER = runnable_impls("indexer_topk")


@pytest.fixture(autouse=True)
def _clean_word():
    errors.read()
    yield
    errors.read()


def _decode(impl, q, cache, idx, **kw):
    errors.read()
    got = api.sparse_decode(q, cache, idx, impl=impl, **kw)
    return got, errors.read()


# ---- one non-finite contract ----

@pytest.mark.parametrize("impl", DECODE)
def test_a_nan_q_row_is_nan_in_out_and_lse(impl):
    inp = make_decode_inputs(2, 16, 40, context=80, seed=1, pad_frac=0.2, sink=True)
    q = inp.q.clone()
    q[0, 1, 3] = math.nan
    got, flags = _decode(impl, q, inp.cache, inp.indices, attn_sink=inp.attn_sink)
    want = reference.sparse_decode(q, inp.cache, inp.indices, attn_sink=inp.attn_sink)
    assert right_or_nan(got, want, flags) == 1 and math.isnan(float(got[1][0, 1]))


@pytest.mark.parametrize("impl", DECODE)
@pytest.mark.parametrize("scale", [1e-300, 1e-45, 1e30, 1e38])
def test_an_extreme_sm_scale_is_answered_or_flagged(impl, scale):
    inp = make_decode_inputs(2, 16, 40, context=80, seed=2, pad_frac=0.2, topk_len=True)
    got, flags = _decode(impl, inp.q, inp.cache, inp.indices, sm_scale=scale, topk_len=inp.topk_len)
    right_or_nan(got, reference.sparse_decode(inp.q, inp.cache, inp.indices, inp.topk_len, scale), flags)


@pytest.mark.parametrize("impl", DECODE)
@pytest.mark.parametrize("scale", [1e30, 1e38])
def test_scores_all_below_the_running_max_start_are_never_no_token(impl, scale):
    # every scaled score below -1e30 (the kernels' and SGLang's finite starting max) or -inf: the sum
    # of weights is 0 although tokens were read; "no token" (out 0, lse -inf) would be a wrong answer
    q, cache, idx = negative_scores_inputs()
    got, flags = _decode(impl, q, cache, idx, sm_scale=scale)
    right_or_nan(got, reference.sparse_decode(q, cache, idx, sm_scale=scale), flags)
    assert not (got[1] == -math.inf).any()


@pytest.mark.parametrize("impl", DECODE)
def test_the_merged_decode_keeps_tokens_whose_lse_is_below_sglangs_threshold(impl):
    # both caches' lse ~ -1.8e27: SGLang's merge reads <= -1e20 as "no token" and drops both
    q, cache, idx = negative_scores_inputs()
    want = reference.flash_mla_sparse_decode(q, cache, idx[:, :4], sm_scale=1e25, extra_cache=cache,
                                             extra_indices=idx[:, 4:])
    errors.read()
    got = flash_mla_sparse_decode(q, cache, idx[:, :4], None, None, 512, 1e25, cache, idx[:, 4:], impl=impl)
    nan = right_or_nan(got, want, errors.read())
    assert (nan > 0) == (impl == "sglang")                     # SGLang's own merge: flagged, never dropped


@pytest.mark.parametrize("impl", INDEXER)
@pytest.mark.parametrize("op", ["indexer_logits", "indexer_topk"])
@pytest.mark.parametrize("bad", ["nan weight", "inf q", "huge weights"])
def test_non_finite_indexer_inputs_are_flagged(impl, op, bad):
    inp = make_indexer_inputs(2, 8, 256, seq_lens=[200, 100], seed=1)
    q, w = inp.q.clone(), inp.weights.clone()
    if bad == "nan weight":
        w[1, 3] = math.nan
    elif bad == "inf q":
        q[0, 2, 5] = math.inf
    else:
        w[0] = 3e38                                            # finite inputs whose logits overflow
    kw = dict(topk=16) if op == "indexer_topk" else {}
    getattr(dsv4lab, op)(q, inp.cache, w, inp.seq_lens, inp.page_table, max_seq_len=256, impl=impl, **kw)
    flags = errors.read()
    # the logits op returns the overflowed logits as they are (inf: visible); every top-k flags them
    assert bool(flags & Flag.INDEXER_NONFINITE) == (bad != "huge weights" or op == "indexer_topk"), flags
    dsv4lab.indexer_topk(*inp.args(), max_seq_len=256, topk=16, impl=impl)
    assert errors.read() == Flag(0)                            # clean inputs: nothing


# ---- devices and modes ----

@pytest.mark.parametrize("impl", DECODE)
def test_meta_tensors_are_refused_and_later_checks_work(impl):
    inp = make_decode_inputs(2, 16, 8, context=16, seed=3)
    meta = KVCache(inp.cache.buffer.to("meta"), inp.cache.page_size, inp.cache.num_tokens)
    with pytest.raises(ValueError, match="cache is on meta, which holds no data"):
        api.sparse_decode(inp.q.to("meta"), meta, inp.indices.to("meta"), impl=impl)
    with pytest.raises(ValueError, match="k_cache is on meta"):
        flash_mla_sparse_decode(inp.q.to("meta"), meta, inp.indices.to("meta"), None, None, 512, None, impl=impl)
    errors.check_errors()                                       # unharmed
    api.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl)
    errors.check_errors()


@pytest.mark.parametrize("impl", INDEXER)
def test_meta_indexer_tensors_are_refused(impl):
    from dsv4lab.cache import IndexKCache
    inp = make_indexer_inputs(2, 8, 128, seq_lens=[100, 20], seed=4)
    ic = IndexKCache(inp.cache.kv.to("meta"), inp.cache.num_tokens)
    args = [t.to("meta") for t in (inp.q, inp.weights, inp.seq_lens, inp.page_table)]
    for op in ("indexer_logits", "indexer_topk"):
        with pytest.raises(ValueError, match="index_cache is on meta"):
            getattr(dsv4lab, op)(args[0], ic, *args[1:], max_seq_len=128, impl=impl)
    errors.check_errors()


def test_the_error_word_refuses_a_device_it_cannot_hold():
    with pytest.raises(ValueError, match="got meta"):
        errors.word(torch.device("meta"))
    with pytest.raises(ValueError, match="got meta"):
        errors.check_errors("meta")
    errors.check_errors()


# ---- sizes and storage ----

@pytest.mark.parametrize("impl", DECODE)
def test_all_padding_on_an_empty_cache(impl):
    inp = make_decode_inputs(2, 16, 8, context=16, seed=6, sink=True)
    empty = KVCache(inp.cache.buffer, inp.cache.page_size, 0)
    idx = torch.full((2, 8), -1, dtype=torch.int32, device=inp.q.device)
    out, lse = api.sparse_decode(inp.q, empty, idx, impl=impl)
    assert (out == 0).all() and (lse == -math.inf).all()
    out, lse = api.sparse_decode(inp.q, empty, idx, attn_sink=inp.attn_sink, impl=impl)
    assert (out == 0).all() and torch.equal(lse, inp.attn_sink.float()[None].expand(2, 16))


@pytest.mark.parametrize("impl", INDEXER)
def test_a_topk_beyond_the_rows_is_refused_with_its_bound(impl):
    inp = make_indexer_inputs(1, 8, 4096, seq_lens=[100], seed=7)
    for k in (2**31 - 1, 2**28, 4097):
        with pytest.raises(ValueError, match=r"topk must be at most max\(max_seq_len, 2048\) = 4096"):
            dsv4lab.indexer_topk(*inp.args(), max_seq_len=4096, topk=k, impl=impl)
    assert dsv4lab.indexer_topk(*inp.args(), max_seq_len=4096, topk=4096, impl=impl).shape == (1, 4096)
    small = make_indexer_inputs(1, 8, 64, seq_lens=[30], seed=8)
    top = dsv4lab.indexer_topk(*small.args(), max_seq_len=64, topk=2048, impl=impl)   # padding, up to 2048
    assert top.shape == (1, 2048) and (top[0, 30:] == -1).all()


def test_sizes_and_storage_that_cannot_work():
    with pytest.raises(ValueError, match=r"max_seq_len must be at most 2\*\*31 - 1"):
        inp = make_indexer_inputs(1, 8, 64, seq_lens=[30], seed=9)
        dsv4lab.indexer_logits(*inp.args(), max_seq_len=2**31, impl="triton")
    with pytest.raises(ValueError, match=r"page_size must be at most 2\*\*31 - 1"):
        pack_kv(torch.zeros(2, 512), 2**40)
    with pytest.raises(ValueError, match=r"pack_kv would allocate .* GiB .*, more than cpu has"):
        pack_kv(torch.zeros(2, 512), 2**30)
    with pytest.raises(ValueError, match="sm_scale must be a positive float .* past float's range"):
        inp = make_decode_inputs(1, 4, 8, context=8, seed=10)
        dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=10**400, impl="mma")
    pool = torch.zeros(page_bytes(64) + 64, dtype=torch.uint8)
    for off in (1, 2, 8):
        with pytest.raises(ValueError, match="must start at a 16-byte aligned address"):
            KVCache(pool[off: off + page_bytes(64)].view(1, -1), 64, 64)
    KVCache(pool[16: 16 + page_bytes(64)].view(1, -1), 64, 64)   # aligned: fine


# ---- on a GPU ----

def _gpu_decode_inputs(B, seed):
    return make_decode_inputs(B, 64, 512, context=1024, seed=seed, pad_frac=0.1, topk_len=True, sink=True)


@pytest.mark.gpu
@pytest.mark.parametrize("impl", DECODE)
@pytest.mark.parametrize("B", [1, 8, 128])
def test_gpu_the_non_finite_contract(impl, B):
    # DSv4's shapes: auto runs the Hopper kernel from B = 8 (split) and at B = 128 (one launch)
    inp = _gpu_decode_inputs(B, 20 + B)
    q = inp.q.clone()
    q[0, 1, 3] = math.nan
    kw = dict(topk_len=inp.topk_len, attn_sink=inp.attn_sink)
    got, flags = _decode(impl, q, inp.cache, inp.indices, **kw)
    assert right_or_nan(got, reference.sparse_decode(q, inp.cache, inp.indices, **kw), flags) >= 1
    for scale in (1e-300, 1e30, 1e38):
        got, flags = _decode(impl, inp.q, inp.cache, inp.indices, sm_scale=scale, **kw)
        right_or_nan(got, reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=scale, **kw), flags)
    qn, cache, idx = negative_scores_inputs(B, 64, 512, page_size=64)
    for scale in (1e30, 1e38):
        got, flags = _decode(impl, qn, cache, idx, sm_scale=scale)
        right_or_nan(got, reference.sparse_decode(qn, cache, idx, sm_scale=scale), flags)
        assert not (got[1] == -math.inf).any()


@pytest.mark.gpu
def test_gpu_cpu_tensors_and_another_gpu_are_refused():
    inp = make_decode_inputs(2, 16, 8, context=16, seed=3, device="cpu")
    with pytest.raises(ValueError, match="cache is on cpu: in cuda mode"):
        dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="auto")
    if torch.cuda.device_count() > 1:
        other = make_decode_inputs(2, 16, 8, context=16, seed=3, device="cuda:1")
        with pytest.raises(ValueError, match="the current CUDA device is cuda:0"):
            dsv4lab.sparse_decode(other.q, other.cache, other.indices, impl="auto")
        with torch.cuda.device(1):
            dsv4lab.sparse_decode(other.q, other.cache, other.indices, impl="auto")
    errors.check_errors()


@pytest.mark.gpu
def test_gpu_the_error_word_from_two_streams_loses_nothing():
    # set_flag (an atomic kernel) from one stream while kernels flag from another, checks in between
    inp = make_decode_inputs(8, 64, 512, context=1024, seed=30)
    bad = inp.indices.clone()
    bad[0, 0] = inp.cache.num_tokens + 1
    s = torch.cuda.Stream()
    seen = Flag(0)
    torch.cuda.synchronize()
    for i in range(50):
        with torch.cuda.stream(s):
            dsv4lab.sparse_decode(inp.q, inp.cache, bad, impl="splitk_auto")
        errors.set_flag(inp.q.device, Flag.SEQ_LEN, torch.tensor(True, device="cuda"))
        if i % 7 == 0:
            seen |= errors.read()
    seen |= errors.read()
    assert seen == Flag.INDEX | Flag.SEQ_LEN
