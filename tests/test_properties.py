"""Property-based tests (hypothesis) of every impl against the float64 references, through Triton's
interpreter on CPU: random batch, heads, K, page sizes, padding, duplicate and out-of-range indices,
topk lengths in and out of range, sinks, softmax scales, strided views of every tensor argument,
extreme scores (|score| up to ~1e4) and empty batches, in the default checks="device" mode.

Expected answers: the reference on the inputs as the device-mode contract reads them (an index
outside [0, num_tokens) is padding, topk_len and seq_lens clamped, a request cut before its first
live page id outside the cache), and the error word holds exactly the kinds that were there.
Examples are derandomized (CI sees the same ones every run) and small; tolerances as dsv4lab.testing."""
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dsv4lab
from dsv4lab import errors, reference
from dsv4lab.cache import pack_index_k, pack_kv
from dsv4lab.errors import Flag
from dsv4lab.testing import (INDEXER_TOL, LSE_TOL, OUT_TOL, indexer_tol, poisoned, rel_err, strided_view,
                             topk_recall)

SETTINGS = dict(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))


def _sglang_available():
    from dsv4lab.kernels.decode import sglang_peer
    return sglang_peer.unavailable_reason() is None


DECODE_IMPLS = ["simt", "mma_story", "mma", "splitk", "splitk_auto"] + (["sglang"] if _sglang_available() else [])


@st.composite
def decode_cases(draw):
    B = draw(st.integers(0, 3))
    K = draw(st.integers(0, 40))
    c = dict(B=B, H=draw(st.integers(1, 20)), K=K, N=draw(st.integers(1, 90)),
             page_size=draw(st.sampled_from([1, 3, 16, 64, 256])), seed=draw(st.integers(0, 2**31 - 1)),
             pattern=draw(st.sampled_from(["distinct", "random", "one token"])),
             pad=draw(st.sampled_from([0.0, 0.3, 1.0])), outside=draw(st.booleans()),
             topk_len=draw(st.sampled_from([None, "in range", "any"])), sink=draw(st.booleans()),
             q_scale=draw(st.sampled_from([1.0, 100.0, 1000.0])), kv_scale=draw(st.sampled_from([1e-3, 1.0, 10.0])),
             sm_scale=draw(st.one_of(st.none(), st.floats(1e-3, 0.2))),
             strided=draw(st.sets(st.sampled_from(["q", "indices", "topk_len", "attn_sink"]))))
    return c


def _decode_inputs(c):
    g = torch.Generator().manual_seed(c["seed"])
    B, H, K, N = c["B"], c["H"], c["K"], c["N"]
    cache = pack_kv(torch.randn(N, 512, generator=g) * c["kv_scale"], c["page_size"])
    q = (torch.randn(B, H, 512, generator=g) * c["q_scale"]).bfloat16()
    if c["pattern"] == "distinct":
        idx = torch.stack([torch.randperm(max(N, K), generator=g)[:K] for _ in range(B)]) if B else torch.zeros(0, K)
        idx = torch.where(idx < N, idx, -1)
    elif c["pattern"] == "random":
        idx = torch.randint(0, N, (B, K), generator=g)
    else:
        idx = torch.randint(0, N, (B, 1), generator=g).expand(B, K)
    idx = torch.where(torch.rand(B, K, generator=g) < c["pad"], -1, idx)
    if c["outside"]:
        far = torch.where(torch.rand(B, K, generator=g) < 0.5, N + torch.randint(0, 10**6, (B, K), generator=g),
                          -torch.randint(2, 10**6, (B, K), generator=g))
        idx = torch.where(torch.rand(B, K, generator=g) < 0.2, far, idx)
    idx = idx.int().contiguous()
    tl_ = None
    if c["topk_len"] == "in range":
        tl_ = torch.randint(0, K + 1, (B,), generator=g, dtype=torch.int32)
    elif c["topk_len"] == "any":
        tl_ = torch.randint(-3, K + 4, (B,), generator=g, dtype=torch.int32)
    sink = torch.randn(H, generator=g) * 3 if c["sink"] else None
    return q, cache, idx, tl_, sink


def _strided(c, name, x):
    if x is None or name not in c["strided"]:
        return x
    return strided_view(x, 1 if x.dim() > 1 else 0)


@pytest.mark.parametrize("impl", DECODE_IMPLS)
@settings(max_examples=60, **SETTINGS)
@given(c=decode_cases())
def test_decode_matches_the_reference(impl, c):
    q, cache, idx, tl_, sink = _decode_inputs(c)
    B, H, K, N = c["B"], c["H"], c["K"], c["N"]
    errors.read()
    with poisoned():
        out, lse = dsv4lab.sparse_decode(_strided(c, "q", q), cache, _strided(c, "indices", idx),
                                         topk_len=_strided(c, "topk_len", tl_), attn_sink=_strided(c, "attn_sink", sink),
                                         sm_scale=c["sm_scale"], impl=impl)
    flags = errors.read()
    assert out.shape == (B, H, 512) and lse.shape == (B, H) and out.dtype == torch.bfloat16
    assert not torch.isnan(out.float()).any() and not torch.isnan(lse).any()
    length = torch.full((B,), K) if tl_ is None else tl_.clamp(0, K)
    in_row = torch.arange(K)[None, :] < length[:, None]
    want = Flag(0)
    if B and bool((in_row & (idx >= N)).any()):
        want |= Flag.INDEX
    if B and tl_ is not None and bool(((tl_ < 0) | (tl_ > K)).any()):
        want |= Flag.TOPK_LEN
    assert flags == want
    if B == 0:
        return
    ro, rl = reference.sparse_decode(q, cache, torch.where((idx >= 0) & (idx < N), idx, -1), length.int(),
                                     c["sm_scale"], sink)
    assert rel_err(out.float(), ro) <= OUT_TOL, rel_err(out.float(), ro)
    assert rel_err(lse, rl) <= LSE_TOL, rel_err(lse, rl)


