"""S4's and S5's whole step on DeepSeek-V4-Flash's share, in one process: S5 against S4 on one path
(step_compare.compare_stages, S4's top-k and experts replayed in S5), then per C (a row each) both steps captured as
CUDA graphs and replayed alternately (a drift hits both; the median of 30 replays each), S5's replay
checked bitwise against its eager step, and a kernel profile of one replay of each (category ms and
kernels a step). The replay (`python -m dsv4lab reproduce`) records the same and more; this is the
short run for a change to S5's kernels.

    python experiments/s5_fused_glue/step_s4_vs_s5.py OUT.json [--batches 1 64] [--cpu-smoke]

--cpu-smoke: the CPU preset, the comparison at C = 2 and one eager step of each stage, no times.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)
import torch

from dsv4lab import bench
from dsv4lab.model import CPU_MODEL, Model
from dsv4lab.stages import stage
from dsv4lab.step_compare import compare_stages
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "s5_fused_glue"
STAGES = ("S4", "S5")


def profile_summary(model, fn, graph, C: int) -> dict:
    """Kernel ms by category and kernels a step, from one profiled graph replay (the replay's profiler)."""
    from dsv4lab.replay.profiling import profile_cell
    p = profile_cell(model, fn, graph.replay, True, C, eager=False)
    return dict(total_us=p["total_us"], by_category=p["by_category"],
                kernels_per_step=sum(k["calls"] for k in p["kernels"]), top_kernels=p["kernels"][:12])


def main(argv=None):
    a = ab.parse_args(__doc__, lambda p: p.add_argument("--batches", type=int, nargs="+", default=[1, 64]), argv)
    m = Model(CPU_MODEL) if a.smoke else Model()
    batches = [2] if a.smoke else a.batches
    res = dict(config=m.cfg.as_dict(), compare=[], rows=[], profiles={})
    for B in batches:
        row = ab.attempt(dict(B=B), lambda B=B: compare_stages(m, B))
        if "error" not in row:
            row["ok"] = row["finite"] and row["rel_err"] < row["tolerance"]
        res["compare"].append(row)
        ab.write(a.out, QUESTION, a.smoke, **res, complete=False)
    for C in batches:
        fns = {}
        for name in STAGES:
            inp = m.inputs(C, stage(name).max_context)
            m.check(inp)
            fns[name] = lambda inp=inp, s=stage(name): m.step(inp, s)
        if a.smoke:
            for name, fn in fns.items():
                finite = bool(torch.isfinite(fn()).all())
                res["rows"].append(dict(stage=name, C=C, finite=finite, ok=finite and all(
                    r.get("ok") for r in res["compare"] if r["B"] == C)))
            continue
        from dsv4lab.replay.measure import replay_ms
        graphs = {name: bench.capture(fn) for name, fn in fns.items()}
        times = {name: [] for name in graphs}
        for _ in range(5):
            for name, (g, _) in graphs.items():
                times[name] += replay_ms(g, 6)
        for name, (g, out) in graphs.items():
            ms = sorted(times[name])[len(times[name]) // 2]
            g.replay()
            torch.cuda.synchronize()
            rep = out.clone()
            res["rows"].append(dict(stage=name, C=C, step_ms=ms, tok_s=C / ms * 1e3, step_ms_all=times[name],
                                     finite=bool(torch.isfinite(rep).all()),
                                     replay_equals_eager_bitwise=bool(torch.equal(rep, fns[name]()))))
            print({k: v for k, v in res["rows"][-1].items() if k != "step_ms_all"}, flush=True)
            res["profiles"][f"{name}/{C}"] = profile_summary(m, fns[name], g, C)
        graphs = g = out = None               # the last graph's pool too
        torch.cuda.empty_cache()
        ab.write(a.out, QUESTION, a.smoke, **res, complete=False)
    ab.write(a.out, QUESTION, a.smoke, **res, complete=True)


if __name__ == "__main__":
    main()
