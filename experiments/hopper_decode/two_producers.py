# Kept as a record: it compiled a kernel variant (PRODUCERS and PV_N constexprs, never shipped) whose code did not survive in the repository's history; it does not run on the current package
"""Two producer warp groups for the hopper kernel: does it compile without spills? (no GPU needed)

    DSV4LAB_MODE=compile python experiments/hopper_decode/two_producers.py OUT.json

The hopper kernel's producer (one warp group) gathers at ~1.3 TB/s where the chip gathers at ~2.3
(README, "What bounds the producer"): a second producer warp group, each filling half of every
tile's chunks (``PRODUCERS=2``, ``ready`` counting two arrivals), would put twice the bytes in
flight. That makes 16 warps, so the launch caps the function at 65536 / 512 = 128 registers a
thread; Triton's warp specialization then gives the consumers ``setmaxnreg`` 256 - PRODUCER_REGS
at run time. Does ptxas allocate the consumers' [64, 256] fp32 accumulator (128 registers) by that
figure or by the function's 128?

Compiles the kernel for sm_90a with Triton's ptxas, for each configuration: the shipped one
(1 producer, 12 warps, maxnreg 168), and two producers at 96 down to 64 producer registers, with
the P @ V wgmma as the shipped m64n256k16 or as two m64n128k16 (``PV_N``: fewer registers a single
instruction needs). Records whether ptxas accepts it, its message, registers, spill bytes, the
``setmaxnreg`` values in the PTX, and which source lines the spills sit under (nvdisasm's line
info: consumer or producer code).
"""
import dsv4lab  # noqa: F401  (first: it decides the mode)

import argparse
import json
import os
import re
import subprocess
import tempfile

import triton

from dsv4lab import ab
from dsv4lab import compile_report as cr
from dsv4lab.cache import page_bytes
from dsv4lab.kernels import hopper

CONFIGS = [  # (producers, producer registers, maxnreg of the launch, P @ V instruction N)
    (1, 104, 168, 256), (1, 104, 168, 128),
    (2, 96, 128, 256),
    (2, 96, 128, 128), (2, 88, 128, 128), (2, 80, 128, 128), (2, 72, 128, 128), (2, 64, 128, 128),
]


def functions_of_lines(path: str) -> dict[int, str]:
    """source line -> the @gluon.jit function it lies in (hopper.py)."""
    out, name = {}, "?"
    for n, line in enumerate(open(path), 1):
        m = re.match(r"\s*def (\w+)\(", line)
        if m:
            name = m.group(1)
        out[n] = name
    return out


def spill_sites(ptx: str, src: str) -> dict[str, int]:
    """Local-memory instructions (STL / LDL) in the SASS, counted by the source function of the line
    they are attributed to."""
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    fn_of = functions_of_lines(src)
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "k.ptx"), "w").write(ptx)
        subprocess.run([os.path.join(bin_dir, "ptxas"), "-lineinfo", "-arch=sm_90a", os.path.join(d, "k.ptx"),
                        "-o", os.path.join(d, "k.cubin")], check=True, capture_output=True)
        sass = subprocess.run([os.path.join(bin_dir, "nvdisasm"), "-g", "-c", os.path.join(d, "k.cubin")],
                              check=True, capture_output=True, text=True).stdout
    line = None
    for s in sass.splitlines():
        m = re.search(r'hopper\.py", line (\d+)', s)
        if m:
            line = int(m.group(1))
        elif re.search(r"\b(STL|LDL)\b", s):
            key = fn_of.get(line, "?") if line else "?"
            counts[key] = counts.get(key, 0) + 1
    return counts


def compile_one(producers, regs, maxnreg, pv_n) -> dict:
    row = dict(producers=producers, producer_regs=regs, maxnreg=maxnreg, pv_n=pv_n,
               warps=8 + 4 * producers)
    c = dict(TRACED=False, ABLATE=0, PAGE_SIZE=64, PAGE_BYTES=page_bytes(64), HAS_TOPK_LEN=True, HAS_SINK=False,
             BLOCK_H=hopper.BLOCK_H, BLOCK_N=hopper.BLOCK_N, NUM_BUF=hopper.NUM_BUF, CHUNK=hopper.CHUNK,
             PRODUCER_WARPS=4, PRODUCER_REGS=regs, D=512, NOPE=448, num_warps=8, PRODUCERS=producers, PV_N=pv_n)
    try:
        k = cr.compile_kernel(hopper._hopper_decode_kernel, c, num_warps=8, num_stages=1, arch=90, maxnreg=maxnreg)
    except Exception as e:  # noqa: BLE001  (ptxas refusing is a result)
        msg = str(e)
        m = re.search(r"ptxas fatal\s*:\s*(.*)", msg)
        return {**row, "ptxas_ok": False, "error": (m.group(1) if m else msg)[:300]}
    ptx = k.asm["ptx"]
    rep = cr.report(k, 90)
    return {**row, **{key: rep[key] for key in ("ptxas_ok", "registers", "spill_stores", "spill_loads", "stack",
                                                 "shared_bytes", "mma")},
            "setmaxnreg": re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx),
            "local_memory_instructions_by_function": spill_sites(ptx, hopper.__file__)}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    a = p.parse_args(argv)
    rows = [compile_one(*cfg) for cfg in CONFIGS]
    for r in rows:
        print(json.dumps(r))
    ab.write(a.out, "hopper_decode", False, study="two producer warp groups: compile report (sm_90a)", rows=rows)


if __name__ == "__main__":
    main()
