"""Command line: ``python -m dsv4lab info | bench decode ... | record --out DIR | reproduce [--quick] [--out DIR]``."""
from __future__ import annotations

import argparse
import json
import sys

import dsv4lab  # noqa: F401  (sets the mode before triton is imported; a bad DSV4LAB_MODE exits 2 there)
from dsv4lab.config import PAGE_SIZE
from dsv4lab.device import ModeError


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (the usage is one --help away)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def _count(lo: int):
    """argparse type: an int >= lo."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int >= {lo}, got {text!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be an int >= {lo}, got {v}")
        return v
    return parse


def _impl(name: str) -> str:
    """argparse type: a sparse_decode impl name."""
    names = dsv4lab.impls()
    if name not in names:
        raise argparse.ArgumentTypeError(f"must be one of {names}, got {name!r}")
    return name


def _info(args):
    from . import bench, device
    env = bench.environment()
    env["ceilings"] = device.ceilings().as_dict()
    env["interpreter_traps"] = device.INTERPRETER_TRAPS if device.is_interpret() else "n/a (cuda mode)"
    print(json.dumps(env, indent=1, default=str))


def _bench_decode(args):
    from . import bench, device
    if device.mode() != "cuda":
        raise SystemExit("bench needs a CUDA GPU (this process runs Triton's interpreter); "
                         "the recorded H200 runs are in data/runs/, e.g. data/runs/h200/decode.json")
    import pandas as pd
    from .registry import registered
    impls = args.impl or [i.name for i in registered(tag="recorded")]
    rows = bench.decode_table(impls, args.batch, H=args.heads, K=args.topk, context=args.context,
                              page_size=args.page_size, baseline=impls[0], graph=not args.no_graph,
                              layers=bench.LAYERS if args.layers is None else args.layers)
    df = pd.DataFrame(rows)
    cols = [c for c in ["impl", "B", "eager_us", "back_to_back_us", "graph_us", "graph_layer_us", "speedup_vs_baseline",
                        "speedup_vs_baseline_layer", "served_tb_s", "floor_tb_s", "tflops", "tflops_layer",
                        "bw_share", "mma_share"] if c in df]
    print(df[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    if args.json:
        bench.save(args.json, {**bench.environment(), "ceilings": device.ceilings().as_dict(), "rows": rows})


def _readme(args):
    from . import report
    stale = report.sync_readme(write=not args.check)
    if args.check and stale:
        raise SystemExit(f"README.md / docs/*.md tables differ from data/: {', '.join(stale)} "
                         "(run: python -m dsv4lab readme)")
    print("README.md and docs/*.md: " + (f"rewrote {', '.join(stale)}" if stale else "every table matches data/"))


def main(argv=None):
    p = _Parser(prog="python -m dsv4lab")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="mode, device, versions and ceilings").set_defaults(fn=_info)
    pb = sub.add_parser("bench", help="time kernels (GPU)")
    bsub = pb.add_subparsers(dest="what", required=True)
    pd_ = bsub.add_parser("decode", help="sparse decode: time vs B, bytes, FLOP/s")
    pd_.add_argument("--impl", nargs="+", type=_impl,
                     help="first one is the baseline for speedups (default: the recorded impls, the campaign's "
                          "baseline first)")
    pd_.add_argument("--batch", nargs="+", type=_count(1), default=[1, 4, 16, 32, 64, 128])
    pd_.add_argument("--heads", type=_count(1), default=64)
    pd_.add_argument("--topk", type=_count(1), default=512)
    pd_.add_argument("--context", type=_count(1), default=8192)
    pd_.add_argument("--page-size", type=_count(1), default=PAGE_SIZE)
    pd_.add_argument("--no-graph", action="store_true", help="eager launches only")
    pd_.add_argument("--layers", type=_count(0), default=None,
                     help="also time each call inside one graph of this many calls on copies of the inputs, "
                          "as a captured decode step runs its layers (graph_layer_us; default bench.LAYERS = 8); "
                          "0: skip")
    pd_.add_argument("--json", help="write the rows here")
    pd_.set_defaults(fn=_bench_decode)
    pr = sub.add_parser("record", help="the full recorded GPU run (checks, decode, tiles, split)")
    pr.add_argument("--out", required=True)
    pr.add_argument("--only", nargs="+", choices=["checks", "decode", "tiles", "split", "indexer"])
    pr.set_defaults(fn=lambda a: __import__("dsv4lab.record", fromlist=["main"]).main(a.out, a.only))
    prp = sub.add_parser("reproduce", help="the campaign replayed on a synthetic DSv4-Flash decode step: "
                                           "profile shifts and throughput per stage (dsv4lab.replay)")
    prp.add_argument("--quick", action="store_true", help="the CPU preset's small shapes (what a CPU runs anyway)")
    prp.add_argument("--stages", nargs="+", help="stage names (default all: S0 S1 S2 S3 S4 S1stop S1best S1cap S0cap S3cap)")
    prp.add_argument("--out", default="reproduce", help="folder for the tables, plots and JSON")
    prp.add_argument("--budget-s", type=float, help="GPU: start no new work after this many seconds (default 520)")
    prp.add_argument("--no-compile", action="store_true", help="skip the torch.compile lesson")
    prp.add_argument("--layers", nargs=3, type=int, metavar=("WINDOW", "RATIO4", "RATIO128"),
                     help="the layer mix (default 2 21 20; the CPU preset 1 1 1)")
    prp.add_argument("--live-context", type=int, help="tokens each request holds (default 8192)")
    prp.set_defaults(fn=lambda a: __import__("dsv4lab.replay", fromlist=["cli"]).cli(a))
    prm = sub.add_parser("readme", help="rewrite the measured tables of README.md and the docs pages (docs/*.md) from data/ "
                                        "(--check: only compare)")
    prm.add_argument("--check", action="store_true", help="exit 1 if a table differs from the data")
    prm.set_defaults(fn=_readme)
    args = p.parse_args(argv)
    try:
        args.fn(args)
    except (ValueError, TypeError, OSError, KeyError, ModeError) as e:   # bad input or setup: one line, not a traceback
        print(f"dsv4lab {args.cmd}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
