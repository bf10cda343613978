"""What the A/B scripts under experiments/ share: their command line, the smoke mode CI runs,
timing that becomes a single call in that mode, per-case error rows, and the JSON they write.

    python experiments/<question>/<script>.py OUT.json [--cpu-smoke] [script options]

On a GPU a script checks every variant against the float64 reference and times it (CUDA-graph
replay, do_bench median, L2 flushed). With ``--cpu-smoke``, or automatically without a GPU, it
runs the same code on tiny shapes through Triton's interpreter and records no times (``us`` is
None): it proves the script runs, not how fast anything is. Every case is caught into its row
(``error``), so a run always finishes and writes what it has.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch

from dsv4lab import bench, reference, roofline
from dsv4lab.device import mode
from dsv4lab.testing import LSE_TOL, OUT_TOL, poisoned, rel_err

#: the softmax scale of every decode here (1 / sqrt(head_dim))
SCALE = 512 ** -0.5


def parse_args(doc: str, add=None, argv=None) -> argparse.Namespace:
    """OUT.json, --cpu-smoke and the script's own options (``add(parser)``); ``.smoke`` is True
    with --cpu-smoke or when this process has no GPU."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the JSON file to write")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny shapes, no timings (what CI runs; automatic without a GPU)")
    if add:
        add(ap)
    a = ap.parse_args(argv)
    a.smoke = a.cpu_smoke or mode() != "cuda"
    return a


def time_us(fn, smoke: bool, *, graph: bool = True, **kw) -> float | None:
    """Median microseconds of ``fn`` (bench.time_ms, CUDA-graph replay by default); in smoke mode
    one call and None."""
    if smoke:
        fn()
        return None
    return bench.time_ms(fn, graph=graph, **kw) * 1e3


def time_in_graph_us(fns, smoke: bool) -> float | None:
    """Microseconds per call inside one CUDA graph of ``fns`` (bench.time_per_call_in_graph_ms);
    in smoke mode each called once and None."""
    if smoke:
        for fn in fns:
            fn()
        return None
    return bench.time_per_call_in_graph_ms(fns) * 1e3


def add_times(rows: list, timed: dict, row_of) -> None:
    """Append one row per timed variant of ``timed`` ({name: times}, as time_variants returns):
    ``row_of(name)`` with the times, printed as it lands."""
    for name, t in timed.items():
        rows.append({**row_of(name), **t})
        print(rows[-1], flush=True)


def host_profile(fn, smoke: bool, calls: int = 300, top: int = 25) -> list:
    """The top functions by own time over ``calls`` eager calls: microseconds a call."""
    calls = 2 if smoke else calls
    fn()
    p = cProfile.Profile()
    p.enable()
    for _ in range(calls):
        fn()
    p.disable()
    if not smoke:
        torch.cuda.synchronize()
    st = pstats.Stats(p, stream=io.StringIO())
    rows = sorted(((f"{k[0].split('/')[-1]}:{k[1]}({k[2]})", v[1] / calls, v[2] / calls * 1e6, v[3] / calls * 1e6)
                   for k, v in st.stats.items()), key=lambda r: -r[2])
    return [dict(function=f, calls=n, own_us=round(own, 2), cum_us=round(cum, 2)) for f, n, own, cum in rows[:top]]


def attempt(row: dict, fn, log=print) -> dict:
    """``row`` updated with what ``fn()`` returns (a dict), or with ``error`` if it raises; logged."""
    try:
        row.update(fn())
    except Exception as e:  # one failing case is a row, not the end of the run
        row["error"] = repr(e)[:300]
    if log:
        log({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()})
    return row


def best_of(passes: int, variants: dict, measure) -> dict:
    """{name: {key: lowest value over ``passes``}} for ``measure(variant) -> {key: us or None}``,
    the variants interleaved in each pass (a drift of the device's clock or temperature hits them
    alike). A variant whose measure raises gets {"error": ...} and is not measured again."""
    best: dict = {}
    for _ in range(passes):
        for name, v in variants.items():
            if "error" in best.get(name, {}):
                continue
            try:
                got = measure(v)
            except Exception as e:  # one failing variant is a row, not the end of the run
                best[name] = {"error": repr(e)[:300]}
                continue
            old = best.setdefault(name, got)
            best[name] = {k: got[k] if old.get(k) is None or got[k] is None else min(old[k], got[k]) for k in got}
    return best


