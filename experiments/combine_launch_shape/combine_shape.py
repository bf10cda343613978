"""Where split-K's merge time goes, on the GPU: the split launch alone, the combine launch alone
in several shapes (heads per program x warps), both together, and both with PDL. One JSON.

    python experiments/combine_launch_shape/combine_shape.py OUT.json [--batches 1 8 16 32 64]
        [--partials bfloat16 float32] [--shapes 1,2 1,4 ...] [--cpu-smoke]

For each B, the split launches splitk and splitk_auto take for the shape (planning.choose_split /
choose, NSPLIT > 1 only). Every combine shape is checked against the float64 reference
(poisoned outputs, topk_len, -1 padding, sink) on the first batch size's launches, then timed at
every B (CUDA-graph replay, do_bench median, L2 flushed): "combine launch alone" reads partials
from HBM (L2 flushed); in "split + combine" they are still in L2. The package's shape is one
head a program with split_k.combine_warps(dtype) warps (4 for fp32, 2 for bf16). ~3 min on an H200.
"""
from dataclasses import replace

import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)
import torch

from dsv4lab import reference
from dsv4lab.kernels.decode import planning
from dsv4lab.kernels.decode import head_batched, split_k
from dsv4lab.kernels import buffers
from dsv4lab.testing import LSE_TOL, OUT_TOL, make_decode_inputs, poisoned, rel_err
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "combine_launch_shape"
#: (heads per program, warps) of the combine launch
SHAPES = [(1, 2), (1, 4), (1, 1), (2, 4), (4, 4), (8, 8), (16, 8)]


def check_shape(opts, heads, warps, chk, ref) -> dict:
    """The split launch then the combine in this shape, outputs poisoned, against the reference."""
    B, H, _ = chk.q.shape
    o_part, lse_part = split_k.workspace(B, H, opts.nsplit, chk.q.device, opts.partials)
    with poisoned():
        o_part.fill_(float("nan"))
        lse_part.fill_(float("nan"))
        out = buffers.alloc((B, H, 512), buffers.out_dtype(), chk.q.device)
        lse = buffers.alloc((B, H), torch.float32, chk.q.device)
    head_batched.launch(chk.q, chk.cache, chk.indices, chk.topk_len, ab.SCALE, None, o_part, lse_part, opts)
    split_k.combine(o_part, lse_part, chk.attn_sink, out, lse, heads=heads, num_warps=warps)
    row = dict(out_err=rel_err(out.float(), ref[0]), lse_err=rel_err(lse, ref[1]))
    row["ok"] = row["out_err"] <= OUT_TOL and row["lse_err"] <= LSE_TOL
    return row


def main(argv=None):
    def add(p):
        p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 32, 64])
        p.add_argument("--partials", nargs="+", default=["bfloat16"], choices=["float32", "bfloat16"])
        p.add_argument("--shapes", nargs="+", default=[f"{h},{w}" for h, w in SHAPES], help="HEADS,WARPS")
    a = ab.parse_args(__doc__, add, argv)
    H, K, ctx = (4, 32, 64) if a.smoke else (64, 512, 8192)
    batches = [2] if a.smoke else a.batches
    shapes = [(1, 2), (2, 4)] if a.smoke else [tuple(int(v) for v in s.split(",")) for s in a.shapes]
    chk = make_decode_inputs(4, H, K, context=ctx, topk_len=True, sink=True, pad_frac=0.1, seed=80)
    ref = reference.sparse_decode(chk.q, chk.cache, chk.indices, sm_scale=ab.SCALE, **chk.kwargs())
    rows = []
    for B in batches:
        inp = make_decode_inputs(B, H, K, context=ctx, seed=800 + B)
        for plan in ab.split_plans(B, H, K):
            for dtype in a.partials:
                opts = replace(planning.launch_of_plan(plan), partials=dtype, pdl=False)
                base = dict(B=B, block_h=plan.cfg.block_h, block_n=plan.cfg.block_n, loop=plan.cfg.loop,
                            nsplit=plan.nsplit, partials=dtype)
                o_part, lse_part = split_k.workspace(B, H, plan.nsplit, inp.q.device, dtype)
                out = torch.empty(B, H, 512, dtype=buffers.out_dtype(), device=inp.q.device)
                lse = torch.empty(B, H, dtype=torch.float32, device=inp.q.device)

                def split_only(opts=opts, o_part=o_part, lse_part=lse_part):
                    head_batched.launch(inp.q, inp.cache, inp.indices, None, ab.SCALE, None, o_part, lse_part, opts)
                rows.append(ab.attempt(dict(base, what="split launch alone"),
                                       lambda: {"us": ab.time_us(split_only, a.smoke)}))
                for heads, warps in shapes:
                    row = dict(base, heads=heads, num_warps=warps)
                    if B == batches[0]:
                        ab.attempt(row, lambda: check_shape(opts, heads, warps, chk, ref), log=None)

                    def comb(heads=heads, warps=warps, o_part=o_part, lse_part=lse_part, out=out, lse=lse):
                        split_k.combine(o_part, lse_part, None, out, lse, heads=heads, num_warps=warps)

                    def both(comb=comb, split_only=split_only):
                        split_only()
                        comb()
                    rows.append(ab.attempt(dict(row, what="combine launch alone"),
                                           lambda: {"us": ab.time_us(comb, a.smoke)}))
                    rows.append(ab.attempt(dict(row, what="split + combine"), lambda: {"us": ab.time_us(both, a.smoke)}))
                if not a.smoke and planning.pdl_supported():     # the package's shape, PDL on
                    pdl = replace(opts, pdl=True)

                    def both_pdl(pdl=pdl, o_part=o_part, lse_part=lse_part, out=out, lse=lse):
                        head_batched.launch(inp.q, inp.cache, inp.indices, None, ab.SCALE, None, o_part, lse_part, pdl)
                        split_k.combine(o_part, lse_part, None, out, lse, pdl=True)
                    rows.append(ab.attempt(dict(base, heads=split_k.COMBINE_HEADS,
                                                num_warps=split_k.combine_warps(getattr(torch, dtype)),
                                                what="split + combine, PDL"),
                                           lambda: {"us": ab.time_us(both_pdl, a.smoke)}))
        del inp
        ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=False)   # kept if cut short
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=True)


if __name__ == "__main__":
    main()
