"""The replay's throughput fit: step time = a + b x C over the concurrencies, and tokens/s."""
from __future__ import annotations


def fit_step_time(concurrency, step_ms) -> dict:
    """Least squares step_ms = a + b x C: a (ms, the fixed cost of a step), b (ms per request,
    the marginal cost), r2, and the asymptote 1000 / b tok/s (what the story calls ~33 -> ~77)."""
    import numpy as np
    C, y = np.asarray(concurrency, dtype=float), np.asarray(step_ms, dtype=float)
    if C.shape != y.shape or C.ndim != 1 or len(set(C.tolist())) < 2:
        raise ValueError(f"need >= 2 distinct concurrencies with one step time each, got {concurrency} / {step_ms}")
    b, a = np.polyfit(C, y, 1)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    ss_res = float(((y - a - b * C) ** 2).sum())
    return dict(a_ms=float(a), b_ms=float(b), r2=1 - ss_res / ss_tot if ss_tot else 1.0,
                asymptote_tok_s=1000.0 / float(b) if b > 0 else None)


def tokens_per_s(C: int, step_ms: float) -> float:
    return C / (step_ms / 1000.0)


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])
