"""The library's GPU path up to the launch, on the CPU: what tests of the plan cache and of the
host profile's plumbing need where there is no device.

CuPy builds arrays over invented addresses without a device; ``fake_gpu`` stands in for the
device runtime's current device, CuPy's allocator, the caller's stream and the planner
(``_plan.prepare`` and the tile kernels' ``prepare_weight`` and ``prepare_columns``, whose
launches record each call), and gives the test a fresh plan cache. Nothing touches the
invented memory. A pytest plugin of the test suite (conftest.py), so CuPy is imported only by
the tests that use it.
"""

import itertools
import types

import numpy as np
import pytest

from fp8_group_quant import _device, _plan
from fp8_group_quant._abi import params_type


@pytest.fixture
def fake_gpu(monkeypatch):
    """The library's GPU path up to the launch, on the CPU: plans and launches recorded."""
    cupy = pytest.importorskip("cupy", reason="the stand-in builds CuPy arrays")
    state = types.SimpleNamespace(plans=[], launches=[], device=0, stream=0)
    addresses = itertools.count(1 << 40, 1 << 24)

    def alloc(nbytes):  # allocations at fresh addresses of the current device, never touched
        memory = cupy.cuda.UnownedMemory(next(addresses), max(nbytes, 1), None, state.device)
        return cupy.cuda.MemoryPointer(memory, 0)

    class Launch:
        def __init__(self, request, tuning):
            self.request, self.tuning = request, tuning
            self.params = params_type()()

        def launch(self, x_ptr, q_ptr, scale_ptr, stream, extra=()):
            state.launches.append((self, x_ptr, stream, dict(extra)))

        def __call__(self, stream):  # a launch of the Params as they are
            state.launches.append((self, self.params.x, stream, {}))

    def prepare(request, device, tuning):
        state.plans.append((request, device, tuning))
        return [Launch(request, tuning)]

    def prepare_tile(request, *args):  # prepare_weight's and prepare_columns' one launch
        state.plans.append((request, *args[-2:]))
        return Launch(request, args[-1])

    monkeypatch.setattr(cupy.cuda, "alloc", alloc)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: state.device)
    monkeypatch.setattr(cupy.cuda.runtime, "setDevice", lambda d: setattr(state, "device", d))
    monkeypatch.setattr(_device, "stream_getter", lambda kind: lambda device: state.stream)
    monkeypatch.setattr(_device, "_thread_state", type(_device._thread_state)())
    monkeypatch.setattr(_device, "PLANS", _device.PlanCache(64))
    monkeypatch.setattr(_plan, "prepare", prepare)
    monkeypatch.setattr(_plan, "prepare_weight", prepare_tile)
    monkeypatch.setattr(_plan, "prepare_columns", prepare_tile)
    return state


_bases = itertools.count(1 << 32, 1 << 24)


def fake(shape=(4, 256), dtype="float16", *, row=None, offset=0, device=0):
    """A CuPy array over invented memory: rows ``row`` elements apart (default: contiguous),
    ``offset`` bytes past a 256-byte aligned base, on ``device``."""
    import cupy

    row = shape[-1] if row is None else row
    itemsize = np.dtype(dtype).itemsize
    strides = tuple(row * itemsize * int(np.prod(shape[i + 1 : -1])) for i in range(len(shape) - 1))
    memory = cupy.cuda.UnownedMemory(next(_bases), 1 << 22, None, device)
    pointer = cupy.cuda.MemoryPointer(memory, offset)
    return cupy.ndarray(shape, dtype, pointer, strides + (itemsize,))
