"""Notebook 09's widget: which of S5's glue fusions are on (dsv4lab.step_fused.FUSIONS), and what the step
does with them, run now on the small preset (model.CPU_MODEL): its launches, per layer kind and in all,
and its logits against S4's on one path (step_compare). On a CPU the launches are counted in one
interpreted step: every Triton launch, and every torch op that computes (views and allocations left out;
on a GPU such an op launches one kernel or more, top-k two). On a CUDA GPU they are the step's device
kernels in a profiled eager step, and the "time live" box times the captured step (dsv4lab.bench)."""
from __future__ import annotations

import contextlib
import functools

import ipywidgets as w
import pandas as pd
import torch
from torch.autograd import DeviceType
from torch.profiler import record_function

from ..device import mode
from .live import live_box

#: torch ops that launch nothing: views, allocations, metadata
_VIEWS = {"aten::view", "aten::slice", "aten::select", "aten::as_strided", "aten::expand", "aten::unsqueeze",
          "aten::squeeze", "aten::t", "aten::transpose", "aten::permute", "aten::unflatten", "aten::flatten",
          "aten::chunk", "aten::split", "aten::narrow", "aten::empty", "aten::empty_strided", "aten::empty_like",
          "aten::alias", "aten::detach", "aten::_unsafe_view", "aten::lift_fresh", "aten::resolve_conj",
          "aten::resolve_neg", "aten::_reshape_alias", "aten::view_as", "aten::unbind", "aten::expand_as",
          "aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::set_"}
#: torch ops that launch something only when they copy (then a child op computes)
_MAYBE = {"aten::to", "aten::_to_copy", "aten::contiguous", "aten::reshape", "aten::type_as"}
_TRITON = "triton::"


def _computes(e) -> bool:
    if e.name in _VIEWS:
        return False
    if e.name in _MAYBE:
        return any(_computes(c) for c in e.cpu_children)
    return True


def _counted(e) -> bool:
    """An outermost computing torch op, outside any Triton launch."""
    if not e.name.startswith("aten::") or not _computes(e):
        return False
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith(_TRITON) or (p.name.startswith("aten::") and _computes(p)):
            return False
        p = p.cpu_parent
    return True


@contextlib.contextmanager
def _triton_regions():
    """Each interpreted Triton launch inside a profiler region ``triton::<kernel>``."""
    from triton.runtime.interpreter import InterpretedFunction
    real = InterpretedFunction.run

    def run(self, *args, **kwargs):
        with record_function(_TRITON + getattr(self.fn, "__name__", "kernel")):
            return real(self, *args, **kwargs)
    InterpretedFunction.run = run
    try:
        yield
    finally:
        InterpretedFunction.run = real


