"""dsv4lab.integrations.sglang: SGLang's own functions, patched and unpatched (Triton interpreter on CPU).

The decode is exercised through SGLang's public ``flash_mla_sparse_decode_triton`` (its module
loaded as a server would import it, under its dotted name; its autotuned kernel restricted to one
config when unpatched). SGLang's indexer module cannot be imported without SGLang's server
dependencies, so the indexer patch is tested on a module under that module's dotted name that
holds SGLang's ``fp8_paged_mqa_logits_torch_sm120`` compiled from the wheel's source
(kernels.fallback.sglang_function). Tolerances: dsv4lab/testing.py (and test_merged_decode.py
for the lab vs SGLang bound).
"""
import importlib
import math
import sys
import types

import pytest
import torch

import dsv4lab
from dsv4lab.integrations import sglang as integration
from dsv4lab.kernels.decode import sglang_peer
from dsv4lab.kernels.indexer import fallback
from dsv4lab.testing import (INDEXER_BF16_TOL, INDEXER_TOL, LSE_TOL, OUT_TOL, VS_SIMT_TOL, make_indexer_inputs,
                             make_merged_decode_inputs, poisoned, rel_err)
from dsv4lab import reference


@pytest.fixture(autouse=True)
def _unpatched():
    integration.unpatch()
    yield
    integration.unpatch()


@pytest.fixture(scope="module")
def mod():
    return integration.decode_module()


def _count(key):
    return integration.calls().get(key, 0)


def _sglang(mod, args):
    """SGLang's public function as the server's module has it (patched or not)."""
    with sglang_peer.one_config_when_interpreting(mod):
        return mod.flash_mla_sparse_decode_triton(*args)


def _check(out, lse, ref, B, H):
    assert out.dtype == torch.bfloat16 and out.shape == (B, 1, H, 512)
    assert lse.dtype == torch.float32 and lse.shape == (B, H, 1)
    e_out, e_lse = rel_err(out[:, 0].float(), ref[0]), rel_err(lse[..., 0], ref[1])
    assert e_out <= OUT_TOL and e_lse <= LSE_TOL, f"vs float64: out {e_out:.2e}, lse {e_lse:.2e}"


def test_public_function_both_caches_and_sink_patched_and_unpatched(mod):
    B, H = 3, 5
    inp = make_merged_decode_inputs(B, H, 16, 32, window_context=60, compressed_context=71, pad_frac=0.2,
                                    topk_len=True, sink=True)
    inp.window.topk_len[1] = 0                # row 1: no valid token in either cache
    inp.compressed.indices[1] = -1
    args = inp.sglang_args(512 ** -0.5)
    ref = inp.reference(512 ** -0.5)
    out0, lse0 = _sglang(mod, args)
    _check(out0, lse0, ref, B, H)
    before = _count("decode:lab")
    with integration.patched() as where, poisoned():
        assert where["decode"] == integration.DECODE_MODULE
        out1, lse1 = _sglang(mod, args)
    assert _count("decode:lab") == before + 2                     # one call per cache
    _check(out1, lse1, ref, B, H)
    assert rel_err(out1.float(), out0.float()) <= VS_SIMT_TOL and rel_err(lse1, lse0) <= LSE_TOL
    assert (out1[1] == 0).all() and torch.equal(lse1[1, :, 0], inp.window.attn_sink.float())


def test_public_function_window_only_no_sink_empty_rows(mod):
    """One cache, no sink, topk_length 0 and all-padding rows: out 0 and lse -inf, as unpatched."""
    B, H = 3, 4
    inp = make_merged_decode_inputs(B, H, 24, window_context=90, topk_len=True)
    inp.window.topk_len[0] = 0
    inp.window.indices[2] = -1
    args = inp.sglang_args()
    ref = inp.reference()
    out0, lse0 = _sglang(mod, args)
    with integration.patched(), poisoned():
        out1, lse1 = _sglang(mod, args)
    for out, lse in ((out0, lse0), (out1, lse1)):
        _check(out, lse, ref, B, H)
        assert (out[[0, 2]] == 0).all() and (lse[[0, 2]] == -math.inf).all()


