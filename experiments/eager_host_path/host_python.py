"""The Python an eager call runs around its Triton launches, timed on the CPU with the launches stubbed out.

    PYTHONPATH=. python experiments/eager_host_path/host_python.py OUT.json [--cpu-smoke] [--profile]

Every ``kernel[grid](...)`` is replaced by a recorder that counts the launch and returns at once
(``triton.runtime.jit.KernelInterface.__getitem__``, which both the GPU's JITFunction and the
interpreter's InterpretedFunction use), so what is timed is the API's checks, the guard, the launch
planning, the allocations, the error word and the argument lists built for each launch, not
Triton's own launch path (its argument binding: ~11-15 us a launch on the H200 host, measured by
run.py's ``triton_launch_us``) and not the GPU. Each call is timed twice (``launch``): "direct",
where ``kernels.launch.launch_kernel`` takes its GPU path (it builds the signature's key and hands
the arguments to a stand-in for the compiled kernel's C launcher, which only counts), as every
launch after a signature's first does on the GPU; and "triton", where launch_kernel hands every
launch to the recorder (the interpreter's path, and what the rows before the direct launches
measured). Tensors live on the CPU. The kernels store the
GPU's bf16 outputs here too (``buffers.out_dtype`` patched), so the closing ``.to(bfloat16)`` is
the no-op it is on the GPU instead of a CPU conversion of the whole output.

Rows (``rows``), one per call: decode ``splitk_auto`` (``auto`` in the recorded runs) at B 1 / 32 / 128 and ``mma`` at B 32 (H 64, top-k
512), the indexer step ``indexer_topk(impl="triton")`` at B 32 (H_i 64, top-512, 8192 live, max context
65536: see ``cases``); ``python_us``: microseconds per call, the fastest of 40 batches of ``calls`` calls
(``python_us_median``: the median batch);
``launches``: Triton launches per call. ``--profile`` adds the top functions of a cProfile of each
call (``profile``: [function, calls, own s, cumulative s] over the profiled calls). It is a CPU measurement of the
Python alone: the H200's host is a different CPU, and an eager call costs it this Python plus
``launches`` x the Triton launch cost plus whatever torch ops the call runs.
"""
import contextlib
import cProfile
import inspect
import io
import pstats
import statistics
import time
from types import SimpleNamespace

import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import torch
from triton.runtime.jit import KernelInterface

from dsv4lab.kernels import buffers, error_word, launch, rows
from dsv4lab.kernels.decode import head_batched, kv_tiles, planning, split_k
from dsv4lab.kernels.indexer import topk, topk_kernel, triton_indexer
from dsv4lab.testing import make_decode_inputs, make_indexer_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "eager_host_path"


class Launches:
    """Counts the ``kernel[grid](...)`` launches made while :func:`stubbed` is active."""
    count = 0


class FakeCompiled:
    """What ``kernel[grid](...)`` returns on the GPU, as far as launch_kernel's direct path uses it:
    ``run`` (Triton's C launcher; here it only counts), ``function`` and ``packed_metadata``."""
    function = packed_metadata = None

    @staticmethod
    def run(*args):
        Launches.count += 1


def _stub_getitem(kernel, grid):
    def launch(*args, **kwargs):
        Launches.count += 1
        return FakeCompiled
    return launch


def _params(kernel):
    """The ``params`` a JITFunction has and the interpreter's kernels lack (launch_kernel's direct
    path reads the constexprs' names and defaults from them)."""
    return [SimpleNamespace(name=p.name, default=p.default)
            for p in inspect.signature(kernel.fn).parameters.values()]


#: what the launch planning sees of the H200 (planning, the indexer's grid and the top-k's split)
H200 = SimpleNamespace(capability="9.0", sm_count=132)
PLANNED = (planning, triton_indexer, topk)
#: what the library decides once per shape (emptied on entering and leaving :func:`stubbed`); the
#: names it lacks (the library before the per-shape launch arguments) are skipped
PER_SHAPE = [getattr(m, name) for m, name in (
    (split_k, "auto_launch"), (split_k, "splitk_launch"), (head_batched, "mma_launch"), (head_batched, "_launch_args"),
    (split_k, "_combine_args"), (triton_indexer, "_logits_args"), (topk, "_topk_args")) if hasattr(m, name)]


