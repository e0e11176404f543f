"""Test set-up: GPU tests are marked ``gpu`` and skipped with a reason when no GPU is visible.

Without a GPU, the Triton kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, set
here before anything imports them), so kernel tests still run on the CPU, on small shapes.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped with a reason without one)")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="GPU test: no CUDA GPU visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    """Where kernel tests run: the GPU, else the CPU through Triton's interpreter."""
    return torch.device("cuda") if HAS_CUDA else torch.device("cpu")
