"""impl "auto": the fastest decode kernel this process can run for a shape.

* ``hopper`` (the Gluon kernel, beyond the story) on an sm_90 GPU with Triton's Gluon, from
  ``HOPPER_FROM_PROGRAMS`` programs of 64 heads on (B x ceil(H / 64): B >= 8 at DSv4's 64 heads)
  when each request attends to K >= 512 tokens. There it measured 1.03x (B = 8) to 1.23x
  (B = 128) the best of ``splitk_auto`` and ``mma`` in the same run; below it, 0.74-0.83x (B = 1-4:
  its program is a chain of fixed latencies; experiments/hopper_decode, runs 4 and 5). With fewer
  tokens a program those fixed latencies weigh more: at K = 128 (SGLang's window call) it lost to
  ``splitk_auto`` up to B = 32 (0.71-0.84x) and won from B = 64 (1.06x, 1.17x at B = 128;
  experiments/hopper_decode, run k128), so for 128 <= K < 512 it runs from
  ``HOPPER_FROM_PROGRAMS_SHORT_K`` programs, and below K = 128 never. Measured: K = 512 and 128 at
  64 heads; K between them, above 512, or 128 heads follow the rule unmeasured. Below 64 heads
  it would pad its 64-row wgmma tile.
* ``splitk_auto`` everywhere else: the replay's S2 kernel with tiles and NSPLIT from the
  launch-time model (split_k.py), which Triton's interpreter also runs on a CPU.

The choice depends on the shape and the device only, so a captured CUDA graph replays one kernel.
"""
from __future__ import annotations

import functools

from ...registry import register
from . import head_batched, hopper, split_k

#: programs of 64 heads (B x ceil(H / 64)) from which the Hopper kernel is the faster one at K >= 512:
#: B = 8 at 64 heads, the smallest batch where it measured ahead (experiments/hopper_decode, runs 4 and 5)
HOPPER_FROM_PROGRAMS = 8
#: the same for 128 <= K < 512: B = 64 at 64 heads (K = 128: experiments/hopper_decode, run k128)
HOPPER_FROM_PROGRAMS_SHORT_K = 64


def hopper_here() -> bool:
    """Whether this process can run the Hopper kernel."""
    return hopper.unavailable_reason() is None


def on_hopper(B: int, H: int, K: int = 512) -> str:
    """The impl ``auto`` runs for B requests of H heads attending to K tokens each (DSv4's
    compressed top-k, 512, unless given) on an sm_90 GPU with Gluon."""
    if H < hopper.BLOCK_H or K < 128:
        return "splitk_auto"
    least = HOPPER_FROM_PROGRAMS if K >= 512 else HOPPER_FROM_PROGRAMS_SHORT_K
    return "hopper" if B * -(-H // hopper.BLOCK_H) >= least else "splitk_auto"


@functools.lru_cache(maxsize=1024)
def picks_hopper(B: int, H: int, K: int) -> bool:
    """Whether ``auto`` runs the Hopper kernel for the shape in this process."""
    return on_hopper(B, H, K) == "hopper" and hopper_here()


def chosen(B: int, H: int, K: int) -> str:
    """The impl ``auto`` runs for the shape in this process: "hopper" or "splitk_auto"."""
    return "hopper" if picks_hopper(B, H, K) else "splitk_auto"


def _max_scale_byte(B, H, K):
    return hopper.MAX_SCALE_BYTE if picks_hopper(B, H, K) else head_batched.max_scale_byte(split_k.auto_launch(B, H, K))


@register("sparse_decode", "auto", tags=("recorded", "tensor_core"), dispatch=chosen, max_scale_byte=_max_scale_byte,
          description="the fastest here: hopper on sm_90 from 8 programs of 64 heads (64 below K = 512), "
                      "else splitk_auto")
def sparse_decode_auto(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    fn = hopper.sparse_decode_hopper if picks_hopper(q.shape[0], q.shape[1], indices.shape[-1]) \
        else split_k.sparse_decode_splitk_auto
    return fn(q, cache, indices, topk_len=topk_len, sm_scale=sm_scale, attn_sink=attn_sink)
