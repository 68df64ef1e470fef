"""Entry points: validate, pick the backend (NumPy reference or CUDA kernel), call it."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import threading
import warnings

import numpy as np

from . import _jit, _launch, reference
from ._arrays import (
    CUPY,
    JAX,
    NUMPY,
    TORCH,
    ArrayInfo,
    available_bytes,
    describe,
    device_allocator,
    device_signature,
    foreign_library,
    from_cupy,
    pair_allocator,
    pointer,
    stream_getter,
    to_cupy,
)
from ._layout import PACKED, PACKED_LAYOUTS, Geometry, row_strides
from ._spec import DEFAULT_EPS, INPUT_DTYPES, OUTPUT_FORMATS, check_options, output_format

__all__ = [
    "PreparedQuantize",
    "as_float8",
    "dequantize",
    "prepare",
    "quantize",
    "quantize_packed",
    "unpack_scales",
]

Q_ALIGNMENT = 16  # q is written with 16-byte (8-byte for float32 input) stores


def quantize(
    x,
    group_size: int = 128,
    *,
    dtype="e4m3",
    scale: str = "float32",
    layout: str = "row",
    eps: float = DEFAULT_EPS,
    out=None,
    scale_out=None,
    pad_rows: bool = False,
):
    """Quantize ``x`` per token in groups of ``group_size`` channels.

    For each group ``v`` of ``group_size`` consecutive values of a row:
    ``amax = max(eps, max|v_i| over finite v_i)``, ``s = amax / fmax`` (``scale="float32"``) or
    the next power of two of ``max(amax / fmax, 1e-10)`` (``scale="ue8m0"``), and
    ``q_i = round_to_nearest_even(clamp(v_i / s, -fmax, fmax))``.

    Parameters
    ----------
    x : numpy.ndarray, cupy.ndarray or torch.Tensor (CUDA), shape ``[..., K]``
        bfloat16, float16 or float32; the last dimension contiguous, ``K % group_size == 0``.
        The leading dimensions must collapse into one row stride, which may exceed ``K``.
        Three or more dimensions are batches ``[B, ..., K]`` with per-batch TMA padding.
        Numpy input runs the NumPy reference; GPU input runs the CUDA kernel on the caller's
        current stream (torch's for tensors, CuPy's for cupy arrays).
    group_size : {32, 64, 128, 256}
    dtype : {"e4m3", "e5m2", "int8"}
        Output format: float8_e4m3fn (fmax 448), float8_e5m2 (57344) or int8 (127).
    scale : {"float32", "ue8m0"}
        Float scales, or power-of-two scales (as float32 in float layouts, as exponent bytes in
        the packed layouts).
    layout : {"row", "col", "col_tma", "packed", "packed_row"}
        With ``ng = K / group_size``, ``kp = ceil(ng / 4)``, ``tma = align(M, 4)``:
        ``row`` float32 ``[M, ng]`` strides ``(ng, 1)``; ``col`` float32 ``[M, ng]`` strides
        ``(1, M)``; ``col_tma`` float32 ``[M, ng]`` strides ``(1, tma)`` (DeepGEMM, SM90);
        ``packed`` int32 ``[M, kp]`` strides ``(1, tma)``, group ``g`` in byte ``g % 4`` of word
        ``g // 4`` (DeepGEMM, SM100); ``packed_row`` int32 ``[M, kp]`` strides ``(kp, 1)``.
        Padded layouts own their padded storage and every padding byte is written as zero.
    eps : float
        Floor of the group maximum; a positive, finite, normal float32 value.
    out : array, optional
        Destination for q: shape ``x.shape``, strides as returned (contiguous, or row-padded when
        ``pad_rows``), 16-byte aligned, the format's dtype (uint8 also accepted for float8).
    scale_out : array, optional
        Destination for the scales, with exactly the shape, dtype and strides returned, over an
        allocation that holds the padded storage.
    pad_rows : bool
        Back ``q`` with ``align(M, 4)`` rows per batch, the extra rows written as zeros.

    Returns
    -------
    q : array of ``x``'s library, shape ``x.shape``
        numpy: ``ml_dtypes.float8_e4m3fn`` / ``float8_e5m2`` / ``int8``; torch: ``torch.float8_*``
        / ``torch.int8``; cupy: ``uint8`` holding the float8 bytes (see ``as_float8``) / ``int8``.
    scales : array of ``x``'s library, shape ``x.shape[:-1] + (ng or kp,)``, strides as above.
    """
    if type(group_size) is int and (pad_rows is False or pad_rows is True):
        signature = device_signature(x)
        if signature is not None:
            key = (*signature[:-1], group_size, dtype, scale, layout, eps, pad_rows)
            try:
                plan = _PLANS.get(key)
            except TypeError:  # an unhashable option: validation below names it
                plan = None
            if plan is not None:
                return plan.run(x, signature[-1], out, scale_out)
    return _quantize_checked(x, group_size, dtype, scale, layout, eps, out, scale_out, pad_rows)


def _quantize_checked(x, group_size, dtype, scale, layout, eps, out, scale_out, pad_rows):
    """The first call of a kind: validate everything, then run (and remember the plan)."""
    library = foreign_library(x)
    if library is not None:
        return _quantize_foreign(
            library, x, group_size, dtype, scale, layout, eps, out, scale_out, pad_rows
        )
    options_key = (group_size, dtype, scale, layout, eps, pad_rows)  # as given: quantize's key
    eps = check_options(group_size, scale, layout, eps)
    fmt = output_format(dtype)
    x_info = describe(x, "x")
    geometry, x_batch_stride, x_row_stride = _check_input(x_info, int(group_size), layout, pad_rows)
    if x_info.kind == NUMPY:
        q, q_info = _output(out, "out", x_info, *_q_spec(geometry, fmt))
        scales, s_info = _output(scale_out, "scale_out", x_info, *_scale_spec(geometry))
        if not geometry.empty:
            reference.quantize_into(
                x,
                geometry,
                fmt,
                scale == "ue8m0",
                eps,
                _flat_storage(q_info, geometry.q_storage).view(np.uint8),
                _flat_storage(s_info, geometry.scale_storage),
            )
        return q, scales

    error = _launch.grid_limits_error(geometry, x_info.itemsize)
    if error:
        raise ValueError(error)
    launch = None
    if not geometry.empty:
        vec16 = (
            x_info.ptr % 16 == 0
            and (geometry.rows <= 1 or x_row_stride * x_info.itemsize % 16 == 0)
            and (geometry.batches <= 1 or x_batch_stride * x_info.itemsize % 16 == 0)
        )
        key = _launch.KernelKey(
            x_info.dtype, int(group_size), fmt.name, _launch.scale_kind(scale, layout), vec16
        )
        launch = _launch.prepare(key, geometry, x_info.device, x_batch_stride, x_row_stride, eps)
    plan = _Plan(x_info, geometry, fmt, launch)
    signature = device_signature(x)
    if signature is not None and isinstance(group_size, int):
        try:
            _PLANS[(*signature[:-1], *options_key)] = plan
        except TypeError:
            pass
    return plan.run(x, x_info.ptr, out, scale_out)


def _quantize_foreign(library, x, group_size, dtype, scale, layout, eps, out, scale_out, pad_rows):
    """JAX, numba and other DLPack / CUDA-array-interface inputs, through zero-copy cupy views.

    Runs on CuPy's current stream (DLPack and the array interface synchronise the producer with
    it). Results come back in the caller's library: numba device arrays as views, JAX arrays
    through DLPack with float8 codes reinterpreted as JAX's float8 types.
    """
    if library == JAX and (out is not None or scale_out is not None):
        raise TypeError("out: JAX arrays are immutable; call without out= / scale_out=")
    if out is not None and foreign_library(out) is None:
        raise TypeError(f"out: expected an array of x's library, got {type(out).__name__}")
    if scale_out is not None and foreign_library(scale_out) is None:
        raise TypeError(f"scale_out: expected an array of x's library, got {type(scale_out)}")
    q, scales = quantize(
        to_cupy(x), group_size, dtype=dtype, scale=scale, layout=layout, eps=eps,
        out=None if out is None else to_cupy(out),
        scale_out=None if scale_out is None else to_cupy(scale_out), pad_rows=pad_rows,
    )  # fmt: skip
    fmt = output_format(dtype)
    float8 = f"float8_{'e4m3fn' if fmt.name == 'e4m3' else 'e5m2'}" if fmt.is_float8 else None
    q = out if out is not None else from_cupy(q, library, float8)
    scales = scale_out if scale_out is not None else from_cupy(scales, library, None)
    return q, scales


def _q_spec(geometry: Geometry, fmt) -> tuple:
    """(shape, strides, storage, dtype name) of q."""
    name = "int8" if not fmt.is_float8 else f"float8_{'e4m3fn' if fmt.name == 'e4m3' else 'e5m2'}"
    return geometry.shape, geometry.q_strides, geometry.q_storage, name


def _scale_spec(geometry: Geometry) -> tuple:
    name = "int32" if geometry.layout in PACKED_LAYOUTS else "float32"
    return geometry.scale_shape, geometry.scale_strides, geometry.scale_storage, name


_PLANS: dict[tuple, _Plan] = {}
_thread_state = threading.local()
MAX_PLANS = 4096  # distinct (array layout, options) combinations remembered


class _Plan:
    """Everything a GPU call of one kind needs: output specs, the launch, the caller's library."""

    def __init__(self, x_info: ArrayInfo, geometry: Geometry, fmt, launch):
        import cupy

        if len(_PLANS) >= MAX_PLANS:
            _PLANS.clear()
        # NOTES: no reference to the first input: a cached plan must not pin its memory
        self.x_info = dataclasses.replace(x_info, obj=None, ptr=0)
        self.kind = x_info.kind
        self.device = x_info.device
        self.launch = launch
        self.q_spec = _q_spec(geometry, fmt)
        self.scale_spec = _scale_spec(geometry)
        self.q_alloc = device_allocator(x_info.kind, x_info.device, *self.q_spec)
        self.scale_alloc = device_allocator(x_info.kind, x_info.device, *self.scale_spec)
        self.alloc_both = pair_allocator(x_info.kind, x_info.device, self.q_spec, self.scale_spec)
        self.stream = stream_getter(x_info.kind)
        self._get_device = cupy.cuda.runtime.getDevice

    def run(self, x, x_ptr: int, out, scale_out):
        if self.ready():
            return self._run(x_ptr, out, scale_out)
        with self.on_device():
            return self._run(x_ptr, out, scale_out)

    def _run(self, x_ptr: int, out, scale_out):
        if out is None and scale_out is None:
            q, q_ptr, scales, scale_ptr = self.alloc_both()
        else:
            if out is None:
                q = self.q_alloc()
                q_ptr = pointer(q, self.kind)
            else:
                q, q_ptr = out, _output(out, "out", self.x_info, *self.q_spec)[1].ptr
            if scale_out is None:
                scales = self.scale_alloc()
                scale_ptr = pointer(scales, self.kind)
            else:
                scales = scale_out
                scale_ptr = _output(scale_out, "scale_out", self.x_info, *self.scale_spec)[1].ptr
        if self.launch is not None:
            self.launch.launch(x_ptr, q_ptr, scale_ptr, self.stream(self.device))
        return q, scales

    def ready(self) -> bool:
        """True when the input's device is current and bound to this thread: launch as is."""
        return self._get_device() == self.device and self.device in _thread_state.__dict__.get(
            "bound", ()
        )

    def on_device(self):
        """A context making the input's device (and its primary context) current.

        NOTES: cuLaunchKernel needs a current context; a thread whose first CUDA call is a
        prepared launch has none until a runtime call binds it, so each thread binds once.
        """
        device = self._get_device()
        if device != self.device:
            return _jit.current_device(self.device)
        bound = _thread_state.__dict__.setdefault("bound", set())
        if device not in bound:
            _jit.cupy_module().cuda.runtime.setDevice(device)
            bound.add(device)
        return contextlib.nullcontext()


