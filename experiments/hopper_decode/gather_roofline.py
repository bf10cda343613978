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
loads in flight: bandwidth against the bytes in flight an SM. Last, the same walk with the bytes
in flight held in shared memory instead of registers (``gather_tma_per_sm``, Gluon, sm_90): each
token's 576 data bytes come by two TMA copies (words 0-127, and 128-159 of which 16 are its own:
a box's sides are powers of two, and each copy's shared-memory address 128-byte aligned) into a
ring of DEPTH tiles of TILE_T tokens, all completing on the tile's mbarrier. One warp
issues the copies, as far ahead as the ring allows; the program's 4 other warps sum each tile once
it landed, and load its scale words. TB/s counts the bytes once. With --cpu-smoke (automatic
without a GPU) one tiny case runs in the interpreter and the sums are checked against torch; the
TMA rows need a GPU (Gluon has no interpreter) and run in a child process with a time limit
(``--tma-child``), since a kernel that never ran may hang.

``--parts floor`` (small B: ``--parts floor --batches 1 2 4 8 16 32``) asks what one launch at small
B cannot go below. ``_decode_bytes`` reads what a program of a one-launch split decode must read
(its slice of the index row, those tokens' bytes, all of Q[b]) and writes what such a launch
writes (its share of out[b]'s columns for every head), with the decode's dependency chain (the
stores wait for the gathered bytes) and nothing else: no dequant, no products, no merge. It runs
at 8-64 tokens a program, one-call graph and per call in a graph of 8 (each call on its own copy
of the inputs), beside the empty launch's two figures and, from the same run, the decode impls
``hopper``, ``splitk_auto`` and ``auto`` (GPU only).
"""
import sys
from pathlib import Path
import dsv4lab  # noqa: F401  (first: it decides the mode before anything imports triton)

import torch
import triton
import triton.language as tl

from dsv4lab import bench
from dsv4lab.cache import page_bytes
from dsv4lab.device import info
from dsv4lab.kernels.decode import hopper
from dsv4lab.kernels.decode.hopper import kernel as hopper_kernel
from dsv4lab.kernels.rows import token_limit
from dsv4lab.testing import make_decode_inputs
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # experiments/: ab.py, what the scripts share
import ab  # noqa: E402

QUESTION = "hopper_decode"
K, CTX, PAGE = 512, 8192, 64
TOKEN_BYTES = 576 + 8
PARTS = ("gather", "per_sm", "tma", "floor")


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


@triton.jit
def _decode_bytes(IDX, KV32, Q32, OUT16, K, num_tokens, H, BLOCK_T: tl.constexpr, Q_WORDS: tl.constexpr,
                  H_P2: tl.constexpr, COLS: tl.constexpr, PAGE_SIZE: tl.constexpr, PAGE_WORDS: tl.constexpr):
    """Program (b, s) of a one-launch split decode, its bytes only: indices s*BLOCK_T.., their
    tokens' words and all of Q[b] (every slice needs every head's query), summed; then columns
    s*COLS.. of out[b] for every head, each holding the sum's low 14 bits (a finite bf16), so the
    stores wait for the gather."""
    b = tl.program_id(0)
    s = tl.program_id(1)
    t = s * BLOCK_T + tl.arange(0, BLOCK_T)
    tok = tl.load(IDX + b * K + t, mask=t < K, other=-1)
    w = tl.arange(0, Q_WORDS)
    q = tl.load(Q32 + b * (H * 256) + w, mask=w < H * 256, other=0)
    x, r, e = _token_words(KV32, tok, num_tokens, PAGE_SIZE, PAGE_WORDS)
    acc = tl.sum(tl.sum(x, 1), 0) + tl.sum(tl.sum(r, 1), 0) + tl.sum(tl.sum(e, 1), 0) + tl.sum(q, 0)
    h = tl.arange(0, H_P2)[:, None]
    c = s * COLS + tl.arange(0, COLS)[None, :]
    val = tl.zeros([H_P2, COLS], tl.int32) + (acc & 0x3FFF)
    tl.store(OUT16 + (b * H + h) * 512 + c, val.to(tl.int16), mask=h < H)


if hopper_kernel.gluon is not None:
    from triton.experimental.gluon.language.nvidia.hopper import tma
    gluon, gl, mbarrier = hopper_kernel.gluon, hopper_kernel.gl, hopper_kernel.mbarrier

    @gluon.jit
    def _issue_tile(IDX, desc_a, desc_b, ring_a, ring_b, bar, tile, num_tokens, TILE_T: gl.constexpr,
                    PAGE_SIZE: gl.constexpr):
        """TMA copies of one tile's tokens (2 a token: words 0-127 of its 576 data bytes, then
        words 128-159, of which 144-159 are the next token's or the page's scale bytes: a 128-byte
        row keeps every copy's shared-memory address 128-byte aligned) into ring slot ``ring_a`` /
        ``ring_b``, all counted by ``bar`` (an index outside the cache copies token 0's bytes, so
        the byte count always completes)."""
        mbarrier.expect(bar, TILE_T * (512 + 128))
        # the tile's indices in one load, every thread holding all of them (the copies need them as
        # scalars: one load each would put an L2 round trip before every copy)
        ONE: gl.constexpr = gl.BlockedLayout([TILE_T], [32], [gl.num_warps()], [0])
        pos = gl.arange(0, TILE_T, layout=ONE)
        toks = gl.load(IDX + tile * TILE_T + pos)
        for t in gl.static_range(TILE_T):
            tok = gl.sum(gl.where(pos == t, toks, 0), axis=0)
            safe = gl.where(tok.to(gl.uint32) < num_tokens, tok, 0)
            page = safe // PAGE_SIZE
            word = (safe % PAGE_SIZE) * 144
            tma.async_copy_global_to_shared(desc_a, [page, word], bar, ring_a.slice(t, 1))
            tma.async_copy_global_to_shared(desc_b, [page, word + 128], bar, ring_b.slice(t, 1))

    @gluon.jit
    def _tma_issuer(IDX, desc_a, desc_b, ring_a, ring_b, ready, empty, p, G, mine, num_tokens,
                    TILE_T: gl.constexpr, DEPTH: gl.constexpr, PAGE_SIZE: gl.constexpr):
        """Worker partition (one warp): a tile's copies as soon as its ring slot is free."""
        for j in range(mine):
            s = j % DEPTH
            mbarrier.wait(empty.index(s), ((j // DEPTH) & 1) ^ 1)     # slots start free
            _issue_tile(IDX, desc_a, desc_b, ring_a.index(s), ring_b.index(s), ready.index(s), p + j * G,
                        num_tokens, TILE_T, PAGE_SIZE)

    @gluon.jit
    def _tma_summer(IDX, KV32, OUT, ring_a, ring_b, ready, empty, p, G, mine, num_tokens, TILE_T: gl.constexpr,
                    DEPTH: gl.constexpr, PAGE_SIZE: gl.constexpr, PAGE_WORDS: gl.constexpr):
        """Default partition: each tile's words from shared memory once they landed, its scale words
        from global memory, summed; the slot is handed back right after the shared-memory reads."""
        LA: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [gl.num_warps(), 1], [1, 0])
        LB: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [gl.num_warps(), 1], [1, 0])
        LS: gl.constexpr = gl.BlockedLayout([1, 2], [16, 2], [gl.num_warps(), 1], [1, 0])
        acc = gl.zeros([TILE_T], gl.int32, gl.SliceLayout(1, LA))
        for j in range(mine):
            s = j % DEPTH
            mbarrier.wait(ready.index(s), (j // DEPTH) & 1)
            x = ring_a.index(s).load(LA)
            r = ring_b.index(s).load(LB)                                  # words 128-159: 16 are the token's
            r = gl.where(gl.expand_dims(gl.arange(0, 32, layout=gl.SliceLayout(0, LB)), 0) < 16, r, 0)
            mbarrier.arrive(empty.index(s), count=1)
            tok = gl.load(IDX + (p + j * G) * TILE_T + gl.arange(0, TILE_T, layout=gl.SliceLayout(1, LS)))
            ok = tok.to(gl.uint32) < num_tokens
            safe = gl.where(ok, tok, 0).to(gl.int64)
            scl = (safe // PAGE_SIZE) * PAGE_WORDS + PAGE_SIZE * 144 + (safe % PAGE_SIZE) * 2
            e = gl.load(KV32 + gl.expand_dims(scl, 1) + gl.expand_dims(gl.arange(0, 2, layout=gl.SliceLayout(0, LS)), 0),
                        mask=gl.expand_dims(ok, 1), other=0)
            part = (gl.sum(x, axis=1) + gl.convert_layout(gl.sum(r, axis=1), gl.SliceLayout(1, LA))
                    + gl.convert_layout(gl.sum(e, axis=1), gl.SliceLayout(1, LA)))
            acc += gl.where(gl.convert_layout(ok, gl.SliceLayout(1, LA)), part, 0)
        gl.store(OUT + p, gl.sum(acc, axis=0))

    @gluon.jit
    def _gather_tma(IDX, desc_a, desc_b, KV32, OUT, n_tiles, num_tokens, TILE_T: gl.constexpr,
                    DEPTH: gl.constexpr, PAGE_SIZE: gl.constexpr, PAGE_WORDS: gl.constexpr):
        """One program an SM walks tiles p, p + G, ...: one warp keeps up to DEPTH tiles' copies in
        flight (a ring in shared memory, ready / empty mbarriers a slot), the 4 default warps sum
        each tile once it landed."""
        p = gl.program_id(0)
        G = gl.num_programs(0)
        ring_a = gl.allocate_shared_memory(gl.int32, [DEPTH, TILE_T, 128], desc_a.layout)
        ring_b = gl.allocate_shared_memory(gl.int32, [DEPTH, TILE_T, 32], desc_b.layout)
        ready = gl.allocate_shared_memory(gl.int64, [DEPTH, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [DEPTH, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(DEPTH):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        hopper_kernel.fence_async_shared()
        mine = (n_tiles - p + G - 1) // G
        gl.warp_specialize([
            (_tma_summer, (IDX, KV32, OUT, ring_a, ring_b, ready, empty, p, G, mine, num_tokens, TILE_T, DEPTH,
                           PAGE_SIZE, PAGE_WORDS)),
            (_tma_issuer, (IDX, desc_a, desc_b, ring_a, ring_b, ready, empty, p, G, mine, num_tokens, TILE_T, DEPTH,
                           PAGE_SIZE)),
        ], [1], [96])


def tma_descriptors(kv32):
    """The cache's int32 words as [pages, words a page], boxes of 1 x 128 and 1 x 32 words."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    pages = kv32.view(-1, page_bytes(PAGE) // 4)
    return tuple(TensorDescriptor.from_tensor(pages, [1, w], gl.NVMMASharedLayout(swizzle_byte_width=0,
                                                                               element_bitwidth=32, rank=2))
                 for w in (128, 32))


def gather_tma(idx, descs, kv32, out, num_tokens, tile_t, depth, warps=4):
    n_tiles = idx.numel() // tile_t
    _gather_tma[(out.numel(),)](idx, *descs, kv32, out, n_tiles, num_tokens, TILE_T=tile_t, DEPTH=depth,
                                PAGE_SIZE=PAGE, PAGE_WORDS=page_bytes(PAGE) // 4, num_warps=warps)


def gather_loop(idx, kv32, out, num_tokens, chunk_t, warps):
    n_chunks = idx.numel() // chunk_t
    _gather_loop[(out.numel(),)](idx, kv32, out, n_chunks, num_tokens, CHUNK_T=chunk_t, PAGE_SIZE=PAGE,
                                PAGE_WORDS=page_bytes(PAGE) // 4, num_warps=warps, num_stages=1)


def gather(idx, kv32, out, num_tokens, block_t):
    B = idx.shape[0]
    _gather_sum[(B, triton.cdiv(K, block_t))](idx, kv32, out, K, num_tokens, BLOCK_T=block_t,
                                             PAGE_SIZE=PAGE, PAGE_WORDS=page_bytes(PAGE) // 4, num_warps=4)


def decode_bytes(idx, kv32, q, out, num_tokens, block_t):
    """_decode_bytes over a [B, H, 512] bf16 q and out; K must be a multiple of block_t."""
    B, H, _ = q.shape
    _decode_bytes[(B, K // block_t)](idx, kv32, q.view(torch.int32), out.view(torch.int16), K, num_tokens, H,
                                     BLOCK_T=block_t, Q_WORDS=triton.next_power_of_2(H * 256),
                                     H_P2=triton.next_power_of_2(H), COLS=512 * block_t // K, PAGE_SIZE=PAGE,
                                     PAGE_WORDS=page_bytes(PAGE) // 4, num_warps=8)


def decode_bytes_expected(idx, kv32, q, block_t):
    """The out _decode_bytes writes, from torch: [B, H, 512] int16."""
    B, H, _ = q.shape
    total = expected(idx, kv32, block_t).to(torch.int64) + q.view(torch.int32).to(torch.int64).sum((1, 2))[:, None]
    bits = (total & 0x3FFF).to(torch.int16)                          # the low 14 bits, as the kernel's int32
    return bits.repeat_interleave(512 * block_t // K, dim=1)[:, None, :].expand(B, H, 512)


def floor_rows(B, inp, smoke) -> list[dict]:
    """The small-B floor of one B: _decode_bytes at 8-64 tokens a program, then the decode impls
    (GPU), one-call graph and per call in a graph of bench.LAYERS calls, each on its own copy."""
    copies = bench.layer_copies(inp, 2 if smoke else bench.LAYERS)
    views = [(x.indices.contiguous(), x.cache.byte_views[1].view(torch.int32), x.q,
              torch.empty_like(x.q), token_limit(x.cache)) for x in copies]
    rows = []
    for bt in ([8, 64] if smoke else [8, 16, 32, 64]):
        idx, kv32, q, out, ntok = views[0]
        out.fill_(-1)
        decode_bytes(idx, kv32, q, out, ntok, bt)
        ok = bool(torch.equal(out.view(torch.int16), decode_bytes_expected(idx, kv32, q, bt)))
        one = ab.time_us(lambda: decode_bytes(idx, kv32, q, out, ntok, bt), smoke)
        many = ab.time_in_graph_us([lambda v=v: decode_bytes(*v[:4], v[4], bt) for v in views], smoke)
        rows.append(dict(kind="decode_bytes_floor", B=B, H=inp.q.shape[1], tokens_per_program=bt,
                         programs=B * (K // bt), bytes=B * (K * TOKEN_BYTES + 2 * inp.q[0].numel() * 2),
                         graph_us=one, graph_layer_us=many, layers=len(views), ok=ok))
        print(rows[-1], flush=True)
    if smoke:
        return rows
    for impl in ("hopper", "splitk_auto", "auto"):
        row = dict(kind="decode", impl=impl, B=B)
        try:
            got = bench.decode_row(impl, inp, eager=False, layer_inputs=copies)
            row.update(graph_us=got["graph_us"], graph_layer_us=got.get("graph_layer_us"), layers=got.get("layers"))
        except Exception as e:  # noqa: BLE001  (an impl that cannot run here is a row)
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        print(row, flush=True)
    return rows


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


def tma_rows(B, rand, kv32, ntok, progs) -> list[dict]:
    """The gather_tma_per_sm rows of one B (GPU, sm_90)."""
    rows = []
    for depth, tt in [(2, 32), (4, 16), (4, 32), (3, 64), (6, 32)]:
        out = torch.empty(progs, dtype=torch.int32, device=rand.device)
        row = dict(kind="gather_tma_per_sm", B=B, order="random", tile_tokens=tt, depth=depth, num_warps=4,
                   issuer_warps=1, programs=progs, ring_bytes=depth * tt * (512 + 128), bytes=B * K * TOKEN_BYTES)
        try:
            descs = tma_descriptors(kv32)
            gather_tma(rand, descs, kv32, out, ntok, tt, depth)
            torch.cuda.synchronize()
            row["sums_match"] = (int(out.to(torch.int64).sum()) % 2**32
                                 == int(expected(rand, kv32, tt).to(torch.int64).sum()) % 2**32)
            us = ab.time_us(lambda: gather_tma(rand, descs, kv32, out, ntok, tt, depth), False)
            row.update(graph_us=us, tb_s=row["bytes"] / us / 1e6)
        except Exception as e:  # noqa: BLE001  (a variant that fails to compile or run is a row)
            row["error"] = f"{type(e).__name__}: {e}"[:400]
        rows.append(row)
        print(row, flush=True)
    return rows


def tma_rows_in_child(B, timeout_s=150.0) -> list[dict]:
    """tma_rows in a child process: a kernel that has never run may hang (an mbarrier phase off by
    one), which costs the child, not this run."""
    import json
    import subprocess
    import sys
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/tma.json"
        try:
            r = subprocess.run([sys.executable, __file__, path, "--tma-child", "--batches", str(B)],
                               capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return [dict(kind="gather_tma_per_sm", B=B, error=f"no answer in {timeout_s:.0f} s (a hang?)")]
        if r.returncode != 0:
            return [dict(kind="gather_tma_per_sm", B=B, error=(r.stderr or r.stdout)[-600:])]
        return json.load(open(path))["rows"]


def main(argv=None):
    def options(p):
        p.add_argument("--batches", type=int, nargs="+", default=[32, 128])
        p.add_argument("--tma-child", action="store_true", help="only the TMA rows (the child process of a run)")
        p.add_argument("--parts", nargs="+", choices=PARTS, default=["gather", "per_sm", "tma"],
                       help="which rows to run (a smoke run runs them all)")
    a = ab.parse_args(__doc__, options, argv)
    parts = PARTS if a.smoke else a.parts
    rows = []
    if not a.smoke and not a.tma_child:
        rows.append(dict(kind="launch_floor", **bench.launch_floor_us(in_graph="floor" in parts)))
    for B in ([2] if a.smoke else a.batches):
        if "floor" in parts and not a.tma_child:
            rows += floor_rows(B, make_decode_inputs(B, 4 if a.smoke else 64, K, context=CTX, page_size=PAGE,
                                                     seed=B), a.smoke)
        if not set(parts) - {"floor"}:       # the floor alone: the gather rows' inputs are not needed
            ab.write(a.out, QUESTION, a.smoke, K=K, context=CTX, rows=rows, complete=False)
            continue
        inp = make_decode_inputs(B, 4, K, context=CTX, page_size=PAGE, seed=B)
        kv32 = inp.cache.byte_views[1].view(torch.int32)
        ntok = token_limit(inp.cache)
        rand = inp.indices.contiguous()
        progs = 2 if a.smoke else info().sm_count
        if a.tma_child:
            rows += tma_rows(B, rand, kv32, ntok, progs)
            continue
        seq = (torch.arange(B, device=rand.device, dtype=torch.int32)[:, None] * CTX
               + torch.arange(K, device=rand.device, dtype=torch.int32)[None, :]).contiguous()
        for order, idx in (("random", rand), ("sequential", seq)) if "gather" in parts else ():
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
        for warps in ([4] if a.smoke else [4, 8]) if "per_sm" in parts else ():
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
        # the same walk with the bytes in flight in shared memory, copied by TMA (sm_90, Gluon)
        if "tma" in parts:
            why = hopper.unavailable_reason()
            if why:
                rows.append(dict(kind="gather_tma_per_sm", B=B, skipped=why))
            else:
                rows += tma_rows_in_child(B)
        ab.write(a.out, QUESTION, a.smoke, K=K, context=CTX, rows=rows, complete=False)
    ab.write(a.out, QUESTION, a.smoke, K=K, context=CTX, rows=rows, complete=True)


if __name__ == "__main__":
    main()
