"""Byte and FLOP counts of each stage and of the whole decode step, and the floors they imply.

A "floor" is the time the work would take at a ceiling: bytes / copy bandwidth
or FLOPs / matmul rate; the larger of the two bounds any implementation.
``served`` bytes count what a kernel makes the memory system deliver, re-reads
included (they mostly hit L2, which is why SIMT is not 64x slower than its floor).
"""
from __future__ import annotations

import math

from .config import HEAD_DIM, INDEX_DIM, INDEX_TOKEN_BYTES, NOPE_DIM, PAGE_SIZE, TOKEN_BYTES


def decode_floor_bytes(B, H, K, D=HEAD_DIM) -> int:
    """Each gathered token once + indices + bf16 q and out + fp32 lse."""
    return B * K * (TOKEN_BYTES + 4) + B * H * (2 * D * 2 + 4)


def decode_served_bytes(B, H, K, heads_per_read: int, D=HEAD_DIM) -> int:
    """KV gathered once per group of ``heads_per_read`` heads (1 for SIMT, BLOCK_H for mma)."""
    reads = math.ceil(H / heads_per_read)
    return B * reads * K * (TOKEN_BYTES + 4) + B * H * (2 * D * 2 + 4)


def decode_flops(B, H, K, D=HEAD_DIM) -> int:
    """QK^T and PV, 2 FLOPs per multiply-add: 4 * H * K * D per query."""
    return 4 * B * H * K * D


def indexer_bytes(B, seq_len, Hi=64, Di=128) -> int:
    """Live keys once (132 B/token) + q (bf16) + weights + fp32 logits out."""
    return B * seq_len * (INDEX_TOKEN_BYTES + 4) + B * Hi * (Di * 2 + 4)


def indexer_flops(B, seq_len, Hi=64, Di=INDEX_DIM) -> int:
    """q . k for every head and token (2*Hi*Di) plus relu, weight and sum (~3*Hi)."""
    return B * seq_len * Hi * (2 * Di + 3)


def indexer_step_bytes(B, live, Hi=64, Di=INDEX_DIM, k=512, q_bytes=2) -> int:
    """The indexer step over the live context (logits of live pages, then the top-k of each live
    prefix): live keys once (132 B/token), each live logit written and read back (8 B), q and the
    head weights, the k positions written. Nothing here grows with the max context."""
    return B * live * (INDEX_TOKEN_BYTES + 8) + B * Hi * (Di * q_bytes + 4) + B * k * 4


