"""The lab's entry points: argument checks, then dispatch on ``impl``.

Every implementation of a stage registers itself here with :func:`register`; the checks live once,
in this file, so a kernel never sees a bad argument and a user never gets a crash deep inside
Triton. Registration wraps each implementation in its op's guard (empty batches, strided views),
so code that calls a registered function directly gets the same treatment.

Two modes, chosen per call with ``checks=``:

* ``"device"`` (the default): no host sync. Everything that does not need the data (types,
  shapes, dtypes, devices, scalars) is checked on the host and refused with a ValueError/TypeError
  that names the argument; values only the device can see never make a kernel read outside its
  buffers (an index past the cache is padding, a ``topk_len`` is clamped to [0, K], a seq_len to
  [0, max_seq_len], a live page id outside the cache ends its request's context), and each kind
  found sets a bit in the device's error word: :func:`dsv4lab.check_errors` raises naming them.
  Graph-safe: this is what runs inside a CUDA-graph capture.
* ``"sync"``: the same, after host checks of the data that name the offending value (a few host
  syncs per call). Under CUDA-graph capture, where nothing may sync, it runs as ``"device"``.

Either way, every impl of an op keeps one non-finite contract: what it cannot compute it flags and
gives as NaN (a decode row's out and lse), never a plausible answer (:func:`peer_rows` keeps it for
code the lab does not own). A device or mode the ops do not run in is refused before anything
launches (:func:`check_device`). Concurrent callers: dsv4lab.concurrency.
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Callable

import torch

from . import concurrency, errors, reference
from .cache import (DATA_BYTES, HEAD_DIM, INDEX_DIM, MAX_PACKED_SCALE_BYTE, NOPE_DIM, IndexKCache, KVCache,
                    int_arg, scale_bytes)


@dataclass(frozen=True)
class Impl:
    """One registered implementation of an op: what ``impl=`` names, and its properties."""
    op: str
    name: str
    fn: Callable                     # the implementation inside its op's guard (see register)
    stage: str = ""                  # the campaign stage it stands for (S0..S4); "" for references
    description: str = ""
    needs: tuple = ()                # what it needs beyond the lab: "sglang" (its wheel), "gpu"
    graph_safe: bool = True          # captures in a CUDA graph (no host sync, shapes-only launches)
    max_scale_byte: Callable | None = None   # (B, H, K) -> largest UE8M0 scale byte it reads right, or None
    reads_dead_pages: bool = False   # indexer: gathers every page-table entry, not only the live ones
    guards_inputs: bool = False      # indexer: clamps seq_lens, cuts at a bad live page id and flags both itself
    prepare: Callable | None = None  # indexer_topk: (checked args, max_seq_len, topk) -> a callable for
                                     # later calls of the same signature, or None (api.prepared_calls)


OPS = ("sparse_decode", "indexer_logits", "indexer_topk")
CHECKS = ("device", "sync")
_IMPLS: dict[str, dict[str, Impl]] = {op: {} for op in OPS}


def register(op: str, name: str, **props):
    """Decorator: register ``fn`` as implementation ``name`` of ``op`` (props: the Impl fields).
    The function takes the op's checked arguments (see the reference registered for the op); the
    registry holds it inside the op's guard (``Impl.fn``), which handles an empty batch (and, for the
    decode, K = 0) without calling it, and hands it tensors it may index as contiguous."""
    if op not in _IMPLS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")

    def deco(fn):
        guard = _decode_entry if op == "sparse_decode" else functools.partial(
            _indexer_entry, op=op, dead_pages=props.get("reads_dead_pages", False),
            guarded=props.get("guards_inputs", False))
        _IMPLS[op][name] = Impl(op, name, guard(fn), **props)
        return fn
    return deco


def impls(op: str = "sparse_decode") -> list[str]:
    """Names accepted by ``impl=`` for ``op``."""
    _load_kernels()
    if op not in _IMPLS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return sorted(_IMPLS[op])


def impl_info(op: str, name: str) -> Impl:
    """The registered :class:`Impl` ``name`` of ``op``."""
    return _pick(op, name)


_LOADED = []


def _load_kernels():
    if not _LOADED:
        from . import kernels  # noqa: F401  (importing registers the implementations)
        _LOADED.append(True)


def _pick(op, impl) -> Impl:
    _load_kernels()
    table = _IMPLS[op]
    if not isinstance(impl, str) or impl not in table:
        raise ValueError(f"impl must be one of {sorted(table)}, got {impl!r}")
    return table[impl]


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def checks_mode(checks=None, check_ranges=None) -> str:
    """The mode a call runs in: ``checks`` ("device" or "sync"), or the older spelling
    ``check_ranges`` (True: "sync", False: "device"); default "device"."""
    if check_ranges is not None:
        if not isinstance(check_ranges, bool):
            raise TypeError(f"check_ranges must be True or False, got {check_ranges!r}")
        if checks is not None and checks != ("sync" if check_ranges else "device"):
            raise ValueError(f"checks={checks!r} contradicts check_ranges={check_ranges} (the older spelling "
                             f"of checks='sync' / 'device'): pass one of them")
        return "sync" if check_ranges else "device"
    if checks is None:
        return "device"
    if checks not in CHECKS:
        raise ValueError(f"checks must be one of {CHECKS}, got {checks!r}")
    return checks


def _mode(checks) -> str:
    """Accepts a mode name or the older bool (True: "sync")."""
    if isinstance(checks, bool):
        return "sync" if checks else "device"
    return checks_mode(checks)


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
    offending value; as "device" during CUDA-graph capture); True / False are the older spelling.
    ``max_scale_byte``: the impl's ``(B, H, K) -> largest scale byte it reads correctly, or None``
    (named in the message on a scale byte past the packers' limit). ``names``: what the caller calls
    ``cache``, ``indices``, ``topk_len`` and ``sm_scale`` (for the messages). B = 0 is accepted
    (``empty_batch_ok`` is kept for callers that pass it). Returns the softmax scale as a float."""
    mode = _mode(checks)
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
    non-finite sink sets errors.Flag.SINK (no sync). True / False: the older spelling of the modes."""
    H = q.shape[-2]
    _tensor("attn_sink", attn_sink, dim=1, dtypes=_FLOATS, device=q.device, shape=(H,))
    if _mode(checks) == "sync" and not _capturing(q):
        bad = ~torch.isfinite(attn_sink)
        if bool(bad.any()):
            (h,) = _first(bad)
            raise ValueError(f"attn_sink must be finite (no sink for a head: pass attn_sink=None); "
                             f"attn_sink[{h}] = {float(attn_sink[h])}")
    elif H:
        errors.set_flag(q.device, errors.Flag.SINK, ~torch.isfinite(attn_sink).all())


def sparse_decode(q, cache, indices, *, topk_len=None, sm_scale=None, attn_sink=None,
                  impl: str = "reference", checks: str | None = None, check_ranges: bool | None = None):
    """Sparse MLA decode: (out bf16 [B,H,512], lse float32 [B,H]).

    ``impl`` names the implementation (see ``dsv4lab.impls()``); all share the semantics of
    :func:`dsv4lab.reference.sparse_decode`. q [B, H, 512] float, cache a KVCache, indices [B, K]
    int32 token ids (< 0: padding), topk_len [B] int32 (each row reads its first topk_len entries),
    attn_sink [H] float, sm_scale a finite positive number (default 1/sqrt(512)); any strides. B = 0
    gives empty outputs; K = 0 (or a row with no valid entry) gives out 0 and lse -inf (the sink
    with a sink).

    ``checks="device"`` (default; no host sync, graph-safe): an index >= cache.num_tokens is read as
    padding, a topk_len outside [0, K] is clamped, and each is flagged in the device's error word, as
    are a non-finite sink and a non-finite output (``dsv4lab.check_errors()`` raises naming them). A
    row no impl can compute (a non-finite q or cache value, or an extreme but finite sm_scale or q
    whose scores all overflow or underflow float32) is NaN in out and in lse, flagged, never out 0
    with lse -inf ("no token"): every impl either answers a row as the float64 reference does or
    gives it NaN.
    Scale bytes above 134, which the packers never write, are not looked at: launches with the
    "bits" dequant give NaN in the rows that read them (flagged), the others the value 2^(byte-127).
    ``checks="sync"`` also checks the data before launching and names the first offending value:
    q finite, topk_len in [0, K], indices < cache.num_tokens, a finite sink, scale bytes <= 134 and
    no fp8 NaN byte or non-finite rope value in the tokens read. ``check_ranges`` is the older
    spelling (True: "sync", False: "device").
    """
    entry = _pick("sparse_decode", impl)
    mode = checks_mode(checks, check_ranges)
    scale = check_sparse_decode_args(q, cache, indices, topk_len, sm_scale, attn_sink, mode, entry.max_scale_byte)
    return entry.fn(q, cache, indices, topk_len=topk_len, sm_scale=scale, attn_sink=attn_sink)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x with unit stride along its last dim (rows may keep any stride): what the kernels index."""
    return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def _no_tokens(q, topk_len, attn_sink):
    """(out, lse) of rows that read nothing (B = 0 or K = 0): out 0, lse -inf, or the sink; a topk_len
    other than 0 or a non-finite sink flagged, as the kernels do."""
    B, H, D = q.shape
    out = torch.zeros(B, H, D, dtype=torch.bfloat16, device=q.device)
    if B and topk_len is not None:
        errors.set_flag(q.device, errors.Flag.TOPK_LEN, (topk_len != 0).any())
    if attn_sink is None:
        return out, torch.full((B, H), -math.inf, dtype=torch.float32, device=q.device)
    if B:
        errors.set_flag(q.device, errors.Flag.SINK, ~torch.isfinite(attn_sink).all())
    return out, attn_sink.float()[None, :].expand(B, H).contiguous()


