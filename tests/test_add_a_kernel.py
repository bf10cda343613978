"""Adding a decode kernel is one new file plus one import line: a kernel registered from a temporary
module (the import line) runs through the bench, the recorded checks, the record command's impl list,
the CLI and the measured tables (docs/measured.md) with no other edit to the package."""
import importlib.util
import json
import shutil

import pandas as pd
import pytest

import dsv4lab
from dsv4lab import bench, checks, registry, report, roofline, runs
from dsv4lab.__main__ import _impl

NAME = "tmp_torch_gather"
#: the new file: docs/api.md's example kernel, under a name of its own
KERNEL = '''
import torch
from dsv4lab.cache import dequant_kv
from dsv4lab.registry import register


@register("sparse_decode", "{name}", stage="S1best", tags=("recorded", "tensor_core"),
          description="gather + two matmuls in torch (the add-a-kernel test)")
def tmp_torch_gather(q, cache, indices, *, topk_len, sm_scale, attn_sink):
    B, H, D = q.shape
    valid = indices >= 0
    if topk_len is not None:
        valid &= torch.arange(indices.shape[1], device=q.device)[None, :] < topk_len[:, None]
    kv = dequant_kv(cache, torch.where(valid, indices, 0))
    s = torch.einsum("bhd,bkd->bhk", q.float(), kv) * sm_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    if attn_sink is not None:
        s = torch.cat([s, attn_sink.float()[None, :, None].expand(B, H, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None].nan_to_num(neginf=0.0)).nan_to_num(0.0)[..., : kv.shape[1]]
    return torch.einsum("bhk,bkd->bhd", p, kv).to(torch.bfloat16), lse
'''.format(name=NAME)


@pytest.fixture
def new_kernel(tmp_path, monkeypatch):
    """The one import line: the temporary module imported (it registers itself); the registry as it was after."""
    table = registry._IMPLS["sparse_decode"]
    monkeypatch.setitem(registry._IMPLS, "sparse_decode", dict(table))
    path = tmp_path / "tmp_torch_gather.py"
    path.write_text(KERNEL)
    spec = importlib.util.spec_from_file_location("tmp_torch_gather", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return registry.impl_info("sparse_decode", NAME)


def test_it_is_registered_and_listed(new_kernel):
    assert NAME in dsv4lab.impls() and new_kernel.stage == "S1best"
    assert registry.registered(tag="recorded")[-1] is new_kernel            # the campaign's order: last in
    assert _impl(NAME) == NAME                                               # the CLI's --impl takes it


def test_the_bench_times_it(new_kernel, monkeypatch):
    """bench.decode_table's row for it (the GPU's timers replaced by one eager call: this is the CPU)."""
    timed = []

    def one_call(fn, **kw):
        timed.append(fn())
        return 0.05                                                          # ms

    monkeypatch.setattr(bench, "time_ms", one_call)
    monkeypatch.setattr(bench, "back_to_back_us", lambda fn, **kw: dict(per_call_us=(one_call(fn), 50.0)[1]))
    rows = bench.decode_table([NAME], [2], H=8, K=40, context=100, graph=False)
    (row,) = rows
    assert "error" not in row and timed, row
    # no launch description: one head a gather, as the SIMT grids
    assert row["impl"] == NAME and row["served_bytes"] == roofline.decode_served_bytes(2, 8, 40, 1)
    assert row["eager_us"] == 50.0 and row["tflops"] > 0


def test_the_recorded_checks_take_it(new_kernel):
    assert NAME in checks.recorded()
    rows = checks.against_reference(cases=[(3, 8, 40, 100, 64, 0.2, True, True)], log=lambda *a: None)
    mine = [r for r in rows if r["impl"] == NAME]
    assert mine and all(r["ok"] for r in mine), mine
    assert "vs_simt_err" in mine[0]                                          # tagged tensor_core: held to the story's bound


def test_the_record_command_times_it(new_kernel, monkeypatch):
    from dsv4lab import record
    seen = {}
    monkeypatch.setattr(bench, "decode_table", lambda impls, *a, **kw: seen.setdefault("impls", impls) and [])
    record.run_decode()
    assert NAME in seen["impls"] and seen["impls"][0] == registry.registered(tag="baseline")[0].name


def test_the_readme_tables_show_it(new_kernel, tmp_path):
    """A recorded run holding its rows: docs/measured.md's decode table grows a column for it."""
    data = tmp_path / "data"
    shutil.copytree(runs.data_dir() / "runs" / "h200", data / "runs" / "h200")
    d = json.loads((data / "runs" / "h200" / "decode.json").read_text())
    d["rows"] += [dict(r, impl=NAME) for r in d["rows"] if r["impl"] == "mma"]
    (data / "runs" / "h200" / "decode.json").write_text(json.dumps(d))
    before = report.decode_run_table()
    old = runs.data_dir()
    runs.use_data_dir(data)
    try:
        after = report.decode_run_table()
    finally:
        runs.use_data_dir(old)
    head = after.splitlines()[0].split(" | ")
    assert NAME in head and NAME not in before
    assert len(pd.Series(head)) == len(before.splitlines()[0].split(" | ")) + 1
