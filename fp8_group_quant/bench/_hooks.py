"""Every place the benchmark reaches below the public API (``_run``, ``_tuning``, ``_plan``,
``_launch``, ``_jit``), gathered here so that a change of those layers is repointed in one file.

The benchmark needs them to measure what the public API cannot show: the launch with PDL on and
off, a kernel of its own (the roofline, the chain's producer and consumer, a peer's) launched
through the library's launch path, the prepared launch of the default kernel without the call
around it, and the host-side steps of one call. The other modules of ``bench`` import none of
those layers (a test reads their imports).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from .. import _device, _jit, _launch, _plan, _run, _tuning, api
from .._arrays import device_signature
from .._spec import DEFAULT_EPS

# the launch layer ------------------------------------------------------------------------------


@contextlib.contextmanager
def pdl_launches(on: bool) -> Iterator[None]:
    """Inside the block the library prepares its launches with PDL ``on`` (or off); plans made
    under the override are its own, so none prepared the other way is reused."""
    with _tuning.override(pdl=on):
        yield


def pdl_supported(device: int) -> bool:
    """Whether ``device`` can launch with PDL at all (SM90 or newer, NVIDIA's bindings),
    whatever FP8_GROUP_QUANT_PDL says: a benchmark timing both ways sets PDL per measurement
    (``pdl_launches``)."""
    return _launch.pdl_supported(device)


def kernel_launch(handle: int, grid, block, args, pdl: bool = False):
    """A launch of the kernel ``handle`` through the library's launch path (cuLaunchKernelEx,
    the PDL attribute when ``pdl``); call it with a stream."""
    return _launch.KernelLaunch(handle, grid, block, args, pdl)


def function_launch(function, device: int, grid, block, args, pdl: bool = False):
    """``kernel_launch`` of a CuPy function, made with ``device`` current."""
    with _jit.current_device(device):
        return _launch.KernelLaunch(function.kernel.ptr, grid, block, args, pdl=pdl)


def default_launch(x, device: int, pdl: bool):
    """The library's launch of the default kernel (bf16 -> e4m3, UE8M0 packed, G = 128) for
    arrays like ``x``, prepared with PDL ``pdl``; run it with ``run_prepared``."""
    with _tuning.override(pdl=pdl):
        plan = device_plan(x, 128, dtype="e4m3", scale="ue8m0", layout="packed")
    (launch,) = plan.launches
    return launch


def run_prepared(launch, x_ptr: int, q_ptr: int, scale_ptr: int, stream: int) -> None:
    launch.launch(x_ptr, q_ptr, scale_ptr, stream)


def device_plan(x, group_size: int = 128, **options):
    """The library's plan of ``quantize(x, group_size, **options)`` on the GPU (its launches,
    allocators and, for NVFP4 with a computed global scale, its scratch words)."""
    arguments = dict(dtype="e4m3", scale="float32", layout="row", eps=1e-10, pad_rows=False,
                     activation=None, scale_rule="rceil", masked_m=None, expected_m=None,
                     norm=None, residual=None, global_scale=None)  # fmt: skip
    call = api._call(group_size, **{**arguments, **options})
    return _run.device_plan(x, call, None, None)[0]


# the JIT layer ---------------------------------------------------------------------------------


def device_count() -> int:
    """CUDA devices the driver sees (0 without a driver); creates no context."""
    return _jit.device_count()


def cupy_module():
    """CuPy, or the library's error that says why it cannot be used."""
    return _jit.cupy_module()


def get_function(filename: str, name_expression: str, device: int):
    """A kernel of ``kernels/`` (compiled or loaded from the cache) as a CuPy function."""
    return _jit.get_function(filename, name_expression, device)


def handle(function, device: int) -> int:
    """The driver handle of a CuPy function, read with ``device`` current."""
    with _jit.current_device(device):
        return function.kernel.ptr


def preload_every_kernel(device: int) -> None:
    """Every instantiation of the quantizer in one NVRTC call (or one read of the disk cache)."""
    expressions = [key.name_expression for key in _plan.all_kernel_keys()]
    _jit.preload(_plan.SOURCE, expressions, device)


def kernel_source(filename: str) -> str:
    """The text of a file of ``kernels/``, its includes inlined."""
    return _jit.source_text(filename)


def compile_text(text: str, name_expression: str, extra_options: tuple[str, ...] = ()):
    """``name_expression`` compiled from ``text`` by CuPy's RawModule with the library's NVRTC
    options (and ``extra_options``), as a CuPy function."""
    import cupy

    options = (*_jit.nvrtc_options(), *extra_options)
    module = cupy.RawModule(code=text, options=options, name_expressions=(name_expression,))
    return module.get_function(name_expression)