def test_patch_is_idempotent_and_reversible(mod):
    original = mod._run_triton_sparse_decode
    integration.unpatch()                                        # without patch: nothing to do
    assert mod._run_triton_sparse_decode is original and not integration.is_patched()
    assert integration.patch() == {"decode": integration.DECODE_MODULE, "indexer": None}
    replaced = mod._run_triton_sparse_decode
    assert replaced is not original and integration.is_patched()
    integration.patch()
    assert mod._run_triton_sparse_decode is replaced             # a second patch changes nothing
    integration.unpatch()
    assert mod._run_triton_sparse_decode is original and not integration.is_patched()
    integration.unpatch()
    assert mod._run_triton_sparse_decode is original
    with integration.patched():
        assert mod._run_triton_sparse_decode is not original
    assert mod._run_triton_sparse_decode is original
    integration.patch()                                          # patched before the block: stays patched
    with integration.patched():
        pass
    assert integration.is_patched() and mod._run_triton_sparse_decode is not original
    integration.unpatch()
    assert mod._run_triton_sparse_decode is original


def test_module_is_the_one_a_later_import_finds(mod):
    """Loaded by path under its dotted name, without SGLang's parent packages: a later import of
    that name (as a server started in this process would do) gets this module, patched."""
    assert sys.modules[integration.DECODE_MODULE] is mod and "sglang" not in sys.modules
    with integration.patched():
        assert importlib.import_module(integration.DECODE_MODULE) is mod
        from sglang.kernels.ops.attention.flash_mla_sm120_triton import _run_triton_sparse_decode
        assert _run_triton_sparse_decode is mod._run_triton_sparse_decode is not sglang_peer.module()._run_triton_sparse_decode


def test_lab_sglang_impl_keeps_sglang_code_while_patched(mod):
    """impl='sglang' runs the lab's private copy of SGLang's file: unchanged results, no call into the lab."""
    inp = make_merged_decode_inputs(2, 4, 16, 16, window_context=40, compressed_context=40, sink=True)
    args = inp.sglang_args()
    before = dsv4lab.flash_mla_sparse_decode(*args, impl="sglang")
    with integration.patched():
        calls = _count("decode:lab")
        during = dsv4lab.flash_mla_sparse_decode(*args, impl="sglang")
        assert _count("decode:lab") == calls
        assert sglang_peer.module() is not mod
    assert torch.equal(before[0], during[0]) and torch.equal(before[1], during[1])


def test_patched_decode_reads_no_device_data_on_the_host(mod):
    """Index ranges are not checked (a check reads indices on the host: a sync, impossible under
    CUDA-graph capture). An index past the cache behind topk_length is never read, as in SGLang."""
    inp = make_merged_decode_inputs(2, 4, 16, window_context=40, topk_len=True)
    inp.window.topk_len[:] = torch.tensor([0, 5], dtype=torch.int32)
    inp.window.indices[:, 5:] = inp.window.cache.num_tokens + 1000
    q, k_cache, indices, topk_length = inp.sglang_args()[:4]
    bad = indices.clone()
    bad[1, 0, 4] = inp.window.cache.num_tokens + 1000       # inside row 1's length: the lab's sync check names it
    with pytest.raises(ValueError, match="indices must be < cache.num_tokens"):
        dsv4lab.sparse_decode(q[:, 0], inp.window.cache, bad[:, 0], topk_len=topk_length, impl="auto", checks="sync")
    out0, lse0 = _sglang(mod, inp.sglang_args())
    with integration.patched():
        out, lse = mod._run_triton_sparse_decode(q, k_cache, indices, topk_length, 512 ** -0.5)
    assert (out[0] == 0).all() and (lse[0] == -math.inf).all()
    assert rel_err(lse[:, 0], lse0[..., 0]) <= LSE_TOL


