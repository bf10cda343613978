"""The recorded GPU run: one command that checks, times and sweeps every stage
and writes JSON (device, versions and date inside) for data/runs/.

    python -m dsv4lab record --out data/runs/h200 [--only checks decode tiles split indexer]

Each part is written as soon as it is done, so a run cut short keeps what it had.
"""
from __future__ import annotations

import os
import time
import traceback
from dataclasses import replace

import torch
import triton

from . import api, bench, reference
from .cache import scale_view
from .device import ceilings, mode
from .kernels import head_batched, split_k
from .testing import (INDEXER_TOL, LSE_TOL, OUT_TOL, VS_SIMT_TOL, check_decode, check_indexer, indexer_tol,
                      make_decode_inputs, make_indexer_inputs, poisoned, rel_err)

DECODE_IMPLS = ["simt", "sglang", "mma", "splitk", "auto"]
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]

# (B, H, K, context, page_size, pad_frac, topk_len, sink): odd sizes on purpose
CHECK_CASES = [
    (4, 64, 512, 8192, 64, 0.0, False, False),
    (1, 64, 512, 8192, 64, 0.3, True, True),
    (3, 8, 100, 300, 256, 0.2, True, False),
    (2, 16, 77, 64, 64, 0.1, False, True),      # one page, K not a multiple of the tile
    (5, 32, 512, 700, 256, 0.0, True, True),
    (2, 64, 37, 50, 64, 0.0, False, False),     # K smaller than a tile, one partial page
    (136, 64, 512, 1024, 64, 0.1, True, True),  # more programs than SMs: mma takes its 64-head tiles
]


def _log(*a):
    print(*a, flush=True)


