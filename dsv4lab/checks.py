"""Correctness on the GPU, as the recorded run checks it: every implementation against the float64
reference on odd shapes, CUDA-graph replay against eager calls, determinism over reruns, and the
"bits" dequant past its scale-byte limit. Each function returns rows (dicts with ``ok``); a
failing case is a row, never an exception, so a run keeps going and reports everything.
"""
from __future__ import annotations

import torch

from . import api, bench, errors, reference
from .cache import scale_view
from .config import PAGE_SIZE, WINDOW_PAGE_SIZE
from .kernels.decode import head_batched
from .registry import impl_info, registered
from .stages import stage
from .testing import (LSE_TOL, OUT_TOL, VS_SIMT_TOL, check_decode, make_decode_inputs, poisoned, rel_err)


def recorded() -> list[str]:
    """The decode impls the recorded run checks: the registry's tag "recorded", in the campaign's order."""
    return [i.name for i in registered(tag="recorded")]

# (B, H, K, context, page_size, pad_frac, topk_len, sink): odd sizes on purpose
CHECK_CASES = [
    (4, 64, 512, 8192, PAGE_SIZE, 0.0, False, False),
    (1, 64, 512, 8192, PAGE_SIZE, 0.3, True, True),
    (3, 8, 100, 300, WINDOW_PAGE_SIZE, 0.2, True, False),
    (2, 16, 77, 64, PAGE_SIZE, 0.1, False, True),      # one page, K not a multiple of the tile
    (5, 32, 512, 700, WINDOW_PAGE_SIZE, 0.0, True, True),
    (2, 64, 37, 50, PAGE_SIZE, 0.0, False, False),     # K smaller than a tile, one partial page
    (136, 64, 512, 1024, PAGE_SIZE, 0.1, True, True),  # more programs than SMs: mma takes its 64-head tiles
]


def against_reference(impls=None, cases=CHECK_CASES, log=print) -> list[dict]:
    """Every recorded impl (or ``impls``) against the float64 reference on each case; a tensor-core impl
    (tag "tensor_core") also against the lab's SIMT kernel (tagged as such), within the story's bound."""
    (simt,) = registered(tag="simt")
    rows = []
    for case in cases:
        B, H, K, ctx, ps, pad, tl_, sink = case
        inp = make_decode_inputs(B, H, K, context=ctx, page_size=ps, pad_frac=pad, topk_len=tl_,
                                 sink=sink, seed=hash(case) % 2**31)
        for impl in impls or recorded():
            try:
                e_out, e_lse = check_decode(impl, inp)
                row = dict(case=case, impl=impl, out_err=e_out, lse_err=e_lse, ok=e_out <= OUT_TOL and e_lse <= LSE_TOL)
                if "tensor_core" in impl_info("sparse_decode", impl).tags:
                    row["vs_simt_err"] = check_decode(impl, inp, against=simt.name)[0]
                    row["ok"] = row["ok"] and row["vs_simt_err"] <= VS_SIMT_TOL
            except Exception as e:  # record, don't stop the run
                row = dict(case=case, impl=impl, ok=False, error=repr(e)[:300])
            rows.append(row)
            log("check", row)
    return rows


def scale_byte_past_limit(log=print) -> list[dict]:
    """A UE8M0 scale byte past the "bits" dequant's limit in the default checks="device" mode (no host
    check of the bytes): the rows that read it come out NaN, flagged in the error word, never a wrong
    finite number (with "cvt": the right answer)."""
    impl = stage("S1best").decode_impl                                 # the tuned kernel, whole rows
    inp = make_decode_inputs(136, 64, 512, context=1024, seed=9)       # 64-head tiles
    tok = int(inp.indices[0, 0])
    ps = inp.cache.page_size
    scale_view(inp.cache)[tok // ps, tok % ps, 3] = 140
    bits = head_batched.max_scale_byte(head_batched.mma_launch(136, 64, 512)) is not None
    errors.read()
    with poisoned():
        out, _ = api.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl)
    flagged = bool(errors.read() & errors.Flag.NONFINITE)
    rest_ok = bool(torch.isfinite(out[1:].float()).all())
    if bits:
        ok = bool(torch.isnan(out[0].float()).all()) and rest_ok and flagged
    else:
        ro, _ = reference.sparse_decode(inp.q[:1], inp.cache, inp.indices[:1])
        ok = rel_err(out[:1].float(), ro) <= OUT_TOL and rest_ok
    row = dict(case="scale_byte_past_limit", impl=impl, dequant="bits" if bits else "cvt", ok=ok)
    log("scale byte 140", row)
    return [row]


def determinism(impls=None, reruns=20, log=print) -> list[dict]:
    """Bitwise the same output over ``reruns`` eager calls on the same inputs, and CUDA-graph
    replay bitwise equal to the eager call."""
    rows = []
    inp = make_decode_inputs(8, 64, 512, context=2048, topk_len=True, sink=True, seed=7)
    for impl in impls or recorded():
        fn = lambda: api.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs())  # noqa: E731
        try:
            first = fn()
            same_runs = all(torch.equal(first[0], o) and torch.equal(first[1], l)
                            for o, l in (fn() for _ in range(reruns - 1)))
            g, res = bench.capture(fn)
            g.replay()
            torch.cuda.synchronize()
            graph_same = torch.equal(res[0], first[0]) and torch.equal(res[1], first[1])
            row = dict(case="determinism", impl=impl, reruns=reruns, bitwise_reruns=bool(same_runs),
                       graph_replay_bitwise=bool(graph_same), ok=bool(same_runs and graph_same))
        except Exception as e:
            row = dict(case="determinism", impl=impl, ok=False, error=repr(e)[:300])
        rows.append(row)
        log("determinism", row)
    return rows


def decode_checks(log=print) -> list[dict]:
    return against_reference(log=log) + scale_byte_past_limit(log=log) + determinism(log=log)
