# Runs at commit 971bafeb1eb2fcc70cc2c5b9747b0797d8c2c218 as tools/trace_decode.py, not on the current package (its variants were deleted).
"""Where a decode launch's time goes, from the GPU's own clock: every program of the head-batched
kernel (and of split-K's combine kernel) writes %globaltimer at its start, after its last tile and
after its stores, and its SM id (kernels.common.trace_point). One JSON.

    python tools/trace_decode.py OUT.json

Cases (DSv4-Flash shapes, H 64, top-k 512, 8192 tokens per request, CUDA-graph replay):
  splitk B=1 (the launches choose_split picks), mma B=1, mma B=128, and mma B=128 with every
  request reading the same 512 tokens (after the first touch they sit in L2: the gathers no longer
  queue on HBM). For each: the do_bench median with and without tracing, and, over 20 replays with
  L2 flushed before each, the medians of: program start spread, program duration, time in the
  tile loop, gap between the split launch's last store and the combine's first start, span from
  the first program start to the last store.
"""
import json
import statistics
import subprocess
import sys
import time

import torch

import dsv4lab  # noqa: F401  (first: decides the mode before triton is imported)
import triton
from dsv4lab import bench
from dsv4lab.kernels import head_batched, split_k
from dsv4lab.testing import make_decode_inputs

H, K, SCALE = 64, 512, 512 ** -0.5


def launches(inp, case, traces=None):
    """The launches of one case as a closure; ``traces``: dict of int64 buffers to fill."""
    B = inp.q.shape[0]
    out = torch.empty(B, H, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(B, H, dtype=torch.float32, device="cuda")
    t = traces or {}
    if case.startswith("splitk"):
        plan = split_k.choose_split(B, H, K)
        o_part, lse_part, _ = split_k.workspace(B, H, plan.nsplit, inp.q.device, split_k.partials_dtype())

        def fn():
            head_batched.launch(inp.q, inp.cache, inp.indices, None, SCALE, None, o_part, lse_part,
                                nsplit=plan.nsplit, cfg=plan.cfg, trace=t.get("split"))
            split_k.combine(o_part, lse_part, None, out, lse, trace=t.get("combine"))
        shape = {"split": plan.programs, "combine": B * H // split_k.COMBINE_HEADS}
        info = dict(nsplit=plan.nsplit, block_h=plan.cfg.block_h, block_n=plan.cfg.block_n)
    else:
        cfg = head_batched.choose_tiles(B, H, K)

        def fn():
            head_batched.launch(inp.q, inp.cache, inp.indices, None, SCALE, None, out, lse, cfg=cfg,
                                trace=t.get("split"))
        shape = {"split": B * triton.cdiv(H, cfg.block_h)}
        info = dict(block_h=cfg.block_h, block_n=cfg.block_n, tiles_per_program=triton.cdiv(K, cfg.block_n))
    return fn, shape, info


def stats(xs):
    xs = sorted(xs)
    return {"min": xs[0] / 1e3, "median": statistics.median(xs) / 1e3, "max": xs[-1] / 1e3}   # us


def summarize(tr):
    """tr: {"split": [P, 4], "combine": [Q, 4]} int64 ns of one replay -> us figures."""
    s = tr["split"].tolist()
    t0 = min(r[0] for r in s)
    d = {"split_start_spread_us": (max(r[0] for r in s) - t0) / 1e3,
         "split_program_us": stats([r[2] - r[0] for r in s]),
         "split_loop_us": stats([r[1] - r[0] for r in s]),
         "split_after_loop_us": stats([r[2] - r[1] for r in s]),
         "split_span_us": (max(r[2] for r in s) - t0) / 1e3,
         "sms": len({r[3] for r in s})}
    if "combine" in tr:
        c = tr["combine"].tolist()
        d.update(gap_split_end_to_combine_start_us=(min(r[0] for r in c) - max(r[2] for r in s)) / 1e3,
                 combine_start_spread_us=(max(r[0] for r in c) - min(r[0] for r in c)) / 1e3,
                 combine_program_us=stats([r[2] - r[0] for r in c]),
                 span_us=(max(r[2] for r in c) - t0) / 1e3)
    return d


def run_case(case, B, same_tokens=False, reps=20):
    inp = make_decode_inputs(B, H, K, context=8192, seed=900 + B)
    if same_tokens:
        inp.indices.copy_(inp.indices[:1].expand_as(inp.indices))
    plain, shape, info = launches(inp, case)
    us_plain = bench.time_ms(plain, graph=True) * 1e3
    traces = {k: torch.zeros(n, 4, dtype=torch.int64, device="cuda") for k, n in shape.items()}
    traced, _, _ = launches(inp, case, traces)
    us_traced = bench.time_ms(traced, graph=True) * 1e3
    g, _ = bench.capture(traced)
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    rows = []
    for _ in range(reps):
        flush.zero_()
        g.replay()
        torch.cuda.synchronize()
        rows.append(summarize({k: v.cpu() for k, v in traces.items()}))
    med = {}
    for key in rows[0]:
        v = [r[key] for r in rows]
        med[key] = ({k: statistics.median(x[k] for x in v) for k in v[0]} if isinstance(v[0], dict)
                    else statistics.median(v))
    res = dict(case=case, B=B, same_tokens=same_tokens, **info, graph_us=us_plain, graph_us_traced=us_traced,
               replays=reps, medians=med, last_replay={k: v.cpu().tolist() for k, v in traces.items()})
    print(json.dumps({k: v for k, v in res.items() if k != "last_replay"}), flush=True)
    return res


def clocks_while(fn, seconds=3.0):
    """SM clock and power sampled by nvidia-smi while ``fn`` (a graph replay) runs in a loop."""
    p = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                          "-lms", "100"], stdout=subprocess.PIPE, text=True)
    t = time.time()
    while time.time() - t < seconds:
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
    p.terminate()
    vals = [line.split(",") for line in p.communicate()[0].strip().splitlines() if "," in line]
    mhz = [float(a) for a, _ in vals[3:]]          # skip the samples from before the load
    watts = [float(b) for _, b in vals[3:]]
    return {"sm_mhz_median": statistics.median(mhz) if mhz else None, "sm_mhz_min": min(mhz) if mhz else None,
            "power_w_median": statistics.median(watts) if watts else None, "samples": len(mhz)}


if __name__ == "__main__":
    out = {**bench.environment(), "part": "trace_decode", "cases": []}
    for case, B, same in (("splitk", 1, False), ("mma", 1, False), ("mma", 128, False), ("mma", 128, True),
                          ("splitk", 32, False), ("mma", 32, False)):
        out["cases"].append(run_case(case, B, same))
    inp = make_decode_inputs(128, H, K, context=8192, seed=5)
    fn, _, _ = launches(inp, "mma")
    g, _ = bench.capture(fn)
    out["clocks_mma_B128"] = clocks_while(g.replay)
    inp1 = make_decode_inputs(1, H, K, context=8192, seed=6)
    fn1, _, _ = launches(inp1, "mma")
    g1, _ = bench.capture(fn1)
    out["clocks_mma_B1"] = clocks_while(g1.replay)
    print(out["clocks_mma_B128"], out["clocks_mma_B1"], flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1, default=str)
