"""The lab's kernels inside SGLang 0.5.23's DeepSeek-V4 decode: :func:`patch`, :func:`unpatch`, :func:`patched`.

Two functions are replaced in the module objects SGLang itself uses (its ``sys.modules``
entries), so every caller inside SGLang sees the change:

* **decode**: ``_run_triton_sparse_decode`` in ``sglang.kernels.ops.attention.flash_mla_sm120_triton``.
  SGLang's ``flash_mla_sparse_decode_triton`` calls it once for the sliding-window cache and once
  for the compressed cache, then merges the two by LSE and applies the attention sink; the merge
  and the sink stay SGLang's. It becomes :func:`lab_sparse_decode` (the registry's dispatcher,
  ``auto``: on an sm_90 GPU the Hopper kernel from B = 8 for the compressed cache's 512 tokens and
  from B = 64 for the window's 128, else split-K with tiles and NSPLIT by shape).
* **indexer**: ``fp8_paged_mqa_logits_torch_sm120`` in ``sglang.srt.layers.attention.dsv4.indexer``,
  the indexer's CUDA-graph-safe torch fallback (it scores the maximum context every step). It
  becomes :func:`lab_paged_mqa_logits`, the lab's Triton indexer (it reads live pages only).

SGLang looks both names up in their module at every call (``flash_mla_sparse_decode_triton``
reads the module global; the indexer's forward picks ``fn = fp8_paged_mqa_logits_torch_sm120``
each step), so replacing the module attribute reaches every caller, whenever it was imported.

Contracts kept: shapes, dtypes, natural-log LSE, -inf LSE and 0 output on a row with no valid
token, -inf logits past a request's length, and no host sync: the replacements read no device
data on the host (``checks="device"``), so they run eagerly and under CUDA-graph capture alike.
Arguments the lab's kernels do not take (another cache layout, int64 indices, more than 128
indexer heads, ...) go to SGLang's original function; the first such call of each function is
logged (logger ``dsv4lab.integrations.sglang``), and :func:`calls` counts both routes.

Where the modules come from (:func:`decode_module`, :func:`indexer_module`): the ``sys.modules``
entry when SGLang has imported them; otherwise, in a process that has imported ``sglang``, a
normal import; otherwise (SGLang installed with ``--no-deps``, nothing imported it: this lab)
the decode module's one file is loaded by path under its own dotted name and registered in
``sys.modules`` *without* its parent packages, and the indexer is left alone (its module
imports much of SGLang's server). No stand-in parent packages are created: an empty ``sglang``
package in ``sys.modules`` would hide the real one from a later ``import sglang``, while the
leaf on its own is found by any later import of its dotted name (``from ... import`` and
``importlib.import_module`` look in ``sys.modules`` first), so a server started afterwards in
this process uses the patched module. The module stays loaded after :func:`unpatch`.

The lab's impl of SGLang's kernel (tag "peer") keeps running SGLang's original code while patched: it
uses its own copy of the file, loaded under a private name (``kernels.decode.sglang_peer.module()``).
"""
from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.util
import logging
import math
import numbers
import sys

import torch

from .. import api
from ..cache import IndexKCache, as_kv_cache
from ..config import HEAD_DIM, INDEX_DIM, INDEX_TOKEN_BYTES, PAGE_SIZE
from ..kernels.decode import sglang_peer
from ..kernels.indexer import triton_indexer as indexer
from ..registry import registered

PACKAGE = "sglang"                     # in sys.modules once anything in this process imported SGLang
DECODE_MODULE = f"{PACKAGE}.kernels.ops.attention.flash_mla_sm120_triton"
DECODE_FUNCTION = "_run_triton_sparse_decode"
INDEXER_MODULE = f"{PACKAGE}.srt.layers.attention.dsv4.indexer"
INDEXER_FUNCTION = "fp8_paged_mqa_logits_torch_sm120"

