"""The DSv4 paged caches, byte for byte as SGLang 0.5.23 stores them.

Main KV cache (``KVLayout.V4``), 584 bytes per token::

    data  (576 B): 448 fp8 e4m3 "nope" values | 64 bf16 rope values (128 B)
    scale (  8 B): 7 UE8M0 exponents, one per 64 nope values (scale = 2**(byte-127)) | 1 pad

    page  = [page_size * 576 data | page_size * 8 scales | pad up to a multiple of 576]
    page_bytes = ceil(page_size * 584 / 576) * 576

Token ``t`` lives on page ``t // page_size``, slot ``t % page_size``.
Quantization mirrors SGLang's ``_quant_k_cache_fused_kernel``: per 64-value
tile, ``scale = 2**ceil(log2(max(amax, 1e-8) / 448))``, values clamped to
+-448 and cast to e4m3.

Indexer K cache (DeepGEMM fused layout), 132 bytes per token, pages of 64::

    page = [64 * 128 fp8 e4m3 values | 64 fp32 scales]   -> uint8 [num_pages, 64, 1, 132]
"""
from __future__ import annotations

import functools
import numbers
import os
from dataclasses import dataclass

import torch

from .config import (DATA_BYTES, FP8_MAX, HEAD_DIM, INDEX_DIM, INDEX_TOKEN_BYTES,  # noqa: F401  (re-exported)
                     MAX_PACKED_SCALE_BYTE, NOPE_DIM, NUM_SCALES, PAGE_ALIGN, PAGE_SIZE, QUANT_TILE, ROPE_DIM,
                     SCALE_BYTES, TOKEN_BYTES)

MAX_NOPE_ABS = FP8_MAX * 2.0 ** (MAX_PACKED_SCALE_BYTE - 127)      # 57344
BF16_MAX = torch.finfo(torch.bfloat16).max


def page_bytes(page_size: int) -> int:
    """Bytes one KV page occupies, padded to a multiple of 576."""
    return -(-page_size * TOKEN_BYTES // PAGE_ALIGN) * PAGE_ALIGN


def _first_bad(mask: torch.Tensor) -> str:
    """'row r, column c' of the first True of a 2-D mask (for error messages)."""
    r, c = (int(v) for v in mask.nonzero()[0])
    return f"row {r}, column {c}"


def _check_tokens(name, x, width):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"{name} must have shape [N, {width}], got {list(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one token, got N=0")
    bad = ~torch.isfinite(x.float())
    if bool(bad.any()):
        raise ValueError(f"{name} must be finite (as float32); the fp8 cache cannot store NaN or inf: "
                         f"{name}[{_first_bad(bad)}] = {float(x[bad.nonzero()[0][0], bad.nonzero()[0][1]])!r}")


def int_arg(name, v, lo=None) -> int:
    """An int argument: Python, numpy and 0-d torch integers are accepted, bools and floats are not."""
    if type(v) is int and (lo is None or v >= lo):        # the common case, on every call of an op
        return v
    if isinstance(v, torch.Tensor) and v.dim() == 0 and not v.is_floating_point() and v.dtype != torch.bool:
        v = int(v)
    want = {0: "a non-negative int", 1: "a positive int"}.get(lo, "an int" if lo is None else f"an int >= {lo}")
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be {want}, got {type(v).__name__} {v!r}")
    v = int(v)
    if lo is not None and v < lo:
        raise ValueError(f"{name} must be {want}, got {v}")
    return v


#: the largest page: the kernels' token indices are int32, so a token past 2^31 - 1 is never read
MAX_PAGE_SIZE = 2**31 - 1
#: the start of every cache buffer: the kernels read 16-byte vectors (and Hopper's bulk prefetch needs
#: 16-byte aligned addresses); the bf16 and fp32 views of the bytes need 2 and 4
BUFFER_ALIGN = 16


def _check_page_size(page_size) -> int:
    ps = int_arg("page_size", page_size, 1)
    if ps > MAX_PAGE_SIZE:
        raise ValueError(f"page_size must be at most 2**31 - 1 (token indices are int32), got {ps}")
    return ps


