"""Where the lab runs: a CUDA GPU (real timings) or Triton's CPU interpreter.

``import dsv4lab`` calls :func:`configure` before anything imports triton:
without a CUDA GPU it sets ``TRITON_INTERPRET=1`` (Triton reads it when it is
first imported, so it must come first). If triton was already imported without
it, we stop with an error that says what to do instead of running kernels that
would fail later in a confusing way.
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import asdict, dataclass

import torch

from .errors import OneLine

#: the packages whose versions a recorded run stamps beside its device (bench.environment; runs.versions)
VERSIONED = ("torch", "triton")

#: Interpreter traps seen with triton 3.6-3.9 and what the lab does about each.
INTERPRETER_TRAPS = {
    "bf16 tl.dot": "numpy multiplies the raw uint16 bits -> garbage; kernels take a "
                   "constexpr DOT_DTYPE (float32 when interpreting, bfloat16 on GPU)",
    "bf16 arithmetic": "cast to float32 before arithmetic",
    "autotune": "@triton.autotune with 2+ configs fails ('0 active drivers'); the lab "
                "launches kernel.fn with one explicit config when interpreting",
    "do_bench": "triton.testing.do_bench needs a GPU; timings are only taken in cuda mode",
    "fp32->bf16 cast": "the interpreter truncates instead of rounding to nearest (2x the "
                       "rounding error); kernels store fp32 there and torch rounds (kernels.buffers.out_dtype)",
    "speed": "programs run one after another in numpy (~ms each): keep grids small",
}

_MODE: str | None = None


class ModeError(OneLine, RuntimeError):
    """The mode cannot be decided (a bad DSV4LAB_MODE, or triton imported too early): one line."""


def started_as_cli() -> bool:
    """This process is the lab's command line: ``python -m dsv4lab[.module] ...`` or the ``dsv4lab``
    script (there, a setup error is one line on stderr and exit status 2, not a traceback)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1].split(".")[0] == "dsv4lab"
    return os.path.basename(sys.argv[0]) == "dsv4lab"


def exit_on_mode_error():
    """configure(), with a ModeError turned into one line on stderr and exit status 2 when this
    process is the lab's command line (``import dsv4lab`` calls it)."""
    try:
        configure()
    except ModeError as e:
        if not started_as_cli():
            raise
        sys.stderr.write(f"dsv4lab: {e}\n")
        raise SystemExit(2) from None


def configure() -> str:
    """Decide the mode once per process and set the environment Triton reads."""
    global _MODE
    if _MODE is not None:
        return _MODE
    forced = os.environ.get("DSV4LAB_MODE", "").strip().lower()
    if forced not in ("", "cuda", "interpret", "compile"):
        raise ModeError(f"DSV4LAB_MODE must be 'cuda', 'interpret' or 'compile', got {forced!r}")
    if forced == "compile":
        # compile-only: kernels are compiled ahead of time for a GPU this machine lacks
        # (dsv4lab.compile_report), never run; Triton must not be in interpreter mode.
        if os.environ.get("TRITON_INTERPRET") == "1":
            raise ModeError("DSV4LAB_MODE=compile conflicts with TRITON_INTERPRET=1")
        _MODE = "compile"
        return _MODE
    has_cuda = torch.cuda.is_available()
    if forced == "cuda" and not has_cuda:
        raise ModeError("DSV4LAB_MODE=cuda but torch sees no CUDA GPU")
    interpret = (forced == "interpret" or not has_cuda
                 or (os.environ.get("TRITON_INTERPRET") == "1" and forced != "cuda"))
    if interpret and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            raise ModeError(
                "triton was imported before dsv4lab without TRITON_INTERPRET=1, and this "
                "process needs Triton's interpreter (no CUDA GPU). Import dsv4lab before "
                "triton (or anything that imports it), or start Python with "
                "TRITON_INTERPRET=1 set in the environment.")
        os.environ["TRITON_INTERPRET"] = "1"
    if not interpret and os.environ.get("TRITON_INTERPRET") == "1":
        raise ModeError("DSV4LAB_MODE=cuda conflicts with TRITON_INTERPRET=1; unset one of them")
    _MODE = "interpret" if interpret else "cuda"
    return _MODE


def mode() -> str:
    """'cuda' (compiled kernels on the GPU), 'interpret' (Triton's CPU interpreter), or
    'compile' (DSV4LAB_MODE=compile: ahead-of-time compiler reports only, nothing runs)."""
    return configure()


def is_interpret() -> bool:
    return (_MODE or configure()) == "interpret"     # every launch asks: the decided mode first


def gpu_unavailable_reason() -> str | None:
    """None in cuda mode; else one line saying why nothing runs on a GPU here and what the lab does
    instead (for notebooks: print it in place of a live timing)."""
    m = mode()
    if m == "cuda":
        return None
    if m == "compile":
        return ("DSV4LAB_MODE=compile: kernels are compiled for a GPU this machine lacks, never run; "
                "timings are the recorded ones in data/runs/")
    return ("no CUDA GPU in this process: the kernels run in Triton's CPU interpreter on small shapes; live "
            "timings are skipped and the recorded H200 timings (data/runs/h200/) are shown instead")


def torch_device() -> torch.device:
    """Where the lab puts tensors: the GPU, or the CPU when interpreting."""
    return torch.device("cuda" if mode() == "cuda" else "cpu")


