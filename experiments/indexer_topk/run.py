"""The indexer step over the live context on the GPU, version 2 (README "Version 2: after run 1"):
checks, the step against the max context, the top-k alone per split, the logits alone per launch,
eager against graph, the issue's targets.

    python experiments/indexer_topk/run.py OUT.json [--cpu-smoke]

Everything in one process, every ratio from times taken in this run. Sections, each written to
OUT.json as soon as it is done (``complete`` False until the end):

1. checks (``kind="check"``): the registered step at B = 32, H = 64, max context 262208, random
   lengths (0, 1, < k among them) against ``reference.topk_positions`` on its own logits (exact)
   and the float64 reference's selection (recall); one captured graph replayed on the next step's
   data against the reference and bitwise against an eager call; the API's second call of one
   signature (its prepared step) on the next step's data.
2. the step against the max context (``kind="step_vs_max"``): B = 32, 8192 live, max 65536 /
   262208 / 1,048,576 for impl "triton"; every other available impl (the torch fallbacks, SGLang's)
   at 65536 and 262208 ("torch_fp32" at 262208 is the targets' baseline); then the Triton step
   against the live length (``kind="step_vs_live"``) at max 1,048,576, with logits and top-k alone.
3. eager (``kind="eager"``; ``kind="eager_first"``: the same at max 262208 right after the checks,
   before section 2 allocates gigabytes): ``dsv4lab.indexer_topk(..., impl="triton")`` with default
   checks, back to back (``bench.back_to_back_us``) and in a graph, with a cProfile of its calls
   (``api_profile``) and back to back without Python's garbage collector; the registered function;
   the step with the one-launch top-k (split 1) and with the merge as its own launch; at max 262208
   and 1,048,576.
4. top-k alone (``kind="topk"``): each launch of ``SPLITS`` checked exact on random lengths, then
   timed at live 8192, max 262208 and 1,048,576, and at live 65536 (streamed chunks);
   ``kind="topk_batch"``: the shipped choice with its merge launched and fused, and S = 1, at
   B = 1, 64, 128.
5. logits alone (``kind="logits"``): the shipped launch and run 1's, checked against the float64
   reference, timed at live 8192 and 65536 with their share of the measured copy bandwidth.
6. targets (``kind="target"``), then safety (``kind="safety"``, last: a fault would end the
   process): a captured step whose live page ids lie outside the cache.

Graph replay, do_bench median with L2 flushed, microseconds. ~1.5-2 minutes on an H200.
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import gc
import math
import time
from dataclasses import replace

import torch

from dsv4lab import api, bench, errors, reference
from dsv4lab.cache import INDEX_TOKEN_BYTES
from dsv4lab.device import ceilings
from dsv4lab.kernels.decode import sglang_peer
from dsv4lab.kernels.indexer import triton_indexer, topk
from dsv4lab.kernels.indexer.triton_indexer import LOGITS, LOGITS_RUN1
from dsv4lab.kernels.indexer.topk import TOPK, topk_triton
from dsv4lab.testing import INDEXER_TOL, make_indexer_inputs, poisoned, rel_err, topk_recall
from dsv4lab import registry
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "indexer_topk"
K = 512
H = 64
#: the top-k launches timed: (split, warps, merge); split None is the shipped choice (topk.split_for),
#: warps None the shipped ``TOPK.num_warps``; the merge as its own launch first (the baseline),
#: then fused (the shipped merge). Runs 5-7 also timed the bucket's compaction (commit 4684d48504ee).
SPLITS = [(None, None, "launch"), (1, None, "launch"), (2, None, "launch"), (4, None, "launch"), (8, None, "launch"),
          (4, 4, "launch"), (4, 32, "launch"), (None, None, "fused"), (2, None, "fused"), (8, None, "fused")]
#: the logits launches timed: the shipped one (run 1's pick) and run 1's default
LOGITS_LAUNCHES = {"shipped": LOGITS, "run1": LOGITS_RUN1}


def step_bytes(inp, k=K) -> int:
    """What the step must move: live keys once (132 B a token), q, weights, the live logits
    written and read back, the positions written."""
    live = int(inp.seq_lens.clamp(0, inp.max_seq_len).sum())
    B, Hi, D = inp.q.shape
    return live * (INDEX_TOKEN_BYTES + 8) + B * Hi * (D * inp.q.element_size() + 4) + B * k * 4


def logits_bytes(inp) -> int:
    """The logits kernel's share: live keys, q, weights, live logits written."""
    live = int(inp.seq_lens.clamp(0, inp.max_seq_len).sum())
    B, Hi, D = inp.q.shape
    return live * (INDEX_TOKEN_BYTES + 4) + B * Hi * (D * inp.q.element_size() + 4)