def device_bytes(device: torch.device) -> int:
    """The memory of ``device``: a GPU's total memory, or the machine's RAM for the CPU (0: unknown)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    if device.type == "cpu":
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return 0
    return 0


def check_allocation(what: str, nbytes: int, device, how: str):
    """Refuse an allocation larger than ``device``'s memory before making it, naming ``what`` needed
    it and ``how`` its size comes about (the allocator's own error names neither)."""
    have = device_bytes(device)
    if have and nbytes > have:
        raise ValueError(f"{what} would allocate {nbytes / 2**30:.4g} GiB ({how}), more than {torch.device(device)} has "
                         f"({have / 2**30:.4g} GiB)")


def check_aligned(name: str, buf: torch.Tensor):
    """``buf`` starts at an address the kernels can read (BUFFER_ALIGN)."""
    if buf.data_ptr() % BUFFER_ALIGN:
        raise ValueError(f"{name} must start at a {BUFFER_ALIGN}-byte aligned address (the kernels read 16-byte "
                         f"vectors), got one at {buf.data_ptr() % BUFFER_ALIGN} mod {BUFFER_ALIGN} (storage offset "
                         f"{buf.storage_offset() * buf.element_size()} bytes): view the pool at a multiple of "
                         f"{BUFFER_ALIGN} bytes")


def _check_token_ids(token_ids, num_tokens, name="token_ids"):
    token_ids = torch.as_tensor(token_ids)
    if token_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an integer tensor (int32/int64), got {token_ids.dtype}")
    if token_ids.numel() and (token_ids.min() < 0 or token_ids.max() >= num_tokens):
        raise ValueError(f"{name} must lie in [0, {num_tokens}), got range "
                         f"[{int(token_ids.min())}, {int(token_ids.max())}]")
    return token_ids.long()


@dataclass(frozen=True)
class KVCache:
    """A packed DSv4 main KV cache. ``buffer`` is uint8 [num_pages, page_bytes], row-contiguous
    (a view of a larger page pool is fine: rows are pages). Checked when built, so the sizes the
    kernels and the range checks trust always agree with the bytes that exist; frozen, so they stay so."""
    buffer: torch.Tensor
    page_size: int
    num_tokens: int

    def __post_init__(self):
        b = self.buffer
        if not isinstance(b, torch.Tensor):
            raise TypeError(f"KVCache.buffer must be a torch.Tensor, got {type(b).__name__}")
        if b.dtype != torch.uint8 or b.dim() != 2:
            raise ValueError(f"KVCache.buffer must be a 2-D uint8 tensor [num_pages, page_bytes], got "
                             f"{b.dtype} {list(b.shape)}")
        ps = int_arg("KVCache.page_size", self.page_size, 1)
        object.__setattr__(self, "page_size", ps)
        if b.shape[0] < 1 or b.shape[1] < ps * TOKEN_BYTES:
            raise ValueError(f"KVCache.buffer must hold >= 1 page of >= page_size x {TOKEN_BYTES} = "
                             f"{ps * TOKEN_BYTES} bytes, got {list(b.shape)}")
        if b.stride(1) != 1 or (b.shape[0] > 1 and b.stride(0) != b.shape[1]):
            raise ValueError(f"KVCache.buffer must be row-contiguous with rows of page_bytes ({b.shape[1]}): "
                             f"strides ({b.shape[1]}, 1), got {tuple(b.stride())}")
        if b.shape[1] % 64 and b.shape[0] > 1:
            raise ValueError(f"KVCache page_bytes must be a multiple of 64 (the kernels' vector loads), got {b.shape[1]}")
        check_aligned("KVCache.buffer", b)
        n = int_arg("KVCache.num_tokens", self.num_tokens, 0)
        object.__setattr__(self, "num_tokens", n)
        if n > b.shape[0] * ps:
            raise ValueError(f"KVCache.num_tokens ({n}) must be <= num_pages x page_size "
                             f"({b.shape[0]} x {ps} = {b.shape[0] * ps})")

    @property
    def num_pages(self) -> int:
        return self.buffer.shape[0]

    @property
    def page_bytes(self) -> int:
        return self.buffer.shape[1]

    @property
    def k_cache(self) -> torch.Tensor:
        """The float8_e4m3fn view SGLang's decode kernels take: [num_pages, page_size, 1, 584],
        stride(0) = page_bytes (the same view SGLang's DSv4 backend builds)."""
        return self.buffer[:, : self.page_size * TOKEN_BYTES].view(torch.float8_e4m3fn).view(
            self.num_pages, self.page_size, 1, TOKEN_BYTES)

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    @functools.cached_property
    def byte_views(self) -> tuple:
        """(float8_e4m3fn, uint8, bfloat16) flat views of the buffer: the decode kernels' three pointers
        (fp8 nope values, UE8M0 scale bytes, bf16 rope), made once per cache."""
        raw = self.buffer.reshape(-1)
        return raw.view(torch.float8_e4m3fn), raw, raw.view(torch.bfloat16)

    def to(self, device) -> "KVCache":
        return KVCache(self.buffer.to(device), self.page_size, self.num_tokens)

    def __repr__(self):
        return (f"KVCache(tokens={self.num_tokens}, page_size={self.page_size}, "
                f"pages={self.num_pages}, page_bytes={self.page_bytes}, device={self.device})")


def as_kv_cache(x, name: str = "k_cache") -> KVCache:
    """A :class:`KVCache` as given, or one over SGLang's fp8 view of a page buffer,
    [num_pages, page_size, 1, 584] with stride(0) = the page's bytes (read in place, not copied)."""
    if isinstance(x, KVCache):
        return x
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a dsv4lab.cache.KVCache or SGLang's [num_pages, page_size, 1, "
                        f"{TOKEN_BYTES}] float8_e4m3fn view, got {type(x).__name__}")
    if x.dim() != 4 or x.shape[2] != 1 or x.shape[3] != TOKEN_BYTES or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must have shape [num_pages, page_size, 1, {TOKEN_BYTES}], got {list(x.shape)}")
    if x.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"{name} must be float8_e4m3fn (or uint8) bytes, got {x.dtype}")
    pages, ps = x.shape[0], x.shape[1]
    pb = page_bytes(ps)
    have = x.untyped_storage().nbytes() - x.storage_offset()
    if pages == 1 and have < pb:
        pb = ps * TOKEN_BYTES          # one page (its stride means nothing): its bytes without the tail pad
    if x.stride(3) != 1 or x.stride(1) != TOKEN_BYTES or (pages > 1 and x.stride(0) != pb):
        raise ValueError(f"{name} must be the view SGLang builds over pages of {pb} bytes: strides "
                         f"({pb}, {TOKEN_BYTES}, *, 1), got {tuple(x.stride())}")
    need = x.storage_offset() + pages * pb
    if x.untyped_storage().nbytes() < need:
        raise ValueError(f"{name}'s storage holds {x.untyped_storage().nbytes()} bytes, fewer than its "
                         f"{pages} pages of {pb} need ({need})")
    buf = torch.as_strided(x.view(torch.uint8), (pages, pb), (pb, 1))
    return KVCache(buf, ps, pages * ps)