def _decode_entry(fn):
    """The sparse-decode guard around an implementation: B = 0 or K = 0 answered without it, and
    q, topk_len, attn_sink contiguous, indices with unit column stride."""
    @functools.wraps(fn)
    def run(q, cache, indices, *, topk_len, sm_scale, attn_sink, **kw):
        if q.shape[0] == 0 or indices.shape[1] == 0:
            return _no_tokens(q, topk_len, attn_sink)
        return fn(q.contiguous(), cache, _rows(indices), topk_len=None if topk_len is None else topk_len.contiguous(),
                  sm_scale=sm_scale, attn_sink=None if attn_sink is None else attn_sink.contiguous(), **kw)
    return run


def peer_rows(out, lse, indices, topk_len, *, empty_at: float = -math.inf):
    """The decode's non-finite contract for code that does not keep it itself (SGLang's kernel, the float64
    reference), on its (out [B, (1,) H, 512], lse [B, (1,) H]) before the sink: a row it could not compute
    is NaN in out and lse, flagged NONFINITE, never a plausible answer. Such a row has a non-finite output,
    a NaN or +inf lse, or (although it read a token: ``indices`` [B, K] and ``topk_len`` as sanitized) an
    lse of "no token": at or below ``empty_at``, as float32 (every score lost below the code's finite
    starting value or to -inf, an extreme sm_scale or q; or a float64 lse past float32's range)."""
    read = indices >= 0
    if topk_len is not None:
        read &= torch.arange(indices.shape[1], device=indices.device)[None, :] < topk_len[:, None]
    has = read.any(1).view(-1, *(1,) * (lse.dim() - 1))
    lse32 = lse.float()
    bad = ~torch.isfinite(out).all(-1) | torch.isnan(lse32) | (lse32 == math.inf) | (has & (lse32 <= empty_at))
    errors.set_flag(out.device, errors.Flag.NONFINITE, bad.any())
    return out.masked_fill(bad[..., None], math.nan), lse.masked_fill(bad, math.nan)


