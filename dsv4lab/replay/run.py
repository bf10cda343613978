"""``python -m dsv4lab reproduce``: build the model, walk the stages within the time budget, then the
isolated decode calls, S0's glue scaling, the compile lessons, the bridge and the files."""
from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from .. import bench, bridge, roofline, run_folder
from ..device import ceilings, mode
from ..model import ASSUMPTIONS, CPU_MODEL, DSV4_FLASH_TP8, Model, weight_bytes
from ..stages import STAGES, stage
from ..step_compare import compare_stages
from .compile_lesson import COMPILE_LESSONS, run_compile_lesson
from .isolated import isolated_decode
from .measure import glue_scaling, measure_stage
from .outputs import write_outputs
from .plan import (CONCURRENCY, CONCURRENCY_CPU, DEFAULT_BUDGET_S, GLUE_SCALING_COUNTS, PROFILE_BATCH,
                   PROFILE_BATCH_CPU, Deadline, budget_plan, glue_scaling_counts, stage_for)


def main(out="reproduce", quick: bool = False, stages=None, budget_s: float | None = None,
         compile_glue: bool = True, config: dict | None = None, log=print) -> dict:
    """Run the replay and write its files to ``out`` (dsv4lab.run_folder: into a fresh folder moved
    into place at the end, so ``out`` is always one whole run); returns the results dict. ``config``:
    ModelConfig fields to change (e.g. the layer mix, live_context)."""
    gpu = mode() == "cuda"
    if quick and gpu:
        log("--quick on a GPU: the CPU preset's small shapes, compiled kernels")
    small = quick or not gpu
    cfg = replace(CPU_MODEL if small else DSV4_FLASH_TP8, **(config or {}))
    concurrency = CONCURRENCY_CPU if small else CONCURRENCY
    profile_batch = PROFILE_BATCH_CPU if small else PROFILE_BATCH
    profile_at = (1, profile_batch)               # the story's batch, and C = 1 (its regression)
    scaling_counts = glue_scaling_counts(cfg, (0, 2) if small else GLUE_SCALING_COUNTS)
    names = list(stages) if stages else [s.name for s in STAGES]
    todo = [stage_for(stage(n), cfg) for n in names]
    out = run_folder.check_out(out)
    plan = budget_plan(cfg, todo, concurrency, profile_at, scaling_counts, compile_glue)
    with run_folder.writing(out) as stage_dir:
        results = _run(stage_dir, cfg, todo, concurrency, profile_at, scaling_counts, plan, quick, budget_s,
                       compile_glue, log)
    log(f"wrote {', '.join(results['output']['files'])}, reproduce.json and reproduce.tar.gz to {out} "
        f"in {results['elapsed_s']:.0f} s")
    return results


