"""The indexer's top-k over the live context (kernels/topk.py) and the step that feeds it
(kernels/indexer.py without the -inf fill): the exact contract (reference.topk_positions), ties,
short and empty rows, dead positions and page-table entries that must never be used, bad page
ids without the API's checks, one launch shape across steps, odd shapes."""
import math

import pytest
import torch

import dsv4lab
from dsv4lab import errors, reference
from dsv4lab.kernels.indexer import triton_indexer
from dsv4lab.kernels.indexer.triton_indexer import LogitsLaunch
from dsv4lab.kernels.indexer.topk import TopkLaunch, split_for, topk_triton
from dsv4lab.testing import INDEXER_TOL, check_indexer, make_indexer_inputs, poisoned, rel_err, topk_recall

SMALL = TopkLaunch(tile=64)             # rows longer than a tile: the streamed path
TOPK = dsv4lab.registry.impl_info("indexer_topk", "triton").fn        # no API checks: what a captured graph runs


def _topk(logits, seq_lens, k, launch=None):
    with poisoned():
        return topk_triton(logits, seq_lens, k, launch=launch)


def _lens(*v):
    return torch.tensor(v, dtype=torch.int32)


@pytest.mark.parametrize("launch", [None, SMALL, TopkLaunch(tile=128, radix=8), TopkLaunch(anchor=0)],
                         ids=["one tile", "tiles of 64", "radix 8", "no anchor pass"])
def test_topk_is_the_contract_on_distinct_logits(launch):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 300, generator=g)
    x[2] = -x[2].abs()                          # all negative: the anchor's buckets miss, passes from the top
    x[4, 7] = 1e30                              # an outlier far above the rest: the same
    n = _lens(300, 299, 64, 1, 170)
    for k in (1, 17, 64, 300, 400):
        got = _topk(x, n, k, launch)
        assert torch.equal(got, reference.topk_positions(x.masked_fill(torch.arange(300) >= n[:, None], -math.inf), k)), k
        for b in range(5):                      # distinct values: the same set as torch.topk
            want = torch.topk(x[b, :n[b]], min(k, int(n[b]))).indices.sort().values
            assert torch.equal(got[b, :len(want)], want.int()) and (got[b, len(want):] == -1).all()


@pytest.mark.parametrize("launch", [None, SMALL], ids=["one tile", "tiles of 64"])
def test_ties_go_to_the_lower_positions(launch):
    x = torch.zeros(4, 200)
    x[0, 50:150] = 1.0                          # 100 equal values across the k-th: the first 10 by position
    x[0, 190] = 2.0
    x[1] = 3.0                                  # a whole row of one value
    x[2, ::2] = -0.0                            # -0.0 and +0.0 are equal logits
    x[2, 1] = -1.0
    x[3, 60:70] = 5.0                           # ties straddling tile edges, wanted whole
    x[3, 120:140] = 4.0
    n = _lens(200, 200, 200, 200)
    got = _topk(x, n, 11, launch)
    assert got[0].tolist() == list(range(50, 60)) + [190]
    assert got[1].tolist() == list(range(11))
    assert got[2].tolist() == [0] + list(range(2, 12))
    assert got[3].tolist() == list(range(60, 70)) + [120]
    assert torch.equal(got, reference.topk_positions(x, 11))


@pytest.mark.parametrize("launch", [None, SMALL, TopkLaunch(tile=256, split=4),
                                    TopkLaunch(tile=256, split=2, merge="launch")],
                         ids=["one tile", "tiles of 64", "chunks", "merge launch"])
