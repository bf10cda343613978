"""Notebook 05's widget: the indexer step at a live length and a max context."""
from __future__ import annotations

import functools

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from .. import plots
from ..device import mode
from ..registry import impl_info
from ..stages import stage
from .live import indexer_inputs, live_box, slider, time_us


def indexer_step_shape(live: int, max_seq_len: int) -> tuple:
    """(B, H, row lengths, max context, k) notebook 05's widget runs the step at: on a GPU 4 requests at
    the real lengths, top-512; in the interpreter 2 requests, 16 heads, every length / 128 and a
    top-32. The first row holds the live length (at most the max context), the second a third of it."""
    n = min(live, max_seq_len)
    if mode() == "cuda":
        return 4, 64, (n, n, n, n // 3), max_seq_len, 512
    s = max(1, n // 128)
    return 2, 16, (s, s // 3), -(-max_seq_len // 128), 32


def indexer_step_check(live: int, max_seq_len: int) -> dict:
    """The indexer step as a captured graph runs it (indexer_topk's registered Triton function: logits of
    the live pages, then the radix top-k of each live prefix) once at indexer_step_shape(live,
    max_seq_len), outputs poisoned: ``exact``, the positions equal the contract (reference.topk_positions)
    on the kernel's own logits; ``recall``, the share of the float64 reference's selection found (ties
    counted); the positions it read against those of the max context."""
    return _indexer_step_check(*indexer_step_shape(live, max_seq_len))


@functools.lru_cache(maxsize=64)
def _indexer_step_check(B, H, lens, L, k) -> dict:
    from ..testing import check_indexer_step, make_indexer_inputs
    inp = make_indexer_inputs(B, H, L, seq_lens=list(lens), seed=sum(lens) + L)
    return dict(B=B, H=H, lens=lens, max_seq_len=L, k=k, read=sum(-(-n // 64) * 64 for n in lens), max_positions=B * L,
                **check_indexer_step(inp, k))


def time_indexer_step_live(live: int, max_seq_len: int, B: int = 32, H: int = 64, k: int = 512) -> float:
    """Graph-replay time (us) of the Triton indexer step at B requests of ``live`` tokens (GPU)."""
    inp = indexer_inputs(B, H, max_seq_len, min(live, max_seq_len))
    fn = impl_info("indexer_topk", stage("S4").indexer_impl).fn
    return time_us(lambda: fn(*inp.args(), max_seq_len=max_seq_len, topk=k))


def _step_vs_max(rows: pd.DataFrame) -> pd.DataFrame:
    """The recorded rows of the Triton indexer's step (stage S4's indexer) against the max context."""
    return rows[(rows["kind"] == "step_vs_max") & (rows["impl"] == stage("S4").indexer_impl)]


def indexer_step_view(rows: pd.DataFrame, live: int, max_seq_len: int, live_timing: bool = False) -> dict:
    """What explore_indexer_step draws for one (live length, max context): the recorded step against
    the max context and against the live length (experiments/indexer_topk rows kind="step_vs_max" and
    "step_vs_live") with this setting marked, on a GPU with ``live_timing`` the step timed now, and
    the step run now and checked exact (indexer_step_check). Returns the check."""
    chk = indexer_step_check(live, max_seq_len)
    vs_max = _step_vs_max(rows).dropna(subset=["graph_us"])
    vs_live = rows[rows["kind"] == "step_vs_live"].dropna(subset=["graph_us"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.3))
    fig.subplots_adjust(wspace=0.3)
    plots.indexer_step_vs_max(axes[0], rows)
    axes[0].axvline(max_seq_len, color="C3", lw=1)
    plots.indexer_step_vs_live(axes[1], rows)
    axes[1].axvline(live, color="C3", lw=1)
    for ax, what in zip(axes, ("max context", "live length")):
        ax.set_title(f"recorded; red: the {what} chosen", fontsize=9)
        ax.legend(fontsize=7)
    timed = time_indexer_step_live(live, max_seq_len) if live_timing and mode() == "cuda" else None
    if timed is not None:
        axes[0].plot([max_seq_len], [timed], "*", ms=12, color="C3", label=f"timed live: {timed:.1f} us")
        axes[0].legend(fontsize=7)
    plt.show()
    at_max = vs_max[vs_max["max_seq_len"] == max_seq_len]
    at_live = vs_live[vs_live["live"] == live]
    if len(at_max):
        r = at_max.iloc[0]
        print(f"recorded: {int(r['live'])} live tokens, max context {max_seq_len}: {r['graph_us']:.1f} us "
              f"(floor {r['floor_us']:.1f} us)")
    if len(at_live):
        r = at_live.iloc[0]
        print(f"recorded: {live} live tokens, max context {int(r['max_seq_len'])}: {r['graph_us']:.1f} us "
              f"(logits {r['logits_us']:.1f}, top-k {r['topk_us']:.1f}; floor {r['floor_us']:.1f} us)")
    if not len(at_max) and not len(at_live):
        print(f"no recorded step at {live} live tokens or max context {max_seq_len}")
    if live > max_seq_len:
        print(f"{live} live tokens do not fit a max context of {max_seq_len}: the rows hold {max_seq_len}")
    if timed is not None:
        print(f"timed live on this GPU: B=32, {min(live, max_seq_len)} live, max context {max_seq_len}: {timed:.1f} us")
    print(f"run now ({mode()}): B={chk['B']}, H={chk['H']}, rows of {', '.join(str(n) for n in chk['lens'])} live tokens, "
          f"max context {chk['max_seq_len']}, top-{chk['k']}: read {chk['read']} of {chk['max_positions']} positions, "
          f"{chk['padded']} outputs padded with -1; exact {chk['exact']}, recall {chk['recall']:.3f}, logits error "
          f"{chk['logits_err']:.1e} -> {'ok' if chk['ok'] else 'FAILS'}")
    return chk


def explore_indexer_step(rows: pd.DataFrame):
    """Live length x max context for the indexer step over the live context: the recorded step
    (experiments/indexer_topk) against both, and the step run now at a small shape in the interpreter
    and checked exact against the contract and the float64 reference (indexer_step_view)."""
    lives = sorted(int(v) for v in rows[rows["kind"] == "step_vs_live"]["live"].unique())
    maxes = sorted(int(v) for v in _step_vs_max(rows)["max_seq_len"].unique())
    first_live = 8192 if 8192 in lives else lives[len(lives) // 2]

    def show(live, max_seq_len, live_timing):
        indexer_step_view(rows, live, max_seq_len, live_timing)
    return w.interactive(show, live=slider(lives, first_live, "live tokens"),
                         max_seq_len=slider(maxes, maxes[-1], "max context"), live_timing=live_box())
