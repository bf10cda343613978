"""The error word's two atomics on a GPU (dsv4lab.errors keeps the word; these are the kernels it uses
there): OR a bit in where a 0-d bool is true, and read the word while swapping it for 0. Importing
this module installs them into dsv4lab.errors (the package's face imports every kernel module)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import errors
from .launch import launch_kernel


@triton.jit(do_not_specialize=["FLAG"])      # one kernel for every bit: none compiles first inside a capture
def _or_word_kernel(ERR, WHEN, FLAG):
    if tl.load(WHEN):
        tl.atomic_or(ERR, FLAG)


@triton.jit
def _swap_word_kernel(ERR, OUT, CLEAR: tl.constexpr):
    if CLEAR:
        tl.store(OUT, tl.atomic_xchg(ERR, 0))
    else:
        tl.store(OUT, tl.atomic_or(ERR, 0))


_NO_CONSTS: dict = {}
_CLEAR, _KEEP = {"CLEAR": True}, {"CLEAR": False}


def or_word(err: torch.Tensor, when: torch.Tensor, flag: int):
    """errors.set_flag on a GPU: ``flag`` ORed into the error word ``err`` by an atomic where the 0-d
    bool ``when`` is true (one launch, no sync)."""
    launch_kernel(_or_word_kernel, (1,), (err, when), (flag,), _NO_CONSTS)


def swap_word(err: torch.Tensor, clear: bool) -> int:
    """errors.read on a GPU: the error word's bits, swapped for 0 (``clear``) in one atomic exchange on
    the current stream (a host sync)."""
    out = torch.empty(1, dtype=torch.int32, device=err.device)
    launch_kernel(_swap_word_kernel, (1,), (err, out), (), _CLEAR if clear else _KEEP)
    return int(out.item())


errors.use_gpu_atomics(or_word, swap_word)
