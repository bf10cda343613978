"""The bridge from the story's numbers to a run's (dsv4lab.bridge), on a synthetic GPU-shaped run whose
costs follow a known law: the factors must multiply back to the measured speedups, name their
sources, and the sensitivity's model must give back the points it was not fitted to."""
import math

import pytest

from dsv4lab import bridge, profile
from dsv4lab.device import KNOWN_DEVICES
from dsv4lab.model import DSV4_FLASH_TP8

CFG = DSV4_FLASH_TP8
DEVICE = "NVIDIA H100 80GB HBM3"
# (fixed us, us per live entry, us per masked entry) of each impl's call at B = 1 and 32
DECODE = {("sglang", 1): (10.0, 0.37, 0.29), ("sglang", 32): (30.0, 5.5, 4.6),
          ("mma_story", 1): (6.0, 0.22, 0.20), ("mma_story", 32): (7.0, 0.23, 0.20)}
IN_STEP = 1.1
INDEXER_PER_POSITION = {1: {profile.GLUE: 1.3e-6, profile.FP32_GEMM: 2e-7, profile.TOPK: 1e-7},
                        32: {profile.GLUE: 4.2e-5, profile.FP32_GEMM: 1.3e-5, profile.TOPK: 6e-7}}
REST = {profile.GLUE: 14.0, profile.FP32_GEMM: 1.0, profile.MOE: 3.0, profile.BF16_GEMM: 2.7}
IMPL = {"S0": "sglang", "S1": "mma_story", "S0cap": "sglang", "S1cap": "mma_story"}


