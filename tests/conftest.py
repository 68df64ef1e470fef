"""Markers: gpu tests run wherever a CUDA device is visible and skip only where none is;
multi_gpu tests need two devices. ``--compile-all`` runs the exhaustive NVRTC compile."""

import os

import pytest

pytest_plugins = ("fake_gpu",)  # the fake_gpu fixture: the GPU path's host side on the CPU

# JAX (used by the interop tests) must not take 75% of the GPU's memory on import
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _gpu_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def pytest_addoption(parser):
    parser.addoption(
        "--compile-all",
        action="store_true",
        help="compile every kernel instantiation for each architecture (minutes; CI's own step)",
    )


def pytest_collection_modifyitems(config, items):
    count = _gpu_count()
    no_gpu = pytest.mark.skip(reason="no CUDA device visible")
    one_gpu = pytest.mark.skip(reason="needs two CUDA devices; run on a two-GPU machine")
    for item in items:
        if "gpu" in item.keywords and count == 0:
            item.add_marker(no_gpu)
        elif "multi_gpu" in item.keywords and count < 2:
            item.add_marker(one_gpu)


# hypothesis profiles (tests/test_properties.py), chosen with HYPOTHESIS_PROFILE: "ci" (default)
# runs the CPU property tests in about 50 s on two cores, the same examples every run; "gpu", for
# the H200, draws fresh examples each run, enough for the kernel to meet every layout, format and
# path many times (about 2 min for the kernel test there, 2 min for the CPU ones). Neither keeps an
# example database (hypothesis still caches constants in .hypothesis/, which ignores itself).
try:
    from hypothesis import settings
except ImportError:  # a test dependency; the files that do not use it run without it
    pass
else:
    settings.register_profile(
        "ci", max_examples=3000, deadline=None, derandomize=True, database=None
    )
    settings.register_profile("gpu", max_examples=8000, deadline=None, database=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
