import dsv4lab  # noqa: F401  (first: sets the mode before anything imports triton)
import pytest
import torch


@pytest.fixture
def dev():
    return dsv4lab.device.torch_device()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