def run_checks(impls=DECODE_IMPLS) -> list[dict]:
    rows = []
    for case in CHECK_CASES:
        B, H, K, ctx, ps, pad, tl_, sink = case
        inp = make_decode_inputs(B, H, K, context=ctx, page_size=ps, pad_frac=pad, topk_len=tl_,
                                 sink=sink, seed=hash(case) % 2**31)
        for impl in impls:
            try:
                e_out, e_lse = check_decode(impl, inp)
                ok = e_out <= OUT_TOL and e_lse <= LSE_TOL
                row = dict(case=case, impl=impl, out_err=e_out, lse_err=e_lse, ok=ok)
                if impl in ("mma", "splitk", "auto"):
                    row["vs_simt_err"] = check_decode(impl, inp, against="simt")[0]
                    row["ok"] = ok and row["vs_simt_err"] <= VS_SIMT_TOL
            except Exception as e:  # record, don't stop the run
                row = dict(case=case, impl=impl, ok=False, error=repr(e)[:300])
            rows.append(row)
            _log("check", row)
    # a scale byte past the "bits" dequant's limit (common.MAX_SCALE_BYTE) where the eager range
    # check does not run: the rows that read it must come out NaN, never a wrong finite number
    # (with "cvt" the launch has no limit: then the row must match the reference)
    inp = make_decode_inputs(136, 64, 512, context=1024, seed=9)       # 64-head tiles (choose_tiles)
    tok = int(inp.indices[0, 0])
    ps = inp.cache.page_size
    scale_view(inp.cache)[tok // ps, tok % ps, 3] = 140
    bits = head_batched.max_scale_byte(head_batched.choose_tiles(136, 64, 512)) is not None
    with poisoned():
        out, _ = api.sparse_decode(inp.q, inp.cache, inp.indices, impl="mma", check_ranges=False)
    rest_ok = bool(torch.isfinite(out[1:].float()).all())
    if bits:
        ok = bool(torch.isnan(out[0].float()).all()) and rest_ok
    else:
        ro, _ = reference.sparse_decode(inp.q[:1], inp.cache, inp.indices[:1])
        ok = rel_err(out[:1].float(), ro) <= OUT_TOL and rest_ok
    rows.append(dict(case="scale_byte_past_limit", impl="mma", dequant="bits" if bits else "cvt", ok=ok))
    _log("scale byte 140", rows[-1])
    del inp
    # CUDA-graph replay must give bitwise the eager result
    inp = make_decode_inputs(8, 64, 512, context=2048, topk_len=True, sink=True, seed=7)
    for impl in ["mma", "splitk", "auto"]:
        fn = lambda: api.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs())  # noqa: E731
        eager = fn()
        g, res = bench.capture(fn)
        g.replay()
        torch.cuda.synchronize()
        same = torch.equal(res[0], eager[0]) and torch.equal(res[1], eager[1])
        rows.append(dict(case="graph_replay_bitwise", impl=impl, ok=bool(same)))
        _log("graph", impl, same)
    # the merges inside the split launch (split_k.MERGES; not the default): against the reference
    # (a row whose last slices hold no token, a sink), graph replay bitwise, arrival counts back at 0
    inp = make_decode_inputs(2, 64, 512, context=2048, topk_len=True, sink=True, pad_frac=0.1, seed=8)
    inp.topk_len[1] = 100
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, **inp.kwargs())
    plan = split_k.choose_split(2, 64, 512)
    for merge in ("fused", "coop"):
        fn = lambda: split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5,  # noqa: E731
                                                 nsplit=plan.nsplit, cfg=plan.cfg, merge=merge, **inp.kwargs())
        try:
            with poisoned():
                out, lse = fn()
            row = dict(case=f"merge_{merge}", impl="splitk", nsplit=plan.nsplit, out_err=rel_err(out.float(), ro),
                       lse_err=rel_err(lse, rl))
            eager = fn()
            g, res = bench.capture(fn)
            g.replay()
            g.replay()
            torch.cuda.synchronize()
            row["graph_bitwise"] = bool(torch.equal(res[0], eager[0]) and torch.equal(res[1], eager[1]))
            cnt = split_k.workspace(2, 64, plan.nsplit, inp.q.device, split_k.partials_dtype())[2]
            row["counts_zero"] = not bool(cnt[0::2].any())
            row["ok"] = (row["out_err"] <= OUT_TOL and row["lse_err"] <= LSE_TOL and row["graph_bitwise"]
                         and row["counts_zero"])
        except Exception as e:  # record, don't stop the run
            row = dict(case=f"merge_{merge}", impl="splitk", ok=False, error=repr(e)[:300])
        rows.append(row)
        _log("merge", row)
    return rows


def run_decode(impls=DECODE_IMPLS, batches=BATCHES, H=64, K=512, context=8192, page_size=64,
               layers=bench.LAYERS) -> list[dict]:
    """Every stage at each B, speedups against SGLang's kernel measured in the same run: in a
    one-call graph (graph_us) and per call in a graph of ``layers`` calls (graph_layer_us)."""
    def log(row):
        _log("decode", {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                        if k in ("impl", "B", "eager_us", "graph_us", "graph_layer_us", "tflops",
                                 "speedup_vs_baseline", "speedup_vs_baseline_layer", "error")})
    return bench.decode_table(impls, batches, H=H, K=K, context=context, page_size=page_size,
                              baseline="sglang", log=log, layers=layers)


