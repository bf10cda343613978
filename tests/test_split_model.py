"""auto's rule (split_k.plans/choose): depends on shapes only, and picks split-K where the
grid is too small for the chip and the stage-2 launch where it is full."""
import pytest

import torch

from dsv4lab.kernels import head_batched, split_k

# the H200's tiles and the partials its recorded runs wrote: the model as the GPU sees it, in any mode
H200 = dict(mma_cfg=head_batched.TILE_TABLE[("9.0", "mma")], split_cfg=head_batched.TILE_TABLE[("9.0", "split")],
            partials=torch.bfloat16)


def best(B, H=64, K=512, sms=132):
    return min(split_k.plans(B, H, K, sms=sms, **H200), key=lambda p: (p.model_us, p.nsplit))


def test_small_batch_splits_large_batch_does_not():
    assert best(1).use == "split" and best(1).nsplit > 1
    assert best(128).use == "mma" and best(128).nsplit == 1


def test_model_matches_the_recorded_h200_choices():
    # data/runs/h200/split.json (model_choice) and decode.json (auto's plan): 16-head tiles
    # split x8 at B<=4, x4 at 8; 64-head tiles split x4 at B=16/32, x2 at 64, one launch at 128
    picks = {B: (best(B).use, best(B).cfg.block_h, best(B).nsplit) for B in (1, 4, 8, 16, 32, 64, 128)}
    assert picks == {1: ("split", 16, 8), 4: ("split", 16, 8), 8: ("split", 16, 4), 16: ("split", 64, 4),
                     32: ("split", 64, 4), 64: ("split", 64, 2), 128: ("mma", 64, 1)}


def test_more_sms_never_mean_fewer_programs():
    for B in (1, 2, 4, 8, 16, 32):
        assert best(B, sms=188).programs >= best(B, sms=132).programs


@pytest.mark.parametrize("K", [1, 17, 64, 100, 512])
def test_slices_cover_k_without_empty_tail(K):
    for p in split_k.plans(3, 64, K, sms=132, **H200):
        tiles = -(-K // p.cfg.block_n)
        assert p.nsplit * p.tiles_per_program >= tiles > (p.nsplit - 1) * p.tiles_per_program
        assert p.nsplit <= split_k.MAX_SPLIT


def test_stage2_tiles_fill_the_chip_then_batch_heads():
    # choose_tiles: 16-head tiles while 64-head programs would leave SMs idle; 64 once the
    # grid is full (recorded H200: 16 heads at B<=32, 64 at B=64/128, data/runs/h200/decode.json)
    def pick(B):
        big, small = H200["mma_cfg"], H200["split_cfg"]
        return min((big, small), key=lambda c: head_batched.model_us(c, B, 64, 512, sms=132)[3]).block_h
    assert [pick(B) for B in (1, 8, 32, 64, 128)] == [16, 16, 16, 64, 64]
    progs, waves, per, t = head_batched.model_us(H200["mma_cfg"], 133, 64, 512, sms=132)
    c = H200["mma_cfg"]
    per_program = 512 // c.block_n
    assert (progs, waves, per) == (133, 2, per_program)
    assert t == pytest.approx(c.fixed_us + 2 * per_program * c.us_per_tile)


@pytest.mark.parametrize("partials", [torch.float32, torch.bfloat16])
def test_merge_cost_grows_with_partials(partials):
    # the same programs and tiles per program, 4x the partials: the model must charge their bytes
    kw = dict(H200, partials=partials)
    one, = [p for p in split_k.plans(1, 64, 512, sms=1024, **kw) if p.nsplit == 4 and p.cfg.block_h == 64]
    four, = [p for p in split_k.plans(4, 64, 512, sms=1024, **kw) if p.nsplit == 4 and p.cfg.block_h == 64]
    assert four.model_us - one.model_us == pytest.approx(
        split_k.PARTIAL_US_PER_MB * 3 * 64 * 4 * 512 * partials.itemsize / 1e6)


def test_pdl_is_never_asked_of_the_interpreter(monkeypatch):
    # griddepcontrol is PTX: the interpreter must get a plain launch even with PDL switched on
    from dsv4lab.device import is_interpret
    monkeypatch.setattr(split_k, "PDL", "1")
    if is_interpret():
        assert split_k.pdl_kwargs(1) == {}
    else:
        assert split_k.pdl_kwargs(1) in ({}, {"USE_GDC": True, "launch_pdl": True})


def test_pdl_auto_only_on_a_half_empty_grid(monkeypatch):
    # "auto": PDL when the split launch leaves at least half the SMs idle, never on a fuller grid,
    # "0" never, "1" always (on a GPU that has it: forced here)
    from dsv4lab.kernels import head_batched
    monkeypatch.setattr(split_k, "use_pdl", lambda: True)
    monkeypatch.setattr(head_batched, "sm_count", lambda: 132)
    on = {"USE_GDC": True, "launch_pdl": True}
    monkeypatch.setattr(split_k, "PDL", "auto")
    assert split_k.pdl_kwargs(66) == on and split_k.pdl_kwargs(67) == {} and split_k.pdl_kwargs(None) == {}
    monkeypatch.setattr(split_k, "PDL", "0")
    assert split_k.pdl_kwargs(1) == {}
    monkeypatch.setattr(split_k, "PDL", "1")
    assert split_k.pdl_kwargs(1000) == on


def test_fit_costs_recovers_the_model_it_fits():
    # B=1 rows made from known figures (fixed 9, 2.5 us a tile, merge 1.5): the fit returns them
    from dsv4lab import record
    cfg = head_batched.TileConfig(16, 64, 8, 1, "t", prefetch=2)
    keys = dict(block_h=16, block_n=64, num_warps=8, num_stages=1, lazy_rescale=False, prefetch=2)
    rows = [dict(B=1, nsplit=n, us=9.0 + (8 // n) * 2.5 + (1.5 if n > 1 else 0.0), **keys) for n in (1, 2, 4, 8)]
    rows.append(dict(B=2, nsplit=1, us=999.0, **keys))                 # other batch sizes are not used
    fit = record.fit_costs(rows, cfg)
    assert (fit.fixed_us, fit.us_per_tile, fit.merge_us) == pytest.approx((9.0, 2.5, 1.5))