# the host path, step by step (bench --profile-host) ----------------------------------------------

EMPTY_KERNEL = ("roofline.cu", "fgq::roofline_copy")  # with no chunks it returns at once


def empty_launches(device: int, stream: int) -> dict[str, Any]:
    """An empty kernel (one warp of the roofline copy with no chunks) launched on ``stream``
    three ways, each a callable, or the reason (a string) it cannot be timed here: through
    NVIDIA's bindings with pre-packed arguments (the library's launch), through ``cuda.core``
    (``LaunchConfig`` and ``launch``, which pack the arguments at each call), and through
    CuPy's ``RawKernel`` (on CuPy's current stream, which the caller makes ``stream``)."""
    import ctypes

    import numpy as np

    function = _jit.get_function(*EMPTY_KERNEL, device)
    found: dict[str, Any] = {}
    if _jit.driver() is None:
        found["bindings"] = "cuda-bindings not importable: the library launches through CuPy"
    else:
        args = [ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int64(0)]
        with _jit.current_device(device):
            launch = _launch.KernelLaunch(function.kernel.ptr, (1, 1, 1), (32, 1, 1), args)
        found["bindings"] = lambda: launch(stream)
    try:
        found["cuda.core"] = _core_launch(device, stream)
    except Exception as error:  # not installed, or an API this version lacks: say which
        found["cuda.core"] = f"cuda.core unusable here ({type(error).__name__}: {error})"
    zero = (np.uint64(0), np.uint64(0), np.int64(0))
    found["cupy"] = lambda: function((1, 1, 1), (32, 1, 1), zero)
    return found


def _core_launch(device: int, stream: int) -> Callable[[], None]:
    """The empty kernel through cuda.core: its own load of our cached binary, a LaunchConfig
    built once, ``launch`` with the arguments as numpy scalars."""
    import numpy as np
    from cuda.core import Device, LaunchConfig, ObjectCode, Stream, launch

    Device(device).set_current()  # the primary context, as CuPy's
    target = _jit.target_for(_jit.compute_capability(device))
    path, lowered = _jit.compile_cached(EMPTY_KERNEL[0], EMPTY_KERNEL[1:], target)
    load = ObjectCode.from_ptx if target.startswith("compute_") else ObjectCode.from_cubin
    kernel = load(path.read_bytes()).get_kernel(lowered[EMPTY_KERNEL[1]])
    config, on = LaunchConfig(grid=1, block=32), Stream.from_handle(stream)
    zero = (np.uint64(0), np.uint64(0), np.int64(0))
    return lambda: launch(on, config, kernel, *zero)


def driver_call() -> Callable[[], Any] | str:
    """cuCtxGetCurrent through the bindings: crossing into the driver and back, no launch."""
    bindings = _jit.driver()
    return "cuda-bindings not importable" if bindings is None else bindings.cuCtxGetCurrent


# the options quantize_packed passes, as the fast path of quantize keys them
PACKED_RAW = (128, "e4m3", "ue8m0", "packed", DEFAULT_EPS, False, None, "rceil", "row")


def call_steps(x) -> dict[str, Callable[[], Any]]:
    """The steps of ``quantize_packed(x)``'s fast path on ``x``, each alone: describing x, the
    plan lookup, allocating q and the scales, packing the arguments (the device check, the
    stream, the Params pointers), the launch (the driver call of a prepared launch); and the
    prepared call. The plan is made first, by one call."""
    api.quantize_packed(x)
    signature = device_signature(x)
    key = (*signature[:-1], PACKED_RAW)
    plan = _device.cached(key)
    assert plan is not None, "quantize_packed's plan is not under the key built here"
    (launch,) = plan.launches
    params, ptr = launch.params, signature[-1]
    q, q_ptr, scales, scale_ptr = plan.alloc_both()
    prepared = api.prepare(x, 128, dtype="e4m3", scale="ue8m0", layout="packed")
    stream = plan.stream(plan.device)

    def pack():
        plan.ready()
        plan.stream(plan.device)
        params.x, params.q, params.scales = ptr, q_ptr, scale_ptr

    return {
        "describe x": lambda: device_signature(x),
        "plan lookup": lambda: _device.cached((*signature[:-1], PACKED_RAW)),
        "allocate q, scales": plan.alloc_both,
        "pack arguments": pack,
        # NOTES: the default argument holds q and the scales the launch writes, which would
        # otherwise be freed (and their memory handed to another array) when this returns
        "launch": lambda held=(q, scales): launch(stream),
        "prepared call": lambda: prepared(x),
    }
