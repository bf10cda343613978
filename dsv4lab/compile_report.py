"""The compiler's resource report for a kernel, without a GPU.

Triton can compile for a GPU this machine does not have; ptxas (shipped in
Triton's wheel) then says how many registers a thread needs, how many bytes
spill to local memory, and the PTX shows which matrix instructions were picked
(``wgmma`` on Hopper, ``mma.sync`` otherwise). This is how the lab chose tiles
before spending GPU time: a config that spills is slow however it is launched.

Needs ``DSV4LAB_MODE=compile`` (Triton must not be in interpreter mode):

    DSV4LAB_MODE=compile python -m dsv4lab.compile_report 64 128 8 1 l2_hint bits fold
    DSV4LAB_MODE=compile python -m dsv4lab.compile_report story
"""
from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .cache import page_bytes
from .config import HEAD_DIM, NOPE_DIM, PAGE_SIZE

# Runtime launches specialize pointers and ints divisible by 16; AOT must say so, or the
# report describes a kernel that never runs (unvectorized loads, different registers).
_PTR = {"Q": "*bf16", "KV_FP8": "*fp8e4nv", "KV_U8": "*u8", "KV_BF16": "*bf16", "IDX": "*i32",
        "TOPK_LEN": "*i32", "SINK": "*fp32", "O": "*bf16", "LSE": "*fp32",
        "ERR": "*i32"}
_DIV16 = {"stride_qb", "stride_qh", "stride_ib", "stride_ob", "stride_oh", "K",
          "split_len", "stride_os", "stride_fb", "stride_fh", "stride_pb", "stride_ph", "stride_ps"}


def compile_kernel(fn, constexprs: dict, *, num_warps=4, num_stages=2, arch=90, fp32_args=("qk_scale",),
                   ptr_types=None, maxnreg=None, num_ctas=1):
    """triton.compile ``fn`` for sm_``arch``; returns the compiled kernel (asm dict inside).
    ``num_ctas`` > 1: a launch of thread-block clusters of that many CTAs (sm_90+)."""
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
    source = ASTSource
    if getattr(fn, "is_gluon", lambda: False)():          # a @gluon.jit kernel compiles from its own source class
        from triton.experimental.gluon._runtime import GluonASTSource as source
    src = source(fn, sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages,
                                       **({"maxnreg": maxnreg} if maxnreg else {}),
                                       **({"num_ctas": num_ctas} if num_ctas != 1 else {})))


def report(kernel, arch=90) -> dict:
    """Registers, spills and shared memory from ptxas -v; the MMA instructions from the PTX."""
    ptx = kernel.asm["ptx"]
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    ptxas = next(p for p in (os.path.join(bin_dir, "ptxas-blackwell"), os.path.join(bin_dir, "ptxas"))
                 if os.path.exists(p))
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        open(src, "w").write(ptx)
        tgt = re.search(r"^\.target (\S+)", ptx, re.M).group(1)    # sm_90a, sm_100a, sm_120a: as Triton wrote it
        r = subprocess.run([ptxas, f"-arch={tgt}", "-v", src, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True)
    log = r.stderr
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, log)) else None  # noqa: E731
    mma = sorted(set(re.findall(r"(wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+|mma\.sync\.aligned\.m\d+n\d+k\d+"
                                r"|tcgen05\.mma\.cta_group::\d\.kind::\w+)", ptx)))
    return {"registers": num(r"Used (\d+) registers"), "spill_stores": num(r"(\d+) bytes spill stores"),
            "spill_loads": num(r"(\d+) bytes spill loads"), "stack": num(r"(\d+) bytes stack frame"),
            "shared_bytes": kernel.metadata.shared, "mma": mma, "ptxas_ok": r.returncode == 0,
            "ptx_ops": {op: len(re.findall(pat, ptx)) for op, pat in PTX_OPS.items()}}


