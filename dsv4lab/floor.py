"""The decode step's floors: the least time one GPU's share of a step can take, from the bytes it must
read at the device's measured copy bandwidth, and from its multiply-adds at the measured bf16 rate.

Computed from a replay's record (``reproduce.json``: its config, the weight bytes per layer kind the
model built, the ceilings it measured), so every recorded run has its floor, and a stage's step time
divided by it says how far above the floor the step runs ("x above the floor").

What a step must read, per GPU (one token per request, C requests):
- every dense weight of every layer once (attention, compressor, indexer, mHC, router, shared expert),
  and the lm_head; the embedding only at C rows (left out: kilobytes);
- the routed experts the batch touches: each request picks ``active_experts`` of ``experts``, uniformly
  at random here, so a GPU's ``local_experts`` are touched 1 - (1 - k/E)^C of the time (expected);
- per request and layer, the KV cache rows its attention reads (the window, and on compressed layers
  the top-k rows or, at ratio 128, every compressed row), and on ratio-4 layers the indexer's key rows
  of the live compressed context (the work S4's indexer pays for).
Writes (the new token's cache rows, activations) are kilobytes and left out.
"""
from __future__ import annotations

from .config import INDEX_TOKEN_BYTES, TOKEN_BYTES

BF16_BYTES = 2


def _layer_counts(cfg: dict) -> dict:
    return {"c0": cfg["layers_window"], "c4": cfg["layers_c4"], "c128": cfg["layers_c128"]}


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
    index = C * INDEX_TOKEN_BYTES * counts["c4"] * rows["index_c4"]
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


def byte_floor(record: dict) -> dict:
    """The floor per C of a recorded replay: bytes, ms at its copy bandwidth, FLOPs and ms at its bf16
    rate, and the floor (the larger). ``record``: reproduce.json's dict."""
    ceil = record.get("ceilings")
    if not ceil:
        raise ValueError("record has no measured 'ceilings' (copy bandwidth, bf16 rate): replays before "
                         "the ceilings were measured have no floor")
    rows = []
    for C in record["concurrency"]:
        b, f = step_bytes(record, C), step_flops(record, C)
        byte_ms = b["total"] / (ceil["copy_tb_s"] * 1e12) * 1e3
        flop_ms = f / (ceil["bf16_tflops"] * 1e12) * 1e3
        rows.append(dict(C=C, **{f"{k}_bytes": v for k, v in b.items()}, flops=f, byte_ms=byte_ms,
                         flop_ms=flop_ms, floor_ms=max(byte_ms, flop_ms)))
    return dict(how="bytes a step must read at the measured copy bandwidth; FLOPs of its weight GEMMs at the "
                    "measured bf16 rate; the floor is the larger (dsv4lab.floor)",
                copy_tb_s=ceil["copy_tb_s"], bf16_tflops=ceil["bf16_tflops"], rows=rows)


def above_floor(record: dict) -> list[dict]:
    """Each stage's step time per C over its floor: how many times above the floor the step runs."""
    floor = {r["C"]: r["floor_ms"] for r in byte_floor(record)["rows"]}
    out = []
    for name, s in record["stages"].items():
        for t in s["steps"]:
            if t.get("step_ms") and t["C"] in floor:
                out.append(dict(stage=name, C=t["C"], step_ms=t["step_ms"], floor_ms=floor[t["C"]],
                                x_above_floor=t["step_ms"] / floor[t["C"]]))
    return out