class PreparedQuantize:
    """``quantize`` fixed to one input layout and one pair of outputs: the leanest eager call.

    Made by ``prepare``. Calling it with an array of the prepared dtype, shape, strides, device
    and 16-byte alignment quantizes into the same ``q`` and ``scales`` every time (like the static
    buffers of a CUDA graph) and returns them; any other array raises ValueError.
    """

    def __init__(self, plan: _Plan, key: tuple, q, scales):
        self._plan = plan
        self._key = key
        self.q = q
        self.scales = scales
        self._q_ptr = pointer(q, plan.kind)
        self._scale_ptr = pointer(scales, plan.kind)
        # bound once: the call below is the eager hot path
        self._launch = plan.launch.launch if plan.launch is not None else None
        self._ready, self._stream, self._device = plan.ready, plan.stream, plan.device

    def __call__(self, x):
        signature = device_signature(x)
        if signature is None or signature[:-1] != self._key:
            raise ValueError(
                f"x: this call was prepared for {self._key[:6]} (library, dtype, shape, strides, "
                f"device, 16-byte aligned), got {signature[:6] if signature else type(x)}"
            )
        launch = self._launch
        if launch is not None:
            if self._ready():
                launch(signature[-1], self._q_ptr, self._scale_ptr, self._stream(self._device))
            else:
                with self._plan.on_device():  # the stream is read on the input's device
                    launch(signature[-1], self._q_ptr, self._scale_ptr, self._stream(self._device))
        return self.q, self.scales