#: PTX instructions counted in a report (static counts in the kernel's text, not executions)
PTX_OPS = {"wgmma": r"wgmma\.mma_async", "tcgen05.mma": r"tcgen05\.mma\.", "wgmma_wait": r"wgmma\.wait_group", "cp.async": r"cp\.async\.(?:ca|cg)",
           "cp.async.bulk": r"cp\.async\.bulk", "mbarrier.wait": r"mbarrier\.try_wait",
           "mbarrier.arrive": r"mbarrier\.arrive", "setmaxnreg": r"setmaxnreg", "bar.sync": r"bar\.sync|barrier\.sync",
           "ld.global.v4": r"ld\.global(?:\.\w+)*\.v4", "st.shared": r"st\.shared", "fence.proxy.async": r"fence\.proxy\.async"}


def launch_report(opts, *, story: bool = False, arch=90, maxnreg=None) -> dict:
    """The compiler's report for one launch of the tuned head-batched kernel with ``opts``
    (planning.Launch; a split launch writes ``opts.partials`` partials), or of the story's
    stage-2 kernel with ``opts.tiles`` (``story=True``)."""
    from .kernels.decode.head_batched import LOOP_CODE, _head_batched_kernel, _story_kernel
    t = opts.tiles
    c = dict(PAGE_SIZE=PAGE_SIZE, PAGE_BYTES=page_bytes(PAGE_SIZE), HAS_TOPK_LEN=False, HAS_SINK=False,
             BLOCK_H=t.block_h, BLOCK_N=t.block_n, D=HEAD_DIM, NOPE=NOPE_DIM, DOT=triton.language.bfloat16)
    types = {}
    if story:
        kernel = _story_kernel
    else:
        kernel = _head_batched_kernel
        c.update(SPLIT=opts.nsplit > 1, LOOP=LOOP_CODE[t.loop], L2_HINT=True, LAUNCH_DEPENDENTS=opts.pdl,
                 DEQUANT_BITS=opts.dequant == "bits", FOLD_SCALE=opts.fold_scale)
        if opts.nsplit > 1:
            types = {"O": "*bf16" if opts.partials == "bfloat16" else "*fp32"}
    k = compile_kernel(kernel, c, num_warps=t.num_warps, num_stages=t.num_stages, arch=arch, maxnreg=maxnreg,
                       ptr_types=types)
    return {"kernel": "story" if story else "tuned", **opts.as_dict(), "maxnreg": maxnreg, "arch": arch,
            "triton": triton.__version__, **report(k, arch)}


#: GPUs the package is compile-checked for (experiments/other_gpus_compile): SM counts and the
#: shared memory a block may opt into, from public specifications; none was measured by the lab
TARGETS = {
    "H200": ("NVIDIA H200", 132, "9.0", 232_448),
    "B200": ("NVIDIA B200", 148, "10.0", 232_448),
    "RTX PRO 6000": ("NVIDIA RTX PRO 6000 Blackwell", 188, "12.0", 101_376),
    "GB10": ("NVIDIA GB10", 48, "12.1", 101_376),
    "L40S": ("NVIDIA L40S", 142, "8.9", 101_376),
}


@dataclass
class Captured:
    """One Triton launch the package asked for inside :func:`planned_for` (recorded, not run)."""
    fn: object
    grid: object
    args: tuple
    kwargs: dict

    @property
    def name(self) -> str:
        return self.fn.fn.__name__


def target_info(name: str):
    """The DeviceInfo the package plans for on TARGETS[name], in compile mode."""
    from .device import DeviceInfo
    full, sms, cap, smem = TARGETS[name]
    return DeviceInfo("compile", full, sms, cap, smem, None, torch.__version__, triton.__version__, None)


