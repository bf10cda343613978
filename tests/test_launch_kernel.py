"""kernels.common.launch_kernel's cache, on a stand-in kernel (the interpreter always takes Triton's
own path, so the direct path is driven here with is_interpret patched off; the GPU test in
test_gpu_safety.py runs it on real kernels)."""
import types

import torch

from dsv4lab.kernels import common


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
    monkeypatch.setattr(common, "is_interpret", lambda: False)
    monkeypatch.setattr(common, "_DRIVER", [lambda: 0, lambda device: 99])
    monkeypatch.setattr(common, "_LAUNCHES", {})


def test_second_call_goes_direct_with_constexpr_tail(monkeypatch):
    _direct(monkeypatch)
    k, consts, x, y = FakeKernel(), {"A": 3, "num_warps": 4}, torch.zeros(8), torch.ones(8)
    common.launch_kernel(k, (2,), (x,), (32,), consts)
    common.launch_kernel(k, (2,), (y,), (32,), consts)         # another tensor, same signature
    assert len(k.slow) == 1
    (call,) = k.compiled.calls
    assert call[:9] == (2, 1, 1, 99, "fn", "meta", None, None, None)
    assert call[9] is y and call[10:] == (32, 3, 7)        # args, then A from consts, B's default


def test_signature_change_takes_triton_path(monkeypatch):
    _direct(monkeypatch)
    k, consts = FakeKernel(), {"A": 3}
    buf = torch.zeros(16)
    common.launch_kernel(k, (1,), (buf,), (16,), consts)
    for t, n in ((buf[1:], 16),        # 4 bytes past the alignment (always Triton's path)
                 (buf, 1),             # an int equal to 1
                 (buf, 17),            # an int not a multiple of 16
                 (buf, 2**40),         # past 32 bits
                 (buf, 16.0),          # a float equal to the int (and of the same hash)
                 (buf, True),          # a bool
                 (buf.double(), 16)):  # another dtype
        before = len(k.slow)
        common.launch_kernel(k, (1,), (t,), (n,), consts)
        assert len(k.slow) == before + 1, (t, n)
    common.launch_kernel(k, (1,), (buf,), (16,), consts)        # the first call's signature
    common.launch_kernel(k, (1,), (buf,), (16,), dict(consts))  # an equal but new dict: Triton's path
    common.launch_kernel(k, (4,), (buf,), (16,), consts)        # another grid
    common.launch_kernel(k, (1,), (buf[1:],), (16,), consts)    # misaligned again: never cached
    assert len(k.slow) == 11


def test_triton_launches_block_and_interpreter_take_triton_path(monkeypatch):
    k, consts = FakeKernel(), {"A": 1}
    for _ in range(2):
        common.launch_kernel(k, (1,), (torch.zeros(4),), (16,), consts)   # CPU: the interpreter's mode
    assert len(k.slow) == 2
    _direct(monkeypatch)
    with common.triton_launches():
        for _ in range(2):
            common.launch_kernel(k, (1,), (torch.zeros(4),), (16,), consts)
    assert len(k.slow) == 4 and common._DIRECT[0]
