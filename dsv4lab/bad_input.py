"""Bad input and what it gets: every kind of unusual or wrong argument the lab has been tried with,
as data, and the README table rendered from it.

Each :class:`Case` names a public entry point, the bad input, the mode it runs in (``checks=``,
see dsv4lab.contracts) and what the caller gets: an exception whose message contains ``says``, or an
answer (``gets``), checked by the case itself. ``tests/test_bad_input.py`` runs every case and
checks that README.md's section equals :func:`render`, so the table cannot go stale
(``python -m dsv4lab readme`` rewrites it). Shapes are tiny: the whole table runs in seconds
through Triton's CPU interpreter.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from . import api, cache as C, errors, reference
from .device import mode as dsv4lab_mode, torch_device
from .errors import DeviceInputError
from .registry import impls
from .testing import OUT_TOL, negative_scores_inputs, rel_err, right_or_nan, runnable_impls, strided_view


@dataclass(frozen=True)
class Case:
    entry: str                     # the public entry point
    bad: str                       # the bad input, in words
    checks: str                    # the mode it was tried in: "device", "sync" or "either"
    run: Callable[[], object]      # makes the call; checks the answer itself where there is one
    raises: type | None = None     # what the call (for a device-mode flag: check_errors()) raises
    says: str = ""                 # ... with this in its message
    gets: str = ""                 # the answer, in words (answered cases, and device-mode flags)

    def outcome(self) -> str:
        err = f"`{self.raises.__name__}`: {self.says}" if self.raises else ""
        if self.gets and err:
            return f"{self.gets}; `check_errors()` raises {err}"
        return self.gets or err


# ---- tiny deterministic inputs ----

def _decode_inputs(B=2, H=4, K=8, tokens=32, page_size=16, seed=0, dev=None):
    """q [B, H, 512] bf16, a cache of ``tokens`` random tokens, indices = token ids 0 .. B*K-1 in order, a sink."""
    g = torch.Generator().manual_seed(seed)
    dev = dev or torch_device()
    cache = C.pack_kv(torch.randn(tokens, 512, generator=g).to(dev), page_size)
    q = torch.randn(B, H, 512, generator=g).to(torch.bfloat16).to(dev)
    idx = torch.arange(B * K, dtype=torch.int32).reshape(B, K).to(dev)
    return q, cache, idx, torch.randn(H, generator=g).to(dev)


def _decode(impl="mma", checks=None, change=lambda a: a, dev=None, **kw):
    """sparse_decode on the tiny inputs after ``change(args dict)``."""
    q, cache, idx, _ = _decode_inputs(dev=dev)
    a = change(dict(q=q, cache=cache, indices=idx, **kw))
    return api.sparse_decode(a.pop("q"), a.pop("cache"), a.pop("indices"), impl=impl, checks=checks, **a)


def _agrees(got, q, cache, idx, topk_len=None, sink=None, scale=None):
    """(out, lse) ``got`` matches the float64 reference on the given (sanitized) arguments."""
    ro, rl = reference.sparse_decode(q, cache, idx, topk_len, scale, sink)
    e = rel_err(got[0].float(), ro), rel_err(got[1], rl)
    assert e[0] <= OUT_TOL and e[1] <= 1e-3, f"errors {e} against the reference"
    return got


def _flagged(call):
    """Device mode: the call answers (and checks its answer), then check_errors() raises."""
    errors.read()
    call()
    errors.check_errors()


def _same_as_contiguous(impl, **strided):
    """The call with strided views of some arguments gives bitwise the answer of contiguous copies."""
    q, cache, idx, sink = _decode_inputs()
    args = dict(q=q, indices=idx, attn_sink=sink, topk_len=torch.tensor([5, 8], dtype=torch.int32, device=q.device))
    views = {k: strided_view(v, strided[k]) if k in strided else v for k, v in args.items()}
    a = api.sparse_decode(views.pop("q"), cache, views.pop("indices"), impl=impl, **views)
    b = api.sparse_decode(args.pop("q"), cache, args.pop("indices"), impl=impl, **args)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "strided views read differently"


def _set_scale_byte(cache, token, group, byte):
    C.scale_view(cache)[token // cache.page_size, token % cache.page_size, group] = byte


def _with_bad_cache(edit, **kw):
    q, cache, idx, _ = _decode_inputs()
    edit(cache)
    return api.sparse_decode(q, cache, idx, **kw), (q, cache, idx)


def _indexer_inputs(seq=(70, 10), table=((1, 0), (0, -1)), B=2, H=4, max_seq_len=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    dev = torch_device()
    ic = C.pack_index_k(torch.randn(128, 128, generator=g).to(dev))
    q = torch.randn(B, H, 128, generator=g).to(torch.bfloat16).to(dev)
    w = torch.randn(B, H, generator=g).to(dev)
    seq_lens = torch.tensor(seq, dtype=torch.int32, device=dev)
    pt = torch.tensor(table, dtype=torch.int32, device=dev)
    return dict(q=q, index_cache=ic, weights=w, seq_lens=seq_lens, page_table=pt, max_seq_len=max_seq_len)


def _indexer(op="indexer_logits", impl="triton", checks=None, change=lambda a: a, **kw):
    a = change({**_indexer_inputs(), **kw})
    fn = getattr(api, op)
    return fn(a.pop("q"), a.pop("index_cache"), a.pop("weights"), a.pop("seq_lens"), a.pop("page_table"),
              impl=impl, checks=checks, **a)


def _logits_agree(impl, got_seq, got_table, **kw):
    """The impl's logits on the given inputs equal the reference's on the sanitized (seq, table)."""
    a = {**_indexer_inputs(), **kw}
    got = api.indexer_logits(a["q"], a["index_cache"], a["weights"], a["seq_lens"], a["page_table"],
                             max_seq_len=a["max_seq_len"], impl=impl)
    seq = torch.tensor(got_seq, dtype=torch.int32, device=got.device)
    table = torch.tensor(got_table, dtype=torch.int32, device=got.device)
    ref = reference.indexer_logits(a["q"], a["index_cache"], a["weights"], seq, table, a["max_seq_len"])
    assert rel_err(got, ref) <= 1e-4, rel_err(got, ref)


def _cli(args, env=None):
    """Run ``python -m dsv4lab args`` in a process of its own (the mode is decided once per process, and
    the CLI is what a user starts): (exit status, stderr lines). ``env``: variables to set there."""
    e = {k: v for k, v in os.environ.items() if k not in ("DSV4LAB_MODE", "TRITON_INTERPRET")}
    e.update(env or {})
    e["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent), e.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "dsv4lab", *args], capture_output=True, text=True, env=e, timeout=300)
    return r.returncode, r.stderr.strip().splitlines()


def _exits_2_with(args, says, env=None):
    code, lines = _cli(args, env)
    assert code == 2 and len(lines) == 1 and says in lines[0], (code, lines)


def _empty(result, *shapes):
    got = result if isinstance(result, tuple) else (result,)
    assert [list(t.shape) for t in got] == [list(s) for s in shapes], [list(t.shape) for t in got]


_I32 = torch.int32
_SINK_NAN = "attn_sink must be finite (no sink for a head: pass attn_sink=None); attn_sink[1] = nan"


def _tl(*v):
    return torch.tensor(v, dtype=_I32, device=torch_device())


def _sink_with(v):
    s = _decode_inputs()[3].clone()
    s[1] = v
    return s


def _nan_sink_answer():
    out, lse = _decode(attn_sink=_sink_with(math.nan))
    assert torch.isnan(out[:, 1].float()).all() and torch.isfinite(out[:, [0, 2, 3]].float()).all()


def _q_with_inf(a):
    a["q"] = a["q"].clone()
    a["q"][0, 0, 0] = math.inf
    return a


def _index_past(a, value=40):
    a["indices"] = a["indices"].clone()
    a["indices"][0, 1] = value
    return a


def _index_past_answer():
    q, cache, idx, _ = _decode_inputs()
    bad = idx.clone()
    bad[0, 1] = 40
    got = api.sparse_decode(q, cache, bad, impl="auto")
    idx[0, 1] = -1
    _agrees(got, q, cache, idx)


def _topk_len_answer():
    q, cache, idx, _ = _decode_inputs()
    got = api.sparse_decode(q, cache, idx, topk_len=_tl(-3, 9), impl="simt")
    _agrees(got, q, cache, idx, topk_len=_tl(0, 8))


def _negative_index_answer():
    q, cache, idx, _ = _decode_inputs()
    bad = idx.clone()
    bad[1, 2] = -7
    got = api.sparse_decode(q, cache, bad, impl="mma")
    bad[1, 2] = -1
    _agrees(got, q, cache, bad)


def _duplicate_index_answer():
    q, cache, idx, _ = _decode_inputs()
    idx[:, 1:] = idx[:, :1]
    _agrees(api.sparse_decode(q, cache, idx, impl="splitk"), q, cache, idx)


def _k0_answer():
    q, cache, idx, sink = _decode_inputs()
    out, lse = api.sparse_decode(q, cache, idx[:, :0], attn_sink=sink, impl="auto")
    assert (out == 0).all() and torch.equal(lse, sink[None].expand(2, 4).float())


def _scale_byte_device_answer():
    from .kernels.decode import head_batched
    q, cache, idx, _ = _decode_inputs()
    _set_scale_byte(cache, 0, 3, 140)
    errors.read()
    got = api.sparse_decode(q, cache, idx, impl="mma")
    if head_batched.max_scale_byte(head_batched.mma_launch(2, 4, 8)) is None:
        _agrees(got, q, cache, idx)                   # "cvt" (the interpreter's) reads 2^13 exactly
    else:                                             # "bits": NaN in the row that reads it, flagged
        assert torch.isnan(got[0][0].float()).all() and errors.read() & errors.Flag.NONFINITE


def _nan_byte(cache):
    cache.buffer[0, 3] = 0x7F                         # token 0, nope value 3: e4m3 NaN


def _nan_byte_device_answer():
    """Not looked at: whatever the launch's dequant makes of the byte. NaN rows (the GPU's conversion
    instructions) are flagged; the interpreter's conversion and the "bits" dequant read 480 x scale."""
    errors.read()
    got, _ = _with_bad_cache(_nan_byte, impl="mma")
    rows = torch.isnan(got[0].float()).flatten(1).any(1)
    assert torch.isfinite(got[0][1].float()).all()
    assert bool(rows[0]) == bool(errors.read() & errors.Flag.NONFINITE)


