"""Each glue op of the step three ways, per batch: S4's torch ops, the same function through torch.compile
(Inductor, default mode, called inside a CUDA graph as the captured step would), and S5's fused Triton
kernel. Which wins per op, and by how much.

    python experiments/s5_fused_glue/per_op.py OUT.json [--batches 1 64] [--cpu-smoke]

One layer of each kind of DeepSeek-V4-Flash's share (layers 1 / 1 / 1, the real widths); the inputs of
each op built as the step builds them. Checks first: every output of the fused and the compiled function
against S4's (the largest relative error; S5's within OUT_TOL, its outputs poisoned first), and what an
op writes into the caches (attn_input: the new token's fp8 bytes and scales, the state rings) cleared
before each variant and compared with S4's bytes. The device kernels of one call are counted
(profile.device_kernel_count). The compiled function's first call (Inductor's compile) is timed apart; a
second compiled variant rounds its intermediates to bf16 as eager does (Inductor's
emulate_precision_casts). Then graph-replay times (do_bench median), the variants interleaved, the best of
three passes. --cpu-smoke: the CPU preset, no
torch.compile (Inductor on a CPU needs a C++ toolchain and minutes a function) and no times.
"""
from dataclasses import replace

import sys
import time
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)
import torch
import torch.nn.functional as F

from dsv4lab import step_glue
from dsv4lab.kernels.decode.planning import sm_count
from dsv4lab.kernels.step import attn_input, decode_epilogue, mhc, mhc_fused, moe, moe_fused, router
from dsv4lab.merged_decode import apply_sink, merge_by_lse
from dsv4lab.model import CPU_MODEL, DSV4_FLASH_TP8, Model
from dsv4lab.stages import stage
from dsv4lab.profile import device_kernel_count
from dsv4lab.testing import OUT_TOL, poisoned, rel_err
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "s5_fused_glue"


def ops(m: Model, B: int) -> dict:
    """op -> (S4's torch function, S5's fused function, the arguments both take, what the op writes into
    the caches: a function returning those tensors, and one clearing them; None for the others)."""
    cfg, S4 = m.cfg, stage("S4")
    i4 = m.ratios.index(4)
    lw, c = m.weights[i4], m.caches[i4]
    inp = m.inputs(B)
    g = torch.Generator(device=m.device).manual_seed(B)
    bf = torch.bfloat16
    rnd = lambda *s: torch.randn(*s, generator=g, device=m.device).to(bf)  # noqa: E731
    n, D, eps = cfg.hc_mult, cfg.hidden, cfg.rms_eps
    h, o = rnd(B, n, D), rnd(B, D)
    hc = lw.hc_fn("attn", S4.mhc_dtype)

    def mhc_pre_torch(h):
        x, mixes = m.mhc_pre_linear(h, hc, S4)
        pre, post, comb = mhc.mhc_sinkhorn(mixes, lw.hc_attn_scale, lw.hc_attn_base, n, cfg.sinkhorn_iters, cfg.hc_eps)
        return step_glue.rms_norm(step_glue.mhc_combine(x, pre, n, h.dtype), lw.attn_norm, eps), post, comb

    def mhc_pre_fused(h):
        return mhc_fused.mhc_pre(h, hc, lw.hc_attn_scale, lw.hc_attn_base, lw.attn_norm, cfg.sinkhorn_iters,
                                 cfg.hc_eps, eps)
    _, post, comb = mhc_pre_torch(h)
    cos, sin = inp.cos[cfg.compress_rope_theta], inp.sin[cfg.compress_rope_theta]
    ring = inp.ring_pos[cfg.ring_c4]
    p = F.linear(rnd(B, D), lw.w_y)
    flat = c.window.buffer.view(-1)
    q0, sw = cfg.q_lora_rank, c.state.shape[2]
    scale = cfg.index_dim ** -0.5 * cfg.index_heads ** -0.5
    rows = torch.arange(B, device=m.device)

    def attn_input_torch(p):
        q_lora = step_glue.rms_norm(p[:, :q0], lw.q_norm, eps)
        kv = step_glue.rope(step_glue.rms_norm(p[:, q0:q0 + 512], lw.kv_norm, eps), cos, sin)
        data, scales = step_glue.kv_cache_bytes(kv)
        flat[inp.window_data_off] = data
        flat[inp.window_scale_off] = scales
        col = q0 + 512
        c.state[rows, ring] = p[:, col:col + sw].float()
        w = p[:, col + sw:col + sw + cfg.index_heads].float() * scale
        c.index_state[rows, ring] = p[:, col + sw + cfg.index_heads:].float()
        return q_lora, w

    def attn_input_fused(p):
        return attn_input.attn_input(p, lw.q_norm, lw.kv_norm, cos, sin, flat, inp.window_data_off,
                                     inp.window_scale_off, q_lora=q0, eps=eps, state=c.state, ring=ring,
                                     index_state=c.index_state, index_ring=ring, index_heads=cfg.index_heads,
                                     index_scale=scale)

    def cache_written():
        return (flat[inp.window_data_off], flat[inp.window_scale_off], c.state[rows, ring], c.index_state[rows, ring])

    def cache_clear():
        flat[inp.window_data_off] = 0
        flat[inp.window_scale_off] = 0
        c.state[rows, ring] = float("nan")
        c.index_state[rows, ring] = float("nan")
    H, heads = cfg.kernel_heads, cfg.local_heads
    o1, o2 = rnd(B, H, 512), rnd(B, H, 512)
    l1 = torch.randn(B, H, generator=g, device=m.device)
    l2 = torch.randn(B, H, generator=g, device=m.device)

    def epilogue_torch(o1, l1, o2, l2):
        out, lse = merge_by_lse(o1, l1, o2, l2)
        out, _ = apply_sink(out, lse, lw.attn_sink)
        return step_glue.rope(out.to(bf)[:, :heads], cos, sin, inverse=True)

    def epilogue_fused(o1, l1, o2, l2):
        return decode_epilogue.decode_epilogue([(o1, l1), (o2, l2)], lw.attn_sink, cos, sin, heads)
    logits = F.linear(rnd(B, D), lw.gate)
    k, rs = cfg.active_experts, cfg.routed_scale
    y = rnd(B, D)
    _, topw = step_glue.route(logits.float(), lw.gate_bias, k, rs)
    shared = F.linear(step_glue.silu_mul(F.linear(y, lw.shared_w13)), lw.shared_w2)

    def moe_torch(y, topw, shared):
        xd = y[inp.moe_tok]
        hmid = step_glue.silu_mul(moe.moe_grouped_gemm(xd, lw.w13)).to(bf)
        yd = moe.moe_grouped_gemm(hmid, lw.w2) * (topw[inp.moe_tok, inp.moe_col] * inp.moe_valid).unsqueeze(-1)
        out = torch.zeros(B, D, dtype=torch.float32, device=y.device)
        out.index_add_(0, inp.moe_tok.flatten(), yd.flatten(0, 1))
        return (out + shared.float()).to(bf)

    def moe_fused_(y, topw, shared):
        yd = moe_fused.moe_routed(y, inp.moe_tok, inp.moe_col, inp.moe_valid, lw.w13, lw.w2, topw, sm_count())
        return moe_fused.moe_combine(yd, inp.moe_rows, shared)
    return {
        "mhc_pre": (mhc_pre_torch, mhc_pre_fused, (h,), None),
        "mhc_post": (step_glue.mhc_post, mhc_fused.mhc_post, (o, h, post, comb), None),
        "attn_input": (attn_input_torch, attn_input_fused, (p,), (cache_written, cache_clear)),
        "decode_epilogue": (epilogue_torch, epilogue_fused, (o1, l1, o2, l2), None),
        "router": (lambda x: step_glue.route(x.float(), lw.gate_bias, k, rs)[1],
                   lambda x: router.route(x, lw.gate_bias, k, rs)[1], (logits,), None),
        "moe": (moe_torch, moe_fused_, (y, topw, shared), None),
    }


