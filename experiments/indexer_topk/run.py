"""The indexer step over the live context on the GPU: checks, the issue's targets, the step against
the max context (every impl) and the live length (Triton), and the two kernels' launch variants.

    python experiments/indexer_topk/run.py OUT.json [--cpu-smoke]

Everything in one process, every ratio from times taken in this run. Sections, each written to
OUT.json as soon as it is done (``complete`` False until the end):

1. checks (``kind="check"``): the Triton step (logits of live pages, then the radix top-k) at
   B = 32, H = 64, max context 262208 against ``reference.topk_positions`` on its own logits
   (exact) and against the float64 reference's selection (recall, ties counted); one captured
   graph replayed on the next step's data (new seq_lens incl. 0 and short rows, shuffled page
   table, new q and weights) against the reference on that data and bitwise against an eager call;
   every launch variant below checked before it is timed.
2. targets (``kind="target"``): the issue's table, each row with its value, target and verdict.
3. step against the max context (``kind="step_vs_max"``): logits + top-k, B = 32, 8192 live, for
   every impl (the torch paths at fewer max contexts: they take milliseconds).
4. step against the live length (``kind="step_vs_live"``): Triton, max context 1,048,576; step,
   logits and top-k alone, with the byte floor.
5. batch (``kind="batch"``): the Triton step at B = 1 .. 128, 8192 live, max 262208.
6. variants (``kind="logits_variant"``, ``"topk_variant"``): launch options of both kernels,
   and the pick by the rule in the README (``kind="pick"``).
7. safety (``kind="safety"``, last: a fault would end the process): a captured step whose live
   page-table entries hold ids outside the cache; those pages must score -inf, nothing else change.

Graph replay, do_bench median with L2 flushed, microseconds. ~2-3 minutes on an H200.
"""
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import math
import time

import torch

from dsv4lab import ab, api, bench, reference
from dsv4lab.cache import INDEX_TOKEN_BYTES
from dsv4lab.device import ceilings, mode
from dsv4lab.kernels import indexer
from dsv4lab.kernels.indexer import LOGITS, LogitsLaunch
from dsv4lab.kernels.topk import TOPK, TopkLaunch, topk_triton
from dsv4lab.testing import INDEXER_TOL, make_indexer_inputs, poisoned, rel_err, topk_recall

QUESTION = "indexer_topk"
K = 512
H = 64
#: launch variants timed against the shipped ones (LOGITS, TOPK come first)
LOGITS_VARIANTS = [
    LOGITS, LogitsLaunch(dot="fp16"),
    LogitsLaunch(programs_per_sm=4), LogitsLaunch(programs_per_sm=4, dot="fp16"),
    LogitsLaunch(programs_per_sm=16), LogitsLaunch(programs_per_sm=16, dot="fp16"),
    LogitsLaunch(prefetch=2), LogitsLaunch(prefetch=2, dot="fp16"),
    LogitsLaunch(prefetch=2, programs_per_sm=3, dot="fp16"), LogitsLaunch(prefetch=2, programs_per_sm=6, dot="fp16"),
    LogitsLaunch(prefetch=0), LogitsLaunch(prefetch=0, dot="fp16"),
    LogitsLaunch(prefetch=0, dot="fp16", maxnreg=64), LogitsLaunch(prefetch=0, dot="fp16", maxnreg=64, programs_per_sm=16),
    LogitsLaunch(num_warps=8, dot="fp16"), LogitsLaunch(num_warps=8, prefetch=2, dot="fp16"),
]
TOPK_VARIANTS = [TOPK, TopkLaunch(num_warps=16), TopkLaunch(radix=6), TopkLaunch(anchor=0), TopkLaunch(anchor=11),
                 TopkLaunch(tile=4096), TopkLaunch(tile=4096, num_warps=4)]
#: the shapes the variants are timed at: (B, live tokens a request, max context)
VARIANT_SHAPES = [(32, 8192, 262208), (32, 65536, 65536), (1, 8192, 262208)]


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
    """Whether what the impl needs beyond the lab is here (SGLang's wheel for impl "sglang")."""
    if "sglang" in api.impl_info("indexer_topk", impl).needs:
        from dsv4lab.kernels import indexer_gemm
        try:
            indexer_gemm.sglang_indexer_file()
        except ImportError:
            return False
    return True