def test_nan_is_above_every_number_as_in_torch_topk(launch):
    # a NaN logit (never a real score: a corrupt input) is chosen first, whatever its sign and
    # payload, ties among NaNs to the lower positions; past seq_len it is never read
    g = torch.Generator().manual_seed(13)
    x = torch.randn(4, 500, generator=g)
    bits = x.view(torch.int32)
    bits[0, 7] = 0x7FC00000                    # the canonical NaN
    bits[0, 300] = -0x00400000                 # 0xFFC00000: a negative NaN
    x[0, 5] = math.inf                         # below both
    bits[1, 450] = 0x7F800001                  # the smallest NaN payload
    bits[1, 2] = -1                            # 0xFFFFFFFF: negative, every payload bit
    x[2, ::3] = math.nan                       # more NaNs than k: the lower positions
    x[3, 100:] = math.nan                      # past seq_len
    n = _lens(500, 500, 500, 90)
    live = x.masked_fill(torch.arange(500) >= n[:, None], -math.inf)
    for k in (1, 3, 200):
        want = reference.topk_positions(live, k)
        assert torch.equal(_topk(x, n, k, launch), want), k
    top3 = reference.topk_positions(live, 3)
    assert top3[0].tolist() == [5, 7, 300] and {2, 450} < set(top3[1].tolist()) and top3[2].tolist() == [0, 3, 6]
    assert reference.topk_positions(live, 2)[0].tolist() == [7, 300]          # the NaNs above +inf
    for r in (0, 1, 3):                        # the same set as torch.topk where NaNs do not tie for the last place
        assert sorted(torch.topk(live[r], 3).indices.tolist()) == top3[r].tolist()


@pytest.mark.parametrize("launch", [None, SMALL], ids=["one tile", "tiles of 64"])
def test_extreme_value_ranges(launch):
    # values at fp32's edges, inf, every value equal, subnormals and signed zeros, two far clusters
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 200, generator=g)
    x[0, 3], x[0, 9] = 3e38, -3e38                  # the span overflows to inf
    x[1, 11] = math.inf                            # an inf logit: always chosen
    x[2] = 0.25                                    # every value equal: ties, lower positions first
    x[3] = -x[3].abs() - 5.0                       # all negative: the k-th largest is negative
    x[4] = x[4] * 1e-40                            # subnormals, and -0.0 beside +0.0 (one key: ties)
    x[4, :20] = -0.0
    x[4, 20:40] = 0.0
    x[5, ::2] = -math.inf                          # half the row can never be chosen
    x[6] = torch.where(torch.arange(200) % 3 == 0, 1e20, 1e-20)   # two clusters far apart, many ties
    n = _lens(200, 200, 200, 200, 200, 200, 200, 1)
    for k in (1, 50, 150, 200):
        want = reference.topk_positions(x.masked_fill(torch.arange(200) >= n[:, None], -math.inf), k)
        assert torch.equal(_topk(x, n, k, launch), want), k


@pytest.mark.parametrize("launch", [TopkLaunch(tile=256, split=4), TopkLaunch(tile=1024, split=1), SMALL,
                                    TopkLaunch(tile=256, split=4, rebase=False), TopkLaunch(tile=256, split=2, anchor=12)],
                         ids=["chunks", "one program", "tiles of 64", "no second anchor", "anchor 12"])
def test_a_missed_anchor_is_anchored_again(launch):
    # pass 0 misses when the k-th largest is negative or more than eight octaves below the largest
    # value; the second anchor sits at the smallest value, and both miss on a row spread evenly
    # over sixty decades: every outcome must still be the contract
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 1000, generator=g)
    x[0] -= 3.0                                          # the k-th largest is negative
    x[1, 500] = 1e6                                      # one huge value: the rest far below it
    x[2] = torch.exp(torch.linspace(-69, 69, 1000))[torch.randperm(1000, generator=g)]     # both anchors miss
    x[3] = -x[3].abs() * 1e-3 - 1e3                      # all negative in one narrow band
    x[4, ::7] = -1e30                                    # the smallest value far below the rest
    n = _lens(1000, 1000, 1000, 1000, 1000, 613)
    for k in (1, 37, 300, 999):
        want = reference.topk_positions(x.masked_fill(torch.arange(1000) >= n[:, None], -math.inf), k)
        assert torch.equal(_topk(x, n, k, launch), want), k


