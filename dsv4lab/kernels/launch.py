"""How the lab's kernels launch: ``launch_kernel`` (Triton's compiled launcher called directly after a
signature's first launch), the host-int helpers around a launch, and the tl.dot operand type."""
from __future__ import annotations

import contextlib
import functools
import operator
import threading
import types

import torch
import triton
import triton.language as tl

from ..device import is_interpret


def dot_dtype():
    """tl.dot operand type: bf16 on the GPU; fp32 in the interpreter, whose bf16 dot is wrong."""
    return tl.float32 if is_interpret() else tl.bfloat16


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) of host ints. Host code around a launch uses this, not triton.cdiv: in recent
    Triton that is a constexpr function costing microseconds a call on the host."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n = 0, as triton.next_power_of_2), for host ints."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


#: launch_kernel() goes through Triton's compiled launcher after a signature's first call; False: every
#: launch through ``kernel[grid](...)`` (experiments/eager_host_path measures one against the other)
_DIRECT = [True]
_LAUNCHES: dict = {}
_FIRST_LAUNCH = threading.Lock()


_DTYPE = operator.attrgetter("dtype")
_DATA_PTR = torch.Tensor.data_ptr          # the unbound C method: half the host time of methodcaller


def launch_kernel(kernel, grid: tuple, tensors: tuple, scalars: tuple, consts: dict):
    """``kernel[grid](*tensors, *scalars, **consts)`` with the host cost of a C call after the first time.

    Triton's launch binds and specializes every argument, builds its cache key from the
    constexprs and options and checks the kernel's globals on every call: twice the host time of
    the launch itself on the H200 nodes (experiments/eager_host_path), more than many decode
    launches take on the GPU. Here the first call of a signature goes through Triton, which
    compiles and returns the kernel; later calls hand that kernel's launcher the arguments
    directly. The signature is what Triton specializes on, or finer: the tensors' dtypes, the
    scalars' values and types (Triton looks at an int's ``== 1``, ``% 16 == 0`` and range, and
    never at a float's), the grid, the device and ``consts``, with every tensor 16-byte aligned.
    It is taken with C-level loops (``map``): a Python loop over twenty arguments costs as much as
    the launch.
    ``tensors`` are the kernel's leading parameters, ``scalars`` the hashable ones after them;
    ``consts`` (constexprs and launch options) must be one dict object per shape, as the per-shape
    ``lru_cache`` helpers return. The interpreter, a Triton launch hook (the proton profiler's),
    a tensor off 16-byte alignment (Triton specializes each pointer on it) or ``triton_launches()``
    take Triton's own path."""
    if _takes_triton_path(tensors):
        return kernel[grid](*tensors, *scalars, **consts)
    current_device, current_stream = _DRIVER or _driver()
    device = current_device()
    key = _launch_key(kernel, device, grid, consts, scalars, tuple(map(_DTYPE, tensors)))
    hit = _LAUNCHES.get(key)
    if hit is None:
        with _FIRST_LAUNCH:                  # one thread compiles a signature; the entry serves every caller
            compiled = kernel[grid](*tensors, *scalars, **consts)
            # the launcher takes every parameter in signature order, constexprs included
            tail = tuple(consts.get(p.name, p.default) for p in kernel.params[len(tensors) + len(scalars):])
            if len(_LAUNCHES) >= 4096:
                _LAUNCHES.clear()
            _LAUNCHES[key] = (consts, kernel, compiled, tuple(grid) + (1,) * (3 - len(grid)), *_launcher(compiled),
                              tail)
        return compiled
    _, _, compiled, (g0, g1, g2), call, head, tail = hit
    call(g0, g1, g2, current_stream(device), *head, *tensors, *scalars, *tail)
    return compiled


def _takes_triton_path(tensors) -> bool:
    """A launch that takes Triton's own path: switched there (``triton_launches``), the interpreter,
    a launch hook, a tensor off 16-byte alignment (Triton specializes each pointer on it), or code that
    torch.compile traces (Dynamo records ``kernel[grid](...)`` as a user-defined Triton kernel; the
    direct path's compiled launcher does not exist in a trace)."""
    return (not _DIRECT[0] or is_interpret() or torch.compiler.is_compiling() or _launch_hooked()
            or functools.reduce(operator.or_, map(_DATA_PTR, tensors), 0) & 15)


