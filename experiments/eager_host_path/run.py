"""The eager host path of the ops, with each check mode, against CUDA-graph replay. One JSON.

    PYTHONPATH=. python experiments/eager_host_path/run.py OUT.json [--cpu-smoke]

Rows (``rows``), one per (op, impl, B, mode), DeepSeek-V4-Flash shapes (H 64, top-k 512, 8192 live
tokens a request, pages of 64; the indexer at B = 32 with 8192 live tokens and the story's max
context 262208, H_i 64, top-512):

* ``eager_us``: do_bench median (L2 flushed) of the eager call: what a caller sees per call when
  the GPU waits on the host (dsv4lab.bench.time_ms);
* ``host_us``: the host's time to issue one call (median over 7 batches of 50 calls issued back to
  back, divided by 50; the GPU runs behind, so this is the host path alone);
* ``graph_us``: the same call replayed from a one-call CUDA graph (mode "device" only: "sync"
  cannot be captured, and captures as "device").

Modes: ``checks="device"`` (the default: no host sync) and ``checks="sync"`` (host checks that
name the offending value). ``launch``: "direct" (the default: kernels.launch.launch_kernel hands a
compiled kernel's C launch its arguments after the first call), "wrapper" (the same through the
compiled kernel's Python wrapper, ``compiled.run``) or "triton" (every launch through Triton's
``kernel[grid](...)``, which binds and specializes the arguments each time); the device mode runs
all three, one right after the other, in the same run. ``repeats``: decode ``splitk_auto`` (``auto`` in runs 1-9) at B 32 and the
indexer step back to back, five samples each of "direct" and "wrapper" alternating, and the graph.
Also ``triton_launch_us`` / ``direct_launch_us``: the host time of one launch of an empty Triton
kernel each way (the floor any eager call pays per launch: split-K launches two kernels, the
indexer step two), and every timed call's eager answer equals its graph replay bitwise with no
error flag set.

Where the host time goes: ``primitives``, host microseconds per call (median of 9 batches of 200
back-to-back calls) of the pieces an eager call is made of (torch.empty, a torch elementwise
launch, an empty Triton kernel through ``kernel[grid]``, through ``compiled.run`` (Triton's Python
wrapper) and through the C launch launch_kernel calls, whole eager calls), and ``profile``, the
top functions by own time in a cProfile of 300 eager calls of decode ``splitk_auto`` at B 32 and of the
indexer step. Expected runtime on an H200: about 2 minutes (compiling included).
"""
import statistics
import time

import contextlib

import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import torch

from dsv4lab import bench, errors
from dsv4lab.kernels import launch
from dsv4lab.testing import make_decode_inputs, make_indexer_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "eager_host_path"


def host_us(fn, smoke, batches=7, calls=50) -> float | None:
    """Median host microseconds to issue one call (``calls`` issued back to back, then a sync)."""
    if smoke:
        fn()
        return None
    per = []
    for _ in range(batches):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per)


def time_call(fn, smoke, *, graph: bool) -> dict:
    row = {"eager_us": ab.time_us(fn, smoke, graph=False), "host_us": host_us(fn, smoke)}
    if not smoke:                           # do_bench's L2 flush hides the host: calls back to back too
        row["back_to_back_us"] = bench.back_to_back_us(fn)["per_call_us"]
    if graph:
        row["graph_us"] = ab.time_us(fn, smoke, graph=True)
        if not smoke:                       # the replayed graph gives the eager answer, bitwise
            first = fn()
            g, res = bench.capture(fn)
            g.replay()
            torch.cuda.synchronize()
            first, res = (first if isinstance(first, tuple) else (first,)), (res if isinstance(res, tuple) else (res,))
            row["graph_bitwise"] = all(torch.equal(a, b) for a, b in zip(first, res))
    row["flags"] = int(errors.read())
    row["ok"] = row["flags"] == 0 and row.get("graph_bitwise", True)
    return row


def empty_launch_us(smoke, direct: bool) -> float | None:
    from dsv4lab.bench import _empty_kernel
    x, consts = torch.zeros(1, device=dsv4lab.device.torch_device()), {}
    with launch_path("direct" if direct else "triton"):
        return host_us(lambda: launch.launch_kernel(_empty_kernel, (1,), (x,), (), consts), smoke)


def launch_path(name):
    if name == "wrapper":
        return wrapper_launches()
    return contextlib.nullcontext() if name == "direct" else launch.triton_launches()


@contextlib.contextmanager
def wrapper_launches():
    """Direct launches through the compiled kernel's Python wrapper (``compiled.run``), never its C
    launch: what launch_kernel did before it called the C launch itself."""
    saved = launch.C_LAUNCH_TRITON
    launch.C_LAUNCH_TRITON = ()
    launch._LAUNCHES.clear()                 # entries made before hold the C launch
    try:
        yield
    finally:
        launch.C_LAUNCH_TRITON = saved
        launch._LAUNCHES.clear()


