"""A synthetic DeepSeek-V4-Flash decode step: one GPU's share of 8-GPU serving, random weights.

No checkpoint is used: every weight is random (scaled so activations stay O(1)) at the real
shapes, so the step does the real work (bytes moved, FLOPs, kernel launches) and says nothing
about the model's outputs. Shapes, op order and sharding follow SGLang 0.5.23's DeepSeek-V4 code
(``srt/models/deepseek_v4.py``, ``deepseek_v4_mhc.py``, ``srt/layers/attention/dsv4/``); where
that code does not decide, :data:`ASSUMPTIONS` says what the replay chose. It is the one list
of assumptions (``assumptions_markdown()`` renders it for the notebooks and the README).

This module holds the step: the weights, the caches, the per-batch inputs and :class:`Model`. The
config and its presets (with ASSUMPTIONS) are dsv4lab.model_config, the torch glue between the kernels
dsv4lab.step_glue, the step's own Triton kernels kernels/step/; their names stay importable from here.

One decoder layer, in SGLang's order (``B`` requests, one new token each)::

    residual h [B, 4, 4096] bf16 (mHC: 4 streams)
    mHC pre      x = h.flatten(1).float(); mixes = x @ hc_fn^T * rsqrt(mean(x^2))   the "pre-linear" GEMM
                 (pre, post, comb) = sigmoid / 2 sigmoid / Sinkhorn(20) of mixes     one Triton kernel
                 y = rms_norm(sum_k pre[k] h[:, k])
    attention    [q_lora | kv] = y @ wqkv_a^T; q = rms_norm(q_lora) @ wq_b^T (this GPU's heads)
                 q: per-head rms_norm + rope; kv: rms_norm + rope, quantized into the window cache
                 compressor: kv/gate projection into its state ring (ratio-4 and ratio-128 layers)
                 ratio 4: indexer q = q_lora @ wq_b_idx^T (+rope), weights = y @ w_proj^T,
                          top-512 of the compressed cache (dsv4lab.indexer_topk impls)
                 dsv4lab.flash_mla_sparse_decode(q padded to 64 heads, window cache, extra cache)
                 o: inverse rope, per-group wo_a, wo_b
    mHC post     h = post * o + comb^T h
    mHC pre (ffn weights), then MoE: router GEMM + sqrtsoftplus + top-6, routed experts
                 (stand-in, see ASSUMPTIONS), shared expert; mHC post

``Model(cfg).step(inputs, stage)`` runs embedding, every layer and the head; it is CUDA-graph
safe (no host sync, shapes fixed per batch size; the lab's ops run with ``checks="device"``
on inputs built valid by construction) and is captured as one graph per batch size, as SGLang
captures its decode.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from . import step_fused, step_glue
from .cache import IndexKCache, KVCache, pack_index_k, pack_kv, page_bytes
from .config import DATA_BYTES, HEAD_DIM, NUM_SCALES, SCALE_BYTES
from .contracts import check_indexer_args, check_sink, check_sparse_decode_args
from .device import torch_device
from .kernels.step.mhc import mhc_sinkhorn
from .kernels.step.moe import moe_grouped_gemm
from .merged_decode import flash_mla_sparse_decode
from .model_config import FULL_PAGE, ModelConfig, model_config
from .model_weights import LayerWeights, _randn, weight_bytes  # noqa: F401  (dsv4lab.model.X)
from .registry import impl_info
# dsv4lab.model.X names the notebooks, the replay and the tests use, kept where they moved
from .model_config import (ASSUMPTIONS, CPU_MODEL, DSV4_FLASH_TP8, assumptions_markdown)  # noqa: F401
from .step_glue import (GLUE, INDEXER_TOPK, kv_cache_bytes, mhc_combine, mhc_flat, mhc_post,  # noqa: F401
                        rms_norm, rope, route, silu_mul)


@dataclass
class LayerCaches:
    """One layer's caches, built for cfg.max_batch requests."""
    ratio: int
    window: KVCache                    # pages of 256: request b's ring of recent tokens on page b
    compressed: KVCache | None = None  # ratio 4: pages of 64; ratio 128: pages of 2
    index: IndexKCache | None = None   # ratio 4: the indexer's keys, pages of 64
    state: torch.Tensor | None = None  # compressor state ring [max_batch, ring, width] float32
    index_state: torch.Tensor | None = None