def prepare(
    x,
    group_size: int = 128,
    *,
    dtype="e4m3",
    scale: str = "float32",
    layout: str = "row",
    eps: float = DEFAULT_EPS,
    out=None,
    scale_out=None,
    pad_rows: bool = False,
) -> PreparedQuantize:
    """Validate once and return a callable that quantizes arrays laid out like ``x``.

    Arguments as for ``quantize``; ``x`` must be a cupy array or torch CUDA tensor. The outputs
    (``out``/``scale_out``, or buffers allocated here) are reused by every call. This is the
    lowest-overhead eager path for decode-sized inputs; the first call here also compiles.
    """
    signature = device_signature(x)
    if signature is None:
        raise TypeError(f"x: prepare needs a cupy array or torch CUDA tensor, got {type(x)}")
    check_options(group_size, scale, layout, eps)
    if not isinstance(pad_rows, (bool, np.bool_)):
        raise TypeError(f"pad_rows: expected a bool, got {type(pad_rows).__name__}")
    group_size, pad_rows = int(group_size), bool(pad_rows)  # the plan cache's spelling
    q, scales = quantize(
        x, group_size, dtype=dtype, scale=scale, layout=layout, eps=eps,
        out=out, scale_out=scale_out, pad_rows=pad_rows,
    )  # fmt: skip
    plan = _PLANS.get((*signature[:-1], group_size, dtype, scale, layout, eps, pad_rows))
    if plan is None:
        raise TypeError(f"dtype: {dtype!r} cannot key a prepared call; pass its name")
    return PreparedQuantize(plan, signature[:-1], q, scales)


