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
import ctypes
from collections.abc import Callable, Iterator
from typing import Any

from .. import _jit, _launch, _plan, _run, _tuning, api
from .._arrays import device_signature

# the launch layer ------------------------------------------------------------------------------


@contextlib.contextmanager
def pdl_launches(on: bool) -> Iterator[None]:
    """Inside the block the library prepares its launches with PDL ``on`` (or off); plans made
    under the override are its own, so none prepared the other way is reused."""
    with _tuning.override(pdl=on):
        yield


def pdl_default() -> bool:
    """Whether the library launches with PDL (FP8_GROUP_QUANT_PDL, read at import)."""
    return _tuning.active()[1].pdl


def pdl_supported(device: int) -> bool:
    return _launch.pdl_supported(device, _tuning.active()[1].pdl)


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


# the host-side steps of one call (bench --profile-host) -----------------------------------------


def host_steps(x, sync, group_size: int, options: dict) -> dict[str, tuple[Callable, Any]]:
    """The steps of an eager call on ``x``, each as (callable, sync or None)."""
    prepared = api.prepare(x, group_size, **options)
    plan = prepared._plan
    (launch,) = plan.launches
    ptr, stream = device_signature(x)[-1], plan.stream(plan.device)
    return {
        "plain call": (lambda: api.quantize(x, group_size, **options), sync),
        "prepared call": (lambda: prepared(x), sync),
        "  read the input (device_signature)": (lambda: device_signature(x), None),
        "  device current and bound (ready)": (plan.ready, None),
        "  read the stream": (lambda: plan.stream(plan.device), None),
        "  allocate q and scales (plain only)": (plan.alloc_both, None),
        "  launch (Launch.launch)": (
            lambda: launch.launch(ptr, prepared._q_ptr, prepared._scale_ptr, stream),
            sync,
        ),
        "    of which cuLaunchKernelEx": (lambda: launch._launch_locked(stream), sync),
        # NOTES: the floor under any launch from Python: the same call launching a kernel that
        # does nothing (the roofline kernel with no chunks, one warp), and a call into the
        # driver that launches nothing
        "  floor: empty kernel, cuLaunchKernelEx": (_empty_launch(plan.device or 0, stream), sync),
        "  floor: driver call, no launch": (_driver_call(), None),
    }


def _empty_launch(device: int, stream: int) -> Callable[[], None]:
    """A launch of a kernel that returns at once, through the library's launch path."""
    function = _jit.get_function("roofline.cu", "fgq::roofline_copy", device)
    args = [ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int64(0)]
    with _jit.current_device(device):
        launch = _launch.KernelLaunch(function.kernel.ptr, (1, 1, 1), (32, 1, 1), args)
    return lambda: launch(stream)


def _driver_call() -> Callable[[], Any]:
    """cuCtxGetCurrent through the bindings: the cost of crossing into the driver and back."""
    bindings = _jit.driver()
    return bindings.cuCtxGetCurrent if bindings is not None else (lambda: None)
