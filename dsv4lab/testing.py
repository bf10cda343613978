"""One way to judge a kernel: fresh random inputs, poisoned outputs, relative error.

``rel_err(out, ref) = ||out - ref|| / ||ref||`` over finite reference entries;
NaN anywhere in ``out`` never passes. Tolerances (why):

* out <= 5e-3: bf16 output rounding alone is ~1.6e-3 and P is rounded to bf16
  before the PV product, another ~1e-3; split-K's bf16 partials (the GPU default) add one
  more rounding (2.1e-3 -> 2.6e-3 measured on the H200); 5e-3 leaves room for that, not for
  a bug (a dropped token or a wrong scale costs >= 1e-2 at these sizes).
* lse <= 1e-3 on finite entries: lse is accumulated in fp32.
* mma vs simt <= 6.7e-3: the story's published bound between the two kernels.
* indexer logits <= 1e-4 (Triton, torch fp32): q (bf16 or fp8) and the fp8 keys are exact
  in bf16 and their products exact in fp32; only the fp32 summation order differs (~1e-7).
* indexer logits <= 5e-3 (torch bf16, SGLang's path): its bmm rounds every score to bf16
  (2^-9 rms), and the signed head weights cancel in the sum, which magnifies it: 1.4e-3 to
  2.1e-3 measured over 12 seeds. Top-k: the share of the reference's positions found
  (recall; >= 0.997 measured for the bf16 path, 1.0 for the exact ones).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from .cache import pack_index_k, pack_kv
from .config import HEAD_DIM, PAGE_SIZE, WINDOW_PAGE_SIZE
from .device import torch_device

OUT_TOL = 5e-3
LSE_TOL = 1e-3
VS_SIMT_TOL = 6.7e-3
INDEXER_TOL = 1e-4
INDEXER_BF16_TOL = 5e-3
#: one decode step's logits, stage against stage (dsv4lab.replay.STAGES compute the same step with other
#: kernels and GEMM dtypes): bf16 activations through every layer, each stage rounding in its own order;
#: a wrong kernel or a lost cache moves them by O(1)
STEP_TOL = 3e-2


def indexer_tol(impl: str) -> float:
    """The logits bound for an indexer impl: INDEXER_TOL where q . k is exact (the registry's tag
    "exact"), else the bf16 one."""
    from .registry import impl_info
    return INDEXER_TOL if "exact" in impl_info("indexer_logits", impl).tags else INDEXER_BF16_TOL


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64 over entries where ref is finite; inf if out has NaN
    or disagrees with ref on which entries are finite."""
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any():
        return float("inf")
    fin = torch.isfinite(ref)
    if not torch.equal(fin, torch.isfinite(out)) or not torch.equal(out[~fin], ref[~fin]):
        return float("inf")
    num = (out[fin] - ref[fin]).norm()
    den = ref[fin].norm()
    if den == 0:
        return float(num)
    return float(num / den)