@register("sparse_decode", "reference", description="float64, the judge (dsv4lab.reference)", graph_safe=False)
def _sparse_decode_reference(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    from .kernels import guards
    indices, topk_len = guards.sanitize_decode(indices, topk_len, attn_sink, cache.num_tokens)
    out, lse = peer_rows(*reference.sparse_decode_float64(q, cache, indices, topk_len, sm_scale), indices, topk_len)
    if attn_sink is not None:
        out, lse = reference.sink_float64(out, lse, attn_sink)
    return out.to(torch.bfloat16), lse.float()


#: the longest context the indexer addresses: positions are int32
MAX_SEQ_LEN = 2**31 - 1


def check_indexer_args(q, index_cache, weights, seq_lens, page_table, max_seq_len, checks="device") -> int:
    """Raise a ValueError/TypeError naming the argument; returns max_seq_len as an int. ``checks``:
    "device" (no host sync) or "sync" (also seq_lens, the live page ids, finite q and weights and the
    live pages' bytes, naming the first offending value; as "device" during CUDA-graph capture)."""
    mode = _mode(checks)
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


def _indexer_entry(fn, *, op, dead_pages, guarded=False):
    """The indexer guard around an implementation: B = 0 answered without it, q / weights / seq_lens
    contiguous, and the device-side guard (kernels.guards.sanitize_indexer) in front: seq_lens
    clamped, each request cut before a live page id outside the cache, and for code that gathers
    the whole table (``dead_pages``) a copy with every entry in the cache. An impl that does all of
    that itself (``guarded``: Impl.guards_inputs) runs without the guard's launch."""
    @functools.wraps(fn)
    def run(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, **kw):
        B = q.shape[0]
        if B == 0:
            if op == "indexer_topk":
                return torch.empty(0, kw["topk"], dtype=torch.int32, device=q.device)
            return torch.empty(0, max_seq_len, dtype=torch.float32, device=q.device)
        if guarded:
            return fn(q.contiguous(), index_cache, weights.contiguous(), seq_lens.contiguous(), _rows(page_table),
                      max_seq_len=max_seq_len, **kw)
        from .kernels import guards
        q, weights = q.contiguous(), weights.contiguous()
        seq, table = guards.sanitize_indexer(seq_lens.contiguous(), _rows(page_table), max_seq_len,
                                             index_cache.num_pages, index_cache.page_size, whole_table=dead_pages,
                                             q=q, weights=weights)
        return fn(q, index_cache, weights, seq, table, max_seq_len=max_seq_len, **kw)
    return run


def indexer_logits(q, index_cache, weights, seq_lens, page_table, *, max_seq_len: int,
                   impl: str = "reference", checks: str | None = None):
    """Lightning-indexer logits float32 [B, max_seq_len] (-inf past each seq_len).

    q [B, H_i, 128] (bf16/fp16/fp32/fp8), weights [B, H_i] float, seq_lens [B] int32, page_table
    [B, >= ceil(max_seq_len / 64)] int32 (entries past a request's live pages are never read and
    may hold anything), max_seq_len a positive int (numpy/torch integers too); any strides; B = 0
    gives [0, max_seq_len]. ``checks="device"`` (default, no host sync): a seq_len outside
    [0, max_seq_len] is clamped, a request whose live pages hold an id outside [0, num_pages) is cut
    at that page (its positions from there on are -inf), each flagged for ``dsv4lab.check_errors()``,
    as are non-finite q or weights (the logits are what the arithmetic gives: NaN or inf). ``checks="sync"``
    refuses all of these before launching, naming the value (and live pages holding bytes the packer
    never writes).
    """
    entry = _pick("indexer_logits", impl)
    L = check_indexer_args(q, index_cache, weights, seq_lens, page_table, max_seq_len, checks_mode(checks))
    return entry.fn(q, index_cache, weights, seq_lens, page_table, max_seq_len=L)


@register("indexer_logits", "reference", description="float64, the judge (dsv4lab.reference)", graph_safe=False)
def _indexer_logits_reference(q, index_cache, weights, seq_lens, page_table, *, max_seq_len):
    return reference.indexer_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len)


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


