"""Notebook 07's widget: the replay's chosen parameters over the recorded per-layer costs."""
from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt
import pandas as pd

from .live import slider


#: the after-S1 shares the sensitivity reports (bridge.predict's keys), by dsv4lab.profile category
_SHARES = (("decode_share_after_pct", "DECODE", "decode"), ("fp32_share_after_pct", "FP32_GEMM", "FP32 GEMM"),
           ("glue_share_after_pct", "GLUE", "glue"))


def sensitivity_costs(results: dict) -> dict:
    """The per-layer costs a replay recorded for the sensitivity (reproduce.json's
    ``sensitivity.costs``, built by dsv4lab.bridge.cost_model); ValueError naming what is missing."""
    costs = results.get("sensitivity", {}).get("costs")
    if not isinstance(costs, dict):
        why = results.get("sensitivity", {}).get("note", "it was recorded before the sensitivity existed")
        raise ValueError(f"this replay has no recorded per-layer costs (reproduce.json 'sensitivity'): {why}")
    return costs


def sensitivity_options(results: dict) -> dict:
    """The settings explore_sensitivity offers: every count of ratio-4 layers the model's compressed
    layers allow, and the live contexts and served maxima of dsv4lab.bridge's ranges with the replay's own."""
    from .. import bridge
    cfg = results["config"]
    return dict(ratio4=list(range(cfg["layers_c4"] + cfg["layers_c128"] + 1)),
                live=sorted(set(bridge.SENS_LIVE) | {cfg["live_context"]}),
                max_context=sorted(set(bridge.SENS_MAX) | {cfg["max_context"]}))


def _story_targets() -> dict:
    from .. import bridge, profile
    shares = bridge.story_after_shares()
    out = {key: shares[getattr(profile, cat)] for key, cat, _ in _SHARES}
    out.update(attention_speedup=bridge.story_attention_speedup(), c1_change_pct=100 * (bridge.story_c1_ratio() - 1))
    return out


def sensitivity_grid(results: dict, ratio4=None, live=None, max_context=None) -> pd.DataFrame:
    """bridge.predict over every combination of the given settings (default: the replay's own), the
    points with more live tokens than the served maximum left out: the after-S1 shares, the S0 -> S1
    decode speedup, the C = 1 change in tok/s, and the largest miss against the story's three shares."""
    from .. import bridge
    costs, cfg = sensitivity_costs(results), results["config"]
    target = _story_targets()
    rows = []
    for n in ratio4 if ratio4 is not None else [cfg["layers_c4"]]:
        for lv in live if live is not None else [cfg["live_context"]]:
            for mc in max_context if max_context is not None else [cfg["max_context"]]:
                if lv > mc:
                    continue
                p = bridge.predict(costs, results, ratio4=n, live=lv, max_context=mc)
                row = {k: p[k] for k in ("ratio4", "live", "max_context")}
                row.update({k: p[k] for k, _, _ in _SHARES})
                row.update(attention_speedup=p["attention_speedup"], c1_change_pct=p["c1_change_pct"],
                           story_share_miss_pts=max(abs(p[k] - target[k]) for k, _, _ in _SHARES))
                rows.append(row)
    return pd.DataFrame(rows)


def sensitivity_view(results: dict, ratio4: int, live: int, max_context: int) -> dict:
    """What explore_sensitivity draws at one setting: each output of the cost model (the after-S1
    shares, the S0 -> S1 decode speedup, the C = 1 change in tok/s) against each parameter, the other
    two held at this setting; the setting marked, the replay's own setting dotted, the story's published
    value dashed. Returns bridge.predict at the setting ({"error": ...} when live > max_context)."""
    import matplotlib.ticker

    from .. import bridge, profile
    costs, cfg = sensitivity_costs(results), results["config"]
    if live > max_context:
        msg = (f"{live} live tokens a request cannot exceed the served maximum of {max_context}: "
               f"pick a larger max context or fewer live tokens")
        print(msg)
        return dict(error=msg)
    p = bridge.predict(costs, results, ratio4=ratio4, live=live, max_context=max_context)
    target = _story_targets()
    opts = sensitivity_options(results)
    at = dict(ratio4=ratio4, live=live, max_context=max_context)
    own = dict(ratio4=cfg["layers_c4"], live=cfg["live_context"], max_context=cfg["max_context"])
    names = dict(ratio4="ratio-4 layers (of the compressed ones)", live="live tokens a request",
                 max_context="served max context")
    fig, axes = plt.subplots(3, 3, figsize=(12, 7.5), sharey="row")
    for j, par in enumerate(("ratio4", "live", "max_context")):
        grid = sensitivity_grid(results, **{k: opts[k] if k == par else [v] for k, v in at.items()})
        for i, ax in enumerate(axes[:, j]):
            if i == 0:
                for key, cat, label in _SHARES:
                    color = profile.COLORS[getattr(profile, cat)]
                    ax.plot(grid[par], grid[key], "-", color=color, label=label)
                    ax.plot([at[par]], [p[key]], "o", color=color)
                    ax.axhline(target[key], color=color, ls="--", lw=0.8)
                ax.set_ylabel("share of kernel time\nafter S1 (%)" if j == 0 else "")
            else:
                key = ("attention_speedup", "c1_change_pct")[i - 1]
                ax.plot(grid[par], grid[key], "-", color="C0")
                ax.plot([at[par]], [p[key]], "o", color="C3")
                ax.axhline(target[key], color="k", ls="--", lw=0.8)
                ax.set_ylabel(("S0 -> S1 decode\nspeedup (x)", "tok/s change at\nC = 1, S0 -> S1 (%)")[i - 1]
                              if j == 0 else "")
            ax.axvline(own[par], color="0.5", ls=":", lw=1)
            if par == "ratio4":
                ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
            else:
                ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
        axes[-1, j].set_xlabel(names[par])
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("the cost model at this setting (dots), one parameter moved at a time; dotted: the replay's "
                 "setting; dashed: the story's published value", fontsize=9)
    fig.tight_layout()
    plt.show()
    print(f"ratio-4 layers {ratio4}, live {live}, max context {max_context}: after S1 decode "
          f"{p['decode_share_after_pct']:.1f}%, FP32 GEMM {p['fp32_share_after_pct']:.1f}%, glue "
          f"{p['glue_share_after_pct']:.1f}% (story {target['decode_share_after_pct']:g} / "
          f"{target['fp32_share_after_pct']:g} / {target['glue_share_after_pct']:g}); S0 -> S1 decode "
          f"{p['attention_speedup']:.3g}x (story {target['attention_speedup']:.1f}x); C = 1 tok/s "
          f"{p['c1_change_pct']:+.0f}% (story {target['c1_change_pct']:+.0f}%)"
          + ("; the replay's own setting" if at == own else ""))
    return p


def explore_sensitivity(results: dict):
    """The layer mix, the live context and the served maximum over a replay's recorded per-layer costs
    (sensitivity_view); starts at the replay's own setting."""
    opts, cfg = sensitivity_options(results), results["config"]
    sensitivity_costs(results)

    def show(ratio4, live, max_context):
        sensitivity_view(results, ratio4, live, max_context)

    return w.interactive(show, ratio4=slider(opts["ratio4"], cfg["layers_c4"], "ratio-4 layers"),
                         live=slider(opts["live"], cfg["live_context"], "live tokens"),
                         max_context=slider(opts["max_context"], cfg["max_context"], "max context"))
