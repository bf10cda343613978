"""The two check modes, the error word, and the checks the bad-input table (test_bad_input.py) does
not walk: every impl (from the registry), both modes."""
import math

import pytest
import torch

import dsv4lab
from dsv4lab import api, errors
from dsv4lab.cache import pack_index_k, scale_view
from dsv4lab.errors import DeviceInputError, Flag
from dsv4lab import contracts
from dsv4lab.testing import (OUT_TOL, make_decode_inputs, make_indexer_inputs, make_merged_decode_inputs, rel_err,
                             runnable_impls)

DECODE_IMPLS = runnable_impls("sparse_decode")


@pytest.fixture
def inp():
    return make_decode_inputs(2, 4, 8, context=16, seed=3)


@pytest.fixture(autouse=True)
def _clean_word():
    errors.read()
    yield
    errors.read()


def test_impls_lists_all_stages():
    assert {"reference", "simt", "sglang", "mma", "splitk", "splitk_auto", "auto"} <= set(dsv4lab.impls())


def test_one_spelling_of_checks(inp):
    """checks="device" or "sync"; the older spellings (check_ranges=, a bool) are refused naming checks=, by every op."""
    assert contracts.checks_mode() == "device" and contracts.checks_mode("sync") == "sync"
    for bad in (True, False, "yes"):
        with pytest.raises(ValueError, match=r"checks must be one of \('device', 'sync'\)"):
            contracts.checks_mode(bad)
    merged = make_merged_decode_inputs(2, 4, 16, window_context=40)
    ix = make_indexer_inputs(2, 4, 128, seed=3)
    for call in (lambda: dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl="mma", check_ranges=True),
                 lambda: dsv4lab.flash_mla_sparse_decode(*merged.sglang_args(), impl="mma", check_ranges=False),
                 lambda: dsv4lab.indexer_logits(*ix.args(), max_seq_len=128, check_ranges=True),
                 lambda: dsv4lab.indexer_topk(*ix.args(), max_seq_len=128, topk=8, check_ranges=True)):
        with pytest.raises(TypeError, match="check_ranges= is gone: pass checks='sync'"):
            call()


@pytest.mark.parametrize("impl", DECODE_IMPLS)
def test_index_past_the_cache_every_impl(inp, impl):
    """sync: refused, naming the entry; device: read as padding (the reference's answer with -1 there), flagged."""
    bad = inp.indices.clone()
    bad[1, 3] = inp.cache.num_tokens + 5
    with pytest.raises(ValueError, match=r"indices\[1, 3\] = 37"):
        dsv4lab.sparse_decode(inp.q, inp.cache, bad, impl=impl, checks="sync")
    out, lse = dsv4lab.sparse_decode(inp.q, inp.cache, bad, impl=impl)
    want = bad.clone()
    want[1, 3] = -1
    ro, rl = dsv4lab.reference.sparse_decode(inp.q, inp.cache, want)
    assert rel_err(out.float(), ro) <= OUT_TOL and rel_err(lse, rl) <= 1e-3
    with pytest.raises(DeviceInputError, match="an index >= cache.num_tokens") as e:
        dsv4lab.check_errors()
    assert e.value.flags == Flag.INDEX
    dsv4lab.check_errors()                                     # cleared: a second check is clean


@pytest.mark.parametrize("impl", DECODE_IMPLS)
def test_topk_len_and_sink_every_impl(inp, impl):
    tl_ = torch.tensor([-2, 12], dtype=torch.int32)
    out, lse = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, topk_len=tl_, impl=impl)
    ro, rl = dsv4lab.reference.sparse_decode(inp.q, inp.cache, inp.indices, torch.tensor([0, 8], dtype=torch.int32))
    assert rel_err(out.float(), ro) <= OUT_TOL and rel_err(lse, rl) <= 1e-3
    assert errors.read() == Flag.TOPK_LEN
    sink = torch.tensor([0.0, math.nan, 1.0, -math.inf])
    out, lse = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, attn_sink=sink, impl=impl)
    assert torch.isnan(out[:, 1].float()).all() and torch.isfinite(out[:, [0, 2, 3]].float()).all()
    assert errors.read() & Flag.SINK