def registered(impl):
    """The impl's top-k as a captured graph runs it: the registered function, no API checks."""
    fn = api.impl_info("indexer_topk", impl).fn
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
    return rows


def variant_inputs(smoke):
    shapes = [(2, 300, 700), (2, 40, 200)] if smoke else VARIANT_SHAPES
    return {s: make_indexer_inputs(s[0], H, s[2], seq_lens=s[1], seed=40 + i) for i, s in enumerate(shapes)}


def run_variants(smoke, inputs) -> list:
    """Each launch variant checked (poisoned, against the float64 reference) then timed per shape."""
    rows = []
    chk = make_indexer_inputs(4, H, 700 if smoke else 4096, seed=41)
    ref = reference.indexer_logits(*chk.args(), chk.max_seq_len)
    variants = LOGITS_VARIANTS[:3] if smoke else LOGITS_VARIANTS
    for v in variants:
        def one(v=v):
            with poisoned():
                out = indexer.logits_triton(*chk.args(), chk.max_seq_len, launch=v)
            row = dict(logits_err=rel_err(out, ref))
            row["ok"] = row["logits_err"] <= INDEXER_TOL
            for (B, live, L), inp in inputs.items():
                row[f"us_B{B}_live{live}"] = ab.time_us(
                    lambda: indexer.logits_triton(*inp.args(), L, launch=v, fill_dead=False), smoke)
            return row
        rows.append(ab.attempt(dict(kind="logits_variant", shipped=v == LOGITS, **v.as_dict()), one))
    chk_logits = indexer.logits_triton(*chk.args(), chk.max_seq_len)
    want = reference.topk_positions(chk_logits, K)
    variants = TOPK_VARIANTS[:2] if smoke else TOPK_VARIANTS
    logits = {s: indexer.logits_triton(*inp.args(), s[2], fill_dead=False) for s, inp in inputs.items()}
    for v in variants:
        def one(v=v):
            with poisoned():
                got = topk_triton(chk_logits, chk.seq_lens, K, launch=v)
            row = dict(exact=bool(torch.equal(got, want)))
            row["ok"] = row["exact"]
            for (B, live, L), inp in inputs.items():
                x = logits[(B, live, L)]
                row[f"us_B{B}_live{live}"] = ab.time_us(lambda: topk_triton(x, inp.seq_lens, K, launch=v), smoke)
            return row
        rows.append(ab.attempt(dict(kind="topk_variant", shipped=v == TOPK, **v.as_dict()), one))
    return rows


def pick(rows, kind, cols, margin):
    """The rule (README): score = the sum over ``cols`` of time / the shipped launch's time; the
    lowest score replaces the shipped launch only if it beats 1 per column by ``margin``."""
    ok = [r for r in rows if r["kind"] == kind and r.get("ok") and all(r.get(c) for c in cols)]
    base = next((r for r in ok if r["shipped"]), None)
    if base is None:
        return dict(kind="pick", of=kind, launch=None, note="no timed, checked row of the shipped launch")
    for r in ok:
        r["score"] = sum(r[c] / base[c] for c in cols)
    best = min(ok, key=lambda r: r["score"])
    keep = best["score"] > len(cols) * (1 - margin)
    chosen = base if keep else best
    fields = [k for k in chosen if k in LogitsLaunch.__dataclass_fields__ or k in TopkLaunch.__dataclass_fields__]
    return dict(kind="pick", of=kind, rule=f"lowest sum of time / shipped over {cols}; replace if < {len(cols)} x "
                                           f"(1 - {margin})", best_score=best["score"], keep_shipped=keep,
                launch={k: chosen[k] for k in fields})


