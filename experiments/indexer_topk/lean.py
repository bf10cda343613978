"""Top-k launches side by side: checks and times, one process. Written for run 3 of
experiments/indexer_topk's "lean" runs; ``LAUNCHES`` now holds the shipped launch and its S = 2
form. The README gives, for each lean run, its variants and the commit whose code it ran (runs
12-13: the ``TopkLaunch.lean`` bits of commit 96e76d4, since shipped as one kernel).

    python experiments/indexer_topk/lean.py OUT.json [--cpu-smoke]

For each launch in ``LAUNCHES``: exactness against
``reference.topk_positions`` on random lengths (0, 1, < k among them) and on rows whose whole
top-k sits in one chunk, bitwise over 20 replays of a captured graph; then the top-k alone in
one-call graphs at B = 1, 8, 16, 32, 64, 128 (8192 live, max 262208), B = 32 at max 1,048,576,
at 5000 live and at 65536 live, twice in alternating order (``round`` 0 and 1); at B = 1 and 32
also per call in a graph of 8 calls on their own logits.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import time
from dataclasses import replace

import torch

from dsv4lab import bench, reference
from dsv4lab.kernels.indexer import triton_indexer, topk
from dsv4lab.kernels.indexer.topk import TOPK, topk_triton
from dsv4lab.testing import make_indexer_inputs, poisoned
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "indexer_topk"
K = 512
H = 64
LAUNCHES = {"shipped": TOPK,
            "shipped, S = 2": replace(TOPK, split=2)}


def logits_of(B, live, L, seed):
    inp = make_indexer_inputs(B, H, L, seq_lens=live, seed=seed)
    return triton_indexer.logits_triton(*inp.args(), L, fill_dead=False), inp.seq_lens


def one_chunk_rows(x, seq, split):
    """The same logits with the last chunk of every row lifted above the rest: the row's whole
    top-k is in one chunk."""
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
    sms = 2 if smoke else torch.cuda.get_device_properties(0).multi_processor_count

    def save(complete=False):
        ab.write(a.out, QUESTION, smoke, rows=rows, seconds=round(time.time() - t0, 1), complete=complete,
                 launches={n: v.as_dict() for n, v in LAUNCHES.items()})

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
                                 "one chunk holds the top-k": (one_chunk_rows(xo, so, 4), so)}.items():
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

    sizes = [(B, live, L)] if smoke else [(32, 8192, 262208), (32, 8192, 1048576), (1, 8192, 262208),
                                           (8, 8192, 262208), (16, 8192, 262208), (64, 8192, 262208),
                                           (128, 8192, 262208), (32, 5000, 262208), (32, 65536, 65536)]
    names = list(LAUNCHES)
    for b, n, Lm in sizes:
        x, s = logits_of(b, n, Lm, 7)
        copies = [(x, s)] + ([] if smoke else [(x.clone(), s.clone()) for _ in range(bench.LAYERS - 1)])
        for rnd, order in enumerate((names, names[::-1])):
            for name in order:
                launch = LAUNCHES[name]

                def one(launch=launch):
                    r = dict(us=ab.time_us(lambda: topk_triton(x, s, K, launch=launch), smoke))
                    if Lm == L and b in (1, 32) and n == live:
                        r["us_per_call_in_graph_of_8"] = ab.time_in_graph_us(
                            [lambda c=c: topk_triton(c[0], c[1], K, launch=launch) for c in copies], smoke)
                    return r
                rows.append(ab.attempt(dict(kind="topk", launch=name, round=rnd, B=b, live=n, max_seq_len=Lm,
                                            split=launch.split or topk.split_for(b, Lm, K, sms)), one))
        del x, s, copies
        save()
    save(complete=True)


if __name__ == "__main__":
    main()
