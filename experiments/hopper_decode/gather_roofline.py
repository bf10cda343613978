"""What the decode's gather can reach on this GPU: the bytes a sparse decode reads (each chosen
token's 576 data bytes and 8 scale bytes, FP8 paged cache, page 64), read by a kernel that does
nothing else, at many programs an SM. One JSON.

    python experiments/hopper_decode/gather_roofline.py OUT.json [--batches 32 128]

For each B (K = 512 tokens a request, context 8192, the lab's random decode indices) and tokens a
program (8 .. 64; 4 warps), a Triton kernel loads every chosen token's bytes as int32 words and
sums them into one word a program (so no load is dead). The same kernel on the first K tokens of
each request in order (sequential indices) gives the streaming figure for the same bytes; both
are CUDA-graph replay medians (L2 flushed before each, the lab's timing), and the empty launch's
time (bench.launch_floor_us) is reported beside them. Then the hopper producer's situation: one
program an SM (4 or 8 warps) walks the random indices CHUNK_T = 16-64 tokens at a time, one chunk's
loads in flight: bandwidth against the bytes in flight an SM. TB/s counts the bytes once. With
--cpu-smoke (automatic without a GPU) one tiny case runs in the interpreter and the sums are
checked against torch.
"""
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import torch
import triton
import triton.language as tl

from dsv4lab import ab, bench
from dsv4lab.cache import page_bytes
from dsv4lab.device import info
from dsv4lab.kernels.common import token_limit
from dsv4lab.testing import make_decode_inputs

QUESTION = "hopper_decode"
K, CTX, PAGE = 512, 8192, 64
TOKEN_BYTES = 576 + 8


