"""The MoE stand-in's two GEMMs (S5's moe_up and moe_down) over launch shapes, per batch: how wide a
program's tile is (``block_n``) and, for the up GEMM, over how many programs K is split (``split``, a
second launch applies the SiLU). At C = 1 one expert's weights (8.9 MB up, 4.5 MB down) are read by
17 (up, 32 wide) and 64 (down) programs on a 132-SM chip; at C = 64, 25 experts by 25 times as many.

    python experiments/s5_fused_glue/moe_launch.py OUT.json [--batches 1 2 4 8 16 32 64] [--cpu-smoke]

DeepSeek-V4-Flash's share (one layer), the dispatch tables as Model.inputs builds them. Checks first
(every variant, its outputs poisoned, against S4's grouped GEMMs and SiLU: relative error within
OUT_TOL); then graph-replay times (do_bench median), the variants interleaved, the best of two passes, and
the bytes of weights read per us; each row says whether it is the shape moe_fused.moe_launch picks.
--cpu-smoke: the CPU preset, a few variants, no times.
"""
from dataclasses import replace

import sys
from itertools import product
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)
import torch

from dsv4lab import step_glue
from dsv4lab.kernels.decode.planning import sm_count
from dsv4lab.kernels.step import moe, moe_fused
from dsv4lab.model import CPU_MODEL, DSV4_FLASH_TP8, Model
from dsv4lab.testing import OUT_TOL, poisoned, rel_err
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "s5_fused_glue"
UP = list(product([16, 32, 64, 128], [1, 2, 4, 8]))        # (block_n, split)
DOWN = [16, 32, 64, 128]                                    # block_n


def main(argv=None):
    a = ab.parse_args(__doc__, lambda p: p.add_argument("--batches", type=int, nargs="+",
                                                        default=[1, 2, 4, 8, 16, 32, 64]), argv)
    cfg = replace(CPU_MODEL if a.smoke else DSV4_FLASH_TP8, layers_window=1, layers_c4=0, layers_c128=0)
    m = Model(cfg)
    lw = m.weights[0]
    rows = []
    for B in ([2] if a.smoke else a.batches):
        inp = m.inputs(B)
        g = torch.Generator(device=m.device).manual_seed(B)
        y = torch.randn(B, cfg.hidden, generator=g, device=m.device).to(torch.bfloat16)
        topw = torch.rand(B, cfg.active_experts, generator=g, device=m.device)
        E, M = inp.moe_tok.shape
        ref_h = step_glue.silu_mul(moe.moe_grouped_gemm(y[inp.moe_tok], lw.w13)).float()
        hmid = moe_fused.moe_up(y, inp.moe_tok, lw.w13)
        ref_y = moe.moe_grouped_gemm(hmid, lw.w2) * (topw[inp.moe_tok, inp.moe_col] * inp.moe_valid).unsqueeze(-1)
        up_bytes, down_bytes = E * lw.w13[0].numel() * 2, E * lw.w2[0].numel() * 2
        variants = {("up", n, s): (lambda n=n, s=s: moe_fused.moe_up(y, inp.moe_tok, lw.w13, block_n=n, split=s))
                    for n, s in (UP[:3:2] if a.smoke else UP)}
        variants.update({("down", n, 1): (lambda n=n: moe_fused.moe_down(hmid, lw.w2, topw, inp.moe_tok, inp.moe_col,
                                                                         inp.moe_valid, block_n=n))
                         for n in (DOWN[:2] if a.smoke else DOWN)})
        def check(k, fn):
            with poisoned():
                err = rel_err(fn().float(), ref_h if k[0] == "up" else ref_y)
            return dict(rel_err=err, ok=err <= OUT_TOL)
        checked = {k: ab.attempt(dict(gemm=k[0], B=B, experts=E, rows_per_expert=M, block_n=k[1], split=k[2]),
                                 lambda k=k, fn=fn: check(k, fn), log=None) for k, fn in variants.items()}
        ok = {k: fn for k, fn in variants.items() if "error" not in checked[k]}
        timed = ab.best_of(1 if a.smoke else 2, ok, lambda fn: dict(graph_us=ab.time_us(fn, a.smoke)))
        rule = moe_fused.moe_launch(E, lw.w2.shape[1], lw.w2.shape[2], sm_count())
        for k in variants:
            row = {**checked[k], **timed.get(k, {}),
                   "moe_launch_picks": k[1:] == (rule[:2] if k[0] == "up" else (rule[2], 1))}
            if row.get("graph_us"):
                row["weights_GB_per_s"] = round((up_bytes if k[0] == "up" else down_bytes) / row["graph_us"] / 1e3, 1)
            rows.append(row)
            print({kk: (round(v, 4) if isinstance(v, float) else v) for kk, v in row.items()}, flush=True)
        ab.write(a.out, QUESTION, a.smoke, config=cfg.as_dict(), rows=rows, complete=False)
    ab.write(a.out, QUESTION, a.smoke, config=cfg.as_dict(), rows=rows, complete=True)


if __name__ == "__main__":
    main()