@pytest.mark.parametrize("split", [2, 4])
def test_chunks_start_before_seq_len_is_known(split):
    # while a row fits `split` tiles its chunks are those tiles, loaded before seq_len arrives
    # (NaN past seq_len must be dropped unread); a longer row is cut into chunks of ceil(n / split)
    x = torch.randn(7, 700)
    n = _lens(0, 1, 255, 256, 257, 700, 130)
    x.masked_fill_(torch.arange(700) >= n[:, None], float("nan"))
    for k in (1, 37, 128, 300):
        want = reference.topk_positions(x.masked_fill(torch.arange(700) >= n[:, None], -math.inf), k)
        assert torch.equal(_topk(x, n, k, TopkLaunch(tile=256, split=split)), want), k


def test_a_whole_tile_above_the_threshold():
    # the emit counts keys above and at the threshold in one 32-bit scan: a tile of 32768 keys all
    # above it fills the top bit (a signed scan read it as negative and stored nothing)
    x = -torch.arange(40000.0).reshape(1, -1)
    for k in (32768, 39000):
        want = reference.topk_positions(x, k)
        assert torch.equal(_topk(x, _lens(40000), k, TopkLaunch(tile=32768, split=1)), want), k


def test_short_rows_empty_rows_and_k_past_the_width():
    x = torch.randn(3, 50)
    got = _topk(x, _lens(7, 0, 50), 64)               # k > width > some seq_lens
    assert got[0, :7].tolist() == list(range(7)) and (got[0, 7:] == -1).all()
    assert (got[1] == -1).all()
    assert got[2, :50].tolist() == list(range(50)) and (got[2, 50:] == -1).all()
    assert got.shape == (3, 64)


def test_minus_inf_is_never_chosen_and_dead_positions_are_never_used():
    x = torch.randn(2, 300)
    x[0, 10:290] = -math.inf                    # only 20 live finite logits for k = 32
    x[1, 100:] = float("nan")                   # past seq_len: a NaN read would be chosen (largest key)
    n = _lens(300, 100)
    for launch in (None, SMALL):
        got = _topk(x, n, 32, launch)
        assert got[0, :20].tolist() == list(range(10)) + list(range(290, 300)) and (got[0, 20:] == -1).all()
        assert (got[1] < 100).all() and torch.equal(got[1], torch.topk(x[1, :100], 32).indices.sort().values.int())


def test_seq_lens_are_clamped_to_the_width_and_empty_batches_work():
    x = torch.randn(2, 40)
    assert torch.equal(_topk(x, _lens(1000, -5), 8), _topk(x, _lens(40, 0), 8))
    assert _topk(x[:0], _lens(), 8).shape == (0, 8)


def test_topk_refuses_what_it_cannot_read():
    x = torch.randn(2, 40)
    with pytest.raises(ValueError, match="float32"):
        topk_triton(x.double(), _lens(1, 2), 4)
    with pytest.raises(ValueError, match="unit stride"):
        topk_triton(x.t(), _lens(*range(40)), 4)
    with pytest.raises(ValueError, match="seq_lens must be int32"):
        topk_triton(x, _lens(1, 2).long(), 4)
    with pytest.raises(ValueError, match="k must be a positive int"):
        topk_triton(x, _lens(1, 2), 0)
    with pytest.raises(ValueError, match=r"at most 2\*\*31 - 1"):         # int32 slots, before any allocation
        topk_triton(x, _lens(1, 2), 2**31)


@pytest.mark.parametrize("split,ks,merge", [(2, (1, 301), "launch"), (4, (30,), "launch"), (8, (64,), "launch"),
                                            (2, (1, 301), "fused"), (4, (30,), "fused"), (8, (64,), "fused")])
