"""Notebook 08's widget: the Hopper kernel at one batch."""
from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from ..registry import impl_info, registered
from ..stages import stage
from .live import decode_floor, live_check, live_line, slider


def _kernels() -> tuple:
    """(the Hopper kernel: the impl that needs sm_90; the Triton kernels it is held against: S2's
    split-K and S1best's tuned whole-row kernel; the dispatcher that picks per shape)."""
    (hopper,) = [i.name for i in registered() if "sm_90" in i.needs]
    (auto,) = registered(tag="dispatcher")
    return hopper, [stage(s).decode_impl for s in ("S2", "S1best")], auto.name


def hopper_live_check(B: int) -> dict:
    """The Hopper kernel itself run now at up to 3 requests of the model's 64 heads and a top-k of 80,
    outputs poisoned, against the float64 reference, where this process can run it (an sm_90 GPU with
    Gluon). Elsewhere it says why not, and checks what ``auto`` runs here in its place at a small
    shape. Returns the live_check result with ``impl`` (what ran) and ``line`` (what a view prints)."""
    hopper, _, auto = _kernels()
    why = impl_info("sparse_decode", hopper).unavailable()
    B_live = min(B, 3)
    if why is None:
        from ..kernels.decode.hopper import BLOCK_H
        shape = (B_live, BLOCK_H, 80)
        res = dict(live_check(hopper, *shape), impl=hopper)
        return dict(res, line=live_line(res, hopper, shape))
    shape = (B_live, 8, 80)
    ran = impl_info("sparse_decode", auto).runs(*shape).name
    res = dict(live_check(auto, *shape), impl=auto, hopper_unavailable=why)
    return dict(res, line=f"live here: {hopper} cannot run in this process ({why}); in its place "
                          + live_line(res, f"{auto} (runs {ran} here)", shape).removeprefix("live here "))


def hopper_batch_view(times: pd.DataFrame, B: int, ceilings, model, budget: list[dict], cold_us: float = 1.1) -> dict:
    """What explore_hopper shows at batch ``B``: the recorded one-call graph times of hopper, splitk_auto,
    mma (and hopper with half the slices) beside the byte and matmul floors, the launch hopper ran
    (slices, tiles a program) and the per-tile model's kernel time for it; then the Hopper kernel itself run now and checked
    against the float64 reference where this process can run it (hopper_live_check; elsewhere it
    says why not and checks what ``auto`` runs in its place)."""
    from ..kernels.decode.auto import on_hopper
    from ..kernels.decode.hopper import BLOCK_N
    hopper, rivals, auto = _kernels()
    rows = times[times["B"] == B]
    if rows.empty:
        raise ValueError(f"B must be one of the recorded batches {sorted(times['B'].unique())}, got {B!r}")
    us = {r["impl"]: float(r["graph_us"]) for _, r in rows.iterrows()}
    hop = rows[rows["impl"] == hopper].iloc[0]
    nsplit = int(hop["nsplit"])
    tiles = -(-model.topk // (BLOCK_N * nsplit))
    chain_us = sum(r["us"] for r in budget if r["who"] == "consumers")
    model_us = cold_us + tiles * chain_us
    floor = decode_floor(model, B, ceilings)
    fig, ax = plt.subplots(figsize=(6, 1.9))
    names = list(us)[::-1]
    ax.barh(names, [us[n] for n in names], color=[f"C{i}" for i in range(len(names))])
    for y, n in enumerate(names):
        ax.text(us[n], y, f" {us[n]:.1f}", va="center", fontsize=8)
    ax.axvline(floor["mem_us"], color="black", ls="--", lw=1, label=f"byte floor {floor['mem_us']:.1f} us")
    ax.axvline(floor["math_us"], color="grey", ls=":", lw=1.5, label=f"matmul floor {floor['math_us']:.1f} us")
    ax.set_xlim(0, max(us.values()) * 1.2)
    ax.set_xlabel(f"B = {B}: one-call CUDA-graph time (us, recorded)")
    ax.legend(fontsize=7, loc="lower right")
    plt.show()
    print(f"B = {B}: {hopper} {us[hopper]:.1f} us ({float(hop['tflops']):.0f} TFLOP/s), "
          + ", ".join(f"{n} {us[n]:.1f}" for n in rivals)
          + f"; best of {'/'.join(rivals)} over {hopper} {min(us[n] for n in rivals) / us[hopper]:.2f}x; "
          f"{auto} runs {on_hopper(B, 64)} there on an sm_90 GPU")
    print(f"{hopper}'s launch: {B} x {nsplit} programs of {tiles} tile(s) of {BLOCK_N} tokens; "
          f"model: {cold_us:.1f} us cold first tile + {tiles} x {chain_us:.2f} us = {model_us:.1f} us of kernel")
    live = hopper_live_check(B)
    print(live["line"])
    return {"B": B, "us": us, "nsplit": nsplit, "tiles": tiles, "model_us": model_us, "floor": floor, "live": live}


def explore_hopper(times: pd.DataFrame, ceilings, model, budget: list[dict], cold_us: float = 1.1):
    """One recorded batch at a time (hopper_batch_view)."""
    bs = sorted(int(b) for b in times["B"].unique())

    def show(B):
        hopper_batch_view(times, B, ceilings, model, budget, cold_us)

    return w.interactive(show, B=slider(bs, 32, "B"))