def _sm_scale_numpy():
    q, cache, idx, _ = _decode_inputs()
    _agrees(api.sparse_decode(q, cache, idx, sm_scale=np.float32(0.05), impl="mma"), q, cache, idx, scale=0.05)


def _page_cut_answer():
    # request 0 has 70 tokens on pages [1, -1]: cut at its second page, 64 positions are left
    _logits_agree("triton", (64, 10), ((1, 0), (0, 0)), page_table=_tl2(((1, -1), (0, -1))))


def _tl2(rows):
    return torch.tensor(rows, dtype=_I32, device=torch_device())


def _dead_pages_answer():
    junk = _tl2(((1, 0, 7), (0, 10**9, -5)))          # past the live pages: never read
    for impl in ("torch_fp32", "torch_bf16", "triton", "reference"):
        a = {**_indexer_inputs(), "page_table": junk}
        got = api.indexer_logits(a["q"], a["index_cache"], a["weights"], a["seq_lens"], junk,
                                 max_seq_len=128, impl=impl)
        ref = reference.indexer_logits(a["q"], a["index_cache"], a["weights"], a["seq_lens"], junk, 128)
        assert rel_err(got, ref) <= 5e-3, impl


def _seq_len_answer():
    _logits_agree("triton", (128, 0), ((1, 0), (0, -1)), seq_lens=_tl(200, -4))