#: (BLOCK_H, BLOCK_N, warps, stages, prefetch, lazy rescale[, dequant, fold the scale]; without
#: the last two: "cvt", no fold; rows record what ran, head_batched.ran_with,
#: which the env overrides DSV4LAB_DEQUANT / DSV4LAB_FOLD_SCALE can change). Configs the offline compiler
#: report (dsv4lab.compile_report, sm_90a) shows with no or few spills; the rest spill
#: kilobytes per thread and were not timed. prefetch 0/1/2/3/4 = the kernel's loops
#: (Triton's pipeliner / L2 hint / register pipeline / bulk L2 hint / indices ahead, head_batched.py); 64x64 s2 p0 is the
#: first stage-2 kernel, kept as the reference point, with and without the lazy rescale; loop 5
#: (indices ahead + the next tile's L2 hint after QK) with either dequant closes the list.
TILE_CANDIDATES = [(64, 64, 8, 2, 0, False), (64, 64, 8, 2, 0, True), (64, 64, 8, 1, 1, False),
                   (64, 32, 8, 1, 0, False), (64, 32, 8, 3, 0, False), (64, 32, 8, 1, 1, False),
                   (64, 32, 8, 1, 2, False), (64, 16, 8, 1, 2, False), (64, 128, 8, 1, 1, False),
                   (64, 128, 8, 1, 0, False), (64, 128, 8, 1, 3, False), (64, 128, 8, 1, 4, False), (16, 64, 8, 1, 3, False),
                   (16, 16, 4, 1, 0, False), (16, 32, 8, 2, 0, False), (16, 32, 4, 1, 2, False),
                   (16, 64, 8, 1, 0, False), (16, 64, 8, 1, 1, False), (16, 64, 8, 1, 2, False),
                   (64, 128, 8, 1, 5, False, "cvt", False), (64, 128, 8, 1, 5, False, "bits", True)]
CHOSEN: dict = {}


def time_tiles(candidates, batches=(1, 8, 32, 128), H=64, K=512, context=8192) -> list[dict]:
    """Each (BLOCK_H, BLOCK_N, warps, stages, prefetch, lazy) config of the head-batched
    kernel: checked against the float64 reference (poisoned outputs, topk_len, sink),
    then timed with graph replay at each B. One row per config; errors are rows."""
    rows = []
    inputs = {B: make_decode_inputs(B, H, K, context=context, seed=100 + B) for B in batches}
    chk = make_decode_inputs(4, H, K, context=1024, topk_len=True, sink=True, pad_frac=0.1, seed=5)
    ro, rl = reference.sparse_decode(chk.q, chk.cache, chk.indices, sm_scale=512**-0.5, **chk.kwargs())
    for bh, bn, nw, ns, pf, lazy, *rest in candidates:
        dq, fold = rest or ("cvt", False)
        cfg = head_batched.TileConfig(bh, bn, nw, ns, "sweep", lazy, pf, dequant=dq, fold_scale=fold)
        row = dict(block_h=bh, block_n=bn, num_warps=nw, num_stages=ns, prefetch=pf, lazy_rescale=lazy,
                   **head_batched.ran_with(cfg))
        try:
            with poisoned():
                out, lse = head_batched.sparse_decode_mma(chk.q, chk.cache, chk.indices, sm_scale=512**-0.5,
                                                          cfg=cfg, **chk.kwargs())
            row["out_err"] = rel_err(out.float(), ro)
            row["lse_err"] = rel_err(lse, rl)
            row["tiles"] = triton.cdiv(K, bn)
            for B, inp in inputs.items():
                fn = lambda: head_batched.sparse_decode_mma(inp.q, inp.cache, inp.indices, sm_scale=512**-0.5,  # noqa: E731
                                                            topk_len=None, attn_sink=None, cfg=cfg)
                row[f"us_B{B}"] = bench.time_ms(fn, graph=True, warmup=10, rep=40) * 1e3
        except Exception as e:
            row["error"] = repr(e)[:200]
        rows.append(row)
        _log("tile", row)
    return rows


def run_tiles(batches=(1, 8, 32, 128), H=64, K=512, context=8192) -> list[dict]:
    """The tile sweep over TILE_CANDIDATES; the fastest at the largest B becomes this
    device's "mma" entry for the rest of the run."""
    rows = time_tiles(TILE_CANDIDATES, batches, H, K, context)
    ok = [r for r in rows if "error" not in r and r["out_err"] <= OUT_TOL and r["lse_err"] <= LSE_TOL]
    best = min(ok, key=lambda r: r[f"us_B{max(batches)}"])
    cap = bench.info().capability or "interpret"
    head_batched.TILE_TABLE[(cap, "mma")] = _cfg(best, "this run's sweep")
    CHOSEN["mma"] = best
    _log("chosen mma", best)
    return rows


