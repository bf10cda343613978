import dsv4lab  # noqa: F401  (first: sets the mode before anything imports triton)
import os
import shutil
from pathlib import Path

import pytest
import torch

# The browser tests (test_lab_browser.py, test_site_browser.py) share one Chromium and one screenshot folder.
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "browser"
CHROMIUM = "/usr/bin/chromium"
# Offline, quiet, no profile of its own (Playwright gives each launch a fresh --user-data-dir).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: runs on a CUDA GPU (the recorded GPU run: pytest -m gpu); "
                                       "skipped with a reason elsewhere")


def pytest_collection_modifyitems(config, items):
    if dsv4lab.device.mode() == "cuda":
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU (this process runs {dsv4lab.device.mode()} mode); "
                                   f"the recorded GPU run executes it with `pytest -m gpu`")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def dev():
    return dsv4lab.device.torch_device()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def artifacts():
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: install it with `apt-get install -y chromium` "
                    "(Debian/Ubuntu; `make chromium` does this as root)", pytrace=False)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None:
        pytest.fail("Playwright for Python is missing: pip install -e '.[test]' (or pip install playwright)",
                    pytrace=False)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()
