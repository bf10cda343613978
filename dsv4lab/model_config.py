"""One GPU's share of DeepSeek-V4-Flash for the synthetic decode step (dsv4lab.model): the config, its
presets (the real share on a GPU, a small one for the Triton interpreter) and :data:`ASSUMPTIONS`, the
one list of what the replay chose where SGLang's code does not decide (``assumptions_markdown()``
renders it for the notebooks and the README). The model's sizes and the cache layouts come from
dsv4lab.config; this module says how one GPU's share is cut from them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .config import DSV4_FLASH as _F
from .config import HEAD_DIM, INDEX_DIM, WINDOW_PAGE_SIZE

#: the full-token page of SGLang's DSv4 pools ("the system hardcodes page_size=256": the window cache's
#: page, config.WINDOW_PAGE_SIZE); a ratio-r compressed pool pages at 256 // r rows, so pages line up
#: (ratio 4: 64 rows, ratio 128: 2)
FULL_PAGE = WINDOW_PAGE_SIZE
#: SGLang's req_to_token rows hold context_len + 4 slots (no speculative decoding)
CONTEXT_HEADROOM = 4
#: SGLang pads the c128 index table (and the window's) to a multiple of this
INDEX_ALIGN = 64


@dataclass(frozen=True)
class ModelConfig:
    """One GPU's share of DeepSeek-V4-Flash decode under SGLang's 8-GPU serving (see ASSUMPTIONS).

    Global sizes are the model's; ``tp``/``ep`` say how a GPU's share is cut from them."""
    name: str = "DeepSeek-V4-Flash, one GPU of 8 (attention TP 8, MoE EP 8)"
    hidden: int = _F.hidden
    vocab: int = _F.vocab
    tp: int = 8                      # attention tensor parallel: heads, o groups, vocab
    ep: int = 8                      # expert parallel: experts per GPU = experts / ep
    heads: int = _F.heads
    kernel_heads: int = 64           # SGLang pads each GPU's heads to 64 for the decode kernels
    head_dim: int = _F.head_dim
    rope_dim: int = _F.rope_dim
    q_lora_rank: int = _F.q_lora_rank
    o_lora_rank: int = _F.o_lora_rank
    o_groups: int = _F.o_groups
    index_heads: int = _F.index_heads
    index_dim: int = _F.index_dim
    index_topk: int = _F.topk
    window: int = _F.sliding_window
    layers_window: int = 2           # compress ratio 0: window only        (2 + 21 + 20 = the model's 43)
    layers_c4: int = 21              # ratio 4: compressed cache + the indexer's top-512
    layers_c128: int = 20            # ratio 128: every compressed token
    hc_mult: int = _F.hc_mult
    sinkhorn_iters: int = _F.hc_sinkhorn_iters
    hc_eps: float = 1e-6
    rms_eps: float = 1e-6
    experts: int = _F.moe_experts
    active_experts: int = _F.moe_active
    moe_intermediate: int = _F.moe_intermediate
    routed_scale: float = 1.5
    moe_weight_bits: float = 4.25    # MXFP4: 4-bit values + one UE8M0 byte per 32; 16 = bf16
    rope_theta: float = 10_000.0     # window-only layers
    compress_rope_theta: float = 40_000.0   # compressed layers
    ring_c4: int = 8                 # compressor state ring (SGLang: 8 for ratio 4, 128 for ratio 128)
    ring_c128: int = 128
    live_context: int = _F.context   # tokens each request holds
    max_context: int = _F.max_context  # the served maximum (sizes the indexer's fallback and the c128 table)
    max_batch: int = 64              # caches are built for this many requests
    share_weights: bool = True       # one weight set per layer kind (caches are always per layer)
    seed: int = 0

    def __post_init__(self):
        for name in ("tp", "ep", "heads", "kernel_heads", "hidden", "q_lora_rank", "o_lora_rank", "o_groups",
                     "index_heads", "window", "experts", "active_experts", "moe_intermediate", "live_context",
                     "max_context", "max_batch", "hc_mult", "sinkhorn_iters"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {v!r}")
        for name in ("layers_window", "layers_c4", "layers_c128"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"ModelConfig.{name} must be an int >= 0, got {v!r}")
        if self.num_layers < 1:
            raise ValueError("ModelConfig needs at least one layer (layers_window + layers_c4 + layers_c128 >= 1)")
        if self.heads % self.tp or self.o_groups % self.tp or self.vocab % self.tp:
            raise ValueError(f"heads ({self.heads}), o_groups ({self.o_groups}) and vocab ({self.vocab}) must "
                             f"divide by tp ({self.tp})")
        if self.local_heads > self.kernel_heads:
            raise ValueError(f"kernel_heads ({self.kernel_heads}) must be >= heads / tp ({self.local_heads})")
        if self.experts % self.ep or self.active_experts > self.experts:
            raise ValueError(f"experts ({self.experts}) must divide by ep ({self.ep}) and hold active_experts")
        if self.head_dim != HEAD_DIM or self.index_dim != INDEX_DIM:
            raise ValueError("head_dim 512 and index_dim 128 are the cache layouts' contract")
        if self.hc_mult & (self.hc_mult - 1):
            raise ValueError(f"hc_mult must be a power of two (the Sinkhorn kernel's tile), got {self.hc_mult}")
        if self.window > FULL_PAGE:
            raise ValueError(f"window ({self.window}) must fit one window page of {FULL_PAGE}")
        if self.live_context > self.max_context:
            raise ValueError(f"live_context ({self.live_context}) must be <= max_context ({self.max_context})")
        if self.live_context % FULL_PAGE:
            raise ValueError(f"live_context must be a multiple of {FULL_PAGE} (whole pages), got {self.live_context}")
        if self.live_context // 4 < 1 or self.live_context // 128 < 1:
            raise ValueError("live_context must hold at least one ratio-128 block (>= 128 tokens)")

    # --- derived sizes --------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.layers_window + self.layers_c4 + self.layers_c128

    # this GPU's share of what tensor (tp) and expert (ep) parallelism cut
    local_heads = property(lambda self: self.heads // self.tp)
    local_groups = property(lambda self: self.o_groups // self.tp)
    local_vocab = property(lambda self: self.vocab // self.tp)
    local_experts = property(lambda self: self.experts // self.ep)

    @property
    def moe_standin_intermediate(self) -> int:
        """The stand-in experts' intermediate: bf16 weights with the bytes of ``moe_weight_bits``
        per weight of the real size (a multiple of 16)."""
        return max(16, int(round(self.moe_intermediate * self.moe_weight_bits / 16 / 16)) * 16)

    @property
    def shared_intermediate(self) -> int:
        """The shared expert is tensor parallel (SGLang's default without an all-to-all backend)."""
        return self.moe_intermediate // self.tp

    def layer_ratios(self) -> list[int]:
        """Compress ratio of each layer, in order: the window-only layers first, then ratio 4 and
        ratio 128 interleaved (ratio 4 first), the remainder of the larger kind at the end."""
        out = [0] * self.layers_window
        a, b = self.layers_c4, self.layers_c128
        for i in range(max(a, b)):
            if i < a:
                out.append(4)
            if i < b:
                out.append(128)
        return out

    def index_max_seq_len(self, max_context: int | None = None) -> int:
        """The indexer's width, as SGLang forms it: ceil((max_context + 4) / 256) pages x 64
        compressed tokens (1,048,576 -> 262,208; 8192 -> 2112)."""
        return self.full_pages(max_context) * (FULL_PAGE // 4)

    def full_pages(self, max_context: int | None = None) -> int:
        m = self.max_context if max_context is None else max_context
        return -(-(m + CONTEXT_HEADROOM) // FULL_PAGE)

    def c128_width(self, max_context: int | None = None) -> int:
        """Columns of the ratio-128 index table: 2 per full page, padded to 64 (SGLang's
        c128_page_indices): 8256 at the 1M maximum; valid entries = live / 128."""
        n = self.full_pages(max_context) * (FULL_PAGE // 128)
        return -(-n // INDEX_ALIGN) * INDEX_ALIGN

    @property
    def live_pages(self) -> int:
        return self.live_context // FULL_PAGE

    def moe_rows(self, B: int) -> int:
        """Routed expert evaluations this GPU does per step on average: B x 6 / ep (>= 1)."""
        return max(1, round(B * self.active_experts / self.ep))

    def moe_local_experts(self, B: int) -> int:
        """Distinct local experts hit on average: local x (1 - (1 - 6/256)^B), >= 1, <= rows."""
        p = self.active_experts / self.experts
        e = round(self.local_experts * (1 - (1 - p) ** B))
        return max(1, min(self.moe_rows(B), e, self.local_experts))

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(num_layers=self.num_layers, local_heads=self.local_heads, local_groups=self.local_groups,
                 local_vocab=self.local_vocab, local_experts=self.local_experts,
                 moe_standin_intermediate=self.moe_standin_intermediate,
                 shared_intermediate=self.shared_intermediate, layer_ratios=self.layer_ratios(),
                 index_max_seq_len=self.index_max_seq_len(), c128_width=self.c128_width())
        return d


#: The default: DeepSeek-V4-Flash on one of 8 GPUs, SGLang's sharding.
DSV4_FLASH_TP8 = ModelConfig()

#: CPU / Triton-interpreter preset: the same structure and byte layouts (head_dim 512, pages of
#: 256/64/2, the indexer's 132-byte rows), one layer of each kind and small counts.
CPU_MODEL = replace(DSV4_FLASH_TP8, name="DeepSeek-V4-Flash (CPU preset: one layer per kind, small counts)",
                    hidden=256, vocab=1024, heads=16, kernel_heads=8, q_lora_rank=64, o_lora_rank=64,
                    index_heads=4, index_topk=32, window=16, layers_window=1, layers_c4=1, layers_c128=1,
                    experts=16, active_experts=2, ep=2, moe_intermediate=64, ring_c128=8,
                    live_context=512, max_context=2048, max_batch=2)


def model_config(mode: str | None = None) -> ModelConfig:
    """The config a run should use in this process's mode (the real share on a GPU)."""
    if mode is None:
        from .device import mode as _mode
        mode = _mode()
    return DSV4_FLASH_TP8 if mode == "cuda" else CPU_MODEL


#: Every assumption of the replay, in one place: (topic, what the replay does, why / source).
ASSUMPTIONS = [
    ("weights", "random, at the real shapes (bf16; the mHC mixing weights fp32 as in SGLang); one set per "
     "layer kind when share_weights", "no checkpoint is reachable. Sharing changes no HBM read: one layer's "
     "weights (~0.3-0.5 GB with its experts) far exceed the 50 MB L2, so nothing survives to the next layer"),
    ("caches", "every layer owns its window cache, compressed cache and indexer cache, filled with random "
     "tokens at setup (fp8 layout byte for byte)", "no layer reads bytes another layer left in L2"),
    ("layer mix", "2 window-only + 21 ratio-4 + 20 ratio-128 = 43 layers (ModelConfig.layers_*), ratio-4 and "
     "ratio-128 interleaved after the window-only ones", "the per-layer compress_ratios of the checkpoint are "
     "not published in any source read here; the counts are a parameter"),
    ("attention sharding", "tensor parallel 8: this GPU holds 8 of 64 heads (wq_b, wo_a, wo_b sharded; "
     "wqkv_a, the indexer and the compressors replicated); the decode kernels get q padded to 64 heads "
     "(zeros in the padded heads) and the sink padded with zeros", "SGLang's MqaAttentionBase: "
     "_kernel_num_heads returns 64 for n_local_heads <= 64 outside FlashInfer; ColumnParallel wq_b/wo_a, "
     "RowParallel wo_b, ReplicatedLinear wqkv_a/indexer/compressor"),
    ("MoE sharding", "expert parallel 8: 32 local experts; per step this GPU evaluates B*6/8 (rounded, >= 1) "
     "routed rows over the expected number of distinct local experts 32*(1-(1-6/256)^B); the shared expert "
     "tensor parallel (intermediate 2048/8)", "SGLang EP MoE; shared expert parallel_group='tp' without an "
     "all-to-all backend. Under TP-MoE a GPU reads the same expected bytes (8x the experts at 1/8 each)"),
    ("MoE stand-in", "real: the router GEMM (bf16 -> fp32 logits), sqrtsoftplus scores, the +bias top-6 and "
     "its renormalized weights x 1.5. Stand-in: which experts run is a fixed balanced assignment (rows "
     "spread evenly over the expected number of local experts; the router's weights scale them), and the "
     "expert GEMMs are a Triton grouped GEMM on bf16 weights whose intermediate is cut to match FP4 bytes "
     "(2048 x 4.25/16 -> 544: same bytes read, ~1/4 of the FLOPs)", "graph capture needs fixed shapes; "
     "SGLang's FP4 MoE kernels are not available here; decode MoE is bound by weight bytes"),
    ("dense projections", "bf16 GEMMs (torch)", "the checkpoint stores them block-FP8: these read ~2x its bytes"),
    ("collectives", "not modeled: no all-reduce after wo_b / MoE, no all-gather of logits", "one GPU"),
    ("streams", "one CUDA stream", "SGLang overlaps the indexer on side streams during capture"),
    ("mHC", "pre: fp32 GEMM [B,16384]x[16384,24] (S0-S2; bf16 from S3), the split + Sinkhorn (20 iterations) "
     "in one Triton kernel, the stream combine and post in torch", "SGLang's hc_pre torch path "
     "(hc_pre_torch_impl) the story profiled as FP32 SIMT GEMM; hc_split_sinkhorn is one kernel in SGLang"),
    ("fusions", "SGLang's fused q-norm+rope, kv norm+rope+fp8 store, indexer q rope+hadamard+quant are "
     "written as several torch ops (no hadamard; indexer q stays bf16)", "their work is small at decode; "
     "they add glue kernels the fused versions do not have"),
    ("compressors", "per step: the kv/gate projection and the write into the state ring; the pooling into "
     "the compressed cache (1 step in 4 or 128, a fused kernel that exits early on the others) is not run",
     "the compressed caches are filled at setup"),
    ("rope", "interleaved pairs on the last 64 dims, base 10000 (window-only) / 40000 (compressed), no YaRN "
     "factor", "only the cost matters here"),
    ("routing", "every layer uses the learned router", "the checkpoint's first hash-routed layers skip one "
     "small GEMM"),
    ("contexts", "every request at the same position: live_context tokens (default 8192), so window 128, "
     "ratio-4 cache live/4 = 2048 tokens, ratio-128 live/128 = 64", "the story's serving point"),
    ("max context", "1,048,576 tokens: indexer width ceil((1048576+4)/256)*64 = 262,208 (the story's tensor), "
     "ratio-128 index table 8256 wide with 64 valid; the 'cap' stages use 8192 (width 2112, table 128)",
     "SGLang: max_compressed_seq_len = page_table columns x 64, req_to_token = context + 4; "
     "c128_page_indices padded to 64"),
    ("page sizes", "window cache pages of 256 (a request's last 128 tokens in its page), ratio-4 cache and "
     "indexer pages of 64, ratio-128 cache pages of 2, one page table for all three", "SGLang's pools: "
     "slot = full-pool loc // ratio, page = 256 // ratio"),
    ("head", "vocab-parallel embedding and lm_head (129280/8 rows), the mHC head (fp32 GEMM) and the final "
     "norm are in the step; sampling is not", "SGLang samples after the graph"),
]


def assumptions_markdown() -> str:
    rows = ["| topic | the replay | why / source |", "|---|---|---|"]
    rows += [f"| {t} | {r} | {s} |" for t, r, s in ASSUMPTIONS]
    return "\n".join(rows)