def strided_view(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """The values of ``x`` in a view with stride 2 along ``dim`` (every other element of a tensor twice
    as long): what a caller holding a slice of a bigger buffer passes. Kernels must read its strides."""
    shape = list(x.shape)
    shape[dim] *= 2
    big = torch.zeros(shape, dtype=x.dtype, device=x.device)
    view = big[(slice(None),) * dim + (slice(0, None, 2),)]
    view.copy_(x)
    return view


@contextlib.contextmanager
def poisoned():
    """Kernel outputs come pre-filled with NaN inside this block (see kernels.buffers.alloc)."""
    from .kernels import buffers
    old = buffers._POISON[0]
    buffers._POISON[0] = True
    try:
        yield
    finally:
        buffers._POISON[0] = old


@dataclass
class DecodeInputs:
    q: torch.Tensor
    cache: object
    indices: torch.Tensor
    topk_len: torch.Tensor | None = None
    attn_sink: torch.Tensor | None = None

    def kwargs(self):
        return dict(topk_len=self.topk_len, attn_sink=self.attn_sink)


def make_decode_inputs(B, H, K, *, context=None, page_size=PAGE_SIZE, seed=None, device=None,
                       pad_frac=0.0, topk_len=False, sink=False, kv_scale=1.0) -> DecodeInputs:
    """Random decode inputs in the campaign's setting: request b owns tokens
    [b*context, (b+1)*context) of one paged cache and attends to K distinct of them.
    ``pad_frac`` of the index entries become -1 at random places; ``topk_len`` draws a
    valid length per row in [0, K]; ``sink`` draws an attention sink per head."""
    device = device or torch_device()
    g = torch.Generator(device="cpu")
    g.manual_seed(torch.seed() if seed is None else seed)
    context = context or max(K, 1)
    n = B * context
    kv = (torch.randn(n, HEAD_DIM, generator=g) * kv_scale).to(device)
    cache = pack_kv(kv, page_size)
    del kv
    q = torch.randn(B, H, HEAD_DIM, generator=g).to(torch.bfloat16).to(device)
    kk = min(K, context)
    pick = torch.rand(B, context, generator=g).argsort(dim=1)[:, :kk]
    idx = pick + torch.arange(B)[:, None] * context
    if kk < K:
        idx = torch.cat([idx, torch.full((B, K - kk), -1)], dim=1)
    if pad_frac:
        idx = torch.where(torch.rand(B, K, generator=g) < pad_frac, torch.full_like(idx, -1), idx)
    tl_ = torch.randint(0, K + 1, (B,), generator=g, dtype=torch.int32).to(device) if topk_len else None
    sk = (torch.randn(H, generator=g) * 2).to(device) if sink else None
    return DecodeInputs(q, cache, idx.to(torch.int32).to(device), tl_, sk)


@dataclass
class MergedDecodeInputs:
    """One DSv4 decode step over two caches, as SGLang's ``flash_mla_sparse_decode_triton`` takes
    it: the window cache (pages of 256) and, optionally, the compressed cache (pages of 64),
    each with its own indices and topk_len; one q and one sink (both held by ``window``)."""
    window: DecodeInputs
    compressed: DecodeInputs | None = None

    def sglang_args(self, softmax_scale=None) -> tuple:
        """SGLang's ten arguments in SGLang's layout: q [B, 1, H, 512], the fp8 page views
        [num_pages, page_size, 1, 584], indices [B, 1, K]."""
        w, c = self.window, self.compressed
        return (w.q.unsqueeze(1), w.cache.k_cache, w.indices.unsqueeze(1), w.topk_len, w.attn_sink, HEAD_DIM,
                softmax_scale, c.cache.k_cache if c else None, c.indices.unsqueeze(1) if c else None,
                c.topk_len if c else None)

    def reference(self, softmax_scale=None):
        """Float64: (out float32 [B, H, 512], lse float32 [B, H])."""
        from . import reference
        w, c = self.window, self.compressed
        return reference.flash_mla_sparse_decode(w.q, w.cache, w.indices, w.topk_len, w.attn_sink, softmax_scale,
                                                 c.cache if c else None, c.indices if c else None,
                                                 c.topk_len if c else None)


def make_merged_decode_inputs(B, H, window_k, compressed_k=None, *, window_context=None, compressed_context=None,
                              seed=None, device=None, pad_frac=0.0, topk_len=False, sink=False) -> MergedDecodeInputs:
    """Random two-cache decode inputs (make_decode_inputs for each cache): request b attends to
    ``window_k`` of its ``window_context`` tokens in the window cache and, with ``compressed_k``, to
    ``compressed_k`` of its ``compressed_context`` tokens in the compressed cache."""
    g = torch.Generator(device="cpu")
    g.manual_seed(torch.seed() if seed is None else seed)
    seeds = torch.randint(0, 2**62, (2,), generator=g).tolist()
    w = make_decode_inputs(B, H, window_k, context=window_context, page_size=WINDOW_PAGE_SIZE, seed=seeds[0],
                           device=device, pad_frac=pad_frac, topk_len=topk_len, sink=sink)
    c = None
    if compressed_k:
        c = make_decode_inputs(B, H, compressed_k, context=compressed_context, page_size=PAGE_SIZE,
                               seed=seeds[1], device=device, pad_frac=pad_frac, topk_len=topk_len)
        c.q = w.q
    return MergedDecodeInputs(w, c)


def check_decode(impl, inp: DecodeInputs, *, against: str = "reference"):
    """Run ``impl`` on poisoned outputs; return (out rel. error, lse rel. error) vs ``against``. ``impl``
    is a registered name, or a callable ``run(inp) -> (out, lse)``: a launch no impl names (a tile
    config, a sweep's candidate, the story's kernel at another BLOCK_H) judged the same way."""
    from . import api, reference
    run = impl if callable(impl) else lambda i: api.sparse_decode(i.q, i.cache, i.indices, impl=impl, **i.kwargs())
    with poisoned():
        out, lse = run(inp)
    if against == "reference":
        ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, **inp.kwargs())
    else:
        ro, rl = api.sparse_decode(inp.q, inp.cache, inp.indices, impl=against, **inp.kwargs())
    return rel_err(out.float(), ro.float()), rel_err(lse, rl)


