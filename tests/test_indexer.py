"""The indexer of every stage (S0-S3: the torch GEMM paths, S4: the Triton indexer) against the float64
reference: every registered impl this process can run (the registry's tag "exact": the tight bound)."""
import pytest
import torch

import dsv4lab
from dsv4lab import reference
from dsv4lab.registry import impl_info
from dsv4lab.testing import (INDEXER_TOL, check_indexer, indexer_tol, make_indexer_inputs, poisoned, rel_err,
                             runnable_impls, topk_recall)

IMPLS = [i for i in runnable_impls("indexer_logits") if i != "reference"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", [
    dict(B=4, H=64, max_seq_len=300, seq_lens=[0, 1, 64, 300]),        # empty row, one token, one full page, max
    dict(B=3, H=4, max_seq_len=129, seq_lens=[65, 128, 129]),           # page boundaries; max not a multiple of 64
    dict(B=1, H=64, max_seq_len=64, seq_lens=[40]),                     # one page, B=1
    dict(B=2, H=64, max_seq_len=1000, seq_lens=None),                   # random lengths, many dead pages
    dict(B=2, H=24, max_seq_len=150, seq_lens=[150, 3]),                # heads padded to a power of two
])
def test_indexer_against_reference(impl, case):
    inp = make_indexer_inputs(case["B"], case["H"], case["max_seq_len"], seq_lens=case["seq_lens"], seed=7)
    err, recall = check_indexer(impl, inp, topk=64)
    assert err <= indexer_tol(impl), (impl, err)
    assert recall >= (1.0 if "exact" in impl_info("indexer_logits", impl).tags else 0.99), (impl, recall)


def test_logits_are_minus_inf_exactly_past_each_seq_len():
    inp = make_indexer_inputs(3, 16, 200, seq_lens=[0, 70, 200], seed=3)
    with poisoned():                                          # every position must be written
        out = dsv4lab.indexer_logits(*inp.args(), max_seq_len=200, impl="triton")
    for b, n in enumerate([0, 70, 200]):
        assert torch.isfinite(out[b, :n]).all() and torch.isneginf(out[b, n:]).all()


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("nprog", [1, 2, 7])
def test_any_grid_gives_the_same_logits(nprog, prefetch):
    # the grid is fixed per shape (graph-safe): one program walking every live page, or more
    # programs than live pages, must give the same answer
    from dsv4lab.kernels.indexer import triton_indexer
    inp = make_indexer_inputs(2, 8, 400, seq_lens=[130, 5], seed=4)
    ref = reference.indexer_logits(*inp.args(), 400)
    with poisoned():
        out = triton_indexer.logits_triton(*inp.args(), 400, nprog=nprog, prefetch=prefetch)
    assert rel_err(out, ref) <= INDEXER_TOL


def test_fp8_query_and_the_topk_padding():
    # the model's indexer query is fp8 (SGLang's q_fp8): exact in bf16, so the same bound
    inp = make_indexer_inputs(2, 64, 100, seq_lens=[30, 100], seed=5, q_dtype=torch.float8_e4m3fn)
    err, recall = check_indexer("triton", inp, topk=64)
    assert err <= INDEXER_TOL and recall == 1.0
    top = dsv4lab.indexer_topk(*inp.args(), max_seq_len=100, topk=64, impl="triton")
    assert (top[0, 30:] == -1).all() and (top[0, :30] >= 0).all() and (top[1] >= 0).all()


def test_strided_and_numpy_arguments():
    # a seq_lens view with a stride, and a numpy integer for max_seq_len, are what a caller may hold
    import numpy as np
    inp = make_indexer_inputs(3, 16, 200, seq_lens=[10, 150, 70], seed=8)
    wide = torch.zeros(3, 2, dtype=torch.int32, device=inp.seq_lens.device)
    wide[:, 0] = inp.seq_lens
    ref = reference.indexer_logits(*inp.args(), 200)
    out = dsv4lab.indexer_logits(inp.q, inp.cache, inp.weights, wide[:, 0], inp.page_table,
                                 max_seq_len=np.int64(200), impl="triton")
    assert rel_err(out, ref) <= INDEXER_TOL


def test_triton_indexer_refuses_what_it_would_round():
    # fp32 / fp16 q would be rounded to bf16 for the tensor cores on a GPU: refused, not silently rounded
    from dsv4lab.kernels.indexer import triton_indexer
    inp = make_indexer_inputs(1, 16, 64, seq_lens=[10], seed=6, q_dtype=torch.float32)
    with pytest.raises(TypeError, match="bfloat16 or float8_e4m3fn"):
        dsv4lab.indexer_logits(*inp.args(), max_seq_len=64, impl="triton")
    assert rel_err(dsv4lab.indexer_logits(*inp.args(), max_seq_len=64, impl="torch_fp32"),
                   reference.indexer_logits(*inp.args(), 64)) <= INDEXER_TOL
    inp = make_indexer_inputs(1, 16, 64, seq_lens=[10], seed=6)
    with pytest.raises(ValueError, match="nprog must be >= 1"):
        triton_indexer.logits_triton(*inp.args(), 64, nprog=0)


def test_topk_recall_counts_ties():
    logits = torch.tensor([[5.0, 1.0, 1.0, float("-inf")]])
    ref = torch.tensor([[0, 1]])                                   # the reference kept position 1 of the tie
    assert topk_recall(torch.tensor([[0, 2]]), ref, logits) == 1.0
    assert topk_recall(torch.tensor([[0, 2]]), ref) == 0.5     # without the logits, a tie looks like a miss
    assert topk_recall(torch.tensor([[0, 3]]), ref, logits) == 0.5


def test_topk_recall_can_fail():
    ref = torch.tensor([[3, 1, -1]])
    assert topk_recall(torch.tensor([[1, 3, -1]]), ref) == 1.0
    assert topk_recall(torch.tensor([[1, 2, -1]]), ref) == 0.5
    assert topk_recall(torch.tensor([[1, 2, 0]]), ref) == 0.0        # found a position where none exists


def test_triton_indexer_refuses_too_many_heads():
    inp = make_indexer_inputs(1, 129, 64, seq_lens=[10], seed=6)
    with pytest.raises(ValueError, match="at most 128 heads"):
        dsv4lab.indexer_logits(*inp.args(), max_seq_len=64, impl="triton")