def test_rows_split_over_programs_are_the_contract(split, ks, merge):
    # chunk candidates, then their merge: the same positions as one program per row, whatever the
    # chunk lengths (odd, shorter than k, empty), ties across chunk edges, -inf and empty rows
    g = torch.Generator().manual_seed(12 + split)
    x = torch.randn(6, 301, generator=g)
    x[1] = torch.randint(0, 3, (301,), generator=g).float()     # few distinct values: ties everywhere
    x[2, 5:290] = -math.inf
    x[3] = -x[3].abs()
    x[4, 100:] = float("nan")                                    # past seq_len: never used
    n = _lens(301, 301, 301, 37, 100, 0)
    launch = TopkLaunch(tile=256, split=split, merge=merge)
    for k in ks:
        want = reference.topk_positions(x.masked_fill(torch.arange(301) >= n[:, None], -math.inf), k)
        assert torch.equal(_topk(x, n, k, launch), want), k
    if split == 2:
        assert torch.equal(_topk(x[:1], n[:1], 40, launch), _topk(x[:1], n[:1], 40))   # B = 1
        assert _topk(x[:0], n[:0], 8, launch).shape == (0, 8)
    if merge == "fused":                       # every row's ticket counter is back at zero
        from dsv4lab import concurrency
        counters = [ws[2] for key, ws in concurrency.scope(x.device)[0].items() if key[0][0] == "topk" and key[0][4]]
        assert counters and all(int(t.abs().sum()) == 0 for t in counters)


def test_merge_option_is_checked():
    x = torch.randn(2, 300)
    with pytest.raises(ValueError, match="merge must be 'launch' or 'fused'"):
        _topk(x, _lens(300, 200), 8, TopkLaunch(tile=256, split=2, merge="cooperative"))


def test_split_is_chosen_from_shapes_only():
    assert split_for(32, 262208, 512, 132) == 4 and split_for(32, 1048576, 512, 132) == 4
    assert split_for(64, 262208, 512, 132) == 2 and split_for(128, 262208, 512, 132) == 1
    assert split_for(1, 262208, 512, 132) == 4 and split_for(1, 1500, 512, 132) == 1
    assert split_for(8, 262208, 4096, 132) == 2 and split_for(8, 262208, 8192, 132) == 1
    with pytest.raises(ValueError, match="split must be a power of two"):
        topk_triton(torch.zeros(1, 64), _lens(64), 4, launch=TopkLaunch(tile=64, split=4))


def test_strided_rows_of_a_wider_buffer():
    wide = torch.randn(3, 100)
    x = wide[:, :70]                            # row stride 100, width 70
    n = _lens(70, 33, 5)
    assert torch.equal(_topk(x, n, 16), reference.topk_positions(x.masked_fill(torch.arange(70) >= n[:, None], -math.inf), 16))


# ---- the indexer step: logits over live pages only, then the top-k ----

def _step_ref(inp, k):
    """The float64 reference's logits and the contract's selection on the kernel's own logits."""
    ref = reference.indexer_logits(*inp.args(), inp.max_seq_len)
    with poisoned():
        logits = triton_indexer.logits_triton(*inp.args(), inp.max_seq_len)
    return ref, reference.topk_positions(logits, k)


@pytest.mark.parametrize("case", [
    dict(B=3, H=64, L=300, lens=[300, 1, 129], k=64),           # page edges, one token
    dict(B=2, H=1, L=130, lens=[130, 0], k=200),                 # one head, an empty row, k > max_seq_len
    dict(B=1, H=128, L=64, lens=[64], k=64),                     # the most heads, k = the whole row
    dict(B=2, H=24, L=700, lens=None, k=100),                    # heads padded to a power of two, random lengths
])
def test_step_against_the_reference(case):
    inp = make_indexer_inputs(case["B"], case["H"], case["L"], seq_lens=case["lens"], seed=3)
    ref, want = _step_ref(inp, case["k"])
    with poisoned():
        got = TOPK(*inp.args(), max_seq_len=case["L"], topk=case["k"])
    assert torch.equal(got, want)                                        # the contract, on its own logits
    assert topk_recall(got, reference.topk_indices(ref, case["k"]), ref) == 1.0   # and the float64 selection
    err, recall = check_indexer("triton", inp, topk=case["k"])           # through the API, poisoned
    assert err <= INDEXER_TOL and recall == 1.0


