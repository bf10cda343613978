# Runs at commit 971bafeb1eb2fcc70cc2c5b9747b0797d8c2c218 as tools/ab_merge.py, not on the current package (its variants were deleted).
"""A/B of split-K's merge on the GPU: a second (combine) launch vs the fused merge (the last
slice of each row merges), with fp32 or bf16 partials. One JSON under OUT.

    python tools/ab_merge.py OUT.json [--batches 16 32 64] [--tiles 64,128,8,1,0 ...] [--splits 2 4]
                                      [--merges launch fused]


For each B, the launches split_k.choose_split / choose pick with the table's figures, plus
NSPLIT 2/4/8 of both tile entries: each variant is timed with CUDA-graph replay, all in one
run, and checked against the float64 reference (poisoned outputs, topk_len, sink) at the
first batch size's launch shapes, where the fused merge's graph replay must also equal its
eager result bitwise (and leave the counters 0).
"""
import json

import torch

import dsv4lab  # noqa: F401
from dsv4lab import bench, reference
from dsv4lab.kernels import head_batched, split_k
from dsv4lab.testing import LSE_TOL, OUT_TOL, make_decode_inputs, poisoned, rel_err

H, K = 64, 512
VARIANTS = [("launch", torch.float32), ("fused", torch.float32), ("launch", torch.bfloat16),
            ("fused", torch.bfloat16)]


def run(cfg, nsplit, merge, partials, inp, **kw):
    return split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5, nsplit=nsplit,
                                       cfg=cfg, merge=merge, partials=partials, **kw)


def main(path, batches=(1, 2, 4, 8, 16, 32, 64, 128), tiles=None, splits=(2, 4, 8)):
    rows = []
    chk = make_decode_inputs(4, H, K, context=2048, topk_len=True, sink=True, pad_frac=0.1, seed=11)
    ro, rl = reference.sparse_decode(chk.q, chk.cache, chk.indices, sm_scale=512**-0.5, **chk.kwargs())
    cfgs = ([head_batched.TileConfig(*t[:4], "ab", prefetch=t[4]) for t in tiles] if tiles else
            [head_batched.tile_config(H), head_batched.tile_config(H, split=True)])
    for B in batches:
        inp = make_decode_inputs(B, H, K, context=8192, seed=300 + B)
        launches = set() if tiles else {(p.cfg, p.nsplit) for p in (split_k.choose(B, H, K),
                                                                     split_k.choose_split(B, H, K))}
        launches |= {(c, n) for c in cfgs for n in splits}
        for cfg, n in sorted(launches, key=lambda x: (x[0].block_h, x[1])):
            if n < 2:
                continue
            for merge, partials in VARIANTS:
                row = dict(B=B, block_h=cfg.block_h, block_n=cfg.block_n, num_warps=cfg.num_warps,
                           num_stages=cfg.num_stages, prefetch=cfg.prefetch, nsplit=n, merge=merge,
                           partials=str(partials).split(".")[-1])
                try:
                    if B == batches[0]:      # correctness once per variant and launch shape
                        with poisoned():
                            o, lse = run(cfg, n, merge, partials, chk, **chk.kwargs())
                        row["out_err"], row["lse_err"] = rel_err(o.float(), ro), rel_err(lse, rl)
                        row["ok"] = row["out_err"] <= OUT_TOL and row["lse_err"] <= LSE_TOL
                        eager = run(cfg, n, merge, partials, chk, **chk.kwargs())
                        g, res = bench.capture(lambda: run(cfg, n, merge, partials, chk, **chk.kwargs()))
                        g.replay()
                        torch.cuda.synchronize()
                        row["graph_bitwise"] = bool(torch.equal(res[0], eager[0]) and torch.equal(res[1], eager[1]))
                        row["counters_zero"] = not bool(split_k.workspace(4, H, n, chk.q.device, partials)[2].any())
                    fn = lambda: run(cfg, n, merge, partials, inp, topk_len=None, attn_sink=None)  # noqa: E731
                    row["us"] = bench.time_ms(fn, graph=True, warmup=10, rep=50) * 1e3
                except Exception as e:
                    row["error"] = repr(e)[:300]
                rows.append(row)
                print("ab", {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        del inp
        torch.cuda.empty_cache()
    json.dump({**bench.environment(), "part": "ab_merge", "rows": rows}, open(path, "w"), indent=1, default=str)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--tiles", nargs="+", default=None, help="BLOCK_H,BLOCK_N,warps,stages,prefetch")
    ap.add_argument("--splits", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--merges", nargs="+", default=["launch", "fused"])
    a = ap.parse_args()
    VARIANTS[:] = [v for v in VARIANTS if v[0] in a.merges]
    main(a.out, a.batches, [tuple(int(v) for v in t.split(",")) for t in a.tiles] if a.tiles else None, a.splits)
