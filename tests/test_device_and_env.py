"""Modes, shapes, the CLI, the SGLang peer's loading, and the two environment files."""
import os
import re
import subprocess
import sys
import tomllib

import pytest
import torch
import yaml

import dsv4lab
from dsv4lab import config, device
from dsv4lab.testing import OUT_TOL, check_decode, make_decode_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mode_is_interpret_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert device.mode() == "interpret" and os.environ["TRITON_INTERPRET"] == "1"
    info = device.info()
    assert info.mode == "interpret" and info.sm_count is None
    c = device.ceilings()
    assert c.copy_tb_s is None and "unavailable" in c.how


def _run(code, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSV4LAB_MODE")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=ROOT)


def test_importing_triton_first_gives_clear_error():
    if torch.cuda.is_available():
        pytest.skip("with a GPU, importing triton first is fine")
    r = _run("import triton, dsv4lab")
    assert r.returncode != 0
    assert "Import dsv4lab before triton" in r.stderr and "TRITON_INTERPRET=1" in r.stderr


def test_triton_first_is_fine_when_interpret_already_set():
    r = _run("import triton, dsv4lab; print(dsv4lab.device.mode())", {"TRITON_INTERPRET": "1"})
    assert r.returncode == 0 and r.stdout.strip() == "interpret"


def test_bad_mode_env():
    r = _run("import dsv4lab", {"DSV4LAB_MODE": "tpu"})
    assert r.returncode != 0 and "DSV4LAB_MODE must be" in r.stderr


def test_cli_info_runs():
    r = subprocess.run([sys.executable, "-m", "dsv4lab", "info"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert '"mode"' in r.stdout and '"triton"' in r.stdout and '"ceilings"' in r.stdout


def test_shapes():
    s = config.DSV4_FLASH
    assert (s.heads, s.head_dim, s.nope_dim, s.rope_dim, s.topk) == (64, 512, 448, 64, 512)
    assert (s.index_heads, s.index_dim, s.page_size, s.window_page_size) == (64, 128, 64, 256)
    assert s.max_context == 1_048_576 and s.kv_bytes_per_token == 584 and s.index_bytes_per_token == 132
    assert s.decode_flops(batch=1) == 4 * 64 * 512 * 512
    with pytest.raises(Exception):
        s.heads = 8                                              # frozen
    cpu = config.shapes("interpret")
    assert cpu.head_dim == 512 and cpu.heads < s.heads and cpu.topk < s.topk
    assert config.shapes("cuda") is s


def test_sglang_layout_cross_check_page_sizes():
    """SGLang's production kernel, reading the lab's packed bytes, agrees with the
    reference on the dequantized cache: the byte layout is SGLang's."""
    for ps in (64, 256):
        inp = make_decode_inputs(2, 4, 40, context=300, page_size=ps, pad_frac=0.2)
        assert check_decode("sglang", inp)[0] <= OUT_TOL


def test_missing_sglang_says_how_to_install(monkeypatch):
    import importlib.util

    from dsv4lab.kernels.decode import sglang_peer
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "sglang" else real(n, *a))
    with pytest.raises(sglang_peer.SGLangMissing, match="pip install --no-deps sglang==0.5.23"):
        sglang_peer.sglang_file()


def _names(reqs):
    return {re.split(r"[<>=!\[ ;]", r.strip(), maxsplit=1)[0].lower() for r in reqs if r.strip()}


def test_environment_yml_matches_pyproject():
    proj = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    want = _names(proj["dependencies"]) | set().union(*(_names(v) for v in proj["optional-dependencies"].values()))
    env = yaml.safe_load(open(os.path.join(ROOT, "environment.yml")))
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    got = _names(p for p in pip if not p.startswith("-e"))
    assert got == want, f"only in environment.yml: {got - want}; only in pyproject: {want - got}"
    assert any(str(d).startswith("python") for d in env["dependencies"])


def test_makefile_and_ci_use_the_same_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert re.search(r"^make test$", ci, re.M)
    mk = open(os.path.join(ROOT, "Makefile")).read()
    assert "sglang==0.5.23" in mk and "torch==2.13.0" in mk and "--nbval" in mk


def test_cli_bench_without_gpu_says_why():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    r = subprocess.run([sys.executable, "-m", "dsv4lab", "bench", "decode", "--impl", "simt", "--batch", "1"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode != 0 and "bench needs a CUDA GPU" in r.stderr and "data/runs/" in r.stderr
