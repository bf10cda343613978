"""S5, after the story: the decode step with its glue fused into Triton kernels (kernels/step/), the
decode and indexer kernels S4's. A layer runs as ~30 launches where S4 runs ~190:

    mHC pre            3  partial pre-linear; Sinkhorn (one warp); combine + RMS norm  mhc_fused.mhc_pre
    input projection   1  one GEMM: q LoRA | kv | compressor | indexer weights | indexer compressor
                       1  q LoRA norm; kv norm, rope, fp8 bytes into the window cache; state rings  attn_input
    query              1  one GEMM: the heads' q | the indexer's q
                       1-2 heads' norm + rope into the padded query; the indexer's rope          norm_rope
    indexer (ratio 4)  S4's kernels, then 1 to map its top-k to cache token ids                 cache_ids
    decode             S4's kernels per cache, then 1: merge, sink, inverse rope                 decode_epilogue
    output             2 GEMMs (wo_a, wo_b)
    mHC post           1                                                                        mhc_fused.mhc_post
    MoE                1 GEMM router | shared up; 1 router; 1 shared SiLU; 1 GEMM shared down;
                       up (gather + SiLU; K split over programs, + 1 reduce, when few experts
                       are hit), down (router weight), sum with the shared expert              moe_fused
The weights are S4's: the concatenated projections are one tensor whose slices are S4's weights
(LayerWeights), so S4 and S5 read the same bytes. ``Model.step`` calls :func:`layer` and :func:`head`
when ``stage.glue == "fused"``.

Each fusion can be switched off (``model.fusions``, a subset of :data:`FUSIONS`): a part whose name is
left out runs S4's torch ops for it, the Model's own (``Model.mhc_pre``, ``attn_input``, ``query``,
``cache_ids``, ``decode_out``, ``router``, ``experts``), GEMMs included; with every fusion off, S5's
step is S4's op for op. A fused part that shares a GEMM with its neighbour (the router's with the
shared expert's up projection) keeps that GEMM, the neighbour reading its slice.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from .config import HEAD_DIM
from .kernels.decode.planning import sm_count
from .kernels.step.attn_input import attn_input
from .kernels.step.cache_ids import cache_ids
from .kernels.step.decode_epilogue import decode_epilogue
from .kernels.step.mhc_fused import mhc_head_pre, mhc_post, mhc_pre
from .kernels.step.moe_fused import moe_combine, moe_routed, silu_mul
from .kernels.step.norm_rope import norm_rope, norm_rope_new
from .kernels.step.router import route
from .merged_decode import sparse_decode_per_cache
from .model_config import FULL_PAGE


#: the glue fusions, in step order: S5 runs those in ``model.fusions`` (all by default), S4's ops for the rest
FUSIONS = ("mhc", "attn_input", "norm_rope", "cache_ids", "decode_epilogue", "router", "moe")


def layer(model, h, lw, c, inp, stage):
    cfg, on = model.cfg, model.fusions
    if "mhc" not in on:
        y, post, comb = model.mhc_pre(h, lw, "attn", stage)
        h = model.mhc_post(attention(model, y, lw, c, inp, stage), h, post, comb)
        y, post, comb = model.mhc_pre(h, lw, "ffn", stage)
        return model.mhc_post(moe(model, y, lw, inp), h, post, comb)
    with record_function("dsv4::glue[mhc]"):
        y, post, comb = mhc_pre(h, lw.hc_fn("attn", stage.mhc_dtype), lw.hc_attn_scale, lw.hc_attn_base,
                                lw.attn_norm, cfg.sinkhorn_iters, cfg.hc_eps, cfg.rms_eps)
    o = attention(model, y, lw, c, inp, stage)
    with record_function("dsv4::glue[mhc]"):
        h = mhc_post(o, h, post, comb)
        y, post, comb = mhc_pre(h, lw.hc_fn("ffn", stage.mhc_dtype), lw.hc_ffn_scale, lw.hc_ffn_base,
                                lw.ffn_norm, cfg.sinkhorn_iters, cfg.hc_eps, cfg.rms_eps)
    o = moe(model, y, lw, inp)
    with record_function("dsv4::glue[mhc]"):
        return mhc_post(o, h, post, comb)


def attention(model, y, lw, c, inp, stage):
    cfg, B, on = model.cfg, inp.B, model.fusions
    cos, sin = model.rope_tables(c, inp)
    ring = inp.ring_pos[cfg.ring_c4 if c.ratio == 4 else cfg.ring_c128]
    if "attn_input" not in on:
        q_lora, idx_w = model.attn_input(y, lw, c, inp, cos, sin)
    else:
        with record_function("dsv4::attn_proj"):
            p = F.linear(y, lw.w_y)
        with record_function("dsv4::glue[attn_input]"):
            q_lora, idx_w = attn_input(
                p, lw.q_norm, lw.kv_norm, cos, sin, c.window.buffer.view(-1), inp.window_data_off,
                inp.window_scale_off, q_lora=cfg.q_lora_rank, eps=cfg.rms_eps,
                state=c.state if c.ratio else None, ring=ring if c.ratio else None,
                index_state=c.index_state if c.ratio == 4 else None, index_ring=ring if c.ratio == 4 else None,
                index_heads=cfg.index_heads if c.ratio == 4 else 0,
                index_scale=cfg.index_dim ** -0.5 * cfg.index_heads ** -0.5)
    if "norm_rope" not in on:
        qi = model.query(q_lora, lw, c, inp, cos, sin)
    else:
        with record_function("dsv4::attn_proj"):
            q = F.linear(q_lora, lw.w_q)
        heads_w = cfg.local_heads * cfg.head_dim
        with record_function("dsv4::glue[norm_rope]"):
            norm_rope(q[:, :heads_w].view(B, cfg.local_heads, cfg.head_dim), inp.q_pad[:, :cfg.local_heads],
                      cos=cos, sin=sin, eps=cfg.rms_eps)
            qi = (norm_rope_new(q[:, heads_w:].view(B, cfg.index_heads, cfg.index_dim), cos=cos, sin=sin, norm=False)
                  if c.ratio == 4 else None)
    ids = None
    if c.ratio == 4:
        with record_function(f"dsv4::indexer[{stage.indexer_impl}]"):
            top = model.indexer_topk(qi, c, idx_w, inp, stage)
        if "cache_ids" not in on:
            ids = model.cache_ids(top, inp)
        else:
            with record_function("dsv4::glue[cache_ids]"):
                ids = cache_ids(top, inp.page_table, FULL_PAGE // 4)
    extra = model.extra_cache(c, inp, ids)
    if "decode_epilogue" not in on:
        return model.decode_out(lw, c, inp, stage, extra, cos, sin)
    with record_function(f"dsv4::decode[{stage.decode_impl},c{c.ratio}]"):
        # the sink is a weight, checked once (Model.check), not on every step: S4's per-step device check
        # is 7 kernels a layer
        parts = sparse_decode_per_cache(inp.q_pad, c.window, inp.window_idx, inp.window_len, None, HEAD_DIM,
                                        cfg.head_dim ** -0.5, **extra, impl=stage.decode_impl, checks="device")
    with record_function("dsv4::glue[decode_epilogue]"):
        o = decode_epilogue(parts, lw.attn_sink, cos, sin, cfg.local_heads)
    with record_function("dsv4::attn_proj"):
        if cfg.local_groups == 1:
            o = F.linear(o.view(B, -1), lw.wo_a[0])
        else:
            o = torch.einsum("bgd,grd->bgr", o.view(B, cfg.local_groups, -1), lw.wo_a).flatten(1)
        return F.linear(o, lw.wo_b)


def moe(model, y, lw, inp):
    cfg, on = model.cfg, model.fusions
    shared_up = None
    if "router" not in on:
        _, topw = model.router(y, lw)
    else:
        with record_function("dsv4::moe_router"):
            g = F.linear(y, lw.w_g)                                   # router logits | shared expert's up
        shared_up = g[:, cfg.experts:]
        with record_function("dsv4::glue[router]"):
            fixed = model.fixed("route")
            ids, topw = route(g[:, :cfg.experts], lw.gate_bias, cfg.active_experts, cfg.routed_scale, ids=fixed)
            model.seen("route", ids)
    if "moe" not in on:
        return model.experts(y, lw, inp, topw, shared_up)
    with record_function("dsv4::moe_shared"):
        up = F.linear(y, lw.shared_w13) if shared_up is None else shared_up
        shared = F.linear(silu_mul(up), lw.shared_w2)
    with record_function("dsv4::moe_experts"):
        yd = moe_routed(y, inp.moe_tok, inp.moe_col, inp.moe_valid, lw.w13, lw.w2, topw, sm_count())
    with record_function("dsv4::glue[moe_sum]"):
        return moe_combine(yd, inp.moe_rows, shared)


def head(model, h, stage):
    if "mhc" not in model.fusions:
        return model.head(h, stage)
    with record_function("dsv4::head"):
        cfg = model.cfg
        y = mhc_head_pre(h, model.hc_head_fn[stage.mhc_gemm], model.hc_head_scale, model.hc_head_base,
                         model.head_norm, cfg.hc_eps, cfg.rms_eps)
        return F.linear(y, model.lm_head).float()
