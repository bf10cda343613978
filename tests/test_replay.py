"""The replay's pieces (dsv4lab.replay): the stages, the throughput fit, the story beside the run, and
``python -m dsv4lab reproduce --quick`` end to end on two stages (Triton interpreter, ~30 s)."""
import json
import tarfile

import pytest

from dsv4lab import replay as R
from dsv4lab import registry, stages
from dsv4lab.__main__ import main as cli
from dsv4lab.model import CPU_MODEL, DSV4_FLASH_TP8
from dsv4lab.story_vs_lab import story_vs_lab_rows


def test_stages_are_cumulative_and_distinct():
    s = stages.STAGE_BY_NAME
    assert (s["S0"].decode_impl, s["S0"].indexer_impl, s["S0"].mhc_gemm) == ("sglang", "torch_fp32", "float32")
    assert s["S1"].decode_impl == "mma_story" and s["S1best"].decode_impl == "mma"
    assert s["S1stop"].decode_impl == "mma_story_stop" and s["S1cap"].decode_impl == "mma_story"
    # every variant is one change away from the stage it names
    for name, x in s.items():
        if name not in ("S0", "S1", "S2", "S3", "S4", "S5"):
            base = s[name[:2]]
            diff = [f for f in ("decode_impl", "indexer_impl", "mhc_gemm", "max_context", "glue")
                    if getattr(x, f) != getattr(base, f)]
            assert len(diff) == 1, (name, diff)
    assert s["S2"].decode_impl == "splitk_auto" and s["S2"].indexer_impl == "torch_fp32"
    assert (s["S3"].indexer_impl, s["S3"].mhc_gemm) == ("torch_bf16", "bfloat16") and s["S3"].decode_impl == "splitk_auto"
    assert s["S4"].indexer_impl == "triton" and s["S4"].mhc_gemm == "bfloat16"
    # S5 is S4 with the glue fused, nothing else
    assert s["S5"].glue == "fused" and {**s["S5"].as_dict(), "name": "S4", "title": s["S4"].title,
                                        "glue": "torch"} == s["S4"].as_dict()
    assert s["S0cap"].max_context == s["S1cap"].max_context == s["S3cap"].max_context == 8192
    assert all(x.max_context is None for n, x in s.items() if not n.endswith("cap"))
    keys = [(x.decode_impl, x.indexer_impl, x.mhc_gemm, x.max_context, x.glue) for x in stages.STAGES]
    assert len(set(keys)) == len(keys)
    with pytest.raises(ValueError, match="stage must be one of"):
        stages.stage("S9")


def test_a_kernel_added_for_a_stage_leaves_the_stage_table_alone(monkeypatch):
    """The table takes the first impl registered for a stage: one a new module registers for it later
    (kernels/decode/__init__.py imports new kernels last) does not take the stage's place."""
    monkeypatch.setitem(registry._IMPLS, "sparse_decode", dict(registry._IMPLS["sparse_decode"]))
    registry.register("sparse_decode", "tmp_for_s1best", stage="S1best")(lambda *a, **kw: None)
    assert stages._registered_for("sparse_decode", "S1best") == stages.stage("S1best").decode_impl == "mma"


def test_stage_for_keeps_the_cap_a_cap():
    assert R.stage_for(stages.stage("S0cap"), DSV4_FLASH_TP8).max_context == 8192
    assert R.stage_for(stages.stage("S0cap"), CPU_MODEL).max_context == CPU_MODEL.live_context
    assert R.stage_for(stages.stage("S0"), CPU_MODEL) is stages.stage("S0")


def test_fit_recovers_a_line_and_the_asymptote():
    C = [1, 16, 32, 64]
    f = R.fit_step_time(C, [50 + 13 * c for c in C])
    assert f["a_ms"] == pytest.approx(50) and f["b_ms"] == pytest.approx(13) and f["r2"] == pytest.approx(1)
    assert f["asymptote_tok_s"] == pytest.approx(1000 / 13)
    noisy = R.fit_step_time(C, [50 + 30 * c + e for c, e in zip(C, [3, -4, 5, -2])])
    assert noisy["b_ms"] == pytest.approx(30, rel=0.02) and 0.99 < noisy["r2"] < 1
    assert R.tokens_per_s(32, 1000.0) == 32
    with pytest.raises(ValueError, match="distinct"):
        R.fit_step_time([8, 8], [1.0, 2.0])