def test_step_writes_and_reads_live_pages_only():
    # without the fill, positions past each row's live pages keep what the buffer held (NaN when poisoned)
    inp = make_indexer_inputs(3, 16, 1000, seq_lens=[1000, 70, 0], seed=4)
    with poisoned():
        out = triton_indexer.logits_triton(*inp.args(), 1000, fill_dead=False)
    assert torch.isnan(out[1, 128:]).all() and torch.isnan(out[2]).all()
    assert torch.isneginf(out[1, 70:128]).all() and torch.isfinite(out[0]).all()


@pytest.mark.parametrize("junk", [-1, -2**31, 2**31 - 1, 123456789])
def test_dead_page_table_entries_hold_anything(junk):
    inp = make_indexer_inputs(2, 16, 640, seq_lens=[200, 65], seed=5)
    ref, want = _step_ref(inp, 50)
    live = (inp.seq_lens.long() + 63) // 64
    dead = torch.arange(inp.page_table.shape[1])[None, :] >= live[:, None]
    inp.page_table[dead] = junk
    with poisoned():
        assert torch.equal(TOPK(*inp.args(), max_seq_len=640, topk=50), want)
        assert rel_err(dsv4lab.indexer_logits(*inp.args(), max_seq_len=640, impl="triton"), ref) <= INDEXER_TOL


@pytest.mark.parametrize("prefetch,split,merge", [(0, 1, "fused"), (1, 1, "fused"), (2, 4, "fused"), (2, 4, "launch")])
def test_a_bad_live_page_id_is_never_read(prefetch, split, merge):
    # what a captured graph would see with a corrupt page table (the API's check cannot run there):
    # the logits kernel scores that page's 64 positions -inf (never used); the step cuts the request
    # there (the API's contract: nothing from that page on is chosen) and flags it
    inp = make_indexer_inputs(3, 16, 400, seq_lens=[400, 300, 130], seed=6)
    ref, _ = _step_ref(inp, 40)
    inp.page_table[0, 2] = inp.cache.num_pages          # one past the cache
    inp.page_table[1, 0] = -7
    inp.page_table[2, 1] = 2**31 - 1
    errors.read()
    with poisoned():
        out = triton_indexer.logits_triton(*inp.args(), 400, launch=LogitsLaunch(prefetch=prefetch))
        top = triton_indexer.topk_step(*inp.args(), 400, 40, launch=LogitsLaunch(prefetch=prefetch),
                                topk_launch=TopkLaunch(tile=256, split=split, merge=merge))
    assert errors.read() == errors.Flag.PAGE
    bad = torch.zeros(3, 400, dtype=torch.bool)
    bad[0, 128:192] = bad[1, 0:64] = bad[2, 64:128] = True
    assert torch.isneginf(out[bad]).all()
    assert rel_err(out.masked_fill(bad, -math.inf), ref.masked_fill(bad, -math.inf)) <= INDEXER_TOL
    cut = torch.zeros(3, 400, dtype=torch.bool)
    cut[0, 128:] = cut[1, :] = cut[2, 64:] = True
    assert torch.equal(top, reference.topk_positions(ref.masked_fill(cut, -math.inf), 40))


def _next_step(inp, seed, gen):
    """The next decode step's data written into ``inp``'s buffers (every page of its table live):
    new q and weights, random lengths up to the max context."""
    B, H, _ = inp.q.shape
    nxt = make_indexer_inputs(B, H, inp.max_seq_len, seq_lens=inp.max_seq_len, seed=seed)
    inp.q.copy_(nxt.q)
    inp.weights.copy_(nxt.weights)
    inp.seq_lens.copy_(torch.randint(0, inp.max_seq_len + 1, (B,), generator=gen).int())


def test_one_launch_shape_across_steps():
    # a captured graph replays one launch (same grid, same buffers) on each step's data
    inp = make_indexer_inputs(3, 16, 512, seq_lens=[512, 512, 512], seed=7)
    g = triton_indexer.grid(3, 512)
    gen = torch.Generator().manual_seed(8)
    for step in range(3):
        _next_step(inp, 20 + step, gen)
        inp.seq_lens[step] = 0 if step else 512
        inp.page_table.copy_(inp.page_table[torch.randperm(3, generator=gen)])
        ref, want = _step_ref(inp, 64)
        with poisoned():
            assert torch.equal(TOPK(*inp.args(), max_seq_len=512, topk=64), want)
        assert topk_recall(want, reference.topk_indices(ref, 64), ref) == 1.0
        assert triton_indexer.grid(3, 512) == g


