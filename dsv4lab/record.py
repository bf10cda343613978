"""The recorded GPU run: one command that checks, times and sweeps every stage and writes JSON
(device, versions and date inside) for data/runs/<device>/, plus a manifest of what it wrote.

    python -m dsv4lab record --out data/runs/h200 [--only checks decode tiles split indexer]

Each part is written as soon as it is done, so a run cut short keeps what it had. The checks live
in checks.py, the sweeps and cost fits in sweeps.py, the timings in bench.py: this file only runs
them in order and writes what they return.
"""
from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

import torch

from . import api, bench, checks, reference, sweeps
from .config import PAGE_SIZE
from .device import VERSIONED, ceilings, mode
from .kernels.decode import planning
from .registry import registered
from .stages import stage
from .testing import INDEXER_TOL, check_indexer, indexer_tol, make_indexer_inputs, rel_err

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]


def _log(*a):
    print(*a, flush=True)


def run_checks() -> list[dict]:
    return checks.decode_checks(log=_log)


def run_decode(impls=None, batches=BATCHES, H=64, K=512, context=8192, page_size=PAGE_SIZE,
               layers=bench.LAYERS) -> list[dict]:
    """Every recorded decode impl (default: the registry's tag "recorded") at each B, speedups against
    the campaign's baseline (tag "baseline": SGLang's kernel) measured in the same run: in a one-call
    graph (graph_us) and per call in a graph of ``layers`` calls (graph_layer_us)."""
    def log(row):
        _log("decode", {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
                        if k in ("impl", "B", "eager_us", "back_to_back_us", "graph_us", "graph_layer_us", "tflops",
                                 "speedup_vs_baseline", "speedup_vs_baseline_layer", "error")})
    (base,) = registered("sparse_decode", tag="baseline")
    return bench.decode_table(impls or checks.recorded(), batches, H=H, K=K,
                              context=context, page_size=page_size, baseline=base.name, log=log, layers=layers)


_SWEPT: dict = {}


def run_tiles(batches=(1, 8, 32, 128)) -> list[dict]:
    """The tile sweep; the fastest checked config at the largest B becomes this device's whole-row
    entry of the tile table for the rest of the run."""
    rows = sweeps.tile_sweep(batches=batches, log=_log)
    ok = [r for r in rows if "error" not in r and r["out_err"] <= checks.OUT_TOL and r["lse_err"] <= checks.LSE_TOL]
    best = min(ok, key=lambda r: r[f"us_B{max(batches)}"])
    planning.TILE_TABLE[(planning.device_key(), "mma")] = sweeps.from_row(best, "this run's tile sweep")
    _SWEPT["tiles"] = rows
    _log("chosen mma", best)
    return rows


def run_split(batches=BATCHES) -> list[dict]:
    """NSPLIT x B for the table's 64-head entry and the two 16-head configs fastest at B=1 in the
    tile sweep (without a tile sweep: the table's two entries); costs fitted to the B=1 rows, the
    faster 16-head config becomes the "split" entry; each row says whether splitk_auto's model, with the
    fitted figures, picks it."""
    key = planning.device_key()
    tiles = [r for r in _SWEPT.get("tiles", []) if "error" not in r and r["out_err"] <= checks.OUT_TOL]
    small = sorted((r for r in tiles if r["block_h"] < 64), key=lambda r: r["us_B1"])[:2]
    cands = [planning.tile_config(64)] + [sweeps.from_row(r, "sweep") for r in small]
    if len(cands) == 1:
        cands.append(planning.tile_config(64, split=True))
    rows = sweeps.split_sweep(cands, batches=batches, log=_log)
    fitted = [sweeps.fit_costs(rows, c) for c in cands]
    planning.TILE_TABLE[(key, "mma")] = fitted[0]
    planning.TILE_TABLE[(key, "split")] = min(fitted[1:], key=lambda c: sweeps.best_at(rows, c))
    for r in rows:                                 # what splitk_auto's model picks, with the fitted figures
        p = planning.choose(r["B"], 64, 512)
        r["model_choice"] = r["nsplit"] == p.nsplit and sweeps.ran(r, p.cfg)
    _log("fitted", fitted)
    return rows


INDEXER_BATCHES = [1, 8, 32, 64]


def _try(fn):
    try:
        return fn()
    except Exception as e:
        return repr(e)[:200]