def count_launches(fn) -> dict:
    """Launches of one call of ``fn``: {"triton", "torch", "total"} in the interpreter (the rule in the
    module's docstring), {"total"} device kernels on a GPU (after one call unprofiled)."""
    from ..profile import _no_fd2, device_kernel_count
    fn()                                     # first-call work (a weight's bf16 copy, buffers) stays out
    if mode() == "cuda":
        return dict(total=device_kernel_count(fn))
    with _triton_regions(), _no_fd2(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    ev = [e for e in prof.events() if e.device_type == DeviceType.CPU]
    triton = sum(1 for e in ev if e.name.startswith(_TRITON))
    ops = sum(1 for e in ev if _counted(e))
    return dict(triton=triton, torch=ops, total=triton + ops)


@functools.lru_cache(maxsize=1)
def _model():
    from ..model import CPU_MODEL, Model
    return Model(CPU_MODEL)


@contextlib.contextmanager
def fusions_on(model, fusions):
    """``model.fusions = fusions`` inside the block, every fusion on again after it."""
    from ..step_fused import FUSIONS
    model.fusions = fusions
    try:
        yield model
    finally:
        model.fusions = FUSIONS


def launches_per_layer(stage: str, fusions=None, B: int = 1) -> dict:
    """Launches of one step of ``stage`` on the small preset, per layer kind ("c0", "c4", "c128": one
    layer each) and for the rest ("embed + head"), with ``fusions`` on (S5; default all). The layers are
    called as Model.step calls them."""
    from .. import step_fused
    from ..stages import stage as stage_by_name
    m, s = _model(), stage_by_name(stage)
    inp = m.inputs(B, s.max_context)
    m.check(inp)
    fused = s.glue == "fused"
    out, state = {}, {}
    with fusions_on(m, step_fused.FUSIONS if fusions is None else fusions):
        def embed():
            state["h"] = m.embed[inp.tokens].unsqueeze(1).expand(-1, m.cfg.hc_mult, -1).contiguous()
        rest = count_launches(embed)["total"]
        for lw, c in zip(m.weights, m.caches):
            def layer(lw=lw, c=c, h=state["h"]):
                state["h"] = (step_fused.layer(m, h, lw, c, inp, s) if fused else m.layer(h, lw, c, inp, s))
            out[f"c{c.ratio}"] = count_launches(layer)["total"]
        head = (lambda: step_fused.head(m, state["h"], s)) if fused else (lambda: m.head(state["h"], s))
        out["embed + head"] = rest + count_launches(head)["total"]
    return out


@functools.lru_cache(maxsize=256)
def fusion_check(fusions: frozenset, B: int = 2, live: bool = False) -> dict:
    """S5's step on the small preset with ``fusions`` on: its launches (count_launches), its logits
    against S4's on one path (rel_err, tolerance), and with ``live`` on a GPU the captured step's time."""
    from ..stages import stage
    from ..step_compare import compare_stages
    m = _model()
    with fusions_on(m, fusions):
        inp = m.inputs(B)
        m.check(inp)
        n = count_launches(lambda: m.step(inp, stage("S5")))
        r = compare_stages(m, B)
        res = dict(fusions=len(fusions), launches=n["total"], rel_err=r["rel_err"], tolerance=r["tolerance"],
                   ok=r["finite"] and r["rel_err"] < r["tolerance"])
        if "torch" in n:
            res.update(triton=n["triton"], torch_ops=n["torch"])
        if live and mode() == "cuda":
            from .live import time_us
            res["step_us"] = time_us(lambda: m.step(inp, stage("S5")))
    return res


def fusion_table(rows: dict, B: int = 2) -> pd.DataFrame:
    """fusion_check for each named set of fusions (``rows``: label -> fusions), one row each."""
    return pd.DataFrame({k: fusion_check(frozenset(v), B) for k, v in rows.items()}).T


def fusion_view(live: bool = False, B: int = 2, **on) -> dict:
    """The widget's view: the fusions ticked in ``on`` (name -> bool), checked now (fusion_check)."""
    from ..step_fused import FUSIONS
    fusions = frozenset(n for n in FUSIONS if on.get(n, True))
    res = fusion_check(fusions, B, live)
    off = [n for n in FUSIONS if n not in fusions]
    how = (f"{res['triton']} Triton + {res['torch_ops']} torch ops, interpreted" if "triton" in res
           else "device kernels, eager")
    print(f"S5 with {len(fusions)} of {len(FUSIONS)} fusions on" + (f" (S4's ops for {', '.join(off)})" if off else "")
          + f", small preset, B = {B}, live here ({mode()}):")
    print(f"  launches per step: {res['launches']} ({how})")
    print(f"  logits vs S4 on one path: rel. err {res['rel_err']:.2g}, bound {res['tolerance']:.3g}: "
          + ("within" if res["ok"] else "OUTSIDE"))
    if "step_us" in res:
        print(f"  captured step: {res['step_us']:.0f} us (CUDA-graph replay)")
    return res


def explore_fusions(B: int = 2):
    """Checkboxes over step_fused.FUSIONS (all on), and on a GPU the "time live" box."""
    from ..step_fused import FUSIONS
    boxes = {n: w.Checkbox(value=True, description=n, indent=False) for n in FUSIONS}
    return w.interactive(fusion_view, live=live_box(), B=w.fixed(B), **boxes)
