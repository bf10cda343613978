"""Argument contracts of the ops: what a call must pass, checked before anything launches.

Every entry point (dsv4lab.api, merged_decode) checks its arguments here, once, so a kernel never sees a
bad argument and a user never gets a crash deep inside Triton. Two modes, chosen per call with ``checks=``:

* ``"device"`` (the default): no host sync. Everything that does not need the data (types,
  shapes, dtypes, devices, scalars) is checked on the host and refused with a ValueError/TypeError
  that names the argument; values only the device can see never make a kernel read outside its
  buffers (an index past the cache is padding, a ``topk_len`` is clamped to [0, K], a seq_len to
  [0, max_seq_len], a live page id outside the cache ends its request's context), and each kind
  found sets a bit in the device's error word: :func:`dsv4lab.check_errors` raises naming them.
  Graph-safe: this is what runs inside a CUDA-graph capture.
* ``"sync"``: the same, after host checks of the data that name the offending value (a few host
  syncs per call). Under CUDA-graph capture, where nothing may sync, it runs as ``"device"``.

A device or mode the ops do not run in is refused before anything launches (:func:`check_device`).
"""
from __future__ import annotations

import math
import numbers

import torch

from . import errors
from .cache import IndexKCache, KVCache, int_arg, scale_bytes
from .config import DATA_BYTES, HEAD_DIM, INDEX_DIM, MAX_PACKED_SCALE_BYTE, NOPE_DIM

CHECKS = ("device", "sync")


def checks_mode(checks=None) -> str:
    """The mode a call runs in: ``checks`` ("device" or "sync"), default "device"."""
    if checks is None:
        return "device"
    if isinstance(checks, bool) or checks not in CHECKS:
        raise ValueError(f"checks must be one of {CHECKS}, got {checks!r}")
    return checks


def refuse_check_ranges(check_ranges):
    """``check_ranges=`` was the older spelling of ``checks=``: refused, naming the new one."""
    if check_ranges is not None:
        raise TypeError(f"check_ranges= is gone: pass checks='sync' (the data checked on the host, naming the "
                        f"offending value) or checks='device' (no host sync), got check_ranges={check_ranges!r}")


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _tensor(name, x, *, dim=None, dtypes=None, device=None, shape=None):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {list(x.shape)}")
    if shape is not None:
        for i, (got, want) in enumerate(zip(x.shape, shape)):
            if want is not None and got != want:
                want_s = ", ".join("*" if s is None else str(s) for s in shape)
                raise ValueError(f"{name} must have shape [{want_s}], got {list(x.shape)} (dim {i})")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if device is not None and x.device != device:
        raise ValueError(f"{name} must be on {device} (the cache's device), got {x.device}")


#: devices the ops run on in this process's mode (a set, not device.type: that costs ~0.4 us a call)
_RUNS_HERE: set = set()


def check_device(device: torch.device, name: str = "cache"):
    """Refuse, before anything launches or touches the error word, a device or a mode the ops cannot run
    in, in one line naming it: cuda mode runs on the current CUDA device, interpret mode (Triton's CPU
    interpreter) on CPU tensors, compile mode nowhere (kernels are compiled, never launched) except
    inside ``compile_report.planned_for``, which records the launches."""
    if device not in _RUNS_HERE:
        from . import device as dev
        m = dev.mode()
        if m == "compile":
            if dev._PLANNED:
                return
            raise ValueError("DSV4LAB_MODE=compile: dsv4lab's kernels are compiled for a GPU this machine lacks and "
                             "never run (compile_report.planned_for records their launches); unset DSV4LAB_MODE to run")
        want, where = ("cuda", "the GPU") if m == "cuda" else ("cpu", "Triton's CPU interpreter")
        if device.type != want:
            why = ", which holds no data" if device.type == "meta" else ""
            raise ValueError(f"{name} is on {device}{why}: in {m} mode ({where}) dsv4lab's ops take {want} tensors")
        _RUNS_HERE.add(device)
    if device.index is not None and device.index != torch._C._cuda_getDevice():
        raise ValueError(f"{name} is on {device} but the current CUDA device is cuda:{torch._C._cuda_getDevice()}: "
                         f"the kernels launch on the current device; call inside `with torch.cuda.device({device})`")


