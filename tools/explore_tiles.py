"""Quick GPU exploration of head-batched tile variants (correctness + graph-replay time).

    python tools/explore_tiles.py OUT.json "64,64,8,1,1" "64,64,8,2,0" ...

Each variant is BLOCK_H,BLOCK_N,num_warps,num_stages,prefetch. Checked against the float64
reference (poisoned outputs, topk_len, sink, padding) before it is timed at B in {1, 32, 128}.
The full, recorded sweep is ``python -m dsv4lab record --only tiles``; this is the scratch pad.
"""
import json
import sys
import time

import dsv4lab  # noqa: F401
from dsv4lab import bench, reference
from dsv4lab.kernels import head_batched
from dsv4lab.testing import make_decode_inputs, poisoned, rel_err

out_path, specs = sys.argv[1], sys.argv[2:]
chk = make_decode_inputs(4, 64, 512, context=1024, topk_len=True, sink=True, pad_frac=0.2, seed=5)
ro, rl = reference.sparse_decode(chk.q, chk.cache, chk.indices, sm_scale=512**-0.5, **chk.kwargs())
inputs = {B: make_decode_inputs(B, 64, 512, context=8192, seed=100 + B) for B in (1, 32, 128)}
rows = []
for spec in specs:
    bh, bn, nw, ns, pf = (int(v) for v in spec.split(","))
    cfg = head_batched.TileConfig(bh, bn, nw, ns, "explore", False, pf)
    row = dict(block_h=bh, block_n=bn, num_warps=nw, num_stages=ns, prefetch=pf)
    t0 = time.time()
    try:
        with poisoned():
            o, lse = head_batched.sparse_decode_mma(chk.q, chk.cache, chk.indices, cfg=cfg, **chk.kwargs(),
                                                    sm_scale=512**-0.5)
        row["out_err"] = rel_err(o.float(), ro)
        row["lse_err"] = rel_err(lse, rl)
        row["nan"] = bool(o.isnan().any())
        for B, inp in inputs.items():
            fn = lambda: head_batched.sparse_decode_mma(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5,  # noqa: E731
                                                        topk_len=None, attn_sink=None, cfg=cfg)
            row[f"us_B{B}"] = bench.time_ms(fn, graph=True, warmup=10, rep=50) * 1e3
    except Exception as e:
        row["error"] = repr(e)[:300]
    row["s"] = round(time.time() - t0, 1)
    rows.append(row)
    print(row, flush=True)
json.dump({**bench.environment(), "rows": rows}, open(out_path, "w"), indent=1, default=str)
