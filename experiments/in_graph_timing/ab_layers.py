# Runs at commit 971bafeb1eb2fcc70cc2c5b9747b0797d8c2c218 as tools/ab_layers.py, not on the current package (its variants were deleted).
"""Decode launches timed the way a decode step runs them: per call inside one CUDA graph of
LAYERS calls on their own copies of the inputs (bench.time_per_call_in_graph_ms), beside the
one-call graph every other table uses. One JSON.

    python tools/ab_layers.py OUT.json [coop|coop-again|mma64]     (RUNS; RUN1_*, RUN2_*: earlier runs' variants)

Why: an empty kernel in a one-call graph already measures 4.2 us (launch_floor.json), a third of
split-K's 14 us at B=1; SGLang captures a whole decode step (all layers) in one graph, so there a
call pays its kernels and the gaps between graph nodes, not a graph launch. Variants at small B
(split-K's regime): the table's plans, PDL for the combine launch, the fused merge, 32-token
slices (NSPLIT 16); at B=128 the 64-head tiles with the table's dequant ("bits" + folded scale)
and with "cvt". Each variant is checked first (poisoned outputs, float64 reference, topk_len, -1
padding, sink), and the in-graph replay compared bitwise with eager calls; times are do_bench
medians (L2 flushed before each replay), the variants interleaved, best of 2 passes.
"""
import dataclasses
import json
import sys

import torch
from triton.testing import do_bench

from dsv4lab import api, bench, reference
from dsv4lab.kernels import head_batched, split_k
from dsv4lab.testing import LSE_TOL, OUT_TOL, make_decode_inputs, poisoned, rel_err

H, K, SCALE, LAYERS = 64, 512, 512 ** -0.5, bench.LAYERS
SPLIT = head_batched.tile_config(H, split=True)
MMA = head_batched.tile_config(H)
S32 = dataclasses.replace(SPLIT, block_n=32, num_warps=4)      # tiles.json: 16x32 w4 p2, 3 us a tile
DEFAULTS = (split_k.PDL, head_batched.DEQUANT, head_batched.FOLD_SCALE)     # restored after each variant


def _impl(name, pdl=None):
    def run(x):
        split_k.PDL = pdl or DEFAULTS[0]
        return api.sparse_decode(x.q, x.cache, x.indices, impl=name, check_ranges=False, **x.kwargs())
    return run


def _split(cfg, nsplit, merge="launch", pdl="0", dequant=None, fold=None, partials=None, pdl_in=False):
    def run(x):
        split_k.PDL = pdl
        head_batched.DEQUANT, head_batched.FOLD_SCALE = dequant, fold
        return split_k.sparse_decode_split(x.q, x.cache, x.indices, topk_len=x.topk_len, sm_scale=SCALE,
                                           attn_sink=x.attn_sink, nsplit=nsplit, cfg=cfg, merge=merge,
                                           partials=partials, pdl_in=pdl_in)
    return run


def _mma(pdl_in=False):
    """mma's table launch for the shape (head_batched.choose_tiles), optionally PDL-launched"""
    def run(x):
        cfg = head_batched.choose_tiles(x.q.shape[0], H, x.indices.shape[1])
        return split_k.sparse_decode_split(x.q, x.cache, x.indices, topk_len=x.topk_len, sm_scale=SCALE,
                                           attn_sink=x.attn_sink, nsplit=1, cfg=cfg, pdl_in=pdl_in)
    return run


def _splitk_loop(prefetch, pdl=None):
    """splitk's plan for the shape with the split entry's loop replaced"""
    def run(x):
        plan = split_k.choose_split(x.q.shape[0], H, x.indices.shape[1])
        split_k.PDL = pdl or DEFAULTS[0]
        return split_k.sparse_decode_split(x.q, x.cache, x.indices, topk_len=x.topk_len, sm_scale=SCALE,
                                           attn_sink=x.attn_sink, nsplit=plan.nsplit,
                                           cfg=dataclasses.replace(plan.cfg, prefetch=prefetch))
    return run


