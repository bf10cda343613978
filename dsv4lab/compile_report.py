"""The compiler's resource report for a kernel, without a GPU.

Triton can compile for a GPU this machine does not have; ptxas (shipped in
Triton's wheel) then says how many registers a thread needs, how many bytes
spill to local memory, and the PTX shows which matrix instructions were picked
(``wgmma`` on Hopper, ``mma.sync`` otherwise). This is how the lab chose tiles
before spending GPU time: a config that spills is slow however it is launched.

Needs ``DSV4LAB_MODE=compile`` (Triton must not be in interpreter mode):

    DSV4LAB_MODE=compile python -m dsv4lab.compile_report 64 32 8 1 2
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

# Runtime launches specialize pointers and ints divisible by 16; AOT must say so, or the
# report describes a kernel that never runs (unvectorized loads, different registers).
_PTR = {"Q": "*bf16", "KV_FP8": "*fp8e4nv", "KV_U8": "*u8", "KV_BF16": "*bf16", "IDX": "*i32",
        "TOPK_LEN": "*i32", "SINK": "*fp32", "O": "*bf16", "LSE": "*fp32"}
_DIV16 = {"stride_qb", "stride_qh", "stride_ib", "stride_ob", "stride_oh", "K",
          "split_len", "stride_os", "stride_fb", "stride_fh", "stride_pb", "stride_ph", "stride_ps"}


def compile_kernel(fn, constexprs: dict, *, num_warps=4, num_stages=2, arch=90, fp32_args=("qk_scale",),
                   ptr_types=None, maxnreg=None):
    """triton.compile ``fn`` for sm_``arch``; returns the compiled kernel (asm dict inside)."""
    ptr_types = {**_PTR, **(ptr_types or {})}
    names = fn.arg_names
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if fn.params[i].is_constexpr or n in constexprs:       # a None argument is a constexpr at launch
            sig[n] = "constexpr"
        elif n in ptr_types:
            sig[n] = ptr_types[n]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif n in fp32_args:
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
            if n in _DIV16:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages,
                                       **({"maxnreg": maxnreg} if maxnreg else {})))


def report(kernel, arch=90) -> dict:
    """Registers, spills and shared memory from ptxas -v; the MMA instructions from the PTX."""
    ptx = kernel.asm["ptx"]
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas = next(p for p in (os.path.join(bin_dir, "ptxas-blackwell"), os.path.join(bin_dir, "ptxas"))
                 if os.path.exists(p))
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        open(src, "w").write(ptx)
        tgt = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
        r = subprocess.run([ptxas, f"-arch={tgt}", "-v", src, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    log = r.stderr
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, log)) else None  # noqa: E731
    mma = sorted(set(re.findall(r"(wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+|mma\.sync\.aligned\.m\d+n\d+k\d+)", ptx)))
    return {"registers": num(r"Used (\d+) registers"), "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"), "stack": num(r"(\d+) bytes stack frame"),
            "shared_bytes": kernel.metadata.shared, "mma": mma, "ptxas_ok": r.returncode == 0}


def head_batched_report(block_h, block_n, num_warps, num_stages, prefetch=0, *, split=False, arch=90,
                        lazy_rescale=False, maxnreg=None, merge_nsplit=0, partials="bf16", dequant="cvt",
                        fold_scale=False, merge="fused") -> dict:
    """``merge_nsplit`` > 0: the split-K launch with its in-launch merge, ``merge`` "fused" (the last
    slice merges) or "coop" (barrier, each slice merges a share), ``partials`` "bf16" (the GPU
    default) or "fp32"; ``dequant`` / ``fold_scale``: as TileConfig's (the H200 64-head entry: "bits", True)."""
    from .kernels.common import coop_columns, merge_chunk
    from .kernels.head_batched import _head_batched_kernel
    c = dict(PAGE_SIZE=64, PAGE_BYTES=37440, HAS_TOPK_LEN=False, HAS_SINK=False, SPLIT=split or merge_nsplit > 0,
             BLOCK_H=block_h, BLOCK_N=block_n, D=512, NOPE=448, DOT=triton.language.bfloat16,
             LAZY_RESCALE=lazy_rescale, PREFETCH=prefetch, TRACE=None, DEQUANT_BITS=dequant == "bits",
             FOLD_SCALE=bool(fold_scale))
    types = {}
    if merge_nsplit:
        p2 = triton.next_power_of_2(merge_nsplit)
        c.update(MERGE=1, SPLIT_P2=p2, DCHUNK=merge_chunk(block_h, p2, num_warps, per_thread=64))
        if merge == "coop":
            ncol = coop_columns(merge_nsplit)
            c.update(MERGE=2, NCOL=ncol, DCHUNK=min(ncol, c["DCHUNK"]))
        types = {"O": f"*{partials}", "CNT": "*i32", "O_FINAL": "*bf16", "LSE_FINAL": "*fp32"}
    else:
        c.update(CNT=None, O_FINAL=None, LSE_FINAL=None)
    k = compile_kernel(_head_batched_kernel, c, num_warps=num_warps, num_stages=num_stages, arch=arch,
                       maxnreg=maxnreg, ptr_types=types)
    return {"maxnreg": maxnreg, "block_h": block_h, "block_n": block_n, "num_warps": num_warps, "num_stages": num_stages,
            "prefetch": prefetch, "lazy_rescale": lazy_rescale, "dequant": dequant, "fold_scale": bool(fold_scale),
            "merge_nsplit": merge_nsplit, "merge": merge if merge_nsplit else None,
            "partials": partials if merge_nsplit else None, "arch": arch,
            "triton": triton.__version__,
            **report(k, arch)}


if __name__ == "__main__":
    import dsv4lab  # noqa: F401
    # BLOCK_H BLOCK_N warps stages [prefetch] [lazy] [maxnreg] [nsplit of a fused merge], and the
    # words "bits" (the integer dequant), "fold" (the folded softmax scale) and "coop" (the
    # cooperative merge instead of the fused one) anywhere
    words = {a for a in sys.argv[1:] if not a.isdigit()}
    args = [int(a) for a in sys.argv[1:] if a.isdigit()][:8] or [64, 128, 8, 1, 0]
    print(head_batched_report(*args[:5], lazy_rescale=bool(args[5:6] and args[5]),
                              maxnreg=(args[6:7] or [None])[0] or None, merge_nsplit=(args[7:8] or [0])[0],
                              dequant="bits" if "bits" in words else "cvt", fold_scale="fold" in words,
                              merge="coop" if "coop" in words else "fused"))
