import dsv4lab  # noqa: F401  (first: sets the mode before anything imports triton)
import pytest
import torch


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
