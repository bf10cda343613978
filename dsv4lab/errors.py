"""Bad input found on the device: one error word per device, read by :func:`check_errors`.

The ops' default mode (``checks="device"``) never synchronizes the host, so a value that only
the device can see (an index past the cache, a ``topk_len`` past K, a non-finite sink, a page id
outside the indexer cache) cannot raise where it is passed. The kernels never read outside their
buffers whatever the values are: they treat such a value as padding, clamp it, or stop before it
(each op's docstring says which), and OR a bit into this device's error word (an int32 tensor
that lives as long as the process, so a captured CUDA graph writes the same word on every
replay). :func:`check_errors` reads the word (one host sync), clears it and raises
:class:`DeviceInputError` naming every kind of bad input seen since the last check; run the call
again with ``checks="sync"`` to have the offending value itself named.

Concurrent callers share the word (one per device, for the process): kernels on any stream, and
replayed graphs, OR their bits in with atomics; :func:`check_errors` synchronizes the device and swaps
the word for 0 atomically, so a flag is reported once, by the first check after the work that set it
(whichever thread calls it), and never lost to a concurrent clear (dsv4lab.concurrency).

On a GPU both take an atomic, which is a kernel: kernels/error_word.py holds the two and installs them
here when imported (:func:`use_gpu_atomics`; the package's face imports every kernel module), so this
module, which the kernels import for the bits, imports no kernel.
"""
from __future__ import annotations

import enum
import threading

import torch

from . import concurrency


class OneLine:
    """Mixin for errors about the setup (an environment variable, a missing file or package), not the
    code: Jupyter and IPython show the message alone instead of a traceback."""

    def _render_traceback_(self):
        return [f"{type(self).__name__}: {self}"]


class Flag(enum.IntFlag):
    """The bits of the error word, one per kind of bad input, and what the op did about it."""
    INDEX = 1          # sparse decode: an index >= cache.num_tokens
    TOPK_LEN = 2       # sparse decode: topk_len outside [0, K]
    SINK = 4           # sparse decode: a non-finite attn_sink
    NONFINITE = 8      # sparse decode: an output came out NaN or inf
    SEQ_LEN = 16       # indexer: seq_lens outside [0, max_seq_len]
    PAGE = 32          # indexer: a live page id outside [0, index_cache.num_pages)
    INDEXER_NONFINITE = 64   # indexer: non-finite q or weights, or a live logit that came out non-finite


#: what each bit means to the caller: what was wrong and what the op did instead
MEANING = {
    Flag.INDEX: "sparse decode: an index >= cache.num_tokens (that entry was read as padding: left out)",
    Flag.TOPK_LEN: "sparse decode: a topk_len outside [0, K] (below 0 read as 0, above K as K)",
    Flag.SINK: "sparse decode: a non-finite attn_sink (the rows of that head are NaN, or 0 with lse +inf)",
    Flag.NONFINITE: "sparse decode: an output row came out NaN or inf, or could not be computed (a non-finite q, "
                    "cache bytes the packers never write, or an extreme sm_scale or q whose scores all overflow or "
                    "underflow): its out and lse are NaN, never 'no token'",
    Flag.SEQ_LEN: "indexer: a seq_len outside [0, max_seq_len] (below 0 read as 0, above as max_seq_len)",
    Flag.PAGE: "indexer: a live page id outside [0, index_cache.num_pages) (that request's positions from "
               "that page on are -inf: never read, never chosen)",
    Flag.INDEXER_NONFINITE: "indexer: non-finite q or weights, or a live position's logit that came out NaN or "
                            "inf (the top-k ranks NaN and +inf first and never chooses -inf: that row's top-k is "
                            "not an answer)",
}


class DeviceInputError(ValueError):
    """Bad input an op saw on the device (see :func:`check_errors`); ``flags`` holds the bits."""

    def __init__(self, flags: Flag, devices: list):
        self.flags, self.devices = flags, devices
        kinds = "; ".join(MEANING[f] for f in Flag if f & flags)
        where = ", ".join(str(d) for d in devices)
        super().__init__(f"bad input seen on {where} since the last check_errors(): {kinds}. "
                         f"Run the call with checks='sync' to have the offending value named")


