"""Does keeping workspaces per caller (dsv4lab.concurrency, issue 46) cost the eager host path or
CUDA-graph replay? One JSON.

    PYTHONPATH=. python experiments/eager_host_path/per_caller.py OUT.json [--cpu-smoke] [--rounds N]

Each call is timed both ways, alternating ``--rounds`` times (a host's speed drifts between rows
minutes apart): ``workspaces`` "per caller" (the lab since issue 46: workspaces and prepared calls
per thread and CUDA stream, fresh ones during a capture, the top-k's counters from a zeroed arena)
and "shared" (``concurrency.shared_per_process()``: one set per process, used by captures too, as
before issue 46; the other changes of issue 46 are in both). Calls (DSv4's shapes: H 64, top-k 512,
8192 tokens a request): decode ``splitk_auto`` at B 1 and 32, ``auto`` at B 32 and 128 (the Hopper
kernel on sm_90), the indexer step ``indexer_topk(impl="triton")`` at B 32 (8192 live, max context
262208). Per row: ``host_us`` (the host's time to issue one call, back to back), ``back_to_back_us``
(bench.back_to_back_us: what a caller sees), ``eager_us`` (do_bench), ``graph_us`` (one-call graph
replay), ``graph_bitwise`` (the replay's answer equals the eager one), ``flags`` (the error word).
``summary``: per call and way, the median over rounds of each time. Expected on an H100/H200:
about 3 minutes.
"""
import contextlib
import os
import statistics
import sys
from pathlib import Path

import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

from dsv4lab import concurrency
from dsv4lab.testing import make_decode_inputs, make_indexer_inputs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import time_call  # noqa: E402  (this folder's run.py: eager, host, back to back, graph, bitwise)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "eager_host_path"
WAYS = ("per caller", "shared")


def calls(smoke: bool) -> dict:
    H, K, ctx = (8, 32, 64) if smoke else (64, 512, 8192)
    out = {}
    for impl, B in (("splitk_auto", 1), ("splitk_auto", 32), ("auto", 32), ("auto", 128)):
        B = min(B, 2) if smoke else B
        inp = make_decode_inputs(B, H, K, context=ctx, seed=B)
        out[f"decode {impl} B={B}"] = lambda inp=inp, impl=impl: dsv4lab.sparse_decode(
            inp.q, inp.cache, inp.indices, impl=impl)
    B, L, k = (2, 200, 16) if smoke else (32, 262208, 512)
    ind = make_indexer_inputs(B, 8 if smoke else 64, L, seq_lens=64 if smoke else 8192, seed=13)
    out[f"indexer step B={B}"] = lambda: dsv4lab.indexer_topk(*ind.args(), max_seq_len=L, topk=k, impl="triton")
    return out


def way(name):
    return concurrency.shared_per_process() if name == "shared" else contextlib.nullcontext()


def main(argv=None):
    a = ab.parse_args(__doc__, add=lambda p: p.add_argument("--rounds", type=int, default=5), argv=argv)
    rounds = 1 if a.smoke else a.rounds
    rows = []
    for name, fn in calls(a.smoke).items():
        for r in range(rounds):
            for w in WAYS:
                with way(w):
                    rows.append(ab.attempt(dict(call=name, workspaces=w, round=r),
                                           lambda fn=fn: time_call(fn, a.smoke, graph=True)))
        ab.write(a.out, QUESTION, a.smoke, rows=rows, complete=False)
    summary = {}
    for name in dict.fromkeys(row["call"] for row in rows):
        for w in WAYS:
            got = [row for row in rows if row["call"] == name and row["workspaces"] == w and "error" not in row]
            summary[f"{name} | {w}"] = {k: statistics.median(row[k] for row in got) if got and got[0].get(k) is not None
                                        else None for k in ("host_us", "back_to_back_us", "eager_us", "graph_us")}
    ab.write(a.out, QUESTION, a.smoke, rows=rows, summary=summary, complete=True,
             all_ok=all(row.get("ok") for row in rows))


if __name__ == "__main__":
    main()
