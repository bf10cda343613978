"""What the lab keeps between calls, kept right for concurrent callers.

The ops keep four things from one call to the next: workspaces (split-K's partials, the top-k's
candidates and ticket counters), ``indexer_topk``'s prepared calls, launch caches (compiled
launchers, per-shape plans) and the error word. A caller may be one of several threads sharing a
stream, threads whose streams run at once, or one of several CUDA graphs replayed at once on
different streams. What each of them gets:

* **Workspaces and prepared calls are the caller's own**: kept per thread and, inside a thread, per
  CUDA stream (:func:`scope`). Two callers never share one, so no lock is needed (a host lock would
  not order two streams anyway) and no call allocates afresh (host time). One caller's launches are
  ordered by its stream, so reusing its workspace call after call is safe.
* **While a CUDA graph is captured** every workspace is allocated afresh, from the graph's private
  memory pool: free at replay, never shared by two graphs. Inside one graph, calls of a shape take
  their workspaces in stream order (the caching allocator hands a block to a later call only after
  the earlier call's launches on that stream), so sharing memory there is safe. Graphs captured into
  one shared pool (``torch.cuda.graph(..., pool=...)``) must not replay at once (torch's rule).
  Counters that must start at zero (the fused top-k's tickets, which each launch leaves at zero again)
  come from a zeroed arena made outside capture (:func:`zeroed_counters`), so a graph holds no memset.
* **Launch caches** hold no per-call state: every caller uses the same compiled launcher, and it
  launches on the caller's current stream.
* **The error word** (dsv4lab.errors) is shared by design: one per device, kernels OR their bits in
  with atomics, from any stream or graph. ``check_errors()`` synchronizes the device and swaps the
  word for 0 in one atomic exchange, so every flag set by work launched before it is reported once,
  by that check, and none is lost to a concurrent clear. It reports every caller's flags: with
  concurrent callers, check from one place.
* **Triton's interpreter** (CPU) keeps its state in module globals (the program index, the patched
  ``tl`` functions): two launches interpreted at once in two threads corrupt each other. Every
  interpreted launch in the process takes :data:`INTERPRETER_LOCK` (:func:`serialize_interpreter`);
  the lab's own edits of the error word on the CPU take it too.
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch

#: held by every interpreted Triton launch in the process, and by the lab's host-side edits of a CPU error word
INTERPRETER_LOCK = threading.RLock()

#: the stream key while a CUDA graph is captured on the caller's stream: nothing is kept
CAPTURING = "capturing"

_LOCAL = threading.local()
_PER_CALLER = [True]                 # False: experiments/eager_host_path's A/B, one shared set per process
_SHARED: dict = {}


def capturing() -> bool:
    """A CUDA graph is being captured on the current stream (one C call, no CUDA init on the CPU)."""
    return torch._C._cuda_isCurrentStreamCapturing() if torch.cuda.is_available() else False


_IS_CUDA: dict = {}                  # device -> is it CUDA (torch.device.type costs ~0.4 us a call)


def stream_key(device):
    """The caller's stream on ``device`` (a torch.device) as part of a key: the raw CUDA stream,
    :data:`CAPTURING` during graph capture, None on the CPU (no streams: a thread's calls run in order)."""
    cuda = _IS_CUDA.get(device)
    if cuda is None:
        cuda = _IS_CUDA[device] = torch.device(device).type == "cuda"
    if not cuda:
        return None
    if torch._C._cuda_isCurrentStreamCapturing():
        return CAPTURING
    return torch._C._cuda_getCurrentRawStream(device.index)


def _thread_dict(name: str) -> dict:
    if not _PER_CALLER[0]:
        return _SHARED.setdefault(name, {})
    d = getattr(_LOCAL, name, None)
    if d is None:
        d = {}
        setattr(_LOCAL, name, d)
    return d


def scope(device) -> tuple:
    """(this thread's workspaces, the stream key): what a caller keeps is found under its stream key in
    its thread's dict; under capture (stream key CAPTURING) nothing is kept. ``device``: a torch.device."""
    return _thread_dict("workspaces"), stream_key(device) if _PER_CALLER[0] else None


def prepared_calls() -> dict:
    """This thread's prepared calls (api.indexer_topk), keyed by their signature and stream."""
    return _thread_dict("prepared")


@contextlib.contextmanager
def shared_per_process():
    """Inside the block workspaces and prepared calls are kept once per process and captured graphs
    use them too, as before they were kept per caller (experiments/eager_host_path/per_caller.py times
    the difference). Not safe for concurrent callers. What the block made is kept for the process: a
    graph captured in it may still replay on it."""
    before, _PER_CALLER[0] = _PER_CALLER[0], False
    try:
        yield
    finally:
        _PER_CALLER[0] = before


#: int32 counters in a device's first arena (each new one is twice the last)
ARENA = 1 << 14
_ARENAS: dict = {}                   # device -> [arena, counters handed out]
_RETIRED: list = []                  # full arenas: graphs may still replay on their counters
_ARENA_LOCK = threading.Lock()


def zeroed_counters(n: int, device: torch.device) -> torch.Tensor:
    """``n`` int32 counters at zero that no other launch uses, for a launch captured in a CUDA graph
    whose kernels leave them at zero again: a slice of an arena zeroed outside capture (torch.cuda.graph
    synchronizes the device before capturing), never handed out twice since the graph may replay at
    any time, so the graph holds no memset. Without room (no eager call made the arena) they are zeros
    made inside the graph."""
    with _ARENA_LOCK:
        entry = _ARENAS.get(device)
        if entry is not None and entry[1] + n <= entry[0].numel():
            entry[1] += n
            return entry[0][entry[1] - n: entry[1]]
    return torch.zeros(n, dtype=torch.int32, device=device)


def keep_arena(device: torch.device, n: int):
    """Outside capture: leave ``device``'s arena at least half free after ``n`` more counters (a new,
    larger one when not), so that later captures of launches like this one find their counters there."""
    entry = _ARENAS.get(device)
    if entry is not None and 2 * (entry[1] + n) <= entry[0].numel():
        return
    with _ARENA_LOCK:
        entry = _ARENAS.get(device)
        if entry is None or 2 * (entry[1] + n) > entry[0].numel():
            if entry is not None:
                _RETIRED.append(entry[0])
            size = max(ARENA, 4 * n, 2 * entry[0].numel() if entry is not None else 0)
            _ARENAS[device] = [torch.zeros(size, dtype=torch.int32, device=device), 0]


def serialize_interpreter():
    """Make every launch by Triton's interpreter in this process take :data:`INTERPRETER_LOCK` (idempotent)."""
    from triton.runtime.interpreter import InterpretedFunction
    run = InterpretedFunction.run
    if getattr(run, "dsv4lab_serialized", False):
        return

    @functools.wraps(run)
    def serialized(self, *args, **kwargs):
        with INTERPRETER_LOCK:
            return run(self, *args, **kwargs)
    serialized.dsv4lab_serialized = True
    InterpretedFunction.run = serialized
