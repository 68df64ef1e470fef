"""What the ported upstream test files share: the devices a case runs on. Upstream runs on
CUDA only; each port also runs on torch CPU tensors (the NumPy backend) where the case is
small enough for CI, so the same assertions are checked without a GPU."""

from __future__ import annotations

import pytest

CPU_ELEMENTS = 1 << 22  # input elements a CPU case may have: the NumPy backend's speed in CI

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")]


def skip_large_on_cpu(device: str, elements: int) -> None:
    """Skip a CPU case over CPU_ELEMENTS input elements: it runs on the GPU only."""
    if device == "cpu" and elements > CPU_ELEMENTS:
        pytest.skip(f"{elements} elements: too slow for the NumPy backend in CI; GPU only")