_ORIGINAL = "__dsv4lab_original__"     # set on a replacement: the function it replaced
_log = logging.getLogger(__name__)
_installed: list = []                  # (module, attribute name) pairs patch() replaced
_calls: collections.Counter = collections.Counter()
_warned: set = set()


class NotSupported(ValueError):
    """Arguments the lab's kernel does not take; the patched function hands them to SGLang's."""


# ---- the replacements: SGLang's contracts on the lab's kernels ----

def lab_sparse_decode(q, k_cache, indices, topk_length, softmax_scale):
    """SGLang's ``_run_triton_sparse_decode`` on the lab's dispatcher (the fastest kernel per shape).

    q [B, 1, H, 512] (bf16; fp16/fp32 too), k_cache SGLang's fp8 (or uint8) page view
    [num_pages, page_size, 1, 584] (DSv4's layout, read in place), indices [B, ...] int32 token ids
    (flattened to [B, K], -1 = padding), topk_length [B] int32 or None, softmax_scale a float ->
    (out bf16 [B, 1, H, 512], lse float32 [B, 1, H]): natural-log LSE, -inf and out 0 on a row
    with no valid token. B = 0 gives empty outputs (SGLang's own function cannot take it).
    Raises :class:`NotSupported` for anything else. Reads no device data on the host
    (``checks="device"``): no sync, so CUDA-graph capture works, and SGLang's own function does
    not check ranges either; out-of-range indices are not caught, and where the launch dequantizes
    with integer ops (a tile entry's "bits") a UE8M0 scale byte above 134 gives NaN in the outputs
    that read it (an fp8 group with |x| > 2^7 * 448), never a wrong number.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[1] != 1 or q.shape[3] != HEAD_DIM:
        raise NotSupported(f"q must be [B, 1, H, {HEAD_DIM}], got {_shape(q)}")
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise NotSupported(f"q must be bf16/fp16/fp32, got {q.dtype}")
    try:
        cache = as_kv_cache(k_cache)
    except (TypeError, ValueError) as e:
        raise NotSupported(str(e)) from None
    B, _, H, _ = q.shape
    if H < 1:
        raise NotSupported("q has no head (H = 0)")
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32 or indices.dim() < 2 \
            or indices.shape[0] != B:
        raise NotSupported(f"indices must be int32 [B={B}, ...], got {_shape(indices)} {getattr(indices, 'dtype', '')}")
    if topk_length is not None and (not isinstance(topk_length, torch.Tensor) or topk_length.dtype != torch.int32
                                    or tuple(topk_length.shape) != (B,)):
        raise NotSupported(f"topk_length must be None or int32 [{B}], got {_shape(topk_length)}")
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real) or not softmax_scale > 0:
        raise NotSupported(f"softmax_scale must be a positive float, got {softmax_scale!r}")
    if any(t.device != q.device for t in (cache.buffer, indices) + ((topk_length,) if topk_length is not None else ())):
        raise NotSupported("q, k_cache, indices and topk_length must share a device")
    if B == 0:
        return (torch.zeros(0, 1, H, HEAD_DIM, dtype=torch.bfloat16, device=q.device),
                torch.full((0, 1, H), -math.inf, dtype=torch.float32, device=q.device))
    flat = indices.reshape(B, -1)
    if flat.shape[1] == 0:
        raise NotSupported("indices have no column (K = 0)")
    (dispatcher,) = registered(tag="dispatcher")
    out, lse = api.sparse_decode(q[:, 0], cache, flat, topk_len=topk_length, sm_scale=float(softmax_scale),
                                 impl=dispatcher.name, checks="device")
    return out.unsqueeze(1), lse.unsqueeze(1)


def lab_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                         clean_logits=True):
    """SGLang's ``fp8_paged_mqa_logits_torch_sm120`` on the lab's Triton indexer.

    q_fp8 [B, 1, H, 128] float8_e4m3fn (or bf16), H <= 128; kvcache_fp8 the contiguous indexer
    cache [num_pages, 64, 1, 132] (64 x 128 fp8 values | 64 fp32 scales per page; uint8 or fp8);
    weight [B, H] float; seq_lens [B] or [B, 1] integer; page_table [B, >= ceil(max_seq_len / 64)]
    integer; max_seq_len an int -> logits float32 [B, max_seq_len], -inf at positions >= seq_lens[b].
    ``deep_gemm_metadata`` is unused (as in SGLang's fallback); ``clean_logits`` must be False
    (SGLang's fallback asserts it). Only each request's live pages are read, and no device data
    on the host (graph-safe). The products are exact in fp32 where SGLang's bmm rounds each score
    to bf16, so near-ties in the top-k may resolve differently. Raises :class:`NotSupported`
    for anything else.
    """
    if clean_logits:
        raise NotSupported("clean_logits=True (SGLang's fallback takes False only)")
    if not isinstance(q_fp8, torch.Tensor) or q_fp8.dim() != 4 or q_fp8.shape[1] != 1 or q_fp8.shape[3] != INDEX_DIM:
        raise NotSupported(f"q must be [B, 1, H, {INDEX_DIM}], got {_shape(q_fp8)}")
    if q_fp8.dtype not in (torch.float8_e4m3fn, torch.bfloat16):
        raise NotSupported(f"q must be float8_e4m3fn or bf16, got {q_fp8.dtype}")
    B, _, H, _ = q_fp8.shape
    if H > 128:
        raise NotSupported(f"the Triton indexer takes at most 128 heads, got {H}")
    kv = kvcache_fp8
    if not isinstance(kv, torch.Tensor) or kv.dim() != 4 or tuple(kv.shape[1:]) != (PAGE_SIZE, 1, INDEX_TOKEN_BYTES) \
            or kv.dtype not in (torch.uint8, torch.float8_e4m3fn) or not kv.is_contiguous():
        raise NotSupported(f"kvcache must be a contiguous uint8/fp8 [num_pages, {PAGE_SIZE}, 1, {INDEX_TOKEN_BYTES}], "
                           f"got {_shape(kv)} {getattr(kv, 'dtype', '')}")
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (B, H) or not weight.is_floating_point():
        raise NotSupported(f"weight must be float [{B}, {H}], got {_shape(weight)}")
    if not isinstance(seq_lens, torch.Tensor) or tuple(seq_lens.shape) not in ((B,), (B, 1)) \
            or seq_lens.dtype not in (torch.int32, torch.int64):
        raise NotSupported(f"seq_lens must be int32/int64 [{B}] or [{B}, 1], got {_shape(seq_lens)}")
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, numbers.Integral) or max_seq_len < 1:
        raise NotSupported(f"max_seq_len must be a positive int, got {max_seq_len!r}")
    if not isinstance(page_table, torch.Tensor) or page_table.dim() != 2 or page_table.shape[0] != B \
            or page_table.dtype not in (torch.int32, torch.int64) or page_table.shape[1] * PAGE_SIZE < max_seq_len:
        raise NotSupported(f"page_table must be int32/int64 [{B}, >= {-(-max_seq_len // PAGE_SIZE)}], "
                           f"got {_shape(page_table)}")
    if any(t.device != q_fp8.device for t in (kv, weight, seq_lens, page_table)):
        raise NotSupported("q, kvcache, weight, seq_lens and page_table must share a device")
    if B == 0:
        return torch.full((0, int(max_seq_len)), -math.inf, dtype=torch.float32, device=q_fp8.device)
    cache = IndexKCache(kv.view(torch.uint8), kv.shape[0] * PAGE_SIZE)
    return indexer.logits_triton(q_fp8[:, 0].contiguous(), cache, weight.contiguous(),
                                 seq_lens.reshape(B).to(torch.int32).contiguous(),
                                 page_table.to(torch.int32).contiguous(), int(max_seq_len))


def _shape(x):
    return list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


def _routed(name, lab_fn, original):
    """SGLang's ``original`` replaced: arguments go to ``lab_fn``, or to ``original`` where the lab's
    kernel does not take them."""
    def replacement(*args, **kwargs):
        try:
            result = lab_fn(*args, **kwargs)
        except NotSupported as e:
            _calls[name + ":sglang"] += 1
            if name not in _warned:
                _warned.add(name)
                _log.warning("dsv4lab: SGLang's %s runs its own code for these arguments (%s)", name, e)
            return original(*args, **kwargs)
        _calls[name + ":lab"] += 1
        return result
    replacement.__name__ = original.__name__
    replacement.__qualname__ = original.__qualname__
    replacement.__doc__ = f"dsv4lab's {lab_fn.__name__}, in place of SGLang's {original.__name__} (dsv4lab.integrations.sglang)."
    setattr(replacement, _ORIGINAL, original)
    return replacement


# ---- SGLang's modules ----

def decode_module():
    """``sglang.kernels.ops.attention.flash_mla_sm120_triton`` as SGLang uses it (see the module
    docstring for where it comes from)."""
    mod = sys.modules.get(DECODE_MODULE)
    if mod is not None:
        return mod
    if PACKAGE in sys.modules:
        return importlib.import_module(DECODE_MODULE)
    spec = importlib.util.spec_from_file_location(DECODE_MODULE, sglang_peer.sglang_file())
    mod = importlib.util.module_from_spec(spec)
    sys.modules[DECODE_MODULE] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[DECODE_MODULE]
        raise
    return mod


def indexer_module():
    """``sglang.srt.layers.attention.dsv4.indexer`` where SGLang has imported it or can import it
    (a process that has imported ``sglang``), else None."""
    mod = sys.modules.get(INDEXER_MODULE)
    if mod is not None or PACKAGE not in sys.modules:
        return mod
    return importlib.import_module(INDEXER_MODULE)


# ---- patch / unpatch ----

def patch() -> dict:
    """Route SGLang's DSv4 sparse decode, and its indexer's torch fallback where its module is
    there (see :func:`indexer_module`), to the lab's kernels. Idempotent: a second call changes
    nothing. Takes no arguments, so it can be an SGLang plugin entry point (docs/sglang.md).
    Returns which module each replacement went into: ``{"decode": name, "indexer": name or None}``."""
    dec = decode_module()
    _install(dec, DECODE_FUNCTION, "decode", lab_sparse_decode)
    try:
        idx = indexer_module()
    except ImportError as e:
        _log.warning("dsv4lab: SGLang's indexer module cannot be imported (%s); its fallback is not patched", e)
        idx = None
    if idx is not None:
        _install(idx, INDEXER_FUNCTION, "indexer", lab_paged_mqa_logits)
    return {"decode": dec.__name__, "indexer": None if idx is None else idx.__name__}


def _install(mod, attr, name, lab_fn):
    current = getattr(mod, attr)
    if hasattr(current, _ORIGINAL):
        return                                   # ours already
    setattr(mod, attr, _routed(name, lab_fn, current))
    _installed.append((mod, attr))


def unpatch() -> None:
    """Put SGLang's own functions (the same objects) back; nothing to do when not patched. A
    replacement that someone else has since wrapped or replaced is left alone (logged)."""
    while _installed:
        mod, attr = _installed.pop()
        current = getattr(mod, attr)
        if hasattr(current, _ORIGINAL):
            setattr(mod, attr, getattr(current, _ORIGINAL))
        else:
            _log.warning("dsv4lab: %s.%s was replaced after patch(); left as it is", mod.__name__, attr)


def is_patched() -> bool:
    return bool(_installed)


@contextlib.contextmanager
def patched():
    """``with patched(): ...`` runs the block patched, and restores the state it found (a
    process that was patched before the block stays patched)."""
    was = is_patched()
    try:
        yield patch()
    finally:
        if not was:
            unpatch()


def calls() -> dict:
    """How many calls each replacement sent to the lab's kernel (``"decode:lab"``,
    ``"indexer:lab"``) and to SGLang's own code (``"decode:sglang"``, ``"indexer:sglang"``),
    since the process started. Counted on the host: a CUDA graph replay is not a call."""
    return dict(_calls)