def softmax_scale(value, name: str = "sm_scale") -> float:
    """The softmax scale as a float: a finite positive real (Python or numpy int/float); None means
    1/sqrt(512). bool, tensors, NaN, inf and values <= 0 are refused."""
    if value is None:
        return HEAD_DIM ** -0.5
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive float (finite, > 0; a Python or numpy number), got "
                        f"{type(value).__name__} {value!r}" +
                        (": pass float(x) (a GPU tensor would need a host sync)" if isinstance(value, torch.Tensor) else ""))
    try:
        v = float(value)
    except OverflowError:                 # an int past float's range
        raise ValueError(f"{name} must be a positive float (finite, > 0), got an int of {int(value).bit_length()} "
                         f"bits, past float's range") from None
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive float (finite, > 0), got {value!r}")
    return v


_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
#: what check_sparse_decode_args calls the arguments in its messages unless told otherwise
_NAMES = {"cache": "cache", "indices": "indices", "topk_len": "topk_len", "sm_scale": "sm_scale"}


def check_sparse_decode_args(q, cache, indices, topk_len, sm_scale, attn_sink, checks="device",
                             max_scale_byte=None, *, names=None, empty_batch_ok=True):
    """Raise a ValueError/TypeError naming the argument, what was expected and what was given.
    ``checks``: "device" (no host sync: only what needs no data) or "sync" (also the data, naming the
    offending value; as "device" during CUDA-graph capture).
    ``max_scale_byte``: the impl's ``(B, H, K) -> largest scale byte it reads correctly, or None``
    (named in the message on a scale byte past the packers' limit). ``names``: what the caller calls
    ``cache``, ``indices``, ``topk_len`` and ``sm_scale`` (for the messages). B = 0 is accepted
    (``empty_batch_ok`` is kept for callers that pass it). Returns the softmax scale as a float."""
    mode = checks_mode(checks)
    n = {**_NAMES, **names} if names else _NAMES
    if not isinstance(cache, KVCache):
        raise TypeError(f"{n['cache']} must be a dsv4lab.cache.KVCache (from pack_kv), got {type(cache).__name__}")
    dev = cache.device
    check_device(dev, n["cache"])
    _tensor("q", q, dim=3, dtypes=_FLOATS, device=dev)
    B, H, D = q.shape
    if D != HEAD_DIM:
        raise ValueError(f"q must have shape [B, H, {HEAD_DIM}], got {list(q.shape)}")
    if H < 1 or (B < 1 and not empty_batch_ok):
        raise ValueError(f"q must have H >= 1 heads, got {list(q.shape)}")
    _tensor(n["indices"], indices, dim=2, dtypes=(torch.int32,), device=dev, shape=(B, None))
    if topk_len is not None:
        _tensor(n["topk_len"], topk_len, dim=1, dtypes=(torch.int32,), device=dev, shape=(B,))
    if attn_sink is not None:
        _tensor("attn_sink", attn_sink, dim=1, dtypes=_FLOATS, device=dev, shape=(H,))
    scale = softmax_scale(sm_scale, n["sm_scale"])
    if mode == "sync" and B > 0 and indices.shape[1] > 0 and not _capturing(q):
        _sync_decode_checks(q, cache, indices, topk_len, attn_sink, n,
                            max_scale_byte(B, H, indices.shape[1]) if max_scale_byte else None)
    return scale


def _first(mask: torch.Tensor) -> tuple:
    """The index of the first True of ``mask`` (a host sync)."""
    return tuple(int(v) for v in mask.nonzero()[0])


