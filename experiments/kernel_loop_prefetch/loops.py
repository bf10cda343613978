"""The tuned head-batched kernel's three loops on the GPU: "plain", "registers" and "l2_hint".

    python experiments/kernel_loop_prefetch/loops.py OUT.json [--cpu-smoke]

"plain" loads a tile's indices and bytes in the iteration that uses them; "registers" loads the
raw bytes of tile i+1 into registers before tile i is multiplied and dequantizes them after its
P @ V; "l2_hint" loads indices one tile ahead and asks L2 for tile i+1's bytes after tile i's
Q @ K^T (planning.LOOPS). Each loop on both tile entries of the table, with the launch options the
package gives that launch (planning.launch_for: the entry's dequant and fold on whole rows, "cvt"
on split slices, PDL where the split grid leaves half the SMs idle):
  the 64-head entry at (B, NSPLIT) = (1, 1), (1, 4), (32, 1), (32, 4), (64, 1), (64, 2), (128, 1);
  the 16-head entry at B = 1, 2, 4, 8 with splitk's NSPLIT for the shape.
Checks first (poisoned outputs, float64 reference, topk_len, -1 padding, sink; graph replay
bitwise) at NSPLIT 1 and 2, then the time in a graph of one call and per call in a graph of 8
calls, the loops interleaved, best of 2 passes. ~4 min on an H200.
"""
from dataclasses import replace

import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)
import triton

from dsv4lab.kernels.decode import planning
from dsv4lab.testing import make_decode_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "kernel_loop_prefetch"
BIG_SHAPES = [(1, 1), (1, 4), (32, 1), (32, 4), (64, 1), (64, 2), (128, 1)]
SMALL_BATCHES = [1, 2, 4, 8]


def launch(cfg, loop, B, H, nsplit):
    tiles = replace(cfg, loop=loop)
    return planning.launch_for(tiles, nsplit, B * triton.cdiv(H, tiles.block_h) * nsplit)


def main(argv=None):
    a = ab.parse_args(__doc__, argv=argv)
    H, K, ctx = (4, 32, 64) if a.smoke else (64, 512, 8192)
    entries = {"mma": planning.tile_config(H), "split": planning.tile_config(H, split=True)}
    if a.smoke:                   # the interpreter's two entries are the same tiles: one is enough
        entries.pop("split")
        shapes = [("mma", 1, 2)]
    else:
        shapes = [("mma", B, n) for B, n in BIG_SHAPES] + \
                 [("split", B, planning.choose_split(B, H, K).nsplit) for B in SMALL_BATCHES]
    rows = []
    chk = make_decode_inputs(3, H, K, context=ctx, topk_len=True, sink=True, pad_frac=0.1, seed=90)
    for use, cfg in entries.items():
        for loop in planning.LOOPS:
            for n in (1, 2):
                opts = launch(cfg, loop, 3, H, n)
                call = lambda x, opts=opts: ab.decode(opts, x)  # noqa: E731
                rows.append(ab.attempt(dict(kind="check", entry=use, **opts.as_dict()),
                                       lambda: ab.check(call, chk, a.smoke)))
    for use, B, n in shapes:
        inp = make_decode_inputs(B, H, K, context=ctx, seed=900 + B)
        variants = {loop: launch(entries[use], loop, B, H, n) for loop in planning.LOOPS}
        ab.add_times(rows, ab.time_variants(variants, inp, a.smoke),
                     lambda loop: dict(kind="time", entry=use, B=B, **variants[loop].as_dict()))
        del inp
        ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=False)   # kept if cut short
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=True)


if __name__ == "__main__":
    main()
