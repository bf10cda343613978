"""Notebooks 02-03's widgets: every view callback at every setting (or a representative grid), on the
recorded run and on tables in the recorded run's newer layout. On a CPU each setting also runs a
small kernel through the interpreter and checks it against the float64 reference."""
import dsv4lab  # noqa: F401  (first: sets the mode before anything imports triton)
import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dsv4lab import runs, widgets  # noqa: E402
from dsv4lab.kernels.decode.planning import STORY_TILES  # noqa: E402


@pytest.fixture
def no_show(monkeypatch):
    """Count the figures the views draw, and close them (no display in tests)."""
    shown = []
    monkeypatch.setattr(plt, "show", lambda *a, **k: (shown.append(plt.gcf()), plt.close("all")))
    return shown


def _as_new_layout(df: pd.DataFrame) -> pd.DataFrame:
    """A sweep table as runs recorded with named loops write it ("loop", no "prefetch")."""
    from dsv4lab import plots
    return df.assign(loop=df.apply(plots.loop_name, axis=1)).drop(columns=["prefetch", "lazy_rescale"], errors="ignore")


def _decode_with_story(decode: pd.DataFrame) -> pd.DataFrame:
    """The decode table with mma_story rows carrying a ``launch`` dict, as newer runs record them
    (unchanged when the recorded table has them already)."""
    if (decode.impl == "mma_story").any():
        return decode
    story = decode[decode.impl == "mma"].assign(impl="mma_story", graph_us=lambda d: d.graph_us * 2)
    story["launch"] = [dict(block_h=STORY_TILES.block_h, block_n=STORY_TILES.block_n, loop="plain", nsplit=1)] * len(story)
    return pd.concat([decode, story], ignore_index=True)


@pytest.mark.parametrize("layout", ["recorded", "named loops + mma_story"])
def test_tiles_view_at_every_setting(layout, no_show, capsys):
    tiles, decode = runs.table("tiles"), runs.table("decode")
    if layout != "recorded":
        tiles, decode = _as_new_layout(tiles), _decode_with_story(decode)
    batches = sorted(int(c[4:]) for c in tiles.columns if c.startswith("us_B"))
    for block_h in widgets.STORY_BLOCK_HS:
        for B in batches:
            chk = widgets.tiles_view(tiles, block_h, B, decode=decode, sms=132)
            b, H, _, _ = widgets.story_shape(B)
            assert chk["ok"], chk
            assert (chk["block_h"], chk["B"], chk["programs"]) == (block_h, b, b * -(-H // block_h))
            rec = widgets.recorded_head_block(tiles, decode, block_h, B)
            has_story = ((decode.impl == "mma_story") & (decode.B == B)).any()
            assert len(rec) == (tiles.block_h == block_h).sum() + (has_story and block_h == STORY_TILES.block_h)
            assert rec.us.notna().all()
    assert len(no_show) == len(widgets.STORY_BLOCK_HS) * len(batches)
    out = capsys.readouterr().out
    assert "FAILS" not in out and out.count("checked now") == len(no_show)


def test_recorded_head_block_names_the_story_kernel_only_at_its_block():
    decode = _decode_with_story(runs.table("decode"))
    tiles = runs.table("tiles")
    story = widgets.recorded_head_block(tiles, decode, STORY_TILES.block_h, 8)
    assert story.label.str.contains("the story's kernel").sum() == 1
    assert not widgets.recorded_head_block(tiles, decode, 64, 8).label.str.contains("story").any()
    assert widgets.recorded_head_block(tiles, None, 32, 8).empty            # no 32-head tile was swept


def test_story_check_catches_a_wrong_kernel(monkeypatch):
    # the check is real: a kernel that drops the sink fails it
    from dsv4lab.kernels.decode import head_batched
    real = head_batched.sparse_decode_story
    monkeypatch.setattr(head_batched, "sparse_decode_story", lambda *a, attn_sink=None, **k: real(*a, attn_sink=None, **k))
    widgets.head_batched._story_check.cache_clear()
    try:
        assert not widgets.story_check(16, 1)["ok"]
    finally:
        widgets.head_batched._story_check.cache_clear()


@pytest.mark.parametrize("layout", ["recorded", "named loops"])
def test_split_view_at_every_setting(layout, no_show, capsys):
    split = runs.table("split")
    if layout != "recorded":
        split = _as_new_layout(split)
    batches = sorted(int(b) for b in split.B.unique())
    splits = sorted(set(int(n) for n in split.nsplit.unique()) | {16})
    for B in batches:
        for nsplit in splits:
            chk = widgets.split_view(split, B, nsplit, sms=132)
            assert chk["ok"] and chk["nsplit"] == nsplit, chk
            out = capsys.readouterr().out
            # the model's choice is shown at every B, whichever tile config it is in
            pick = split[(split.B == B) & split.model_choice.astype(bool)]
            assert len(pick) == 1
            assert f"x{int(pick.nsplit.iloc[0])}, {pick.us.iloc[0]:.1f} us" in out.split("the model's choice")[1]
            assert "none recorded" not in out
    assert len(no_show) == len(batches) * len(splits)


def test_split_check_counts_programs_with_no_token():
    # one 16-head block, 128 tokens in tiles of 16: NSPLIT 16 cuts 16-token slices of which the
    # last 8 lie past K; shorter rows (topk_len) leave more of them empty
    b, H, K, _ = widgets.split_shape(1)
    chk = widgets.split_check(16, 1)
    assert chk["ok"] and chk["programs"] == b * 16
    assert chk["empty_programs"] >= b * 8
    assert widgets.split_check(1, 1)["empty_programs"] <= b


def test_widgets_build_and_offer_every_setting(no_show):
    tiles, decode, split = runs.table("tiles"), runs.table("decode"), runs.table("split")
    wt = widgets.explore_tiles(tiles, decode, sms=132)
    ws = widgets.explore_split(split, sms=132)
    assert list(wt.children[0].options) == list(widgets.STORY_BLOCK_HS)
    assert list(wt.children[1].options) == sorted(int(c[4:]) for c in tiles.columns if c.startswith("us_B"))
    assert list(ws.children[0].options) == sorted(int(b) for b in split.B.unique())
    assert 16 in ws.children[1].options
    assert len(no_show) == 2                                              # each drew once on creation
    wt.children[0].value = 64                                             # a change redraws
    ws.children[1].value = 16
    assert len(no_show) == 4


def test_times_keeps_two_figures_below_ten():
    from dsv4lab.plots import times
    assert [times(x) for x in (1.6, 0.89, 23.4, 123.4, None, float("nan"))] == ["1.6x", "0.89x", "23x", "123x", "", ""]