_WORDS: dict[torch.device, torch.Tensor] = {}
_MAKING = threading.Lock()
#: (or_word, swap_word): the GPU's atomics on a word, installed by kernels/error_word.py
_GPU_ATOMICS: list = []


def use_gpu_atomics(or_word, swap_word):
    """Install the GPU's atomics: ``or_word(word, when, flag)`` ORs ``flag`` in where the 0-d bool ``when``
    is true, ``swap_word(word, clear) -> int`` reads the word, swapped for 0 when ``clear``."""
    _GPU_ATOMICS[:] = [or_word, swap_word]


def _gpu_atomics():
    if not _GPU_ATOMICS:
        raise RuntimeError("dsv4lab.errors: the GPU's error-word atomics are not installed (kernels/error_word.py "
                           "installs them; `import dsv4lab` imports it)")
    return _GPU_ATOMICS


def _key(device) -> torch.device:
    d = torch.device(device)
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"dsv4lab's ops run on CUDA or CPU tensors; got {d.type} (a {d.type} tensor holds no data "
                         f"a kernel could read)")
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def word(device) -> torch.Tensor:
    """This device's error word, int32 [1] (made on first use, which must not be inside a CUDA-graph
    capture: a graph would own its memory; every op runs eagerly once before capture anyway, since
    Triton compiles on the first launch). One per device for the process, whichever thread asks first."""
    w = _WORDS.get(device)                 # a tensor's .device (cuda:N): the fast path of every launch
    if w is not None:
        return w
    d = _key(device)
    with _MAKING:
        w = _WORDS.get(d)
        if w is None:
            if d.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"dsv4lab's error word for {d} does not exist yet and cannot be made inside a "
                                   f"CUDA-graph capture: run the op (or dsv4lab.check_errors()) once before capturing")
            w = _WORDS[d] = torch.zeros(1, dtype=torch.int32, device=d)
    return w


def set_flag(device, flag: Flag, when: torch.Tensor):
    """OR ``flag`` into the device's word where the 0-d bool tensor ``when`` is true, on the device (no
    sync): with an atomic on a GPU, as the kernels set their bits (a read-modify-write there could undo
    a bit another stream sets at the same moment), under the interpreter's lock on the CPU."""
    w = word(device)
    if w.is_cuda:
        _gpu_atomics()[0](w, when, int(flag))
        return
    with concurrency.INTERPRETER_LOCK:
        w.bitwise_or_(when.to(torch.int32) * int(flag))


def read(device=None, *, clear: bool = True) -> Flag:
    """The bits set on ``device`` (default: every device that has a word), cleared unless ``clear=False``.
    Reads the device: a host sync, refused inside a CUDA-graph capture. A GPU's word is read after the
    device has finished everything launched before (on any stream), and swapped for 0 in one atomic
    exchange: a bit set at the same moment by work on another stream is either in this read or left for
    the next, never lost. A CPU word is read and cleared under the interpreter's lock."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("check_errors() reads the device (a host sync): call it outside CUDA-graph capture, "
                           "e.g. after a replay")
    words = [word(device)] if device is not None else list(_WORDS.values())
    bits = 0
    for w in words:
        if w.is_cuda:
            torch.cuda.synchronize(w.device)
            bits |= _gpu_atomics()[1](w, clear)
            continue
        with concurrency.INTERPRETER_LOCK:
            bits |= int(w.item())
            if clear:
                w.zero_()
    return Flag(bits)


def _or(flags) -> Flag:
    out = Flag(0)
    for f in flags:
        out |= f
    return out


def check_errors(device=None):
    """Raise :class:`DeviceInputError` if any op has flagged bad input on ``device`` (default: every
    device) since the last call, and clear the flags. One host sync; returns None when clean."""
    seen = {d: read(d) for d in ([_key(device)] if device is not None else list(_WORDS))}
    bad = [d for d, bits in seen.items() if bits]
    if bad:
        raise DeviceInputError(_or(seen[d] for d in bad), bad)