def _run(out: Path, cfg, todo, concurrency, profile_at, scaling_counts, plan, quick, budget_s, compile_glue,
         log) -> dict:
    from tqdm.auto import tqdm
    gpu = mode() == "cuda"
    profile_batch = profile_at[-1]
    deadline = Deadline(budget_s or (DEFAULT_BUDGET_S if gpu else 1e9))
    results = dict(environment=bench.environment(), mode=mode(), quick=quick, config=cfg.as_dict(),
                   assumptions=[dict(topic=t, replay=r, source=s) for t, r, s in ASSUMPTIONS],
                   stages_run=[s.as_dict() for s in todo], concurrency=list(concurrency), profile_batch=profile_batch,
                   profiled_at=list(profile_at), budget_s=deadline.budget_s, stages={}, skipped=[],
                   run_id=f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
    est = plan["stages_s"] if gpu else {}
    results["budget_plan"] = plan
    if gpu:
        log(f"time budget (estimates for an H200; no new work starts after {deadline.budget_s:.0f} s):")
        parts = [("setup", plan["setup_s"])] + list(est.items()) + [
            ("glue scaling", plan["glue_scaling_s"]), ("isolated decode", plan["isolated_decode_s"]),
            ("compile lesson", plan["compile_lesson_s"]), ("outputs", plan["outputs_s"])]
        for k, v in parts:
            log(f"  {k:>16}: {v:6.0f} s")
        log(f"  {'total':>16}: {sum(v for _, v in parts):6.0f} s")
    t0 = time.time()
    model = Model(cfg)
    results["setup_s"] = time.time() - t0
    results["weight_bytes"] = weight_bytes(model)
    log(f"model built in {results['setup_s']:.1f} s: {cfg.num_layers} layers, C in {concurrency}")
    reserve = plan["outputs_s"] + 15
    if not gpu and todo:                 # one untimed step first: the interpreter's and torch's one-time costs
        model.step(model.inputs(profile_batch, todo[0].max_context), todo[0])
    for s in tqdm(todo, desc="stages", unit="stage"):
        need = est.get(s.name, 0.0)
        if gpu and deadline.left() - reserve < 0.6 * need:
            results["skipped"].append(dict(part=s.name, reason=f"budget: {deadline.left():.0f} s left, ~{need:.0f} s needed"))
            log(f"skip {s.name}: budget")
            continue
        t1 = time.time()
        results["stages"][s.name] = measure_stage(model, s, concurrency, profile_at, deadline=deadline, log=log)
        results["stages"][s.name]["seconds"] = time.time() - t1
        bench.save(out / "reproduce.json", results)          # partial results survive a kill (never 'complete')
    if {"S4", "S5"} <= set(results["stages"]):
        results["stage_agreement"] = stage_agreement(model, (1, profile_batch), log=log)
    if not gpu or deadline.left() > reserve + plan["isolated_decode_s"]:
        results["isolated_decode"] = isolated_decode(model, batches=(1, profile_batch), log=log)
    else:
        results["skipped"].append(dict(part="isolated decode", reason="budget"))
    del model
    if gpu:
        torch.cuda.empty_cache()
    s0 = stage_for(stage("S0"), cfg)
    if not scaling_counts:
        results["skipped"].append(dict(part="glue scaling", reason="the config has no compressed layer"))
    elif not gpu or deadline.left() > reserve + plan["glue_scaling_s"]:
        results["glue_scaling"] = glue_scaling(cfg, s0, profile_batch, scaling_counts, log=log)
        bench.save(out / "reproduce.json", results)
    else:
        results["skipped"].append(dict(part="glue scaling", reason="budget"))
    results["compile_lessons"] = {}
    for name, indexer in COMPILE_LESSONS if compile_glue else ():
        left = deadline.left() - reserve
        if not gpu:
            results["compile_lessons"][name] = dict(stage=name, variants=[], note="not run: CUDA-graph capture needs a GPU")
        elif left > 90:
            results["compile_lessons"][name] = run_compile_lesson(out, name, indexer, timeout_s=min(180.0, left), log=log)
        else:
            results["skipped"].append(dict(part=f"compile lesson {name}", reason=f"budget: {left:.0f} s left"))
    results["ceilings"] = ceilings().as_dict()
    results["byte_floor"] = roofline.step_floor(results)
    results["factors"] = bridge.factors(results)
    results["sensitivity"] = bridge.sensitivity(results)
    results["elapsed_s"] = deadline.elapsed()
    write_outputs(out, results, quick)
    return results


def stage_agreement(model, batches, log=print) -> list:
    """S5's logits against S4's on one path (S4's choices replayed), per batch: a row each, or its error."""
    rows = []
    for B in batches:
        try:
            r = compare_stages(model, B)
            rows.append({k: r[k] for k in ("before", "after", "B", "rel_err", "tolerance", "finite")})
        except Exception as e:                   # a failing comparison is a row, not the end of the run
            rows.append(dict(before="S4", after="S5", B=B, error=f"{type(e).__name__}: {str(e)[:300]}"))
        log(f"  S5 vs S4 at C={B}: " + (f"rel. error {rows[-1]['rel_err']:.3g} (bound {rows[-1]['tolerance']:.3g})"
                                        if "rel_err" in rows[-1] else rows[-1]["error"]))
    return rows


def cli(args) -> dict:
    """``python -m dsv4lab reproduce``'s arguments -> main()."""
    config = {}
    if args.layers:
        config.update(zip(("layers_window", "layers_c4", "layers_c128"), args.layers))
    if args.live_context:
        config["live_context"] = args.live_context
    return main(args.out, args.quick, args.stages, args.budget_s, not args.no_compile, config)