def _launch_key(kernel, device, grid, consts, scalars, dtypes) -> tuple:
    """launch_kernel's cache key. Values and types: 16 == 16.0 == hash(16.0) and True == 1, but Triton
    compiles each differently. id(kernel), not the kernel: a JITFunction's __hash__ is Python (its
    cache key), ~1 us a launch. The entry holds consts and the kernel, so while it exists their ids
    in its key stay theirs."""
    return id(kernel), device, grid, id(consts), scalars, tuple(map(type, scalars)), dtypes


def bind_launch(kernel, grid: tuple, scalars: tuple, consts: dict, dtypes: tuple):
    """``launch(*tensors)``: launch_kernel for a launch whose grid, scalars and constexprs are fixed and
    whose tensors always have these ``dtypes`` (a prepared call: kernels/indexer.PreparedStep). Where
    launch_kernel has already launched that signature on this device by its direct path, the
    launch hands the compiled kernel's launcher the arguments without building and looking up the
    signature's key each time; it takes launch_kernel whenever launch_kernel would not go direct
    (Triton's path switched on, a launch hook, another current device, a tensor off 16-byte
    alignment). Anywhere else (the interpreter, a signature not launched yet) it is launch_kernel."""
    def through_triton(*tensors):
        return launch_kernel(kernel, grid, tensors, scalars, consts)
    if not _DIRECT[0] or is_interpret() or not _DRIVER:
        return through_triton
    current_device, current_stream = _DRIVER
    device = current_device()
    hit = _LAUNCHES.get(_launch_key(kernel, device, grid, consts, scalars, dtypes))
    if hit is None:
        return through_triton
    _, _, _, (g0, g1, g2), call, head, tail = hit

    def launch(*tensors):
        if _takes_triton_path(tensors) or current_device() != device:
            return through_triton(*tensors)
        call(g0, g1, g2, current_stream(device), *head, *tensors, *scalars, *tail)
    return launch


#: Triton versions whose CudaLauncher.__call__ was read and its C launch's arguments checked (3.6:
#: grid, stream, function, cooperative, pdl, two scratch buffers, then what __call__ receives)
C_LAUNCH_TRITON = ("3.6.",)


def _launcher(compiled) -> tuple:
    """(callable, leading arguments after the grid and stream) of a compiled kernel's launch.
    Triton's ``compiled.run`` (a CudaLauncher) is a Python wrapper that makes a closure and allocates
    scratch buffers on every call before its C launch; where the kernel needs no scratch and this
    Triton's wrapper is one of C_LAUNCH_TRITON, the C launch is called directly (about a microsecond
    less host time a launch on the H200 nodes). Anything else goes through ``compiled.run``."""
    run = compiled.run
    c_launch = getattr(run, "launch", None)
    if (triton.__version__.startswith(C_LAUNCH_TRITON) and type(run).__name__ == "CudaLauncher"
            and callable(c_launch) and not isinstance(c_launch, types.FunctionType)   # not the tensor-descriptor wrapper
            and not run.global_scratch_size and not run.profile_scratch_size):
        return c_launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                          compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


@contextlib.contextmanager
def triton_launches():
    """Inside the block every launch_kernel call takes Triton's own ``kernel[grid](...)`` path (the
    A/B of experiments/eager_host_path and the GPU tests)."""
    before, _DIRECT[0] = _DIRECT[0], False
    try:
        yield
    finally:
        _DIRECT[0] = before


_DRIVER: list = []


def _driver():
    """(current device, current raw stream) functions of Triton's driver, looked up once. Where the
    driver's device function is torch.cuda.current_device, torch's C getter behind it is used: a
    CUDA tensor is at hand, so torch's lazy init (the Python half of that function) has run."""
    from triton.runtime import driver
    get_device = driver.active.get_current_device
    if get_device is torch.cuda.current_device:
        get_device = torch._C._cuda_getDevice
    _DRIVER[:] = [get_device, driver.active.get_current_stream]
    return _DRIVER


def _launch_hooked() -> bool:
    """A launch-enter or -exit hook is installed (Triton 3.6+ keeps them in a HookChain, older ones a
    callable): the direct path passes neither, so a hooked launch goes through Triton."""
    rt = triton.knobs.runtime
    enter, leave = rt.launch_enter_hook, getattr(rt, "launch_exit_hook", None)
    return bool(getattr(enter, "calls", enter)) or bool(getattr(leave, "calls", leave))
