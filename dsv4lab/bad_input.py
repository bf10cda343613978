"""Bad input and what it gets: every kind of unusual or wrong argument the lab has been tried with,
as data, and the table of docs/bad_input.md rendered from it.

Each :class:`Case` names a public entry point, the bad input, the mode it runs in (``checks=``,
see dsv4lab.contracts) and what the caller gets: an exception whose message contains ``says``, or an
answer (``gets``), checked by the case itself (the calls and their checks are dsv4lab.bad_input_calls).
``tests/test_bad_input.py`` runs every case and checks that docs/bad_input.md's block equals :func:`render`,
so the table cannot go stale (``python -m dsv4lab readme`` rewrites it). Shapes are tiny: the whole
table runs in seconds through Triton's CPU interpreter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from . import bad_input_calls as call, cache as C, errors
from .config import INDEX_TOKEN_BYTES, PAGE_SIZE
from .device import mode as dsv4lab_mode, torch_device
from .errors import DeviceInputError
from .registry import impls


@dataclass(frozen=True)
class Case:
    entry: str                     # the public entry point
    bad: str                       # the bad input, in words
    checks: str                    # the mode it was tried in: "device", "sync" or "either"
    run: Callable[[], object]      # makes the call; checks the answer itself where there is one
    raises: type | None = None     # what the call (for a device-mode flag: check_errors()) raises
    says: str = ""                 # ... with this in its message
    gets: str = ""                 # the answer, in words (answered cases, and device-mode flags)

    def outcome(self) -> str:
        err = f"`{self.raises.__name__}`: {self.says}" if self.raises else ""
        if self.gets and err:
            return f"{self.gets}; `check_errors()` raises {err}"
        return self.gets or err


_SAYS_INDEX = errors.MEANING[errors.Flag.INDEX]
_SAYS_TOPK = errors.MEANING[errors.Flag.TOPK_LEN]

CASES: list[Case] = [
    # ---- sparse_decode: the arguments, checked without reading data ----
    Case("sparse_decode", "q is a list", "either", lambda: call.decode(change=lambda a: {**a, "q": a["q"].tolist()}),
         TypeError, "q must be a torch.Tensor, got list"),
    Case("sparse_decode", "q [B, H, 500]", "either",
         lambda: call.decode(change=lambda a: {**a, "q": a["q"][..., :500]}),
         ValueError, "q must have shape [B, H, 512], got [2, 4, 500]"),
    Case("sparse_decode", "q float64", "either", lambda: call.decode(change=lambda a: {**a, "q": a["q"].double()}),
         TypeError, "q must have dtype in ['torch.bfloat16', 'torch.float16', 'torch.float32'], got torch.float64"),
    Case("sparse_decode", "q with no heads, [2, 0, 512]", "either",
         lambda: call.decode(change=lambda a: {**a, "q": a["q"][:, :0]}), ValueError, "q must have H >= 1 heads"),
    Case("sparse_decode", "q on another device than the cache", "either",
         lambda: call.decode(change=lambda a: {**a, "q": a["q"].to("meta")}, dev="cpu"), ValueError,
         "q must be on cpu (the cache's device), got meta"),
    Case("sparse_decode", "the cache's byte tensor instead of a KVCache", "either",
         lambda: call.decode(change=lambda a: {**a, "cache": a["cache"].buffer}), TypeError,
         "cache must be a dsv4lab.cache.KVCache (from pack_kv), got Tensor"),
    Case("sparse_decode", "indices int64", "either",
         lambda: call.decode(change=lambda a: {**a, "indices": a["indices"].long()}),
         TypeError, "indices must have dtype in ['torch.int32'], got torch.int64"),
    Case("sparse_decode", "indices for another batch size, [1, 8]", "either",
         lambda: call.decode(change=lambda a: {**a, "indices": a["indices"][:1]}), ValueError,
         "indices must have shape [2, *], got [1, 8] (dim 0)"),
    Case("sparse_decode", "topk_len int64", "either", lambda: call.decode(topk_len=torch.tensor([1, 1])), TypeError,
         "topk_len must have dtype in ['torch.int32'], got torch.int64"),
    Case("sparse_decode", "attn_sink for 3 heads of 4", "either",
         lambda: call.decode(attn_sink=torch.zeros(3)), ValueError,
         "attn_sink must have shape [4], got [3] (dim 0)"),
    Case("sparse_decode", "sm_scale NaN", "either", lambda: call.decode(sm_scale=math.nan), ValueError,
         "sm_scale must be a positive float (finite, > 0), got nan"),
    Case("sparse_decode", "sm_scale inf", "either", lambda: call.decode(sm_scale=math.inf), ValueError,
         "sm_scale must be a positive float (finite, > 0), got inf"),
    Case("sparse_decode", "sm_scale 0", "either", lambda: call.decode(sm_scale=0), ValueError,
         "sm_scale must be a positive float (finite, > 0), got 0"),
    Case("sparse_decode", "sm_scale True", "either", lambda: call.decode(sm_scale=True), TypeError,
         "sm_scale must be a positive float (finite, > 0; a Python or numpy number), got bool True"),
    Case("sparse_decode", "sm_scale a 0-d tensor", "either",
         lambda: call.decode(sm_scale=torch.tensor(0.05)), TypeError,
         "pass float(x) (a GPU tensor would need a host sync)"),
    Case("sparse_decode", "sm_scale numpy.float32(0.05)", "either", call.sm_scale_numpy,
         gets="accepted: the same answer as 0.05"),
    Case("sparse_decode", "impl='fast'", "either", lambda: call.decode(impl="fast"), ValueError,
         f"impl must be one of {impls('sparse_decode')}, got 'fast'"),   # the registry's names
    Case("sparse_decode", "checks='fast'", "either", lambda: call.decode(checks="fast"), ValueError,
         "checks must be one of ('device', 'sync'), got 'fast'"),
    Case("sparse_decode", "check_ranges=True (the older spelling of checks=)", "either",
         lambda: call.decode(check_ranges=True), TypeError,
         "check_ranges= is gone: pass checks='sync' (the data checked on the host, naming the offending value) "
         "or checks='device' (no host sync), got check_ranges=True"),
    # ---- sparse_decode: shapes that are legal but unusual ----
    Case("sparse_decode", "an empty batch, q [0, 4, 512], indices [0, 8]", "either",
         lambda: call.has_shapes(call.decode(change=lambda a: {**a, "q": a["q"][:0], "indices": a["indices"][:0]}),
                        (0, 4, 512), (0, 4)),
         gets="out [0, 4, 512], lse [0, 4]"),
    Case("sparse_decode", "K = 0 index columns, with a sink", "either", call.k0_answer,
         gets="out 0, lse = the sink (-inf without one)"),
    Case("sparse_decode", "strided views of q, indices, topk_len and attn_sink", "either",
         lambda: call.same_as_contiguous(call.MMA, q=1, indices=1, topk_len=0, attn_sink=0),
         gets="read with their strides: bitwise the answer for contiguous copies"),
    Case("sparse_decode", "a negative index other than -1 (-7)", "either", call.negative_index_answer,
         gets="padding, like -1"),
    Case("sparse_decode", "the same token several times in a row", "either", call.duplicate_index_answer,
         gets="each entry counts (as the reference)"),
    # ---- sparse_decode: values only the device sees ----
    Case("sparse_decode", "an index >= cache.num_tokens", "sync",
         lambda: call.decode(checks="sync", change=call.index_past),
         ValueError, "indices must be < cache.num_tokens (32) or < 0 for padding; indices[0, 1] = 40"),
    Case("sparse_decode", "an index >= cache.num_tokens", "device", lambda: call.flagged(call.index_past_answer),
         DeviceInputError, _SAYS_INDEX, gets="the entry is read as padding"),
    Case("sparse_decode", "topk_len 9 with K = 8", "sync",
         lambda: call.decode(checks="sync", topk_len=call.int32s(9, 1)),
         ValueError, "topk_len must lie in [0, K=8]; topk_len[0] = 9"),
    Case("sparse_decode", "topk_len -3 and 9 with K = 8", "device", lambda: call.flagged(call.topk_len_answer),
         DeviceInputError, _SAYS_TOPK, gets="clamped to 0 and 8"),
    Case("sparse_decode", "a NaN attn_sink", "sync",
         lambda: call.decode(checks="sync", attn_sink=call.sink_with(math.nan)),
         ValueError, call.SINK_NAN),
    Case("sparse_decode", "a NaN attn_sink", "device", lambda: call.flagged(call.nan_sink_answer),
         DeviceInputError, errors.MEANING[errors.Flag.SINK], gets="that head's rows are NaN"),
    Case("sparse_decode", "q holding inf", "sync",
         lambda: call.decode(checks="sync", change=call.q_with_inf), ValueError,
         "q must be finite; q[0, 0, 0] = inf"),
    Case("sparse_decode", "a cache scale byte 140 (the packers write <= 134)", "sync",
         lambda: call.with_bad_cache(lambda c: call.set_scale_byte(c, 0, 3, 140), checks="sync"), ValueError,
         "cache scale bytes must be <= 134 (scale 2^7, the largest the packers write); token 0 (indices[0, 0]) "
         "has 140 in nope group 3"),
    Case("sparse_decode", "a cache scale byte 140", "device", call.scale_byte_device_answer,
         gets="not looked at: a 'cvt' launch reads 2^13 (this table's run); the GPU's 'bits' launches give NaN "
              "rows, flagged as a non-finite output"),
    Case("sparse_decode", "an fp8 NaN byte in a cached token", "sync",
         lambda: call.with_bad_cache(call.nan_byte, checks="sync"), ValueError,
         "cache holds bytes the packers never write: token 0 (indices[0, 0]) has an fp8 NaN byte at nope value 3"),
    Case("sparse_decode", "an fp8 NaN byte in a cached token", "device", call.nan_byte_device_answer,
         gets="not looked at: the GPU's conversion instructions make the rows that read it NaN (flagged as a "
              "non-finite output); the interpreter and the 'bits' dequant read the byte as 480 x its scale"),
    # ---- flash_mla_sparse_decode (SGLang's arguments) ----
    Case("flash_mla_sparse_decode", "head_dim_v 256", "either", lambda: call.merged(head_dim_v=256), ValueError,
         "head_dim_v must be 512 (K = V in DSv4's MLA), got 256"),
    Case("flash_mla_sparse_decode", "extra_k_cache without extra_indices", "either",
         lambda: call.merged(extra_k_cache=call.decode_inputs()[1]), ValueError,
         "extra_k_cache and extra_indices go together: pass both or neither"),
    Case("flash_mla_sparse_decode", "an fp8 page view with the wrong page stride", "either",
         lambda: call.merged(k_cache=call.fp8_pages_with_token_stride()), ValueError,
         "k_cache must be the view SGLang builds over pages of 37440 bytes"),
    # ---- the indexer ----
    Case("indexer_logits", "seq_lens[0] = 129 > max_seq_len", "sync",
         lambda: call.indexer(checks="sync", seq_lens=call.int32s(129, 10)), ValueError,
         "seq_lens must lie in [0, max_seq_len=128]; seq_lens[0] = 129"),
    Case("indexer_logits", "seq_lens 200 and -4, max_seq_len 128", "device", lambda: call.flagged(call.seq_len_answer),
         DeviceInputError, errors.MEANING[errors.Flag.SEQ_LEN], gets="clamped to 128 and 0"),
    Case("indexer_logits", "a live page id -1", "sync",
         lambda: call.indexer(checks="sync", page_table=call.page_rows(((1, -1), (0, -1)))), ValueError,
         "page_table[0, 1] = -1 is a live page of request 0 and must lie in [0, 2)"),
    Case("indexer_logits", "a live page id -1", "device", lambda: call.flagged(call.page_cut_answer), DeviceInputError,
         errors.MEANING[errors.Flag.PAGE], gets="the request ends before that page (-inf from there)"),
    Case("indexer_logits", "page-table entries past the live pages holding junk (-5, 10^9)", "either",
         call.dead_pages_answer, gets="never read, by every impl"),
    Case("indexer_logits", "max_seq_len True", "either", lambda: call.indexer(max_seq_len=True), TypeError,
         "max_seq_len must be a positive int, got bool True"),
    Case("indexer_logits", "max_seq_len 0", "either", lambda: call.indexer(max_seq_len=0), ValueError,
         "max_seq_len must be a positive int, got 0"),
    Case("indexer_logits", "a page table too narrow for max_seq_len 200", "either",
         lambda: call.indexer(max_seq_len=200),
         ValueError, "page_table must have at least ceil(max_seq_len/64) = 4 columns, got 2"),
    Case("indexer_logits", "weights holding NaN", "sync",
         lambda: call.indexer(checks="sync", weights=torch.full((2, 4), math.nan, device=torch_device())), ValueError,
         "weights must be finite; weights[0, 0] = nan"),
    Case("indexer_logits", f"q float32 for impl={call.triton_indexer()!r}", "either",
         lambda: call.indexer(change=lambda a: {**a, "q": a["q"].float()}), TypeError,
         f"impl={call.triton_indexer()!r} takes q in bfloat16 or float8_e4m3fn"),
    Case("indexer_logits", "strided views of seq_lens and weights", "either", call.strided_seq_lens,
         gets="read with their strides"),
    Case("indexer_logits", "an empty batch", "either",
         lambda: call.has_shapes(call.indexer(change=call.no_requests), (0, 128)), gets="logits [0, max_seq_len]"),
    Case("indexer_topk", "topk 0", "either", lambda: call.indexer("indexer_topk", topk=0), ValueError,
         "topk must be a positive int, got 0"),
    Case("indexer_topk", "topk 2**31 - 1 with max_seq_len 128", "either",
         lambda: call.indexer("indexer_topk", topk=2**31 - 1), ValueError,
         "topk must be at most max(max_seq_len, 2048) = 2048 (a row has max_seq_len positions; every slot past "
         "them would be -1 padding), got 2147483647"),
    Case("indexer_topk", "topk 2**28 (a GiB of output slots a request)", "either",
         lambda: call.indexer("indexer_topk", topk=2**28), ValueError,
         "topk must be at most max(max_seq_len, 2048) = 2048"),
    Case("indexer_topk", "topk numpy.int32(16), max_seq_len numpy.int64(128)", "either", call.topk_numpy,
         gets="accepted as ints"),
    # ---- the cache packers ----
    Case("cache.pack_kv", "a NaN value", "either",
         lambda: C.pack_kv(torch.zeros(2, 512).index_fill_(1, torch.tensor([5]), math.nan)), ValueError,
         "kv must be finite (as float32); the fp8 cache cannot store NaN or inf: kv[row 0, column 5] = nan"),
    Case("cache.pack_kv", "a nope value 1e5 (past 448 x 2^7)", "either",
         lambda: C.pack_kv(torch.zeros(2, 512).index_fill_(1, torch.tensor([7]), 1e5)), ValueError,
         "kv nope values must satisfy |x| <= 57344"),
    Case("cache.pack_kv", "a rope value 3.4e38 (finite in float32, past bf16)", "either",
         lambda: C.pack_kv(torch.zeros(2, 512).index_fill_(1, torch.tensor([500]), 3.4e38)), ValueError,
         "kv rope values (columns 448..511) are stored in bf16 and must satisfy |x| <= 3.39e+38"),
    Case("cache.pack_kv", "no token, [0, 512]", "either", lambda: C.pack_kv(torch.zeros(0, 512)), ValueError,
         "kv must hold at least one token, got N=0"),
    Case("cache.pack_kv", "page_size True", "either", lambda: C.pack_kv(torch.zeros(2, 512), True), TypeError,
         "page_size must be a positive int, got bool True"),
    Case("cache.pack_kv", "page_size numpy.int64(16)", "either",
         lambda: call.has_shapes(C.pack_kv(torch.zeros(2, 512), np.int64(16)).buffer, (1, C.page_bytes(16))),
         gets="accepted as an int"),
    Case("cache.pack_index_k", "an inf value", "either",
         lambda: C.pack_index_k(torch.zeros(2, 128).index_fill_(1, torch.tensor([1]), math.inf)), ValueError,
         "k must be finite (as float32)"),
    Case("cache.KVCache", "num_tokens past the pages that exist", "either",
         lambda: call.kvcache(torch.zeros(1, C.page_bytes(PAGE_SIZE), dtype=torch.uint8), num_tokens=200), ValueError,
         "KVCache.num_tokens (200) must be <= num_pages x page_size (1 x 64 = 64)"),
    Case("cache.KVCache", "a page buffer whose rows are not contiguous", "either",
         lambda: call.kvcache(torch.zeros(2, 2 * C.page_bytes(PAGE_SIZE), dtype=torch.uint8)[:, ::2]), ValueError,
         "KVCache.buffer must be row-contiguous"),
    Case("cache.IndexKCache", "a strided page view", "either",
         lambda: C.IndexKCache(torch.zeros(4, PAGE_SIZE, 1, INDEX_TOKEN_BYTES, dtype=torch.uint8)[::2], PAGE_SIZE),
         ValueError,
         "IndexKCache.kv must be contiguous"),
    Case("cache.dequant_kv", "a token id past the cache", "either",
         lambda: C.dequant_kv(C.pack_kv(torch.zeros(4, 512)), torch.tensor([4])), ValueError,
         "token_ids must lie in [0, 4), got range [4, 4]"),
    # ---- what cannot be computed: one non-finite contract for every impl ----
    Case("sparse_decode", "q holding NaN in one row, every impl", "device", lambda: call.flagged(call.nan_q_every_impl),
         DeviceInputError, "an output row came out NaN or inf",
         gets="that row NaN in out and lse (never lse -inf), the others answered"),
    Case("sparse_decode", "sm_scale 1e-300 (below float32's smallest), every impl", "device",
         lambda: call.extreme_scale_every_impl(1e-300), gets="the float64 answer (every score ~0: a uniform average), "
         "or NaN rows, flagged (the GPU's folded-scale launches with padding)"),
    Case("sparse_decode", "sm_scale 1e38 (scores past float32), every impl", "device",
         lambda: call.flagged(lambda: call.extreme_scale_every_impl(1e38, all_nan=True)), DeviceInputError,
         "an output row came out NaN or inf, or could not be computed", gets="every row NaN in out and lse"),
    Case("sparse_decode", "sm_scale 1e30 with every score negative (all below the running max's start), "
         "every impl", "device", lambda: call.extreme_scale_every_impl(1e30, negative=True),
         gets="the float64 answer (the reference) or NaN rows, flagged (the kernels): never out 0 with lse -inf"),
    Case("flash_mla_sparse_decode", "both caches' lse near -1.8e27 (sm_scale 1e25, every score negative), "
         "every impl", "device", call.merged_low_lse,
         gets=f"the float64 answer; impl={call.SGLANG!r} (SGLang's merge drops an lse <= -1e20) NaN rows, flagged"),
    Case("indexer_topk", "a NaN weight, every impl", "device",
         lambda: call.flagged(lambda: call.indexer_flagged_every_impl("indexer_topk", call.nan_weight)),
         DeviceInputError,
         errors.MEANING[errors.Flag.INDEXER_NONFINITE], gets="a top-k"),
    Case("indexer_logits", "a NaN weight, every impl", "device",
         lambda: call.flagged(lambda: call.indexer_flagged_every_impl("indexer_logits", call.nan_weight)),
         DeviceInputError,
         "indexer: non-finite q or weights", gets="the logits the arithmetic gives (NaN in that row)"),
    Case("indexer_topk", "weights 3e38 (the logits overflow), every impl", "device",
         lambda: call.flagged(lambda: call.indexer_flagged_every_impl("indexer_topk", call.huge_weights)),
         DeviceInputError,
         "a live position's logit that came out NaN or inf", gets="a top-k"),
    # ---- devices and modes the ops do not run in ----
    Case("sparse_decode", "every tensor on the meta device (then check_errors(): clean, as before)", "either",
         lambda: call.then_checks_work(call.meta_decode), ValueError,
         "cache is on meta, which holds no data: in interpret mode (Triton's CPU interpreter) dsv4lab's ops take "
         "cpu tensors" if dsv4lab_mode() == "interpret" else "cache is on meta, which holds no data"),
    Case("indexer_topk", "every tensor on the meta device (then check_errors(): clean)", "either",
         lambda: call.then_checks_work(call.meta_indexer), ValueError, "index_cache is on meta, which holds no data"),
    Case("sparse_decode", "a call in DSV4LAB_MODE=compile", "either", call.compile_mode_call, ValueError,
         "DSV4LAB_MODE=compile: dsv4lab's kernels are compiled for a GPU this machine lacks and never run"),
    # ---- sizes and storage that cannot work ----
    Case("sparse_decode", "sm_scale 10**400 (a Python int past float)", "either",
         lambda: call.decode(sm_scale=10**400), ValueError,
         "sm_scale must be a positive float (finite, > 0), got an int of 1329 bits, past float's range"),
    Case("sparse_decode", "all padding on a cache with no token (num_tokens 0), every impl", "either",
         call.empty_cache_all_padding, gets="out 0, lse -inf (impl='reference' too)"),
    Case("indexer_logits", "max_seq_len 2**31", "either", lambda: call.indexer(max_seq_len=2**31), ValueError,
         "max_seq_len must be at most 2**31 - 1 (positions are int32), got 2147483648"),
    Case("cache.pack_kv", "page_size 2**40", "either", lambda: C.pack_kv(torch.zeros(2, 512), 2**40), ValueError,
         "page_size must be at most 2**31 - 1 (token indices are int32), got 1099511627776"),
    Case("cache.pack_kv", "page_size 2**30 for 2 tokens", "either", lambda: C.pack_kv(torch.zeros(2, 512), 2**30),
         ValueError, "pack_kv would allocate 584 GiB (1 page(s) of 1073741824 tokens x 584 bytes for 2 tokens)"),
    Case("cache.KVCache", "a page buffer 8 bytes into a byte pool", "either", call.misaligned_pool, ValueError,
         "KVCache.buffer must start at a 16-byte aligned address (the kernels read 16-byte vectors)"),
    # ---- environment, command line, recorded data ----
    Case("import dsv4lab / CLI", "DSV4LAB_MODE=tpu", "either",
         lambda: call.exits_2_with(["info"], "dsv4lab: DSV4LAB_MODE must be 'cuda', 'interpret' or 'compile', got 'tpu'",
                               {"DSV4LAB_MODE": "tpu"}),
         gets="exit status 2 and one line on stderr: dsv4lab: DSV4LAB_MODE must be 'cuda', 'interpret' or "
              "'compile', got 'tpu' (in Python: `ModeError`, one line in Jupyter)"),
    Case("CLI", "python -m dsv4lab bench decode --batch 0", "either",
         lambda: call.exits_2_with(["bench", "decode", "--batch", "0"], "argument --batch: must be an int >= 1, got 0"),
         gets="exit status 2 and one line on stderr: argument --batch: must be an int >= 1, got 0 (see --help)"),
    Case("config.shapes", "mode 'gpu'", "either", call.shapes_bad_mode, ValueError,
         "mode must be 'cuda', 'interpret' or 'compile' (dsv4lab.device.mode()), got 'gpu'"),
    Case("runs.load", "a part no run recorded", "either", call.runs_missing, FileNotFoundError,
         "run 'h200' has no part 'no_such_part'"),
]




def render() -> str:
    """docs/bad_input.md's table of :data:`CASES`."""
    lines = ["| # | entry point | bad input | checks | what it gets |", "|---|---|---|---|---|"]
    for i, c in enumerate(CASES, 1):
        cells = [str(i), f"`{c.entry}`", c.bad, c.checks, c.outcome()]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)