def repeats(fn, smoke, times=5) -> dict | None:
    """Back-to-back microseconds per call, ``times`` samples each of the direct launch and of the
    wrapper, alternating (the host's speed drifts between rows minutes apart), and the graph's time."""
    if smoke:
        return None
    got = {"direct": [], "wrapper": []}
    for _ in range(times):
        for name in got:
            with launch_path(name):
                got[name].append(round(bench.back_to_back_us(fn)["per_call_us"], 2))
    return {**got, "graph_us": ab.time_us(fn, smoke, graph=True)}


def timed(fn, smoke, mode, launch):
    with launch_path(launch):
        return time_call(fn, smoke, graph=mode == "device")


# (mode, launch) of each row: device mode both ways, sync mode with the default launch
VARIANTS = (("device", "direct"), ("device", "wrapper"), ("device", "triton"), ("sync", "direct"))


def primitives(smoke, cases: dict) -> dict | None:
    """Host microseconds per call of the pieces of an eager call (GPU only)."""
    if smoke:
        return None
    from dsv4lab.bench import _empty_kernel
    from triton.runtime import driver
    dev = dsv4lab.device.torch_device()
    x = torch.zeros(1, device=dev)
    compiled = _empty_kernel[(1,)](x)
    stream = driver.active.get_current_stream(torch.cuda.current_device())
    c_launch, head = launch._launcher(compiled)     # the C launch where launch_kernel calls it, else the wrapper
    prims = {
        "torch.empty 32x64x512 bf16": lambda: torch.empty(32, 64, 512, dtype=torch.bfloat16, device=dev),
        "torch x.add_(1)": lambda: x.add_(1),
        "triton kernel[grid](x)": lambda: _empty_kernel[(1,)](x),
        "compiled.run(x) wrapper": lambda: compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata,
                                                         None, None, None, x),
        "C launch(x)": lambda: c_launch(1, 1, 1, stream, *head, x),
        **{f"eager {k}": f for k, f in cases.items()},
    }
    return {k: round(host_us(f, False, batches=9, calls=200), 2) for k, f in prims.items()}


def main(argv=None):
    a = ab.parse_args(__doc__, argv=argv)
    smoke = a.smoke
    H, K, ctx, batches = (8, 32, 64, (1, 2)) if smoke else (64, 512, 8192, (1, 32, 128))
    rows = []
    payload = dict(rows=rows, complete=False)
    payload["triton_launch_us"] = empty_launch_us(smoke, direct=False)
    payload["direct_launch_us"] = empty_launch_us(smoke, direct=True)
    for B in batches:
        inp = make_decode_inputs(B, H, K, context=ctx, seed=B)
        for impl in ("splitk_auto", "mma"):
            for mode, launch in VARIANTS:
                fn = lambda impl=impl, mode=mode: dsv4lab.sparse_decode(  # noqa: E731
                    inp.q, inp.cache, inp.indices, impl=impl, checks=mode)
                rows.append(ab.attempt(dict(op="sparse_decode", impl=impl, B=B, H=H, K=K, mode=mode, launch=launch),
                                       lambda fn=fn, mode=mode, launch=launch: timed(fn, smoke, mode, launch)))
        ab.write(a.out, QUESTION, smoke, **payload)
        del inp
    B, L = (2, 200) if smoke else (32, 262208)
    inp = make_indexer_inputs(B, 8 if smoke else 64, L, seq_lens=64 if smoke else 8192, seed=13)
    for op, kw in (("indexer_logits", {}), ("indexer_topk", {"topk": 16 if smoke else 512})):
        for mode, launch in VARIANTS:
            fn = lambda op=op, kw=kw, mode=mode: getattr(dsv4lab, op)(  # noqa: E731
                *inp.args(), max_seq_len=L, impl="triton", checks=mode, **kw)
            rows.append(ab.attempt(dict(op=op, impl="triton", B=B, max_seq_len=L, mode=mode, launch=launch),
                                   lambda fn=fn, mode=mode, launch=launch: timed(fn, smoke, mode, launch)))
    dec = make_decode_inputs(*((2, H, K) if smoke else (32, H, K)), context=ctx, seed=1)
    cases = {
        f"decode splitk_auto B={dec.q.shape[0]}": lambda: dsv4lab.sparse_decode(dec.q, dec.cache, dec.indices,
                                                                               impl="splitk_auto"),
        f"indexer step B={B}": lambda: dsv4lab.indexer_topk(*inp.args(), max_seq_len=L, topk=16 if smoke else 512,
                                                             impl="triton"),
    }
    payload["repeats"] = {k: repeats(f, smoke) for k, f in cases.items()}
    payload["primitives"] = primitives(smoke, cases)
    payload["profile"] = {k: ab.host_profile(f, smoke) for k, f in cases.items()}
    payload["complete"] = True
    ab.write(a.out, QUESTION, smoke, **payload)


if __name__ == "__main__":
    main()
