"""The indexer of S0-S3: SGLang's CUDA-graph-safe torch fallback, its GEMM in fp32 (S0) and in bf16 (S3).

The lightning indexer scores every past token of a request for the sparse attention's
top-k (docs/dsv4.md):

    logits[b, t] = k_scale[t] * sum_h w[b, h] * relu(q[b, h] . k8[t]),  t < seq_len[b]; -inf beyond

SGLang's fallback for sm_120, the story's node (``fp8_paged_mqa_logits_torch_sm120`` in
dsv4/indexer.py; on other GPUs SGLang calls DeepGEMM's kernel, or ``fp8_paged_mqa_logits_torch``,
which writes 0 rather than -inf past seq_len), is vectorized so that it captures in a CUDA graph: it gathers ``page_table[:, :ceil(max_seq_len / 64)]``,
dequantizes all of it to bf16 [B, max_pages * 64, 128], runs one ``torch.bmm`` with q, then
relu, the head weights, the sum over heads, the scale and the mask as separate kernels.
Every step pays for the *maximum* context, whatever the live one. The story's first
version forced that bmm to fp32 (a SIMT GEMM: 17% of its profile); the fix ran it in bf16
on tensor cores. Both are here (``gemm_dtype``), and SGLang's own function, read from its
wheel, as ``impl="sglang"`` (SGLang also splits batches above 1024 rows into chunks; the lab's
copy does not). S4 (triton_indexer.py) removes the max-context cost.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import math
import os

import torch
import torch.nn.functional as F

from ...config import INDEX_DIM
from ...cache import IndexKCache
from ...registry import register
from ..decode.sglang_peer import SGLANG_VERSION, SGLangMissing
from ..guards import flag_nonfinite_logits

_SGLANG_REL = ("srt", "layers", "attention", "dsv4", "indexer.py")
_SGLANG_FN = "fp8_paged_mqa_logits_torch_sm120"


def logits_torch(q, index_cache: IndexKCache, weights, seq_lens, page_table, max_seq_len: int,
                 gemm_dtype=torch.bfloat16):
    """The fallback's arithmetic, step by step as SGLang runs it, over the max context.

    ``gemm_dtype`` is the bmm's operand type: bf16 (SGLang; tensor cores, the product is
    rounded to bf16) or fp32 (the story's first version; a SIMT GEMM)."""
    B, H, D = q.shape
    ps = index_cache.page_size
    max_pages = -(-max_seq_len // ps)
    L = max_pages * ps
    flat = index_cache.kv.view(-1, ps * (D + 4))
    pages = flat[page_table[:, :max_pages].clamp(min=0).long()]           # [B, max_pages, 64 * 132] bytes
    k = pages[..., : ps * D].contiguous().view(torch.float8_e4m3fn).to(gemm_dtype).view(B, L, D)
    k_scale = pages[..., ps * D:].contiguous().view(torch.float32).view(B, L)
    score = torch.bmm(k, q.to(gemm_dtype).transpose(1, 2))                # [B, L, H]
    score = F.relu(score) * weights.float().unsqueeze(1)
    logits = score.sum(dim=2) * k_scale
    out = logits.new_full((B, max_seq_len), float("-inf"))
    out[:, : min(L, max_seq_len)] = logits[:, :max_seq_len]
    pos = torch.arange(max_seq_len, device=q.device)
    return out.masked_fill_(pos[None, :] >= seq_lens[:, None], float("-inf"))


def topk_from_logits(logits, k: int, seq_lens=None):
    """Positions of the k largest logits per row that are not -inf (NaN above every number, as
    torch.topk), -1 where a row has fewer: the same contract as reference.topk_indices, on the GPU
    without a host sync (graph-safe). With ``seq_lens`` (as sanitized: the registered impls), a live
    logit that is not finite is flagged (guards.flag_nonfinite_logits)."""
    if seq_lens is not None:
        flag_nonfinite_logits(logits, seq_lens)
    B, L = logits.shape
    vals, idx = torch.topk(logits, min(k, L), dim=-1)
    idx = torch.where(vals != -math.inf, idx, torch.full_like(idx, -1)).int()
    if k > L:
        idx = torch.cat([idx, idx.new_full((B, k - L), -1)], dim=1)
    return idx


def sglang_indexer_file() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SGLangMissing(f"sglang is not installed; install it with `pip install --no-deps sglang=={SGLANG_VERSION}`")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, *_SGLANG_REL)
        if os.path.exists(path):
            return path
    raise SGLangMissing(f"sglang is installed but has no {'/'.join(_SGLANG_REL)}")


@functools.cache
def sglang_function():
    """SGLang's ``fp8_paged_mqa_logits_torch_sm120``, compiled from its source in the wheel.

    Its module imports the whole serving stack, so only this function's definition is taken
    (by ``ast``) and run with what it uses: torch, F, the fp8 dtype and an arange cache."""
    path = sglang_indexer_file()
    tree = ast.parse(open(path).read(), path)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == _SGLANG_FN)
    ns = {"torch": torch, "F": F, "Any": object, "FP8_DTYPE": torch.float8_e4m3fn, "_arange_cache": {}}
    exec(compile(ast.Module([fn], type_ignores=[]), path, "exec"), ns)
    return ns[_SGLANG_FN]


def unavailable_reason() -> str | None:
    """None when SGLang's function can be read from its wheel, else why (and how to install it)."""
    try:
        sglang_function()
    except ImportError as e:
        return str(e)
    return None


def logits_sglang(q, index_cache, weights, seq_lens, page_table, max_seq_len):
    fn = sglang_function()
    return fn(q.unsqueeze(1), index_cache.kv, weights.float(), seq_lens, page_table, None, max_seq_len,
              clean_logits=False)


for _name, _dt in (("torch_fp32", torch.float32), ("torch_bf16", torch.bfloat16)):
    def _logits(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, _dt=_dt):
        return logits_torch(q, index_cache, weights, seq_lens, page_table, max_seq_len, _dt)

    def _topk(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, topk, _dt=_dt):
        return topk_from_logits(logits_torch(q, index_cache, weights, seq_lens, page_table, max_seq_len, _dt), topk,
                                seq_lens)
    _props = dict(stage="S0" if _dt == torch.float32 else "S3", reads_dead_pages=True,
                  tags=("recorded", "exact") if _dt == torch.float32 else ("recorded",),
                  description=f"SGLang's graph-safe torch fallback over the max context, {_dt} bmm")
    register("indexer_logits", _name, **_props)(_logits)
    register("indexer_topk", _name, **_props)(_topk)


@register("indexer_logits", "sglang", stage="S3", needs=("sglang",), reads_dead_pages=True, tags=("recorded",),
          available=unavailable_reason,
          description="SGLang's fp8_paged_mqa_logits_torch_sm120 (bf16 bmm over the max context), from its wheel")
def _logits_sglang(q, index_cache, weights, seq_lens, page_table, *, max_seq_len):
    return logits_sglang(q, index_cache, weights, seq_lens, page_table, max_seq_len)


@register("indexer_topk", "sglang", stage="S3", needs=("sglang",), reads_dead_pages=True, tags=("recorded",),
          available=unavailable_reason,
          description="SGLang's fp8_paged_mqa_logits_torch_sm120 (bf16 bmm over the max context), from its wheel")
def _topk_sglang(q, index_cache, weights, seq_lens, page_table, *, max_seq_len, topk):
    return topk_from_logits(logits_sglang(q, index_cache, weights, seq_lens, page_table, max_seq_len), topk, seq_lens)


assert INDEX_DIM == 128
