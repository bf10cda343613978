"""The calls behind the bad-input table (dsv4lab.bad_input): tiny deterministic inputs, the call each
case makes, and the checks of the answers it gets. A case that means one kind of kernel asks the registry
for it by what it is (its stage, its tag), and one that means every kernel walks the registered impls this
process can run, so a renamed or a new impl changes no case.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from . import api, cache as C, errors, reference
from .config import HEAD_DIM, INDEX_DIM, PAGE_SIZE, TOKEN_BYTES
from .device import torch_device
from .registry import registered
from .testing import OUT_TOL, negative_scores_inputs, rel_err, right_or_nan, runnable_impls, strided_view


def _only(found: list) -> str:
    """The name of the one impl found: a second would leave the case's role ambiguous, so it fails here."""
    (impl,) = found
    return impl.name


# the kernels the cases call by role
MMA = _only([i for i in registered("sparse_decode") if i.stage == "S1best"])   # the lab's tuned MMA kernel
SIMT = _only(registered("sparse_decode", "simt"))                # the lab's SIMT kernel
SGLANG = _only(registered("sparse_decode", "baseline"))          # SGLang's own kernel and merge
DISPATCHER = _only(registered("sparse_decode", "dispatcher"))    # picks a kernel per shape


def triton_indexer(op: str = "indexer_logits") -> str:
    """The impl of ``op`` that stands for stage S4: the Triton indexer."""
    return _only([i for i in registered(op) if i.stage == "S4"])


def decode_inputs(B=2, H=4, K=8, tokens=32, page_size=16, seed=0, dev=None):
    """q [B, H, 512] bf16, a cache of ``tokens`` random tokens, indices = token ids 0 .. B*K-1 in order, a sink."""
    g = torch.Generator().manual_seed(seed)
    dev = dev or torch_device()
    cache = C.pack_kv(torch.randn(tokens, HEAD_DIM, generator=g).to(dev), page_size)
    q = torch.randn(B, H, HEAD_DIM, generator=g).to(torch.bfloat16).to(dev)
    idx = torch.arange(B * K, dtype=torch.int32).reshape(B, K).to(dev)
    return q, cache, idx, torch.randn(H, generator=g).to(dev)


def decode(impl=MMA, checks=None, change=lambda a: a, dev=None, **kw):
    """sparse_decode on the tiny inputs after ``change(args dict)``."""
    q, cache, idx, _ = decode_inputs(dev=dev)
    a = change(dict(q=q, cache=cache, indices=idx, **kw))
    return api.sparse_decode(a.pop("q"), a.pop("cache"), a.pop("indices"), impl=impl, checks=checks, **a)


def agrees(got, q, cache, idx, topk_len=None, sink=None, scale=None):
    """(out, lse) ``got`` matches the float64 reference on the given (sanitized) arguments."""
    ro, rl = reference.sparse_decode(q, cache, idx, topk_len, scale, sink)
    e = rel_err(got[0].float(), ro), rel_err(got[1], rl)
    assert e[0] <= OUT_TOL and e[1] <= 1e-3, f"errors {e} against the reference"
    return got


def flagged(call):
    """Device mode: the call answers (and checks its answer), then check_errors() raises."""
    errors.read()
    call()
    errors.check_errors()


def same_as_contiguous(impl, **strided):
    """The call with strided views of some arguments gives bitwise the answer of contiguous copies."""
    q, cache, idx, sink = decode_inputs()
    args = dict(q=q, indices=idx, attn_sink=sink, topk_len=torch.tensor([5, 8], dtype=torch.int32, device=q.device))
    views = {k: strided_view(v, strided[k]) if k in strided else v for k, v in args.items()}
    a = api.sparse_decode(views.pop("q"), cache, views.pop("indices"), impl=impl, **views)
    b = api.sparse_decode(args.pop("q"), cache, args.pop("indices"), impl=impl, **args)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "strided views read differently"