def run_indexer(impls=None, H=64, live=8192, B=32, max_lens=bench.INDEXER_MAX_LENS,
                batches=INDEXER_BATCHES, topk=512) -> list[dict]:
    """The indexer of every stage (default: the registry's recorded indexer impls). Checks: every impl
    against the float64 reference (logits, top-512 recall) on random lengths, and one captured graph of
    S4's Triton indexer replayed on the next step's data. Timings (graph replay and eager, without the
    API's checks): ``live`` tokens per request at each max context, and, for the impls of S3 and S4, at
    the largest one over B; plus the top-k after the Triton logits."""
    from .kernels.indexer import fallback
    impls = impls or [i.name for i in registered("indexer_logits", tag="recorded")]
    triton_impl, every_b = stage("S4").indexer_impl, (stage("S3").indexer_impl, stage("S4").indexer_impl)
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
    rows.append(dict(kind="env", sglang_indexer_file=_try(fallback.sglang_indexer_file)))
    # one captured graph for every decode step: replay it with new lengths, page tables and queries
    # written into the same buffers, against the reference on the new data (and bitwise vs eager)
    big = make_indexer_inputs(8, H, max(max_lens), seq_lens=live, seed=12)
    fn = lambda: api.indexer_logits(*big.args(), max_seq_len=big.max_seq_len, impl=triton_impl)  # noqa: E731
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
    rows.append(dict(kind="check", impl=triton_impl, case="graph replay on the next step's data (new seq_lens, "
                     "page table, q, w)", logits_err=err, tol=INDEXER_TOL, ok=err <= INDEXER_TOL and same,
                     bitwise_vs_eager=same))
    _log("indexer", rows[-1])
    del g, res, big, step, ref
    shapes = [(B, L) for L in max_lens] + [(b, max(max_lens)) for b in batches if b != B]
    for b, L in shapes:
        inp = make_indexer_inputs(b, H, L, seq_lens=live, seed=13)
        for impl in [i for i in impls if b == B or i in every_b]:
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


#: which notebook or document reads each recorded part (the manifest says it beside each file)
PART_READERS = {
    "device": ["notebooks 00, 01, 02, 04, 05 (ceilings)", "README"],
    "checks": ["notebook 01"],
    "decode": ["notebooks 01-03", "README"],
    "tiles": ["notebook 02", "experiments/tile_sweep"],
    "split": ["notebooks 02-03", "experiments/split_sweep"],
    "indexer": ["notebooks 04-05", "README"],
    "indexer_step": ["notebook 05", "README"],
    "reproduce": ["notebook 04 (the glue's ops)", "notebooks 06-07", "README"],
    "launch_floor": ["notebook 03"],
}


def write_manifest(folder, part: str, payload: dict, command: str, file: str | None = None):
    """Add (or replace) ``part``'s entry in ``folder``/manifest.json: its file (default
    ``<part>.json``), date, device, versions, the command that wrote it and who reads it."""
    path = Path(folder) / "manifest.json"
    man = json.loads(path.read_text()) if path.exists() else {}
    man[part] = {"file": file or f"{part}.json", "date": payload.get("date"), "device": payload.get("device", {}).get("name"),
                 **{name: payload.get(name) for name in VERSIONED}, "command": command,
                 "read_by": PART_READERS.get(part, [])}
    path.write_text(json.dumps(dict(sorted(man.items())), indent=1) + "\n")


PARTS = {"tiles": run_tiles, "split": run_split, "decode": run_decode, "checks": run_checks, "indexer": run_indexer}


def main(out_dir: str, only=None):
    if mode() != "cuda":
        raise SystemExit("record needs a CUDA GPU (this process runs Triton's interpreter); the recorded "
                         "runs are in data/runs/")
    os.makedirs(out_dir, exist_ok=True)
    env = bench.environment()
    t0 = time.time()
    env["ceilings"] = ceilings().as_dict()
    env["launch_floor"] = bench.launch_floor_us()
    _log("ceilings", env["ceilings"], "launch floor", env["launch_floor"], f"{time.time() - t0:.1f}s")
    command = f"python -m dsv4lab record --out {out_dir}" + (f" --only {' '.join(only)}" if only else "")
    bench.save(os.path.join(out_dir, "device.json"), env)
    write_manifest(out_dir, "device", env, command)
    for name in only or PARTS:
        t = time.time()
        try:
            rows = PARTS[name]()
        except Exception:
            traceback.print_exc()
            continue
        payload = {**env, "part": name, "rows": rows, "tile_table": planning.table_dict(), "seconds": time.time() - t}
        bench.save(os.path.join(out_dir, f"{name}.json"), payload)
        write_manifest(out_dir, name, payload, command)
        _log(f"== {name} done in {time.time() - t:.0f}s")