def _strided_seq_lens():
    a = _indexer_inputs()
    seq = strided_view(a["seq_lens"])
    got = api.indexer_logits(a["q"], a["index_cache"], strided_view(a["weights"], 1), seq, a["page_table"],
                             max_seq_len=128, impl="triton")
    ref = reference.indexer_logits(a["q"], a["index_cache"], a["weights"], a["seq_lens"], a["page_table"], 128)
    assert rel_err(got, ref) <= 1e-4


def _topk_numpy():
    top = _indexer("indexer_topk", topk=np.int32(16), max_seq_len=np.int64(128))
    assert top.shape == (2, 16) and (top[1, 10:] == -1).all() and (top[1, :10] >= 0).all()


def _kvcache(buffer, page_size=64, num_tokens=64):
    return C.KVCache(buffer, page_size, num_tokens)


def _runs_missing():
    from . import runs
    runs.load("no_such_part")


def _shapes_bad_mode():
    from . import config
    config.shapes("gpu")


def _nan_q_every_impl():
    """q[0, 1] holds a NaN: that row is NaN in out and lse for every impl, the others answered, flagged."""
    q, cache, idx, _ = _decode_inputs()
    q = q.clone()
    q[0, 1, 3] = math.nan
    for impl in runnable_impls():
        errors.read()
        got = api.sparse_decode(q, cache, idx, impl=impl)
        assert right_or_nan(got, reference.sparse_decode(q, cache, idx), errors.read()) == 1, impl
    api.sparse_decode(q, cache, idx, impl="auto")                 # its flag left for check_errors()


def _extreme_scale_every_impl(scale, negative=False, all_nan=None):
    """Every impl answers sm_scale ``scale`` as float64 does or gives NaN rows, flagged (all of them,
    where ``all_nan``)."""
    q, cache, idx = negative_scores_inputs() if negative else _decode_inputs()[:3]
    want = reference.sparse_decode(q, cache, idx, sm_scale=scale)
    for impl in runnable_impls():
        errors.read()
        nan = right_or_nan(api.sparse_decode(q, cache, idx, sm_scale=scale, impl=impl), want, errors.read())
        assert all_nan is None or (nan == idx.shape[0] * q.shape[1]) == all_nan, (impl, nan)
    api.sparse_decode(q, cache, idx, sm_scale=scale, impl="auto")  # its flags (if any) left for check_errors()


def _merged_low_lse():
    """Both caches' lse near -1.8e27 (sm_scale 1e25, every score negative): SGLang's merge reads an lse
    <= -1e20 as "no token" and drops both. The lab's impls give the float64 answer; SGLang's own
    function (impl='sglang') gives NaN rows, flagged."""
    from .merged_decode import flash_mla_sparse_decode
    q, cache, idx = negative_scores_inputs()
    want = reference.flash_mla_sparse_decode(q, cache, idx[:, :4], sm_scale=1e25, extra_cache=cache,
                                             extra_indices=idx[:, 4:])
    assert float(want[1].max()) < -1e20
    for impl in runnable_impls():
        errors.read()
        got = flash_mla_sparse_decode(q, cache, idx[:, :4], None, None, 512, 1e25, cache, idx[:, 4:], impl=impl)
        nan = right_or_nan(got, want, errors.read())
        assert (nan > 0) == (impl == "sglang"), (impl, nan)


