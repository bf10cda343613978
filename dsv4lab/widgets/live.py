"""What several notebooks' widgets share: their knobs, and a kernel run, checked and timed live."""
from __future__ import annotations

import dataclasses
import functools

import ipywidgets as w

from .. import roofline
from ..device import mode
from ..stages import stage

_LIVE_HELP = "time live on this GPU (dsv4lab.bench)"


def live_box():
    """The "time live" checkbox: enabled only on a CUDA GPU."""
    live = mode() == "cuda"
    return w.Checkbox(value=False, description=_LIVE_HELP if live else "live timing needs a CUDA GPU",
                      disabled=not live, indent=False)


def slider(options, value, description):
    """A slider over ``options`` starting at ``value`` (the first option when ``value`` is not one)."""
    options = list(options)
    return w.SelectionSlider(options=options, value=value if value in options else options[0], description=description,
                             continuous_update=False)


@functools.lru_cache(maxsize=2)
def decode_inputs(B, H, K, context):
    """The decode inputs a live timing runs on (the last two shapes kept)."""
    from ..testing import make_decode_inputs
    return make_decode_inputs(B, H, K, context=context, seed=B)


def time_us(fn) -> float:
    """Graph-replay time (us) of ``fn`` (GPU)."""
    from .. import bench
    return bench.time_ms(fn, graph=True, warmup=10, rep=40) * 1e3


def occupancy(programs: int, sms: int) -> str:
    """'3 of 132 SMs busy' or '4 waves' for a launch of ``programs`` programs on ``sms`` SMs."""
    if programs <= sms:
        return f"{programs} of {sms} SMs busy"
    return f"{-(-programs // sms)} waves on {sms} SMs"


def checked(run, inp) -> dict:
    """``run(inp)`` -> (out, lse) with outputs poisoned (NaN) first, against the float64 reference."""
    from ..testing import LSE_TOL, OUT_TOL, check_decode
    e_out, e_lse = check_decode(run, inp)
    return dict(out_err=e_out, lse_err=e_lse, ok=e_out <= OUT_TOL and e_lse <= LSE_TOL)


@functools.lru_cache(maxsize=1)
def indexer_inputs(B, H, max_seq_len, live):
    """The indexer inputs a live timing runs on (the last shape kept)."""
    from ..testing import make_indexer_inputs
    return make_indexer_inputs(B, H, max_seq_len, seq_lens=live, seed=13)


@functools.lru_cache(maxsize=32)
def live_check(impl: str, B: int, H: int, K: int, block_h: int | None = None) -> dict:
    """Run ``impl`` once in this process's mode (Triton's interpreter on a CPU) on fresh inputs
    (seed 0, request b attends to K of its 3K tokens) with NaN-poisoned outputs: relative errors
    of out and lse against the float64 reference, and whether they are within the tolerances.
    ``block_h`` (the story's kernel, stage S1's decode impl, only): its heads per program, instead of
    its BLOCK_H = 32. Returns {"error": message} when the impl cannot run here (no sglang wheel)."""
    from ..kernels.decode import head_batched, sglang_peer
    from ..kernels.decode.planning import STORY_TILES
    from ..testing import LSE_TOL, OUT_TOL, check_decode, make_decode_inputs
    story = stage("S1").decode_impl
    if block_h is not None and impl != story:
        raise ValueError(f"block_h applies to impl {story!r} only, got impl {impl!r}")
    inp = make_decode_inputs(B, H, K, context=3 * K, seed=0)
    try:
        if block_h is None:
            out_err, lse_err = check_decode(impl, inp)
        else:
            tiles = dataclasses.replace(STORY_TILES, block_h=block_h)
            out_err, lse_err = check_decode(lambda i: head_batched.sparse_decode_story(
                i.q, i.cache, i.indices, sm_scale=512 ** -0.5, tiles=tiles, **i.kwargs()), inp)
    except sglang_peer.SGLangMissing as e:
        return {"error": str(e)}
    return {"out_err": out_err, "lse_err": lse_err, "ok": out_err <= OUT_TOL and lse_err <= LSE_TOL}


def live_line(res: dict, what: str, shape: tuple) -> str:
    """The line a view prints for a live_check result of ``what`` at ``shape`` (B, H, K)."""
    B, H, K = shape
    if "error" in res:
        return f"live here: {what} cannot run: {res['error']}"
    verdict = "within tolerance" if res["ok"] else "OUTSIDE tolerance"
    return (f"live here ({mode()}, B={B}, H={H}, K={K}): {what}: out rel. err {res['out_err']:.2g}, "
            f"lse {res['lse_err']:.2g} vs the float64 reference: {verdict}")


def decode_floor(model, B, ceilings) -> dict:
    """The bytes and FLOPs of ``model``'s decode at batch B, and the time floor they set at ``ceilings``."""
    nbytes = roofline.decode_floor_bytes(B, model.heads, model.topk, model.head_dim)
    flops = roofline.decode_flops(B, model.heads, model.topk, model.head_dim)
    return {"bytes": nbytes, "flops": flops, **roofline.floor_us(nbytes, flops, ceilings.copy_tb_s, ceilings.bf16_tflops)}
