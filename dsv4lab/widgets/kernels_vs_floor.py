"""Notebook 00's widget: each recorded decode kernel's time against the floor of its work, checked live."""
from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from .. import plots
from ..device import mode
from .live import decode_floor, live_box, live_check, live_line, slider


def recorded_us(decode: pd.DataFrame, impl: str, B: int, col: str = "graph_us") -> float | None:
    """The recorded time (us) of ``impl`` at batch ``B``, or None (not run, or a row with an error)."""
    if col not in decode:
        return None
    d = decode[(decode["impl"] == impl) & (decode["B"] == B)][col].dropna()
    return float(d.iloc[0]) if len(d) else None


def recorded_impls(decode: pd.DataFrame) -> list[str]:
    """Sparse-decode impls with at least one recorded time, in the table's order (the campaign's)."""
    from ..registry import impls
    have = set(decode.dropna(subset=["graph_us"])["impl"]) if "graph_us" in decode else set()
    known = set(impls()) - {"reference"}
    return [i for i in dict.fromkeys(decode["impl"]) if i in have and i in known]


def kernels_vs_floor(decode: pd.DataFrame, ceilings, model, B: int, live_shape=(2, 8, 80)) -> pd.DataFrame:
    """One row per recorded impl at batch ``B``: its campaign stage, recorded time against the
    floor of ``model``'s work at ``ceilings``, the TFLOP/s that time means, and the impl's live
    check at ``live_shape`` (B, H, K) in this process."""
    from ..registry import impl_info
    fl = decode_floor(model, B, ceilings)
    rows = []
    for impl in recorded_impls(decode):
        us = recorded_us(decode, impl, B)
        live = live_check(impl, *live_shape)
        rows.append({"impl": impl, "stage": impl_info("sparse_decode", impl).stage,
                     "recorded us": us, "floor us": fl["floor_us"],
                     "x floor": us / fl["floor_us"] if us else None,
                     "TFLOP/s": fl["flops"] / (us * 1e-6) / 1e12 if us else None,
                     "live out err": live.get("out_err"), "live ok": live.get("ok")})
    return pd.DataFrame(rows).set_index("impl")


def kernel_floor_view(impl, B, live=False, *, decode, ceilings, model, live_shape=(2, 8, 80)):
    """What :func:`explore_kernels_vs_floor` draws for one setting: ``impl``'s recorded time vs
    batch against the floor, its point on the roofline at ``B``, and its live check."""
    from ..registry import impl_info
    batches = sorted(int(b) for b in decode["B"].unique())
    floor = pd.Series({b: decode_floor(model, b, ceilings)["floor_us"] for b in batches})
    fl = decode_floor(model, B, ceilings)
    us = recorded_us(decode, impl, B)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    fig.subplots_adjust(wspace=0.3)       # the roofline's legend goes right of its axes
    plots.time_vs_batch_floors(axes[0], decode, [impl], {"floor (bytes or FLOPs at the ceilings)": floor})
    if us:
        axes[0].plot([B], [us], "*", ms=14, color="C3")
    axes[0].set_title(f"{impl}: recorded time per call vs batch", fontsize=9)
    pts = [dict(label=f"the work at B={B}, at the roof", intensity=fl["intensity"])]
    if us:
        pts.append(dict(label=f"{impl} at B={B}, recorded", intensity=fl["intensity"],
                        tflops=fl["flops"] / (us * 1e-6) / 1e12))
    plots.roofline(axes[1], ceilings, pts)
    axes[1].set_title("where that time sits under the roof", fontsize=9)
    plt.show()
    info = impl_info("sparse_decode", impl)
    print(f"{impl} (stage {info.stage or '-'}): {info.description}")
    if us:
        print(f"recorded at B={B}: {us:.1f} us per call (graph replay) = {us / fl['floor_us']:.0f}x the floor "
              f"{fl['floor_us']:.2f} us ({fl['bound']}-bound work: {fl['bytes'] / 1e6:.2f} MB, "
              f"{fl['flops'] / 1e9:.2f} GFLOP)")
    else:
        print(f"the recorded run has no time for {impl} at B={B}")
    if live and mode() == "cuda":
        from ..bench import measure_decode
        live_us = measure_decode([impl], [B], model, layers=0)["graph_us"].iloc[0]
        print(f"live on this GPU at B={B}: {live_us:.1f} us per call (graph replay)")
    print(live_line(live_check(impl, *live_shape), impl, live_shape))


def explore_kernels_vs_floor(decode: pd.DataFrame, ceilings, model, live_shape=(2, 8, 80)):
    """Impl and B over a recorded decode table: recorded time against the floor of ``model``'s
    work at ``ceilings`` (time vs batch and the roofline), and the impl run live at
    ``live_shape`` (B, H, K) against the float64 reference (interpreter on a CPU)."""
    names = recorded_impls(decode)
    batches = sorted(int(b) for b in decode["B"].unique())

    def show(impl, B, live):
        kernel_floor_view(impl, B, live, decode=decode, ceilings=ceilings, model=model, live_shape=live_shape)

    return w.interactive(show, impl=w.Dropdown(options=names, value=names[0], description="impl"),
                         B=slider(batches, model.batch, "B"), live=live_box())
