"""Carry out a plan: occupancy queries, and launches through the driver's cuLaunchKernelEx.

No decisions are made here; ``_plan`` makes them. A ``Launch`` holds a kernel handle, its grid
and one ``Params`` argument whose pointers are filled in at each call.
"""

from __future__ import annotations

import ctypes
import threading

from . import _jit

STATIC_SHARED_LIMIT = 48 * 1024  # bytes of shared memory a block may take without opting in
_resident: dict[tuple[int, str, int, int], tuple[int, int]] = {}


def resident_blocks(
    handle: int, name: str, threads: int, device: int, shared: int = 0
) -> tuple[int, int]:
    """(blocks per SM, SMs): how many blocks of ``threads`` threads of the kernel ``handle`` fit,
    with ``shared`` bytes of dynamic shared memory each.

    NOTES: the driver's occupancy calculator knows that a block's warps are spread over the
    SM's four sub-partitions (a 7-warp block fits 5 times, not the 6 a register count suggests).
    """
    key = (device, name, threads, shared)
    fit = _resident.get(key)
    if fit is None:
        import cupy
        from cupy_backends.cuda.api import driver

        sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(handle, threads, shared)
        fit = _resident[key] = (max(1, per_sm), sms)
    return fit


def allow_shared(handle: int, shared: int) -> None:
    """Let the kernel ``handle`` take ``shared`` bytes of dynamic shared memory (more than
    STATIC_SHARED_LIMIT needs the function attribute)."""
    from cupy_backends.cuda.api import driver

    max_dynamic_shared = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (cuda.h)
    driver.funcSetAttribute(handle, max_dynamic_shared, shared)


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig of cuLaunchKernelEx."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attributes", ctypes.POINTER(_LaunchAttribute)),
        ("attribute_count", ctypes.c_uint),
    ]


_PROGRAMMATIC_STREAM_SERIALIZATION = (
    6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
)


def pdl_supported(device: int, enabled: bool = True) -> bool:
    """PDL for this device: ``enabled`` (the tuning table's pdl, FP8_GROUP_QUANT_PDL by
    default), SM90 or newer, and the driver's cuLaunchKernelEx reachable."""
    if not enabled or _jit.driver_entry_point("cuLaunchKernelEx", 4) is None:
        return False
    return _jit.compute_capability(device)[0] >= 9


class KernelLaunch:
    """A kernel, its grid and its arguments (ctypes values), launched on a given stream.

    NOTES: the launch calls the driver's cuLaunchKernelEx through ctypes with a prepared
    CUlaunchConfig; with ``pdl`` it carries the programmatic stream serialization attribute, so
    the kernel may start while the previous kernel on the stream finishes (its
    griddepcontrol.wait orders the memory). The attribute is recorded in CUDA-graph captures.
    Without cuLaunchKernelEx (no ctypes driver), CuPy's cuLaunchKernel, without PDL. ``shared``:
    bytes of dynamic shared memory a block.
    """

    def __init__(self, handle: int, grid, block, args, pdl: bool = False, shared: int = 0):
        self.handle = handle
        self.grid = tuple(grid)
        self.block = tuple(block)
        self.args = list(args)  # kept alive: the driver reads them at each launch
        self.pdl = pdl
        self._pointers = (ctypes.c_void_p * len(self.args))(
            *[ctypes.addressof(a) for a in self.args]
        )
        self._pointers_address = ctypes.addressof(self._pointers)
        self._attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attribute.value[0] = 1
        self._config = _LaunchConfig(
            (ctypes.c_uint * 3)(*self.grid),
            (ctypes.c_uint * 3)(*self.block),
            shared,
            None,
            ctypes.pointer(self._attribute),
            1 if pdl else 0,
        )
        self._config_address = ctypes.addressof(self._config)
        self._launch_ex = _jit.driver_entry_point("cuLaunchKernelEx", 4)
        if self._launch_ex is None:
            from cupy_backends.cuda.api import driver

            self.pdl = False
            self._launch_kernel = driver.launchKernel
            self._launch_args = (handle, *self.grid, *self.block, shared)
        self._lock = threading.Lock()

    def __call__(self, stream: int) -> None:
        with self._lock:  # the configuration and arguments are shared: fill and launch at once
            self._launch_locked(stream)

    def _launch_locked(self, stream: int) -> None:
        if self._launch_ex is None:
            self._launch_kernel(*self._launch_args, stream, self._pointers_address, 0)
            return
        self._config.stream = stream
        status = self._launch_ex(self._config_address, self.handle, self._pointers_address, None)
        if status:
            raise RuntimeError(f"cuLaunchKernelEx failed: {_jit.driver_error(status)}")


class Launch(KernelLaunch):
    """The quantizer's launch for a fixed geometry: one Params argument, whose three pointers
    are the only thing that changes between calls."""

    def __init__(
        self, handle: int, grid, block, params: ctypes.Structure, pdl: bool = False, shared: int = 0
    ):
        super().__init__(handle, grid, block, [params], pdl, shared)
        self.params = params

    def launch(self, x_ptr: int, q_ptr: int, scale_ptr: int, stream: int, extra=()) -> None:
        """Launch on ``stream`` with these pointers; ``extra``: (Params field, value) pairs of
        the call's other arrays (masked_m, the norm's weight and residual, NVFP4's scratch)."""
        params = self.params
        with self._lock:  # the Params are shared: fill and launch atomically
            params.x, params.q, params.scales = x_ptr, q_ptr, scale_ptr
            for field, value in extra:
                setattr(params, field, value)
            self._launch_locked(stream)
