"""splitk_auto's rule (planning.plans/choose): depends on shapes only, and picks split-K where the
grid is too small for the chip and the stage-2 launch where it is full."""
import pytest

import torch

from dsv4lab.kernels.decode import planning

# the H200's tiles and the partials its recorded runs wrote: the model as the GPU sees it, in any mode
H200_TILES = (planning.TILE_TABLE[("9.0", "mma")], planning.TILE_TABLE[("9.0", "split")])
H200 = dict(cfgs=H200_TILES, partials_bytes=2)


def best(B, H=64, K=512, sms=132):
    return planning.choose(B, H, K, sms=sms, cfgs=H200_TILES)


def test_small_batch_splits_large_batch_does_not():
    assert best(1).use == "split" and best(1).nsplit > 1
    assert best(128).use == "mma" and best(128).nsplit == 1


def test_model_matches_the_recorded_h200_choices():
    # the recorded H200 NSPLIT sweep (model_choice) and decode run (splitk_auto's plan): 16-head tiles
    # split x8 at B<=4, x4 at 8; 64-head tiles split x4 at B=16/32, x2 at 64, one launch at 128
    picks = {B: (best(B).use, best(B).cfg.block_h, best(B).nsplit) for B in (1, 4, 8, 16, 32, 64, 128)}
    assert picks == {1: ("split", 16, 8), 4: ("split", 16, 8), 8: ("split", 16, 4), 16: ("split", 64, 4),
                     32: ("split", 64, 4), 64: ("split", 64, 2), 128: ("mma", 64, 1)}


def test_more_sms_never_mean_fewer_programs():
    for B in (1, 2, 4, 8, 16, 32):
        assert best(B, sms=188).programs >= best(B, sms=132).programs


@pytest.mark.parametrize("K", [1, 17, 64, 100, 512])
def test_slices_cover_k_without_empty_tail(K):
    for p in planning.plans(3, 64, K, sms=132, **H200):
        tiles = -(-K // p.cfg.block_n)
        assert p.nsplit * p.tiles_per_program >= tiles > (p.nsplit - 1) * p.tiles_per_program
        assert p.nsplit <= planning.MAX_SPLIT


def test_stage2_tiles_fill_the_chip_then_batch_heads():
    # choose_tiles: 16-head tiles while 64-head programs would leave SMs idle; 64 once the
    # grid is full (the recorded H200 run: 16 heads at B<=32, 64 at B=64/128)
    def pick(B):
        return planning.choose_tiles(B, 64, 512, sms=132, cfgs=H200_TILES).block_h
    assert [pick(B) for B in (1, 8, 32, 64, 128)] == [16, 16, 16, 64, 64]
    c = H200_TILES[0]
    progs, waves, per, t = planning.model_us(c, 133, 64, 512, sms=132)
    per_program = 512 // c.block_n
    assert (progs, waves, per) == (133, 2, per_program)
    assert t == pytest.approx(c.fixed_us + 2 * per_program * c.us_per_tile)


@pytest.mark.parametrize("partials", [torch.float32, torch.bfloat16])
def test_merge_cost_grows_with_partials(partials):
    # the same programs and tiles per program, 4x the partials: the model must charge their bytes
    kw = dict(cfgs=H200_TILES, partials_bytes=partials.itemsize)
    one, = [p for p in planning.plans(1, 64, 512, sms=1024, **kw) if p.nsplit == 4 and p.cfg.block_h == 64]
    four, = [p for p in planning.plans(4, 64, 512, sms=1024, **kw) if p.nsplit == 4 and p.cfg.block_h == 64]
    assert four.model_us - one.model_us == pytest.approx(
        planning.PARTIAL_US_PER_MB * 3 * 64 * 4 * 512 * partials.itemsize / 1e6)


def test_pdl_only_on_a_half_empty_grid_of_a_gpu_that_has_it(monkeypatch):
    # PDL for the combine when the split launch leaves at least half the SMs idle, never on a
    # fuller grid, never for a whole-row launch, never without the hardware (the interpreter)
    cfg = H200_TILES[1]
    monkeypatch.setattr(planning, "pdl_supported", lambda: True)
    monkeypatch.setattr(planning, "sm_count", lambda: 132)
    monkeypatch.setattr(planning, "is_interpret", lambda: False)
    assert planning.launch_for(cfg, 4, programs=66).pdl and not planning.launch_for(cfg, 4, programs=67).pdl
    assert not planning.launch_for(cfg, 1, programs=1).pdl and not planning.launch_for(cfg, 4).pdl
    monkeypatch.setattr(planning, "pdl_supported", lambda: False)
    assert not planning.launch_for(cfg, 4, programs=1).pdl


def test_split_slices_take_cvt_whole_rows_the_entry(monkeypatch):
    # the entry's dequant/fold for whole rows; split slices "cvt" and no fold (measured faster there)
    monkeypatch.setattr(planning, "is_interpret", lambda: False)
    bits = H200_TILES[0]
    assert (bits.dequant, bits.fold_scale) == ("bits", True)
    whole, sliced = planning.launch_for(bits, 1), planning.launch_for(bits, 2)
    assert (whole.dequant, whole.fold_scale) == ("bits", True)
    assert (sliced.dequant, sliced.fold_scale) == ("cvt", False)


def test_fit_costs_recovers_the_model_it_fits():
    # B=1 rows made from known figures (fixed 9, 2.5 us a tile, merge 1.5): the fit returns them
    from dsv4lab import sweeps
    cfg = planning.TileConfig(16, 64, 8, 1, "t", loop="registers")
    keys = dict(block_h=16, block_n=64, num_warps=8, num_stages=1, loop="registers", dequant="cvt", fold_scale=False)
    rows = [dict(B=1, nsplit=n, us=9.0 + (8 // n) * 2.5 + (1.5 if n > 1 else 0.0), **keys) for n in (1, 2, 4, 8)]
    rows.append(dict(B=2, nsplit=1, us=999.0, **keys))                 # other batch sizes are not used
    rows.append(dict(B=1, nsplit=2, us=1.0, **dict(keys, loop="plain")))   # another config's row is not used
    fit = sweeps.fit_costs(rows, cfg)
    assert (fit.fixed_us, fit.us_per_tile, fit.merge_us) == pytest.approx((9.0, 2.5, 1.5))


@pytest.mark.parametrize("bad", [dict(loop="unrolled"), dict(dequant="int"), dict(block_h=24), dict(block_n=8)])
def test_tile_config_refuses_what_no_kernel_runs(bad):
    with pytest.raises(ValueError, match="TileConfig|tl.dot"):
        planning.TileConfig(**{**dict(block_h=16, block_n=16, num_warps=4, num_stages=1), **bad})
