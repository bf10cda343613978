"""How much faster split-K is than the stage-2 launch at B = 1 and 2, on the GPU, both graph timings.

    python experiments/batch1_split_k_speedup/b1_ratio.py OUT.json [--batches 1 2] [--cpu-smoke]

The launches, each checked first (poisoned outputs, float64 reference, topk_len, -1 padding,
sink; graph replay bitwise), then timed in a graph of one call and per call in a graph of 8
calls on copies of the inputs, interleaved, best of 2 passes:
  "mma (table)"         impl mma: the tiles choose_tiles picks for the shape (16-head tiles at B = 1)
  "splitk (table)"      impl splitk: splitk's plan (tiles and NSPLIT) for the shape
  "auto (table)"        impl splitk_auto (named auto when this ran)
  "mma, 64-head tiles"  the tuned kernel with the table's 64-head entry, whole rows (one program
                        per request at H = 64: the story's stage-2 grid)
  "mma_story"           the story's stage-2 kernel as published (BLOCK_H 32, the plain loop)
The JSON also carries each launch's options. ~1 min on an H200.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

from dsv4lab.kernels.decode import planning
from dsv4lab.kernels.decode import head_batched, split_k
from dsv4lab.testing import make_decode_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "batch1_split_k_speedup"


def launches(B, H, K) -> dict:
    """name -> planning.Launch, or None for the story's kernel (it takes no options)."""
    return {"mma (table)": head_batched.mma_launch(B, H, K), "splitk (table)": split_k.splitk_launch(B, H, K),
            "auto (table)": split_k.auto_launch(B, H, K),
            "mma, 64-head tiles": planning.launch_for(planning.tile_config(H)), "mma_story": None}


def caller(opts):
    if opts is None:
        return lambda x: head_batched.sparse_decode_story(x.q, x.cache, x.indices, topk_len=x.topk_len,
                                                          sm_scale=ab.SCALE, attn_sink=x.attn_sink)
    return lambda x: ab.decode(opts, x)


def main(argv=None):
    a = ab.parse_args(__doc__, lambda p: p.add_argument("--batches", type=int, nargs="+", default=[1, 2]), argv)
    H, K, ctx = (4, 32, 64) if a.smoke else (64, 512, 8192)
    rows = []
    chk = make_decode_inputs(2, H, K, context=ctx, topk_len=True, sink=True, pad_frac=0.1, seed=41)
    for name, opts in launches(2, H, K).items():
        rows.append(ab.attempt(dict(kind="check", variant=name, launch=opts and opts.as_dict()),
                               lambda: ab.check(caller(opts), chk, a.smoke)))
    for B in ([1] if a.smoke else a.batches):
        inp = make_decode_inputs(B, H, K, context=ctx, seed=900 + B)
        variants = launches(B, H, K)
        ab.add_times(rows, ab.time_variants({n: caller(o) for n, o in variants.items()}, inp, a.smoke),
                     lambda name: dict(kind="time", B=B, variant=name, launch=variants[name] and variants[name].as_dict()))
        del inp
        ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=False)   # kept if cut short
    ab.write(a.out, QUESTION, a.smoke, H=H, K=K, context=ctx, rows=rows, complete=True)


if __name__ == "__main__":
    main()