def _outputs(fn, args, cache) -> tuple:
    """fn's outputs (a tuple; a fused kernel's poisoned first) and, for an op that writes the caches, the
    bytes it wrote (cleared first)."""
    if cache:
        cache[1]()
    with poisoned():
        out = fn(*args)
    out = out if isinstance(out, tuple) else (out,)
    return tuple(t.clone() for t in out), (tuple(t.clone() for t in cache[0]()) if cache else ())


def check(fn, args, cache, ref) -> dict:
    """The largest relative error of fn's outputs against ``ref``'s (inf for a NaN), and how many cache
    bytes differ from those ``ref`` wrote."""
    out, written = _outputs(fn, args, cache)
    res = dict(rel_err_vs_torch=max(rel_err(a.float(), b.float()) for a, b in zip(out, ref[0], strict=True)))
    if cache:
        res["cache_bytes"] = sum(t.numel() * t.element_size() for t in written)
        res["cache_bytes_differ"] = sum(int((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8))
                                            .sum()) for a, b in zip(written, ref[1], strict=True))
    return res


def main(argv=None):
    a = ab.parse_args(__doc__, lambda p: p.add_argument("--batches", type=int, nargs="+", default=[1, 64]), argv)
    cfg = replace(CPU_MODEL if a.smoke else DSV4_FLASH_TP8, layers_window=1, layers_c4=1, layers_c128=1)
    m = Model(cfg)
    rows = []
    for B in ([2] if a.smoke else a.batches):
        for name, (torch_fn, fused_fn, args, cache) in ops(m, B).items():
            variants = {"torch": torch_fn, "fused": fused_fn}
            if not a.smoke:
                variants["compiled"] = torch.compile(torch_fn, mode="default")
                # Inductor keeps a fused op's intermediates in float32 where eager rounds them to bf16;
                # this variant rounds them as eager does (is that why its bytes differ?)
                variants["compiled_eager_rounding"] = torch.compile(   # mode "default" is the options' default
                    torch_fn, options={"emulate_precision_casts": True})
            ref = _outputs(torch_fn, args, cache)
            checked = {}
            for v, fn in variants.items():
                def first_call(fn=fn):
                    t = time.perf_counter()
                    res = check(fn, args, cache, ref)
                    if not a.smoke:
                        torch.cuda.synchronize()
                    return dict(res, first_call_s=round(time.perf_counter() - t, 2),
                                kernels=None if a.smoke else device_kernel_count(lambda: fn(*args)))
                checked[v] = ab.attempt(dict(op=name, B=B, variant=v), first_call, log=None)
            fused = checked["fused"]
            if "error" not in fused:     # S5's kernel: S4's answer within OUT_TOL, S4's cache bytes exactly
                fused["ok"] = fused["rel_err_vs_torch"] <= OUT_TOL and not fused.get("cache_bytes_differ")
            ok = {v: fn for v, fn in variants.items() if "error" not in checked[v]}
            timed = ab.best_of(1 if a.smoke else 3, ok,
                               lambda fn: dict(graph_us=ab.time_us(lambda: fn(*args), a.smoke)))
            for v in variants:
                rows.append({**checked[v], **timed.get(v, {})})
                print(rows[-1], flush=True)
            ab.write(a.out, QUESTION, a.smoke, config=cfg.as_dict(), rows=rows, complete=False)
    ab.write(a.out, QUESTION, a.smoke, config=cfg.as_dict(), rows=rows, complete=True)


if __name__ == "__main__":
    main()
