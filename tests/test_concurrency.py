"""Concurrent callers (dsv4lab.concurrency): threads calling the ops at once each get their own right
answer, whatever the impl and the shapes; no flag of the shared error word is lost. On the CPU the
threads share no stream (the interpreter runs one launch at a time, any thread's); on a GPU (gpu marker)
threads share one stream, run on two streams at once, and two CUDA graphs of one shape replay at once
on two streams."""
import threading

import pytest
import torch

import dsv4lab
from dsv4lab import api, concurrency, errors, reference
from dsv4lab.errors import Flag
from dsv4lab.testing import (LSE_TOL, OUT_TOL, check_indexer_step, make_decode_inputs, make_indexer_inputs,
                             rel_err)
from dsv4lab import registry

GPU = dsv4lab.device.mode() == "cuda"
#: the decode shape of the thread tests: split-K runs 4 slices here on the CPU (2 with "splitk")
B, H, K = 1, 16, 128


def _runs_here(op, impl) -> bool:
    needs = registry.impl_info(op, impl).needs
    if "gpu" in needs and not GPU:
        return False
    if "sglang" in needs:
        from dsv4lab.kernels.decode import sglang_peer
        from dsv4lab.kernels.indexer import fallback
        try:
            sglang_peer.module() if op == "sparse_decode" else fallback.sglang_function()
        except ImportError:
            return False
    return True


def _in_threads(work, args_per_thread) -> list:
    """Run ``work(*args)`` in one thread per entry, all started together; the results in order (an
    exception in a thread is raised here)."""
    results = [None] * len(args_per_thread)
    barrier = threading.Barrier(len(args_per_thread))

    def run(i, args):
        try:
            barrier.wait()
            results[i] = work(*args)
        except BaseException as e:  # noqa: BLE001  (handed to the test)
            results[i] = e
    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(args_per_thread)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def _decode_errors(impl, inp, calls):
    """(out, lse) errors against the float64 reference of ``calls`` calls on ``inp``."""
    ro, rl = reference.sparse_decode(inp.q, inp.cache, inp.indices, **inp.kwargs())
    got = []
    for _ in range(calls):
        out, lse = api.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs())
        got.append((rel_err(out.float(), ro), rel_err(lse, rl)))
    return got


@pytest.mark.parametrize("impl", [i for i in dsv4lab.impls() if _runs_here("sparse_decode", i)])
def test_threads_on_one_shape_each_get_their_answer(impl):
    # split-K used to keep one partials workspace per shape for the process: a thread's merge read
    # another's partials (relative errors up to 1.1 on the CPU)
    inps = [make_decode_inputs(B, H, K, context=2 * K, seed=s, pad_frac=0.1, topk_len=s == 1, sink=s == 2)
            for s in range(3)]
    calls = 1 if impl in ("simt", "sglang") else 3            # the interpreter's slow ones
    for got in _in_threads(lambda inp: _decode_errors(impl, inp, calls), [(i,) for i in inps]):
        assert all(o <= OUT_TOL and lse <= LSE_TOL for o, lse in got), got


def _topk_step(inp, k):
    """Three calls of indexer_topk(impl="triton") (prepared after the first) on ``inp``, and how many
    prepared calls this thread holds (checked afterwards: testing.poisoned() is process-wide)."""
    got = [dsv4lab.indexer_topk(*inp.args(), max_seq_len=inp.max_seq_len, topk=k, impl="triton") for _ in range(3)]
    return got, len(api.prepared_calls())


