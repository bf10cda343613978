"""The decode step's floor (dsv4lab.roofline.step_floor), on the recorded replays and by hand on a small record."""
import json
import math
from pathlib import Path

import pytest

from dsv4lab import roofline as floor
from dsv4lab.config import INDEX_TOKEN_BYTES, TOKEN_BYTES

RUNS = sorted(Path(__file__).resolve().parents[1].glob("data/runs/*/reproduce/reproduce.json"))
MEASURED = [p for p in RUNS if "ceilings" in json.loads(p.read_text())]


def _record():
    cfg = dict(layers_window=1, layers_c4=2, layers_c128=1, active_experts=2, experts=16, local_experts=4,
               live_context=1024, window=128, index_topk=512, local_vocab=10, hidden=8, moe_weight_bits=4.0)
    wb = {k: dict(dense=1000 * (i + 1), per_expert=100) for i, k in enumerate(("c0", "c4", "c128"))}
    return dict(config=cfg, weight_bytes=wb, concurrency=[1, 3],
                ceilings=dict(copy_tb_s=1e-6, bf16_tflops=1e-6))     # 1 kB/ms and 1 kFLOP/ms: easy to read


def test_bytes_by_hand():
    r = _record()
    b = floor.step_bytes(r, 3)
    assert b["dense_weights"] == 1000 + 2 * 2000 + 3000 + 10 * 8 * 2
    assert b["routed_experts"] == pytest.approx(4 * 100 * 4 * (1 - (14 / 16) ** 3))
    assert b["kv_cache"] == 3 * TOKEN_BYTES * (128 + 2 * (128 + 256) + (128 + 8))
    assert b["index_keys"] == 3 * INDEX_TOKEN_BYTES * 2 * 256
    assert b["total"] == sum(v for k, v in b.items() if k != "total")
    row = floor.step_floor(r)["rows"][1]
    assert row["byte_ms"] == pytest.approx(b["total"] / 1e3) and row["floor_ms"] == max(row["byte_ms"], row["flop_ms"])


def test_experts_touched_grow_to_every_local_expert():
    cfg = _record()["config"]
    seen = [floor.experts_touched(cfg, C) for C in (1, 2, 8, 64, 4096)]
    assert seen[0] == pytest.approx(4 * 2 / 16) and all(a < b for a, b in zip(seen, seen[1:]))
    assert seen[-1] == pytest.approx(4)


@pytest.mark.parametrize("path", MEASURED, ids=lambda p: p.parents[1].name)
def test_every_recorded_replay_sits_above_its_floor(path):
    rec = json.loads(path.read_text())
    rows = floor.above_floor(rec)
    assert rows and all(math.isfinite(r["x_above_floor"]) and r["x_above_floor"] > 1 for r in rows)
    floors = [r["floor_ms"] for r in floor.step_floor(rec)["rows"]]
    assert floors == sorted(floors)                      # more requests read more


def test_a_record_without_measured_ceilings_is_refused_by_name():
    r = _record()
    r["ceilings"] = dict(copy_tb_s=None, bf16_tflops=None)             # the interpreter's: bytes, no ms
    row = floor.step_floor(r)["rows"][0]
    assert row["total_bytes"] > 0 and row["floor_ms"] is None and floor.above_floor(r) == []
    del r["ceilings"]
    with pytest.raises(ValueError, match="ceilings"):
        floor.step_floor(r)
    assert MEASURED, "no recorded replay has measured ceilings"


def test_a_config_without_compressed_layers_has_a_floor():
    """--layers 1 0 0: no ratio-4 or ratio-128 layer, so no weight bytes recorded for those kinds."""
    r = _record()
    r["config"].update(layers_c4=0, layers_c128=0)
    for kind in ("c4", "c128"):
        del r["weight_bytes"][kind]
    b = floor.step_bytes(r, 1)
    assert b["index_keys"] == 0 and b["dense_weights"] == 1000 + 10 * 8 * 2