def test_estimates_rank_the_stages_like_the_story():
    cfg = DSV4_FLASH_TP8
    est = {n: R.estimate_step_ms(cfg, R.stage_for(stages.stage(n), cfg), 32) for n in stages.STAGE_BY_NAME}
    assert est["S0"] > est["S1"] >= est["S3"] > est["S4"] and est["S0"] > est["S0cap"]
    assert est["S1"] > est["S1stop"] and est["S1"] > est["S1cap"]


def test_story_vs_lab_rows_of_a_run_of_its_own():
    """The one story-vs-lab builder on a replay's own results (kernel_run None: no recorded kernel runs)
    that lack S2 and the glue scaling: the figures it has, "n/a" where a figure needs what it lacks."""
    prof = {"total_us": 1000.0, "by_category": {"sparse-MLA decode": 600.0}}
    p1 = dict(prof, total_us=500.0, by_category={"sparse-MLA decode": 100.0},
              glue_ops={"ops": [{"op": "aten::copy_", "share": 0.4}]})
    res = {"profile_batch": 32, "concurrency": [1, 32], "config": CPU_MODEL.as_dict(),
           "environment": {"device": {"name": "cpu", "sm_count": None}},
           "stages": {"S0": {"profiles": {"32": prof}, "steps": [{"C": 1, "tok_s": 10.0}],
                             "fit": {"b_ms": 30, "asymptote_tok_s": 33}},
                      "S1": {"profiles": {"32": p1}, "steps": [{"C": 1, "tok_s": 8.0}],
                             "fit": {"b_ms": 13, "asymptote_tok_s": 77}}}}
    by = {r["figure"]: r for r in story_vs_lab_rows(res, kernel_run=None)}
    assert by["sparse-MLA decode kernel time, in the model"]["lab"] == "0.6 -> 0.1 ms per step (6x)"
    assert by["tok/s at concurrency 1"]["lab"].endswith("(-20%)")
    assert by["the glue by aten op (after the MMA kernel)"]["lab"].startswith("copy_ 40.0%")
    assert "S2 n/a" in by["the B = 1 regression's cause"]["lab"]
    assert not any("the kernel alone" in f or "relative error" in f for f in by)     # the kernel runs' figures


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce") / "rep"
    cli(["reproduce", "--quick", "--stages", "S0", "S1", "S4", "S1stop", "S1cap", "S0cap", "--out", str(out)])
    return out


def test_reproduce_quick_writes_what_it_promises(quick_run):
    out = quick_run
    names = {p.name for p in out.iterdir()}
    assert names == {"reproduce.json", "tables.md", "throughput.csv", "profile.csv", "kernels.json",
                     "profile_shift.png", "throughput.png", "reproduce.tar.gz"}           # <= 8 files, one folder
    res = json.loads((out / "reproduce.json").read_text())
    assert set(res["stages"]) == {"S0", "S1", "S4", "S1stop", "S1cap", "S0cap"}
    assert res["environment"]["device"]["mode"] == "interpret"
    for st in res["stages"].values():
        assert [r["C"] for r in st["steps"]] == list(R.CONCURRENCY_CPU) and all(r["finite"] for r in st["steps"])
        assert set(st["profiles"]) == {"1", str(R.PROFILE_BATCH_CPU)} and "fit" in st
        assert st["profiles"][str(R.PROFILE_BATCH_CPU)]["glue_ops"]["ops"]
    t = res["tables"]
    assert [(x["before"], x["after"]) for x in t["transitions"]] == [
        ("S0", "S1"), ("S1", "S1stop"), ("S1", "S1cap"), ("S0", "S0cap"), ("S0", "S4")]
    assert t["story"] and t["decode"] and t["c1"]
    assert {"total kernel time", "the machine"} <= {r["figure"] for r in t["story"]}      # story_vs_lab_rows' figures
    # the bridge and the sensitivity, on the interpreter's meaningless times: every path runs
    f = res["factors"]
    assert f["assumed"] and f["step"]["product"] == pytest.approx(f["step"]["measured"])
    assert {r["parameter"] for r in res["sensitivity"]["rows"]} == {"ratio-4 layers", "live tokens a request",
                                                                     "max context"}
    assert res["sensitivity"]["validation"] and "story_fit" in res["sensitivity"]
    iso = {(r["impl"], r["call"].split(" (")[0]) for r in res["isolated_decode"] if r["B"] == 1}
    assert {("mma_story", "ratio 128"), ("mma_story_stop", "ratio 128"), ("sglang", "window")} <= iso
    gs = res["glue_scaling"]
    assert [r["ratio4_layers"] for r in gs["rows"]] == [0, 2] and "glue_per_ratio4_layer_ms" in gs["fit"]
    md = (out / "tables.md").read_text()
    for head in ("## Throughput", "## S0 -> S4", "## Glue breakdown", "## The story beside this run", "## Assumptions",
                 "## S0's glue vs the number of ratio-4 layers", "## C = 1: programs against SMs",
                 "## From the story's numbers to this run's: the bridge", "## What the replay's chosen parameters do"):
        assert head in md
    with tarfile.open(out / "reproduce.tar.gz") as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers()}
    assert {"transitions.csv", "glue_ops.csv", "decode.csv", "story_vs_here.csv", "tables.md", "c1.csv", "factors.csv",
            "sensitivity.csv"} <= members
    assert (out / "profile_shift.png").stat().st_size > 10_000


