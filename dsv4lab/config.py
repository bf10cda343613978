"""DeepSeek-V4-Flash's shapes and the cache layouts' constants: the lab's one source of them.

Numbers from the model config (SGLang's ``configs/deepseek_v4.py``; docs/dsv4.md collects them
with the byte layouts). The layout constants below are what every byte layout, kernel and check
derives from (dsv4lab.cache re-exports them beside the layouts); :class:`DSV4Shapes` holds the
model's sizes as one frozen object. A notebook asks :func:`shapes` once and never hard-codes a
size: on a GPU it gets the real model, under the Triton interpreter a small preset with the same
structure so cells run in seconds. One GPU's share of the model (tensor and expert parallel) is
dsv4lab.model_config.ModelConfig, whose defaults come from here.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

# ---- the cache layouts (SGLang 0.5.23's KVLayout.V4 and DeepGEMM's indexer layout) ----------------
NOPE_DIM, ROPE_DIM, HEAD_DIM = 448, 64, 512  # the latent: fp8 "nope" values, then bf16 rope values
QUANT_TILE = 64                              # nope values sharing one UE8M0 scale
NUM_SCALES = NOPE_DIM // QUANT_TILE          # 7
DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM         # 576
SCALE_BYTES = NUM_SCALES + 1                 # 8
TOKEN_BYTES = DATA_BYTES + SCALE_BYTES       # 584
PAGE_ALIGN = DATA_BYTES                      # a page is padded to a multiple of 576 (the reader's TMA row stride)
FP8_MAX = 448.0                              # e4m3's largest finite value
#: the largest UE8M0 scale byte the packers write: 127 + 7, scale 2^7 (every kernel's dequant reads it
#: exactly, the GPU's integer "bits" dequant included), so |kv| <= 448 x 2^7 on the nope values
MAX_PACKED_SCALE_BYTE = 134
INDEX_DIM = 128                              # the indexer's key width (fp8)
INDEX_TOKEN_BYTES = INDEX_DIM + 4            # 132: 128 fp8 values + one fp32 scale
PAGE_SIZE = 64                               # tokens a page of the compressed (c4/c128) and indexer caches
WINDOW_PAGE_SIZE = 256                       # tokens a page of the sliding-window cache


@dataclass(frozen=True)
class DSV4Shapes:
    name: str = "DeepSeek-V4-Flash"
    # attention (MQA over a 512-wide latent; K = V, output includes rope)
    heads: int = 64
    head_dim: int = HEAD_DIM
    nope_dim: int = NOPE_DIM
    rope_dim: int = ROPE_DIM
    quant_tile: int = QUANT_TILE  # nope values sharing one UE8M0 scale
    topk: int = 512               # tokens each query attends to
    # lightning indexer
    index_heads: int = 64
    index_dim: int = INDEX_DIM
    # paged caches
    page_size: int = PAGE_SIZE    # compressed (c4/c128) cache and indexer cache
    window_page_size: int = WINDOW_PAGE_SIZE   # sliding-window cache
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