@contextlib.contextmanager
def planned_for(target):
    """Compile mode: inside the block the package plans as on ``target`` (a DeviceInfo: its
    capability picks the tiles, its SM count the splits and grids) and every Triton launch, an
    autotuned one once per config, is recorded in the list yielded instead of run. Plans are cached
    per shape, so plan for one target per process."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction
    from . import device
    from .kernels.launch import triton_launches
    if device.mode() != "compile":
        raise RuntimeError(f"planned_for needs DSV4LAB_MODE=compile (nothing runs), this process is in {device.mode()} mode")
    launches: list[Captured] = []

    def record(fn, *args, grid, warmup, **kwargs):
        launches.append(Captured(fn, grid, args, kwargs))

    def record_each_config(tuner, *args, **kwargs):
        for cfg in tuner.configs:
            tuner.fn.run(*args, **{**kwargs, **cfg.all_kwargs()})

    saved = JITFunction.run, Autotuner.run
    JITFunction.run, Autotuner.run = record, record_each_config
    device._PLANNED.append(target)
    try:
        with triton_launches():
            yield launches
    finally:
        JITFunction.run, Autotuner.run = saved
        device._PLANNED.pop()


_TYPE = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
         torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
         torch.bool: "i1", torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5"}
#: launch keywords that are options of the compile, not kernel arguments
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl", "launch_cooperative_grid")


def signature(c: Captured):
    """(signature, constexprs, attrs, options) of a recorded launch, as Triton's launcher would
    specialize it: pointers by dtype and 16-byte alignment, ints by width, ``% 16 == 0`` and
    ``== 1``, None a constexpr. Two launches with the same signature compile to the same kernel."""
    fn = c.fn
    bound = dict(zip(fn.arg_names, c.args))
    bound.update((k, v) for k, v in c.kwargs.items() if k not in _OPTIONS)
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        v = bound[p.name] if p.name in bound else p.default
        if p.is_constexpr or v is None:
            sig[p.name], consts[(i,)] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _TYPE[v.dtype]
            if v.data_ptr() % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            if v == 1 and not p.do_not_specialize:
                sig[p.name], consts[(i,)] = "constexpr", 1
                continue
            sig[p.name] = "i32" if -2**31 <= v < 2**31 else "i64"
            if v % 16 == 0 and not p.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{c.name}: argument {p.name} of type {type(v).__name__} has no compile signature here")
    options = {k: v for k, v in c.kwargs.items() if k in _OPTIONS and v is not None}
    return sig, consts, attrs, options


def compile_captured(c: Captured, arch: int):
    """Compile a recorded launch for sm_``arch`` with its :func:`signature`."""
    sig, consts, attrs, options = signature(c)
    return triton.compile(ASTSource(c.fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", arch, 32),
                          options=options)


def arch_of(capability: str) -> int:
    """Triton's target number for a capability string: "12.1" -> 121."""
    major, minor = capability.split(".")
    return int(major) * 10 + int(minor)


def captured_report(c: Captured, target) -> dict:
    """One recorded launch compiled for ``target``: the compiler's report, whether its shared memory
    fits what a block may use there, and the compile's first error line if it failed."""
    arch = arch_of(target.capability)
    row = {"kernel": c.name, "grid": list(c.grid) if isinstance(c.grid, tuple) else None,
           "constexprs": {k: v if isinstance(v, (bool, int, float, str)) or v is None else str(v)
                          for k, v in c.kwargs.items() if k not in _OPTIONS},
           **{k: c.kwargs.get(k) for k in ("num_warps", "num_stages")},
           "arch": arch, "smem_limit": target.smem_per_block, "triton": triton.__version__}
    try:
        row.update(report(compile_captured(c, arch), arch), compiled=True)
    except Exception as e:  # noqa: BLE001  (a compile failure is the finding: its first error line is kept)
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        row.update(compiled=False, error=next((ln for ln in lines if "error" in ln.lower()), lines[0] if lines else repr(e)))
        return row
    row["fits"] = row["ptxas_ok"] and row["shared_bytes"] <= target.smem_per_block
    return row

# ---- thunks that call the public entries at the campaign's shapes, for planned_launches -------------

def decode_call(impl: str, B: int, K: int):
    """A sparse_decode call of ``impl``: B requests of 64 heads attending to K tokens (topk_len and a sink)."""
    from .api import sparse_decode
    from .testing import make_decode_inputs
    inp = make_decode_inputs(B, 64, K, context=K, topk_len=True, sink=True, seed=0, device="cpu")
    return lambda: sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs())