def _sync_decode_checks(q, cache, indices, topk_len, attn_sink, n, bits_limit):
    """The data checks of checks="sync", in the order a reader would fix them; each names the first
    offending value. Two host syncs when everything is in range."""
    B, H, _ = q.shape
    K = indices.shape[1]
    dev = q.device
    length = topk_len.clamp(0, K).long() if topk_len is not None else torch.full((B,), K, device=dev)
    prefix = torch.arange(K, device=dev)[None, :] < length[:, None]          # the entries a row reads
    bad = {
        "q": ~torch.isfinite(q),
        "topk_len": (topk_len < 0) | (topk_len > K) if topk_len is not None else None,
        "indices": prefix & (indices >= cache.num_tokens),
        "attn_sink": ~torch.isfinite(attn_sink) if attn_sink is not None else None,
    }
    read = prefix & (indices >= 0) & (indices < cache.num_tokens)
    if cache.num_tokens:
        bad["scale"], bad["bytes"] = _unpacked_bytes(cache, torch.where(read, indices, torch.zeros_like(indices)))
        bad["scale"] &= read[..., None]
        bad["bytes"] &= read[..., None]
    masks = {k: v for k, v in bad.items() if v is not None}
    hit = dict(zip(masks, torch.stack([m.any() for m in masks.values()]).tolist()))
    if hit.get("q"):
        i = _first(masks["q"])
        raise ValueError(f"q must be finite; q[{', '.join(map(str, i))}] = {float(q[i])}")
    if hit.get("topk_len"):
        (b,) = _first(masks["topk_len"])
        raise ValueError(f"{n['topk_len']} must lie in [0, K={K}]; {n['topk_len']}[{b}] = {int(topk_len[b])}")
    if hit.get("indices"):
        b, k = _first(masks["indices"])
        raise ValueError(f"{n['indices']} must be < {n['cache']}.num_tokens ({cache.num_tokens}) or < 0 for "
                         f"padding; {n['indices']}[{b}, {k}] = {int(indices[b, k])}")
    if hit.get("attn_sink"):
        (h,) = _first(masks["attn_sink"])
        raise ValueError(f"attn_sink must be finite (no sink for a head: pass attn_sink=None); "
                         f"attn_sink[{h}] = {float(attn_sink[h])}")
    if hit.get("scale"):
        b, k, g = _first(masks["scale"])
        tok = int(indices[b, k])
        byte = int(scale_bytes(cache, torch.tensor([tok]))[0, g])
        bits = (f"; this impl's launch at this shape (the 'bits' dequant) would give NaN there"
                if bits_limit is not None else "")
        raise ValueError(f"{n['cache']} scale bytes must be <= {MAX_PACKED_SCALE_BYTE} (scale 2^"
                         f"{MAX_PACKED_SCALE_BYTE - 127}, the largest the packers write); token {tok} "
                         f"({n['indices']}[{b}, {k}]) has {byte} in nope group {g}{bits}")
    if hit.get("bytes"):
        b, k, c = _first(masks["bytes"])
        what = f"an fp8 NaN byte at nope value {c}" if c < NOPE_DIM else f"a non-finite bf16 rope value at column {c}"
        raise ValueError(f"{n['cache']} holds bytes the packers never write: token {int(indices[b, k])} "
                         f"({n['indices']}[{b}, {k}]) has {what}")


