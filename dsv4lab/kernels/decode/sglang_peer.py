"""SGLang's production SIMT decode kernel, run as a peer on the lab's cache.

``_tiled_sparse_decode_kernel`` lives in ``sglang/kernels/ops/attention/
flash_mla_sm120_triton.py`` of the sglang 0.5.23 wheel. That file needs only
torch and triton, so we load it by path: ``import sglang`` would pull in the
whole serving stack. Install the wheel without its dependencies::

    pip install --no-deps sglang==0.5.23
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import os

import torch

from ... import errors
from ...config import DATA_BYTES, NOPE_DIM, ROPE_DIM
from ...device import is_interpret
from ...registry import register
from .. import guards

SGLANG_VERSION = "0.5.23"
#: SGLang's merge and sink take a partial whose lse is at or below this for one with no valid token
EMPTY_LSE = -1e20
_REL_PATH = ("kernels", "ops", "attention", "flash_mla_sm120_triton.py")
INTERPRET_BLOCK_T = 16   # the autotuner cannot run under the interpreter: one explicit tile


class SGLangMissing(ImportError):
    pass


def sglang_file() -> str:
    spec = importlib.util.find_spec("sglang")   # does not run sglang/__init__.py
    if spec is None or not spec.submodule_search_locations:
        raise SGLangMissing(
            f"sglang is not installed; the lab uses one file of its wheel. Install it with "
            f"`pip install --no-deps sglang=={SGLANG_VERSION}` (make test does this).")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, *_REL_PATH)
        if os.path.exists(path):
            return path
    raise SGLangMissing(f"sglang is installed but has no {'/'.join(_REL_PATH)}; "
                        f"install sglang=={SGLANG_VERSION} with --no-deps")


def unavailable_reason() -> str | None:
    """None when SGLang's kernel file can be loaded, else one line saying why and how to install it
    (for notebooks: show the line instead of running the SGLang cells)."""
    try:
        module()
    except SGLangMissing as e:
        return str(e)
    except Exception as e:  # a broken wheel: say what failed, not a traceback
        return f"sglang's {'/'.join(_REL_PATH)} fails to load ({type(e).__name__}: {e}); " \
               f"reinstall it with `pip install --no-deps sglang=={SGLANG_VERSION}`"
    return None


@functools.cache
def module():
    """SGLang's flash_mla_sm120_triton module, loaded by file path: the lab's private copy, whose
    ``_run_triton_sparse_decode`` (which SGLang's ``flash_mla_sparse_decode_triton`` calls per cache)
    takes its indices through the lab's device-side guard first (kernels.guards: an index past the
    cache becomes padding, topk_length is clamped, both flagged; no host sync), since SGLang's
    kernel trusts them, and its rows through the lab's non-finite contract (guards.peer_rows). SGLang's
    code itself runs unchanged."""
    path = sglang_file()
    spec = importlib.util.spec_from_file_location("dsv4lab_sglang_flash_mla_sm120_triton", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    original = mod._run_triton_sparse_decode

    def run_guarded(q, k_cache, indices, topk_length, softmax_scale):
        B = q.shape[0]
        idx, tlen = guards.sanitize_decode(indices.reshape(B, -1), None if topk_length is None else
                                           topk_length.contiguous(), None, k_cache.shape[0] * k_cache.shape[1])
        # SGLang's merge and sink then read an lse <= -1e20 as "no token": such rows are flagged NaN
        return guards.peer_rows(*original(q, k_cache, idx, tlen, softmax_scale), idx, tlen, empty_at=EMPTY_LSE)
    mod._run_triton_sparse_decode = run_guarded
    mod.unguarded_run_triton_sparse_decode = original
    return mod


@contextlib.contextmanager
def one_config_when_interpreting(mod=None):
    """Inside this block SGLang's autotuned kernel has a single config under the interpreter
    (which cannot time configs: with two or more the autotuner fails), so SGLang's own Python
    code around the kernel (its launch, LSE merge and sink) runs unchanged. On a GPU: no change.
    ``mod``: the loaded flash_mla_sm120_triton module whose kernel to restrict (default: this
    module's private copy, :func:`module`)."""
    kernel = (mod or module())._tiled_sparse_decode_kernel
    if not is_interpret():
        yield
        return
    saved = kernel.configs
    kernel.configs = [c for c in saved if c.kwargs.get("BLOCK_T") == INTERPRET_BLOCK_T][:1] or saved[:1]
    try:
        yield
    finally:
        kernel.configs = saved


def run(q, cache, indices, topk_len, sm_scale, empty_at=-math.inf):
    """Launch SGLang's kernel on q [B,H,512] and the lab's cache; returns (out, lse) [B,H,*]. Indices
    past cache.num_tokens become padding and topk_len is clamped first, on the device (kernels.guards);
    rows SGLang's kernel cannot compute come out NaN, flagged (guards.peer_rows: an lse at or below
    ``empty_at`` after reading a token is one)."""
    indices, topk_len = guards.sanitize_decode(indices, topk_len, None, cache.num_tokens)
    return guards.peer_rows(*_launch(q, cache, indices, topk_len, sm_scale), indices, topk_len, empty_at=empty_at)


def _launch(q, cache, indices, topk_len, sm_scale):
    mod = module()
    if not is_interpret():
        out, lse = mod.unguarded_run_triton_sparse_decode(q.unsqueeze(1), cache.k_cache, indices, topk_len, sm_scale)
        return out.squeeze(1), lse.squeeze(1)
    # Interpreter: the same launch as _run_triton_sparse_decode, minus the autotuner.
    k_cache = cache.k_cache
    B, H, D = q.shape
    page_bytes = k_cache.stride(0)
    raw = k_cache.as_strided((k_cache.shape[0] * page_bytes,), (1,)).view(torch.uint8)
    q3 = q.contiguous()
    out = torch.zeros(B, H, D, dtype=torch.bfloat16, device=q.device)
    lse = torch.full((B, H), float("-inf"), dtype=torch.float32, device=q.device)
    topk = indices.shape[1]
    mod._tiled_sparse_decode_kernel.fn[(B, H)](
        q3, raw.view(torch.float8_e4m3fn), raw, raw.view(torch.bfloat16), indices,
        topk_len if topk_len is not None else torch.empty(0, device=q.device, dtype=torch.int32),
        out, lse, sm_scale, k_cache.shape[1], int(page_bytes), int(k_cache.shape[1] * DATA_BYTES), H, topk,
        1 << (topk - 1).bit_length(), topk_len is not None,
        q3.stride(0), q3.stride(1), out.stride(0), out.stride(1), indices.stride(0),
        NOPE_PAD=512, ROPE_DIM=ROPE_DIM, NOPE_DIM_RT=NOPE_DIM, BLOCK_T=INTERPRET_BLOCK_T)
    return out, lse


@register("sparse_decode", "sglang", stage="S0", needs=("sglang",), tags=("recorded", "baseline", "whole_row"),
          available=unavailable_reason,
          description="SGLang 0.5.23's _tiled_sparse_decode_kernel (SIMT), from its wheel")
def sparse_decode_sglang(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    # SGLang's sink reads an lse <= -1e20 as "no token"
    out, lse = run(q, cache, indices, topk_len, sm_scale, EMPTY_LSE if attn_sink is not None else -math.inf)
    if attn_sink is not None:
        errors.set_flag(q.device, errors.Flag.SINK, ~torch.isfinite(attn_sink).all())
        # SGLang's _apply_attn_sink, on our [B,H] layout
        out4, lse3 = module()._apply_attn_sink(out.unsqueeze(1), lse.unsqueeze(1), attn_sink.float())
        out, lse = out4.squeeze(1), lse3.squeeze(1)
    return out, lse