#: run 1 (ab_layers.json): the table's plans, PDL, the fused merge, 32-token slices, the dequant
RUN1_SMALL = {
    "mma (table)": _impl("mma"),
    "splitk (table)": _impl("splitk", pdl="0"),
    "splitk (table) + PDL": _impl("splitk", pdl="1"),
    "16x64 NSPLIT 8 fused merge": _split(SPLIT, 8, merge="fused"),
    "16x32w4 NSPLIT 16": _split(S32, 16),
    "16x32w4 NSPLIT 16 + PDL": _split(S32, 16, pdl="1"),
}
RUN1_LARGE = {
    "mma (table: bits + fold)": _split(MMA, 1),
    "mma cvt, no fold": _split(MMA, 1, dequant="cvt", fold=False),
    "auto (table)": _impl("auto"),
}
#: run 2 (ab_layers2.json): PDL "auto", loop 2 without the dequant past a slice's end (the table's
#: split entry) against loops 4 and 0, and the 64-head tile's loop 8 (tile 1's hint at the start)
RUN2_SMALL = {
    "mma (table)": _impl("mma"),
    "splitk (table, PDL auto)": _impl("splitk"),
    "splitk (table, PDL off)": _impl("splitk", pdl="0"),
    "splitk, split entry loop 4": _splitk_loop(4),
    "splitk, split entry loop 0": _splitk_loop(0),
}
RUN2_LARGE = {
    "mma (table: loop 5)": _split(MMA, 1),
    "mma loop 8": _split(dataclasses.replace(MMA, prefetch=8), 1),
    "auto (table)": _impl("auto"),
}
#: run 3 (ab_coop.json): the cooperative merge (one launch: the slices of a row meet at a barrier,
#: each merges a share of the columns) against the combine launch, and PDL for the first kernel
#: (each call launched while the previous call drains; for mma too, so the ratio stays fair)
SMALL = {
    "mma (table)": _impl("mma"),
    "mma (table) + PDL in": _mma(pdl_in=True),
    "splitk (table)": _impl("splitk"),
    "16x64 NSPLIT 8 fused": _split(SPLIT, 8, merge="fused"),
    "16x64 NSPLIT 8 coop": _split(SPLIT, 8, merge="coop"),
    "16x64 NSPLIT 8 coop fp32": _split(SPLIT, 8, merge="coop", partials=torch.float32),
    "16x64 NSPLIT 8 coop + PDL in": _split(SPLIT, 8, merge="coop", pdl_in=True),
    "16x64 NSPLIT 4 coop": _split(SPLIT, 4, merge="coop"),
    "16x32w4 NSPLIT 16 coop": _split(S32, 16, merge="coop"),
    "16x32w4 NSPLIT 16 coop + PDL in": _split(S32, 16, merge="coop", pdl_in=True),
    "16x64 NSPLIT 8 launch + PDL in": _split(SPLIT, 8, pdl="auto", pdl_in=True),
}
LARGE = {
    "mma (table)": _impl("mma"),
    "mma (table) + PDL in": _mma(pdl_in=True),
    "auto (table)": _impl("auto"),
}
SHAPES = [(1, SMALL), (2, SMALL), (4, SMALL), (8, SMALL), (32, LARGE), (128, LARGE)]
#: run 4 (ab_coop_cooperative.json): the coop merge again once it became a cooperative launch
COOP_AGAIN = {k: SMALL[k] for k in ("mma (table)", "splitk (table)", "16x64 NSPLIT 8 coop", "16x64 NSPLIT 8 coop fp32",
                                     "16x64 NSPLIT 8 coop + PDL in")}
#: run 5 (ab_mma64_b1.json): split-K against the story's stage-2 launch (64-head tiles: one program at B=1)
MMA64 = {"mma (table)": _impl("mma"), "splitk (table)": _impl("splitk"),
         "mma, 64-head tiles (the story's stage 2)": _split(MMA, 1)}
#: what `python tools/ab_layers.py OUT.json [RUN]` runs: RUN -> [(B, variants), ...]
RUNS = {"coop": SHAPES, "coop-again": [(1, COOP_AGAIN), (2, COOP_AGAIN)], "mma64": [(1, MMA64), (2, MMA64)]}


def _fits(B, name):
    """coop variants only where every program can be resident (head_batched.coop_fits)"""
    if "coop" not in name:
        return True
    cfg, n = (S32, 16) if "16x32" in name else (SPLIT, 4 if "NSPLIT 4" in name else 8)
    return head_batched.coop_fits(B, H, n, cfg)


def _reset():
    split_k.PDL, head_batched.DEQUANT, head_batched.FOLD_SCALE = DEFAULTS


def main(path, shapes=SHAPES):
    rows = []
    chk = make_decode_inputs(2, H, K, context=1500, topk_len=True, sink=True, pad_frac=0.1, seed=41)
    chk.topk_len[1] = 100                 # a row whose last slices hold no token
    ro, rl = reference.sparse_decode(chk.q, chk.cache, chk.indices, sm_scale=SCALE, **chk.kwargs())
    for name, fn in {k: v for _, variants in shapes for k, v in variants.items()}.items():
        with poisoned():
            o, lse = fn(chk)
        row = dict(kind="check", variant=name, out_err=rel_err(o.float(), ro), lse_err=rel_err(lse, rl))
        row["ok"] = row["out_err"] <= OUT_TOL and row["lse_err"] <= LSE_TOL
        rows.append(row)
        print(row, flush=True)
        _reset()
    for B, variants in shapes:
        inp = make_decode_inputs(B, H, K, context=8192, seed=900 + B)
        copies = bench.layer_copies(inp, LAYERS)
        graphs, best = {}, {}
        for name, fn in variants.items():
            if not _fits(B, name):
                continue
            eager = [tuple(t.clone() for t in fn(x)) for x in copies]
            g1, _ = bench.capture(lambda: fn(inp))                          # noqa: B023
            gl, res = bench.capture(lambda: [fn(x) for x in copies])        # noqa: B023
            gl.replay()
            torch.cuda.synchronize()
            same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(res, eager))
            graphs[name] = (g1, gl, same)
            _reset()
        for _ in range(2):
            for name, (g1, gl, _) in graphs.items():
                one = do_bench(g1.replay, warmup=25, rep=100, return_mode="median") * 1e3
                per = do_bench(gl.replay, warmup=25, rep=100, return_mode="median") * 1e3 / LAYERS
                a, b = best.get(name, (one, per))
                best[name] = (min(a, one), min(b, per))
        for name, (one, per) in best.items():
            rows.append(dict(kind="time", B=B, variant=name, graph_us=one, graph_layer_us=per, layers=LAYERS,
                             layer_graph_bitwise=graphs[name][2],
                             tflops_layer=4 * H * K * 512 * B / (per * 1e-6) / 1e12))
            print(rows[-1], flush=True)
        del inp, copies, graphs
        torch.cuda.empty_cache()
    json.dump({**bench.environment(), "part": "ab_layers", "rows": rows,
               "launch_floor": bench.launch_floor_us()}, open(path, "w"), indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1], RUNS[sys.argv[2] if len(sys.argv) > 2 else "coop"])