def runnable_impls(op: str = "sparse_decode") -> list:
    """The registered impls of ``op`` this process can run (a new impl is walked as soon as it is
    registered): all but those whose ``Impl.unavailable()`` says why not here (the Hopper kernel off
    sm_90, SGLang's code where its wheel is missing)."""
    from .registry import registered
    return sorted(i.name for i in registered(op) if i.unavailable() is None)


def right_or_nan(got, want, flags) -> int:
    """The decode's non-finite contract on one call: each row of ``got`` (out, lse) is ``want``'s (the
    float64 reference's, as float32) or NaN in both out and lse, with errors.Flag.NONFINITE in ``flags``
    exactly when a row is NaN; never a plausible other number, never lse -inf ("no token") for a row
    the reference answers. Returns how many rows are NaN."""
    from .errors import Flag
    (out, lse), (ro, rl) = got, want
    nan = torch.isnan(lse)
    assert bool(torch.isnan(out.float()).flatten(2).any(-1)[nan].all()), "a NaN lse with a finite output"
    assert bool(flags & Flag.NONFINITE) == bool(nan.any()), (flags, int(nan.sum()))
    ok = ~nan
    if bool(ok.any()):
        e = rel_err(out.float()[ok], ro.to(out.device)[ok]), rel_err(lse[ok], rl.to(lse.device)[ok])
        assert e[0] <= OUT_TOL and e[1] <= LSE_TOL, e
    return int(nan.sum())


def negative_scores_inputs(B=2, H=4, K=8, page_size=16, seed=5, device=None):
    """(q, cache, indices) whose every score is negative (positive cache values, a negative q): with a
    large sm_scale every scaled score lies far below zero."""
    g = torch.Generator().manual_seed(seed)
    device = device or torch_device()
    cache = pack_kv((torch.rand(B * K * 2, HEAD_DIM, generator=g) + 0.1).to(device), page_size)
    q = (-(torch.rand(B, H, HEAD_DIM, generator=g) + 0.1)).to(torch.bfloat16).to(device)
    return q, cache, torch.arange(B * K, dtype=torch.int32, device=device).reshape(B, K)


@dataclass
class IndexerInputs:
    q: torch.Tensor
    cache: object
    weights: torch.Tensor
    seq_lens: torch.Tensor
    page_table: torch.Tensor
    max_seq_len: int

    def args(self):
        return self.q, self.cache, self.weights, self.seq_lens, self.page_table


