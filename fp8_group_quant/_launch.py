"""Carry out a plan: occupancy queries, and launches through cuLaunchKernelEx of NVIDIA's
driver bindings (``cuda.bindings``), or CuPy's launch where they are missing.

No decisions are made here; ``_plan`` makes them. A ``Launch`` holds a kernel handle, its grid
and one ``Params`` argument whose pointers are filled in at each call.
"""

from __future__ import annotations

import ctypes
import threading
import warnings

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


def pdl_supported(device: int, enabled: bool = True) -> bool:
    """PDL for this device: ``enabled`` (the tuning table's pdl, FP8_GROUP_QUANT_PDL by
    default), SM90 or newer, and NVIDIA's driver bindings there to launch with the attribute."""
    if not enabled or _jit.driver() is None:
        return False
    return _jit.compute_capability(device)[0] >= 9


_warned = threading.Event()  # the missing bindings are reported once a process


def _warn_without_bindings() -> None:
    if not _warned.is_set():
        _warned.set()
        warnings.warn(
            "fp8_group_quant: NVIDIA's cuda-bindings (cuda.bindings.driver) are not importable: "
            "kernels launch through CuPy, without Programmatic Dependent Launch; pip install "
            "'fp8_group_quant[cuda12]' (or [cuda13]) to get them",
            RuntimeWarning,
            stacklevel=4,
        )


def launch_config(bindings, grid, block, shared: int, pdl: bool):
    """A ``CUlaunchConfig`` of the bindings for a grid, a block, ``shared`` bytes of dynamic
    shared memory and, with ``pdl``, the programmatic stream serialization attribute."""
    config = bindings.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared
    if pdl:
        attribute = bindings.CUlaunchAttribute()
        attribute.id = (
            bindings.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        )
        attribute.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attribute]  # copied into the config's own array
        config.numAttrs = 1
    return config


class KernelLaunch:
    """A kernel, its grid and its arguments (ctypes values), launched on a given stream.

    NOTES: the launch is cuLaunchKernelEx of NVIDIA's bindings with a ``CUlaunchConfig`` built
    once; a call changes only its stream (written when it differs from the last call's). The
    arguments go as the address of one ``void*`` array that points at them, which the bindings
    pass through as is (no packing per call). With ``pdl`` the config carries the programmatic
    stream serialization attribute, so the kernel may start while the previous kernel on the
    stream finishes (its griddepcontrol.wait orders the memory); the attribute is recorded in
    CUDA-graph captures. Without the bindings: CuPy's cuLaunchKernel, without PDL, said once.
    ``shared``: bytes of dynamic shared memory a block.
    """

    def __init__(self, handle: int, grid, block, args, pdl: bool = False, shared: int = 0):
        self.handle = handle
        self.grid = tuple(grid)
        self.block = tuple(block)
        self.args = list(args)  # kept alive: the driver reads them at each launch
        self._pointers = (ctypes.c_void_p * len(self.args))(
            *[ctypes.addressof(a) for a in self.args]
        )
        self._pointers_address = ctypes.addressof(self._pointers)
        self._lock = threading.Lock()
        bindings = _jit.driver()
        self.pdl = pdl and bindings is not None
        self._stream: int | None = None  # the stream the config holds
        if bindings is None:
            from cupy_backends.cuda.api import driver

            _warn_without_bindings()
            self._launch_ex = None
            self._launch_kernel = driver.launchKernel
            self._launch_args = (handle, *self.grid, *self.block, shared)
            return
        self._config = launch_config(bindings, self.grid, self.block, shared, self.pdl)
        self._function = bindings.CUfunction(handle)
        self._launch_ex = bindings.cuLaunchKernelEx

    def __call__(self, stream: int) -> None:
        with self._lock:  # the configuration and arguments are shared: fill and launch at once
            self._launch_locked(stream)

    def _launch_locked(self, stream: int) -> None:
        if self._launch_ex is None:
            self._launch_kernel(*self._launch_args, stream, self._pointers_address, 0)
            return
        if stream != self._stream:
            self._config.hStream = stream
            self._stream = stream
        (status,) = self._launch_ex(self._config, self._function, self._pointers_address, 0)
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