@dataclass(frozen=True)
class DeviceInfo:
    mode: str
    name: str
    sm_count: int | None
    capability: str | None
    smem_per_block: int | None
    memory_gb: float | None
    torch: str
    triton: str
    cuda: str | None

    def as_dict(self) -> dict:
        return asdict(self)


#: compile mode only: the device compile_report.planned_for() makes the package plan for
_PLANNED: list = []


def info() -> DeviceInfo:
    """This process's device (in compile mode, inside ``compile_report.planned_for``: its target)."""
    return _PLANNED[-1] if _PLANNED else _probe()


@functools.cache
def _probe() -> DeviceInfo:
    import triton
    m = mode()
    if m == "cuda":
        p = torch.cuda.get_device_properties(0)
        smem = getattr(p, "shared_memory_per_block_optin", None)
        return DeviceInfo(m, p.name, p.multi_processor_count, f"{p.major}.{p.minor}", smem,
                          round(p.total_memory / 2**30, 1), torch.__version__, triton.__version__,
                          torch.version.cuda)
    import platform
    how = "Triton interpreter" if m == "interpret" else "compile only (no GPU)"
    return DeviceInfo(m, f"CPU ({platform.processor() or platform.machine()}), {how}",
                      None, None, None, None, torch.__version__, triton.__version__, None)


@dataclass(frozen=True)
class Ceilings:
    """Measured copy bandwidth (bytes read + written) and bf16 matmul rate."""
    copy_tb_s: float | None
    bf16_tflops: float | None
    how: str
    fp32_tflops: float | None = None      # CUDA cores: an fp32 matmul with TF32 off

    @property
    def ridge_flop_per_byte(self) -> float | None:
        if not self.copy_tb_s or not self.bf16_tflops:
            return None
        return self.bf16_tflops / self.copy_tb_s

    def as_dict(self) -> dict:
        return {**asdict(self), "ridge_flop_per_byte": self.ridge_flop_per_byte}


@functools.cache
def ceilings() -> Ceilings:
    """Measure the two ceilings once per process (GPU); unavailable on CPU.

    Copy: a 2 GiB device-to-device copy, counting bytes read plus written.
    Matmul: 8192^3 bf16 on random data (zeros run faster and would flatter it).
    Both are medians over ``do_bench`` repeats after warm-up.
    """
    if mode() != "cuda":
        return Ceilings(None, None, "unavailable in interpret mode; see data/runs/ for recorded ones")
    from triton.testing import do_bench
    n = 2**30 // 2  # 1 GiB of bf16 per buffer
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    copy = 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e12
    del src, dst
    s = 8192
    a = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(s, s, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=100, rep=500, return_mode="median")
    mm = 2 * s**3 / (ms * 1e-3) / 1e12
    a, b = a.float(), b.float()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False      # the CUDA cores, not TF32 tensor cores
    try:
        ms = do_bench(lambda: a @ b, warmup=5, rep=200, return_mode="median")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    fp32 = 2 * s**3 / (ms * 1e-3) / 1e12
    del a, b
    torch.cuda.empty_cache()
    return Ceilings(round(copy, 3), round(mm, 1),
                    "do_bench median: 1 GiB D2D copy (read+write); 8192^3 bf16 matmul, random data; "
                    "8192^3 fp32 matmul with TF32 off (CUDA cores)", round(fp32, 1))


#: Devices the lab plans for but may not have: datasheet figures (``source``), nothing measured by
#: the lab. The RTX PRO 6000 row is the story's node; its bf16 figure is derived from the datasheet's
#: "4,000 AI TOPS" (FP4 with 2:4 sparsity): halved for dense, halved per precision step to bf16.
KNOWN_DEVICES = {
    "NVIDIA H100 80GB HBM3": dict(sm_count=132, capability="9.0", smem_per_block=232_448,
                                  hbm_tb_s_datasheet=3.35, bf16_tflops_datasheet=989, fp32_tflops_datasheet=67,
                                  source="NVIDIA H100 Tensor Core GPU datasheet, SXM5: 67 TFLOPS FP32, "
                                         "989 TFLOPS BF16 dense, 3.35 TB/s HBM3, 132 SMs"),
    "NVIDIA H200": dict(sm_count=132, capability="9.0", smem_per_block=232_448,
                        hbm_tb_s_datasheet=4.8, bf16_tflops_datasheet=989, fp32_tflops_datasheet=67,
                        source="NVIDIA H200 Tensor Core GPU datasheet, SXM: 67 TFLOPS FP32, 989 TFLOPS "
                               "BF16 dense, 4.8 TB/s HBM3e; the H100's 132 SMs"),
    "NVIDIA RTX PRO 6000 Blackwell": dict(sm_count=188, capability="12.0", smem_per_block=101_376,
                                          hbm_tb_s_datasheet=1.792, bf16_tflops_datasheet=500,
                                          fp32_tflops_datasheet=125,
                                          source="NVIDIA RTX PRO 6000 Blackwell datasheet: 24,064 CUDA cores "
                                                 "(188 SMs of 128), 125 TFLOPS FP32 peak, 4,000 AI TOPS "
                                                 "(FP4, sparse; bf16 dense derived: 500), 96 GB GDDR7 at "
                                                 "1,792 GB/s",
                                          note="the story's node (sm_120, GDDR7); not measured here"),
}