def set_scale_byte(cache, token, group, byte):
    C.scale_view(cache)[token // cache.page_size, token % cache.page_size, group] = byte


def with_bad_cache(edit, **kw):
    q, cache, idx, _ = decode_inputs()
    edit(cache)
    return api.sparse_decode(q, cache, idx, **kw), (q, cache, idx)


def indexer_inputs(seq=(70, 10), table=((1, 0), (0, -1)), B=2, H=4, max_seq_len=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    dev = torch_device()
    ic = C.pack_index_k(torch.randn(128, INDEX_DIM, generator=g).to(dev))
    q = torch.randn(B, H, INDEX_DIM, generator=g).to(torch.bfloat16).to(dev)
    w = torch.randn(B, H, generator=g).to(dev)
    seq_lens = torch.tensor(seq, dtype=torch.int32, device=dev)
    pt = torch.tensor(table, dtype=torch.int32, device=dev)
    return dict(q=q, index_cache=ic, weights=w, seq_lens=seq_lens, page_table=pt, max_seq_len=max_seq_len)


def indexer(op="indexer_logits", impl=None, checks=None, change=lambda a: a, **kw):
    """``op`` (by default its Triton kernel) on the tiny inputs after ``change(args dict)``."""
    impl = impl or triton_indexer(op)
    a = change({**indexer_inputs(), **kw})
    fn = getattr(api, op)
    return fn(a.pop("q"), a.pop("index_cache"), a.pop("weights"), a.pop("seq_lens"), a.pop("page_table"),
              impl=impl, checks=checks, **a)


def logits_agree(impl, got_seq, got_table, **kw):
    """The impl's logits on the given inputs equal the reference's on the sanitized (seq, table)."""
    a = {**indexer_inputs(), **kw}
    got = api.indexer_logits(a["q"], a["index_cache"], a["weights"], a["seq_lens"], a["page_table"],
                             max_seq_len=a["max_seq_len"], impl=impl)
    seq = torch.tensor(got_seq, dtype=torch.int32, device=got.device)
    table = torch.tensor(got_table, dtype=torch.int32, device=got.device)
    ref = reference.indexer_logits(a["q"], a["index_cache"], a["weights"], seq, table, a["max_seq_len"])
    assert rel_err(got, ref) <= 1e-4, rel_err(got, ref)


def cli(args, env=None):
    """Run ``python -m dsv4lab args`` in a process of its own (the mode is decided once per process, and
    the CLI is what a user starts): (exit status, stderr lines). ``env``: variables to set there."""
    e = {k: v for k, v in os.environ.items() if k not in ("DSV4LAB_MODE", "TRITON_INTERPRET")}
    e.update(env or {})
    e["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent), e.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "dsv4lab", *args], capture_output=True, text=True, env=e, timeout=300)
    return r.returncode, r.stderr.strip().splitlines()


def exits_2_with(args, says, env=None):
    code, lines = cli(args, env)
    assert code == 2 and len(lines) == 1 and says in lines[0], (code, lines)


def has_shapes(result, *shapes):
    got = result if isinstance(result, tuple) else (result,)
    assert [list(t.shape) for t in got] == [list(s) for s in shapes], [list(t.shape) for t in got]


_I32 = torch.int32
SINK_NAN = "attn_sink must be finite (no sink for a head: pass attn_sink=None); attn_sink[1] = nan"


def int32s(*v):
    return torch.tensor(v, dtype=_I32, device=torch_device())


def sink_with(v):
    s = decode_inputs()[3].clone()
    s[1] = v
    return s


def nan_sink_answer():
    out, lse = decode(attn_sink=sink_with(math.nan))
    assert torch.isnan(out[:, 1].float()).all() and torch.isfinite(out[:, [0, 2, 3]].float()).all()


def q_with_inf(a):
    a["q"] = a["q"].clone()
    a["q"][0, 0, 0] = math.inf
    return a


def index_past(a, value=40):
    a["indices"] = a["indices"].clone()
    a["indices"][0, 1] = value
    return a


def index_past_answer():
    q, cache, idx, _ = decode_inputs()
    bad = idx.clone()
    bad[0, 1] = 40
    got = api.sparse_decode(q, cache, bad, impl=DISPATCHER)
    idx[0, 1] = -1
    agrees(got, q, cache, idx)


def topk_len_answer():
    q, cache, idx, _ = decode_inputs()
    got = api.sparse_decode(q, cache, idx, topk_len=int32s(-3, 9), impl=SIMT)
    agrees(got, q, cache, idx, topk_len=int32s(0, 8))


def negative_index_answer():
    q, cache, idx, _ = decode_inputs()
    bad = idx.clone()
    bad[1, 2] = -7
    got = api.sparse_decode(q, cache, bad, impl=MMA)
    bad[1, 2] = -1
    agrees(got, q, cache, bad)


def duplicate_index_answer():
    q, cache, idx, _ = decode_inputs()
    idx[:, 1:] = idx[:, :1]
    for impl in runnable_impls():
        agrees(api.sparse_decode(q, cache, idx, impl=impl), q, cache, idx)


def k0_answer():
    q, cache, idx, sink = decode_inputs()
    out, lse = api.sparse_decode(q, cache, idx[:, :0], attn_sink=sink, impl=DISPATCHER)
    assert (out == 0).all() and torch.equal(lse, sink[None].expand(2, 4).float())


def scale_byte_device_answer():
    from .kernels.decode import head_batched
    q, cache, idx, _ = decode_inputs()
    set_scale_byte(cache, 0, 3, 140)
    errors.read()
    got = api.sparse_decode(q, cache, idx, impl=MMA)
    if head_batched.max_scale_byte(head_batched.mma_launch(2, 4, 8)) is None:
        agrees(got, q, cache, idx)                   # "cvt" (the interpreter's) reads 2^13 exactly
    else:                                             # "bits": NaN in the row that reads it, flagged
        assert torch.isnan(got[0][0].float()).all() and errors.read() & errors.Flag.NONFINITE


def nan_byte(cache):
    cache.buffer[0, 3] = 0x7F                         # token 0, nope value 3: e4m3 NaN


def nan_byte_device_answer():
    """Not looked at: whatever the launch's dequant makes of the byte. NaN rows (the GPU's conversion
    instructions) are flagged; the interpreter's conversion and the "bits" dequant read 480 x scale."""
    errors.read()
    got, _ = with_bad_cache(nan_byte, impl=MMA)
    rows = torch.isnan(got[0].float()).flatten(1).any(1)
    assert torch.isfinite(got[0][1].float()).all()
    assert bool(rows[0]) == bool(errors.read() & errors.Flag.NONFINITE)


def sm_scale_numpy():
    q, cache, idx, _ = decode_inputs()
    agrees(api.sparse_decode(q, cache, idx, sm_scale=np.float32(0.05), impl=MMA), q, cache, idx, scale=0.05)


def page_cut_answer():
    # request 0 has 70 tokens on pages [1, -1]: cut at its second page, 64 positions are left
    logits_agree(triton_indexer(), (64, 10), ((1, 0), (0, 0)), page_table=page_rows(((1, -1), (0, -1))))


def page_rows(rows):
    return torch.tensor(rows, dtype=_I32, device=torch_device())


def dead_pages_answer():
    junk = page_rows(((1, 0, 7), (0, 10**9, -5)))          # past the live pages: never read
    for impl in runnable_impls("indexer_logits"):
        a = {**indexer_inputs(), "page_table": junk}
        got = api.indexer_logits(a["q"], a["index_cache"], a["weights"], a["seq_lens"], junk,
                                 max_seq_len=128, impl=impl)
        ref = reference.indexer_logits(a["q"], a["index_cache"], a["weights"], a["seq_lens"], junk, 128)
        assert rel_err(got, ref) <= 5e-3, impl


def seq_len_answer():
    logits_agree(triton_indexer(), (128, 0), ((1, 0), (0, -1)), seq_lens=int32s(200, -4))


def strided_seq_lens():
    a = indexer_inputs()
    seq = strided_view(a["seq_lens"])
    got = api.indexer_logits(a["q"], a["index_cache"], strided_view(a["weights"], 1), seq, a["page_table"],
                             max_seq_len=128, impl=triton_indexer())
    ref = reference.indexer_logits(a["q"], a["index_cache"], a["weights"], a["seq_lens"], a["page_table"], 128)
    assert rel_err(got, ref) <= 1e-4


def topk_numpy():
    top = indexer("indexer_topk", topk=np.int32(16), max_seq_len=np.int64(128))
    assert top.shape == (2, 16) and (top[1, 10:] == -1).all() and (top[1, :10] >= 0).all()


def fp8_pages_with_token_stride():
    """A 128-token cache's fp8 bytes viewed [pages, PAGE_SIZE, 1, TOKEN_BYTES] with pages PAGE_SIZE tokens
    apart: not SGLang's view, whose page stride is the padded page's bytes."""
    fp8 = decode_inputs(tokens=128, page_size=PAGE_SIZE)[1].buffer.view(torch.float8_e4m3fn)
    return fp8.as_strided((2, PAGE_SIZE, 1, TOKEN_BYTES), (PAGE_SIZE * TOKEN_BYTES, TOKEN_BYTES, TOKEN_BYTES, 1))


def kvcache(buffer, page_size=PAGE_SIZE, num_tokens=PAGE_SIZE):
    return C.KVCache(buffer, page_size, num_tokens)


def runs_missing():
    from . import runs
    runs.load("no_such_part")


def shapes_bad_mode():
    from . import config
    config.shapes("gpu")


def nan_q_every_impl():
    """q[0, 1] holds a NaN: that row is NaN in out and lse for every impl, the others answered, flagged."""
    q, cache, idx, _ = decode_inputs()
    q = q.clone()
    q[0, 1, 3] = math.nan
    for impl in runnable_impls():
        errors.read()
        got = api.sparse_decode(q, cache, idx, impl=impl)
        assert right_or_nan(got, reference.sparse_decode(q, cache, idx), errors.read()) == 1, impl
    api.sparse_decode(q, cache, idx, impl=DISPATCHER)            # its flag left for check_errors()


def extreme_scale_every_impl(scale, negative=False, all_nan=None):
    """Every impl answers sm_scale ``scale`` as float64 does or gives NaN rows, flagged (all of them,
    where ``all_nan``)."""
    q, cache, idx = negative_scores_inputs() if negative else decode_inputs()[:3]
    want = reference.sparse_decode(q, cache, idx, sm_scale=scale)
    for impl in runnable_impls():
        errors.read()
        nan = right_or_nan(api.sparse_decode(q, cache, idx, sm_scale=scale, impl=impl), want, errors.read())
        assert all_nan is None or (nan == idx.shape[0] * q.shape[1]) == all_nan, (impl, nan)
    api.sparse_decode(q, cache, idx, sm_scale=scale, impl=DISPATCHER)  # its flags (if any) left for check_errors()


def merged_low_lse():
    """Both caches' lse near -1.8e27 (sm_scale 1e25, every score negative): SGLang's merge reads an lse
    <= -1e20 as "no token" and drops both. The lab's impls give the float64 answer; SGLang's own
    function (the baseline impl, SGLANG) gives NaN rows, flagged."""
    from .merged_decode import flash_mla_sparse_decode
    q, cache, idx = negative_scores_inputs()
    want = reference.flash_mla_sparse_decode(q, cache, idx[:, :4], sm_scale=1e25, extra_cache=cache,
                                             extra_indices=idx[:, 4:])
    assert float(want[1].max()) < -1e20
    for impl in runnable_impls():
        errors.read()
        got = flash_mla_sparse_decode(q, cache, idx[:, :4], None, None, HEAD_DIM, 1e25, cache, idx[:, 4:], impl=impl)
        nan = right_or_nan(got, want, errors.read())
        assert (nan > 0) == (impl == SGLANG), (impl, nan)


def indexer_flagged_every_impl(op, change):
    """``op`` with ``change`` applied to the indexer inputs: every impl flags INDEXER_NONFINITE."""
    for impl in runnable_impls(op):
        errors.read()
        indexer(op, impl=impl, change=change, **({"topk": 16} if op == "indexer_topk" else {}))
        assert errors.read() & errors.Flag.INDEXER_NONFINITE, impl
    indexer(op, change=change, **({"topk": 16} if op == "indexer_topk" else {}))   # left flagged


def nan_weight(a):
    a["weights"] = a["weights"].clone()
    a["weights"][1, 2] = math.nan
    return a


def no_requests(a):
    return {**a, **{k: a[k][:0] for k in ("q", "weights", "seq_lens", "page_table")}}


def huge_weights(a):
    return {**a, "weights": torch.full_like(a["weights"], 3e38)}


def then_checks_work(call):
    """``call`` raises; afterwards check_errors() still works (and finds nothing)."""
    errors.read()
    try:
        call()
    finally:
        errors.check_errors()


def meta_decode():
    q, cache, idx, _ = decode_inputs(dev="cpu")
    meta = C.KVCache(cache.buffer.to("meta"), cache.page_size, cache.num_tokens)
    return api.sparse_decode(q.to("meta"), meta, idx.to("meta"), impl=DISPATCHER)


def meta_indexer():
    a = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in indexer_inputs().items()}
    ic = a["index_cache"]
    a["index_cache"] = C.IndexKCache(ic.kv.to("meta"), ic.num_tokens, ic.page_size)
    return indexer("indexer_topk", change=lambda _: a, topk=16)


def compile_mode_call():
    """sparse_decode in a process started with DSV4LAB_MODE=compile: its error, raised here."""
    code = ("import dsv4lab, torch\nfrom dsv4lab import bad_input_calls\nq, c, i, _ = bad_input_calls.decode_inputs()\n"
            f"dsv4lab.sparse_decode(q, c, i, impl={MMA!r})")
    e = {k: v for k, v in os.environ.items() if k not in ("DSV4LAB_MODE", "TRITON_INTERPRET")}
    e.update(DSV4LAB_MODE="compile", PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                                 e.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)
    last = r.stderr.strip().splitlines()[-1]
    kind, _, msg = last.partition(": ")
    raise {"ValueError": ValueError}.get(kind, RuntimeError)(msg or last)


def empty_cache_all_padding():
    """Every impl answers an all-padding call on a cache with no token (out 0, lse -inf)."""
    q, cache, _, _ = decode_inputs()
    empty = C.KVCache(cache.buffer, cache.page_size, 0)
    idx = torch.full((2, 8), -1, dtype=_I32, device=q.device)
    for impl in runnable_impls():
        out, lse = api.sparse_decode(q, empty, idx, impl=impl)
        assert (out == 0).all() and (lse == -math.inf).all(), impl


def misaligned_pool():
    pool = torch.zeros(C.page_bytes(PAGE_SIZE) + 8, dtype=torch.uint8)
    return kvcache(pool[8:].view(1, -1))



def merged(**over):
    from .merged_decode import flash_mla_sparse_decode
    q, cache, idx, _ = decode_inputs()
    a = dict(q=q, k_cache=cache, indices=idx, topk_length=None, attn_sink=None, head_dim_v=HEAD_DIM, softmax_scale=None)
    a.update(over)
    return flash_mla_sparse_decode(**a)