@dataclass
class StepInputs:
    """Everything one decode step reads besides weights and caches, for one batch size and one
    stage's max context: SGLang's per-step metadata (built outside the graph, on the host)."""
    B: int
    max_context: int
    tokens: torch.Tensor               # [B] int64, this GPU's vocab shard
    cos: dict                          # rope base -> [B, rope/2] float32
    sin: dict
    window_idx: torch.Tensor           # [B, window] int32 token ids in the window cache
    window_len: torch.Tensor           # [B] int32
    window_data_off: torch.Tensor      # [B, 576] int64 byte offsets of the new token's data
    window_scale_off: torch.Tensor     # [B, 7] int64 byte offsets of its scale bytes
    page_table: torch.Tensor           # [B, ceil(index_max_seq_len / 64)] int32, -1 past the live pages
    index_max_seq_len: int
    c4_len: torch.Tensor               # [B] int32 live compressed tokens (the indexer's seq_lens)
    c4_topk_len: torch.Tensor          # [B] int32 min(c4_len, topk)
    c128_idx: torch.Tensor             # [B, c128_width] int32 (-1 past the live ones)
    c128_len: torch.Tensor             # [B] int32
    ring_pos: dict                     # ring size -> [B] int64 slot of this token
    q_pad: torch.Tensor                # [B, kernel_heads, 512] bf16, zeros past the local heads
    moe_tok: torch.Tensor              # [E, m] int64 token of each (expert, row) of the stand-in
    moe_col: torch.Tensor              # [E, m] int64 which of the token's top-k weights scales it
    moe_valid: torch.Tensor            # [E, m] float32 1 for real rows, 0 for padding
    moe_rows: torch.Tensor             # [B, s] int64 flat rows e * m + r of each token's real rows, -1 past them


def _rows_by_token(tok, valid, B: int) -> torch.Tensor:
    """[E, m] token of each stand-in row (and whether it is real) -> [B, s] int64: the flat rows
    e * m + r of each token's real rows in order, -1 past them (S5's deterministic combine)."""
    flat, ok = tok.flatten().cpu(), valid.flatten().cpu()
    lists = [[r for r in range(flat.numel()) if ok[r] and flat[r] == b] for b in range(B)]
    s = max(1, max(len(x) for x in lists))
    return torch.tensor([x + [-1] * (s - len(x)) for x in lists], dtype=torch.int64).to(tok.device)