def _indexer_flagged_every_impl(op, change):
    """``op`` with ``change`` applied to the indexer inputs: every impl flags INDEXER_NONFINITE."""
    for impl in runnable_impls(op):
        errors.read()
        _indexer(op, impl=impl, change=change, **({"topk": 16} if op == "indexer_topk" else {}))
        assert errors.read() & errors.Flag.INDEXER_NONFINITE, impl
    _indexer(op, impl="triton", change=change, **({"topk": 16} if op == "indexer_topk" else {}))   # left flagged


def _nan_weight(a):
    a["weights"] = a["weights"].clone()
    a["weights"][1, 2] = math.nan
    return a


def _huge_weights(a):
    return {**a, "weights": torch.full_like(a["weights"], 3e38)}


def _then_checks_work(call):
    """``call`` raises; afterwards check_errors() still works (and finds nothing)."""
    errors.read()
    try:
        call()
    finally:
        errors.check_errors()


def _meta_decode():
    q, cache, idx, _ = _decode_inputs(dev="cpu")
    meta = C.KVCache(cache.buffer.to("meta"), cache.page_size, cache.num_tokens)
    return api.sparse_decode(q.to("meta"), meta, idx.to("meta"), impl="auto")


def _meta_indexer():
    a = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in _indexer_inputs().items()}
    ic = a["index_cache"]
    a["index_cache"] = C.IndexKCache(ic.kv.to("meta"), ic.num_tokens, ic.page_size)
    return _indexer("indexer_topk", change=lambda _: a, topk=16)


def _compile_mode_call():
    """sparse_decode in a process started with DSV4LAB_MODE=compile: its error, raised here."""
    code = ("import dsv4lab, torch\nfrom dsv4lab import bad_input\nq, c, i, _ = bad_input._decode_inputs()\n"
            "dsv4lab.sparse_decode(q, c, i, impl='mma')")
    e = {k: v for k, v in os.environ.items() if k not in ("DSV4LAB_MODE", "TRITON_INTERPRET")}
    e.update(DSV4LAB_MODE="compile", PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                                 e.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)
    last = r.stderr.strip().splitlines()[-1]
    kind, _, msg = last.partition(": ")
    raise {"ValueError": ValueError}.get(kind, RuntimeError)(msg or last)


def _empty_cache_all_padding():
    """Every impl answers an all-padding call on a cache with no token (out 0, lse -inf)."""
    q, cache, _, _ = _decode_inputs()
    empty = C.KVCache(cache.buffer, cache.page_size, 0)
    idx = torch.full((2, 8), -1, dtype=_I32, device=q.device)
    for impl in runnable_impls():
        out, lse = api.sparse_decode(q, empty, idx, impl=impl)
        assert (out == 0).all() and (lse == -math.inf).all(), impl


def _misaligned_pool():
    pool = torch.zeros(C.page_bytes(64) + 8, dtype=torch.uint8)
    return _kvcache(pool[8:].view(1, -1))


_SAYS_INDEX = errors.MEANING[errors.Flag.INDEX]
_SAYS_TOPK = errors.MEANING[errors.Flag.TOPK_LEN]

