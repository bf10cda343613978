"""Where split-K's merge time goes, on the GPU: the split launch alone, the combine launch alone
(several shapes: heads per program x warps), both together, and both with PDL. One JSON.

    python tools/ab_combine.py OUT.json [--batches 1 8 16 32 64] [--partials float32 bfloat16] [--shapes 1,4 1,2]

For each B, the launches choose / choose_split pick (NSPLIT > 1 only). Every combine shape is
checked against the float64 reference (poisoned outputs, topk_len, sink) on the first batch
size's launches, then timed at every B (CUDA-graph replay, do_bench median, L2 flushed).
"""
import argparse
import json

import torch

import dsv4lab  # noqa: F401
from dsv4lab import bench, reference
from dsv4lab.kernels import common, head_batched, split_k
from dsv4lab.testing import LSE_TOL, OUT_TOL, make_decode_inputs, poisoned, rel_err

H, K = 64, 512
SHAPES = [(1, 4), (1, 1), (1, 2), (2, 4), (4, 4), (8, 8), (16, 8)]     # (heads per program, warps)


def main(path, batches, partial_dtypes=("float32",), shapes=SHAPES):
    rows = []
    chk = make_decode_inputs(4, H, K, context=2048, topk_len=True, sink=True, pad_frac=0.1, seed=13)
    ro, rl = reference.sparse_decode(chk.q, chk.cache, chk.indices, sm_scale=512**-0.5, **chk.kwargs())
    for B in batches:
        inp = make_decode_inputs(B, H, K, context=8192, seed=400 + B)
        plans = {(p.cfg, p.nsplit) for p in (split_k.choose(B, H, K), split_k.choose_split(B, H, K)) if p.nsplit > 1}
        for (cfg, n), pname in ((c, p) for c in sorted(plans, key=lambda x: (x[0].block_h, x[1]))
                                for p in partial_dtypes):
            pdt = getattr(torch, pname)
            base = dict(B=B, block_h=cfg.block_h, block_n=cfg.block_n, prefetch=cfg.prefetch, nsplit=n, partials=pname)
            o_part, lse_part, _ = split_k.workspace(B, H, n, inp.q.device, pdt)
            out = torch.empty(B, H, 512, dtype=torch.bfloat16, device=inp.q.device)
            lse = torch.empty(B, H, dtype=torch.float32, device=inp.q.device)

            def split_only():
                head_batched.launch(inp.q, inp.cache, inp.indices, None, 512**-0.5, None, o_part, lse_part,
                                    nsplit=n, cfg=cfg)
            split_only()
            rows.append(dict(base, what="split launch alone", us=bench.time_ms(split_only, graph=True) * 1e3))
            print(rows[-1], flush=True)
            for heads, warps in shapes:
                row = dict(base, heads=heads, num_warps=warps)
                try:
                    if B == batches[0]:
                        co, cl, _ = split_k.workspace(4, H, n, chk.q.device, pdt)
                        with poisoned():
                            co.fill_(float("nan"))
                            cl.fill_(float("nan"))
                            fo = common.alloc((4, H, 512), torch.bfloat16, chk.q.device)
                            fl = common.alloc((4, H), torch.float32, chk.q.device)
                        head_batched.launch(chk.q, chk.cache, chk.indices, chk.topk_len, 512**-0.5, None, co, cl,
                                            nsplit=n, cfg=cfg)
                        split_k.combine(co, cl, chk.attn_sink, fo, fl, heads=heads, num_warps=warps)
                        row["out_err"], row["lse_err"] = rel_err(fo.float(), ro), rel_err(fl, rl)
                        row["ok"] = row["out_err"] <= OUT_TOL and row["lse_err"] <= LSE_TOL
                    comb = lambda: split_k.combine(o_part, lse_part, None, out, lse, heads=heads, num_warps=warps)  # noqa: E731
                    rows.append(dict(row, what="combine launch alone", us=bench.time_ms(comb, graph=True) * 1e3))
                    print(rows[-1], flush=True)

                    def both():
                        split_only()
                        comb()
                    rows.append(dict(row, what="split + combine", us=bench.time_ms(both, graph=True) * 1e3))
                    print(rows[-1], flush=True)
                except Exception as e:
                    rows.append(dict(row, what="error", error=repr(e)[:300]))
                    print(rows[-1], flush=True)
            if common.use_pdl():                  # the default shape with programmatic dependent launch
                def both_pdl():
                    head_batched.launch(inp.q, inp.cache, inp.indices, None, 512**-0.5, None, o_part, lse_part,
                                        nsplit=n, cfg=cfg, pdl=True)
                    split_k.combine(o_part, lse_part, None, out, lse, USE_GDC=True, launch_pdl=True)
                rows.append(dict(base, heads=split_k.COMBINE_HEADS, num_warps=split_k.combine_warps(pdt),
                                 what="split + combine, PDL", us=bench.time_ms(both_pdl, graph=True) * 1e3))
                print(rows[-1], flush=True)
        del inp
        torch.cuda.empty_cache()
    json.dump({**bench.environment(), "part": "ab_combine", "rows": rows}, open(path, "w"), indent=1, default=str)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    ap.add_argument("--partials", nargs="+", default=[split_k.PARTIALS], choices=["float32", "bfloat16"])
    ap.add_argument("--shapes", nargs="+", default=[f"{h},{w}" for h, w in SHAPES], help="HEADS,WARPS of the combine")
    a = ap.parse_args()
    main(a.out, a.batches, a.partials, [tuple(int(v) for v in s.split(",")) for s in a.shapes])
