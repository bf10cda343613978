"""Bad input gets a clear error naming the argument and what was expected."""
import math

import pytest
import torch

import dsv4lab
from dsv4lab.cache import pack_index_k
from dsv4lab.testing import make_decode_inputs


@pytest.fixture
def inp():
    return make_decode_inputs(2, 4, 8, context=16, seed=3)


def call(inp, impl="mma", **over):
    kw = dict(q=inp.q, cache=inp.cache, indices=inp.indices, topk_len=None, attn_sink=None)
    kw.update(over)
    return dsv4lab.sparse_decode(kw.pop("q"), kw.pop("cache"), kw.pop("indices"), impl=impl, **kw)


@pytest.mark.parametrize("over,exc,msg", [
    (lambda i: dict(q=i.q[..., :500]), ValueError, r"q must have shape \[B, H, 512\]"),
    (lambda i: dict(q=i.q[0]), ValueError, "q must be 3-D"),
    (lambda i: dict(q=i.q.to(torch.float64)), TypeError, "q must have dtype"),
    (lambda i: dict(q=i.q.tolist()), TypeError, "q must be a torch.Tensor"),
    (lambda i: dict(cache=i.cache.buffer), TypeError, "cache must be a dsv4lab.cache.KVCache"),
    (lambda i: dict(indices=i.indices.long()), TypeError, "indices must have dtype"),
    (lambda i: dict(indices=i.indices[:1]), ValueError, r"indices must have shape \[2, \*\]"),
    (lambda i: dict(indices=i.indices[:, :0]), ValueError, "at least one column"),
    (lambda i: dict(indices=i.indices + 100), ValueError, r"indices must be < cache.num_tokens \(32\)"),
    (lambda i: dict(topk_len=torch.tensor([9, 1], dtype=torch.int32, device=i.q.device)), ValueError, r"topk_len must lie in \[0, K=8\]"),
    (lambda i: dict(topk_len=torch.tensor([-1, 1], dtype=torch.int32, device=i.q.device)), ValueError, "topk_len must lie in"),
    (lambda i: dict(topk_len=torch.tensor([1, 1], device=i.q.device)), TypeError, "topk_len must have dtype"),
    (lambda i: dict(topk_len=torch.tensor([1], dtype=torch.int32, device=i.q.device)), ValueError, r"topk_len must have shape \[2\]"),
    (lambda i: dict(attn_sink=torch.zeros(3, device=i.q.device)), ValueError, r"attn_sink must have shape \[4\]"),
    (lambda i: dict(sm_scale=-1.0), ValueError, "sm_scale must be a positive float"),
])
def test_bad_decode_args(inp, over, exc, msg):
    with pytest.raises(exc, match=msg):
        call(inp, **over(inp))


def test_unknown_impl_lists_choices(inp):
    with pytest.raises(ValueError, match=r"impl must be one of \[.*'mma'.*\], got 'fast'"):
        call(inp, impl="fast")


def test_impls_lists_all_stages():
    assert {"reference", "simt", "sglang", "mma", "splitk", "auto"} <= set(dsv4lab.impls())


def _indexer(dev):
    ic = pack_index_k(torch.randn(128, 128, device=dev))
    q = torch.randn(2, 4, 128, device=dev)
    w = torch.randn(2, 4, device=dev)
    seq = torch.tensor([70, 10], dtype=torch.int32, device=dev)
    pt = torch.tensor([[1, 0], [0, -1]], dtype=torch.int32, device=dev)
    return q, ic, w, seq, pt


def test_indexer_reference_entry_points(dev):
    q, ic, w, seq, pt = _indexer(dev)
    logits = dsv4lab.indexer_logits(q, ic, w, seq, pt, max_seq_len=128)
    assert logits.shape == (2, 128) and torch.isinf(logits[1, 10:]).all()
    top = dsv4lab.indexer_topk(q, ic, w, seq, pt, max_seq_len=128, topk=16)
    assert top.shape == (2, 16) and top.dtype == torch.int32
    assert (top[1, :10] >= 0).all() and (top[1, 10:] == -1).all()