def make_indexer_inputs(B, H, max_seq_len, *, seq_lens=None, seed=None, device=None,
                        q_dtype=torch.bfloat16) -> IndexerInputs:
    """Random indexer inputs: ``seq_lens`` (a list, one int for every row, or None: random in
    [0, max_seq_len]) live tokens per request, whose pages are distinct physical pages of one
    shared fp8 cache in random order; page-table entries past a request's live pages are -1
    (never read). The page table has ceil(max_seq_len / 64) columns."""
    device = device or torch_device()
    g = torch.Generator(device="cpu")
    g.manual_seed(torch.seed() if seed is None else seed)
    if seq_lens is None:
        lens = torch.randint(0, max_seq_len + 1, (B,), generator=g)
    else:
        lens = torch.as_tensor([seq_lens] * B if isinstance(seq_lens, int) else seq_lens)
    ps = PAGE_SIZE
    live = (lens + ps - 1) // ps
    total = max(1, int(live.sum()))
    cache = pack_index_k((torch.randn(total * ps, 128, generator=g)).to(device))
    order = torch.randperm(total, generator=g)
    table = torch.full((B, -(-max_seq_len // ps)), -1, dtype=torch.int32)
    start = 0
    for b in range(B):
        n = int(live[b])
        table[b, :n] = order[start:start + n].int()
        start += n
    q = torch.randn(B, H, 128, generator=g).to(q_dtype)
    w = torch.randn(B, H, generator=g) * H ** -0.5
    return IndexerInputs(q.to(device), cache, w.to(device), lens.int().to(device), table.to(device), max_seq_len)


def topk_recall(top: torch.Tensor, ref: torch.Tensor, ref_logits: torch.Tensor | None = None) -> float:
    """Share of the reference top-k positions (not -1) that ``top`` found, over all rows; 1.0
    when the reference has none. -1 padding must match in count, or the recall is 0. With
    ``ref_logits``, ties count: a position of ``top`` whose reference logit equals the k-th
    largest is as good as the one the reference's tie-break kept."""
    found = want = 0
    for b, (a, r) in enumerate(zip(top.tolist(), ref.tolist())):
        rs = {v for v in r if v >= 0}
        if sum(v >= 0 for v in a) != len(rs):
            return 0.0
        hit = rs & set(a)
        if ref_logits is not None and rs:
            kth = min(float(ref_logits[b, v]) for v in rs)
            hit = {v for v in a if v >= 0 and float(ref_logits[b, v]) >= kth}
        found += min(len(hit), len(rs))
        want += len(rs)
    return found / want if want else 1.0


def check_indexer(impl: str, inp: IndexerInputs, topk: int = 512):
    """Run ``impl`` on poisoned outputs: (logits rel. error, top-k recall) against the float64 reference."""
    from . import api, reference
    with poisoned():
        logits = api.indexer_logits(*inp.args(), max_seq_len=inp.max_seq_len, impl=impl)
        top = api.indexer_topk(*inp.args(), max_seq_len=inp.max_seq_len, topk=topk, impl=impl)
    ref = reference.indexer_logits(*inp.args(), inp.max_seq_len)
    return rel_err(logits, ref), topk_recall(top, reference.topk_indices(ref, topk), ref)


def check_indexer_step(inp: IndexerInputs, topk: int = 512, got: torch.Tensor | None = None) -> dict:
    """The indexer step over the live context (S4's indexer_topk impl's registered function, what
    a captured graph runs: no API checks), run on poisoned outputs unless its positions ``got`` are given:
    ``exact``, they are the contract (reference.topk_positions) on the Triton kernel's own logits;
    ``recall``, the share of the float64 reference's selection found (ties counted); ``logits_err``, the
    Triton logits against the float64 ones; ``ok``, all three as they must be."""
    from . import reference
    from .kernels.indexer.triton_indexer import logits_triton
    from .registry import impl_info
    from .stages import stage
    with poisoned():
        if got is None:
            got = impl_info("indexer_topk", stage("S4").indexer_impl).fn(*inp.args(), max_seq_len=inp.max_seq_len, topk=topk)
        logits = logits_triton(*inp.args(), inp.max_seq_len)
    ref = reference.indexer_logits(*inp.args(), inp.max_seq_len)
    got = got.cpu()
    exact = bool(torch.equal(got, reference.topk_positions(logits, topk).cpu()))
    recall = topk_recall(got, reference.topk_indices(ref, topk).cpu(), ref.cpu())
    err = rel_err(logits, ref)
    return dict(exact=exact, recall=recall, logits_err=err, padded=int((got == -1).sum()),
                ok=exact and recall == 1.0 and err <= INDEXER_TOL)


_PROBE = """
import json, sys, time, torch, dsv4lab
from dsv4lab.testing import check_decode, make_decode_inputs
t = time.time()
inp = make_decode_inputs(2, 64, 200, context=300, topk_len=True, sink=True, pad_frac=0.1, seed=1)
e_out, e_lse = check_decode(sys.argv[1], inp)
if torch.cuda.is_available():
    torch.cuda.synchronize()
print(json.dumps({"out_err": e_out, "lse_err": e_lse, "seconds": time.time() - t}))
"""


def probe(impl: str, timeout_s: float = 90.0) -> dict:
    """One small decode with ``impl`` in a child process, judged against the float64 reference:
    {"ok", "out_err", "lse_err", "seconds"} or {"ok": False, "error"}. A kernel that has never run may
    hang (an mbarrier phase off by one never completes) or fault; in a child process that costs
    ``timeout_s`` and a row, not the calling process (a hung CUDA context cannot be recovered in-process)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = str(Path(__file__).resolve().parent.parent)
    code = f"import sys; sys.path.insert(0, {root!r})\n" + _PROBE          # this checkout's dsv4lab first
    try:
        r = subprocess.run([sys.executable, "-c", code, impl], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"no answer in {timeout_s:.0f} s (a hang?)"}
    if r.returncode != 0:
        return {"ok": False, "error": (r.stderr or r.stdout)[-600:]}
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return {"ok": got["out_err"] <= OUT_TOL and got["lse_err"] <= LSE_TOL, **got}