def run_split(batches=BATCHES, splits=(1, 2, 4, 8, 16), H=64, K=512, context=8192) -> list[dict]:
    """NSPLIT x B for the table's 64-head entry and the two 16-head configs fastest at B=1
    in the tile sweep. The B=1 rows give each config's launch-time figures (fit_costs);
    the faster 16-head config becomes the "split" entry; each row says whether auto's
    model, with the fitted figures, picks it. Also swept, not (yet) in the model: the
    64-head config with the longest tiles fastest at B=1 (few tiles per slice)."""
    cap = bench.info().capability or "interpret"
    tiles = [r for r in CHOSEN.get("tile_rows") or [] if "error" not in r and r["out_err"] <= OUT_TOL]
    small = sorted((r for r in tiles if r["block_h"] < H), key=lambda r: r["us_B1"])[:2]
    cands = [head_batched.tile_config(H)] + [_cfg(r, "sweep") for r in small]
    # not the mma entry's tiles again: with another dequant/fold only, its split cells (which all
    # take cvt, no fold) would be the same launches measured twice
    long_ = sorted((r for r in tiles if r["block_h"] == H and r["block_n"] >= 128
                    and not _same_tiles(r, cands[0])), key=lambda r: r["us_B1"])[:1]
    if len(cands) == 1:                           # run alone: the table's two entries
        cands.append(head_batched.tile_config(H, split=True))
    rows = []
    for B in batches:
        inp = make_decode_inputs(B, H, K, context=context, seed=200 + B)
        for cfg in cands + [_cfg(r, "sweep: long tiles") for r in long_]:
            for ns in splits:
                if ns > triton.cdiv(K, cfg.block_n):
                    continue
                fn = lambda: split_k.sparse_decode_split(inp.q, inp.cache, inp.indices, topk_len=None,  # noqa: E731
                                                         sm_scale=512**-0.5, attn_sink=None, nsplit=ns, cfg=cfg)
                row = {"B": B, "nsplit": ns, **{k: getattr(cfg, k) for k in _CFG_KEYS},
                       **head_batched.ran_with(cfg, ns)}
                try:
                    row["us"] = bench.time_ms(fn, graph=True, warmup=10, rep=50) * 1e3
                except Exception as e:
                    row["error"] = repr(e)[:200]
                rows.append(row)
                _log("split", row)
        del inp
        torch.cuda.empty_cache()
    fitted = [fit_costs(rows, c) for c in cands]
    _log("long tiles, fitted (not in the model)", [fit_costs(rows, _cfg(r, "sweep: long tiles")) for r in long_])
    head_batched.TILE_TABLE[(cap, "mma")] = fitted[0]
    head_batched.TILE_TABLE[(cap, "split")] = min(fitted[1:], key=lambda c: _b1_best(rows, c))
    for r in rows:                                 # what auto's model picks, with the fitted figures
        p = split_k.choose(r["B"], H, K)
        r["model_choice"] = r["nsplit"] == p.nsplit and _same(r, p.cfg)
    CHOSEN["split"] = {k: getattr(head_batched.TILE_TABLE[(cap, "split")], k) for k in _CFG_KEYS}
    _log("chosen split", CHOSEN["split"], "fitted", fitted)
    return rows


_CFG_KEYS = ("block_h", "block_n", "num_warps", "num_stages", "lazy_rescale", "prefetch", "dequant", "fold_scale")


def _same_tiles(row, cfg):
    """Whether a sweep row has ``cfg``'s tiles and loop (dequant and fold aside); keys a row lacks
    (recorded before they existed) are not compared, as runs.select does."""
    return all(row[k] == getattr(cfg, k) for k in _CFG_KEYS if k in row and k not in ("dequant", "fold_scale"))


def _same(row, cfg):
    """Whether a sweep row ran ``cfg``: its tiles, and the dequant/fold a launch of it takes."""
    ran = head_batched.ran_with(cfg, row.get("nsplit", 1))
    return _same_tiles(row, cfg) and all(row[k] == v for k, v in ran.items() if k in row)