def test_strided_views_and_the_empty_batch():
    inp = make_indexer_inputs(2, 8, 200, seq_lens=[150, 30], seed=9)
    big_q = torch.zeros(2, 16, 128, dtype=inp.q.dtype)
    big_q[:, ::2] = inp.q
    big_w = torch.zeros(2, 8, 3)
    big_w[:, :, 1] = inp.weights
    ref, want = _step_ref(inp, 32)
    got = dsv4lab.indexer_topk(big_q[:, ::2], inp.cache, big_w[:, :, 1], inp.seq_lens, inp.page_table,
                               max_seq_len=200, topk=32, impl="triton")
    assert torch.equal(got, want)
    e = lambda t: t[:0]  # noqa: E731
    for impl in ("triton", "torch_fp32", "reference"):
        top = dsv4lab.indexer_topk(e(inp.q), inp.cache, e(inp.weights), e(inp.seq_lens), e(inp.page_table),
                                   max_seq_len=200, topk=32, impl=impl)
        logits = dsv4lab.indexer_logits(e(inp.q), inp.cache, e(inp.weights), e(inp.seq_lens), e(inp.page_table),
                                        max_seq_len=200, impl=impl)
        assert top.shape == (0, 32) and top.dtype == torch.int32 and logits.shape == (0, 200)


def test_seq_len_past_max_is_clamped_by_the_kernels_and_refused_by_the_api():
    inp = make_indexer_inputs(2, 8, 128, seq_lens=[128, 100], seed=10)
    _, want = _step_ref(inp, 16)
    inp.seq_lens[0] = 500                                              # past max_seq_len: clamped
    with poisoned():
        assert torch.equal(TOPK(*inp.args(), max_seq_len=128, topk=16), want)
    with pytest.raises(ValueError, match="seq_lens must lie in"):
        dsv4lab.indexer_topk(*inp.args(), max_seq_len=128, topk=16, impl="triton", checks="sync")
    errors.read()
    with poisoned():                                                   # device mode: clamped and flagged
        assert torch.equal(dsv4lab.indexer_topk(*inp.args(), max_seq_len=128, topk=16, impl="triton"), want)
    assert errors.read() & errors.Flag.SEQ_LEN


@pytest.mark.parametrize("launch", [LogitsLaunch(dot="fp16"), LogitsLaunch(prefetch=2, dot="fp16"),
                                    LogitsLaunch(prefetch=0, num_stages=2)], ids=["fp16", "fp16 prefetch 2", "plain"])
def test_logits_launch_variants_are_exact(launch):
    # fp16 operands: q scaled per head by a power of two, then rounded to fp16 as the GPU would
    inp = make_indexer_inputs(3, 24, 400, seq_lens=[400, 65, 0], seed=11)
    inp.q[0, 3] *= 1e-30                                              # heads far outside fp16's range
    inp.q[1, 5] *= 1e20
    ref = reference.indexer_logits(*inp.args(), 400)
    for nprog in (1, 3):
        with poisoned():
            out = triton_indexer.logits_triton(*inp.args(), 400, nprog=nprog, launch=launch)
        assert rel_err(out, ref) <= INDEXER_TOL


def test_random_shapes_property():
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies

    @hyp.settings(max_examples=12, deadline=None, derandomize=True)
    @hyp.given(B=st.integers(1, 3), H=st.sampled_from([1, 5, 16, 64]), L=st.integers(1, 260), k=st.integers(1, 300),
               seed=st.integers(0, 2**16), data=st.data())
    def check(B, H, L, k, seed, data):
        lens = data.draw(st.lists(st.integers(0, L), min_size=B, max_size=B))
        inp = make_indexer_inputs(B, H, L, seq_lens=lens, seed=seed)
        ref, want = _step_ref(inp, k)
        with poisoned():
            got = TOPK(*inp.args(), max_seq_len=L, topk=k)
        assert torch.equal(got, want)
        assert topk_recall(got, reference.topk_indices(ref, k), ref) == 1.0
    check()