def test_threads_of_different_shapes_and_ops():
    # the interpreter keeps its state in globals: two launches at once crashed it ("Did you forget to
    # add @triton.jit ?"); the split top-k's candidates and ticket counters are kept per caller too
    dec = [make_decode_inputs(b, h, k, context=2 * k, seed=10 + b) for b, h, k in ((1, 16, 128), (2, 8, 64))]
    idx = [make_indexer_inputs(1, 8, 512, seq_lens=[300], seed=20 + s) for s in range(2)]

    def work(kind, inp):
        if kind == "decode":
            return _decode_errors("splitk_auto", inp, 2)
        return _topk_step(inp, 32)
    got = _in_threads(work, [("decode", d) for d in dec] + [("topk", i) for i in idx])
    for errs in got[:2]:
        assert all(o <= OUT_TOL and lse <= LSE_TOL for o, lse in errs), errs
    for inp, (tops, prepared) in zip(idx, got[2:]):
        assert prepared == 1                                       # each thread prepared its own call
        assert all(check_indexer_step(inp, 32, t)["ok"] for t in tops)


def test_no_flag_is_lost_to_concurrent_callers():
    # the error word is shared: threads flag different kinds while others check; every kind set is
    # reported by some check (the clear is an atomic swap, never a separate zeroing)
    errors.read()
    q, cache, idx, _ = (lambda d: (d.q, d.cache, d.indices, None))(make_decode_inputs(2, 16, 32, context=64, seed=3))
    past = idx.clone()
    past[0, 1] = cache.num_tokens + 5
    ind = make_indexer_inputs(2, 8, 128, seq_lens=[100, 20], seed=4)
    bad_seq = ind.seq_lens.clone()
    bad_seq[1] = 999
    seen = []

    def flagger(kind):
        for _ in range(2):
            if kind == "index":
                api.sparse_decode(q, cache, past, impl="mma")
            elif kind == "topk_len":
                api.sparse_decode(q, cache, idx, topk_len=torch.tensor([40, 3], dtype=torch.int32), impl="mma")
            elif kind == "seq_len":
                api.indexer_logits(ind.q, ind.cache, ind.weights, bad_seq, ind.page_table, max_seq_len=128,
                                   impl="triton")
            else:
                seen.append(errors.read())

    _in_threads(flagger, [("index",), ("topk_len",), ("seq_len",), ("check",), ("check",)])
    seen.append(errors.read())
    total = Flag(0)
    for f in seen:
        total |= f
    # (seq_lens[1] clamped to 128 makes its page-table entry -1 live: PAGE, as the contract says)
    assert total == Flag.INDEX | Flag.TOPK_LEN | Flag.SEQ_LEN | Flag.PAGE, total
    assert errors.read() == Flag(0)


def test_workspaces_are_per_caller_and_fresh_under_capture(monkeypatch):
    from dsv4lab.kernels import buffers
    a = buffers.reused("test.ws", (4,), torch.float32, "cpu")
    assert buffers.reused("test.ws", (4,), torch.float32, "cpu") is a              # the same caller: reused
    other = _in_threads(lambda: buffers.reused("test.ws", (4,), torch.float32, "cpu"), [()])[0]
    assert other.data_ptr() != a.data_ptr()                                       # another thread: its own
    monkeypatch.setattr(concurrency, "stream_key", lambda device: concurrency.CAPTURING)
    c1 = buffers.reused("test.ws", (4,), torch.float32, "cpu")
    c2 = buffers.reused("test.ws", (4,), torch.float32, "cpu")
    assert len({c1.data_ptr(), c2.data_ptr(), a.data_ptr()}) == 3                 # capture: fresh every call


def test_captured_counters_come_zeroed_from_an_arena_never_twice(monkeypatch):
    dev = torch.device("cpu")
    monkeypatch.setattr(concurrency, "_ARENAS", {})
    monkeypatch.setattr(concurrency, "_RETIRED", [])
    monkeypatch.setattr(concurrency, "ARENA", 16)
    concurrency.keep_arena(dev, 3)
    taken = [concurrency.zeroed_counters(3, dev) for _ in range(5)]              # 15 of 16
    assert all(t.tolist() == [0, 0, 0] for t in taken)
    assert len({t.data_ptr() for t in taken}) == 5
    for t in taken:
        t.fill_(7)                                                                # what graphs do with them
    extra = concurrency.zeroed_counters(3, dev)                                   # no room: zeros of its own
    assert extra.tolist() == [0, 0, 0] and not any(extra.data_ptr() == t.data_ptr() for t in taken)
    arena = concurrency._ARENAS[dev][0]
    concurrency.keep_arena(dev, 3)                                                # over half used: a new one
    assert concurrency._ARENAS[dev][0] is not arena and concurrency._RETIRED == [arena]
    assert concurrency.zeroed_counters(3, dev).tolist() == [0, 0, 0]