def available(impl) -> bool:
    """The impl can run here (SGLang's needs its wheel)."""
    return "sglang" not in registry.impl_info("indexer_topk", impl).needs or sglang_peer.unavailable_reason() is None


def registered(impl):
    """The impl's top-k as a captured graph runs it: the registered function, no API checks."""
    fn = registry.impl_info("indexer_topk", impl).fn
    return lambda inp, k=K: fn(*inp.args(), max_seq_len=inp.max_seq_len, topk=k)


def check_step(inp, got, k=K, ref=None) -> dict:
    """``got`` (a Triton step's positions) against the contract on the kernel's own logits (exact)
    and against the float64 reference's selection (recall with ties)."""
    with poisoned():
        logits = dsv4lab.indexer_logits(*inp.args(), max_seq_len=inp.max_seq_len, impl="triton")
    ref = reference.indexer_logits(*inp.args(), inp.max_seq_len) if ref is None else ref
    want = reference.topk_positions(logits, k)
    row = dict(exact=bool(torch.equal(got.cpu(), want.cpu())), logits_err=rel_err(logits, ref),
               recall=topk_recall(got.cpu(), reference.topk_indices(ref, k).cpu(), ref.cpu()))
    row["ok"] = row["exact"] and row["logits_err"] <= INDEXER_TOL and row["recall"] == 1.0
    return row