def _unpacked_bytes(cache, ids):
    """Masks over the tokens ``ids`` (any shape) of what the packers never write: scale bytes > 134
    [..., 7], and [..., 512] fp8 NaN bytes (nope) / non-finite bf16 values (rope). Reads the raw bytes."""
    flat = ids.reshape(-1).long()
    ps = cache.page_size
    data = cache.buffer[:, : ps * DATA_BYTES].reshape(cache.num_pages, ps, DATA_BYTES)[flat // ps, flat % ps]
    nope_nan = (data[:, :NOPE_DIM] & 0x7F) == 0x7F
    rope_bad = (data[:, NOPE_DIM:].view(torch.int16) & 0x7F80) == 0x7F80        # exponent all ones
    values = torch.cat([nope_nan, rope_bad], dim=1).reshape(*ids.shape, HEAD_DIM)
    return scale_bytes(cache, ids) > MAX_PACKED_SCALE_BYTE, values


def check_sink(attn_sink, q, checks="device"):
    """attn_sink: [H] float, finite. "sync": checked on the data, naming the value; "device": a
    non-finite sink sets errors.Flag.SINK (no sync)."""
    H = q.shape[-2]
    _tensor("attn_sink", attn_sink, dim=1, dtypes=_FLOATS, device=q.device, shape=(H,))
    if checks_mode(checks) == "sync" and not _capturing(q):
        bad = ~torch.isfinite(attn_sink)
        if bool(bad.any()):
            (h,) = _first(bad)
            raise ValueError(f"attn_sink must be finite (no sink for a head: pass attn_sink=None); "
                             f"attn_sink[{h}] = {float(attn_sink[h])}")
    elif H:
        errors.set_flag(q.device, errors.Flag.SINK, ~torch.isfinite(attn_sink).all())


#: the longest context the indexer addresses: positions are int32
MAX_SEQ_LEN = 2**31 - 1


def check_indexer_args(q, index_cache, weights, seq_lens, page_table, max_seq_len, checks="device") -> int:
    """Raise a ValueError/TypeError naming the argument; returns max_seq_len as an int. ``checks``:
    "device" (no host sync) or "sync" (also seq_lens, the live page ids, finite q and weights and the
    live pages' bytes, naming the first offending value; as "device" during CUDA-graph capture)."""
    mode = checks_mode(checks)
    if not isinstance(index_cache, IndexKCache):
        raise TypeError(f"index_cache must be a dsv4lab.cache.IndexKCache (from pack_index_k), "
                        f"got {type(index_cache).__name__}")
    dev = index_cache.device
    check_device(dev, "index_cache")
    _tensor("q", q, dim=3, dtypes=_FLOATS + (torch.float8_e4m3fn,), device=dev)
    B, Hi, D = q.shape
    if D != INDEX_DIM or Hi < 1:
        raise ValueError(f"q must have shape [B, H_i >= 1, {INDEX_DIM}], got {list(q.shape)}")
    _tensor("weights", weights, dim=2, dtypes=_FLOATS, device=dev, shape=(B, Hi))
    _tensor("seq_lens", seq_lens, dim=1, dtypes=(torch.int32,), device=dev, shape=(B,))
    _tensor("page_table", page_table, dim=2, dtypes=(torch.int32,), device=dev, shape=(B, None))
    max_seq_len = int_arg("max_seq_len", max_seq_len, 1)
    if max_seq_len > MAX_SEQ_LEN:
        raise ValueError(f"max_seq_len must be at most 2**31 - 1 (positions are int32), got {max_seq_len}")
    ps = index_cache.page_size
    if page_table.shape[1] * ps < max_seq_len:
        raise ValueError(f"page_table must have at least ceil(max_seq_len/{ps}) = {-(-max_seq_len // ps)} "
                         f"columns, got {page_table.shape[1]}")
    if mode == "sync" and B > 0 and not _capturing(q):
        _sync_indexer_checks(q, index_cache, weights, seq_lens, page_table, max_seq_len)
    return max_seq_len


def _sync_indexer_checks(q, index_cache, weights, seq_lens, page_table, max_seq_len):
    ps = index_cache.page_size
    dev = q.device
    bad_len = (seq_lens < 0) | (seq_lens > max_seq_len)
    if bool(bad_len.any()):
        (b,) = _first(bad_len)
        raise ValueError(f"seq_lens must lie in [0, max_seq_len={max_seq_len}]; seq_lens[{b}] = {int(seq_lens[b])}")
    live = torch.arange(page_table.shape[1], device=dev)[None, :] < ((seq_lens.long() + ps - 1) // ps)[:, None]
    bad = live & ((page_table < 0) | (page_table >= index_cache.num_pages))
    if bool(bad.any()):
        b, p = _first(bad)
        raise ValueError(f"page_table[{b}, {p}] = {int(page_table[b, p])} is a live page of request {b} "
                         f"and must lie in [0, {index_cache.num_pages})")
    for name, x in (("q", q), ("weights", weights)):
        nonfinite = ~torch.isfinite(x.float())
        if bool(nonfinite.any()):
            i = _first(nonfinite)
            raise ValueError(f"{name} must be finite; {name}[{', '.join(map(str, i))}] = {float(x[i].float())}")
    pages = page_table[live].long().unique()
    raw = index_cache.kv.view(index_cache.num_pages, -1)[pages]                # [n, 64 x 132] bytes
    values, scales = raw[:, : ps * INDEX_DIM], raw[:, ps * INDEX_DIM:].contiguous().view(torch.float32)
    nan_byte = (values & 0x7F) == 0x7F
    if bool(nan_byte.any()) or not bool(torch.isfinite(scales).all()):
        i, j = _first(nan_byte) if bool(nan_byte.any()) else _first(~torch.isfinite(scales))
        what = (f"an fp8 NaN byte at token slot {j // INDEX_DIM}, value {j % INDEX_DIM}" if bool(nan_byte.any())
                else f"the scale {float(scales[i, j])} at token slot {j}")
        raise ValueError(f"index_cache page {int(pages[i])} (a live page) holds bytes the packer never writes: {what}")


#: the largest top-k the kernels can index: the positions and output slots are int32
MAX_TOPK = 2**31 - 1
#: a top-k may exceed max_seq_len by padding up to this many slots: the widest top-k of DeepSeek's
#: sparse attention (V3.2's 2048; DSv4's is 512), whatever the context
TOPK_PAD_LIMIT = 2048


def topk_arg(topk, max_seq_len: int) -> int:
    """``topk`` as a positive int of at most max(max_seq_len, TOPK_PAD_LIMIT): a row has max_seq_len
    positions and every slot past them is -1, so a larger top-k would only allocate padding (its
    output, and the top-k's candidates several times over)."""
    k = int_arg("topk", topk, 1)
    bound = max(max_seq_len, TOPK_PAD_LIMIT)
    if k > bound:
        raise ValueError(f"topk must be at most max(max_seq_len, {TOPK_PAD_LIMIT}) = {bound} (a row has max_seq_len "
                         f"positions; every slot past them would be -1 padding), got {k}")
    return k
