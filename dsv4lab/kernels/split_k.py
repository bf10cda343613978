"""Stage 3, split-K: more programs for small batches, merged by log-sum-exp.

At batch 1 the head-batched grid has B * H / BLOCK_H programs (1 for H=64,
BLOCK_H=64) on a chip with 132 SMs. Split the top-k row into NSPLIT slices:
each program runs the stage-2 kernel body on its slice and writes a partial
(o_i in bf16 on the GPU, fp32 in the interpreter; lse_i fp32); a combine kernel merges them (or, with
merge="fused", the last slice of each row to finish, in the same launch):

    lse = log(sum_i exp(lse_i)),   o = sum_i exp(lse_i - lse) * o_i

Slices with no valid token have lse_i = -inf and weigh 0; a row with none at all
gives o = 0, lse = -inf; the sink is applied once, after the merge.
NSPLIT depends only on (B, H, K) and the SM count, never on data, and the
workspace is allocated once per shape, so both launches capture in a CUDA graph.

``auto`` picks, per shape, a tile entry (64 heads: fewest bytes and instructions per
token; 16 heads: 4x the programs) and an NSPLIT (1 = the stage-2 launch alone), by
the time model in :func:`plans`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..api import register
from . import common, head_batched
from ..device import is_interpret
from .common import alloc, finish, merge_chunk, merge_partials, out_dtype, trace_point, use_pdl

MAX_SPLIT = 16
#: the merge's cost beyond TileConfig.merge_us (fitted per config to the B=1 rows of the
#: NSPLIT sweep): the partials written and read back, us per MB. Fitted by hand to
#: the B=16..64 rows of the H200 sweep with a combine launch (data/runs/h200/split.json).
PARTIAL_US_PER_MB = 0.35     # (merge_us, fitted at B=1, already holds B=1's partials: <= 0.35 us counted twice)


@dataclass(frozen=True)
class Plan:
    """What ``auto`` launches for one shape, and the time the model expects."""
    use: str            # "mma" (one launch, no merge) or "split" (NSPLIT slices + merge)
    cfg: object         # head_batched.TileConfig
    nsplit: int
    programs: int
    waves: int
    tiles_per_program: int
    model_us: float


def plans(B: int, H: int, K: int, *, sms: int | None = None, mma_cfg=None, split_cfg=None,
          partials: torch.dtype | None = None) -> list[Plan]:
    """Every candidate launch, with its modeled time

        head_batched.model_us (fixed + waves x tiles per program x us per tile)
        + [NSPLIT > 1] (cfg.merge_us + PARTIAL_US_PER_MB x MB of partials, partials_dtype())

    over both tile entries of the table (64-head "mma", 16-head "split") and every
    NSPLIT that leaves no slice empty. Programs of one wave run side by side; the
    per-tile and fixed figures are measured (TileConfig). ``partials``: the dtype whose bytes
    are charged (default partials_dtype(): what this process would launch)."""
    nbytes = (partials or partials_dtype()).itemsize
    out = []
    cfgs = [mma_cfg or head_batched.tile_config(H), split_cfg or head_batched.tile_config(H, split=True)]
    for cfg in dict.fromkeys(cfgs):               # the two entries may be the same config
        tiles = triton.cdiv(K, cfg.block_n)
        for n in range(1, min(MAX_SPLIT, tiles) + 1):
            if triton.cdiv(tiles, triton.cdiv(tiles, n)) != n:
                continue                              # would leave an empty trailing slice
            progs, waves, per, t = head_batched.model_us(cfg, B, H, K, n, sms)
            if n > 1:
                t += cfg.merge_us + PARTIAL_US_PER_MB * B * H * n * 512 * nbytes / 1e6
            out.append(Plan("split" if n > 1 else "mma", cfg, n, progs, waves, per, t))
    return out


def choose(B: int, H: int, K: int, *, sms: int | None = None) -> Plan:
    """The modeled-fastest plan; depends on shapes only, so it is fixed per batch size
    and a CUDA graph captured for that size replays the same launches."""
    return min(plans(B, H, K, sms=sms), key=lambda p: (p.model_us, p.nsplit))


@triton.jit
def _combine_kernel(O_PART, LSE_PART, SINK, O, LSE, H, NSPLIT,
                    stride_pb, stride_ph, stride_ps, stride_ob, stride_oh,
                    HAS_SINK: tl.constexpr, SPLIT_P2: tl.constexpr, D: tl.constexpr,
                    HEADS: tl.constexpr = 1, DCHUNK: tl.constexpr = 512, USE_GDC: tl.constexpr = False,
                    TRACE=None):
    """The merge as its own launch: program (b, j) merges heads j*HEADS .. j*HEADS+HEADS-1 of
    batch row b (common.merge_partials, the same code as the fused merge)."""
    if TRACE is not None:
        trace_point(TRACE, 0)
    if USE_GDC:
        tl.extra.cuda.gdc_wait()      # launched early (PDL): wait until the partials are written
    b = tl.program_id(0)
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    merge_partials(O_PART, LSE_PART, SINK, O, LSE, b, heads, heads < H, H, NSPLIT,
                   stride_pb, stride_ph, stride_ps, stride_ob, stride_oh, HAS_SINK, SPLIT_P2, DCHUNK, D)
    if TRACE is not None:
        trace_point(TRACE, 2, tl.load(LSE + b * H + heads, mask=heads < H, other=0.0))   # after the stores


#: the combine launch's shape: heads per program and warps for fp32 partials (a program holds
#: HEADS x NSPLIT x DCHUNK values at a time, DCHUNK sized to ~128 bytes of them per thread)
COMBINE_HEADS = 1
COMBINE_WARPS = 4


def combine_warps(partials: torch.dtype) -> int:
    """Warps of the combine launch for partials of this dtype: COMBINE_WARPS for fp32, half for
    bf16. Triton loads 16 bytes a thread, so 4 warps cover a 512-wide fp32 row but two bf16
    rows; the sum over slices then crosses warps (shared memory and 9 barriers per program in
    the SASS) instead of staying in each thread's registers. 2 warps keep bf16 in-thread (with a
    column chunk of 512: combine() never takes less for one head a program)."""
    return max(1, COMBINE_WARPS * partials.itemsize // 4)


def combine(o_part, lse_part, attn_sink, out, lse, *, heads=None, num_warps=None, trace=None, **pdl):
    B, H, nsplit, D = o_part.shape
    heads = heads or COMBINE_HEADS
    num_warps = num_warps or combine_warps(o_part.dtype)
    split_p2 = triton.next_power_of_2(nsplit)
    vec = 16 // o_part.element_size()              # elements a thread loads at once
    # a slice's chunk spans every thread, so the sum over slices stays in registers (not shared memory)
    dchunk = max(merge_chunk(heads, split_p2, num_warps, D, per_thread=128 // o_part.element_size()),
                 min(D, 32 * num_warps * vec // heads))
    _combine_kernel[(B, triton.cdiv(H, heads))](
        o_part, lse_part, attn_sink if attn_sink is not None else lse, out, lse, H, nsplit,
        o_part.stride(0), o_part.stride(1), o_part.stride(2), out.stride(0), out.stride(1),
        HAS_SINK=attn_sink is not None, SPLIT_P2=split_p2, D=D, HEADS=heads, DCHUNK=dchunk,
        num_warps=num_warps, TRACE=trace, **pdl)


def pdl_kwargs(programs: int | None = None) -> dict:
    """Launch options for the combine kernel after a split launch of ``programs`` programs: PDL
    where the GPU has it (common.use_pdl) and PDL says so. "auto" (default): only when the split
    grid leaves at least half the SMs idle, where the combine's programs, launched early, wait
    on SMs nobody else needs; on a fuller grid they sit beside split programs and the pair was
    slower. Measured (graph replay, H200, us, off -> on): B=1 13.8 -> 13.0 (32 split programs),
    B=2 13.6 -> 13.4 (64), B=4 14.2 -> 15.0 (128; ab_layers.json); B=8 18.7 -> 19.1 (pdl_on/)."""
    on = PDL == "1" or (PDL == "auto" and programs is not None and 2 * programs <= head_batched.sm_count())
    return dict(USE_GDC=True, launch_pdl=True) if on and use_pdl() else {}


#: programmatic dependent launch of the combine kernel (env DSV4LAB_PDL): "auto" (pdl_kwargs'
#: rule), "1" always, "0" never
PDL = os.environ.get("DSV4LAB_PDL") or "auto"
if PDL not in ("auto", "0", "1"):
    raise ValueError(f"DSV4LAB_PDL must be 'auto', '0' or '1', got {PDL!r}")
#: "launch": a combine kernel merges (default); "fused": the last slice of each row merges
#: inside the split launch. With fp32 partials fused was slower on the H200 at all but one
#: launch shape, where it tied (B=1 13.6 -> 16.5 us, B=32 32.7 -> 38.3;
#: data/runs/h200/ab_merge.json): one SM reads all NSPLIT partials of its row (up to 1 MB)
#: where the combine kernel spreads the merge over B x H programs. "coop": the slices of a row
#: meet at a barrier and each merges a share of the columns (head_batched; only where every
#: program is resident, else this default falls back to "launch"): per call in an 8-call graph
#: at B=1 11.2 us against the combine launch's 9.4 (ab_coop.json; as a cooperative launch 11.1
#: against 9.2, ab_coop_cooperative.json): the barrier's release and polling through L2 cost
#: more than a PDL launch's wait.
MERGE = os.environ.get("DSV4LAB_MERGE", "launch")
MERGES = ("launch", "fused", "coop")
if MERGE not in MERGES:
    raise ValueError(f"DSV4LAB_MERGE must be one of {MERGES}, got {MERGE!r}")
_WORKSPACE: dict = {}


#: dtype of the partial outputs o_i on the GPU (env DSV4LAB_PARTIALS). bf16: half the bytes
#: written and read back, one more rounding (out error 2.1e-3 -> 2.6e-3 against the float64
#: reference, bound 5e-3); with the combine at 2 warps (combine_warps) it was faster at every B
#: measured: B=1 14.1 -> 13.6 us, B=32 29.9 -> 27.3, B=64 43.5 -> 42.9 (data/runs/h200/ab_partials2.json).
PARTIALS = os.environ.get("DSV4LAB_PARTIALS", "bfloat16")
if PARTIALS not in ("float32", "bfloat16"):
    raise ValueError(f"DSV4LAB_PARTIALS must be 'float32' or 'bfloat16', got {PARTIALS!r}")


def partials_dtype() -> torch.dtype:
    """PARTIALS on the GPU; fp32 in the interpreter, whose fp32->bf16 casts truncate
    (twice the GPU's rounding error, see common.out_dtype)."""
    return torch.float32 if is_interpret() else getattr(torch, PARTIALS)


def workspace(B, H, nsplit, device, partials=torch.float32):
    """Partials (o [B,H,NSPLIT,512] in ``partials``, lse [B,H,NSPLIT] fp32) and the in-launch
    merges' barrier words (int32 [2*B*H], zero: per (batch, head block) an arrival count, which
    each launch leaves at zero, and the cooperative merge's generation word, which only grows),
    allocated once per shape. One workspace per shape: two split-K calls of one shape must not
    run concurrently."""
    key = (str(device), B, H, nsplit, partials)
    if key not in _WORKSPACE:
        _WORKSPACE[key] = (torch.empty(B, H, nsplit, 512, dtype=partials, device=device),
                           torch.empty(B, H, nsplit, dtype=torch.float32, device=device),
                           torch.zeros(2 * B * H, dtype=torch.int32, device=device))
    return _WORKSPACE[key]


def sparse_decode_split(q, cache, indices, *, topk_len, sm_scale, attn_sink, nsplit, cfg, merge=None,
                        partials=None, pdl_in=False):
    """The head-batched kernel body on ``nsplit`` slices of each top-k row, then the merge.
    With nsplit == 1 the kernel writes the answer directly (no workspace, no combine).
    ``merge``: "launch" (a second, combine kernel), "fused" (the last slice of each row merges,
    one launch) or "coop" (every slice merges a share after a barrier, one launch; needs
    head_batched.coop_fits); default MERGE (env DSV4LAB_MERGE). ``partials``: the dtype
    of the partial outputs, default partials_dtype() (bf16 halves fp32's bytes for one more rounding).
    ``pdl_in``: the first launch is a programmatic dependent launch of whatever precedes it on
    the stream (head_batched.launch; measured 0.1-0.3 us less per call in a graph of 8 calls,
    for mma as for split-K, ab_coop.json)."""
    B, H, D = q.shape
    q = q.contiguous()
    indices = indices.contiguous()
    out = alloc((B, H, D), out_dtype(), q.device)
    lse = alloc((B, H), torch.float32, q.device)
    if nsplit == 1:
        head_batched.launch(q, cache, indices, topk_len, sm_scale, attn_sink, out, lse, cfg=cfg, pdl_in=pdl_in)
        return finish(out), lse
    o_part, lse_part, counters = workspace(B, H, nsplit, q.device, partials or partials_dtype())
    if common._POISON[0]:
        o_part.fill_(float("nan"))
        lse_part.fill_(float("nan"))
    if merge is None:
        merge = MERGE
        if merge == "coop" and not head_batched.coop_fits(B, H, nsplit, cfg):
            merge = "launch"          # the env's choice where it can run; an explicit merge="coop" raises
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {MERGES}, got {merge!r}")
    if merge != "launch":
        head_batched.launch(q, cache, indices, topk_len, sm_scale, attn_sink, o_part, lse_part,
                            nsplit=nsplit, cfg=cfg, merge_into=(out, lse, counters), merge=merge, pdl_in=pdl_in)
        return finish(out), lse
    pdl = pdl_kwargs(B * triton.cdiv(H, cfg.block_h) * nsplit)
    head_batched.launch(q, cache, indices, topk_len, sm_scale, None, o_part, lse_part,
                        nsplit=nsplit, cfg=cfg, pdl=bool(pdl), pdl_in=pdl_in)
    combine(o_part, lse_part, attn_sink, out, lse, **pdl)
    return finish(out), lse


def choose_split(B: int, H: int, K: int, *, sms: int | None = None) -> Plan:
    """The modeled-fastest plan with at least 2 slices (when K allows): ``splitk``'s launch."""
    every = plans(B, H, K, sms=sms)
    split = [p for p in every if p.nsplit >= 2] or every      # K of a single tile cannot split
    return min(split, key=lambda p: (p.model_us, p.nsplit))


@register("sparse_decode", "splitk")
def sparse_decode_splitk(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    """Always split (at least 2 slices, when K allows), so this impl always exercises the
    merge path; tiles and NSPLIT from the same model as auto."""
    plan = choose_split(q.shape[0], q.shape[1], indices.shape[1])
    return sparse_decode_split(q, cache, indices, topk_len=topk_len, sm_scale=sm_scale,
                               attn_sink=attn_sink, nsplit=plan.nsplit, cfg=plan.cfg)


def _limit(plan):
    return head_batched.max_scale_byte(plan.cfg, plan.nsplit)


sparse_decode_splitk.max_scale_byte = lambda B, H, K: _limit(choose_split(B, H, K))


@register("sparse_decode", "auto")
def sparse_decode_auto(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    """The plan with the smallest modeled time (see plans()): either tile entry, NSPLIT >= 1."""
    plan = choose(q.shape[0], q.shape[1], indices.shape[1])
    return sparse_decode_split(q, cache, indices, topk_len=topk_len, sm_scale=sm_scale,
                               attn_sink=attn_sink, nsplit=plan.nsplit, cfg=plan.cfg)


sparse_decode_auto.max_scale_byte = lambda B, H, K: _limit(choose(B, H, K))