def main(argv=None):
    a = ab.parse_args(__doc__, None, argv)
    smoke = a.smoke
    t0 = time.time()
    rows = []
    payload = dict(H=H, topk=K, logits_launch=LOGITS.as_dict(), topk_launch=TOPK.as_dict())
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

    # 2./3. the step against the max context, every impl (torch paths at fewer sizes)
    max_lens = [300, 700] if smoke else [8192, 32768, 65536, 131072, 262208, 524288, 1048576]
    torch_lens = [300] if smoke else [8192, 65536, 262208]
    impls = [i for i in api.impls("indexer_topk") if i != "reference" and available(i)]
    times = {}
    for L in max_lens:
        inp = make_indexer_inputs(B, H, L, seq_lens=live, seed=13)
        for impl in impls:
            if impl != "triton" and L not in torch_lens:
                continue
            step = registered(impl)

            def one(impl=impl, step=step, inp=inp, L=L):
                us = ab.time_us(lambda: step(inp), smoke, **({} if impl == "triton" else dict(warmup=5, rep=20)))
                times[impl, L] = us
                return dict(graph_us=us, floor_us=floor(step_bytes(inp)),
                            max_ctx_MB=B * L * 4 / 1e6)
            rows.append(ab.attempt(dict(kind="step_vs_max", impl=impl, B=B, live=live, max_seq_len=L), one))
        if L in ((700,) if smoke else (262208, 1048576)):
            # eager: the registered function (no host sync) and the API (its checks sync)
            def eager(inp=inp):
                fast = eager_us(lambda: registered("triton")(inp), smoke)
                api_ = eager_us(lambda: dsv4lab.indexer_topk(*inp.args(), max_seq_len=inp.max_seq_len, topk=K,
                                                            impl="triton"), smoke)
                return dict(eager_us=fast["median_us"], host_us=fast["host_us"], api_eager_us=api_["median_us"],
                            api_host_us=api_["host_us"])
            rows.append(ab.attempt(dict(kind="eager", impl="triton", B=B, live=live, max_seq_len=L), eager))
        del inp
        if not smoke:
            torch.cuda.empty_cache()
        save()

    # 4. the Triton step against the live length (max context 1M), with logits and top-k alone
    lives = [64, 200, 300] if smoke else [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
    Lmax = 700 if smoke else 1048576
    for n in lives:
        inp = make_indexer_inputs(B, H, Lmax, seq_lens=n, seed=14)

        def one(inp=inp):
            x = indexer.logits_triton(*inp.args(), Lmax, fill_dead=False)
            r = dict(graph_us=ab.time_us(lambda: registered("triton")(inp), smoke),
                     logits_us=ab.time_us(lambda: indexer.logits_triton(*inp.args(), Lmax, fill_dead=False), smoke),
                     topk_us=ab.time_us(lambda: topk_triton(x, inp.seq_lens, K), smoke),
                     step_bytes=step_bytes(inp), logits_bytes=logits_bytes(inp), floor_us=floor(step_bytes(inp)),
                     logits_floor_us=floor(logits_bytes(inp)))
            if r["logits_us"] and copy:
                r["logits_share_of_copy"] = logits_bytes(inp) / (r["logits_us"] * 1e-6) / (copy * 1e12)
            return r
        rows.append(ab.attempt(dict(kind="step_vs_live", impl="triton", B=B, live=n, max_seq_len=Lmax), one))
        del inp
        save()

    # 5. batch
    for b in ([1, 2] if smoke else [1, 8, 32, 64, 128]):
        inp = make_indexer_inputs(b, H, 700 if smoke else 262208, seq_lens=live, seed=15)
        rows.append(ab.attempt(dict(kind="batch", impl="triton", B=b, live=live, max_seq_len=inp.max_seq_len),
                               lambda inp=inp: dict(graph_us=ab.time_us(lambda: registered("triton")(inp), smoke),
                                                    floor_us=floor(step_bytes(inp)))))
        del inp
    save()

    # 6. launch variants of both kernels, and the pick
    inputs = variant_inputs(smoke)
    rows += run_variants(smoke, inputs)
    (b0, l0, _), (b1, l1, _) = list(inputs)[:2]
    rows.append(pick(rows, "logits_variant", [f"us_B{b0}_live{l0}", f"us_B{b1}_live{l1}"], 0.02))
    rows.append(pick(rows, "topk_variant", [f"us_B{b0}_live{l0}"], 0.03))
    del inputs
    save()

    # 2. the targets, from the rows above (same run)
    rows += targets(rows, smoke, copy)
    save()

    # 7. safety, last
    rows.append(ab.attempt(dict(kind="safety", case="live page ids outside the cache, in a captured graph"),
                           lambda: safety(smoke)))
    save(complete=True)


def eager_us(fn, smoke, n=300) -> dict:
    """Eager calls back to back, as a host loop issues them: the median over ``n`` calls of the GPU
    time from an event recorded before the call to one after it (it includes the wait for the
    host to enqueue the launches, unlike do_bench, whose L2 flush before each call hides the host),
    and the host's wall time per call (``n`` calls, one sync at the end)."""
    if smoke:
        fn()
        return dict(median_us=None, host_us=None)
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    t = time.perf_counter()
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    host = (time.perf_counter() - t) / n * 1e6
    return dict(median_us=float(torch.tensor([a.elapsed_time(b) for a, b in ev]).median()) * 1e3, host_us=host)


def _get(rows, kind, key, **match):
    r = next((r for r in rows if r["kind"] == kind and all(r.get(k) == v for k, v in match.items())), None)
    return None if r is None else r.get(key)


def targets(rows, smoke, copy) -> list:
    """The issue's table from this run's rows: value, target, verdict (None where a time is missing)."""
    out = []

    def add(name, value, target, higher=False, **extra):
        ok = None if value is None else (value >= target if higher else value <= target)
        out.append(dict(kind="target", metric=name, value=value, target=target,
                        cmp=">=" if higher else "<=", meets=ok, **extra))
    t = lambda L: _get(rows, "step_vs_max", "graph_us", impl="triton", max_seq_len=L)  # noqa: E731
    lo, hi, mid = (300, 700, 700) if smoke else (65536, 1048576, 262208)
    add("step 1M / 64K max context (B=32, live 8192)", t(hi) / t(lo) if t(hi) and t(lo) else None, 1.10)
    add("step at max 262208 (us)", t(mid), 60.0)
    fp32 = _get(rows, "step_vs_max", "graph_us", impl="torch_fp32", max_seq_len=mid)
    add("step at max 262208, speedup over torch_fp32 (same run)", fp32 / t(mid) if fp32 and t(mid) else None, 200.0,
        higher=True, torch_fp32_us=fp32)
    n = 200 if smoke else 65536
    share = _get(rows, "step_vs_live", "logits_share_of_copy", live=n)
    add(f"logits alone at live {n}: share of copy bandwidth on the live bytes", share, 0.60, higher=True,
        logits_us=_get(rows, "step_vs_live", "logits_us", live=n), copy_tb_s=copy)
    b, n = (2, 300) if smoke else (32, 8192)
    add(f"top-k alone at live {n}, max 262208 (us)", _get(rows, "topk_variant", f"us_B{b}_live{n}", shipped=True), 15.0,
        note="the variant sweep's row of the shipped launch")
    add(f"top-k alone at live {n}, max 1048576 (us)", _get(rows, "step_vs_live", "topk_us", live=64 if smoke else n),
        15.0, note="the live sweep's row")
    for L in ((700,) if smoke else (262208, 1048576)):
        e = _get(rows, "eager", "eager_us", max_seq_len=L)
        g = t(L)
        add(f"eager (registered fn, no host sync) - graph, max {L} (us)", e - g if e and g else None, 25.0,
            eager_us=e, graph_us=g, api_eager_us=_get(rows, "eager", "api_eager_us", max_seq_len=L))
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
    got = run().clone()
    bad = torch.zeros(B, L, dtype=torch.bool, device=ref_logits.device)
    bad[0, 64:] = bad[1, :] = True
    want = reference.topk_positions(ref_logits.masked_fill(bad, -math.inf), K)
    return dict(ok=bool(torch.equal(got.cpu(), want.cpu())) and bool(torch.equal(got[2:], clean[2:])))


if __name__ == "__main__":
    main()