def indexer_topk(q, index_cache, weights, seq_lens, page_table, *, max_seq_len: int, topk: int = 512,
                 impl: str = "reference", checks: str | None = None):
    """Top-k token positions int32 [B, topk] of the indexer logits, -1 padded (a row has fewer
    than ``topk`` positions < seq_len); arguments and ``checks`` as :func:`indexer_logits`, topk a
    positive int of at most max(max_seq_len, 2048). A live logit that came out NaN or inf (non-finite
    q or weights, an overflow) is flagged by every impl: NaN and +inf rank first, -inf is never chosen,
    so that row's positions are not an answer. The positions are a set for the sparse decode; their
    order is the impl's: descending logit for the torch paths and the reference, ascending position for impl="triton"
    (whose ties at the k-th value go to the lower position: ``reference.topk_positions`` is its
    exact contract). An impl with ``Impl.prepare`` (impl="triton") keeps what a call's checks and
    launch planning decided under its argument signature (shapes, strides, dtypes, devices, the
    cache object, max_seq_len, topk): an eager loop's later calls of that signature go straight to
    the launches."""
    known = _IMPLS["indexer_topk"].get(impl) if type(impl) is str else None
    key = (_signature(impl, checks, q, index_cache, weights, seq_lens, page_table, max_seq_len, topk)
           if known is not None and known.prepare is not None else None)
    calls = concurrency.prepared_calls()
    prepared = calls.get(key) if key is not None else None
    if prepared is not None:
        out = prepared(q, index_cache, weights, seq_lens, page_table)
        if out is not None:
            return out
    entry = _pick("indexer_topk", impl)
    L = check_indexer_args(q, index_cache, weights, seq_lens, page_table, max_seq_len, checks_mode(checks))
    k = topk_arg(topk, L)
    out = entry.fn(q, index_cache, weights, seq_lens, page_table, max_seq_len=L, topk=k)
    if key is not None and prepared is None:
        prepared = entry.prepare(q, index_cache, weights, seq_lens, page_table, L, k)
        if prepared is not None:
            if len(calls) >= 256:
                calls.clear()
            calls[key] = prepared
    return out