class Model:
    """The synthetic decode step. ``Model(cfg).step(model.inputs(B), stage)`` -> logits."""

    def __init__(self, cfg: ModelConfig | None = None, *, device=None):
        self.cfg = cfg = cfg or model_config()
        self.device = device = torch.device(device) if device is not None else torch_device()
        g = torch.Generator(device=device)
        g.manual_seed(cfg.seed)
        ratios = cfg.layer_ratios()
        self.ratios = ratios
        shared = {}
        self.weights = []
        for r in ratios:
            if cfg.share_weights:
                if r not in shared:
                    shared[r] = LayerWeights(cfg, r, g, device)
                self.weights.append(shared[r])
            else:
                self.weights.append(LayerWeights(cfg, r, g, device))
        bf = torch.bfloat16
        self.embed = _randn(g, (cfg.local_vocab, cfg.hidden), 1.0, bf, device)
        self.lm_head = _randn(g, (cfg.local_vocab, cfg.hidden), cfg.hidden ** -0.5, bf, device)
        self.head_norm = torch.ones(cfg.hidden, dtype=bf, device=device)
        n = cfg.hc_mult
        head_fn = _randn(g, (n, n * cfg.hidden), (n * cfg.hidden) ** -0.5, torch.float32, device)
        self.hc_head_fn = {"float32": head_fn, "bfloat16": head_fn.to(torch.bfloat16)}
        self.hc_head_base = _randn(g, (n,), 0.5, torch.float32, device)
        self.hc_head_scale = torch.ones(1, device=device)
        # one page table for every cache (SGLang's pools line up by page): request b's live full
        # pages are distinct physical pages in random order
        perm = torch.randperm(cfg.max_batch * cfg.live_pages, generator=torch.Generator().manual_seed(cfg.seed))
        self.pages = perm.view(cfg.max_batch, cfg.live_pages).to(torch.int32).to(device)
        self.caches = [self._caches(r, g) for r in ratios]
        self._glue = {name: getattr(step_glue, name) for name in GLUE}
        self._checked = False
        self._fusions = frozenset(step_fused.FUSIONS)
        #: a FixedSelection (dsv4lab.step_compare) while two stages are compared on one path, else None
        self.selection = None

    def _caches(self, ratio, g) -> LayerCaches:
        cfg, dev = self.cfg, self.device
        n_pages = cfg.max_batch * cfg.live_pages
        window = pack_kv(torch.randn(cfg.max_batch * FULL_PAGE, HEAD_DIM, generator=g, device=dev), FULL_PAGE)
        c = LayerCaches(ratio, window)
        if ratio:
            rows = FULL_PAGE // ratio
            c.compressed = pack_kv(torch.randn(n_pages * rows, HEAD_DIM, generator=g, device=dev), rows)
            ring = cfg.ring_c4 if ratio == 4 else cfg.ring_c128
            width = 2 * (2 if ratio == 4 else 1) * cfg.head_dim      # the compressor's kv + gate outputs
            c.state = torch.zeros(cfg.max_batch, ring, width, device=dev)
        if ratio == 4:
            c.index = pack_index_k(torch.randn(n_pages * (FULL_PAGE // 4), cfg.index_dim, generator=g, device=dev))
            c.index_state = torch.zeros(cfg.max_batch, cfg.ring_c4, 4 * cfg.index_dim, device=dev)
        return c

    # --- per-batch inputs ---------------------------------------------------------------------
    def inputs(self, B: int, max_context: int | None = None) -> StepInputs:
        """Inputs for B requests (the first B of the caches), each at position live_context - 1,
        for a served maximum of ``max_context`` (default the config's)."""
        cfg, dev = self.cfg, self.device
        if not isinstance(B, int) or not 1 <= B <= cfg.max_batch:
            raise ValueError(f"B must be an int in [1, max_batch={cfg.max_batch}], got {B!r}")
        mc = cfg.max_context if max_context is None else max_context
        if not isinstance(mc, int) or mc < cfg.live_context:
            raise ValueError(f"max_context must be an int >= live_context ({cfg.live_context}), got {max_context!r}")
        i32 = dict(dtype=torch.int32, device=dev)
        pos = cfg.live_context - 1
        b = torch.arange(B, device=dev)
        # window: the last `window` positions of request b live in its page b, slot pos % 256
        wpos = torch.arange(pos - cfg.window + 1, pos + 1, device=dev)
        window_idx = (b[:, None] * FULL_PAGE + wpos[None, :] % FULL_PAGE).to(torch.int32)
        wpb = page_bytes(FULL_PAGE)
        slot = pos % FULL_PAGE
        data_off = (b * wpb + slot * DATA_BYTES)[:, None] + torch.arange(DATA_BYTES, device=dev)[None, :]
        scale_off = ((b * wpb + FULL_PAGE * DATA_BYTES + slot * SCALE_BYTES)[:, None]
                     + torch.arange(NUM_SCALES, device=dev)[None, :])
        # compressed caches: logical compressed token t of request b at pages[b, t // rows] * rows + t % rows
        n_idx_pages = cfg.full_pages(mc)
        pt = torch.full((B, n_idx_pages), -1, **i32)
        pt[:, :cfg.live_pages] = self.pages[:B]
        n128 = cfg.live_context // 128
        t = torch.arange(n128, device=dev)
        c128_idx = torch.full((B, cfg.c128_width(mc)), -1, **i32)
        c128_idx[:, :n128] = (self.pages[:B].long().gather(1, (t // 2).expand(B, -1)) * 2 + t % 2).to(torch.int32)
        c4 = cfg.live_context // 4
        # rope tables for this step's positions (one per base), as SGLang computes them once per step
        cos, sin = {}, {}
        half = cfg.rope_dim // 2
        for base in {cfg.rope_theta, cfg.compress_rope_theta}:
            inv = base ** (-torch.arange(half, device=dev, dtype=torch.float32) * 2 / cfg.rope_dim)
            ang = torch.full((B, 1), float(pos), device=dev) * inv[None, :]
            cos[base], sin[base] = ang.cos(), ang.sin()
        # the MoE stand-in: rows spread evenly over the expected local experts
        R, E = cfg.moe_rows(B), cfg.moe_local_experts(B)
        m = -(-R // E)
        j = torch.arange(E * m, device=dev).view(m, E).t()          # row r of expert e is assignment r*E + e
        return StepInputs(
            B=B, max_context=mc,
            tokens=torch.randint(0, cfg.local_vocab, (B,), generator=torch.Generator().manual_seed(B)).to(dev),
            cos=cos, sin=sin, window_idx=window_idx, window_len=torch.full((B,), cfg.window, **i32),
            window_data_off=data_off, window_scale_off=scale_off,
            page_table=pt, index_max_seq_len=cfg.index_max_seq_len(mc),
            c4_len=torch.full((B,), c4, **i32), c4_topk_len=torch.full((B,), min(c4, cfg.index_topk), **i32),
            c128_idx=c128_idx, c128_len=torch.full((B,), n128, **i32),
            ring_pos={r: torch.full((B,), pos % r, dtype=torch.int64, device=dev) for r in (cfg.ring_c4, cfg.ring_c128)},
            q_pad=torch.zeros(B, cfg.kernel_heads, HEAD_DIM, dtype=torch.bfloat16, device=dev),
            moe_tok=(j % B).long(), moe_col=(j % cfg.active_experts).long(), moe_valid=(j < R).float(),
            moe_rows=_rows_by_token(j % B, j < R, B))

    def check(self, inp: StepInputs):
        """The argument checks the step skips (they read the GPU): once per batch, outside capture."""
        cfg = self.cfg
        for lw in {id(w): w for w in self.weights}.values():
            check_sink(lw.attn_sink, inp.q_pad, "sync")
        for c in self.caches:
            check_sparse_decode_args(inp.q_pad, c.window, inp.window_idx, inp.window_len, None, None)
            if c.ratio == 128:
                check_sparse_decode_args(inp.q_pad, c.compressed, inp.c128_idx, inp.c128_len, None, None)
            if c.ratio == 4:
                q = torch.zeros(inp.B, cfg.index_heads, cfg.index_dim, dtype=torch.bfloat16, device=self.device)
                w = torch.zeros(inp.B, cfg.index_heads, device=self.device)
                check_indexer_args(q, c.index, w, inp.c4_len, inp.page_table, inp.index_max_seq_len)

    # --- the step ----------------------------------------------------------------------------
    def use_glue(self, fns: dict | None = None):
        """Replace glue functions by name (the compile lesson), and with key INDEXER_TOPK the stage's
        indexer top-k (a function with the registered impl's signature); None restores the plain ones."""
        self._glue = {name: getattr(step_glue, name) for name in GLUE}
        if fns:
            unknown = set(fns) - set(GLUE) - {INDEXER_TOPK}
            if unknown:
                raise ValueError(f"glue functions must be among {GLUE + (INDEXER_TOPK,)}, got {sorted(unknown)}")
            self._glue.update(fns)

    def step(self, inp: StepInputs, stage: Stage) -> torch.Tensor:
        """One decode step for inp.B requests -> logits float32 [B, local_vocab]."""
        cfg = self.cfg
        served = cfg.max_context if stage.max_context is None else stage.max_context
        if served != inp.max_context:
            raise ValueError(f"inputs were built for max_context {inp.max_context}, stage {stage.name} serves "
                             f"{served}: use model.inputs(B, stage.max_context)")
        if self.selection is not None:
            self.selection.start()
        with record_function("dsv4::embed"):
            x = self.embed[inp.tokens]
            h = x.unsqueeze(1).expand(-1, cfg.hc_mult, -1).contiguous()
        fused = stage.glue == "fused"
        for lw, c in zip(self.weights, self.caches):
            h = step_fused.layer(self, h, lw, c, inp, stage) if fused else self.layer(h, lw, c, inp, stage)
        if fused:
            return step_fused.head(self, h, stage)
        return self.head(h, stage)

    # --- S4's ops, part by part (S5 runs a part here when its fusion is off: step_fused.FUSIONS) --------
    @property
    def fusions(self) -> frozenset:
        """The glue fusions S5's step runs (step_fused.FUSIONS, all by default); a name left out runs
        S4's torch ops for that part. Assign any subset: ``model.fusions = {"mhc", "moe"}``."""
        return self._fusions

    @fusions.setter
    def fusions(self, names):
        if isinstance(names, str):
            raise TypeError(f"fusions must be a set of names among {step_fused.FUSIONS}, got the string {names!r}")
        names = frozenset(names)
        unknown = names - set(step_fused.FUSIONS)
        if unknown:
            raise ValueError(f"unknown fusion(s) {sorted(unknown)}: fusions must be among {step_fused.FUSIONS}")
        self._fusions = names

    def head(self, h, stage: Stage):
        cfg, G = self.cfg, self._glue
        with record_function("dsv4::head"):
            xf, mixes = self.mhc_pre_linear(h, self.hc_head_fn[stage.mhc_gemm], stage)
            pre = torch.sigmoid(mixes * self.hc_head_scale + self.hc_head_base) + cfg.hc_eps
            y = G["mhc_combine"](xf, pre, cfg.hc_mult, torch.bfloat16)
            y = G["rms_norm"](y, self.head_norm, cfg.rms_eps)
            return F.linear(y, self.lm_head).float()

    def mhc_pre_linear(self, h, hc_fn, stage: Stage):
        """h [B, n, D] -> (x float32 [B, nD], mixes float32 [B, (2+n)n]): the GEMM the story ran in fp32."""
        x, rsqrt = self._glue["mhc_flat"](h, self.cfg.rms_eps)
        with record_function(f"dsv4::mhc_linear[{stage.mhc_gemm}]"):
            mixes = F.linear(x.to(stage.mhc_dtype), hc_fn).float()
        return x, mixes * rsqrt

    def mhc_pre(self, h, lw: LayerWeights, part: str, stage: Stage):
        """The mHC before a sublayer (``part`` "attn" or "ffn") -> (its input y, post, comb)."""
        cfg, G = self.cfg, self._glue
        with record_function("dsv4::mhc"):
            x, mixes = self.mhc_pre_linear(h, lw.hc_fn(part, stage.mhc_dtype), stage)
            with record_function("dsv4::sinkhorn"):
                pre, post, comb = mhc_sinkhorn(mixes, getattr(lw, f"hc_{part}_scale"), getattr(lw, f"hc_{part}_base"),
                                               cfg.hc_mult, cfg.sinkhorn_iters, cfg.hc_eps)
            y = G["rms_norm"](G["mhc_combine"](x, pre, cfg.hc_mult, h.dtype), getattr(lw, f"{part}_norm"), cfg.rms_eps)
        return y, post, comb

    def mhc_post(self, o, h, post, comb):
        with record_function("dsv4::mhc"):
            return self._glue["mhc_post"](o, h, post, comb)

    def layer(self, h, lw: LayerWeights, c: LayerCaches, inp: StepInputs, stage: Stage):
        y, post, comb = self.mhc_pre(h, lw, "attn", stage)
        h = self.mhc_post(self.attention(y, lw, c, inp, stage), h, post, comb)
        y, post, comb = self.mhc_pre(h, lw, "ffn", stage)
        return self.mhc_post(self.moe(y, lw, inp), h, post, comb)

    def rope_tables(self, c: LayerCaches, inp: StepInputs):
        base = self.cfg.compress_rope_theta if c.ratio else self.cfg.rope_theta
        return inp.cos[base], inp.sin[base]

    def attention(self, y, lw: LayerWeights, c: LayerCaches, inp: StepInputs, stage: Stage):
        cos, sin = self.rope_tables(c, inp)
        q_lora, w = self.attn_input(y, lw, c, inp, cos, sin)
        qi = self.query(q_lora, lw, c, inp, cos, sin)
        ids = None
        if c.ratio == 4:
            with record_function(f"dsv4::indexer[{stage.indexer_impl}]"):
                top = self.indexer_topk(qi, c, w, inp, stage)
            ids = self.cache_ids(top, inp)
        return self.decode_out(lw, c, inp, stage, self.extra_cache(c, inp, ids), cos, sin)

    @staticmethod
    def extra_cache(c: LayerCaches, inp: StepInputs, ids=None) -> dict:
        """The decode's second cache of a compressed layer: ratio 4 the indexer's picks (``ids``, cache
        token ids), ratio 128 every compressed token; none for a window-only layer."""
        if c.ratio == 4:
            return dict(extra_k_cache=c.compressed, extra_indices=ids, extra_topk_length=inp.c4_topk_len)
        if c.ratio == 128:
            return dict(extra_k_cache=c.compressed, extra_indices=inp.c128_idx, extra_topk_length=inp.c128_len)
        return {}

    def attn_input(self, y, lw: LayerWeights, c: LayerCaches, inp: StepInputs, cos, sin):
        """The input projection and what reads it before the query GEMM: the q LoRA norm; the kv's norm,
        rope and fp8 bytes into the window cache; the compressors' rings; the indexer's weights (ratio 4)
        -> (q_lora, indexer weights or None)."""
        cfg, G, B = self.cfg, self._glue, inp.B
        with record_function("dsv4::attn_proj"):
            qkv = F.linear(y, lw.wqkv_a)
            q_lora = G["rms_norm"](qkv[:, :cfg.q_lora_rank], lw.q_norm, cfg.rms_eps)
            kv = G["rope"](G["rms_norm"](qkv[:, cfg.q_lora_rank:], lw.kv_norm, cfg.rms_eps), cos, sin)
            data, scales = G["kv_cache_bytes"](kv)
            flat = c.window.buffer.view(-1)
            flat[inp.window_data_off] = data
            flat[inp.window_scale_off] = scales
        if c.ratio:
            with record_function("dsv4::compressor"):
                ring = inp.ring_pos[cfg.ring_c4 if c.ratio == 4 else cfg.ring_c128]
                c.state[torch.arange(B, device=y.device), ring] = F.linear(y, lw.compressor).float()
        if c.ratio != 4:
            return q_lora, None
        with record_function("dsv4::indexer_proj"):
            w = F.linear(y, lw.idx_proj).float() * (cfg.index_dim ** -0.5 * cfg.index_heads ** -0.5)
            ring = inp.ring_pos[cfg.ring_c4]
            c.index_state[torch.arange(B, device=y.device), ring] = F.linear(y, lw.idx_compressor).float()
        return q_lora, w

    def query(self, q_lora, lw: LayerWeights, c: LayerCaches, inp: StepInputs, cos, sin):
        """The heads' query (norm, rope) into the padded query; the indexer's (rope) returned on ratio 4."""
        cfg, G, B = self.cfg, self._glue, inp.B
        with record_function("dsv4::attn_proj"):
            q = F.linear(q_lora, lw.wq_b).view(B, cfg.local_heads, cfg.head_dim)
            inp.q_pad[:, :cfg.local_heads].copy_(G["rope"](G["rms_norm"](q, None, cfg.rms_eps), cos, sin))
        if c.ratio != 4:
            return None
        with record_function("dsv4::indexer_proj"):
            return G["rope"](F.linear(q_lora, lw.idx_wq_b).view(B, cfg.index_heads, cfg.index_dim), cos, sin)

    def cache_ids(self, top, inp: StepInputs):
        """The indexer's top-k (logical compressed positions) -> the compressed cache's token ids."""
        with record_function("dsv4::indexer_proj"):
            rows = FULL_PAGE // 4
            safe = top.clamp(min=0).long()
            phys = inp.page_table.long().gather(1, safe // rows) * rows + safe % rows
            return torch.where(top >= 0, phys, torch.full_like(phys, -1)).to(torch.int32)

    def decode_out(self, lw: LayerWeights, c: LayerCaches, inp: StepInputs, stage: Stage, extra: dict, cos, sin):
        """The sparse decode (merged over the caches, the sink applied), the inverse rope, wo_a and wo_b."""
        cfg, B = self.cfg, inp.B
        with record_function(f"dsv4::decode[{stage.decode_impl},c{c.ratio}]"):
            o, _ = flash_mla_sparse_decode(inp.q_pad, c.window, inp.window_idx, inp.window_len, lw.attn_sink,
                                           HEAD_DIM, cfg.head_dim ** -0.5, **extra, impl=stage.decode_impl,
                                           checks="device")
        with record_function("dsv4::attn_proj"):
            o = self._glue["rope"](o[:, :cfg.local_heads], cos, sin, inverse=True)
            o = torch.einsum("bgd,grd->bgr", o.reshape(B, cfg.local_groups, -1), lw.wo_a)
            return F.linear(o.flatten(1), lw.wo_b)

    def indexer_topk(self, qi, c: LayerCaches, w, inp: StepInputs, stage: Stage):
        """The stage's indexer top-k (or the one use_glue put in its place; a fixed selection's)."""
        fn = self._glue.get(INDEXER_TOPK) or impl_info("indexer_topk", stage.indexer_impl).fn
        top = fn(qi, c.index, w, inp.c4_len, inp.page_table, max_seq_len=inp.index_max_seq_len,
                 topk=self.cfg.index_topk)
        fixed = self.fixed("indexer")
        self.seen("indexer", top)
        return top if fixed is None else fixed

    def fixed(self, kind: str):
        """The recorded choice a fixed selection replays here ("indexer" or "route"), else None."""
        return None if self.selection is None else self.selection.fixed(kind)

    def seen(self, kind: str, chosen):
        """Tell a fixed selection what this step chose (it records while recording, ignores while replaying)."""
        if self.selection is not None:
            self.selection.seen(kind, chosen)

    def moe(self, y, lw: LayerWeights, inp: StepInputs):
        _, topw = self.router(y, lw)
        return self.experts(y, lw, inp, topw)

    def router(self, y, lw: LayerWeights):
        """The router's GEMM and DSv4's routing -> (expert ids, their weights)."""
        cfg = self.cfg
        with record_function("dsv4::moe_router"):
            logits = F.linear(y, lw.gate).float()
            fixed = self.fixed("route")
            ids, topw = self._glue["route"](logits, lw.gate_bias, cfg.active_experts, cfg.routed_scale, ids=fixed)
            self.seen("route", ids)
            return ids, topw

    def experts(self, y, lw: LayerWeights, inp: StepInputs, topw, shared_up=None):
        """The routed experts (dispatch, grouped GEMMs, weights, sum) and the shared expert, summed;
        ``shared_up``: the shared expert's up projection when a GEMM made it already (S5's router's)."""
        cfg, G = self.cfg, self._glue
        with record_function("dsv4::moe_experts"):
            xd = y[inp.moe_tok]                                           # [E, m, D] dispatch
            hmid = G["silu_mul"](moe_grouped_gemm(xd, lw.w13)).to(y.dtype)
            yd = moe_grouped_gemm(hmid, lw.w2)                             # [E, m, D] float32
            yd = yd * (topw[inp.moe_tok, inp.moe_col] * inp.moe_valid).unsqueeze(-1)
            out = torch.zeros(inp.B, cfg.hidden, dtype=torch.float32, device=y.device)
            out.index_add_(0, inp.moe_tok.flatten(), yd.flatten(0, 1))
        with record_function("dsv4::moe_shared"):
            up = F.linear(y, lw.shared_w13) if shared_up is None else shared_up
            shared = F.linear(G["silu_mul"](up), lw.shared_w2)
            return (out + shared.float()).to(y.dtype)