def test_unsupported_arguments_go_to_sglang(mod):
    """int64 indices: the lab's kernels take int32, SGLang's takes either; the patched function
    hands the call to SGLang's code (same result, bit for bit)."""
    inp = make_merged_decode_inputs(2, 3, 16, window_context=40)
    q, k_cache, indices = inp.sglang_args()[:3]
    with sglang_peer.one_config_when_interpreting(mod):
        want = mod._run_triton_sparse_decode(q, k_cache, indices.long(), None, 0.05)
        with integration.patched():
            n = _count("decode:sglang")
            got = mod._run_triton_sparse_decode(q, k_cache, indices.long(), None, 0.05)
            assert _count("decode:sglang") == n + 1
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_empty_batch_gives_empty_outputs(mod):
    """B = 0 through SGLang's public function, patched (SGLang's own kernel launch cannot take it)."""
    inp = make_merged_decode_inputs(1, 4, 16, 16, window_context=20, compressed_context=20, sink=True)
    args = list(inp.sglang_args())
    for i in (0, 2, 8):
        args[i] = args[i][:0]
    with integration.patched():
        out, lse = mod.flash_mla_sparse_decode_triton(*args)
    assert out.shape == (0, 1, 4, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (0, 4, 1) and lse.dtype == torch.float32


# ---- the indexer ----

def _indexer_args(inp, seq_lens_2d=False):
    """SGLang's arguments: q [B, 1, H, 128] fp8, the cache [pages, 64, 1, 132], weights float32."""
    seq = inp.seq_lens[:, None] if seq_lens_2d else inp.seq_lens
    return (inp.q.unsqueeze(1), inp.cache.kv, inp.weights.float(), seq, inp.page_table, None, inp.max_seq_len, False)


@pytest.mark.parametrize("seq_lens_2d", [False, True], ids=["seq_lens-B", "seq_lens-B1"])
def test_lab_indexer_matches_sglang_fallback_and_reference(seq_lens_2d):
    inp = make_indexer_inputs(3, 8, 300, seq_lens=[0, 130, 300], q_dtype=torch.float8_e4m3fn)
    args = _indexer_args(inp, seq_lens_2d)
    ref = reference.indexer_logits(*inp.args(), inp.max_seq_len)
    with poisoned():
        lab = integration.lab_paged_mqa_logits(*args)
    sg = fallback.sglang_function()(*args)
    assert lab.dtype == sg.dtype == torch.float32 and lab.shape == sg.shape == (3, 300)
    assert rel_err(lab, ref) <= INDEXER_TOL
    assert rel_err(sg, ref) <= INDEXER_BF16_TOL and rel_err(lab, sg) <= INDEXER_BF16_TOL
    assert (lab[0] == -math.inf).all() and (lab[1, 130:] == -math.inf).all()


@pytest.fixture
def indexer_module(monkeypatch):
    """SGLang's fallback in a module under the indexer module's dotted name, as a server has it."""
    stub = types.ModuleType(integration.INDEXER_MODULE)
    stub.fp8_paged_mqa_logits_torch_sm120 = fallback.sglang_function()
    monkeypatch.setitem(sys.modules, integration.INDEXER_MODULE, stub)
    return stub


def test_indexer_patch_routes_reverses_and_falls_back(mod, indexer_module):
    original = indexer_module.fp8_paged_mqa_logits_torch_sm120
    decode = mod._run_triton_sparse_decode
    inp = make_indexer_inputs(2, 8, 200, seq_lens=[77, 200], q_dtype=torch.float8_e4m3fn)
    args = _indexer_args(inp)
    want = integration.lab_paged_mqa_logits(*args)
    assert integration.patch() == {"decode": integration.DECODE_MODULE, "indexer": integration.INDEXER_MODULE}
    replaced = indexer_module.fp8_paged_mqa_logits_torch_sm120
    assert replaced is not original
    integration.patch()
    assert indexer_module.fp8_paged_mqa_logits_torch_sm120 is replaced
    n = _count("indexer:lab")
    assert torch.equal(replaced(*args), want) and _count("indexer:lab") == n + 1
    # int16 seq_lens: not the lab's; SGLang's code takes them (same result as unpatched, bit for bit)
    odd = args[:3] + (inp.seq_lens.to(torch.int16),) + args[4:]
    n = _count("indexer:sglang")
    assert torch.equal(replaced(*odd), original(*odd)) and _count("indexer:sglang") == n + 1
    with pytest.raises(AssertionError):                           # clean_logits=True: SGLang's own assert
        replaced(*args[:7], True)
    integration.unpatch()
    assert indexer_module.fp8_paged_mqa_logits_torch_sm120 is original
    assert mod._run_triton_sparse_decode is decode and not integration.is_patched()