def prepared_calls() -> dict:
    """indexer_topk's prepared calls (Impl.prepare) of this caller (this thread; keyed by argument
    signature and CUDA stream, dsv4lab.concurrency): an eager call that repeats a signature whose checks
    passed goes straight to its launches (experiments/eager_host_path), on workspaces of its own."""
    return concurrency.prepared_calls()


def _signature(impl, checks, q, index_cache, weights, seq_lens, page_table, max_seq_len, topk):
    """What indexer_topk's checks and planning depend on, and the caller's stream, as a key, or None
    where a call is not to be prepared: checks other than the default "device", scalars that are not
    plain ints (a numpy or torch integer, a bool), tensors of a subclass, a CUDA-graph capture (whose
    workspaces are its own). The cache is keyed by its id (the prepared call also holds a weak
    reference and compares the object)."""
    T = torch.Tensor
    if (checks not in (None, "device") or type(max_seq_len) is not int or type(topk) is not int
            or type(q) is not T or type(weights) is not T or type(seq_lens) is not T or type(page_table) is not T):
        return None
    stream = concurrency.stream_key(q.device)
    if stream is concurrency.CAPTURING:
        return None
    return (impl, max_seq_len, topk, id(index_cache), q.shape, q.dtype, q.device, q.stride(), weights.shape,
            weights.dtype, weights.device, weights.stride(), seq_lens.shape, seq_lens.dtype, seq_lens.device,
            seq_lens.stride(), page_table.shape, page_table.dtype, page_table.device, page_table.stride(), stream)


def flag_nonfinite_logits(logits, seq_lens):
    """The top-k's non-finite contract for impls that rank logits made in torch: INDEXER_NONFINITE where a
    live logit (position < seq_lens[b], the guard's sanitized lengths) is NaN or inf, which a top-k would
    rank first (NaN, +inf) or never choose (-inf). One pass over the logits, no host sync."""
    live = torch.arange(logits.shape[1], device=logits.device)[None, :] < seq_lens[:, None]
    errors.set_flag(logits.device, errors.Flag.INDEXER_NONFINITE, (live & ~torch.isfinite(logits)).any())


@register("indexer_topk", "reference", description="float64, the judge (dsv4lab.reference)", graph_safe=False)
def _indexer_topk_reference(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, topk):
    logits = reference.indexer_logits(q, index_cache, weights, seq_lens, page_table, max_seq_len)
    flag_nonfinite_logits(logits, seq_lens)
    return reference.topk_indices(logits, topk)