def indexer_torch_steps(B, max_seq_len, Hi=64, Di=INDEX_DIM, gemm_bytes=2, page=PAGE_SIZE) -> list[dict]:
    """S0-S3's torch fallback, kernel by kernel, over the max context (every page of
    ceil(max_seq_len / 64), live or not): bytes read and written and FLOPs of each step as
    SGLang runs them (indexer_gemm.logits_torch). ``gemm_bytes``: 2 for the bf16 bmm, 4 for fp32."""
    L = -(-max_seq_len // page) * page
    t, g = B * L, gemm_bytes
    steps = [
        ("gather pages (page_table -> [B, pages, 64*132])", t * (Di + 4), t * (Di + 4), 0),
        ("values .contiguous()", t * Di, t * Di, 0),
        ("fp8 -> gemm dtype", t * Di, t * Di * g, 0),
        ("scales .contiguous()", t * 4, t * 4, 0),
        ("bmm  k @ q^T -> [B, L, H]", t * Di * g, t * Hi * g, 2 * t * Hi * Di),
        ("relu", t * Hi * g, t * Hi * g, t * Hi),
        ("* weights (-> fp32)", t * Hi * g, t * Hi * 4, t * Hi),
        ("sum over heads", t * Hi * 4, t * 4, t * Hi),
        ("* k_scale", 2 * t * 4, t * 4, t),
        ("-inf fill + copy + mask", 2 * t * 4, 3 * t * 4, 0),
    ]
    return [dict(step=n, read=r, written=w, flops=f) for n, r, w, f in steps]


def floor_us(nbytes, flops, copy_tb_s, tflops) -> dict:
    t_mem = nbytes / (copy_tb_s * 1e12) * 1e6
    t_math = flops / (tflops * 1e12) * 1e6
    return {"mem_us": t_mem, "math_us": t_math, "floor_us": max(t_mem, t_math),
            "bound": "memory" if t_mem >= t_math else "compute",
            "intensity": flops / nbytes}


#: Per-SM rates of an H200 at the 1.98 GHz its programs run at under load, as the Hopper kernel's
#: budget uses them: dense bf16 wgmma FLOPs, shared-memory bytes (32 banks x 4 B), 32-bit integer
#: ops, fp32 (and bf16x2) ops, MUFU (exp2) ops, each per clock.
H200_SM = {"clock_ghz": 1.98, "mma_flop": 4096, "smem_bytes": 128, "int_ops": 64, "fp32_ops": 128, "mufu": 16}


def hopper_tile_budget(H=64, D=HEAD_DIM, nope=NOPE_DIM, block_n=64, chunk=16, consumer_groups=2, rates=None,
                       chunk_round_trip_us=(0.2, 0.3)) -> list[dict]:
    """Cycles of one BLOCK_N-token tile of the Hopper kernel in steady state at ideal issue (no stalls):
    one row per step, with who runs it (the consumer warp groups or the producer), the resource that
    bounds it and its cycles. Shared-memory reads count each consumer warp group's operands (Q is
    read by every group, K, V and P once). The producer's gather is latency, not throughput:
    BLOCK_N / CHUNK dependent round trips (an index load, then the 16-byte gathers) of
    ``chunk_round_trip_us`` each (an estimate for L2 hits; its "cycles" row holds the low end,
    "cycles_high" the high end)."""
    r = H200_SM if rates is None else rates
    mma = 2 * H * block_n * D                               # one product: 64 heads x BLOCK_N x 512 x 2
    q_reads = H * D * 2 * consumer_groups
    kv_tile = block_n * D * 2
    p_bytes = H * block_n * 2 * (1 + consumer_groups)       # P written once, read by every group
    pairs = nope // 2
    rows = [
        ("consumers", "Q K^T (wgmma)", "shared memory" if (q_reads + kv_tile) / r["smem_bytes"] > mma / r["mma_flop"]
         else "tensor cores", max((q_reads + kv_tile) / r["smem_bytes"], mma / r["mma_flop"]), q_reads + kv_tile, mma),
        ("consumers", "softmax, O rescale, P to operand layout", "MUFU + fp32 + shared memory",
         H * block_n / r["mufu"] + H * D / r["fp32_ops"] + 3 * H * block_n / r["fp32_ops"] + p_bytes / r["smem_bytes"],
         p_bytes, 0),
        ("consumers", "P V (wgmma)", "tensor cores" if mma / r["mma_flop"] >= kv_tile / r["smem_bytes"]
         else "shared memory", max(mma / r["mma_flop"], kv_tile / r["smem_bytes"]), kv_tile, mma),
        ("producer", "fp8 -> bf16 dequant (integer ops)", "integer pipe",
         block_n * (4 * pairs / r["int_ops"] + pairs / r["fp32_ops"]), 0, 0),
        ("producer", "bf16 tile to shared memory", "shared memory", kv_tile / r["smem_bytes"], kv_tile, 0),
        ("producer", f"gather: {block_n // chunk} chunk round trips", "latency (L2 hits)",
         block_n // chunk * chunk_round_trip_us[0] * r["clock_ghz"] * 1e3, 0, 0),
    ]
    out = [dict(who=w, step=s, bound=b, cycles=c, smem_bytes=m, flops=f) for w, s, b, c, m, f in rows]
    out[-1]["cycles_high"] = block_n // chunk * chunk_round_trip_us[1] * r["clock_ghz"] * 1e3
    for row in out:
        row["us"] = row["cycles"] / (r["clock_ghz"] * 1e3)
    return out


def hopper_timeline(budget: list[dict], tiles=4, num_buf=2, chunks=4, cold_us=1.1, clock_ghz=1.98) -> list[dict]:
    """The schedule of :func:`hopper_tile_budget` over ``tiles`` tiles of one program, as segments
    (lane, tile, what, start, end in cycles): the producer's chunk loads (latency; the first chunk of
    the first tile also pays ``cold_us`` from HBM), its dequant + stores of each chunk (overlapping
    the next chunk's loads), and the consumers' three steps. The producer waits for a free ring
    buffer (num_buf), the consumers for a full one. A model at ideal issue, not a trace."""
    prod = [row for row in budget if row["who"] == "producer"]
    load = prod[-1]["cycles"] / chunks
    alu = max(prod[0]["cycles"], prod[1]["cycles"]) / chunks
    cons = [row for row in budget if row["who"] == "consumers"]
    segs, ready, done, p_end = [], [], [], 0.0
    for i in range(tiles):
        t = max(p_end, done[i - num_buf] if i >= num_buf else 0.0)
        alu_end = t
        for c in range(chunks):
            dt = load + (cold_us * clock_ghz * 1e3 if i == 0 and c == 0 else 0.0)
            segs.append(dict(lane="producer: loads in flight", tile=i, what="gather", start=t, end=t + dt))
            t += dt
            s = max(t, alu_end)
            segs.append(dict(lane="producer: dequant + st.shared", tile=i, what="dequant", start=s, end=s + alu))
            alu_end = s + alu
        p_end = alu_end
        ready.append(p_end)
        t = max(ready[i], done[i - 1] if i else 0.0)
        for row in cons:
            segs.append(dict(lane="consumers (2 warp groups)", tile=i, what=row["step"], start=t,
                             end=t + row["cycles"]))
            t += row["cycles"]
        done.append(t)
    return segs


# --- the whole decode step's floor ------------------------------------------------------------------
# The decode step's floors: the least time one GPU's share of a step can take, from the bytes it must
# read at the device's measured copy bandwidth, and from its multiply-adds at the measured bf16 rate.
#
# Computed from a replay's record (``reproduce.json``: its config, the weight bytes per layer kind the
# model built, the ceilings it measured), so every recorded run has its floor, and a stage's step time
# divided by it says how far above the floor the step runs ("x above the floor").
#
# What a step must read, per GPU (one token per request, C requests):
# - every dense weight of every layer once (attention, compressor, indexer, mHC, router, shared expert),
#   and the lm_head; the embedding only at C rows (left out: kilobytes);
# - the routed experts the batch touches: each request picks ``active_experts`` of ``experts``, uniformly
#   at random here, so a GPU's ``local_experts`` are touched 1 - (1 - k/E)^C of the time (expected);
# - per request and layer, the KV cache rows its attention reads (the window, and on compressed layers
#   the top-k rows or, at ratio 128, every compressed row), and on ratio-4 layers the indexer's key rows
#   of the live compressed context (the work S4's indexer pays for).
# Writes (the new token's cache rows, activations) are kilobytes and left out.

BF16_BYTES = 2


def _layer_counts(cfg: dict) -> dict:
    """Layers per kind the config has (a kind with none has no weights to read, nor a weight_bytes entry)."""
    counts = {"c0": cfg["layers_window"], "c4": cfg["layers_c4"], "c128": cfg["layers_c128"]}
    return {k: n for k, n in counts.items() if n}


def experts_touched(cfg: dict, C: int) -> float:
    """Expected routed experts of this GPU that C requests touch in one layer (uniform routing)."""
    miss = 1.0 - cfg["active_experts"] / cfg["experts"]
    return cfg["local_experts"] * (1.0 - miss ** C)


def kv_rows(cfg: dict) -> dict:
    """KV-cache rows one request's attention reads per layer kind, and index-key rows per ratio-4 layer."""
    live = cfg["live_context"]
    return {"c0": min(cfg["window"], live),
            "c4": min(cfg["window"], live) + min(cfg["index_topk"], live // 4),
            "c128": min(cfg["window"], live) + live // 128,
            "index_c4": live // 4}


def step_bytes(record: dict, C: int) -> dict:
    """Bytes one step must read for C requests, by part (see the module's docstring)."""
    cfg, wb = record["config"], record["weight_bytes"]
    counts = _layer_counts(cfg)
    rows = kv_rows(cfg)
    head = cfg["local_vocab"] * cfg["hidden"] * BF16_BYTES
    dense = sum(counts[k] * wb[k]["dense"] for k in counts) + head
    experts = sum(counts[k] * wb[k]["per_expert"] for k in counts) * experts_touched(cfg, C)
    kv = C * TOKEN_BYTES * sum(counts[k] * rows[k] for k in counts)
    index = C * INDEX_TOKEN_BYTES * counts.get("c4", 0) * rows["index_c4"]
    return dict(dense_weights=dense, routed_experts=experts, kv_cache=kv, index_keys=index,
                total=dense + experts + kv + index)


def step_flops(record: dict, C: int) -> float:
    """Multiply-adds x 2 of the step's weight GEMMs for C requests (each weight byte of bf16 is half a
    parameter; the stand-in experts' bytes count FP4's, so their FLOPs use the bf16 parameters they
    stand for: bytes x 8 / bits). Attention's own FLOPs are a few percent and left out."""
    cfg, wb = record["config"], record["weight_bytes"]
    counts = _layer_counts(cfg)
    dense_params = (sum(counts[k] * wb[k]["dense"] for k in counts)
                    + cfg["local_vocab"] * cfg["hidden"] * BF16_BYTES) / BF16_BYTES
    expert_params = sum(counts[k] * wb[k]["per_expert"] for k in counts) * 8 / cfg["moe_weight_bits"]
    per_request_experts = cfg["active_experts"] * cfg["local_experts"] / cfg["experts"]
    return 2.0 * C * (dense_params + expert_params * per_request_experts)


def step_floor(record: dict) -> dict:
    """The floor per C of a replay: bytes, ms at its copy bandwidth, FLOPs and ms at its bf16 rate, and
    the floor (the larger). ``record``: reproduce.json's dict (or the replay's results while it runs).
    A run without measured ceilings (the interpreter's) gets the bytes and FLOPs, and no ms."""
    ceil = record.get("ceilings")
    if ceil is None:
        raise ValueError("record has no 'ceilings' (the copy bandwidth and bf16 rate it measured): replays "
                         "recorded before the ceilings were measured have no floor")
    rows = []
    for C in record["concurrency"]:
        b, f = step_bytes(record, C), step_flops(record, C)
        byte_ms = _ms(b["total"], ceil.get("copy_tb_s"))
        flop_ms = _ms(f, ceil.get("bf16_tflops"))
        rows.append(dict(C=C, **{f"{k}_bytes": v for k, v in b.items()}, flops=f, byte_ms=byte_ms,
                         flop_ms=flop_ms, floor_ms=None if byte_ms is None else max(byte_ms, flop_ms or 0.0)))
    return dict(how="bytes a step must read at the measured copy bandwidth; FLOPs of its weight GEMMs at the "
                    "measured bf16 rate; the floor is the larger (dsv4lab.roofline.step_floor)",
                copy_tb_s=ceil["copy_tb_s"], bf16_tflops=ceil["bf16_tflops"], rows=rows)


def _ms(amount: float, tera_per_s: float | None) -> float | None:
    return None if not tera_per_s else amount / (tera_per_s * 1e12) * 1e3


def above_floor(record: dict) -> list[dict]:
    """Each stage's step time per C over its floor: how many times above the floor the step runs."""
    floor = {r["C"]: r["floor_ms"] for r in (record.get("byte_floor") or step_floor(record))["rows"]
             if r["floor_ms"]}
    out = []
    for name, s in record.get("stages", {}).items():
        for t in s["steps"]:
            if t.get("step_ms") and t["C"] in floor:
                out.append(dict(stage=name, C=t["C"], step_ms=t["step_ms"], floor_ms=floor[t["C"]],
                                x_above_floor=t["step_ms"] / floor[t["C"]]))
    return out
