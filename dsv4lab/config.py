"""DeepSeek-V4-Flash decode shapes, as one frozen object the notebooks read.

Numbers from the model config (SGLang's ``configs/deepseek_v4.py``; docs/dsv4.md collects them
with the byte layouts). A notebook asks :func:`shapes` once and never
hard-codes a size: on a GPU it gets the real model, under the Triton
interpreter a small preset with the same structure so cells run in seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class DSV4Shapes:
    name: str = "DeepSeek-V4-Flash"
    # attention (MQA over a 512-wide latent; K = V, output includes rope)
    heads: int = 64
    head_dim: int = 512
    nope_dim: int = 448
    rope_dim: int = 64
    quant_tile: int = 64          # nope values sharing one UE8M0 scale
    topk: int = 512               # tokens each query attends to
    # lightning indexer
    index_heads: int = 64
    index_dim: int = 128
    # paged caches
    page_size: int = 64           # compressed (c4/c128) cache and indexer cache
    window_page_size: int = 256   # sliding-window cache
    sliding_window: int = 128
    max_context: int = 1_048_576
    # serving point of the campaign
    batch: int = 32
    context: int = 8192           # live tokens per request in the benchmarks
    # model
    hidden: int = 4096
    layers: int = 43
    mtp_layers: int = 1
    compress_ratios: tuple = (0, 4, 128)   # per-layer choices: window only, c4 (+indexer), c128
    q_lora_rank: int = 1024
    o_lora_rank: int = 1024
    o_groups: int = 8
    vocab: int = 129_280
    moe_experts: int = 256
    moe_active: int = 6
    moe_shared: int = 1
    moe_intermediate: int = 2048
    hc_mult: int = 4              # mHC residual streams
    hc_sinkhorn_iters: int = 20

    def __post_init__(self):
        for name, v in vars(self).items():
            if isinstance(v, int) and not isinstance(v, bool) and v < 1 and name != "mtp_layers":
                raise ValueError(f"DSV4Shapes.{name} must be a positive int, got {v}")
        if self.nope_dim + self.rope_dim != self.head_dim:
            raise ValueError("nope_dim + rope_dim must equal head_dim")
        if self.nope_dim % self.quant_tile:
            raise ValueError("nope_dim must be a multiple of quant_tile")

    @property
    def kv_bytes_per_token(self) -> int:
        """584 B: 448 fp8 nope + 128 B bf16 rope + 7 scale bytes + 1 pad."""
        return self.nope_dim + 2 * self.rope_dim + self.nope_dim // self.quant_tile + 1

    @property
    def index_bytes_per_token(self) -> int:
        """132 B: 128 fp8 values + one fp32 scale."""
        return self.index_dim + 4

    @property
    def sm_scale(self) -> float:
        return self.head_dim ** -0.5

    def decode_flops(self, batch: int | None = None, topk: int | None = None) -> int:
        """QK and PV: 2 * 2 * H * topk * D per query."""
        b = self.batch if batch is None else batch
        k = self.topk if topk is None else topk
        return 4 * b * self.heads * k * self.head_dim

    def smaller(self, **kw) -> "DSV4Shapes":
        return replace(self, **kw)


#: The real model.
DSV4_FLASH = DSV4Shapes()

#: CPU / interpreter preset: the byte layout is untouched (D 512, pages of 64,
#: the cache format is the contract), only the counts that set the work shrink.
CPU_PRESET = replace(DSV4_FLASH, name="DeepSeek-V4-Flash (CPU preset)",
                     heads=8, topk=80, index_heads=4, batch=2, context=320)


def shapes(mode: str | None = None) -> DSV4Shapes:
    """The shapes a notebook should use in this process's mode."""
    if mode is None:
        from .device import mode as _mode
        mode = _mode()
    if mode not in ("cuda", "interpret", "compile"):
        raise ValueError(f"mode must be 'cuda', 'interpret' or 'compile' (dsv4lab.device.mode()), got {mode!r}")
    return DSV4_FLASH if mode == "cuda" else CPU_PRESET