def indexer_call(B: int, impl: str | None = None):
    """An indexer_topk call (default: S4's indexer): B requests of 8192 live tokens, max context 65536."""
    from .api import indexer_topk
    from .config import DSV4_FLASH
    from .stages import stage
    from .testing import make_indexer_inputs
    inp = make_indexer_inputs(B, DSV4_FLASH.index_heads, 65536, seq_lens=8192, seed=0, device="cpu")
    return lambda: indexer_topk(*inp.args(), max_seq_len=inp.max_seq_len, topk=512,
                                impl=impl or stage("S4").indexer_impl)


def topk_call(B: int, width: int):
    """The top-k alone over B rows of ``width`` logits, 8192 live."""
    from .kernels.indexer.topk import topk_triton
    return lambda: topk_triton(torch.zeros(B, width), torch.full((B,), 8192, dtype=torch.int32), 512)


def step_kernel_calls() -> dict:
    """The decode step's own kernels (kernels/step) at the model's shapes."""
    from .config import DSV4_FLASH as F
    from .kernels.step.mhc import mhc_sinkhorn
    from .kernels.step.moe import moe_grouped_gemm
    n = F.hc_mult
    return {"moe grouped GEMM": lambda: moe_grouped_gemm(torch.zeros(2, 16, F.hidden, dtype=torch.bfloat16),
                                                         torch.zeros(2, F.hidden, 2 * F.moe_intermediate,
                                                                     dtype=torch.bfloat16)),
            "mHC sinkhorn": lambda: mhc_sinkhorn(torch.zeros(32, (2 + n) * n), torch.ones(3), torch.zeros((2 + n) * n),
                                                 n, F.hc_sinkhorn_iters, 1e-6)}


def launch_key(c: Captured) -> str:
    """What a compile depends on: the kernel and its specialized signature (:func:`signature`)."""
    sig, consts, attrs, options = signature(c)
    return repr((c.name, sig, sorted(consts.items()), sorted(attrs.items()), sorted(options.items())))


def planned_launches(target_name: str, calls: dict) -> list[dict]:
    """The package as it would run on TARGETS[target_name]: each call of ``calls`` ({label: a thunk that
    calls a public entry}) made inside :func:`planned_for` (its launches recorded, not run; a call the
    package refuses there is a row with its error), then each distinct launch compiled for the target
    (:func:`captured_report`). Rows: kind "call" (its launches) and kind "launch" (the calls that made it).
    Compile mode; plan for one target per process (plans are cached per shape)."""
    target = target_info(target_name)
    unique, rows = {}, []
    for label, thunk in calls.items():
        row = {"kind": "call", "target": target_name, "call": label}
        with planned_for(target) as launches:
            try:
                thunk()
            except Exception as e:  # noqa: BLE001  (a call the package refuses here is a row, e.g. no sglang wheel)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        row["launches"] = [c.name for c in launches]
        rows.append(row)
        for c in launches:
            unique.setdefault(launch_key(c), (c, []))[1].append(label)
    for c, labels in unique.values():
        r = {"kind": "launch", "target": target_name, "calls": labels, **captured_report(c, target)}
        print({k: r.get(k) for k in ("target", "kernel", "registers", "spill_stores", "shared_bytes", "smem_limit",
                                     "fits", "mma", "error")}, file=sys.stderr, flush=True)
        rows.append(r)
    return rows


if __name__ == "__main__":
    import dsv4lab  # noqa: F401
    from .kernels.decode.planning import STORY_TILES, Launch, TileConfig
    # BLOCK_H BLOCK_N warps stages [nsplit], and the words: a loop name (plain, registers, l2_hint),
    # "bits" (the integer dequant), "fold" (the folded softmax scale), "story" (the story's kernel)
    words = {a for a in sys.argv[1:] if not a.isdigit()}
    args = [int(a) for a in sys.argv[1:] if a.isdigit()]
    if "story" in words:
        print(launch_report(Launch(STORY_TILES), story=True))
    else:
        bh, bn, nw, ns, *rest = args or [64, 128, 8, 1]
        loop = next((w for w in words if w in ("plain", "registers", "l2_hint")), "plain")
        tiles = TileConfig(bh, bn, nw, ns, "command line", loop=loop)
        print(launch_report(Launch(tiles, nsplit=(rest or [1])[0], dequant="bits" if "bits" in words else "cvt",
                                   fold_scale="fold" in words)))
