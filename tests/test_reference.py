"""The float64 references against naive per-element loops on tiny shapes."""
import math

import pytest
import torch

from dsv4lab import cache as C
from dsv4lab import reference as R


def naive_decode(q, cache, indices, topk_len=None, sm_scale=None, sink=None):
    B, H, D = q.shape
    scale = sm_scale or D ** -0.5
    out = torch.zeros(B, H, D, dtype=torch.float64)
    lse = torch.full((B, H), -math.inf, dtype=torch.float64)
    for b in range(B):
        toks = [int(t) for i, t in enumerate(indices[b])
                if t >= 0 and (topk_len is None or i < int(topk_len[b]))]
        for h in range(H):
            if toks:
                ks = [C.dequant_kv(cache, torch.tensor([t]))[0].double() for t in toks]
                s = [float(q[b, h].double() @ k) * scale for k in ks]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                lse[b, h] = m + math.log(sum(w))
                out[b, h] = sum(wi * k for wi, k in zip(w, ks)) / sum(w)
            if sink is not None:
                new = float(torch.logaddexp(lse[b, h], torch.tensor(float(sink[h]), dtype=torch.float64)))
                out[b, h] *= math.exp(lse[b, h] - new) if lse[b, h] > -math.inf else 0.0
                lse[b, h] = new
    return out, lse


@pytest.mark.parametrize("with_len,with_sink", [(False, False), (True, False), (False, True), (True, True)])
def test_sparse_decode_matches_naive(with_len, with_sink, dev):
    B, H, K, N = 3, 2, 6, 20
    c = C.pack_kv(torch.randn(N, 512, device=dev), 4)
    q = torch.randn(B, H, 512, device=dev)
    idx = torch.randint(0, N, (B, K), dtype=torch.int32, device=dev)
    idx[0, 2] = -1
    idx[2, :] = -1                                     # a row with nothing valid
    tl_ = torch.tensor([4, 0, 6], dtype=torch.int32, device=dev) if with_len else None
    sink = torch.randn(H, device=dev) if with_sink else None
    out, lse = R.sparse_decode(q, c, idx, tl_, None, sink)
    nout, nlse = naive_decode(q.cpu(), c.to("cpu"), idx.cpu(), tl_, None, sink)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert torch.allclose(out.cpu().double(), nout, atol=1e-5)
    assert torch.equal(torch.isfinite(lse.cpu()), torch.isfinite(nlse))
    fin = torch.isfinite(nlse)
    assert torch.allclose(lse.cpu().double()[fin], nlse[fin], atol=1e-5)
    if not with_sink:
        assert (out[2] == 0).all() and (lse[2] == -math.inf).all()


def test_sink_only_lowers_weights(dev):
    c = C.pack_kv(torch.randn(8, 512, device=dev))
    q = torch.randn(1, 3, 512, device=dev)
    idx = torch.arange(8, dtype=torch.int32, device=dev)[None]
    o0, l0 = R.sparse_decode(q, c, idx)
    sink = torch.tensor([-50.0, 0.0, 50.0], device=dev)
    o1, l1 = R.sparse_decode(q, c, idx, attn_sink=sink)
    assert torch.allclose(o1[0, 0], o0[0, 0], rtol=1e-5)        # negligible sink
    assert o1[0, 2].abs().max() < 1e-10                       # sink dominates
    assert torch.allclose(l1, torch.logaddexp(l0, sink[None]))


def _index_setup(dev, B=2, Hi=3, seq=(70, 5), pages=4):
    k = torch.randn(pages * 64, 128, device=dev)
    ic = C.pack_index_k(k)
    q = torch.randn(B, Hi, 128, device=dev)
    w = torch.randn(B, Hi, device=dev)
    seq_lens = torch.tensor(seq, dtype=torch.int32, device=dev)
    pt = torch.full((B, 3), -1, dtype=torch.int32, device=dev)
    pt[0, :2] = torch.tensor([3, 1])
    pt[1, 0] = 2
    return ic, q, w, seq_lens, pt


def test_indexer_logits_matches_naive(dev):
    ic, q, w, seq_lens, pt = _index_setup(dev)
    L = 150
    got = R.indexer_logits(q, ic, w, seq_lens, pt, L)
    assert got.shape == (2, L) and got.dtype == torch.float32
    for b in range(2):
        for t in range(L):
            if t >= int(seq_lens[b]):
                assert got[b, t] == -math.inf
                continue
            phys = int(pt[b, t // 64]) * 64 + t % 64
            kk = C.dequant_index_k(ic, torch.tensor([phys]))[0].double()
            want = sum(float(w[b, h]) * max(0.0, float(q[b, h].double() @ kk)) for h in range(3))
            assert abs(float(got[b, t]) - want) <= 1e-4 * (1 + abs(want))


def test_topk_indices_pads_and_orders(dev):
    x = torch.tensor([[1.0, 5.0, -math.inf, 3.0], [-math.inf] * 4], device=dev)
    got = R.topk_indices(x, 3)
    assert got.dtype == torch.int32
    assert got[0].tolist() == [1, 3, 0] and got[1].tolist() == [-1, -1, -1]
    assert R.topk_indices(x, 6)[0].tolist() == [1, 3, 0, -1, -1, -1]


def test_topk_indices_and_the_torch_fallback_keep_nan_and_inf_as_torch_topk(dev):
    """Only -inf (the mask past seq_len) is left out: a NaN ranks above every number and +inf is a
    number, so a row with them still fills its k slots (they used to become -1, losing a slot each)."""
    from dsv4lab.kernels.indexer.fallback import topk_from_logits
    x = torch.tensor([[math.nan, 1.0, 2.0, 3.0, -math.inf],
                      [0.5, math.inf, -math.inf, math.nan, -2.0],
                      [-math.inf] * 5], device=dev)
    for fn in (R.topk_indices, topk_from_logits):
        got = fn(x, 3).tolist()
        assert got[0] == [0, 3, 2] and got[1] == [3, 1, 0] and got[2] == [-1] * 3, fn
        assert fn(x, 6).tolist()[1] == [3, 1, 0, 4, -1, -1], fn