def _b1_best(rows, cfg):
    return min(r["us"] for r in rows if r["B"] == 1 and "us" in r and _same(r, cfg))


def fit_costs(rows, cfg):
    """cfg with us_per_tile, fixed_us and merge_us fitted to its B=1 rows of the NSPLIT
    sweep: one program per slice, all in one wave, so time = fixed + tiles per slice x
    us_per_tile (+ the merge when NSPLIT > 1). The slope comes from the split rows (same
    merge cost), fixed from the single launch, the merge from the split rows' intercept."""
    pts = [(triton.cdiv(triton.cdiv(512, cfg.block_n), r["nsplit"]), r["us"], r["nsplit"])
           for r in rows if r["B"] == 1 and "us" in r and _same(r, cfg)]
    split = [(x, y) for x, y, n in pts if n > 1]
    one = [(x, y) for x, y, n in pts if n == 1]
    if len(split) < 2 or not one:
        return cfg
    mx = sum(x for x, _ in split) / len(split)
    my = sum(y for _, y in split) / len(split)
    slope = sum((x - mx) * (y - my) for x, y in split) / sum((x - mx) ** 2 for x, _ in split)
    x1, y1 = one[0]
    fixed = y1 - x1 * slope
    return replace(cfg, us_per_tile=round(slope, 3), fixed_us=round(fixed, 2),
                   merge_us=round(max(0.0, my - mx * slope - fixed), 2),
                   source=cfg.source + "; costs fitted to this run's NSPLIT sweep")


def _cfg(row, source):
    """TileConfig from a tile-sweep row (costs: the B=1 time spread over the tiles, until
    fit_costs replaces them)."""
    per = row["us_B1"] / row["tiles"] if row.get("us_B1") else None
    return head_batched.TileConfig(*(row[k] for k in _CFG_KEYS[:4]), source, row["lazy_rescale"],
                                   row.get("prefetch", 0), us_per_tile=per, dequant=row.get("dequant", "cvt"),
                                   fold_scale=row.get("fold_scale", False))


INDEXER_IMPLS = ["torch_fp32", "torch_bf16", "sglang", "triton"]
#: the story's setting: 32 requests with 8192 live tokens each, a max context of 262208
INDEXER_MAX_LENS = [8192, 32768, 131072, 262208]
INDEXER_BATCHES = [1, 8, 32, 64]


def _try(fn):
    try:
        return fn()
    except Exception as e:
        return repr(e)[:200]