@pytest.mark.parametrize("impl", DECODE_IMPLS)
def test_scale_byte_past_134_refused_by_sync_checks(inp, impl):
    """Bytes the packers never write are refused for every impl when checks run, naming the byte."""
    tok = int(inp.indices[0, 2])
    ps = inp.cache.page_size
    scale_view(inp.cache)[tok // ps, tok % ps, 3] = 135
    with pytest.raises(ValueError, match=rf"token {tok} \(indices\[0, 2\]\) has 135 in nope group 3"):
        dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, checks="sync")
    dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl)          # device mode: not looked at


def test_entries_past_topk_len_are_never_read_nor_checked(inp):
    bad = inp.indices.clone()
    bad[:, 4:] = 10**6
    tl_ = torch.tensor([4, 3], dtype=torch.int32)
    a = dsv4lab.sparse_decode(inp.q, inp.cache, bad, topk_len=tl_, impl="mma", checks="sync")
    b = dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, topk_len=tl_, impl="mma")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    dsv4lab.check_errors()


def test_merged_decode_flags_a_sink_without_sync():
    inp = make_merged_decode_inputs(2, 4, 16, window_context=40)
    args = list(inp.sglang_args())
    args[4] = torch.full((4,), math.nan)                         # attn_sink
    dsv4lab.flash_mla_sparse_decode(*args, impl="mma", checks="device")
    assert errors.read() & Flag.SINK


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


@pytest.mark.parametrize("impl", runnable_impls("indexer_logits"))
def test_indexer_bad_live_page_every_impl(impl, dev):
    """A live page id outside the cache: sync names it; device mode ends the request before it, flagged."""
    q, ic, w, seq, pt = _indexer(dev)
    pt[0, 1] = 99
    with pytest.raises(ValueError, match=r"page_table\[0, 1\] = 99 is a live page"):
        dsv4lab.indexer_logits(q.bfloat16(), ic, w, seq, pt, max_seq_len=128, impl=impl, checks="sync")
    got = dsv4lab.indexer_logits(q.bfloat16(), ic, w, seq, pt, max_seq_len=128, impl=impl)
    assert torch.isfinite(got[0, :64]).all() and torch.isneginf(got[0, 64:]).all()
    assert errors.read() == Flag.PAGE


def test_check_errors_names_every_kind_and_device(inp):
    errors.set_flag(inp.q.device, Flag.INDEX | Flag.PAGE, torch.tensor(True))
    with pytest.raises(DeviceInputError) as e:
        dsv4lab.check_errors()
    msg = str(e.value)
    assert "an index >= cache.num_tokens" in msg and "a live page id" in msg and "checks='sync'" in msg
    assert str(inp.q.device) in msg and e.value.flags == Flag.INDEX | Flag.PAGE


def test_scale_byte_limit_follows_the_launch(monkeypatch):
    """The NaN past byte 134 belongs to the launch a shape gets: "bits" has it, "cvt" has none; a tile
    entry's "bits" applies to whole rows, split slices take "cvt". The interpreter never takes "bits"
    (no inline assembly), so the GPU's answer is forced here."""
    from dsv4lab.kernels.decode import planning
    from dsv4lab.kernels.decode import head_batched as hb
    from dsv4lab.kernels.decode.kv_tiles import MAX_SCALE_BYTE
    bits = planning.TileConfig(64, 128, 8, 1, dequant="bits", fold_scale=True)
    cvt = planning.TileConfig(16, 64, 8, 1)
    if planning.is_interpret():
        assert hb.max_scale_byte(planning.launch_for(bits)) is None            # interpreter: always "cvt"
    monkeypatch.setattr(planning, "is_interpret", lambda: False)
    assert hb.max_scale_byte(planning.launch_for(bits)) == MAX_SCALE_BYTE
    assert hb.max_scale_byte(planning.launch_for(cvt)) is None
    assert hb.max_scale_byte(planning.launch_for(bits, nsplit=2)) is None


def test_launches_are_planned_once_per_shape_and_follow_the_table(monkeypatch):
    from dsv4lab.kernels.decode import planning
    from dsv4lab.kernels.decode import split_k
    a = split_k.auto_launch(32, 64, 512)
    assert split_k.auto_launch(32, 64, 512) is a                             # cached
    key = (planning.device_key(), "split")
    monkeypatch.setitem(planning.TILE_TABLE, key, planning.TileConfig(16, 32, 4, 1, "test"))
    b = split_k.auto_launch(32, 64, 512)                                      # the table changed: planned again
    assert b is not a and (b.nsplit == 1 or b.tiles.block_n == 32)
