"""kernels.launch.launch_kernel's cache, on a stand-in kernel (the interpreter always takes Triton's
own path, so the direct path is driven here with is_interpret patched off; the GPU test in
test_gpu_safety.py runs it on real kernels)."""
import types

import torch

from dsv4lab.kernels import launch


class FakeCompiled:
    def __init__(self):
        self.function, self.packed_metadata, self.calls = "fn", "meta", []

    def run(self, *a):
        self.calls.append(a)


class FakeKernel:
    """Records kernel[grid](...) calls; parameters x, n, then constexprs A and B (default 7)."""
    params = [types.SimpleNamespace(name=n, default=d) for n, d in (("x", None), ("n", None), ("A", None), ("B", 7))]

    def __init__(self):
        self.slow = []

    def __getitem__(self, grid):
        def call(*args, **consts):
            self.slow.append((grid, args, consts))
            self.compiled = FakeCompiled()
            return self.compiled
        return call


def _direct(monkeypatch):
    monkeypatch.setattr(launch, "is_interpret", lambda: False)
    monkeypatch.setattr(launch, "_DRIVER", [lambda: 0, lambda device: 99])
    monkeypatch.setattr(launch, "_LAUNCHES", {})


def test_second_call_goes_direct_with_constexpr_tail(monkeypatch):
    _direct(monkeypatch)
    k, consts, x, y = FakeKernel(), {"A": 3, "num_warps": 4}, torch.zeros(8), torch.ones(8)
    launch.launch_kernel(k, (2,), (x,), (32,), consts)
    launch.launch_kernel(k, (2,), (y,), (32,), consts)         # another tensor, same signature
    assert len(k.slow) == 1
    (call,) = k.compiled.calls
    assert call[:9] == (2, 1, 1, 99, "fn", "meta", None, None, None)
    assert call[9] is y and call[10:] == (32, 3, 7)        # args, then A from consts, B's default


def test_signature_change_takes_triton_path(monkeypatch):
    _direct(monkeypatch)
    k, consts = FakeKernel(), {"A": 3}
    buf = torch.zeros(16)
    launch.launch_kernel(k, (1,), (buf,), (16,), consts)
    for t, n in ((buf[1:], 16),        # 4 bytes past the alignment (always Triton's path)
                 (buf, 1),             # an int equal to 1
                 (buf, 17),            # an int not a multiple of 16
                 (buf, 2**40),         # past 32 bits
                 (buf, 16.0),          # a float equal to the int (and of the same hash)
                 (buf, True),          # a bool
                 (buf.double(), 16)):  # another dtype
        before = len(k.slow)
        launch.launch_kernel(k, (1,), (t,), (n,), consts)
        assert len(k.slow) == before + 1, (t, n)
    launch.launch_kernel(k, (1,), (buf,), (16,), consts)        # the first call's signature
    launch.launch_kernel(k, (1,), (buf,), (16,), dict(consts))  # an equal but new dict: Triton's path
    launch.launch_kernel(k, (4,), (buf,), (16,), consts)        # another grid
    launch.launch_kernel(k, (1,), (buf[1:],), (16,), consts)    # misaligned again: never cached
    assert len(k.slow) == 11


def test_triton_launches_block_and_interpreter_take_triton_path(monkeypatch):
    k, consts = FakeKernel(), {"A": 1}
    for _ in range(2):
        launch.launch_kernel(k, (1,), (torch.zeros(4),), (16,), consts)   # CPU: the interpreter's mode
    assert len(k.slow) == 2
    _direct(monkeypatch)
    with launch.triton_launches():
        for _ in range(2):
            launch.launch_kernel(k, (1,), (torch.zeros(4),), (16,), consts)
    assert len(k.slow) == 4 and launch._DIRECT[0]


def test_code_torch_compile_traces_takes_triton_path(monkeypatch):
    """Inside a torch.compile trace ``kernel[grid](...)`` is what Dynamo records (a user-defined Triton
    kernel) and it returns no compiled kernel: launch_kernel must neither cache nor call a launcher."""
    _direct(monkeypatch)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    k, consts = FakeKernel(), {"A": 1}
    for _ in range(2):
        launch.launch_kernel(k, (1,), (torch.zeros(4),), (16,), consts)
    assert len(k.slow) == 2 and not launch._LAUNCHES


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *a):
        self.calls.append(a)


class CudaLauncher:
    """Stands in for Triton's launcher: ``launch`` its C launch (a callable that is no Python
    function), scratch sizes, the cooperative and PDL flags."""
    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid, launch_pdl = 0, 1

    def __init__(self):
        self.launch = Recorder()
        self.wrapped = []

    def __call__(self, *a):
        self.wrapped.append(a)