def run_indexer(impls=INDEXER_IMPLS, H=64, live=8192, B=32, max_lens=INDEXER_MAX_LENS,
                batches=INDEXER_BATCHES, topk=512) -> list[dict]:
    """Stages 4-5. Checks: every impl against the float64 reference (logits, top-512 recall) on
    random lengths, and one captured graph of the Triton indexer replayed on the next step's data.
    The Triton page loop (plain or register pipeline) faster here becomes the default. Timings
    (graph replay and eager, without the API's checks): ``live`` tokens per request at each max context,
    and at the largest one over B; plus the top-k after the Triton logits."""
    from .kernels import indexer_gemm
    rows = []
    chk = make_indexer_inputs(6, H, 4096, seed=11)
    for impl in impls:
        try:
            err, recall = check_indexer(impl, chk, topk)
            tol = indexer_tol(impl)
            rows.append(dict(kind="check", impl=impl, logits_err=err, topk_recall=recall, tol=tol, ok=err <= tol))
        except Exception as e:
            rows.append(dict(kind="check", impl=impl, ok=False, error=repr(e)[:300]))
        _log("indexer", rows[-1])
    rows.append(dict(kind="env", sglang_indexer_file=_try(indexer_gemm.sglang_indexer_file)))
    # one captured graph for every decode step: replay it with new lengths, page tables and queries
    # written into the same buffers, against the reference on the new data (and bitwise vs eager)
    big = make_indexer_inputs(8, H, max(max_lens), seq_lens=live, seed=12)
    fn = lambda: api.indexer_logits(*big.args(), max_seq_len=big.max_seq_len, impl="triton")  # noqa: E731
    g, res = bench.capture(fn)
    step = make_indexer_inputs(8, H, max(max_lens), seq_lens=live, seed=14)
    gen = torch.Generator().manual_seed(15)
    big.seq_lens.copy_(torch.randint(0, live + 1, (8,), generator=gen).int())
    big.seq_lens[0] = 0
    big.page_table.copy_(big.page_table[torch.randperm(8, generator=gen).to(big.page_table.device)])
    big.q.copy_(step.q)
    big.weights.copy_(step.weights)
    g.replay()
    torch.cuda.synchronize()
    ref = reference.indexer_logits(*big.args(), big.max_seq_len)
    err = rel_err(res, ref)
    same = torch.equal(res, fn())
    rows.append(dict(kind="check", impl="triton", case="graph replay on the next step's data (new seq_lens, "
                     "page table, q, w)", logits_err=err, tol=INDEXER_TOL, ok=err <= INDEXER_TOL and same,
                     bitwise_vs_eager=same))
    _log("indexer", rows[-1])
    del g, res, big, step, ref
    # the page loop: plain or the register pipeline, whichever is faster here becomes the default
    from .kernels import indexer
    pick = make_indexer_inputs(B, H, max(max_lens), seq_lens=live, seed=13)
    loops = {}
    for pf in (False, True):
        loops[pf] = bench.time_ms(lambda: indexer.logits_triton(*pick.args(), pick.max_seq_len, prefetch=pf),
                                  graph=True) * 1e3
        rows.append(dict(kind="loop", prefetch=pf, B=B, max_seq_len=pick.max_seq_len, graph_us=loops[pf]))
        _log("indexer", rows[-1])
    indexer.PREFETCH = min(loops, key=loops.get)
    rows.append(dict(kind="loop chosen", prefetch=indexer.PREFETCH))
    del pick
    shapes = [(B, L) for L in max_lens] + [(b, max(max_lens)) for b in batches if b != B]
    for b, L in shapes:
        inp = make_indexer_inputs(b, H, L, seq_lens=live, seed=13)
        for impl in [i for i in impls if b == B or i in ("torch_bf16", "triton")]:
            try:
                row = dict(kind="time", **bench.indexer_row(impl, inp))
            except Exception as e:
                row = dict(kind="time", impl=impl, B=b, max_seq_len=L, error=repr(e)[:300])
            rows.append(row)
            _log("indexer", {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()})
        rows.append(dict(kind="time", **bench.indexer_topk_row(inp, topk)))
        _log("indexer", rows[-1])
        del inp
        torch.cuda.empty_cache()
    return rows


PARTS = {"tiles": run_tiles, "split": run_split, "decode": run_decode, "checks": run_checks, "indexer": run_indexer}


def main(out_dir: str, only=None):
    if mode() != "cuda":
        raise SystemExit("record needs a CUDA GPU")
    os.makedirs(out_dir, exist_ok=True)
    env = bench.environment()
    t0 = time.time()
    env["ceilings"] = ceilings().as_dict()
    env["launch_floor"] = bench.launch_floor_us()
    _log("ceilings", env["ceilings"], "launch floor", env["launch_floor"], f"{time.time() - t0:.1f}s")
    bench.save(os.path.join(out_dir, "device.json"), env)
    for name in only or PARTS:
        t = time.time()
        try:
            rows = PARTS[name]()
        except Exception:
            traceback.print_exc()
            continue
        if name == "tiles":
            CHOSEN["tile_rows"] = rows
        tables = {f"{k[0]}/{k[1]}": vars(v) for k, v in head_batched.TILE_TABLE.items()}
        bench.save(os.path.join(out_dir, f"{name}.json"), {**env, "part": name, "rows": rows,
                                                           "tile_table": tables,
                                                           "seconds": time.time() - t})
        _log(f"== {name} done in {time.time() - t:.0f}s")