def next_step(inp, seed, live):
    """The next decode step's data written into ``inp``'s buffers (what a captured graph sees):
    new lengths (one 0, one shorter than the top-k, one the whole max context), a shuffled page
    table, new q and weights."""
    B = inp.q.shape[0]
    nxt = make_indexer_inputs(B, inp.q.shape[1], inp.max_seq_len, seq_lens=live, seed=seed)
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, live + 1, (B,), generator=g).int()
    lens[0], lens[1] = 0, min(K // 3, live)
    inp.seq_lens.copy_(lens)
    inp.page_table.copy_(inp.page_table[torch.randperm(B, generator=g).to(inp.page_table.device)])
    inp.q.copy_(nxt.q)
    inp.weights.copy_(nxt.weights)


def run_checks(smoke, B, L, live) -> list:
    rows = []
    lens = torch.randint(0, 2 * live + 1, (B,), generator=torch.Generator().manual_seed(31)).tolist()
    lens[:3] = [0, 1, K - 1]                                 # empty, one token, shorter than the top-k
    inp = make_indexer_inputs(B, H, L, seq_lens=lens, seed=31)
    step = registered("triton")
    rows.append(ab.attempt(dict(kind="check", case=f"step B={B} max {L}, random lengths"),
                           lambda: check_step(inp, step(inp))))
    # one captured graph for every step: replay it on the next step's data
    cap = make_indexer_inputs(B, H, L, seq_lens=live, seed=32)

    def replay():
        if smoke:
            next_step(cap, 33, live)
            return {**check_step(cap, step(cap)), "note": "smoke: no graph, an eager call on the new data"}
        g, res = bench.capture(lambda: step(cap))
        next_step(cap, 33, live)
        g.replay()
        torch.cuda.synchronize()
        row = check_step(cap, res)
        row["bitwise_vs_eager"] = bool(torch.equal(res, step(cap)))
        row["ok"] = row["ok"] and row["bitwise_vs_eager"]
        return row
    rows.append(ab.attempt(dict(kind="check", case="graph replay on the next step's data (new seq_lens incl. 0 and "
                                                    "short, shuffled page table, new q and w)"), replay))
    # the API eager: its first call checks and prepares the signature, the next goes to the launches
    api = make_indexer_inputs(B, H, L, seq_lens=live, seed=34)

    def prepared():
        call = lambda: dsv4lab.indexer_topk(*api.args(), max_seq_len=L, topk=K, impl="triton")  # noqa: E731
        call()
        next_step(api, 35, live)
        return {**check_step(api, call()), "prepared_signatures": len(dsv4lab.api.prepared_calls())}
    rows.append(ab.attempt(dict(kind="check", case="the API's prepared call (a repeated signature) on the next "
                                                    "step's data"), prepared))
    return rows


def split_launch(split, warps=None, merge=None):
    return replace(TOPK, split=split, num_warps=warps or TOPK.num_warps, merge=merge or TOPK.merge)


def random_lengths(B, live, seed):
    lens = torch.randint(0, 2 * live + 1, (B,), generator=torch.Generator().manual_seed(seed)).tolist()
    lens[:3] = [0, 1, K - 1]                                 # empty, one token, shorter than the top-k
    return lens


def run_topk(smoke, B, live) -> list:
    """Each split checked exact on random lengths (logits with -inf past each length), then timed
    on the logits kernel's live-only output at 8192 live (max 262208 and 1M) and at live 65536;
    then the shipped split against S = 1 at other batch sizes."""
    rows = []
    L = 700 if smoke else 262208
    chk = make_indexer_inputs(B, H, L, seq_lens=random_lengths(B, live, 51), seed=51)
    x = dsv4lab.indexer_logits(*chk.args(), max_seq_len=L, impl="triton")
    want = reference.topk_positions(x, K)
    shapes = [(live, 700)] if smoke else [(8192, 262208), (8192, 1048576), (65536, 65536)]
    timed = {}
    for n, Lm in shapes:
        inp = make_indexer_inputs(B, H, Lm, seq_lens=n, seed=52)
        timed[n, Lm] = (triton_indexer.logits_triton(*inp.args(), Lm, fill_dead=False), inp.seq_lens)
        del inp
    sms = 2 if smoke else torch.cuda.get_device_properties(0).multi_processor_count
    for split, warps, merge in SPLITS[:5] + SPLITS[-3:] if smoke else SPLITS:   # warps: one program in the interpreter
        launch = split_launch(split, warps, merge)

        def one(launch=launch):
            with poisoned():
                got = topk_triton(x, chk.seq_lens, K, launch=launch)
            row = dict(exact=bool(torch.equal(got.cpu(), want.cpu())))
            row["ok"] = row["exact"]
            for (n, Lm), (logits, seq) in timed.items():
                row[f"us_live{n}_max{Lm}"] = ab.time_us(lambda: topk_triton(logits, seq, K, launch=launch), smoke)
            return row
        rows.append(ab.attempt(dict(kind="topk", split=split, num_warps=launch.num_warps, merge=launch.merge, B=B,
                                    resolved_split=split or topk.split_for(B, L, K, sms)), one))
    del timed
    for b in ([1, 2] if smoke else [1, 64, 128]):
        inp = make_indexer_inputs(b, H, L, seq_lens=live, seed=53)
        logits = triton_indexer.logits_triton(*inp.args(), L, fill_dead=False)
        for split, merge in ((None, "launch"), (1, "launch"), (None, "fused")):
            def one(split=split, logits=logits, inp=inp, merge=merge):
                return dict(us=ab.time_us(lambda: topk_triton(logits, inp.seq_lens, K, launch=split_launch(
                    split, merge=merge)), smoke))
            rows.append(ab.attempt(dict(kind="topk_batch", split=split, merge=merge, resolved_split=split or topk.split_for(
                b, L, K, sms), B=b, live=live, max_seq_len=L), one))
        del inp, logits
    return rows


def run_logits(smoke, B, floor, copy) -> list:
    """The shipped logits launch and run 1's: checked (poisoned, float64 reference), then timed on
    live pages only at live 8192 (max 262208) and 65536 (max 65536), with the share of copy."""
    rows = []
    chk = make_indexer_inputs(4, H, 700 if smoke else 4096, seed=41)
    ref = reference.indexer_logits(*chk.args(), chk.max_seq_len)
    shapes = [(300, 700), (200, 200)] if smoke else [(8192, 262208), (65536, 65536)]
    for name, launch in LOGITS_LAUNCHES.items():
        def one(launch=launch):
            with poisoned():
                out = triton_indexer.logits_triton(*chk.args(), chk.max_seq_len, launch=launch)
            row = dict(logits_err=rel_err(out, ref))
            row["ok"] = row["logits_err"] <= INDEXER_TOL
            for n, Lm in shapes:
                inp = make_indexer_inputs(B, H, Lm, seq_lens=n, seed=54)
                us = ab.time_us(lambda: triton_indexer.logits_triton(*inp.args(), Lm, launch=launch, fill_dead=False), smoke)
                row[f"us_live{n}"] = us
                row[f"floor_us_live{n}"] = floor(logits_bytes(inp))
                row[f"share_of_copy_live{n}"] = logits_bytes(inp) / (us * 1e-6) / (copy * 1e12) if us and copy else None
                del inp
            return row
        rows.append(ab.attempt(dict(kind="logits", launch=name, B=B, **launch.as_dict()), one))
    return rows


def run_eager(smoke, inp) -> dict:
    """Eager calls back to back against graph replay: the API (default checks), the registered
    function, the step with the one-launch top-k (split 1) and with the merge as its own launch."""
    api_call = lambda: dsv4lab.indexer_topk(*inp.args(), max_seq_len=inp.max_seq_len, topk=K, impl="triton")  # noqa: E731
    one_launch = lambda: triton_indexer.topk_step(*inp.args(), inp.max_seq_len, K, topk_launch=split_launch(1))  # noqa: E731
    two = lambda: triton_indexer.topk_step(*inp.args(), inp.max_seq_len, K, topk_launch=split_launch(None, merge="launch"))  # noqa: E731
    api_e = eager_us(api_call, smoke)
    fn_e = eager_us(lambda: registered("triton")(inp), smoke)
    one_e = eager_us(one_launch, smoke)
    two_e = eager_us(two, smoke)
    row = dict(api_eager_us=api_e["median_us"], api_host_us=api_e["host_us"],
               fn_eager_us=fn_e["median_us"], fn_host_us=fn_e["host_us"],
               fn_graph_us=ab.time_us(lambda: registered("triton")(inp), smoke),
               split1_eager_us=one_e["median_us"], split1_host_us=one_e["host_us"],
               split1_graph_us=ab.time_us(one_launch, smoke),
               merge_launch_eager_us=two_e["median_us"], merge_launch_host_us=two_e["host_us"],
               merge_launch_graph_us=ab.time_us(two, smoke))
    # where the host's time goes (cProfile, us a call), and the API without Python's garbage collector
    row["api_profile"] = ab.host_profile(api_call, smoke, calls=200, top=15)
    gc.disable()
    try:
        nogc = eager_us(api_call, smoke)
    finally:
        gc.enable()
    row.update(api_eager_nogc_us=nogc["median_us"], api_host_nogc_us=nogc["host_us"])
    # the API again after two idle seconds: the rows before this one (CPU references, the torch
    # steps) leave the host issuing Python ~1.5-2x slower for a while (eager_host_path/process_state.py)
    if not smoke:
        time.sleep(2)
    settled = eager_us(api_call, smoke)
    row.update(api_eager_settled_us=settled["median_us"], api_host_settled_us=settled["host_us"])
    try:              # the API call itself captured (device mode: its host checks read no device value)
        row["api_graph_us"] = ab.time_us(api_call, smoke)
    except Exception as e:
        row["api_graph_error"] = repr(e)[:300]
    return row


def main(argv=None):
    a = ab.parse_args(__doc__, None, argv)
    smoke = a.smoke
    t0 = time.time()
    rows = []
    payload = dict(H=H, topk=K, logits_launch=LOGITS.as_dict(), logits_launch_run1=LOGITS_RUN1.as_dict(),
                   topk_launch=TOPK.as_dict())
    if not smoke:
        payload["ceilings"] = ceilings().as_dict()
        payload["launch_floor"] = bench.launch_floor_us()
    copy = payload.get("ceilings", {}).get("copy_tb_s")

    def save(complete=False):
        ab.write(a.out, QUESTION, smoke, **payload, rows=rows, seconds=round(time.time() - t0, 1), complete=complete)

    def floor(nbytes):
        return nbytes / (copy * 1e12) * 1e6 if copy else None

    # 1. checks
    B, live = (3, 300) if smoke else (32, 8192)
    rows += run_checks(smoke, B, 700 if smoke else 262208, live)
    save()
    # eager before the torch sections below have allocated gigabytes (the same call is timed again after)
    inp = make_indexer_inputs(B, H, 700 if smoke else 262208, seq_lens=live, seed=13)
    rows.append(ab.attempt(dict(kind="eager_first", impl="triton", B=B, live=live, max_seq_len=inp.max_seq_len),
                           lambda: run_eager(smoke, inp)))
    del inp
    save()

    # 2./3. the step against the max context (the torch paths at two sizes), eager against graph
    max_lens = [300, 700, 1400] if smoke else [65536, 262208, 1048576]
    impls = [i for i in registry.impls("indexer_topk") if i != "reference" and available(i)]
    for L in max_lens:
        inp = make_indexer_inputs(B, H, L, seq_lens=live, seed=13)
        for impl in impls:
            if impl != "triton" and L not in max_lens[:2]:
                continue
            step = registered(impl)

            def one(impl=impl, step=step, inp=inp, L=L):
                us = ab.time_us(lambda: step(inp), smoke, **({} if impl == "triton" else dict(warmup=5, rep=20)))
                return dict(graph_us=us, floor_us=floor(step_bytes(inp)), max_ctx_MB=B * L * 4 / 1e6)
            rows.append(ab.attempt(dict(kind="step_vs_max", impl=impl, B=B, live=live, max_seq_len=L), one))
        if L in max_lens[1:]:
            rows.append(ab.attempt(dict(kind="eager", impl="triton", B=B, live=live, max_seq_len=L),
                                   lambda inp=inp: run_eager(smoke, inp)))
        del inp
        if not smoke:
            torch.cuda.empty_cache()
        save()

    # the Triton step against the live length (max context 1M), with logits and top-k alone
    Lmax = max_lens[-1]
    for n in ([64, 200, 300] if smoke else [1024, 4096, 8192, 16384, 32768, 65536, 131072]):
        inp = make_indexer_inputs(B, H, Lmax, seq_lens=n, seed=14)

        def one(inp=inp):
            x = triton_indexer.logits_triton(*inp.args(), Lmax, fill_dead=False)
            r = dict(graph_us=ab.time_us(lambda: registered("triton")(inp), smoke),
                     logits_us=ab.time_us(lambda: triton_indexer.logits_triton(*inp.args(), Lmax, fill_dead=False), smoke),
                     topk_us=ab.time_us(lambda: topk_triton(x, inp.seq_lens, K), smoke),
                     step_bytes=step_bytes(inp), logits_bytes=logits_bytes(inp), floor_us=floor(step_bytes(inp)),
                     logits_floor_us=floor(logits_bytes(inp)))
            if r["logits_us"] and copy:
                r["logits_share_of_copy"] = logits_bytes(inp) / (r["logits_us"] * 1e-6) / (copy * 1e12)
            return r
        rows.append(ab.attempt(dict(kind="step_vs_live", impl="triton", B=B, live=n, max_seq_len=Lmax), one))
        del inp
        save()

    # 4. top-k alone per split; 5. logits alone per launch
    rows += run_topk(smoke, B, live)
    save()
    rows += run_logits(smoke, B, floor, copy)
    save()

    # 6. the targets, from the rows above (same run), then safety, last
    rows += targets(rows, smoke, copy, max_lens)
    save()
    rows.append(ab.attempt(dict(kind="safety", case="live page ids outside the cache, in a captured graph"),
                           lambda: safety(smoke)))
    save(complete=True)


def eager_us(fn, smoke) -> dict:
    """Eager calls back to back, as a host loop issues them (bench.back_to_back_us): the median
    GPU time per call over batches of 50 calls, which includes any wait for the host to enqueue
    the launches, and the host's wall time per call."""
    if smoke:
        fn()
        return dict(median_us=None, host_us=None)
    r = bench.back_to_back_us(fn)
    return dict(median_us=r["per_call_us"], host_us=r["host_us"])


def _get(rows, kind, key, **match):
    r = next((r for r in rows if r["kind"] == kind and all(r.get(k) == v for k, v in match.items())), None)
    return None if r is None else r.get(key)


def targets(rows, smoke, copy, max_lens) -> list:
    """The issue's table from this run's rows: value, target, verdict (None where a time is missing)."""
    out = []

    def add(name, value, target, higher=False, **extra):
        ok = None if value is None else (value >= target if higher else value <= target)
        out.append(dict(kind="target", metric=name, value=value, target=target,
                        cmp=">=" if higher else "<=", meets=ok, **extra))
    t = lambda L: _get(rows, "step_vs_max", "graph_us", impl="triton", max_seq_len=L)  # noqa: E731
    lo, mid, hi = max_lens
    add(f"step {hi} / {lo} max context (B=32, live 8192)", t(hi) / t(lo) if t(hi) and t(lo) else None, 1.10)
    add(f"step at max {mid} (us)", t(mid), 60.0)
    fp32 = _get(rows, "step_vs_max", "graph_us", impl="torch_fp32", max_seq_len=mid)
    add(f"step at max {mid}, speedup over torch_fp32 (same run)", fp32 / t(mid) if fp32 and t(mid) else None, 200.0,
        higher=True, torch_fp32_us=fp32)
    n = 200 if smoke else 65536
    add(f"logits alone at live {n}: share of copy bandwidth on the live bytes",
        _get(rows, "logits", f"share_of_copy_live{n}", launch="shipped"), 0.60, higher=True,
        logits_us=_get(rows, "logits", f"us_live{n}", launch="shipped"), copy_tb_s=copy)
    live = 300 if smoke else 8192
    for L in max_lens[1:]:
        shipped = _get(rows, "topk", f"us_live{live}_max{L}", split=None, num_warps=TOPK.num_warps, merge=TOPK.merge)
        add(f"top-k alone at live {live}, max {L} (us)", shipped, 15.0, note="the shipped split")
        e = _get(rows, "eager", "api_eager_us", max_seq_len=L)
        e2 = _get(rows, "eager", "api_eager_settled_us", max_seq_len=L)
        g = _get(rows, "eager", "api_graph_us", max_seq_len=L) or _get(rows, "eager", "fn_graph_us", max_seq_len=L)
        add(f"eager dsv4lab.indexer_topk(impl='triton'), default checks - graph, max {L} (us)",
            e - g if e and g else None, 25.0, eager_us=e, graph_us=g, note="right after the rows before it")
        add(f"eager, the same after two idle seconds - graph, max {L} (us)",
            e2 - g if e2 and g else None, 25.0, eager_us=e2, graph_us=g)
    return out


def safety(smoke):
    """Live page-table entries outside [0, num_pages) in a captured step: the request is cut at its
    first such page (positions from there on score -inf, never chosen; the error word's PAGE flag),
    every other row as before."""
    B, L, live = (2, 700, 300) if smoke else (8, 262208, 8192)
    inp = make_indexer_inputs(B, H, L, seq_lens=live, seed=16)
    step = registered("triton")
    clean = step(inp).clone()
    ref_logits = dsv4lab.indexer_logits(*inp.args(), max_seq_len=L, impl="triton").clone()
    if smoke:
        run = lambda: step(inp)  # noqa: E731
    else:
        g, res = bench.capture(lambda: step(inp))

        def run():
            g.replay()
            torch.cuda.synchronize()
            return res
    inp.page_table[0, 1] = inp.cache.num_pages
    inp.page_table[1, 0] = -5
    errors.read()
    got = run().clone()
    flags = errors.read()
    cut = torch.zeros(B, L, dtype=torch.bool, device=ref_logits.device)
    cut[0, 64:] = cut[1, :] = True
    want = reference.topk_positions(ref_logits.masked_fill(cut, -math.inf), K)
    return dict(ok=bool(torch.equal(got.cpu(), want.cpu())) and bool(torch.equal(got[2:], clean[2:]))
                and flags == errors.Flag.PAGE, flags=int(flags))


if __name__ == "__main__":
    main()