def test_step_plots_draw_every_impl_and_the_floor():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd
    from dsv4lab import plots
    rows = [dict(kind="step_vs_max", impl=i, live=8192, max_seq_len=L, graph_us=t * L / 8192, floor_us=9.0)
            for i, t in (("torch_fp32", 500.0), ("triton", 1.0)) for L in (8192, 65536)]
    rows += [dict(kind="step_vs_live", impl="triton", live=n, max_seq_len=2**20, graph_us=n / 100, logits_us=n / 200,
                  topk_us=None if n == 1024 else 5.0, floor_us=n / 1000) for n in (1024, 8192)]
    fig, (a, b) = plt.subplots(1, 2)
    plots.indexer_step_vs_max(a, pd.DataFrame(rows))
    plots.indexer_step_vs_live(b, pd.DataFrame(rows))
    assert [t.get_text() for t in a.get_legend().get_texts()][:2] == ["torch_fp32", "triton"]
    assert len(a.get_lines()) == 3 and len(b.get_lines()) == 4
    assert len(b.get_lines()[2].get_xdata()) == 1                      # a missing time is left out, not drawn as 0
    plt.close(fig)


def test_the_step_guards_its_inputs_without_the_guard_launch(monkeypatch):
    # impl="triton" clamps seq_lens and cuts at a bad live page id in its own kernels, flagging both:
    # the API runs it without kernels.guards.sanitize_indexer (one launch fewer, eager and in a graph)
    from dsv4lab.kernels import guards
    assert dsv4lab.registry.impl_info("indexer_topk", "triton").guards_inputs
    inp = make_indexer_inputs(2, 8, 256, seq_lens=[256, 200], seed=13)
    ref, _ = _step_ref(inp, 24)
    inp.seq_lens[0] = 9999
    inp.page_table[1, 1] = -3

    def refuse(*a, **kw):
        raise AssertionError("the guard launch ran")
    monkeypatch.setattr(guards, "sanitize_indexer", refuse)
    errors.read()
    with poisoned():
        got = dsv4lab.indexer_topk(*inp.args(), max_seq_len=256, topk=24, impl="triton")
    assert errors.read() == errors.Flag.SEQ_LEN | errors.Flag.PAGE
    cut = torch.zeros(2, 256, dtype=torch.bool)
    cut[1, 64:] = True
    assert torch.equal(got, reference.topk_positions(ref.masked_fill(cut, -math.inf), 24))


def test_shared_histograms_only_where_every_key_has_one_thread():
    # a tile smaller than a program's threads is held twice over, and each copy's atomic would
    # count: such launches, and the interpreter, count by ballots
    from dsv4lab.kernels.indexer.topk import counts_in_shared
    shared = TopkLaunch(histogram="shared", num_warps=8)
    assert counts_in_shared(shared, (2048, 2048), interpret=False)
    assert not counts_in_shared(shared, (128, 2048), interpret=False)
    assert not counts_in_shared(shared, (2048,), interpret=True)
    assert not counts_in_shared(TopkLaunch(histogram="ballot"), (8192,), interpret=False)
    assert counts_in_shared(TopkLaunch(histogram="shared", num_warps=16), (512,), interpret=False)
    assert not counts_in_shared(TopkLaunch(), (256,), interpret=False)              # 16 warps: 512 threads
    with pytest.raises(ValueError, match="histogram must be 'ballot' or 'shared'"):
        _topk(torch.randn(2, 300), _lens(300, 200), 8, TopkLaunch(histogram="smem"))


def _refuse_checks(monkeypatch):
    """From here on the API's checks raise: a call that still returns went through a prepared step."""
    def checks(*a, **k):
        raise AssertionError("the full path ran")
    monkeypatch.setattr(dsv4lab.api, "check_indexer_args", checks)


