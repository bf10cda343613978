"""What the Hopper kernel's studies (experiments/hopper_decode) add to the package's launch: the kernel's
two compile-time study switches, launched through Triton's own path (``TRACED``: each program writes its
clocks into a buffer; ``ABLATE``: one partition alone, the other passing the ring's buffers back), and the
kernel compiled without a GPU (``DSV4LAB_MODE=compile``) with the compiler's resource report. The lab's
own launch (dsv4lab.kernels.decode.hopper) leaves both switches off."""
from __future__ import annotations

import triton

from dsv4lab import compile_report as cr
from dsv4lab.cache import page_bytes
from dsv4lab.config import HEAD_DIM, PAGE_SIZE
from dsv4lab.kernels.decode import hopper
from dsv4lab.kernels.decode.hopper.kernel import GLUON_ERROR, _hopper_decode_kernel

nsplit_for = hopper.nsplit_for      # what stalls.py's --module asks of a kernel module, beside launch

#: the ablations (the kernel's ABLATE): 1 the producer alone, 2 the consumers alone, 3 the producer without
#: its gather, 4 the producer's gather without its dequant and stores
ABLATIONS = (1, 2, 3, 4)


def launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, nsplit: int, pdl: bool = False,
           trace=None, ablate: int = 0):
    """hopper.launch with the study switches: ``trace`` an int64 buffer of 10 clocks a program, ``ablate``
    one of ABLATIONS (0: the whole kernel)."""
    if trace is None and not ablate:
        return hopper.launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, nsplit, pdl)
    grid, tensors, scalars, consts = hopper.launch_args(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse,
                                                        nsplit, pdl, trace)
    return _hopper_decode_kernel[grid](*tensors, *scalars, **dict(consts, TRACED=trace is not None, ABLATE=ablate))


def compile_kernel(*, page_size: int = PAGE_SIZE, has_topk_len: bool = True, has_sink: bool = False, arch: int = 90,
                   num_ctas: int = 1):
    """The kernel compiled as the lab's launch compiles it (compile_report.compile_kernel: no GPU needed,
    ``DSV4LAB_MODE=compile``); ``num_ctas`` > 1 asks for clusters of that many CTAs."""
    if GLUON_ERROR is not None:
        raise ValueError(f"triton.experimental.gluon could not be imported ({GLUON_ERROR})")
    consts = hopper._consts(page_size, page_bytes(page_size), has_topk_len, has_sink, HEAD_DIM, False)
    c = {k: v for k, v in consts.items() if k not in ("num_warps", "maxnreg", "LAUNCH_DEPENDENTS")}
    return cr.compile_kernel(_hopper_decode_kernel, {**c, "num_warps": hopper.NUM_WARPS}, num_warps=hopper.NUM_WARPS,
                             num_stages=1, arch=arch, maxnreg=hopper.MAXNREG, num_ctas=num_ctas)


def compile_report(*, split: bool = False, page_size: int = PAGE_SIZE, has_topk_len: bool = True,
                   has_sink: bool = False, arch: int = 90) -> dict:
    """The compiler's resource report (compile_report.report: registers, spills, shared memory, the MMA
    instructions and counts of the PTX instructions that make the schedule) for the kernel as the lab's
    launch compiles it, without a GPU. ``split``: the launch writes bf16 partials."""
    k = compile_kernel(page_size=page_size, has_topk_len=has_topk_len, has_sink=has_sink and not split, arch=arch)
    return {"kernel": "hopper", "split": split, "block_h": hopper.BLOCK_H, "block_n": hopper.BLOCK_N,
            "num_buf": hopper.NUM_BUF, "chunk": hopper.CHUNK, "num_warps": hopper.NUM_WARPS,
            "producer_warps": hopper.PRODUCER_WARPS, "producer_regs": hopper.PRODUCER_REGS,
            "maxnreg": hopper.MAXNREG, "arch": arch, "triton": triton.__version__, **cr.report(k, arch)}
