"""One way to judge a kernel: fresh random inputs, poisoned outputs, relative error.

``rel_err(out, ref) = ||out - ref|| / ||ref||`` over finite reference entries;
NaN anywhere in ``out`` never passes. Tolerances (why):

* out <= 5e-3: bf16 output rounding alone is ~1.6e-3 and P is rounded to bf16
  before the PV product, another ~1e-3; 5e-3 leaves room for that, not for a bug
  (a dropped token or a wrong scale costs >= 1e-2 at these sizes).
* lse <= 1e-3 on finite entries: lse is accumulated in fp32.
* mma vs simt <= 6.7e-3: the story's published bound between the two kernels.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .cache import pack_kv
from .device import torch_device

OUT_TOL = 5e-3
LSE_TOL = 1e-3
VS_SIMT_TOL = 6.7e-3


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 over entries where ref is finite; inf if out has NaN
    or disagrees with ref on which entries are finite."""
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any():
        return float("inf")
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(out)) or not torch.equal(out[~fin], ref[~fin]):
        return float("inf")
    num = (out[fin] - ref[fin]).norm()
    den = ref[fin].norm()
    if den == 0:
        return float(num)
    return float(num / den)


@contextlib.contextmanager
def poisoned():
    """Kernel outputs come pre-filled with NaN inside this block (see kernels.common.alloc)."""
    from .kernels import common
    old = common._POISON[0]
    common._POISON[0] = True
    try:
        yield
    finally:
        common._POISON[0] = old


@dataclass
class DecodeInputs:
    q: torch.Tensor
    cache: object
    indices: torch.Tensor
    topk_len: torch.Tensor | None = None
    attn_sink: torch.Tensor | None = None

    def kwargs(self):
        return dict(topk_len=self.topk_len, attn_sink=self.attn_sink)


def make_decode_inputs(B, H, K, *, context=None, page_size=64, seed=None, device=None,
                       pad_frac=0.0, topk_len=False, sink=False, kv_scale=1.0) -> DecodeInputs:
    """Random decode inputs in the campaign's setting: request b owns tokens
    [b*context, (b+1)*context) of one paged cache and attends to K distinct of them.
    ``pad_frac`` of the index entries become -1 at random places; ``topk_len`` draws a
    valid length per row in [0, K]; ``sink`` draws an attention sink per head."""
    device = device or torch_device()
    g = torch.Generator(device="cpu")
    g.manual_seed(torch.seed() if seed is None else seed)
    context = context or max(K, 1)
    n = B * context
    kv = (torch.randn(n, 512, generator=g) * kv_scale).to(device)
    cache = pack_kv(kv, page_size)
    del kv
    q = torch.randn(B, H, 512, generator=g).to(torch.bfloat16).to(device)
    kk = min(K, context)
    pick = torch.rand(B, context, generator=g).argsort(dim=1)[:, :kk]
    idx = pick + torch.arange(B)[:, None] * context
    if kk < K:
        idx = torch.cat([idx, torch.full((B, K - kk), -1)], dim=1)
    if pad_frac:
        idx = torch.where(torch.rand(B, K, generator=g) < pad_frac, torch.full_like(idx, -1), idx)
    tl_ = torch.randint(0, K + 1, (B,), generator=g, dtype=torch.int32).to(device) if topk_len else None
    sk = (torch.randn(H, generator=g) * 2).to(device) if sink else None
    return DecodeInputs(q, cache, idx.to(torch.int32).to(device), tl_, sk)


def check_decode(impl: str, inp: DecodeInputs, *, against: str = "reference"):
    """Run ``impl`` on poisoned outputs; return (out rel. error, lse rel. error) vs ``against``."""
    from . import api, reference
    with poisoned():
        out, lse = api.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs())
    if against == "reference":
        ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, **inp.kwargs())
    else:
        ro, rl = api.sparse_decode(inp.q, inp.cache, inp.indices, impl=against, **inp.kwargs())
    return rel_err(out.float(), ro.float()), rel_err(lse, rl)