def test_a_repeated_signature_skips_to_its_launches(monkeypatch):
    # an eager loop calls with the same shapes every step: after one checked call, each later call
    # with the same signature goes straight to its two launches, on its own data
    dsv4lab.api.prepared_calls().clear()
    inp = make_indexer_inputs(3, 16, 512, seq_lens=[512, 512, 512], seed=30)      # every page live in the table
    inp.seq_lens.copy_(_lens(512, 300, 64))
    call = lambda i: dsv4lab.indexer_topk(*i.args(), max_seq_len=512, topk=64, impl="triton")  # noqa: E731
    first = call(inp)
    assert torch.equal(first, _step_ref(inp, 64)[1]) and len(dsv4lab.api.prepared_calls()) == 1
    _refuse_checks(monkeypatch)
    gen = torch.Generator().manual_seed(31)
    for step in range(3):
        _next_step(inp, 40 + step, gen)
        inp.seq_lens[step] = [0, 1, 63][step]                          # an empty row, one token, < k
        ref, want = _step_ref(inp, 64)
        got = call(inp)
        assert torch.equal(got, want) and got.data_ptr() != first.data_ptr()   # a fresh output every call
    # the guard still runs on the prepared path: a bad live page id cuts its request and is flagged
    errors.read()
    ref, _ = _step_ref(inp, 64)
    inp.page_table[0, 1] = -5
    cut = torch.zeros(3, 512, dtype=torch.bool)
    cut[0, 64:] = True
    got = call(inp)
    assert errors.read() == errors.Flag.PAGE
    assert torch.equal(got, reference.topk_positions(ref.masked_fill(cut | (torch.arange(512) >= inp.seq_lens[:, None]),
                                                                      -math.inf), 64))
    # anything else in the signature is a new call, checked first
    for other in (dict(max_seq_len=512, topk=32), dict(max_seq_len=256, topk=64)):
        with pytest.raises(AssertionError, match="full path"):
            dsv4lab.indexer_topk(*inp.args(), impl="triton", **other)
    with pytest.raises(AssertionError, match="full path"):
        dsv4lab.indexer_topk(inp.q[:2], *inp.args()[1:], max_seq_len=512, topk=64, impl="triton")


def test_what_a_prepared_step_does_not_repeat(monkeypatch):
    dsv4lab.api.prepared_calls().clear()
    inp = make_indexer_inputs(2, 16, 256, seq_lens=[256, 100], seed=32)
    args = inp.args()
    want = _step_ref(inp, 32)[1]
    call = lambda *a, **k: dsv4lab.indexer_topk(*a, max_seq_len=k.pop("L", 256), topk=k.pop("topk", 32),  # noqa: E731
                                                 impl="triton", **k)
    # never prepared: the sync checks, numpy / bool scalars, a copy the step makes first
    call(*args, checks="sync")
    call(*args, topk=torch.tensor(32).numpy()[()])
    call(args[0].transpose(0, 1).contiguous().transpose(0, 1), *args[1:])   # q not contiguous
    assert not dsv4lab.api.prepared_calls()
    assert torch.equal(call(*args), want) and len(dsv4lab.api.prepared_calls()) == 1
    real_checks = dsv4lab.contracts.check_indexer_args
    _refuse_checks(monkeypatch)
    assert torch.equal(call(*args), want)
    # poisoned outputs, and another cache object with the same shapes, take the full path
    with pytest.raises(AssertionError, match="full path"), poisoned():
        call(*args)
    from dsv4lab.cache import IndexKCache
    twin = IndexKCache(inp.cache.kv.clone(), inp.cache.num_tokens, inp.cache.page_size)
    with pytest.raises(AssertionError, match="full path"):
        call(args[0], twin, *args[2:])
    # bad arguments are refused by name, as always: a changed dtype is a new signature
    monkeypatch.setattr(dsv4lab.api, "check_indexer_args", real_checks)
    with pytest.raises(TypeError, match="seq_lens"):
        call(args[0], args[1], args[2], args[3].long(), args[4])
    with pytest.raises(ValueError, match="impl"):
        dsv4lab.indexer_topk(*args, max_seq_len=256, impl=["triton"])
