"""The buffers kernels write: outputs (poisoned under dsv4lab.testing.poisoned(), so an element a kernel
forgets to write fails the check), each caller's reused workspaces and zeroed counters, and the output
dtype the interpreter needs."""
from __future__ import annotations

import torch

from .. import concurrency
from ..device import is_interpret


def out_dtype() -> torch.dtype:
    """Kernels store bf16 on the GPU. The interpreter truncates fp32->bf16 casts (2x the
    rounding error of the GPU's round-to-nearest), so there they store fp32 and torch rounds."""
    return torch.float32 if is_interpret() else torch.bfloat16


def finish(out: torch.Tensor) -> torch.Tensor:
    return out if out.dtype == torch.bfloat16 else out.to(torch.bfloat16)


_POISON = [False]


def _poison_value(dtype: torch.dtype):
    """NaN, or an integer dtype's smallest value: what no kernel writes."""
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


def alloc(shape, dtype, device) -> torch.Tensor:
    """Output buffers of every kernel. Under dsv4lab.testing.poisoned() they come pre-filled
    with NaN (integer buffers: the dtype's smallest value, which no kernel writes), so an element
    a kernel forgets to write fails the check instead of passing on whatever the memory held."""
    if _POISON[0]:
        return torch.full(shape, _poison_value(dtype), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def workspaces(key: tuple, device, make) -> tuple:
    """The caller's workspaces for ``key`` (which names the device): the tensors ``make()`` returns,
    made on the caller's first call (dsv4lab.concurrency: a caller is a thread and, in it, a CUDA
    stream) and handed out again on its later calls, whose launches its stream orders; no other caller
    ever gets them. While a CUDA graph is captured they are made afresh on every call, from the graph's
    private pool, so every graph has its own (``counters`` says how zeroed ones are made there)."""
    store, stream = concurrency.scope(device)
    if stream is concurrency.CAPTURING:
        return make()
    ws = store.get((key, stream))
    if ws is None:
        ws = store[key, stream] = make()
    return ws


def counters(n: int, device) -> torch.Tensor:
    """``n`` int32 counters at zero for a workspace (``make`` of :func:`workspaces`) whose kernels return
    them to zero after every launch: under CUDA-graph capture a slice of a zeroed arena nobody else uses
    (concurrency.zeroed_counters: the graph holds no memset), else zeros, leaving room in the arena
    for this launch's later captures."""
    device = torch.device(device)
    if device.type == "cuda":
        if concurrency.capturing():
            return concurrency.zeroed_counters(n, device)
        concurrency.keep_arena(device, n)
    return torch.zeros(n, dtype=torch.int32, device=device)


def poison_all(*tensors):
    """Under testing.poisoned(): refill reused workspaces (None: none) as ``alloc`` fills outputs, so an
    element a launch forgets to write fails the check."""
    if _POISON[0]:
        for t in tensors:
            if t is not None:
                t.fill_(_poison_value(t.dtype))


def reused(name: str, shape: tuple, dtype: torch.dtype, device, *, poison: bool = True) -> torch.Tensor:
    """One workspace tensor of the caller's (:func:`workspaces`), refilled under testing.poisoned() (``poison``)."""
    device = device if isinstance(device, torch.device) else torch.device(device)
    (t,) = workspaces((name, shape, dtype, device), device,
                      lambda: (torch.empty(shape, dtype=dtype, device=device),))
    if poison:
        poison_all(t)
    return t
