"""The Triton indexer's knobs on the GPU: programs per SM (the grid) x num_stages x the register pipeline.

    python tools/indexer_sweep.py OUT.json

Each config is checked against the float64 reference first, then timed (graph replay, do_bench
median, L2 flushed) at B = 1 and 32 with 8192 live tokens a request, max context 8192 and 262208.
"""
import json
import sys

import dsv4lab  # noqa: F401
from dsv4lab import bench, reference
from dsv4lab.kernels import indexer
from dsv4lab.testing import INDEXER_TOL, make_indexer_inputs, poisoned, rel_err

rows = []
chk = make_indexer_inputs(4, 64, 4096, seed=11)
ref = reference.indexer_logits(*chk.args(), 4096)
inputs = {(B, L): make_indexer_inputs(B, 64, L, seq_lens=8192, seed=13) for B in (1, 32) for L in (8192, 262208)}
for per_sm, stages, prefetch in [(n, s, p) for p in (False, True) for n in (4, 8, 16) for s in (1, 3)]:
    row = dict(programs_per_sm=per_sm, num_stages=stages, prefetch=prefetch)
    sms = bench.info().sm_count
    nprog = lambda B, L: max(1, min(-(-L // 64), -(-per_sm * sms // B)))  # noqa: E731
    with poisoned():
        out = indexer.logits_triton(*chk.args(), 4096, nprog=nprog(4, 4096), num_stages=stages, prefetch=prefetch)
    row["err"] = rel_err(out, ref)
    row["ok"] = row["err"] <= INDEXER_TOL
    for (B, L), inp in inputs.items():
        fn = lambda: indexer.logits_triton(*inp.args(), L, nprog=nprog(B, L), num_stages=stages,  # noqa: E731
                                           prefetch=prefetch)
        row[f"us_B{B}_L{L}"] = bench.time_ms(fn, graph=True) * 1e3
    rows.append(row)
    print(row, flush=True)
json.dump({**bench.environment(), "part": "indexer_sweep", "rows": rows}, open(sys.argv[1], "w"), indent=1, default=str)