def test_gpu_shaped_profiles_feed_the_tables():
    """What a GPU run hands the tables: kernel names from graph replays and their launching regions
    from an eager step (no GPU needed to check the bookkeeping)."""
    from dsv4lab import profile as P
    kp = P.KernelProfile([dict(name="_tiled_sparse_decode_kernel", us=900.0, calls=86),
                          dict(name="nvjet_tst_64x8_64x16_4x1_v_bz_TNT", us=50.0, calls=10),
                          dict(name="Memset (Device)", us=5.0, calls=3)], runs=3, source="graph replay")
    br = P.EagerBreakdown([], {"_tiled_sparse_decode_kernel": {"dsv4::decode[sglang,c4]": 600.0,
                                                               "dsv4::decode[sglang,c0]": 300.0},
                               "nvjet_tst_64x8_64x16_4x1_v_bz_TNT": {"dsv4::attn_proj": 50.0},
                               "Memset (Device)": {"dsv4::decode[sglang,c4]": 5.0}}, {}, 955.0)
    per = R.decode_regions(kp, br)
    assert per == {"dsv4::decode[sglang,c4]": 600.0, "dsv4::decode[sglang,c0]": 300.0}
    rows = {r["layer_kind"]: r for r in R.decode_by_kind(per, [0, 0, 4, 4, 4, 128])}
    assert rows["ratio 4"]["decode_us_per_layer"] == 200.0 and rows["window only"]["layers"] == 2
    cat = R.category_by_region(kp, br)
    assert cat["dsv4::decode[sglang,c4]"] == {P.DECODE: 600.0, P.GLUE: 5.0}
    kp.regions = br.regions
    assert P.region_mismatches(kp.kernels()) == []


def test_write_outputs_takes_a_gpu_run(quick_run, tmp_path):
    """The GPU-only parts (isolated decode rows, the compile lesson's variants, skipped parts) in
    the files, on a quick run's results."""
    res = json.loads((quick_run / "reproduce.json").read_text())
    res["isolated_decode"] = [dict(impl="sglang", B=32, call="ratio 4 (K=512)", graph_us=2931.0),
                              dict(impl="splitk_auto", B=32, call="ratio 4 (K=512)", error="RuntimeError: x")]
    res["isolated_decode"] += [dict(impl="sglang", B=1, call="ratio 128 (K=8256, 64 valid)", graph_us=2438.0,
                                    programs=64, tile=32, tiles=258),
                               dict(impl="mma_story", B=1, call="ratio 128 (K=8256, 64 valid)", graph_us=1679.0,
                                    programs=2, tile=32, tiles=258)]
    res["environment"]["device"]["sm_count"] = 132
    res["compile_lessons"] = {"S1": dict(stage="S1", glue=["rms_norm", "indexer_topk[torch_fp32]"], variants=[
        dict(variant="default", ok=False, error_type="RuntimeError", error="operation not permitted when stream is capturing")])}
    res["skipped"] = [dict(part="S0", reason="budget")]
    files = R.write_outputs(tmp_path, res, quick=True)
    md = files["tables.md"].read_text()
    assert "2931" in md and "operation not permitted" in md and "| S0 | budget |" in md
    assert "### S1 (compiled: rms_norm, indexer_topk[torch_fp32])" in md
    c1 = {(r["stage"], r["what"].split(" (")[0]): r for r in res["tables"]["c1"]}
    s0, s1 = c1[("S0", "ratio 128 call")], c1[("S1", "ratio 128 call")]
    assert (s0["programs"], s1["programs"], s1["sm_share_pct"]) == (64, 2, pytest.approx(100 * 2 / 132))
    assert s1["us_per_tile"] == pytest.approx(1679.0 / 258) and s1["ms_per_step"] == pytest.approx(1.679)
    assert c1[("S0", "the whole step at C = 1")]["tok_s"] == res["stages"]["S0"]["steps"][0]["tok_s"]
