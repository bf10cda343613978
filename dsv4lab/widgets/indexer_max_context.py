"""Notebook 04's widget: the max context, the torch fallback and the Triton indexer checked live."""
from __future__ import annotations

import functools

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from ..device import mode
from ..registry import impl_info, registered
from ..stages import STAGES
from .live import indexer_inputs, live_box, slider

#: the impls notebook 04's widget runs live: the indexer of each stage (the story's fallback in fp32,
#: its bf16 fix, the Triton indexer)
INDEXER_LIVE_IMPLS = tuple(dict.fromkeys(s.indexer_impl for s in STAGES))


def indexer_max_shape(max_seq_len: int) -> tuple:
    """(B, H, live, max context, k) notebook 04's widget checks at for a recorded max context (with
    8192 live tokens a request): on a GPU 4 requests at the real lengths; in the interpreter 2
    requests, 16 heads and every length / 64 (the same live : max ratio), a top-16."""
    if mode() == "cuda":
        return 4, 64, 8192, max_seq_len, 512
    return 2, 16, 8192 // 64, -(-max_seq_len // 64), 16


def indexer_max_check(max_seq_len: int) -> dict:
    """Each of INDEXER_LIVE_IMPLS once at indexer_max_shape(max_seq_len), on fresh random inputs with
    outputs poisoned, against the float64 reference (testing.check_indexer: logits error and top-k
    recall; ok: logits within testing.indexer_tol and, where the products are exact, the whole
    selection found), and the positions each computes a request (the fallback: every page of the max
    context; the Triton kernel: the live pages)."""
    return _indexer_max_check(*indexer_max_shape(max_seq_len))


@functools.lru_cache(maxsize=16)
def _indexer_max_check(B, H, live, L, k) -> dict:
    from ..testing import INDEXER_TOL, check_indexer, indexer_tol, make_indexer_inputs
    inp = make_indexer_inputs(B, H, L, seq_lens=live, seed=L)
    res = dict(B=B, H=H, live=live, max_seq_len=L, k=k, impls={})
    for impl in INDEXER_LIVE_IMPLS:
        err, recall = check_indexer(impl, inp, topk=k)
        positions = -(-L // 64) * 64 if impl_info("indexer_logits", impl).reads_dead_pages else -(-live // 64) * 64
        # the exact impls must find the reference's whole selection; bf16 scores may swap a boundary
        # position (what notebook 05's selection-quality study measures), so only their logits are bounded
        exact = indexer_tol(impl) == INDEXER_TOL
        res["impls"][impl] = dict(logits_err=err, recall=recall, positions=positions,
                                  ok=err <= indexer_tol(impl) and (recall == 1.0 or not exact))
    res["ok"] = all(r["ok"] for r in res["impls"].values())
    return res


def indexer_max_view(df: pd.DataFrame, max_seq_len: int, live_timing: bool = False, impls=None, B=32) -> dict:
    """What explore_indexer_max draws for one max context: the recorded graph-replay time of each
    indexer impl (rows kind="time" at batch B of data/runs/*/indexer.json; on a GPU with
    ``live_timing`` timed now) against the floor of the live bytes, and the fallback and the Triton
    indexer run and checked now (indexer_max_check). Returns the check."""
    d = df[(df["kind"] == "time") & (df["B"] == B) & (df["max_seq_len"] == max_seq_len)].set_index("impl")
    impls = [i for i in (impls or d.index) if i in d.index]
    us = d["graph_us"].reindex(impls)
    live_n = int(d["live"].dropna().iloc[0]) if "live" in d and d["live"].notna().any() else 8192
    timed = live_timing and mode() == "cuda"
    if timed:
        from .. import bench
        inp = indexer_inputs(B, 64, max_seq_len, live_n)
        us = pd.Series({i: bench.indexer_row(i, inp, eager=False)["graph_us"] for i in impls})
    chk = indexer_max_check(max_seq_len)
    fig, ax = plt.subplots(figsize=(6.5, 0.35 * max(len(us), 1) + 1.4))
    if len(us):
        ax.barh(list(us.index), us.values, color=[f"C{i}" for i in range(len(us))])
        for y, v in enumerate(us.values):
            ax.text(v, y, f" {v:,.1f}", va="center", fontsize=7)
        if d["floor_us"].notna().any():
            ax.axvline(d["floor_us"].dropna().iloc[0], color="black", ls="--", lw=1, label="floor of the live bytes")
            ax.legend(fontsize=7, loc="lower right")
        ax.set_xscale("log")
    else:
        ax.text(0.5, 0.5, f"no recorded time at max context {max_seq_len}", ha="center", va="center")
        ax.set_yticks([])
    ax.set_xlabel("logits, us per call (graph replay), log scale")
    ax.set_title(f"B={B}, {live_n} live tokens a request, max context {max_seq_len}: "
                 f"{'timed live' if timed else 'recorded'}", fontsize=9)
    plt.show()
    pages = -(-max_seq_len // 64)
    print(f"the fallback computes {pages * 64:,} positions a request ({pages * 64 / live_n:.0f}x the {live_n} live), "
          f"its [B, L, H] scores {B} x {pages * 64:,} x 64 = {B * pages * 64 * 64 / 1e6:,.0f} M values; "
          f"the Triton kernel reads the {-(-live_n // 64)} live pages")
    print(f"checked now ({mode()}, B={chk['B']}, H={chk['H']}, {chk['live']} live, max context {chk['max_seq_len']}, "
          f"top-{chk['k']}):")
    for impl, r in chk["impls"].items():
        print(f"  {impl:10s} logits error {r['logits_err']:.1e}, top-k recall {r['recall']:.3f}, "
              f"{r['positions']} positions a request -> {'ok' if r['ok'] else 'FAILS the bounds'}")
    return chk


def explore_indexer_max(df: pd.DataFrame, impls=None, B=32):
    """The max context (the live context fixed): the recorded time of each of ``impls`` (default: the
    indexer impls the recorded run times; on a GPU "time live" times them now) next to the fallback and
    the Triton indexer run and checked against the float64 reference now, at a small shape in the
    interpreter (indexer_max_view)."""
    impls = impls or [i.name for i in registered("indexer_logits", tag="recorded")]
    lens = sorted(int(v) for v in df[(df["kind"] == "time") & (df["B"] == B)]["max_seq_len"].unique())

    def show(max_seq_len, live_timing):
        indexer_max_view(df, max_seq_len, live_timing, list(impls), B)
    return w.interactive(show, max_seq_len=slider(lens, lens[-1], "max context"), live_timing=live_box())
