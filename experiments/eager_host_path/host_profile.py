"""Where an eager call's host time goes on the GPU machine: primitives timed alone, then a cProfile
of eager calls. One JSON.

    PYTHONPATH=. python experiments/eager_host_path/host_profile.py OUT.json

``primitives``: host microseconds per call (median of 9 batches of 200 back-to-back calls) of the
pieces an eager call is made of: torch.empty, a torch elementwise launch, the current device and
stream queries Triton's launch makes, an empty Triton kernel launched through ``kernel[grid]`` and
through its compiled launcher directly, and one whole eager call of each case. ``profile``: the
top functions by own time over 300 eager calls of each case (decode ``auto`` at B 32, the indexer
step at B 32, max context 262208). GPU only.
"""
import cProfile
import io
import json
import pstats
import statistics
import sys
import time

import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import torch
from triton.runtime import driver

from dsv4lab import ab
from dsv4lab.bench import _empty_kernel
from dsv4lab.testing import make_decode_inputs, make_indexer_inputs


def per_call_us(fn, batches=9, calls=200) -> float:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(batches):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def profile(fn, calls=300, top=25):
    fn()
    torch.cuda.synchronize()
    p = cProfile.Profile()
    p.enable()
    for _ in range(calls):
        fn()
    p.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(p, stream=io.StringIO())
    rows = sorted(((f"{k[0].split('/')[-1]}:{k[1]}({k[2]})", v[1], v[2] / calls * 1e6, v[3] / calls * 1e6)
                   for k, v in st.stats.items()), key=lambda r: -r[2])
    return [dict(function=f, calls=n / calls, own_us=round(own, 2), cum_us=round(cum, 2)) for f, n, own, cum in rows[:top]]


def main():
    dev = torch.device("cuda")
    x = torch.zeros(1, device=dev)
    compiled = _empty_kernel[(1,)](x)
    d = driver.active
    stream = d.get_current_stream(0)
    dec = make_decode_inputs(32, 64, 512, context=8192, seed=1)
    idx = make_indexer_inputs(32, 64, 262208, seq_lens=8192, seed=2)
    cases = {
        "decode auto B=32": lambda: dsv4lab.sparse_decode(dec.q, dec.cache, dec.indices, impl="auto"),
        "indexer step B=32": lambda: dsv4lab.indexer_topk(*idx.args(), max_seq_len=262208, topk=512, impl="triton"),
    }
    prims = {
        "torch.empty 32x64x512 bf16": lambda: torch.empty(32, 64, 512, dtype=torch.bfloat16, device=dev),
        "torch x.add_(1)": lambda: x.add_(1),
        "torch.cuda.current_device": torch.cuda.current_device,
        "driver get_current_stream": lambda: d.get_current_stream(0),
        "triton kernel[grid](x)": lambda: _empty_kernel[(1,)](x),
        "compiled.run(x) direct": lambda: compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata,
                                                        None, None, None, x),
        **{f"eager {k}": v for k, v in cases.items()},
    }
    out = {"primitives": {k: round(per_call_us(f), 2) for k, f in prims.items()}}
    print(json.dumps(out, indent=1), flush=True)
    out["profile"] = {k: profile(f) for k, f in cases.items()}
    for k, rows in out["profile"].items():
        print(k)
        for r in rows[:15]:
            print(f"  {r['own_us']:7.2f} {r['cum_us']:7.2f} {r['calls']:5.1f}  {r['function']}")
    ab.write(sys.argv[1], "eager_host_path", False, **out)


if __name__ == "__main__":
    main()
