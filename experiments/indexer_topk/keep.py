# Runs at commit 35479817ea846ee75aa73c2f435bda7a1279d6ce as experiments/indexer_topk/keep.py, not on the current package
"""Chunks that keep fewer candidates (``TopkLaunch.keep``): checks and times, one process.

    python experiments/indexer_topk/keep.py OUT.json [--cpu-smoke]

For each launch (keep 0 = every chunk keeps k, the shipped kernel; keep 2 / 4 = twice / four
times a chunk's share ceil(k / S); split 4, 8 and 16): exactness against ``reference.topk_positions``
on random lengths and on rows whose whole top-k sits in one chunk (the merge must fall back to the
whole row), bitwise in a replayed graph; then the top-k alone in one-call graphs (B = 32, 8192
live, max 262208 and 1,048,576; B = 1, 8, 16, 64), per call in a graph of 8 calls on their own
logits, and on the one-chunk rows (the fallback's price).
"""
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import time
from dataclasses import replace

import torch

from dsv4lab import ab, bench, reference
from dsv4lab.kernels import indexer, topk
from dsv4lab.kernels.topk import TOPK, topk_triton
from dsv4lab.testing import make_indexer_inputs, poisoned

QUESTION = "indexer_topk_keep"
K = 512
H = 64
LAUNCHES = {"keep0 (shipped)": replace(TOPK, keep=0), "keep2": replace(TOPK, keep=2),
            "keep2 split8": replace(TOPK, keep=2, split=8), "keep4 split8": replace(TOPK, keep=4, split=8),
            "keep2 split16": replace(TOPK, keep=2, split=16), "keep4 split16": replace(TOPK, keep=4, split=16)}


def logits_of(B, live, L, seed):
    inp = make_indexer_inputs(B, H, L, seq_lens=live, seed=seed)
    return indexer.logits_triton(*inp.args(), L, fill_dead=False), inp.seq_lens


def one_chunk_rows(x, seq, split):
    """The same logits with a ramp lifting the last chunk of every row above the rest: the row's
    whole top-k is in one chunk (more than any chunk keeps when keep < S)."""
    y = x.clone()
    n = int(seq[0])
    y[:, n - n // split:n] += 1e4
    return y


def main(argv=None):
    a = ab.parse_args(__doc__, None, argv)
    smoke = a.smoke
    t0 = time.time()
    rows = []
    B, live, L = (3, 300, 700) if smoke else (32, 8192, 262208)

    def save(complete=False):
        ab.write(a.out, QUESTION, smoke, rows=rows, seconds=round(time.time() - t0, 1), complete=complete,
                 launches={n: v.as_dict() for n, v in LAUNCHES.items()})

    # checks: random lengths (0, 1, < k among them), then one-chunk rows, then graph replay
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(0, 2 * live + 1, (B,), generator=g)
    lens[:3] = torch.tensor([0, 1, K - 1])
    chk = make_indexer_inputs(B, H, L, seq_lens=lens.tolist(), seed=5)
    xr = dsv4lab.indexer_logits(*chk.args(), max_seq_len=L, impl="triton")
    xo, so = logits_of(B, live, L, 6)
    for name, launch in LAUNCHES.items():
        def check(launch=launch):
            row = {}
            for case, (x, s) in {"random lengths": (xr, chk.seq_lens),
                                 "one chunk holds the top-k": (one_chunk_rows(xo, so, launch.split or 4), so)}.items():
                want = reference.topk_positions(x.masked_fill(torch.arange(x.shape[1], device=x.device)
                                                              >= s[:, None].long(), float("-inf")), K)
                with poisoned():
                    got = topk_triton(x, s, K, launch=launch)
                row[case] = bool(torch.equal(got.cpu(), want.cpu()))
            if not smoke:
                out = torch.empty(B, K, dtype=torch.int32, device="cuda")
                gr, _ = bench.capture(lambda: out.copy_(topk_triton(xr, chk.seq_lens, K, launch=launch)))
                reps = []
                for _ in range(20):
                    gr.replay()
                    reps.append(torch.equal(out, topk_triton(xr, chk.seq_lens, K, launch=launch)))
                row["graph replay bitwise x20"] = all(reps)
            row["ok"] = all(v for v in row.values())
            return row
        rows.append(ab.attempt(dict(kind="check", launch=name), check))
    save()
    del xr, chk

    # times
    sizes = [(B, live, L)] if smoke else [(32, 8192, 262208), (32, 8192, 1048576), (1, 8192, 262208),
                                           (8, 8192, 262208), (16, 8192, 262208), (64, 8192, 262208),
                                           (32, 65536, 65536)]
    for b, n, Lm in sizes:
        x, s = logits_of(b, n, Lm, 7)
        copies = [(x, s)] + ([] if smoke else [(x.clone(), s.clone()) for _ in range(bench.LAYERS - 1)])
        for name, launch in LAUNCHES.items():
            if (launch.split or 4) * b > 264:        # two waves of programs at most
                continue
            def one(launch=launch):
                r = dict(us=ab.time_us(lambda: topk_triton(x, s, K, launch=launch), smoke))
                if Lm == L and b in (1, 32):
                    r["us_per_call_in_graph_of_8"] = ab.time_in_graph_us(
                        [lambda c=c: topk_triton(c[0], c[1], K, launch=launch) for c in copies], smoke)
                    y = one_chunk_rows(x, s, launch.split or 4)
                    r["us_one_chunk_rows"] = ab.time_us(lambda: topk_triton(y, s, K, launch=launch), smoke)
                return r
            rows.append(ab.attempt(dict(kind="topk", launch=name, B=b, live=n, max_seq_len=Lm,
                                        split=launch.split or topk.split_for(b, Lm, K, 2 if smoke else
                                                                            torch.cuda.get_device_properties(0).multi_processor_count)), one))
        del x, s, copies
        save()
    save(complete=True)


if __name__ == "__main__":
    main()