def quantize_packed(
    x, group_size: int = 128, eps: float = DEFAULT_EPS, out=None, scale_out=None, pad_rows=False
):
    """FP8 e4m3 with UE8M0 scales packed four per int32 word, MN-major and TMA-aligned.

    The layout DeepGEMM's SM100 kernels read: ``scales`` int32 of shape ``[..., M, ceil(ng/4)]``
    and strides ``(..., 1, align(M, 4))``. Same as ``quantize(x, group_size, dtype="e4m3",
    scale="ue8m0", layout="packed", ...)``; see ``quantize`` for the parameters.
    """
    return quantize(
        x,
        group_size,
        dtype="e4m3",
        scale="ue8m0",
        layout=PACKED,
        eps=eps,
        out=out,
        scale_out=scale_out,
        pad_rows=pad_rows,
    )


# validation ------------------------------------------------------------------------------------


def _check_input(info: ArrayInfo, group_size: int, layout: str, pad_rows) -> tuple:
    if info.dtype not in INPUT_DTYPES:
        raise TypeError(f"x: expected bfloat16, float16 or float32, got {info.dtype}")
    if len(info.shape) == 0:
        raise ValueError("x: expected at least one dimension [..., K], got a scalar")
    k = info.shape[-1]
    if k % group_size:
        raise ValueError(
            f"x: the last dimension K={k} is not a multiple of group_size={group_size}"
        )
    if not isinstance(pad_rows, (bool, np.bool_)):
        raise TypeError(f"pad_rows: expected a bool, got {type(pad_rows).__name__}")
    geometry = Geometry(tuple(info.shape), group_size, layout, bool(pad_rows))
    if geometry.empty:
        return geometry, 0, k
    if k > 1 and info.strides[-1] != 1:
        raise ValueError(
            f"x: the last dimension must be contiguous (stride 1), got strides {info.strides}"
        )
    strides = row_strides(info.shape, info.strides)
    if strides is None:
        raise ValueError(
            f"x: the dimensions between the batch and K must collapse into one row stride; "
            f"got shape {info.shape} with strides {info.strides} (make it contiguous first)"
        )
    return (geometry, *strides)


def _same_strides(shape, got, expected) -> bool:
    return all(n <= 1 or g == e for n, g, e in zip(shape, got, expected))


