"""NVFP4: e2m1 values two to a byte, one e4m3 scale per 16 values in the blocked layout, and a
float32 global scale for the tensor (docs/spec.md, section 4a).

``quantize(x, 16, dtype="e2m1", scale="e4m3", layout="blocked", global_scale=...)`` lands here.
The NumPy backend composes ``reference.nvfp4_groups`` and ``pack_e2m1`` and places the scale
bytes through the blocked layout's address map; GPU arrays run ``quantize_nvfp4`` (and, for a
computed global scale, ``nvfp4_amax`` first) from kernels/quantize.cu, bit for bit the same.
"""

from __future__ import annotations

import math
import numbers

import ml_dtypes
import numpy as np

from . import _jit, _launch, _plan, _tuning, reference
from ._abi import LANE_BYTES, params_type
from ._arrays import (
    NUMPY,
    TORCH,
    ArrayInfo,
    describe,
    foreign_library,
    from_cupy,
    is_torch_cpu,
    numpy_to_torch_cpu,
    stream_getter,
    to_cupy,
    torch_cpu_to_numpy,
)
from ._layout import BLOCKED, SCALE_LAYOUTS, Geometry, row_strides
from ._spec import INPUT_TYPES

GROUP = 16  # values per scale
E2M1 = "e2m1"
E4M3_SCALE = "e4m3"
THREADS = 128  # quantize_nvfp4's block (the one-pass grid's measured best, docs/perf.md)
AMAX_THREADS, AMAX_MAX_BLOCKS = 256, 2048
VECTOR_BYTES = 16


def is_nvfp4(dtype, scale) -> bool:
    """The call asks for NVFP4: e2m1 values or e4m3 scales (each needs the other)."""
    return dtype == E2M1 or scale == E4M3_SCALE


def check_options(group_size, dtype, scale, layout, others: dict) -> None:
    """NVFP4's fixed choices; ``others`` holds quantize's remaining options, which must be at
    their defaults (``{name: (value, default)}``)."""
    if dtype != E2M1:
        raise ValueError(
            f"scale='e4m3' holds NVFP4's block scales; it needs dtype='e2m1', got {dtype!r}"
        )
    if scale != E4M3_SCALE:
        raise ValueError(
            f"dtype='e2m1' (NVFP4) has e4m3 block scales: pass scale='e4m3', got {scale!r}"
        )
    if isinstance(group_size, bool) or group_size != GROUP:
        raise ValueError(f"group_size: NVFP4 scales groups of 16 values, got {group_size!r}")
    if layout != BLOCKED:
        raise ValueError(
            f"layout: NVFP4's e4m3 scales are written in the 'blocked' layout (Blackwell's 128x4 "
            f"tiles), got {layout!r}"
        )
    for name, (value, default) in others.items():
        if (value is not None) if default is None else (value != default):
            raise ValueError(f"{name}: not supported with dtype='e2m1' (NVFP4); got {value!r}")


def _check_x(info: ArrayInfo) -> Geometry:
    if info.dtype not in INPUT_TYPES:
        raise TypeError(f"x: expected one of {', '.join(INPUT_TYPES)} for NVFP4, got {info.dtype}")
    if len(info.shape) == 0:
        raise ValueError("x: expected at least one dimension [..., K], got a 0-d array")
    k = info.shape[-1]
    if k % GROUP:
        raise ValueError(f"x: NVFP4 needs K a multiple of {GROUP}, got K={k}")
    return Geometry(tuple(info.shape), GROUP, SCALE_LAYOUTS[BLOCKED], False)


def _host_global(global_scale) -> np.float32 | None:
    """A global scale given as a number or a one-element host array, checked; None stays."""
    if global_scale is None:
        return None
    if isinstance(global_scale, numbers.Real) and not isinstance(global_scale, bool):
        value = np.float32(global_scale)
    else:
        if not isinstance(global_scale, np.ndarray):
            raise TypeError(
                f"global_scale: expected a float or a one-element float32 array on the host, "
                f"like x, got {type(global_scale).__name__}"
            )
        array = global_scale
        if array.size != 1 or array.dtype != np.float32:
            raise ValueError(
                f"global_scale: expected a float or a one-element float32 array, got "
                f"{array.dtype} of shape {array.shape}"
            )
        value = array.reshape(-1)[0]
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"global_scale: expected a positive finite float32, got {value!r}")
    return value


