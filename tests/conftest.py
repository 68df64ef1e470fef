"""Markers: gpu tests run wherever a CUDA device is visible and skip only where none is;
multi_gpu tests need two devices."""

import os

import pytest

# JAX (used by the interop tests) must not take 75% of the GPU's memory on import
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _gpu_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    count = _gpu_count()
    no_gpu = pytest.mark.skip(reason="no CUDA device visible")
    one_gpu = pytest.mark.skip(reason="needs two CUDA devices; run on a two-GPU machine")
    for item in items:
        if "gpu" in item.keywords and count == 0:
            item.add_marker(no_gpu)
        elif "multi_gpu" in item.keywords and count < 2:
            item.add_marker(one_gpu)