@pytest.mark.parametrize("over,exc,msg", [
    (lambda d: dict(q=torch.randn(2, 4, 64, device=d)), ValueError, r"q must have shape \[B, H_i, 128\]"),
    (lambda d: dict(weights=torch.randn(2, 3, device=d)), ValueError, r"weights must have shape \[2, 4\]"),
    (lambda d: dict(seq_lens=torch.tensor([70, 10], device=d)), TypeError, "seq_lens must have dtype"),
    (lambda d: dict(seq_lens=torch.tensor([129, 10], dtype=torch.int32, device=d)), ValueError, r"seq_lens must lie in \[0, max_seq_len=128\]"),
    (lambda d: dict(page_table=torch.tensor([[1, -1], [0, -1]], dtype=torch.int32, device=d)), ValueError, r"page_table\[0, 1\] = -1 is a live page"),
    (lambda d: dict(page_table=torch.tensor([[1, 5], [0, -1]], dtype=torch.int32, device=d)), ValueError, r"must lie in \[0, 2\)"),
    (lambda d: dict(max_seq_len=200), ValueError, "page_table must have at least ceil"),
    (lambda d: dict(index_cache="x"), TypeError, "index_cache must be a dsv4lab.cache.IndexKCache"),
])
def test_bad_indexer_args(over, exc, msg, dev):
    q, ic, w, seq, pt = _indexer(dev)
    kw = dict(q=q, index_cache=ic, weights=w, seq_lens=seq, page_table=pt, max_seq_len=128)
    kw.update(over(dev))
    with pytest.raises(exc, match=msg):
        dsv4lab.indexer_logits(kw.pop("q"), kw.pop("index_cache"), kw.pop("weights"), kw.pop("seq_lens"),
                               kw.pop("page_table"), **kw)


def test_indexer_topk_bad_k(dev):
    q, ic, w, seq, pt = _indexer(dev)
    with pytest.raises(ValueError, match="topk must be a positive int"):
        dsv4lab.indexer_topk(q, ic, w, seq, pt, max_seq_len=128, topk=0)


def test_wrong_device_is_named(inp):
    other = torch.device("meta")
    with pytest.raises(ValueError, match=r"indices must be on .* \(the cache's device\)"):
        call(inp, indices=inp.indices.to(other))


def test_check_ranges_off_skips_only_the_range_checks(inp):
    # check_ranges=False (eager timing without a host sync) still checks shapes and dtypes
    kw = dict(impl="reference", check_ranges=False)
    with pytest.raises((ValueError, TypeError), match="indices"):
        dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices[:, :, None], **kw)
    with pytest.raises(ValueError, match=r"indices must be < cache.num_tokens"):
        dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices + 100, impl="reference")
    out, lse = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, **kw)
    assert out.shape == inp.q.shape and torch.isfinite(lse).all()
    # the range check is really skipped: a topk_len past K is not an error then (the kernels clamp it)
    long = torch.full((inp.q.shape[0],), inp.indices.shape[1] + 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="topk_len must lie in"):
        dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, topk_len=long, impl="reference")
    dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, topk_len=long, **kw)


def test_sink_must_be_finite(inp):
    sink = torch.zeros(inp.q.shape[1])
    sink[1] = -math.inf
    with pytest.raises(ValueError, match="attn_sink must be finite"):
        dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, attn_sink=sink, impl="reference")


def test_scale_byte_limit_names_the_byte(inp, monkeypatch):
    """The "bits" dequant (GPU) needs scale bytes <= 134; an eager call over a token with a larger
    one is refused with the byte, not answered wrongly. Forced here: the interpreter uses "cvt"."""
    import dataclasses
    from dsv4lab.api import _IMPLS
    from dsv4lab.kernels.common import MAX_SCALE_BYTE
    for impl in ("mma", "splitk", "auto"):      # what a "bits" launch reports on the GPU
        table = _IMPLS["sparse_decode"]
        monkeypatch.setitem(table, impl, dataclasses.replace(table[impl], max_scale_byte=lambda B, H, K: MAX_SCALE_BYTE))
    dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="mma")            # in range: runs
    tok = int(inp.indices[inp.indices >= 0][0])
    ps = inp.cache.page_size
    inp.cache.buffer[tok // ps, ps * 576 + (tok % ps) * 8 + 3] = 135
    for impl in ("mma", "splitk", "auto"):
        with pytest.raises(ValueError, match="scale bytes of the indexed tokens must be <= 134.*got 135"):
            dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl)
    dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="simt")            # no such limit
    dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="mma", check_ranges=False)


def test_scale_byte_limit_follows_the_launch(monkeypatch):
    """The limit belongs to the launch a shape gets: "bits" has it, "cvt" has none; a tile entry's
    "bits" applies to whole rows, split slices take "cvt". The interpreter never takes "bits" (no
    inline assembly), so the GPU's answer is forced here."""
    from dsv4lab import planning
    from dsv4lab.kernels import head_batched as hb
    from dsv4lab.kernels.common import MAX_SCALE_BYTE
    bits = planning.TileConfig(64, 128, 8, 1, dequant="bits", fold_scale=True)
    cvt = planning.TileConfig(16, 64, 8, 1)
    if planning.is_interpret():
        assert hb.max_scale_byte(planning.launch_for(bits)) is None            # interpreter: always "cvt"
    monkeypatch.setattr(planning, "is_interpret", lambda: False)
    assert hb.max_scale_byte(planning.launch_for(bits)) == MAX_SCALE_BYTE
    assert hb.max_scale_byte(planning.launch_for(cvt)) is None
    assert hb.max_scale_byte(planning.launch_for(bits, nsplit=2)) is None