def test_known_triton_calls_the_c_launch_and_others_the_wrapper(monkeypatch):
    _direct(monkeypatch)

    class Kernel(FakeKernel):
        def __getitem__(self, grid):
            def call(*args, **consts):
                self.compiled = FakeCompiled()
                self.compiled.run = CudaLauncher()
                return self.compiled
            return call

    k, consts, x = Kernel(), {"A": 3}, torch.zeros(8)
    monkeypatch.setattr(launch, "C_LAUNCH_TRITON", (launch.triton.__version__,))
    launch.launch_kernel(k, (2,), (x,), (32,), consts)
    launch.launch_kernel(k, (2,), (x,), (32,), consts)
    (call,) = k.compiled.run.launch.calls
    assert not k.compiled.run.wrapped
    # grid, stream, function, cooperative, pdl, two scratch buffers, metadata, three Nones, arguments
    assert call[:13] == (2, 1, 1, 99, "fn", 0, 1, None, None, "meta", None, None, None)
    assert call[13] is x and call[14:] == (32, 3, 7)

    # a Triton whose wrapper was not read, or a kernel that needs scratch memory: the wrapper
    for patch in (("C_LAUNCH_TRITON", ("0.0.",)), ("C_LAUNCH_TRITON", (launch.triton.__version__,))):
        monkeypatch.setattr(launch, *patch)
        monkeypatch.setattr(launch, "_LAUNCHES", {})
        monkeypatch.setattr(CudaLauncher, "global_scratch_size", 0 if patch[1][0] == "0.0." else 64)
        launch.launch_kernel(k, (2,), (x,), (32,), consts)
        launch.launch_kernel(k, (2,), (x,), (32,), consts)
        (call,) = k.compiled.run.wrapped
        assert not k.compiled.run.launch.calls
        assert call[:9] == (2, 1, 1, 99, "fn", "meta", None, None, None) and call[9] is x


def test_a_launch_hook_takes_triton_path(monkeypatch):
    # the direct path passes no hooks: with an enter or an exit hook installed, Triton's path runs them
    _direct(monkeypatch)
    k, consts, x = FakeKernel(), {"A": 1}, torch.zeros(4)
    launch.launch_kernel(k, (1,), (x,), (16,), consts)
    for chain in (launch.triton.knobs.runtime.launch_enter_hook, launch.triton.knobs.runtime.launch_exit_hook):
        hook = lambda *a: None  # noqa: E731
        chain.add(hook)
        try:
            before = len(k.slow)
            launch.launch_kernel(k, (1,), (x,), (16,), consts)
            assert len(k.slow) == before + 1
        finally:
            chain.remove(hook)
    launch.launch_kernel(k, (1,), (x,), (16,), consts)          # no hook: the direct path again
    assert len(k.slow) == 3


def test_a_bound_launch_is_the_direct_path_without_the_key(monkeypatch):
    _direct(monkeypatch)
    device = [0]
    monkeypatch.setattr(launch, "_DRIVER", [lambda: device[0], lambda d: 99])
    k, consts, x, y = FakeKernel(), {"A": 3}, torch.zeros(8), torch.ones(8)
    unbound = launch.bind_launch(k, (2,), (32,), consts, (torch.float32,))      # not launched yet: launch_kernel
    unbound(x)
    bound = launch.bind_launch(k, (2,), (32,), consts, (torch.float32,))
    monkeypatch.setattr(launch, "_LAUNCHES", {})        # the key is not looked up again
    bound(y)
    assert len(k.slow) == 1
    (call,) = k.compiled.calls
    assert call[:9] == (2, 1, 1, 99, "fn", "meta", None, None, None) and call[9] is y and call[10:] == (32, 3, 7)
    # whenever launch_kernel would not go direct, neither does a bound launch
    bound(torch.zeros(9)[1:])                                                   # off 16-byte alignment
    with launch.triton_launches():
        bound(y)
    device[0] = 1                                                               # another current device
    bound(y)
    assert len(k.slow) == 4 and k.compiled.calls == []
    # another signature (dtype) or the interpreter: launch_kernel itself
    assert launch.bind_launch(k, (2,), (32,), consts, (torch.float64,)).__name__ == "through_triton"
    monkeypatch.setattr(launch, "is_interpret", lambda: True)
    assert launch.bind_launch(k, (2,), (32,), consts, (torch.float32,)).__name__ == "through_triton"
