# Runs at commit 4684d48504eecc42e4ac8241be3744159ddc8f11 as experiments/topk_clocks/run.py, not on the current package (its TRACED constexpr and the ranked bucket were removed after these runs).
"""Where the top-k kernel's time goes, from the GPU's own clock: every program writes %globaltimer
at its start, after its row's maximum (first tile loaded), after the anchor pass, after the
refining passes, after its stores and at its end, plus its pass count and SM id
(kernels.topk's TRACED constexpr). One JSON.

    python experiments/topk_clocks/run.py OUT.json

Cases (B rows of logits from the indexer's logits kernel, 64 heads, live 8192, max 262208, k 512,
CUDA-graph replay): B = 32 with the shipped split (4: chunks then merge), B = 32 with one launch
(S = 1), B = 1 with the shipped split. For each: the graph-replay median traced and untraced, and
over 20 replays the medians of each phase (median and slowest program), the start spread, the
gap between the chunks' last end and the merge's first start, and the span first start -> last end.
"""
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import statistics
import time

import torch

from dsv4lab import ab
from dsv4lab.kernels import indexer, topk
from dsv4lab.kernels.topk import topk_triton
from dsv4lab.testing import make_indexer_inputs

QUESTION = "Where does the top-k kernel's time go: which phase, which program, between the launches?"
H, K, LIVE, L = 64, 512, 8192, 262208
PHASES = ["load + max", "anchor pass", "refining passes", "emit + stores", "padding"]


def stage_stats(traces: list) -> dict:
    """traces: [replays] of int64 [programs, 10]; the medians over replays."""
    per = []
    for t in traces:
        t = t.double()
        d = t[:, 1:6] - t[:, 0:5]
        per.append(dict(start_spread_us=float(t[:, 0].max() - t[:, 0].min()) / 1e3,
                        program_us_median=float((t[:, 5] - t[:, 0]).median()) / 1e3,
                        program_us_max=float((t[:, 5] - t[:, 0]).max()) / 1e3,
                        **{f"{p} median_us": float(d[:, i].median()) / 1e3 for i, p in enumerate(PHASES)},
                        **{f"{p} max_us": float(d[:, i].max()) / 1e3 for i, p in enumerate(PHASES)},
                        first_start=float(t[:, 0].min()), last_end=float(t[:, 5].max())))
    out = {k: statistics.median(r[k] for r in per) for k in per[0] if k not in ("first_start", "last_end")}
    passes = traces[-1][:, 8]
    out["passes"] = {int(v): int((passes == v).sum()) for v in passes.unique()}
    out["sms_used"] = int(traces[-1][:, 9].unique().numel())
    return out, per


def case(name, B, split, smoke, compact=0):
    inp = make_indexer_inputs(B, 8 if smoke else H, 700 if smoke else L, seq_lens=300 if smoke else LIVE, seed=52)
    x = indexer.logits_triton(*inp.args(), inp.max_seq_len, fill_dead=False)
    launch = topk.TopkLaunch(split=split, compact=compact)
    fn = lambda: topk_triton(x, inp.seq_lens, K, launch=launch)  # noqa: E731
    row = dict(case=name, B=B, split=split, compact=compact, untraced_us=ab.time_us(fn, smoke))
    S = launch.split or topk.split_for(B, inp.max_seq_len, K, torch.cuda.get_device_properties(0).multi_processor_count
                                       if not smoke else 2)
    row["resolved_split"] = S
    if smoke:                    # the interpreter has no clock to read
        return row
    stages = {"single": B} if S == 1 else {"chunks": B * S, "merge": B}
    bufs = {st: torch.zeros(n, 10, dtype=torch.int64, device=x.device) for st, n in stages.items()}
    topk.TRACE_BUFFERS.update(bufs)
    try:
        row["traced_us"] = ab.time_us(fn, smoke)
        g = torch.cuda.CUDAGraph()
        fn()
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            fn()
        got = {st: [] for st in stages}
        for _ in range(20):
            g.replay()
            torch.cuda.synchronize()
            for st, b in bufs.items():
                got[st].append(b.cpu().clone())
    finally:
        topk.TRACE_BUFFERS.clear()
    per_stage = {}
    for st in stages:
        row[st], per_stage[st] = stage_stats(got[st])
    if S > 1:
        gaps = [m["first_start"] - c["last_end"] for c, m in zip(per_stage["chunks"], per_stage["merge"])]
        spans = [m["last_end"] - c["first_start"] for c, m in zip(per_stage["chunks"], per_stage["merge"])]
        row["gap_chunks_to_merge_us"] = statistics.median(gaps) / 1e3
        row["span_us"] = statistics.median(spans) / 1e3
    else:
        row["span_us"] = statistics.median(p["last_end"] - p["first_start"] for p in per_stage["single"]) / 1e3
    return row


def main(argv=None):
    a = ab.parse_args(__doc__, None, argv)
    t0 = time.time()
    rows = []
    for name, B, split, C in (("B=32 shipped split", 32, None, 0), ("B=32 one launch", 32, 1, 0),
                              ("B=1 shipped split", 1, None, 0), ("B=1 one launch", 1, 1, 0),
                              ("B=32 shipped split, ranked bucket 256", 32, None, 256),
                              ("B=32 one launch, ranked bucket 512", 32, 1, 512)):
        rows.append(ab.attempt(dict(case=name), lambda B=B, split=split, name=name, C=C: case(name, B, split, a.smoke, C)))
        ab.write(a.out, QUESTION, a.smoke, rows=rows, seconds=round(time.time() - t0, 1), complete=False)
    ab.write(a.out, QUESTION, a.smoke, rows=rows, seconds=round(time.time() - t0, 1), complete=True)


if __name__ == "__main__":
    main()
