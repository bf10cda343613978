"""Where the hopper kernel's time goes: its launches timed one by one, and the GPU's clock inside
every program (hopper's TRACED constexpr: %globaltimer at the program's start, once Q is in shared
memory, when the producer has stored its first chunk and published its first tile, at the
producer's end, when the consumers see the first tile, finish it, leave the loop and have stored
the output; plus the SM id). One JSON.

    python experiments/hopper_decode/clocks.py OUT.json [--batches 1 32 128]

For each B (H = 64, K = 512, context 8192, page 64, the rule's NSPLIT), CUDA-graph replay medians
(L2 flushed before each replay, as every timing of the lab) of: the whole impl call (split launch,
combine launch), the split launch alone, the combine alone, ``splitk_auto``'s whole call as the baseline (``auto`` in runs before it was named so), and two ablations of the split launch
(hopper's ABLATE constexpr: the producer alone, its consumers only handing the buffers back; the
consumers alone, fed buffers that were never filled; the producer alone without its gather, and
with its gather alone, no dequant or stores); then 20 traced replays of the split
launch alone: per phase the median over programs (median over replays) and the slowest program,
the spread of program starts, and the span from the first start to the last end. ~1 min on an H200.
Without a GPU (--cpu-smoke) the kernel cannot run: the script records hopper's refusal.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import statistics
import time

import torch

from dsv4lab import api
from dsv4lab.device import info
from dsv4lab.kernels.decode import hopper, split_k
from dsv4lab.kernels.buffers import alloc
from dsv4lab.testing import make_decode_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402
import hopper_study  # noqa: E402

QUESTION = "hopper_decode"
H, K, CTX = 64, 512, 8192
SLOTS = ["start", "q in shared memory", "producer: first chunk stored", "producer: first tile published",
         "producer: end", "consumers: first tile ready", "consumers: first tile done", "consumers: loop end",
         "consumers: output stored"]
PHASES = {  # name: (from slot, to slot)
    "q load": (0, 1),
    "first chunk (index -> gather -> dequant -> store)": (1, 2),
    "rest of the first tile (3 chunks)": (2, 3),
    "publish -> consumers see it": (3, 5),
    "first tile's two products + softmax": (5, 6),
    "later tiles (consumers)": (6, 7),
    "output store": (7, 8),
    "whole program": (0, 8),
    "producer ahead of consumers at the end": (4, 7),
}


def phase_stats(traces: list) -> dict:
    """traces: [replays] of int64 [programs, 10]; medians over replays of each phase's median and
    slowest program, the start spread and the span."""
    per = []
    for t in traces:
        t = t.double()
        r = dict(start_spread_us=float(t[:, 0].max() - t[:, 0].min()) / 1e3,
                 span_us=float(t[:, 8].max() - t[:, 0].min()) / 1e3)
        for name, (a, b) in PHASES.items():
            d = (t[:, b] - t[:, a]) / 1e3
            r[f"{name}: median_us"] = float(d.median())
            r[f"{name}: max_us"] = float(d.max())
        per.append(r)
    out = {k: round(statistics.median(p[k] for p in per), 3) for k in per[0]}
    out["sms_used"] = int(traces[-1][:, 9].unique().numel())
    return out


def case(B: int, smoke: bool) -> dict:
    inp = make_decode_inputs(B, H, K, context=CTX, seed=B)
    sms = info().sm_count
    ns = hopper.nsplit_for(B, H, K, sms)
    pdl = hopper.pdl_for(B, H, ns, sms)
    q = inp.q.contiguous()
    idx, tlen = inp.indices, inp.topk_len
    out = alloc((B, H, 512), torch.bfloat16, q.device)
    lse = alloc((B, H), torch.float32, q.device)
    if ns > 1:
        o_part, l_part = split_k.partials_for(B, H, ns, q.device, "bfloat16")
    else:
        o_part, l_part = out, lse

    def split(trace=None, ablate=0):
        hopper_study.launch(q, inp.cache, idx, tlen, ab.SCALE, None, o_part, l_part, ns, pdl, trace=trace, ablate=ablate)

    row = dict(B=B, nsplit=ns, pdl=pdl, programs=B * ns)
    row["hopper_us"] = ab.time_us(lambda: api.sparse_decode(inp.q, inp.cache, inp.indices, impl="hopper",
                                                            sm_scale=ab.SCALE, **inp.kwargs()), smoke)
    row["splitk_auto_us"] = ab.time_us(lambda: api.sparse_decode(inp.q, inp.cache, inp.indices, impl="splitk_auto",
                                                          sm_scale=ab.SCALE, **inp.kwargs()), smoke)
    row["split_launch_us"] = ab.time_us(split, smoke)
    # ablations (hopper's ABLATE constexpr): one partition does its work, the other only hands the
    # ring's buffers back, so each side's time alone shows how much of it the pair overlaps
    row["split_launch_producer_only_us"] = ab.time_us(lambda: split(ablate=1), smoke)
    row["split_launch_consumers_only_us"] = ab.time_us(lambda: split(ablate=2), smoke)
    # the producer alone, split further: its indices, dequant and stores without the gather (3),
    # and its indices and gather without the dequant and stores (4)
    row["split_launch_producer_no_gather_us"] = ab.time_us(lambda: split(ablate=3), smoke)
    row["split_launch_producer_gather_only_us"] = ab.time_us(lambda: split(ablate=4), smoke)
    if ns > 1:
        row["combine_us"] = ab.time_us(lambda: split_k.combine(o_part, l_part, None, out, lse), smoke)
    trace = torch.zeros(B * ns, 10, dtype=torch.int64, device=q.device)
    row["split_launch_traced_us"] = ab.time_us(lambda: split(trace), smoke)
    g = torch.cuda.CUDAGraph()
    split(trace)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        split(trace)
    got = []
    for _ in range(20):
        g.replay()
        torch.cuda.synchronize()
        got.append(trace.cpu().clone())
    row["clocks"] = phase_stats(got)
    row["first_replay_program0"] = [int(v - got[0][0, 0]) if i < 9 else int(v) for i, v in enumerate(got[0][0])]
    return row


def main(argv=None):
    def options(p):
        p.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    a = ab.parse_args(__doc__, options, argv)
    t0 = time.time()
    rows = []
    if a.smoke or hopper.unavailable_reason():
        rows.append(dict(kind="refusal", reason=hopper.unavailable_reason()))
        ab.write(a.out, QUESTION, a.smoke, rows=rows, complete=True)
        return
    for B in a.batches:
        rows.append(ab.attempt(dict(kind="clocks", B=B), lambda B=B: case(B, a.smoke)))
        ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=CTX, rows=rows, seconds=round(time.time() - t0, 1),
                 complete=False)
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=CTX, rows=rows, seconds=round(time.time() - t0, 1),
             complete=True)


if __name__ == "__main__":
    main()
