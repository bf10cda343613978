"""Two stages of the step on one path: S5 computes S4's step with its glue fused, so the two must agree
within what rounding explains. A near-tie can still send them down different paths (the indexer's
512th and 513th scores, the router's 6th and 7th expert): then a small rounding difference changes
which tokens or experts a layer reads, and the outputs differ by far more than rounding. So the
comparison fixes the choices: :class:`FixedSelection` records the first stage's (each ratio-4 layer's
top-k, each layer's routed experts) and the second stage replays them; what is left is rounding.

The tolerance comes from the ops' bounds: both stages round to bf16 (unit roundoff u = 2^-9) at
different points: S4 after each torch op, S5 once per fused kernel. Each such point adds a relative
error of at most u to the values it rounds; independent roundings add in quadrature, and the layers'
residual streams carry them forward. With ``ROUNDINGS_PER_LAYER`` points where the two stages differ,
the logits' relative error (Frobenius norm) should stay within
``SAFETY * u * sqrt(ROUNDINGS_PER_LAYER * layers)``; a bug (a wrong rope sign, a head out of place, a
missed router weight) is O(1) instead.
"""
from __future__ import annotations

import math

import torch

from .stages import stage as stage_by_name
from .testing import rel_err

#: bf16's unit roundoff (round to nearest: half its 2^-8 machine epsilon)
BF16_U = 2.0 ** -9
#: per layer, the points where S4 rounds a value to bf16 and S5 does not (or the other way): the
#: mHC combine before its norm (x2), the q LoRA norm, the query norm before rope, the indexer's rope
#: input, the merged decode output before the inverse rope, the SiLU of the experts (x2), the routed
#: sum, the shared expert's activation, the GEMMs' concatenation (cuBLAS may split K differently)
ROUNDINGS_PER_LAYER = 12
SAFETY = 4.0


def tolerance(layers: int) -> float:
    """The logits' relative-error bound for S4 vs S5 over ``layers`` layers (see the module doc)."""
    return SAFETY * BF16_U * math.sqrt(ROUNDINGS_PER_LAYER * layers)


class FixedSelection:
    """Records one step's choices, then replays them: ``fixed(kind)`` is None while recording and the
    recorded tensor (in call order, per step) while replaying; ``seen(kind, value)`` records."""

    KINDS = ("indexer", "route")

    def __init__(self):
        self.recorded = {k: [] for k in self.KINDS}
        self.replaying = False
        self._pos = dict.fromkeys(self.KINDS, 0)

    def start(self):
        self._pos = dict.fromkeys(self.KINDS, 0)

    def fixed(self, kind: str):
        if not self.replaying:
            return None
        i = self._pos[kind]
        self._pos[kind] += 1
        return self.recorded[kind][i]

    def seen(self, kind: str, value):
        if not self.replaying:
            self.recorded[kind].append(value.clone())


def _written(c) -> list:
    """What a step writes into a layer's caches: the window cache's new token, the compressor rings."""
    return [t for t in (c.window.buffer, c.state, c.index_state) if t is not None]


def _cache_state(model):
    return [[t.clone() for t in _written(c)] for c in model.caches]


def _restore(model, saved):
    for c, tensors in zip(model.caches, saved):
        for dst, src in zip(_written(c), tensors):
            dst.copy_(src)


def compare_stages(model, B: int, before: str = "S4", after: str = "S5") -> dict:
    """Stage ``after``'s step against stage ``before``'s on the same inputs and caches, the choices of
    ``before`` replayed in ``after``: the logits' relative error and its bound. The caches are restored
    after each step, so both read the same and the model is left as it was."""
    s0, s1 = stage_by_name(before), stage_by_name(after)
    if s0.max_context != s1.max_context:
        raise ValueError(f"{before} and {after} serve different contexts: no common inputs")
    inp = model.inputs(B, s0.max_context)
    model.check(inp)
    saved = _cache_state(model)
    sel = FixedSelection()
    model.selection = sel
    try:
        ref = model.step(inp, s0)
        _restore(model, saved)
        sel.replaying = True
        got = model.step(inp, s1)
    finally:
        model.selection = None
        _restore(model, saved)
    layers = len(model.caches)
    return dict(before=before, after=after, B=B, rel_err=rel_err(got.float(), ref.float()),
                tolerance=tolerance(layers), layers=layers, finite=bool(torch.isfinite(got).all()),
                choices_fixed={k: len(v) for k, v in sel.recorded.items()})