# the NumPy backend ------------------------------------------------------------------------------


def quantize_host(x: np.ndarray, global_scale) -> tuple:
    """(q uint8 ``[..., K/2]``, scales uint8 blocked storage, global scale or None)."""
    geometry = _check_x(describe(x, "x"))
    g = _host_global(global_scale)
    computed = g is None
    if computed:
        g = reference.nvfp4_global_scale(x)
    values = np.asarray(x).astype(np.float32)
    shape = geometry.shape
    scales = np.zeros(geometry.scale_storage, np.uint8)
    if geometry.empty:
        q = np.zeros((*shape[:-1], shape[-1] // 2), np.uint8)
    else:
        groups = values.reshape(geometry.batches, geometry.rows, geometry.groups, GROUP)
        codes, scale_bytes = reference.nvfp4_groups(groups, g)
        q = reference.pack_e2m1(codes.reshape(shape))
        scales[geometry.scale_byte_offsets()] = scale_bytes
    blocked = scales.reshape(geometry.scale_shape)
    return q, blocked, (np.array([g], np.float32) if computed else None)


# the GPU backend --------------------------------------------------------------------------------


def _device_global(global_scale, info: ArrayInfo):
    """(mode, value, pointer, keep-alive) of a global scale for a GPU call."""
    if global_scale is None:
        return 2, 0.0, 0, None
    if isinstance(global_scale, numbers.Real) and not isinstance(global_scale, bool):
        return 0, float(_host_global(global_scale) or 0.0), 0, None
    g_info = describe(global_scale, "global_scale")
    if g_info.kind != info.kind or g_info.device != info.device:
        raise TypeError(
            f"global_scale: expected a float or a one-element float32 array of x's library and "
            f"device ({info.kind}, device {info.device}), got {g_info.kind} on device "
            f"{g_info.device}"
        )
    if math.prod(g_info.shape) != 1 or g_info.dtype != "float32":
        raise ValueError(
            f"global_scale: expected one float32 element, got {g_info.dtype} of shape "
            f"{g_info.shape}"
        )
    return 1, 0.0, g_info.ptr, global_scale


def _params(strides: tuple[int, int], geometry: Geometry, lanes: int, for_amax: bool, **fields):
    batch_stride, row_stride = strides
    per_row = geometry.groups * (lanes if for_amax else 1)
    magic, shift = _plan.divisor(per_row)
    rows_magic, rows_shift = _plan.divisor(max(1, geometry.rows))
    s_batch, s_row, s_word = geometry.scale_byte_strides
    return params_type()(
        x_batch_stride=batch_stride,
        x_row_stride=row_stride,
        q_batch_stride=geometry.rows * geometry.k // 2,
        rows=geometry.rows,
        grid_rows=geometry.scale_rows,
        batches=geometry.batches,
        groups_per_row=geometry.groups,
        slots=geometry.batches * geometry.rows * per_row,
        tile_slots=per_row,
        tile_slots_magic=magic,
        batch_tiles=geometry.rows,
        batch_tiles_magic=rows_magic,
        tile_slots_shift=shift,
        batch_tiles_shift=rows_shift,
        s_batch_stride=s_batch,
        s_row_stride=s_row,
        s_word_stride=s_word,
        q_rows=geometry.rows,
        scale_rows=geometry.scale_rows,
        **fields,
    )


def _allocate(info: ArrayInfo, shape, count_dtype, zero: bool = False):
    if info.kind == TORCH:
        import torch

        make = torch.zeros if zero else torch.empty
        return make(shape, dtype=getattr(torch, count_dtype), device=info.obj.device)
    import cupy

    make = cupy.zeros if zero else cupy.empty
    return make(shape, count_dtype)


def _pointer(array, info: ArrayInfo) -> int:
    return array.data_ptr() if info.kind == TORCH else array.data.ptr


def quantize_device(x, info: ArrayInfo, global_scale) -> tuple:
    geometry = _check_x(info)
    strides = row_strides(info.shape, info.strides)
    if geometry.empty:  # nothing is read: any strides do (cupy gives empty arrays zeros)
        strides = (0, 0)
    elif info.strides[-1] != 1 and info.shape[-1] > 1:
        raise ValueError(f"x: the last dimension must be contiguous, got strides {info.strides}")
    if strides is None:
        raise ValueError(
            f"x: its leading dimensions must collapse into one row stride, got strides "
            f"{info.strides} for shape {info.shape}"
        )
    if not geometry.empty and (
        info.ptr % VECTOR_BYTES or any(s * info.itemsize % VECTOR_BYTES for s in strides)
    ):
        raise ValueError(
            f"x: NVFP4 on the GPU needs a 16-byte aligned base and row and batch strides; got "
            f"address {info.ptr:#x}, strides {info.strides} ({info.itemsize}-byte elements)"
        )
    groups = geometry.batches * geometry.rows * geometry.groups
    if groups * 2 >= 2**31:
        raise ValueError(f"x: {groups} groups of 16 are more than one launch covers (2**30)")
    mode, value, g_ptr, _keep = _device_global(global_scale, info)
    device = info.device
    assert device is not None  # a GPU array
    with _jit.current_device(device):
        q = _allocate(info, (*geometry.shape[:-1], geometry.k // 2), "uint8")
        scales = _allocate(info, geometry.scale_shape, "uint8")
        scratch = _allocate(info, (2,), "int32", zero=True) if mode == 2 else None
        if geometry.empty:  # nothing to read or write (the scale storage is empty too)
            if scratch is not None:
                scratch[1] = 0x3F800000  # the computed global scale of no values: 1.0
            return q, scales, _global_view(scratch, info)
        stream = stream_getter(info.kind)(device)
        if mode == 2:
            g_ptr = _pointer(scratch, info)
        pointers = (_pointer(q, info), _pointer(scales, info), g_ptr)
        for launch in launches(info, geometry, strides, mode, value, *pointers):
            launch(stream)
    return q, scales, _global_view(scratch, info)


def launches(info, geometry, strides, mode: int, value: float, q_ptr, s_ptr, g_ptr) -> list:
    """The kernel launches of one NVFP4 call, to be called with a stream: with a computed
    global scale (mode 2), nvfp4_amax into the zeroed scratch at g_ptr, then quantize_nvfp4."""
    device = info.device
    lanes = GROUP * info.itemsize // LANE_BYTES
    pdl = _launch.pdl_supported(device, _tuning.active()[1].pdl)
    quantize_name, amax_name = _plan.nvfp4_names(info.dtype)
    result = []
    if mode == 2:
        params = _params(strides, geometry, lanes, True, x=info.ptr, global_ptr=g_ptr)
        blocks = max(1, min(-(-params.slots // AMAX_THREADS), AMAX_MAX_BLOCKS))
        result.append(_kernel_launch(amax_name, device, blocks, AMAX_THREADS, params, pdl))
    params = _params(
        strides, geometry, lanes, False, x=info.ptr, q=q_ptr, scales=s_ptr, global_mode=mode,
        global_scale=value, global_ptr=g_ptr, global_out=g_ptr + 4 if mode == 2 else 0,
    )  # fmt: skip
    blocks = -(-params.slots * lanes // THREADS)
    result.append(_kernel_launch(quantize_name, device, blocks, THREADS, params, pdl))
    return result


def _torch_float32():
    import torch

    return torch.float32


def _global_view(scratch, info: ArrayInfo):
    """The computed global scale: a one-element float32 view of scratch[1], or None."""
    if scratch is None:
        return None
    if info.kind == TORCH:
        return scratch[1:2].view(_torch_float32())
    return scratch[1:2].view("float32")


def _kernel_launch(name: str, device: int, blocks: int, threads: int, params, pdl: bool):
    function = _jit.get_function(_plan.SOURCE, name, device)
    handle = function.kernel.ptr
    return _launch.KernelLaunch(handle, (blocks, 1, 1), (threads, 1, 1), [params], pdl)


# the entry point ----------------------------------------------------------------------------------


def quantize(x, global_scale) -> tuple:
    """NVFP4 of ``x``: ``(q, scales)``, or ``(q, scales, global_scale)`` when it is computed."""
    if is_torch_cpu(x):
        g = global_scale
        if g is not None and is_torch_cpu(g):
            g = torch_cpu_to_numpy(g, "global_scale")
        q, scales, computed = quantize_host(torch_cpu_to_numpy(x, "x"), g)
        tensors = [numpy_to_torch_cpu(q), numpy_to_torch_cpu(scales)]
        if computed is not None:
            tensors.append(numpy_to_torch_cpu(computed))
        return tuple(tensors)
    library = foreign_library(x)
    if library is not None:  # JAX, numba, DLPack: through zero-copy cupy views
        g = global_scale
        if g is not None and not isinstance(g, numbers.Real):
            g = to_cupy(g, "global_scale")
        outputs = quantize(to_cupy(x), g)
        return tuple(from_cupy(array, library, None) for array in outputs)
    info = describe(x, "x")
    if info.kind == NUMPY:
        q, scales, computed = quantize_host(x, global_scale)
    else:
        q, scales, computed = quantize_device(x, info, global_scale)
    return (q, scales) if computed is None else (q, scales, computed)


# dequantize ---------------------------------------------------------------------------------------

E2M1_VALUES = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32
)


def dequantize(q, scales, global_scale):
    """Float32 ``[..., K]`` of NVFP4 codes ``q`` ``[..., K/2]`` and blocked e4m3 ``scales``:
    ``e2m1(code) * RN(S / global_scale)``, the ``d`` that quantize divided by."""
    if is_torch_cpu(q):
        g = (
            torch_cpu_to_numpy(global_scale, "global_scale")
            if is_torch_cpu(global_scale)
            else global_scale
        )
        values = dequantize(torch_cpu_to_numpy(q, "q"), torch_cpu_to_numpy(scales, "scales"), g)
        return numpy_to_torch_cpu(np.ascontiguousarray(values))
    q_info, s_info = describe(q, "q"), describe(scales, "scales")
    if q_info.dtype != "uint8" or s_info.dtype != "uint8":
        raise TypeError(
            f"q, scales: NVFP4 codes and e4m3 scale bytes are uint8, got {q_info.dtype} and "
            f"{s_info.dtype}"
        )
    if not q_info.shape:
        raise ValueError("q: expected [..., K/2] packed codes, got a 0-d array")
    shape = (*q_info.shape[:-1], 2 * q_info.shape[-1])
    if shape[-1] % GROUP:
        raise ValueError(f"q: K = 2 * {q_info.shape[-1]} is not a multiple of {GROUP}")
    geometry = Geometry(shape, GROUP, SCALE_LAYOUTS[BLOCKED], False)
    if tuple(s_info.shape) != geometry.scale_shape:
        raise ValueError(
            f"scales: blocked scales for K = {shape[-1]} have shape {geometry.scale_shape}, got "
            f"{tuple(s_info.shape)}"
        )
    if q_info.kind == TORCH:
        import torch

        g = global_scale
        if isinstance(g, torch.Tensor):
            g = to_cupy(g, "global_scale")
        values = dequantize(to_cupy(q, "q"), to_cupy(scales, "scales"), g)
        return torch.from_dlpack(values)
    if q_info.kind == NUMPY:
        xp = np
        g = np.asarray(global_scale, np.float32).reshape(-1)
    else:
        import cupy as xp

        g = xp.asarray(global_scale, xp.float32).reshape(-1)
    if g.size != 1:
        raise ValueError(f"global_scale: expected one value, got {g.size}")
    offsets = xp.asarray(geometry.scale_byte_offsets().reshape(-1))
    scale_bytes = xp.ascontiguousarray(scales).reshape(-1)[offsets]
    table = xp.asarray(
        np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    )
    d = (table[scale_bytes] / g[0]).astype(xp.float32).reshape(*shape[:-1], geometry.groups, 1)
    codes = xp.ascontiguousarray(q)
    nibbles = xp.stack([codes & 15, codes >> 4], axis=-1).reshape(
        *shape[:-1], geometry.groups, GROUP
    )
    values = xp.asarray(E2M1_VALUES)[nibbles] * d
    return values.reshape(shape).astype(xp.float32)