def _rows(max_context, live=CFG.live_context):
    k128 = CFG.c128_width(max_context)
    return {"window": (CFG.window, CFG.window), "ratio 4": (CFG.index_topk, CFG.index_topk),
            "ratio 128": (k128, live // 128)}


def _call_us(impl, B, K, valid):
    a, bv, bm = DECODE[(impl, B)]
    return a + bv * valid + bm * (K - valid)


def _kernel_cats(impl, C, n4, max_context):
    n128 = CFG.num_layers - CFG.layers_window - n4
    calls = {"window": CFG.num_layers, "ratio 4": n4, "ratio 128": n128}
    rows = _rows(max_context)
    dec = IN_STEP * sum(n * _call_us(impl, C, *rows[k]) for k, n in calls.items()) / 1e3
    w = CFG.index_max_seq_len(max_context)
    cats = {c: v + n4 * INDEXER_PER_POSITION[C].get(c, 0.0) * w for c, v in REST.items()}
    cats[profile.TOPK] = n4 * INDEXER_PER_POSITION[C][profile.TOPK] * w
    cats[profile.DECODE] = dec
    return {c: 1e3 * v for c, v in cats.items()}                 # us, as a profile holds them


def synthetic_run(device=DEVICE):
    stages, iso = {}, []
    for name, impl in IMPL.items():
        mc = 8192 if name.endswith("cap") else None
        profiles, steps = {}, []
        for C in (1, 32):
            cats = _kernel_cats(impl, C, CFG.layers_c4, mc or CFG.max_context)
            total = sum(cats.values())
            profiles[str(C)] = dict(by_category=cats, total_us=total)
            steps.append(dict(C=C, step_ms=total / 1e3 + 2.0, tok_s=C / ((total / 1e3 + 2.0) / 1e3)))
        stages[name] = dict(stage=dict(name=name, decode_impl=impl, max_context=mc), profiles=profiles, steps=steps)
    for impl in ("sglang", "mma_story"):
        for B in (1, 32):
            for kind, (K, valid) in _rows(CFG.max_context).items():
                progs = B * 64 if impl == "sglang" else B * 2
                call = f"{kind} (K={K}, {valid} valid)" if kind == "ratio 128" else f"{kind} (K={K})"
                iso.append(dict(impl=impl, B=B, call=call, graph_us=_call_us(impl, B, K, valid), programs=progs,
                                tile=32, tiles=-(-K // 32)))
    gs_rows = []
    for n in (0, 7, 14, 21):
        cats = _kernel_cats("sglang", 32, n, CFG.max_context)
        gs_rows.append(dict(ratio4_layers=n, kernel_ms=sum(cats.values()) / 1e3))
    return dict(config=CFG.as_dict(), profile_batch=32, stages=stages, isolated_decode=iso,
                environment=dict(device=dict(name=device, sm_count=132)),
                ceilings=dict(copy_tb_s=3.0, bf16_tflops=700.0, fp32_tflops=50.0),
                glue_scaling=dict(stage="S0", C=32, rows=gs_rows))


def test_speed_ratio_follows_the_sms_a_call_can_fill():
    here, story = KNOWN_DEVICES[DEVICE], KNOWN_DEVICES[bridge.STORY_GPU]
    per_sm = (125 / 188) / (67 / 132)
    assert bridge.speed_ratio(2, here, story) == pytest.approx(per_sm)           # both chips mostly idle
    assert bridge.speed_ratio(64, here, story) == pytest.approx(per_sm)
    assert bridge.speed_ratio(100_000, here, story) == pytest.approx(125 / 67)    # both chips full


def test_the_factors_multiply_back_and_name_their_sources():
    res = synthetic_run()
    f = bridge.factors(res)
    for part in ("step", "c1"):
        p = f[part]
        assert p["product"] == pytest.approx(p["measured"], rel=1e-9)
        names = [r["factor"] for r in p["factors"]]
        assert names[-1] == "residue" and len(names) == len(set(names))
        for r in p["factors"][:-1]:
            assert any(w in r["source"] for w in ("published", "measured in this run", "datasheets", "this run's"))
    step = f["step"]
    dec = {s: res["stages"][s]["profiles"]["32"]["by_category"][profile.DECODE] for s in ("S0", "S1")}
    assert step["measured"] == pytest.approx(dec["S0"] / dec["S1"])
    by = {r["factor"]: r for r in step["factors"]}
    assert by["in-step factor"]["value"] == pytest.approx(1.0)                   # IN_STEP cancels in the ratio
    assert by["layer-mix factor"]["low"] <= 1.0 <= by["layer-mix factor"]["high"]
    # at B = 32 SGLang fills the chip, the story's kernel does not: the GPU factor is the chip's over the SM's
    assert by["GPU factor"]["value"] == pytest.approx((125 / 67) / ((125 / 188) / (67 / 132)), rel=1e-6)
    kinds = {r["kind"]: r for r in f["kinds"]}
    assert set(kinds) == set(bridge.KINDS)
    assert kinds["ratio 128"]["before_bound"]["math_unit"] == "CUDA-core FP32"
    # C = 1: both kernels leave SMs idle; only the rest of the step moves with bandwidth
    assert f["c1"]["predicted_a_fall"] is False and f["c1"]["published_a_fall"] is True


def test_a_device_without_datasheet_figures_is_named_as_assumed():
    f = bridge.factors(synthetic_run(device="CPU (x86_64), Triton interpreter"))
    assert f["device"] == bridge.ASSUMED_HERE and "no datasheet entry" in f["assumed"]


def test_the_sensitivity_gives_back_the_points_it_was_not_fitted_to():
    res = synthetic_run()
    s = bridge.sensitivity(res)
    assert s["validation"] and all(abs(r["error_pct"]) < 1e-6 for r in s["validation"])
    at = s["replay_setting"]
    kern = {n: sum(res["stages"][n]["profiles"]["32"]["by_category"].values()) for n in ("S0", "S1")}
    s1 = res["stages"]["S1"]["profiles"]["32"]["by_category"]
    assert at["decode_share_after_pct"] == pytest.approx(100 * s1[profile.DECODE] / kern["S1"])
    step = {n: res["stages"][n]["steps"][0]["step_ms"] for n in ("S0", "S1")}
    assert at["c1_change_pct"] == pytest.approx(100 * (step["S0"] / step["S1"] - 1))
    params = {r["parameter"] for r in s["rows"]}
    assert params == {"ratio-4 layers", "live tokens a request", "max context"}
    r4 = [r for r in s["rows"] if r["parameter"] == "ratio-4 layers"]
    # more ratio-4 layers: more of the fallback's glue, so the decode's share after S1 falls
    assert all(a["decode_share_after_pct"] > b["decode_share_after_pct"] for a, b in zip(r4, r4[1:]))
    fit = s["story_fit"]
    assert fit["largest_miss_pts"] >= 0 and fit["reproduces_all_shares"] == (fit["largest_miss_pts"] <= 2.5)


def test_missing_measurements_are_said_not_guessed():
    res = synthetic_run()
    del res["stages"]["S0cap"]
    assert "S0cap" in bridge.sensitivity(res)["note"]
    res = synthetic_run()
    res["isolated_decode"] = [r for r in res["isolated_decode"] if r["B"] != 1]
    assert "B = 1" in bridge.factors(res)["note"]
    with pytest.raises(ValueError, match="live"):
        bridge.predict(bridge.cost_model(synthetic_run()), synthetic_run(), live=2 ** 21, max_context=8192)


def test_plausible_mixes_are_real_layer_counts():
    for layers in (3, 43):
        mixes = bridge.plausible_mixes(layers)
        assert mixes and all(min(m.values()) >= 0 and sum(m.values()) == layers for m in mixes)
        assert len({tuple(m.values()) for m in mixes}) == len(mixes)
    assert math.isclose(bridge.story_attention_speedup(), 5350 / 850)