def quantize_nope(nope: torch.Tensor):
    """[N, 448] float -> (fp8 e4m3 [N, 448], UE8M0 exponent bytes uint8 [N, 7]).

    Values must satisfy |x| <= MAX_NOPE_ABS (57344 = 448 x 2^7): larger ones would need a scale
    byte above MAX_PACKED_SCALE_BYTE, which the GPU's integer dequant cannot apply; refused, naming
    the element (DSv4's latent KV is normalized: its values are far smaller)."""
    big = nope.float().abs() > MAX_NOPE_ABS
    if bool(big.any()):
        where = _first_bad(big)
        r, c = (int(v) for v in big.nonzero()[0])
        raise ValueError(f"kv nope values must satisfy |x| <= {MAX_NOPE_ABS:g} (448 x 2^7, the largest UE8M0 scale "
                         f"the cache stores is 2^7); kv[{where}] = {float(nope[r, c])!r}")
    x = nope.float().reshape(-1, NUM_SCALES, QUANT_TILE)
    amax = x.abs().amax(dim=-1).clamp_min(1e-8)
    exp = torch.ceil(torch.log2(amax / FP8_MAX))
    q = (x / torch.exp2(exp)[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.reshape(-1, NOPE_DIM), (exp + 127).to(torch.uint8)


def pack_kv(kv: torch.Tensor, page_size: int = PAGE_SIZE) -> KVCache:
    """Quantize ``kv`` [N, 512] (row t = token t) into SGLang's DSv4 paged layout."""
    _check_tokens("kv", kv, HEAD_DIM)
    page_size = _check_page_size(page_size)
    big = kv[:, NOPE_DIM:].float().abs() > BF16_MAX
    if bool(big.any()):
        r, c = (int(v) for v in big.nonzero()[0])
        raise ValueError(f"kv rope values (columns {NOPE_DIM}..{HEAD_DIM - 1}) are stored in bf16 and must satisfy "
                         f"|x| <= {BF16_MAX:.4g}; kv[row {r}, column {NOPE_DIM + c}] = {float(kv[r, NOPE_DIM + c])!r}")
    n = kv.shape[0]
    num_pages = -(-n // page_size)
    pb = page_bytes(page_size)
    check_allocation("pack_kv", num_pages * pb, kv.device, f"{num_pages} page(s) of {page_size} tokens x "
                     f"{TOKEN_BYTES} bytes for {n} tokens")
    nope_fp8, scales = quantize_nope(kv[:, :NOPE_DIM])
    rope = kv[:, NOPE_DIM:].to(torch.bfloat16).contiguous()

    data = torch.zeros(num_pages * page_size, DATA_BYTES, dtype=torch.uint8, device=kv.device)
    data[:n, :NOPE_DIM] = nope_fp8.view(torch.uint8)
    data[:n, NOPE_DIM:] = rope.view(torch.uint8)
    sc = torch.zeros(num_pages * page_size, SCALE_BYTES, dtype=torch.uint8, device=kv.device)
    sc[:n, :NUM_SCALES] = scales
    buf = torch.zeros(num_pages, pb, dtype=torch.uint8, device=kv.device)
    buf[:, : page_size * DATA_BYTES] = data.view(num_pages, page_size * DATA_BYTES)
    buf[:, page_size * DATA_BYTES: page_size * TOKEN_BYTES] = sc.view(num_pages, page_size * SCALE_BYTES)
    return KVCache(buf, page_size, n)


def scale_view(cache: KVCache) -> torch.Tensor:
    """The scale bytes in place: uint8 [num_pages, page_size, 8] (bytes 0..6 the UE8M0 scales of a
    token's 7 nope groups, byte 7 padding), a view of the cache buffer: writes go into the cache."""
    ps = cache.page_size
    return cache.buffer[:, ps * DATA_BYTES: ps * TOKEN_BYTES].reshape(cache.num_pages, ps, SCALE_BYTES)


def scale_bytes(cache: KVCache, token_ids) -> torch.Tensor:
    """The 7 UE8M0 scale bytes (uint8 [..., 7]) of ``token_ids`` (any shape)."""
    ids = _check_token_ids(token_ids, cache.num_tokens).to(cache.device)
    flat = ids.reshape(-1)
    ps = cache.page_size
    return scale_view(cache)[flat // ps, flat % ps][:, :NUM_SCALES].reshape(*ids.shape, NUM_SCALES)


def dequant_kv(cache: KVCache, token_ids) -> torch.Tensor:
    """Dequantized tokens: float32 [..., 512] for ``token_ids`` of any shape."""
    ids = _check_token_ids(token_ids, cache.num_tokens).to(cache.device)
    flat = ids.reshape(-1)
    page, slot = flat // cache.page_size, flat % cache.page_size
    ps = cache.page_size
    data = cache.buffer[:, : ps * DATA_BYTES].reshape(cache.num_pages, ps, DATA_BYTES)[page, slot]
    nope = data[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scale = torch.exp2(scale_bytes(cache, flat).float() - 127.0)
    nope = (nope.reshape(-1, NUM_SCALES, QUANT_TILE) * scale[..., None]).reshape(-1, NOPE_DIM)
    rope = data[:, NOPE_DIM:].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=-1).reshape(*ids.shape, HEAD_DIM)


@dataclass(frozen=True)
class IndexKCache:
    """The indexer's fp8 K cache. ``kv`` is uint8 [num_pages, 64, 1, 132], contiguous. Checked when
    built (sizes agree with the bytes that exist) and frozen."""
    kv: torch.Tensor
    num_tokens: int
    page_size: int = PAGE_SIZE

    def __post_init__(self):
        kv = self.kv
        if not isinstance(kv, torch.Tensor):
            raise TypeError(f"IndexKCache.kv must be a torch.Tensor, got {type(kv).__name__}")
        ps = int_arg("IndexKCache.page_size", self.page_size, 1)
        if ps != PAGE_SIZE:
            raise ValueError(f"IndexKCache.page_size must be {PAGE_SIZE} (DeepGEMM's layout), got {ps}")
        object.__setattr__(self, "page_size", ps)
        if kv.dtype != torch.uint8 or kv.dim() != 4 or tuple(kv.shape[1:]) != (ps, 1, INDEX_TOKEN_BYTES) \
                or kv.shape[0] < 1:
            raise ValueError(f"IndexKCache.kv must be uint8 [num_pages >= 1, {ps}, 1, {INDEX_TOKEN_BYTES}], "
                             f"got {kv.dtype} {list(kv.shape)}")
        if not kv.is_contiguous():
            raise ValueError(f"IndexKCache.kv must be contiguous (pages of {ps * INDEX_TOKEN_BYTES} bytes), "
                             f"got strides {tuple(kv.stride())}")
        check_aligned("IndexKCache.kv", kv)
        n = int_arg("IndexKCache.num_tokens", self.num_tokens, 0)
        object.__setattr__(self, "num_tokens", n)
        if n > kv.shape[0] * ps:
            raise ValueError(f"IndexKCache.num_tokens ({n}) must be <= num_pages x {ps} ({kv.shape[0] * ps})")

    @property
    def num_pages(self) -> int:
        return self.kv.shape[0]

    @property
    def device(self) -> torch.device:
        return self.kv.device

    @functools.cached_property
    def flat_views(self) -> tuple:
        """(float8_e4m3fn, float32) flat views of the bytes: the Triton indexer's two pointers (fp8
        keys, fp32 page scales), made once per cache."""
        raw = self.kv.reshape(-1)
        return raw.view(torch.float8_e4m3fn), raw.view(torch.float32)

    def to(self, device) -> "IndexKCache":
        return IndexKCache(self.kv.to(device), self.num_tokens, self.page_size)

    def __repr__(self):
        return f"IndexKCache(tokens={self.num_tokens}, pages={self.num_pages}, device={self.device})"


def pack_index_k(k: torch.Tensor, page_size: int = PAGE_SIZE) -> IndexKCache:
    """Quantize ``k`` [N, 128] to fp8 e4m3 with one fp32 scale per token (amax / 448)."""
    _check_tokens("k", k, INDEX_DIM)
    page_size = _check_page_size(page_size)
    if page_size != PAGE_SIZE:
        raise ValueError(f"page_size must be {PAGE_SIZE} for the indexer cache (DeepGEMM layout), "
                         f"got {page_size}")
    n = k.shape[0]
    num_pages = -(-n // page_size)
    x = k.float()
    scale = (x.abs().amax(dim=-1) / FP8_MAX).clamp_min(1e-10)
    q = (x / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    vals = torch.zeros(num_pages * page_size, INDEX_DIM, dtype=torch.uint8, device=k.device)
    vals[:n] = q.view(torch.uint8)
    scales = torch.zeros(num_pages * page_size, dtype=torch.float32, device=k.device)
    scales[:n] = scale
    page = torch.cat([vals.view(num_pages, page_size * INDEX_DIM),
                      scales.view(torch.uint8).view(num_pages, page_size * 4)], dim=1)
    return IndexKCache(page.view(num_pages, page_size, 1, INDEX_TOKEN_BYTES), n, page_size)


def dequant_index_k(cache: IndexKCache, token_ids) -> torch.Tensor:
    """Dequantized indexer keys float32 [..., 128] for physical token ids (page * 64 + slot)."""
    ids = _check_token_ids(token_ids, cache.num_pages * cache.page_size).to(cache.device)
    flat = ids.reshape(-1)
    ps = cache.page_size
    pages = cache.kv.view(cache.num_pages, ps * INDEX_TOKEN_BYTES)
    page, slot = flat // ps, flat % ps
    vals = pages[:, : ps * INDEX_DIM].reshape(cache.num_pages, ps, INDEX_DIM)[page, slot]
    sc = pages[:, ps * INDEX_DIM:].contiguous().view(torch.float32)[page, slot]
    out = vals.contiguous().view(torch.float8_e4m3fn).float() * sc[:, None]
    return out.reshape(*ids.shape, INDEX_DIM)