@triton.jit
def _token_words(KV32, tok, num_tokens, PAGE_SIZE: tl.constexpr, PAGE_WORDS: tl.constexpr):
    """The words of tokens ``tok`` (int32 views of the FP8 paged cache): data words 0..127 and
    128..143 (576 bytes), and the 2 scale words; an index outside the cache reads nothing (0)."""
    ok = (tok >= 0) & (tok < num_tokens)
    safe = tl.where(ok, tok, 0).to(tl.int64)
    base = (safe // PAGE_SIZE) * PAGE_WORDS
    data = base + (safe % PAGE_SIZE) * 144                        # 576 bytes = 144 words
    scl = base + PAGE_SIZE * 144 + (safe % PAGE_SIZE) * 2         # 8 bytes = 2 words
    x = tl.load(KV32 + data[:, None] + tl.arange(0, 128)[None, :], mask=ok[:, None], other=0)
    r = tl.load(KV32 + data[:, None] + 128 + tl.arange(0, 16)[None, :], mask=ok[:, None], other=0)
    e = tl.load(KV32 + scl[:, None] + tl.arange(0, 2)[None, :], mask=ok[:, None], other=0)
    return x, r, e


@triton.jit
def _gather_sum(IDX, KV32, OUT, K, num_tokens, BLOCK_T: tl.constexpr, PAGE_SIZE: tl.constexpr,
                PAGE_WORDS: tl.constexpr):
    b = tl.program_id(0)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok = tl.load(IDX + b * K + t, mask=t < K, other=-1)
    x, r, e = _token_words(KV32, tok, num_tokens, PAGE_SIZE, PAGE_WORDS)
    s = tl.sum(tl.sum(x, 1), 0) + tl.sum(tl.sum(r, 1), 0) + tl.sum(tl.sum(e, 1), 0)
    tl.store(OUT + b * tl.num_programs(1) + tl.program_id(1), s)


@triton.jit
def _gather_loop(IDX, KV32, OUT, n_chunks, num_tokens, CHUNK_T: tl.constexpr, PAGE_SIZE: tl.constexpr,
                 PAGE_WORDS: tl.constexpr):
    """One program an SM walks chunks p, p + G, ... of the flattened index list, CHUNK_T tokens a
    chunk, one chunk's loads in flight at a time (this loop is not software-pipelined)."""
    p = tl.program_id(0)
    acc = tl.zeros([CHUNK_T], tl.int32)
    for c in range(p, n_chunks, tl.num_programs(0)):
        t = c * CHUNK_T + tl.arange(0, CHUNK_T)
        x, r, e = _token_words(KV32, tl.load(IDX + t), num_tokens, PAGE_SIZE, PAGE_WORDS)
        acc += tl.sum(x, 1) + tl.sum(r, 1) + tl.sum(e, 1)
    tl.store(OUT + p, tl.sum(acc, 0))


def gather_loop(idx, kv32, out, num_tokens, chunk_t, warps):
    n_chunks = idx.numel() // chunk_t
    _gather_loop[(out.numel(),)](idx, kv32, out, n_chunks, num_tokens, CHUNK_T=chunk_t, PAGE_SIZE=PAGE,
                                PAGE_WORDS=page_bytes(PAGE) // 4, num_warps=warps, num_stages=1)


def gather(idx, kv32, out, num_tokens, block_t):
    B = idx.shape[0]
    _gather_sum[(B, triton.cdiv(K, block_t))](idx, kv32, out, K, num_tokens, BLOCK_T=block_t,
                                             PAGE_SIZE=PAGE, PAGE_WORDS=page_bytes(PAGE) // 4, num_warps=4)


def expected(idx, kv32, block_t):
    """The sums in torch (int64, wrapped to int32 as the kernel's adds wrap)."""
    B = idx.shape[0]
    words = kv32.to(torch.int64)
    pw = page_bytes(PAGE) // 4
    tok = idx.to(torch.int64)
    data = (tok // PAGE) * pw + (tok % PAGE) * 144
    scl = (tok // PAGE) * pw + PAGE * 144 + (tok % PAGE) * 2
    per = words[data[..., None] + torch.arange(144, device=idx.device)].sum(-1) \
        + words[scl[..., None] + torch.arange(2, device=idx.device)].sum(-1)
    per = per.view(B, -1, block_t).sum(-1)
    return ((per + 2**31) % 2**32 - 2**31).to(torch.int32)


def main(argv=None):
    def options(p):
        p.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    a = ab.parse_args(__doc__, options, argv)
    rows = []
    if not a.smoke:
        rows.append(dict(kind="launch_floor", **bench.launch_floor_us()))
    for B in ([2] if a.smoke else a.batches):
        inp = make_decode_inputs(B, 4, K, context=CTX, page_size=PAGE, seed=B)
        kv32 = inp.cache.byte_views[1].view(torch.int32)
        ntok = token_limit(inp.cache)
        rand = inp.indices.contiguous()
        seq = (torch.arange(B, device=rand.device, dtype=torch.int32)[:, None] * CTX
               + torch.arange(K, device=rand.device, dtype=torch.int32)[None, :]).contiguous()
        for order, idx in (("random", rand), ("sequential", seq)):
            for bt in ([8] if a.smoke else [8, 16, 32, 64]):
                out = torch.empty(B * triton.cdiv(K, bt), dtype=torch.int32, device=rand.device)
                gather(idx, kv32, out, ntok, bt)
                ok = bool(torch.equal(out.view(B, -1), expected(idx, kv32, bt)))
                us = ab.time_us(lambda: gather(idx, kv32, out, ntok, bt), a.smoke)
                nbytes = B * K * TOKEN_BYTES
                rows.append(dict(kind="gather", B=B, order=order, tokens_per_program=bt, programs=out.numel(),
                                 bytes=nbytes, graph_us=us, tb_s=None if us is None else nbytes / us / 1e6,
                                 sums_match=ok))
                print(rows[-1], flush=True)
        # one program an SM, as the hopper producer: the bandwidth one chunk in flight at a time gives
        progs = 2 if a.smoke else info().sm_count
        for warps in ([4] if a.smoke else [4, 8]):
            for ct in ([16] if a.smoke else [16, 32, 64]):
                out = torch.empty(progs, dtype=torch.int32, device=rand.device)
                gather_loop(rand, kv32, out, ntok, ct, warps)
                ok = int(out.to(torch.int64).sum()) % 2**32 == int(expected(rand, kv32, ct).to(torch.int64).sum()) % 2**32
                us = ab.time_us(lambda: gather_loop(rand, kv32, out, ntok, ct, warps), a.smoke)
                nbytes = B * K * TOKEN_BYTES
                rows.append(dict(kind="gather_per_sm", B=B, order="random", tokens_per_chunk=ct, num_warps=warps,
                                 programs=progs, chunk_bytes=ct * TOKEN_BYTES, bytes=nbytes, graph_us=us,
                                 tb_s=None if us is None else nbytes / us / 1e6, sums_match=ok))
                print(rows[-1], flush=True)
        ab.write(a.out, QUESTION, a.smoke, K=K, context=CTX, rows=rows, complete=False)
    ab.write(a.out, QUESTION, a.smoke, K=K, context=CTX, rows=rows, complete=True)


if __name__ == "__main__":
    main()