def _output(given, name, x_info, shape, strides, storage, dtype):
    """Allocate a host output, or validate the caller's. Returns (array, info)."""
    if given is None:  # host arrays only: device outputs come from _Plan's allocators
        np_dtype = (
            OUTPUT_FORMATS["e4m3" if "e4m3" in dtype else "e5m2"].numpy_dtype
            if dtype.startswith("float8")
            else np.dtype(dtype)
        )
        array = _host_strided(np.empty(storage, np_dtype), shape, strides)
        return array, describe(array, name)

    info = describe(given, name)
    if info.kind != x_info.kind:
        raise TypeError(f"{name}: expected a {x_info.kind} array like x, got a {info.kind} one")
    if info.device != x_info.device:
        raise ValueError(
            f"{name}: expected device {x_info.device} like x, got device {info.device}"
        )
    allowed = (dtype, "uint8") if dtype.startswith("float8") else (dtype,)
    if info.dtype not in allowed:
        raise TypeError(f"{name}: expected dtype {' or '.join(allowed)}, got {info.dtype}")
    if tuple(info.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(info.shape)}")
    if not _same_strides(shape, info.strides, strides):
        raise ValueError(f"{name}: expected strides {tuple(strides)}, got {tuple(info.strides)}")
    if name == "out" and info.ptr % Q_ALIGNMENT:
        raise ValueError(
            f"{name}: expected a {Q_ALIGNMENT}-byte aligned pointer, got {info.ptr:#x}"
        )
    if info.ptr % info.itemsize:
        raise ValueError(f"{name}: pointer {info.ptr:#x} is not aligned to its item size")
    need = storage * info.itemsize
    have = available_bytes(info)
    if storage and (have is None or have < need):
        raise ValueError(
            f"{name}: the layout owns {need} bytes of storage (padding included) from the first "
            f"element, but the allocation holds {have if have is not None else 'an unknown'} bytes"
        )
    return given, info


def _host_strided(array: np.ndarray, shape, strides) -> np.ndarray:
    """``as_strided`` in elements; through a same-size integer view, since numpy's
    ``as_strided`` cannot rebuild the ml_dtypes float8 types."""
    raw = array.view(f"u{array.itemsize}")
    view = np.lib.stride_tricks.as_strided(raw, shape, tuple(s * array.itemsize for s in strides))
    return view.view(array.dtype)


def _flat_storage(info: ArrayInfo, storage: int) -> np.ndarray:
    """A flat view of ``storage`` elements from the first element of a host output."""
    return _host_strided(info.obj, (storage,), (1,))


# dequantization and helpers -----------------------------------------------------------------------

_DECODE_TABLES: dict[str, np.ndarray] = {}


def _decode_table(fmt_name: str) -> np.ndarray:
    """float32 value of each of the 256 codes of a format."""
    table = _DECODE_TABLES.get(fmt_name)
    if table is None:
        codes = np.arange(256, dtype=np.uint8)
        table = codes.view(OUTPUT_FORMATS[fmt_name].numpy_dtype).astype(np.float32)
        _DECODE_TABLES[fmt_name] = table
    return table


def _format_of(info: ArrayInfo, dtype) -> str:
    if dtype is not None:
        return output_format(dtype).name
    names = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "int8": "int8", "uint8": "e4m3"}
    if info.dtype not in names:
        raise TypeError(f"q: expected float8, int8 or uint8 codes, got {info.dtype}")
    return names[info.dtype]


def unpack_scales(packed, groups: int):
    """Packed UE8M0 words ``[..., kp]`` (int32) to float32 scales ``[..., groups]``.

    Byte ``g % 4`` of word ``g // 4`` is the biased exponent ``e`` of group ``g``; the scale is
    ``2**(e - 127)`` (``e = 255`` is NaN). Works on numpy, cupy and torch arrays of any strides.
    """
    info = describe(packed, "packed")
    if info.dtype != "int32":
        raise TypeError(f"packed: expected int32 words, got {info.dtype}")
    if len(info.shape) == 0 or info.shape[-1] * 4 < groups or groups < 0:
        raise ValueError(
            f"groups: expected at most 4 * {info.shape[-1] if info.shape else 0} groups, "
            f"got {groups}"
        )
    if info.kind == TORCH:
        import torch

        parts = [(packed >> (8 * j)) & 0xFF for j in range(4)]
        exponents = torch.stack(parts, dim=-1).reshape(*info.shape[:-1], -1)[..., :groups]
        bits = torch.where(exponents == 0, 0x00400000, exponents << 23)
        bits = torch.where(exponents == 255, 0x7FC00000, bits)
        return bits.to(torch.int32).contiguous().view(torch.float32)
    xp = _namespace(info)
    parts = [(packed >> (8 * j)) & 0xFF for j in range(4)]
    exponents = xp.stack(parts, axis=-1).reshape(*info.shape[:-1], -1)[..., :groups]
    exponents = exponents.astype(xp.uint32)
    bits = xp.where(exponents == 0, xp.uint32(0x00400000), exponents << 23)
    bits = xp.where(exponents == 255, xp.uint32(0x7FC00000), bits)
    return xp.ascontiguousarray(bits).view(xp.float32)