def decode(opts, inp):
    """One sparse decode of ``inp`` (testing.DecodeInputs) with the launch options ``opts``
    (planning.Launch): split_k.run, which is the stage-2 launch alone when opts.nsplit == 1."""
    from dsv4lab.kernels.decode import split_k
    return split_k.run(inp.q, inp.cache, inp.indices, inp.topk_len, SCALE, inp.attn_sink, opts)


def check(call, inp, smoke: bool, ref=None) -> dict:
    """``call(inp)`` (-> out, lse) with poisoned outputs against the float64 reference (``ref``: its
    (out, lse), computed if not given): out_err, lse_err, ok; on a GPU also whether a CUDA-graph
    replay of the call equals the eager call bitwise."""
    ro, rl = ref or reference.sparse_decode(inp.q, inp.cache, inp.indices, sm_scale=SCALE, **inp.kwargs())
    with poisoned():
        out, lse = call(inp)
    row = dict(out_err=rel_err(out.float(), ro), lse_err=rel_err(lse, rl))
    row["ok"] = row["out_err"] <= OUT_TOL and row["lse_err"] <= LSE_TOL
    if not smoke:
        eager = call(inp)
        g, res = bench.capture(lambda: call(inp))
        g.replay()
        torch.cuda.synchronize()
        row["graph_bitwise"] = bool(torch.equal(res[0], eager[0]) and torch.equal(res[1], eager[1]))
        row["ok"] = row["ok"] and row["graph_bitwise"]
    return row


def graph_times(call, inp, smoke: bool, copies=None) -> dict:
    """``call(x)`` decodes input set x: graph_us (a CUDA graph of one call) and graph_layer_us (per
    call in one graph of a call on each of ``copies``, default bench.layer_copies(inp, LAYERS): as a
    captured decode step runs its layers, paying the graph's launch once)."""
    copies = copies or bench.layer_copies(inp, 2 if smoke else bench.LAYERS)
    return {"graph_us": time_us(lambda: call(inp), smoke),
            "graph_layer_us": time_in_graph_us([lambda x=x: call(x) for x in copies], smoke)}


def time_variants(variants: dict, inp, smoke: bool) -> dict:
    """{name: {"graph_us", "graph_layer_us", "tflops"}} for ``variants`` {name: planning.Launch, or a
    call(x) -> (out, lse)} on ``inp``: a graph of one call and per call in a graph of 8 calls on
    copies of the inputs (graph_times), the variants interleaved, best of 2 passes (in smoke mode one
    pass and no times)."""
    B, H, _ = inp.q.shape
    flops = roofline.decode_flops(B, H, inp.indices.shape[1])
    copies = bench.layer_copies(inp, 2 if smoke else bench.LAYERS)

    def measure(v):
        t = graph_times(v if callable(v) else (lambda x: decode(v, x)), inp, smoke, copies)
        t["tflops"] = flops / (t["graph_us"] * 1e-6) / 1e12 if t["graph_us"] else None
        return t
    return best_of(1 if smoke else 2, variants, measure)


def split_plans(B: int, H: int, K: int) -> list:
    """The split launches (NSPLIT > 1) impls splitk and splitk_auto take for the shape (planning.Plan), once each."""
    from dsv4lab.kernels.decode import planning
    found = {}
    for p in (planning.choose_split(B, H, K), planning.choose(B, H, K)):
        if p.nsplit > 1:
            found.setdefault((p.cfg, p.nsplit), p)
    return list(found.values())


def write(path: str, question: str, smoke: bool, **payload):
    """The JSON of one run: the environment stamp (date, device, versions, tile table, launches),
    the experiment's question folder, whether it was a smoke run, and ``payload``. Scripts write it
    after every batch size (``complete=False``) and once more at the end, so a run cut short
    keeps what it measured."""
    bench.save(path, {**bench.environment(), "experiment": question, "smoke": smoke, **payload})