CASES: list[Case] = [
    # ---- sparse_decode: the arguments, checked without reading data ----
    Case("sparse_decode", "q is a list", "either", lambda: _decode(change=lambda a: {**a, "q": a["q"].tolist()}),
         TypeError, "q must be a torch.Tensor, got list"),
    Case("sparse_decode", "q [B, H, 500]", "either", lambda: _decode(change=lambda a: {**a, "q": a["q"][..., :500]}),
         ValueError, "q must have shape [B, H, 512], got [2, 4, 500]"),
    Case("sparse_decode", "q float64", "either", lambda: _decode(change=lambda a: {**a, "q": a["q"].double()}),
         TypeError, "q must have dtype in ['torch.bfloat16', 'torch.float16', 'torch.float32'], got torch.float64"),
    Case("sparse_decode", "q with no heads, [2, 0, 512]", "either",
         lambda: _decode(change=lambda a: {**a, "q": a["q"][:, :0]}), ValueError, "q must have H >= 1 heads"),
    Case("sparse_decode", "q on another device than the cache", "either",
         lambda: _decode(change=lambda a: {**a, "q": a["q"].to("meta")}, dev="cpu"), ValueError,
         "q must be on cpu (the cache's device), got meta"),
    Case("sparse_decode", "the cache's byte tensor instead of a KVCache", "either",
         lambda: _decode(change=lambda a: {**a, "cache": a["cache"].buffer}), TypeError,
         "cache must be a dsv4lab.cache.KVCache (from pack_kv), got Tensor"),
    Case("sparse_decode", "indices int64", "either", lambda: _decode(change=lambda a: {**a, "indices": a["indices"].long()}),
         TypeError, "indices must have dtype in ['torch.int32'], got torch.int64"),
    Case("sparse_decode", "indices for another batch size, [1, 8]", "either",
         lambda: _decode(change=lambda a: {**a, "indices": a["indices"][:1]}), ValueError,
         "indices must have shape [2, *], got [1, 8] (dim 0)"),
    Case("sparse_decode", "topk_len int64", "either", lambda: _decode(topk_len=torch.tensor([1, 1])), TypeError,
         "topk_len must have dtype in ['torch.int32'], got torch.int64"),
    Case("sparse_decode", "attn_sink for 3 heads of 4", "either", lambda: _decode(attn_sink=torch.zeros(3)), ValueError,
         "attn_sink must have shape [4], got [3] (dim 0)"),
    Case("sparse_decode", "sm_scale NaN", "either", lambda: _decode(sm_scale=math.nan), ValueError,
         "sm_scale must be a positive float (finite, > 0), got nan"),
    Case("sparse_decode", "sm_scale inf", "either", lambda: _decode(sm_scale=math.inf), ValueError,
         "sm_scale must be a positive float (finite, > 0), got inf"),
    Case("sparse_decode", "sm_scale 0", "either", lambda: _decode(sm_scale=0), ValueError,
         "sm_scale must be a positive float (finite, > 0), got 0"),
    Case("sparse_decode", "sm_scale True", "either", lambda: _decode(sm_scale=True), TypeError,
         "sm_scale must be a positive float (finite, > 0; a Python or numpy number), got bool True"),
    Case("sparse_decode", "sm_scale a 0-d tensor", "either", lambda: _decode(sm_scale=torch.tensor(0.05)), TypeError,
         "pass float(x) (a GPU tensor would need a host sync)"),
    Case("sparse_decode", "sm_scale numpy.float32(0.05)", "either", _sm_scale_numpy,
         gets="accepted: the same answer as 0.05"),
    Case("sparse_decode", "impl='fast'", "either", lambda: _decode(impl="fast"), ValueError,
         f"impl must be one of {impls('sparse_decode')}, got 'fast'"),   # the registry's names
    Case("sparse_decode", "checks='fast'", "either", lambda: _decode(checks="fast"), ValueError,
         "checks must be one of ('device', 'sync'), got 'fast'"),
    Case("sparse_decode", "check_ranges=True (the older spelling of checks=)", "either",
         lambda: _decode(check_ranges=True), TypeError,
         "check_ranges= is gone: pass checks='sync' (the data checked on the host, naming the offending value) "
         "or checks='device' (no host sync), got check_ranges=True"),
    # ---- sparse_decode: shapes that are legal but unusual ----
    Case("sparse_decode", "an empty batch, q [0, 4, 512], indices [0, 8]", "either",
         lambda: _empty(_decode(change=lambda a: {**a, "q": a["q"][:0], "indices": a["indices"][:0]}),
                        (0, 4, 512), (0, 4)),
         gets="out [0, 4, 512], lse [0, 4]"),
    Case("sparse_decode", "K = 0 index columns, with a sink", "either", _k0_answer,
         gets="out 0, lse = the sink (-inf without one)"),
    Case("sparse_decode", "strided views of q, indices, topk_len and attn_sink", "either",
         lambda: _same_as_contiguous("mma", q=1, indices=1, topk_len=0, attn_sink=0),
         gets="read with their strides: bitwise the answer for contiguous copies"),
    Case("sparse_decode", "a negative index other than -1 (-7)", "either", _negative_index_answer,
         gets="padding, like -1"),
    Case("sparse_decode", "the same token several times in a row", "either", _duplicate_index_answer,
         gets="each entry counts (as the reference)"),
    # ---- sparse_decode: values only the device sees ----
    Case("sparse_decode", "an index >= cache.num_tokens", "sync", lambda: _decode(checks="sync", change=_index_past),
         ValueError, "indices must be < cache.num_tokens (32) or < 0 for padding; indices[0, 1] = 40"),
    Case("sparse_decode", "an index >= cache.num_tokens", "device", lambda: _flagged(_index_past_answer),
         DeviceInputError, _SAYS_INDEX, gets="the entry is read as padding"),
    Case("sparse_decode", "topk_len 9 with K = 8", "sync", lambda: _decode(checks="sync", topk_len=_tl(9, 1)),
         ValueError, "topk_len must lie in [0, K=8]; topk_len[0] = 9"),
    Case("sparse_decode", "topk_len -3 and 9 with K = 8", "device", lambda: _flagged(_topk_len_answer),
         DeviceInputError, _SAYS_TOPK, gets="clamped to 0 and 8"),
    Case("sparse_decode", "a NaN attn_sink", "sync", lambda: _decode(checks="sync", attn_sink=_sink_with(math.nan)),
         ValueError, _SINK_NAN),
    Case("sparse_decode", "a NaN attn_sink", "device", lambda: _flagged(_nan_sink_answer),
         DeviceInputError, errors.MEANING[errors.Flag.SINK], gets="that head's rows are NaN"),
    Case("sparse_decode", "q holding inf", "sync", lambda: _decode(checks="sync", change=_q_with_inf), ValueError,
         "q must be finite; q[0, 0, 0] = inf"),
    Case("sparse_decode", "a cache scale byte 140 (the packers write <= 134)", "sync",
         lambda: _with_bad_cache(lambda c: _set_scale_byte(c, 0, 3, 140), checks="sync"), ValueError,
         "cache scale bytes must be <= 134 (scale 2^7, the largest the packers write); token 0 (indices[0, 0]) "
         "has 140 in nope group 3"),
    Case("sparse_decode", "a cache scale byte 140", "device", _scale_byte_device_answer,
         gets="not looked at: a 'cvt' launch reads 2^13 (this table's run); the GPU's 'bits' launches give NaN "
              "rows, flagged as a non-finite output"),
    Case("sparse_decode", "an fp8 NaN byte in a cached token", "sync",
         lambda: _with_bad_cache(_nan_byte, checks="sync"), ValueError,
         "cache holds bytes the packers never write: token 0 (indices[0, 0]) has an fp8 NaN byte at nope value 3"),
    Case("sparse_decode", "an fp8 NaN byte in a cached token", "device", _nan_byte_device_answer,
         gets="not looked at: the GPU's conversion instructions make the rows that read it NaN (flagged as a "
              "non-finite output); the interpreter and the 'bits' dequant read the byte as 480 x its scale"),
    # ---- flash_mla_sparse_decode (SGLang's arguments) ----
    Case("flash_mla_sparse_decode", "head_dim_v 256", "either", lambda: _merged(head_dim_v=256), ValueError,
         "head_dim_v must be 512 (K = V in DSv4's MLA), got 256"),
    Case("flash_mla_sparse_decode", "extra_k_cache without extra_indices", "either",
         lambda: _merged(extra_k_cache=_decode_inputs()[1]), ValueError,
         "extra_k_cache and extra_indices go together: pass both or neither"),
    Case("flash_mla_sparse_decode", "an fp8 page view with the wrong page stride", "either",
         lambda: _merged(k_cache=_decode_inputs(tokens=128, page_size=64)[1].buffer.view(torch.float8_e4m3fn)
                         .as_strided((2, 64, 1, 584), (64 * 584, 584, 584, 1))), ValueError,
         "k_cache must be the view SGLang builds over pages of 37440 bytes"),
    # ---- the indexer ----
    Case("indexer_logits", "seq_lens[0] = 129 > max_seq_len", "sync",
         lambda: _indexer(checks="sync", seq_lens=_tl(129, 10)), ValueError,
         "seq_lens must lie in [0, max_seq_len=128]; seq_lens[0] = 129"),
    Case("indexer_logits", "seq_lens 200 and -4, max_seq_len 128", "device", lambda: _flagged(_seq_len_answer),
         DeviceInputError, errors.MEANING[errors.Flag.SEQ_LEN], gets="clamped to 128 and 0"),
    Case("indexer_logits", "a live page id -1", "sync",
         lambda: _indexer(checks="sync", page_table=_tl2(((1, -1), (0, -1)))), ValueError,
         "page_table[0, 1] = -1 is a live page of request 0 and must lie in [0, 2)"),
    Case("indexer_logits", "a live page id -1", "device", lambda: _flagged(_page_cut_answer), DeviceInputError,
         errors.MEANING[errors.Flag.PAGE], gets="the request ends before that page (-inf from there)"),
    Case("indexer_logits", "page-table entries past the live pages holding junk (-5, 10^9)", "either",
         _dead_pages_answer, gets="never read, by every impl"),
    Case("indexer_logits", "max_seq_len True", "either", lambda: _indexer(max_seq_len=True), TypeError,
         "max_seq_len must be a positive int, got bool True"),
    Case("indexer_logits", "max_seq_len 0", "either", lambda: _indexer(max_seq_len=0), ValueError,
         "max_seq_len must be a positive int, got 0"),
    Case("indexer_logits", "a page table too narrow for max_seq_len 200", "either", lambda: _indexer(max_seq_len=200),
         ValueError, "page_table must have at least ceil(max_seq_len/64) = 4 columns, got 2"),
    Case("indexer_logits", "weights holding NaN", "sync",
         lambda: _indexer(checks="sync", weights=torch.full((2, 4), math.nan, device=torch_device())), ValueError,
         "weights must be finite; weights[0, 0] = nan"),
    Case("indexer_logits", "q float32 for impl='triton'", "either",
         lambda: _indexer(change=lambda a: {**a, "q": a["q"].float()}), TypeError,
         "impl='triton' takes q in bfloat16 or float8_e4m3fn"),
    Case("indexer_logits", "strided views of seq_lens and weights", "either", _strided_seq_lens,
         gets="read with their strides"),
    Case("indexer_logits", "an empty batch", "either",
         lambda: _empty(_indexer(change=lambda a: {**a, **{k: a[k][:0] for k in ("q", "weights", "seq_lens", "page_table")}}),
                        (0, 128)), gets="logits [0, max_seq_len]"),
    Case("indexer_topk", "topk 0", "either", lambda: _indexer("indexer_topk", topk=0), ValueError,
         "topk must be a positive int, got 0"),
    Case("indexer_topk", "topk 2**31 - 1 with max_seq_len 128", "either",
         lambda: _indexer("indexer_topk", topk=2**31 - 1), ValueError,
         "topk must be at most max(max_seq_len, 2048) = 2048 (a row has max_seq_len positions; every slot past "
         "them would be -1 padding), got 2147483647"),
    Case("indexer_topk", "topk 2**28 (a GiB of output slots a request)", "either",
         lambda: _indexer("indexer_topk", topk=2**28), ValueError,
         "topk must be at most max(max_seq_len, 2048) = 2048"),
    Case("indexer_topk", "topk numpy.int32(16), max_seq_len numpy.int64(128)", "either", _topk_numpy,
         gets="accepted as ints"),
    # ---- the cache packers ----
    Case("cache.pack_kv", "a NaN value", "either",
         lambda: C.pack_kv(torch.zeros(2, 512).index_fill_(1, torch.tensor([5]), math.nan)), ValueError,
         "kv must be finite (as float32); the fp8 cache cannot store NaN or inf: kv[row 0, column 5] = nan"),
    Case("cache.pack_kv", "a nope value 1e5 (past 448 x 2^7)", "either",
         lambda: C.pack_kv(torch.zeros(2, 512).index_fill_(1, torch.tensor([7]), 1e5)), ValueError,
         "kv nope values must satisfy |x| <= 57344"),
    Case("cache.pack_kv", "a rope value 3.4e38 (finite in float32, past bf16)", "either",
         lambda: C.pack_kv(torch.zeros(2, 512).index_fill_(1, torch.tensor([500]), 3.4e38)), ValueError,
         "kv rope values (columns 448..511) are stored in bf16 and must satisfy |x| <= 3.39e+38"),
    Case("cache.pack_kv", "no token, [0, 512]", "either", lambda: C.pack_kv(torch.zeros(0, 512)), ValueError,
         "kv must hold at least one token, got N=0"),
    Case("cache.pack_kv", "page_size True", "either", lambda: C.pack_kv(torch.zeros(2, 512), True), TypeError,
         "page_size must be a positive int, got bool True"),
    Case("cache.pack_kv", "page_size numpy.int64(16)", "either",
         lambda: _empty(C.pack_kv(torch.zeros(2, 512), np.int64(16)).buffer, (1, C.page_bytes(16))),
         gets="accepted as an int"),
    Case("cache.pack_index_k", "an inf value", "either",
         lambda: C.pack_index_k(torch.zeros(2, 128).index_fill_(1, torch.tensor([1]), math.inf)), ValueError,
         "k must be finite (as float32)"),
    Case("cache.KVCache", "num_tokens past the pages that exist", "either",
         lambda: _kvcache(torch.zeros(1, C.page_bytes(64), dtype=torch.uint8), num_tokens=200), ValueError,
         "KVCache.num_tokens (200) must be <= num_pages x page_size (1 x 64 = 64)"),
    Case("cache.KVCache", "a page buffer whose rows are not contiguous", "either",
         lambda: _kvcache(torch.zeros(2, 2 * C.page_bytes(64), dtype=torch.uint8)[:, ::2]), ValueError,
         "KVCache.buffer must be row-contiguous"),
    Case("cache.IndexKCache", "a strided page view", "either",
         lambda: C.IndexKCache(torch.zeros(4, 64, 1, 132, dtype=torch.uint8)[::2], 64), ValueError,
         "IndexKCache.kv must be contiguous"),
    Case("cache.dequant_kv", "a token id past the cache", "either",
         lambda: C.dequant_kv(C.pack_kv(torch.zeros(4, 512)), torch.tensor([4])), ValueError,
         "token_ids must lie in [0, 4), got range [4, 4]"),
    # ---- what cannot be computed: one non-finite contract for every impl ----
    Case("sparse_decode", "q holding NaN in one row, every impl", "device", lambda: _flagged(_nan_q_every_impl),
         DeviceInputError, "an output row came out NaN or inf",
         gets="that row NaN in out and lse (never lse -inf), the others answered"),
    Case("sparse_decode", "sm_scale 1e-300 (below float32's smallest), every impl", "device",
         lambda: _extreme_scale_every_impl(1e-300), gets="the float64 answer (every score ~0: a uniform average), "
         "or NaN rows, flagged (the GPU's folded-scale launches with padding)"),
    Case("sparse_decode", "sm_scale 1e38 (scores past float32), every impl", "device",
         lambda: _flagged(lambda: _extreme_scale_every_impl(1e38, all_nan=True)), DeviceInputError,
         "an output row came out NaN or inf, or could not be computed", gets="every row NaN in out and lse"),
    Case("sparse_decode", "sm_scale 1e30 with every score negative (all below the running max's start), "
         "every impl", "device", lambda: _extreme_scale_every_impl(1e30, negative=True),
         gets="the float64 answer (the reference) or NaN rows, flagged (the kernels): never out 0 with lse -inf"),
    Case("flash_mla_sparse_decode", "both caches' lse near -1.8e27 (sm_scale 1e25, every score negative), "
         "every impl", "device", _merged_low_lse,
         gets="the float64 answer; impl='sglang' (SGLang's merge drops an lse <= -1e20) NaN rows, flagged"),
    Case("indexer_topk", "a NaN weight, every impl", "device",
         lambda: _flagged(lambda: _indexer_flagged_every_impl("indexer_topk", _nan_weight)), DeviceInputError,
         errors.MEANING[errors.Flag.INDEXER_NONFINITE], gets="a top-k"),
    Case("indexer_logits", "a NaN weight, every impl", "device",
         lambda: _flagged(lambda: _indexer_flagged_every_impl("indexer_logits", _nan_weight)), DeviceInputError,
         "indexer: non-finite q or weights", gets="the logits the arithmetic gives (NaN in that row)"),
    Case("indexer_topk", "weights 3e38 (the logits overflow), every impl", "device",
         lambda: _flagged(lambda: _indexer_flagged_every_impl("indexer_topk", _huge_weights)), DeviceInputError,
         "a live position's logit that came out NaN or inf", gets="a top-k"),
    # ---- devices and modes the ops do not run in ----
    Case("sparse_decode", "every tensor on the meta device (then check_errors(): clean, as before)", "either",
         lambda: _then_checks_work(_meta_decode), ValueError,
         "cache is on meta, which holds no data: in interpret mode (Triton's CPU interpreter) dsv4lab's ops take "
         "cpu tensors" if dsv4lab_mode() == "interpret" else "cache is on meta, which holds no data"),
    Case("indexer_topk", "every tensor on the meta device (then check_errors(): clean)", "either",
         lambda: _then_checks_work(_meta_indexer), ValueError, "index_cache is on meta, which holds no data"),
    Case("sparse_decode", "a call in DSV4LAB_MODE=compile", "either", _compile_mode_call, ValueError,
         "DSV4LAB_MODE=compile: dsv4lab's kernels are compiled for a GPU this machine lacks and never run"),
    # ---- sizes and storage that cannot work ----
    Case("sparse_decode", "sm_scale 10**400 (a Python int past float)", "either",
         lambda: _decode(sm_scale=10**400), ValueError,
         "sm_scale must be a positive float (finite, > 0), got an int of 1329 bits, past float's range"),
    Case("sparse_decode", "all padding on a cache with no token (num_tokens 0), every impl", "either",
         _empty_cache_all_padding, gets="out 0, lse -inf (impl='reference' too)"),
    Case("indexer_logits", "max_seq_len 2**31", "either", lambda: _indexer(max_seq_len=2**31), ValueError,
         "max_seq_len must be at most 2**31 - 1 (positions are int32), got 2147483648"),
    Case("cache.pack_kv", "page_size 2**40", "either", lambda: C.pack_kv(torch.zeros(2, 512), 2**40), ValueError,
         "page_size must be at most 2**31 - 1 (token indices are int32), got 1099511627776"),
    Case("cache.pack_kv", "page_size 2**30 for 2 tokens", "either", lambda: C.pack_kv(torch.zeros(2, 512), 2**30),
         ValueError, "pack_kv would allocate 584 GiB (1 page(s) of 1073741824 tokens x 584 bytes for 2 tokens)"),
    Case("cache.KVCache", "a page buffer 8 bytes into a byte pool", "either", _misaligned_pool, ValueError,
         "KVCache.buffer must start at a 16-byte aligned address (the kernels read 16-byte vectors)"),
    # ---- environment, command line, recorded data ----
    Case("import dsv4lab / CLI", "DSV4LAB_MODE=tpu", "either",
         lambda: _exits_2_with(["info"], "dsv4lab: DSV4LAB_MODE must be 'cuda', 'interpret' or 'compile', got 'tpu'",
                               {"DSV4LAB_MODE": "tpu"}),
         gets="exit status 2 and one line on stderr: dsv4lab: DSV4LAB_MODE must be 'cuda', 'interpret' or "
              "'compile', got 'tpu' (in Python: `ModeError`, one line in Jupyter)"),
    Case("CLI", "python -m dsv4lab bench decode --batch 0", "either",
         lambda: _exits_2_with(["bench", "decode", "--batch", "0"], "argument --batch: must be an int >= 1, got 0"),
         gets="exit status 2 and one line on stderr: argument --batch: must be an int >= 1, got 0 (see --help)"),
    Case("config.shapes", "mode 'gpu'", "either", _shapes_bad_mode, ValueError,
         "mode must be 'cuda', 'interpret' or 'compile' (dsv4lab.device.mode()), got 'gpu'"),
    Case("runs.load", "a part no run recorded", "either", _runs_missing, FileNotFoundError,
         "run 'h200' has no part 'no_such_part'"),
]


def _merged(**over):
    from .merged_decode import flash_mla_sparse_decode
    q, cache, idx, _ = _decode_inputs()
    a = dict(q=q, k_cache=cache, indices=idx, topk_length=None, attn_sink=None, head_dim_v=512, softmax_scale=None)
    a.update(over)
    return flash_mla_sparse_decode(**a)


def render() -> str:
    """The README's table of :data:`CASES`."""
    lines = ["| # | entry point | bad input | checks | what it gets |", "|---|---|---|---|---|"]
    for i, c in enumerate(CASES, 1):
        cells = [str(i), f"`{c.entry}`", c.bad, c.checks, c.outcome()]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)