# ---- on a GPU ----

def _gpu_decode(seed, impl="auto", B=32):
    inp = make_decode_inputs(B, 64, 512, context=1024, seed=seed, pad_frac=0.1, topk_len=True, sink=True)
    return inp, reference.sparse_decode(inp.q, inp.cache, inp.indices, **inp.kwargs())


def _close(got, ref):
    return rel_err(got[0].float(), ref[0]) <= OUT_TOL and rel_err(got[1], ref[1]) <= LSE_TOL


@pytest.mark.gpu
@pytest.mark.parametrize("impl,B", [("splitk_auto", 1), ("splitk", 8), ("auto", 32), ("auto", 2)])
def test_gpu_threads_on_one_stream(impl, B):
    # every thread on the default stream, no lock: launches of different threads interleave on it
    cases = [_gpu_decode(s, impl, B) for s in range(4)]

    def work(inp, ref):
        outs = [api.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs()) for _ in range(50)]
        torch.cuda.synchronize()
        return sum(not _close(o, ref) for o in outs)
    assert _in_threads(work, cases) == [0, 0, 0, 0]


@pytest.mark.gpu
def test_gpu_threads_on_two_streams_at_once():
    cases = [_gpu_decode(s, "splitk_auto", 1) for s in range(2)]
    idx = [make_indexer_inputs(32, 64, 65536, seq_lens=8192, seed=40 + s) for s in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()

    def work(i):
        (inp, ref), ind, s = cases[i], idx[i], streams[i]
        with torch.cuda.stream(s):
            outs = [api.sparse_decode(inp.q, inp.cache, inp.indices, impl="splitk_auto", **inp.kwargs())
                    for _ in range(50)]
            tops = [dsv4lab.indexer_topk(*ind.args(), max_seq_len=65536, topk=512, impl="triton") for _ in range(20)]
        s.synchronize()
        return sum(not _close(o, ref) for o in outs), sum(not check_indexer_step(ind, 512, t)["ok"] for t in tops[::5])
    assert _in_threads(work, [(0,), (1,)]) == [(0, 0), (0, 0)]


@pytest.mark.gpu
@pytest.mark.parametrize("impl,B", [("splitk_auto", 1), ("auto", 32)])
def test_gpu_two_graphs_of_one_shape_replayed_at_once(impl, B):
    # captured one after the other on torch's capture stream, replayed together on two streams: each
    # graph has its own workspaces (split-K's partials, the top-k's candidates and counters)
    cases = [_gpu_decode(s, impl, B) for s in range(2)]
    ind = [make_indexer_inputs(32, 64, 65536, seq_lens=8192, seed=50 + s) for s in range(2)]
    graphs, results = [], []
    for (inp, _), i in zip(cases, ind):
        run = lambda inp=inp, i=i: (api.sparse_decode(inp.q, inp.cache, inp.indices, impl=impl, **inp.kwargs()),  # noqa: E731
                                    dsv4lab.indexer_topk(*i.args(), max_seq_len=65536, topk=512, impl="triton"))
        run()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            results.append(run())
        graphs.append(g)
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    for _ in range(20):
        for g, s in zip(graphs, streams):
            with torch.cuda.stream(s):
                for _ in range(5):
                    g.replay()
        torch.cuda.synchronize()
        for (inp, ref), i, (dec, top) in zip(cases, ind, results):
            assert _close(dec, ref)
            assert check_indexer_step(i, 512, top)["ok"]
    errors.check_errors()
