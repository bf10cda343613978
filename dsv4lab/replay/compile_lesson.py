"""The torch.compile lesson (GPU, in a child process: a failed capture must not poison the run):
compile the glue, capture the whole step in one CUDA graph, and record what works and what fails."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from .. import bench
from ..model import DSV4_FLASH_TP8, GLUE, INDEXER_TOPK, Model
from ..registry import impl_info
from ..stages import stage
from .fit import median
from .measure import replay_ms
from .plan import PROFILE_BATCH

#: the lesson's compile modes, least to most likely to clash with an outer capture
COMPILE_VARIANTS = ("default", "reduce-overhead", "default, first call inside the capture")
#: the lessons: (stage, whether its indexer top-k is compiled too). S1 is where the story tried
#: torch.compile (the glue then included the indexer's torch fallback); S4 after the story's fixes
COMPILE_LESSONS = (("S1", True), ("S4", False))


def _repo_relative(text: str) -> str:
    """Error text with this machine's paths to the package cut to ``dsv4lab/...``."""
    return re.sub(r"(/[^\s\"']*)?/(dsv4lab/[\w/.]+)", r"\2", text)


def compile_lesson(out_json: str, stage_name: str = "S4", C: int = PROFILE_BATCH, indexer: bool = False):
    """Compile the glue functions (model.GLUE) with torch.compile, and with ``indexer`` the stage's
    indexer top-k too (the torch fallback, as the story's S1 ran it), capture the whole step in one
    CUDA graph, replay: per variant whether it worked, the error text if not, compile and step
    times, and the largest logit difference from the uncompiled step. Writes ``out_json``."""
    import torch._dynamo as dynamo

    from .. import model as model_mod
    rows = []
    s = stage(stage_name)
    compiled = list(GLUE) + ([f"{INDEXER_TOPK}[{s.indexer_impl}]"] if indexer else [])

    env = {k: v for k, v in bench.environment().items() if k in ("date", "device", "python", "torch", "triton")}

    def save():
        bench.save(out_json, dict(**env, stage=stage_name, C=C, glue=compiled, variants=rows))

    m = Model(DSV4_FLASH_TP8)
    inp = m.inputs(C, s.max_context)
    m.check(inp)
    fn = lambda: m.step(inp, s)  # noqa: E731
    g, ref = bench.capture(fn)
    base = median(replay_ms(g, 10))
    ref = ref.clone()
    del g
    rows.append(dict(variant="no compile (baseline)", ok=True, step_ms=base))
    save()
    for variant in COMPILE_VARIANTS:
        row = dict(variant=variant)
        dynamo.reset()
        compile_mode = variant.split(",")[0]
        mode_arg = None if compile_mode == "default" else compile_mode
        fns = {name: torch.compile(getattr(model_mod, name), mode=mode_arg) for name in GLUE}
        if indexer:
            fns[INDEXER_TOPK] = torch.compile(impl_info("indexer_topk", s.indexer_impl).fn, mode=mode_arg)
        m.use_glue(fns)
        t0 = time.time()
        try:
            if "inside the capture" in variant:
                row["phase"] = "capture (the first call compiles inside it)"
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out = fn()
            else:
                row["phase"] = "compile (two eager calls)"
                fn()
                fn()
                torch.cuda.synchronize()
                row["compile_s"] = time.time() - t0
                row["phase"] = "capture (bench.capture: warm-ups, then the capture)"
                g, out = bench.capture(fn)
            row["phase"] = "replay"
            times = replay_ms(g, 10)
            row.update(ok=True, phase="done", step_ms=median(times), speedup_vs_baseline=base / median(times),
                       max_abs_logit_diff=float((out - ref).abs().max()),
                       finite=bool(torch.isfinite(out).all()))
            del g
        except Exception as e:
            row.update(ok=False, error_type=type(e).__name__, error=_repo_relative(str(e))[:1500])
            if e.__context__ is not None:                    # e.g. the capture's end failing after the first error
                row["error_during"] = f"{type(e.__context__).__name__}: {str(e.__context__)[:800]}"
            try:
                torch.cuda.synchronize()
            except Exception as e2:                              # a sticky CUDA error: stop here
                row["after_error"] = f"{type(e2).__name__}: {str(e2)[:300]}"
                rows.append(row)
                save()
                return
        row["seconds"] = time.time() - t0
        rows.append(row)
        save()
        m.use_glue(None)
        torch.cuda.empty_cache()


def run_compile_lesson(out_dir: Path, stage_name: str, indexer: bool, timeout_s: float, log=print) -> dict:
    path = out_dir / f".compile_lesson_{stage_name}.json"          # merged into reproduce.json, then removed
    cmd = [sys.executable, "-m", "dsv4lab.replay", "--compile-lesson", str(path), "--stage", stage_name]
    cmd += ["--indexer"] if indexer else []
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        tail = (p.stdout + p.stderr)[-2000:]
        rc = p.returncode
    except subprocess.TimeoutExpired as e:
        tail, rc = f"timed out after {timeout_s:.0f} s: {str(e)[-500:]}", "timeout"
    res = json.loads(path.read_text()) if path.exists() else {}
    path.unlink(missing_ok=True)
    res.update(returncode=rc, seconds=time.time() - t0, log_tail=tail)
    log(f"  compile lesson {stage_name}: rc={rc}, " + "; ".join(
        f"{v['variant']}: {'ok %.2f ms' % v['step_ms'] if v.get('ok') else 'FAILED ' + v.get('error_type', '')}"
        for v in res.get("variants", [])))
    return res