def dequantize(q, scales, group_size: int = 128, dtype=None):
    """Float32 ``q_i * s_group`` with the shape of ``q``.

    ``scales`` is any layout ``quantize`` returns: float32 ``[..., ng]`` or packed int32
    ``[..., kp]``. ``dtype`` names the format of uint8 codes (cupy's float8 container; default
    "e4m3"); other dtypes say it themselves.
    """
    q_info = describe(q, "q")
    s_info = describe(scales, "scales")
    fmt_name = _format_of(q_info, dtype)
    if len(q_info.shape) == 0 or q_info.shape[-1] % group_size:
        raise ValueError(f"q: last dimension must be a multiple of group_size={group_size}")
    groups = q_info.shape[-1] // group_size
    if s_info.dtype == "int32":
        scales = unpack_scales(scales, groups)
    elif s_info.dtype != "float32":
        raise TypeError(f"scales: expected float32 or packed int32, got {s_info.dtype}")
    expected = tuple(q_info.shape[:-1]) + (groups,)
    if tuple(scales.shape) != expected:
        raise ValueError(f"scales: expected shape {expected}, got {tuple(scales.shape)}")
    if q_info.kind == TORCH:
        import torch

        codes = q.view(torch.uint8).to(torch.int64) if fmt_name != "int8" else None
        if codes is None:
            values = q.to(torch.float32)
        else:
            table = torch.from_numpy(_decode_table(fmt_name)).to(q.device)
            values = table[codes]
        return values * scales.repeat_interleave(group_size, dim=-1)
    xp = _namespace(q_info)
    if fmt_name == "int8":
        values = q.astype(xp.float32)
    else:
        values = xp.asarray(_decode_table(fmt_name))[q.view(xp.uint8)]
    return values * xp.repeat(scales, group_size, axis=-1)


def as_float8(q, dtype="e4m3"):
    """Reinterpret uint8 codes as a float8 dtype without copying.

    numpy: an ``ml_dtypes.float8_*`` view. torch: a ``torch.float8_*`` view. cupy has no float8
    dtype: a torch view of the same memory is returned through DLPack (torch must be installed).
    """
    fmt = output_format(dtype)
    if not fmt.is_float8:
        raise ValueError(f"dtype: expected a float8 format, got {dtype!r}")
    info = describe(q, "q")
    if info.dtype not in ("uint8", f"float8_{'e4m3fn' if fmt.name == 'e4m3' else 'e5m2'}"):
        raise TypeError(f"q: expected uint8 codes, got {info.dtype}")
    torch_name = "float8_e4m3fn" if fmt.name == "e4m3" else "float8_e5m2"
    if info.kind == NUMPY:
        return q.view(fmt.numpy_dtype)
    if info.kind == CUPY:
        try:
            import torch
        except ImportError as error:
            raise TypeError(
                "q: cupy has no float8 dtype; install torch to get a float8 view, or use "
                "as_float8(cupy.asnumpy(q)) for a host copy"
            ) from error
        q = torch.from_dlpack(q)
    return q.view(getattr(sys.modules["torch"], torch_name))


def _namespace(info: ArrayInfo):
    if info.kind == CUPY:
        import cupy

        return cupy
    return np


# compile the production kernel when the package is imported on a GPU machine ---------------------


def _compile_on_import() -> None:
    if os.environ.get("FP8_GROUP_QUANT_COMPILE_ON_IMPORT", "1") == "0":
        return
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() == 0:
            return
        device = cupy.cuda.runtime.getDevice()
    except Exception:  # no CuPy, no driver or no device: the NumPy backend still works
        return
    try:
        _jit.get_function(_launch.SOURCE, _launch.DEFAULT_KEY.name_expression, device)
    except Exception as error:  # the call that needs it raises again, with the full log
        warnings.warn(
            f"fp8_group_quant: could not compile the default kernel: {error}", stacklevel=2
        )


_compile_on_import()