@contextlib.contextmanager
def stubbed(direct: bool = True):
    """Triton launches recorded, not run; the launches planned as on the H200 (tiles, NSPLIT, the
    top-k's split, so the launches per call are the H200's); the kernels' output dtype the GPU's (bf16).
    ``direct``: launch_kernel takes its GPU path (the per-signature key, then the compiled kernel's
    ``run``, here :class:`FakeCompiled`), as on the H200 after a signature's first call; False:
    every launch is a stubbed ``kernel[grid](...)`` (what the interpreter's path costs)."""
    saved = [(m, name, getattr(m, name)) for m in PLANNED for name in ("info", "is_interpret")]
    # launch_kernel's cache is swapped for an empty one: entries made here launch the stand-in
    saved += [(launch, name, getattr(launch, name)) for name in ("is_interpret", "_DRIVER", "_LAUNCHES")]
    launch._LAUNCHES = {}
    given = []                                 # kernels handed a ``params`` here (taken back on leaving)
    if direct:
        launch.is_interpret = lambda: False
        launch._DRIVER = [lambda: 0, lambda device: 0]
        kernels = {k for m in (rows, kv_tiles, error_word, head_batched, split_k, triton_indexer, topk_kernel)
                   for k in vars(m).values()
                   if isinstance(k, KernelInterface)}
        for k in kernels:
            if not hasattr(k, "params"):
                k.params = _params(k)
                given.append(k)
    saved += [(m, "out_dtype", m.out_dtype) for m in (buffers, split_k, head_batched)]
    saved.append((KernelInterface, "__getitem__", KernelInterface.__getitem__))
    for m in PLANNED:
        m.info, m.is_interpret = (lambda: H200), (lambda: False)
    for m in (buffers, split_k, head_batched):
        m.out_dtype = lambda: torch.bfloat16
    KernelInterface.__getitem__ = _stub_getitem
    for f in PER_SHAPE:
        f.cache_clear()
    prepared = dsv4lab.api.prepared_calls()              # indexer_topk's prepared calls: planned here anew
    prepared.clear()
    try:
        yield
    finally:
        for m, name, v in saved:
            setattr(m, name, v)
        for k in given:
            del k.params
        for f in PER_SHAPE:
            f.cache_clear()
        prepared.clear()


def python_us(fn, calls: int, batches: int = 40) -> dict:
    """Microseconds per call of ``fn`` over ``batches`` batches of ``calls`` calls: the fastest batch
    (``python_us``: what the Python costs when nothing else competes for the core, as timeit reports)
    and the median batch (``python_us_median``)."""
    fn()                                     # the first call fills the per-shape caches
    per = []
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t) / calls * 1e6)
    return {"python_us": min(per), "python_us_median": statistics.median(per)}


def launches_per_call(fn) -> int:
    before = Launches.count
    fn()
    return Launches.count - before


def profile(fn, calls: int, top: int = 15) -> list:
    """The ``top`` functions by own time over ``calls`` calls: [name, calls, own s, cumulative s]."""
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    st = pstats.Stats(pr, stream=io.StringIO())
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [[f"{f[0].rsplit('/', 1)[-1]}:{f[1]}({f[2]})", v[1], round(v[2], 6), round(v[3], 6)] for f, v in rows]


def cases(smoke: bool) -> list:
    """(row, fn) for every call timed."""
    H, K, ctx = (8, 32, 64) if smoke else (64, 512, 1024)
    out = []
    for impl, B in (("splitk_auto", 1), ("splitk_auto", 32), ("splitk_auto", 128), ("mma", 32)):
        B = min(B, 2) if smoke else B
        inp = make_decode_inputs(B, H, K, context=ctx, seed=B)
        out.append((dict(op="sparse_decode", impl=impl, B=B, H=H, K=K),
                    lambda inp=inp, impl=impl: dsv4lab.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl)))
    # max context 65536, not run.py's 262208: on the CPU a [32, 262208] fp32 torch.empty (33 MB) is an
    # mmap + munmap every call (~15 us, and not every run), which the GPU's caching allocator does not pay
    B, Hi, L, k = (2, 8, 200, 16) if smoke else (32, 64, 65536, 512)
    inp = make_indexer_inputs(B, Hi, L, seq_lens=64 if smoke else 8192, seed=13)
    out.append((dict(op="indexer_topk", impl="triton", B=B, max_seq_len=L, topk=k),
                lambda: dsv4lab.indexer_topk(*inp.args(), max_seq_len=L, topk=k, impl="triton")))
    return out


def main(argv=None):
    a = ab.parse_args(__doc__, add=lambda p: p.add_argument("--profile", action="store_true",
                                                            help="add a cProfile of each call"), argv=argv)
    calls = 5 if a.cpu_smoke else 100
    rows = []
    for launch in ("direct", "triton"):
        with stubbed(direct=launch == "direct"):
            for row, fn in cases(a.cpu_smoke):
                def measure(fn=fn):
                    got = {"launches": launches_per_call(fn), **python_us(fn, calls)}
                    if a.profile:
                        got["profile"] = profile(fn, calls)
                    return got
                rows.append(ab.attempt({**row, "launch": launch}, measure))
    ab.write(a.out, QUESTION, a.cpu_smoke, rows=rows, calls_per_batch=calls, torch_threads=torch.get_num_threads(),
             note="CPU, Triton launches stubbed out: the Python around the launches, not a GPU measurement")


if __name__ == "__main__":
    main()