@pytest.mark.parametrize("impl", ["mma", "auto"])
@settings(max_examples=20, **SETTINGS)
@given(c=decode_cases(), extra_k=st.integers(0, 24), extra_seed=st.integers(0, 2**31 - 1))
def test_merged_decode_matches_the_reference(impl, c, extra_k, extra_seed):
    """Window + compressed cache, merged by LSE, with the sink: one softmax over both caches' tokens."""
    q, cache, idx, tl_, sink = _decode_inputs(c)
    e = _decode_inputs({**c, "K": extra_k, "seed": extra_seed, "page_size": 64, "topk_len": None})
    e_cache, e_idx = e[1], e[2]
    out, lse = dsv4lab.flash_mla_sparse_decode(q, cache, idx, tl_, sink, 512, c["sm_scale"], e_cache, e_idx, None,
                                               impl=impl, checks="device")
    errors.read()
    if c["B"] == 0:
        assert out.shape == (0, q.shape[1], 512)
        return
    K, N = c["K"], c["N"]
    length = torch.full((c["B"],), K) if tl_ is None else tl_.clamp(0, K)
    ro, rl = reference.flash_mla_sparse_decode(
        q, cache, torch.where((idx >= 0) & (idx < N), idx, -1), length.int(), sink, c["sm_scale"],
        e_cache, torch.where((e_idx >= 0) & (e_idx < N), e_idx, -1))
    assert not torch.isnan(out.float()).any()
    assert rel_err(out.float(), ro) <= OUT_TOL and rel_err(lse, rl) <= LSE_TOL


INDEXER_IMPLS = ["triton", "torch_fp32", "torch_bf16", "reference"]


@st.composite
def indexer_cases(draw):
    L = draw(st.integers(1, 300))
    return dict(B=draw(st.integers(0, 3)), H=draw(st.integers(1, 8)), L=L, extra_cols=draw(st.integers(0, 2)),
                num_pages=draw(st.integers(1, 8)), seed=draw(st.integers(0, 2**31 - 1)),
                seq=draw(st.sampled_from(["in range", "any"])), bad_live_page=draw(st.booleans()),
                strided=draw(st.sets(st.sampled_from(["q", "weights", "seq_lens", "page_table"]))))


def _indexer_inputs(c):
    g = torch.Generator().manual_seed(c["seed"])
    B, H, L, P = c["B"], c["H"], c["L"], c["num_pages"]
    cols = -(-L // 64) + c["extra_cols"]
    ic = pack_index_k(torch.randn(P * 64, 128, generator=g))
    q = torch.randn(B, H, 128, generator=g).bfloat16()
    w = torch.randn(B, H, generator=g)
    lo, hi = (0, L) if c["seq"] == "in range" else (-4, L + 4)
    seq = torch.randint(lo, hi + 1, (B,), generator=g, dtype=torch.int32)
    live = (seq.clamp(0, L).long() + 63) // 64
    table = torch.randint(0, P, (B, cols), generator=g, dtype=torch.int32)
    dead = torch.arange(cols)[None, :] >= live[:, None]
    table = torch.where(dead, torch.randint(-10, 10**6, (B, cols), generator=g, dtype=torch.int32), table)
    if c["bad_live_page"] and B and int(live.max()) > 0:
        b = int(live.argmax())
        table[b, int(torch.randint(0, int(live[b]), (1,), generator=g))] = P + 3
    return q, ic, w, seq, table


def _sanitized(c, seq, table):
    """The device-mode contract: seq_lens clamped, each request cut before its first bad live page."""
    L, P = c["L"], c["num_pages"]
    s = seq.clamp(0, L).long()
    live = (s + 63) // 64
    cols = torch.arange(table.shape[1])[None, :]
    bad = (cols < live[:, None]) & ((table < 0) | (table >= P))
    first = torch.where(bad.any(1), bad.int().argmax(1), live)
    return torch.minimum(s, first * 64).int(), torch.where((table >= 0) & (table < P), table, 0), bad.any()


@pytest.mark.parametrize("impl", INDEXER_IMPLS)
@settings(max_examples=40, **SETTINGS)
@given(c=indexer_cases())
def test_indexer_matches_the_reference(impl, c):
    q, ic, w, seq, table = _indexer_inputs(c)
    args = [_strided(c, "q", q), ic, _strided(c, "weights", w), _strided(c, "seq_lens", seq),
            _strided(c, "page_table", table)]
    errors.read()
    with poisoned():
        logits = dsv4lab.indexer_logits(*args, max_seq_len=c["L"], impl=impl)
        top = dsv4lab.indexer_topk(*args, max_seq_len=c["L"], topk=16, impl=impl)
    flags = errors.read()
    assert logits.shape == (c["B"], c["L"]) and top.shape == (c["B"], 16)
    if c["B"] == 0:
        assert flags == Flag(0)
        return
    s, t, any_bad = _sanitized(c, seq, table)
    want = Flag.PAGE if bool(any_bad) else Flag(0)
    if bool(((seq < 0) | (seq > c["L"])).any()):
        want |= Flag.SEQ_LEN
    assert flags == want
    ref = reference.indexer_logits(q, ic, w, s, t, c["L"])
    assert rel_err(logits, ref) <= indexer_tol(impl)
    recall = topk_recall(top, reference.topk_indices(ref, 16), ref)
    assert recall >= (1.0 if indexer_tol(impl) == INDEXER_TOL else 0.9), recall
    assert not math.isnan(float(logits.nan_to_num(0, 0, 0).sum()))
