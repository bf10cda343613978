"""The synthetic step's weights (dsv4lab.model): one decoder layer's share for one compress ratio, random
at the real shapes and scaled so activations stay O(1), and the bytes they hold (the replay's floor)."""
from __future__ import annotations

import torch

from .model_config import ModelConfig


def _randn(g, shape, scale, dtype, device):
    return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * scale).to(dtype)


class LayerWeights:
    """One decoder layer's weights (this GPU's share) for one compress ratio."""

    def __init__(self, cfg: ModelConfig, ratio: int, g: torch.Generator, device):
        D, n, bf = cfg.hidden, cfg.hc_mult, torch.bfloat16
        mix = (2 + n) * n

        def w(out_f, in_f, dtype=bf):
            return _randn(g, (out_f, in_f), in_f ** -0.5, dtype, device)

        self.ratio = ratio
        for part in ("attn", "ffn"):
            setattr(self, f"hc_{part}_fn", _randn(g, (mix, n * D), (n * D) ** -0.5, torch.float32, device))
            setattr(self, f"hc_{part}_base", _randn(g, (mix,), 0.5, torch.float32, device))
            setattr(self, f"hc_{part}_scale", torch.ones(3, device=device))
        self.attn_norm = torch.ones(D, dtype=bf, device=device)
        self.ffn_norm = torch.ones(D, dtype=bf, device=device)
        self.wqkv_a = w(cfg.q_lora_rank + cfg.head_dim, D)
        self.q_norm = torch.ones(cfg.q_lora_rank, dtype=bf, device=device)
        self.kv_norm = torch.ones(cfg.head_dim, dtype=bf, device=device)
        self.wq_b = w(cfg.local_heads * cfg.head_dim, cfg.q_lora_rank)
        group_in = cfg.local_heads * cfg.head_dim // cfg.local_groups
        self.wo_a = _randn(g, (cfg.local_groups, cfg.o_lora_rank, group_in), group_in ** -0.5, bf, device)
        self.wo_b = w(D, cfg.local_groups * cfg.o_lora_rank)
        sink = torch.zeros(cfg.kernel_heads, dtype=torch.float32, device=device)   # padded heads: sink 0
        sink[:cfg.local_heads] = _randn(g, (cfg.local_heads,), 1.0, torch.float32, device)
        self.attn_sink = sink
        if ratio:
            coff = 2 if ratio == 4 else 1                       # ratio 4 compresses overlapping windows
            self.compressor = w(2 * coff * cfg.head_dim, D)
        if ratio == 4:
            self.idx_wq_b = w(cfg.index_heads * cfg.index_dim, cfg.q_lora_rank)
            self.idx_proj = w(cfg.index_heads, D)
            self.idx_compressor = w(2 * 2 * cfg.index_dim, D)
        self.gate = w(cfg.experts, D)
        self.gate_bias = _randn(g, (cfg.experts,), 0.01, torch.float32, device)
        I = cfg.moe_standin_intermediate
        self.w13 = _randn(g, (cfg.local_experts, D, 2 * I), D ** -0.5, bf, device)
        self.w2 = _randn(g, (cfg.local_experts, I, D), I ** -0.5, bf, device)
        self.shared_w13 = w(2 * cfg.shared_intermediate, D)
        self.shared_w2 = w(D, cfg.shared_intermediate)
        # the projections that read the same input, concatenated for S5's single GEMMs; S4's names are
        # row slices of them (views), so both stages read the same bytes and memory holds them once
        self._concat("w_y", "wqkv_a", "compressor", "idx_proj", "idx_compressor")
        self._concat("w_q", "wq_b", "idx_wq_b")
        self._concat("w_g", "gate", "shared_w13")

    def _concat(self, name: str, *parts: str):
        parts = [p for p in parts if hasattr(self, p)]
        whole = torch.cat([getattr(self, p) for p in parts])
        setattr(self, name, whole)
        row = 0
        for p in parts:
            n = getattr(self, p).shape[0]
            setattr(self, p, whole[row:row + n])
            row += n

    def hc_fn(self, part: str, dtype: torch.dtype):
        """The mixing weights in the GEMM's dtype (the bf16 copy made once, not per step)."""
        key = f"_hc_{part}_fn_{dtype}"
        if not hasattr(self, key):
            setattr(self, key, getattr(self, f"hc_{part}_fn").to(dtype))
        return getattr(self, key)


def weight_bytes(model) -> dict:
    """Weight bytes per layer kind: the dense ones a step reads, and one stand-in expert's."""
    out = {}
    for lw in {id(w): w for w in model.weights}.values():
        dense = sum(v.numel() * v.element_size() for k, v in vars(lw).items()        # views counted in their whole
                    if isinstance(v, torch.Tensor) and k not in ("w13", "w2") and not k.startswith("_")
                    and v._base is None)
        per_expert = (lw.w13[0].numel() + lw.w2[0].numel()) * lw.w13.element_size()
        out[f"c{lw.ratio}"] = dict(dense=dense, per_expert=per_expert)
    return out
