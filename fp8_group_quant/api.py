"""Entry points: validate once into a Request, pick the backend (NumPy or CUDA), call it."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from . import _jit, _plan, _settings, _tuning, nvfp4, reference
from . import activation as _activation
from ._arrays import (
    CUPY,
    JAX,
    NUMPY,
    TORCH,
    ArrayInfo,
    available_bytes,
    byte_extent,
    describe,
    device_allocator,
    device_signature,
    foreign_library,
    from_cupy,
    is_torch_cpu,
    numpy_to_torch_cpu,
    pair_allocator,
    pointer,
    stream_getter,
    to_cupy,
    torch_cpu_to_numpy,
)
from ._layout import BLOCKED, PACKED, SCALE_LAYOUTS, Geometry, LayoutName
from ._request import VECTOR_ALIGNMENT, Request, check_options, make_request
from ._spec import (
    DEFAULT_EPS,
    FORMATS_BY_DTYPE,
    INPUT_TYPES,
    OUTPUT_FORMATS,
    ActivationName,
    OutputDType,
    ScaleName,
    ScaleRuleName,
    check_scale_rule,
    output_format,
)

Array = TypeVar(
    "Array", bound=Any
)  # numpy, cupy, torch (CPU or CUDA), JAX or numba: outputs match x

__all__ = [
    "PreparedQuantize",
    "as_float8",
    "dequantize",
    "prepare",
    "quantize",
    "quantize_packed",
    "unpack_scales",
    "warmup",
]


def quantize(
    x: Array,
    group_size: int = 128,
    *,
    dtype: OutputDType = "e4m3",
    scale: ScaleName = "float32",
    layout: LayoutName = "row",
    eps: float = DEFAULT_EPS,
    out=None,
    scale_out=None,
    pad_rows: bool = False,
    activation: ActivationName | None = None,
    masked_m=None,
    expected_m: int | None = None,
    norm: tuple | None = None,
    residual=None,
    scale_rule: ScaleRuleName = "rceil",
    global_scale=None,
) -> tuple[Array, ...]:
    """Quantize ``x`` per token in groups of ``group_size`` channels.

    For each group ``v`` of ``group_size`` consecutive values of a row:
    ``amax = max(eps, max|v_i| over finite v_i)``, ``s = amax / fmax`` (``scale="float32"``) or
    the next power of two of ``max(amax / fmax, 1e-10)`` (``scale="ue8m0"``), and
    ``q_i = round_to_nearest_even(clamp(v_i / s, -fmax, fmax))``. The contract, bit for bit, is
    ``docs/spec.md``.

    Parameters
    ----------
    x : numpy.ndarray, cupy.ndarray or torch.Tensor (CUDA), shape ``[..., K]``
        bfloat16, float16 or float32; the last dimension contiguous, ``K % group_size == 0``.
        The leading dimensions must collapse into one row stride, which may exceed ``K``.
        Three or more dimensions are batches ``[B, ..., K]`` with per-batch TMA padding.
        Numpy input runs the NumPy reference; GPU input runs the CUDA kernel on the caller's
        current stream (torch's for tensors, CuPy's for cupy arrays). JAX, numba and other
        DLPack / CUDA-array-interface arrays run through zero-copy CuPy views.
    group_size : {32, 64, 128, 256}
    dtype : {"e4m3", "e5m2", "int8", "e4m3fnuz", "e2m1"}
        Output format: float8_e4m3fn (fmax 448), float8_e5m2 (57344), int8 (127) or
        float8_e4m3fnuz (AMD; clamped at 224 as vLLM and SGLang do on ROCm); "e2m1" is NVFP4
        (see ``global_scale``).
    scale : {"float32", "ue8m0", "e4m3"}
        Float scales, or power-of-two scales (as float32 in float layouts, as exponent bytes in
        the packed layouts).
    layout : {"row", "col", "col_tma", "packed", "packed_row", "blocked"}
        With ``ng = K / group_size``, ``kp = ceil(ng / 4)``, ``tma = align(M, 4)``:
        ``row`` float32 ``[M, ng]`` strides ``(ng, 1)``; ``col`` float32 ``[M, ng]`` strides
        ``(1, M)``; ``col_tma`` float32 ``[M, ng]`` strides ``(1, tma)`` (DeepGEMM, SM90);
        ``packed`` int32 ``[M, kp]`` strides ``(1, tma)``, group ``g`` in byte ``g % 4`` of word
        ``g // 4`` (DeepGEMM, SM100); ``packed_row`` int32 ``[M, kp]`` strides ``(kp, 1)``;
        ``blocked`` uint8 ``[align(M, 128), align(ng, 4)]``, the 128x4 tiles Blackwell's
        block-scaled MMA reads, one UE8M0 byte per scale (e4m3 and e5m2 only).
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
    activation : {None, "silu_mul"}
        ``"silu_mul"``: ``x`` is ``[..., 2N]``, gate then up, and the values quantized are
        ``round(round(silu(gate)) * up)`` in x's dtype (the engines' ``silu_and_mul`` output,
        defined op by op in ``fp8_group_quant.activation``); ``q`` is ``[..., N]``. Each input
        byte is read once; ``x`` must be 16-byte aligned on the GPU.
    masked_m : array of int32 or int64, shape ``[E]``, optional
        The masked MoE layout: ``x`` is ``[E, T, K]`` (``[E, T, 2N]`` with an activation) and
        only rows ``t < masked_m[e]`` of expert ``e`` are read and written (counts clamped to
        ``[0, T]``; read on the device, without a host synchronisation, so a CUDA graph replays
        with new counts). Every other row of ``q`` and of the scales, TMA padding rows included,
        is left as it was: with library-allocated outputs those bytes are unspecified.
        ``masked_m`` lives with ``x`` (same library and device); at most 1024 experts.
    expected_m : int, optional
        With ``masked_m``: the rows per expert the persistent grid is sized for (DeepGEMM's
        hint); any counts are still handled. Default: ``T``.
    scale_rule : {"rceil", "floor"}
        How a UE8M0 scale's exponent is chosen. ``"rceil"`` (default): the exact ceiling of
        ``amax / fmax``, so no value saturates. ``"floor"``: OCP MX v1.0, the exponent of
        ``amax`` minus the format's ``emax_elem`` (8 for e4m3, 15 for e5m2), at least 2^-126;
        values beyond ``fmax`` saturate. Needs ``scale="ue8m0"`` and e4m3 or e5m2
        (``docs/spec.md``, section 3).
    norm : (weight, eps_norm), optional
        Fused RMSNorm: quantize ``round(x * rsqrt(mean(x^2) + eps_norm) * weight)`` over each
        row (``weight`` ``[K]`` of x's dtype; the float32 steps and the order of the row's sum
        are defined in ``docs/spec.md``, section 2b), at most 16384 16-bit values a row (8192
        float32). On the GPU, ``weight`` is contiguous and x, weight and residual 16-byte
        aligned; every backend gives the same bits.
    residual : array like ``x``, optional
        With ``norm``: ``x + residual`` (rounded to x's dtype) is normalised instead of ``x`` and
        written back to ``residual``, as the engines' fused add-RMSNorm does.
    global_scale : float or one-element float32 array, optional
        NVFP4 only (``group_size=16, dtype="e2m1", scale="e4m3", layout="blocked"``): e2m1
        codes two to a byte (first value in the low nibble) ``[..., K/2]`` uint8, e4m3 block
        scales ``s = e4m3(global * amax / 6)`` as blocked uint8 bytes, codes of
        ``v / (s / global)`` (``docs/spec.md``, section 4a). A device array stays on the device
        (never read on the host; it must hold a positive finite value). None computes
        ``448 * 6 / amax(x)`` on the device (one extra pass over ``x``) and returns it as a
        third output, a one-element float32 array. No other option applies to NVFP4.

    Returns
    -------
    q : array of ``x``'s library, shape ``x.shape``
        numpy: ``ml_dtypes.float8_*`` / ``int8``; torch: ``torch.float8_*`` / ``torch.int8``;
        cupy: ``uint8`` holding the float8 bytes (see ``as_float8``) / ``int8``.
    scales : array of ``x``'s library, shape ``x.shape[:-1] + (ng or kp,)``, strides as above.
    global_scale : NVFP4 with ``global_scale=None`` only: the computed global scale.
    """
    if nvfp4.is_nvfp4(dtype, scale):
        nvfp4.check_options(group_size, dtype, scale, layout, {
            "eps": (eps, DEFAULT_EPS), "pad_rows": (pad_rows, False),
            "activation": (activation, None), "masked_m": (masked_m, None),
            "expected_m": (expected_m, None), "norm": (norm, None), "residual": (residual, None),
            "scale_rule": (scale_rule, "rceil"), "out": (out, None), "scale_out": (scale_out, None),
        })  # fmt: skip
        return nvfp4.quantize(x, global_scale)
    if global_scale is not None:
        raise ValueError("global_scale: only NVFP4 (dtype='e2m1', scale='e4m3') takes one")
    options = (group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule)
    if norm is not None or residual is not None:
        return _quantize_norm(x, options, norm, residual, out, scale_out, masked_m, expected_m)
    if masked_m is not None or expected_m is not None:
        return _quantize_masked(x, options, masked_m, expected_m, out, scale_out)
    signature = device_signature(x)
    if signature is not None:
        plan = _PLANS.get((*signature[:-1], *options, _tuning.active()[0]))
        if plan is not None:
            return plan.run(signature[-1], out, scale_out)
        return _quantize_new(x, options, out, scale_out)
    if is_torch_cpu(x):  # the NumPy backend on zero-copy numpy views, back as torch tensors
        return _quantize_torch_cpu(x, options, out, scale_out)
    library = foreign_library(x)
    if library is None:  # numpy, or something we cannot read: describe() names it
        return _quantize_new(x, options, out, scale_out)
    # JAX, numba, DLPack: converted up front to zero-copy cupy views, and back at the end
    if library == JAX and (out is not None or scale_out is not None):
        raise TypeError("out: JAX arrays are immutable; call without out= / scale_out=")
    for given, name in ((out, "out"), (scale_out, "scale_out")):
        if given is not None and foreign_library(given) is None:
            raise TypeError(f"{name}: expected an array of x's library, got {type(given).__name__}")
    fmt = output_format(dtype)
    x_view = to_cupy(x)
    q, scales = _quantize_new(
        x_view, options, None if out is None else to_cupy(out, "out"),
        None if scale_out is None else to_cupy(scale_out, "scale_out"),
    )  # fmt: skip
    q = out if out is not None else from_cupy(q, library, fmt.dtype_name if fmt.is_float8 else None)
    scales = scale_out if scale_out is not None else from_cupy(scales, library, None)
    return q, scales


def _quantize_torch_cpu(x, options: tuple, out, scale_out):
    """A torch CPU tensor through the NumPy backend: numpy views of the same memory in, torch
    views of the results out (the caller's own tensors when given)."""
    for given, name in ((out, "out"), (scale_out, "scale_out")):
        if given is not None and not is_torch_cpu(given):
            raise TypeError(
                f"{name}: expected a torch CPU tensor like x, got {type(given).__name__}"
            )
    q, scales = _quantize_new(
        torch_cpu_to_numpy(x, "x"), options,
        None if out is None else torch_cpu_to_numpy(out, "out"),
        None if scale_out is None else torch_cpu_to_numpy(scale_out, "scale_out"),
    )  # fmt: skip
    return (
        out if out is not None else numpy_to_torch_cpu(q),
        scale_out if scale_out is not None else numpy_to_torch_cpu(scales),
    )


def _quantize_new(x, options: tuple, out, scale_out):
    """A call of a kind not seen before: validate into a Request, then run (and remember the
    plan of a GPU call). ``options``: quantize's, from group_size to scale_rule."""
    info = describe(x, "x")
    request = make_request(info, *options)
    if info.kind == NUMPY:
        return _quantize_host(x, info, request, out, scale_out)
    plan = _make_plan(info, request, options)
    return plan.run(info.ptr, out, scale_out)


def _norm_arguments(norm, options: tuple, masked_m, expected_m=None) -> tuple:
    """(weight, eps_norm) of a ``norm`` argument that can be combined with the other options."""
    if expected_m is not None:
        raise ValueError("expected_m: a hint for the masked layout, which norm cannot be used with")
    if norm is None:
        raise ValueError("residual: the fused add needs norm=(weight, eps_norm) too")
    if not isinstance(norm, tuple) or len(norm) != 2:
        raise TypeError(f"norm: expected a (weight, eps_norm) tuple, got {type(norm).__name__}")
    if options[6] is not None:
        raise ValueError("norm: cannot be combined with activation")
    if masked_m is not None:
        raise ValueError("norm: cannot be combined with masked_m")
    return norm


def _quantize_norm(x, options: tuple, norm, residual, out, scale_out, masked_m, expected_m=None):
    """Fused RMSNorm (and add), on the NumPy backend; every argument is checked before the
    residual or an output is written."""
    weight, eps_norm = _norm_arguments(norm, options, masked_m, expected_m)
    if is_torch_cpu(x):  # numpy views of the same memory: the residual is written through them
        host = [torch_cpu_to_numpy(a, name) if a is not None else None
                for a, name in ((x, "x"), (weight, "norm"), (residual, "residual"),
                                (out, "out"), (scale_out, "scale_out"))]  # fmt: skip
        q, scales = _quantize_norm(host[0], options, (host[1], eps_norm), host[2], host[3],
                                   host[4], None)  # fmt: skip
        return (
            out if out is not None else numpy_to_torch_cpu(q),
            scale_out if scale_out is not None else numpy_to_torch_cpu(scales),
        )
    info = describe(x, "x")
    w_info = describe(weight, "norm")
    r_info = None if residual is None else describe(residual, "residual")
    group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule = options
    request = make_request(info, group_size, dtype, scale, layout, eps, pad_rows, activation,
                           scale_rule, norm=(w_info, eps_norm, r_info))  # fmt: skip
    if info.kind != NUMPY:
        return _quantize_norm_device(x, info, request, options, w_info, r_info, out, scale_out)
    if residual is not None:
        if not residual.flags.writeable:
            raise ValueError("residual: the array is read-only; the fused add writes it")
        if np.shares_memory(residual, x):
            raise ValueError("residual: overlaps x; pass a separate buffer")
        if np.shares_memory(residual, weight):
            raise ValueError("residual: overlaps the norm's weight; pass a separate buffer")
        for given, name in ((out, "out"), (scale_out, "scale_out")):
            if given is not None and np.shares_memory(residual, given):
                raise ValueError(f"residual: overlaps {name}")
    values, new_residual = _activation.rms_norm(x, weight, request.eps_norm, info.dtype, residual)
    q, scales = _quantize_host(values, info, request, out, scale_out)  # checks the outputs
    if new_residual is not None:
        residual[...] = new_residual.astype(residual.dtype)
    return q, scales


def _check_norm_writes(reads, writes) -> None:
    """Raise if a written array (``writes``: name, ArrayInfo) overlaps any other array, read
    (``reads``: x and the weight, which may share memory) or written."""
    extents = [(name, byte_extent(a.ptr, a.shape, a.strides, a.itemsize)) for name, a in
               reads + writes]  # fmt: skip
    for i, (name_a, (a0, a1)) in enumerate(extents):
        for name_b, (b0, b1) in extents[i + 1 :]:
            if a0 < b1 and b0 < a1 and not (i < len(reads) and name_b in dict(reads)):
                raise ValueError(f"{name_b}: its memory overlaps {name_a}'s")


def _norm_plan(x, info, request, options, w_info, r_info, out, scale_out):
    """(plan, norm pointers) of a fused RMSNorm call on the GPU, its writes checked. The plan is
    remembered under x's signature, the options, eps_norm and the residual's strides."""
    writes = [("residual", r_info)] if r_info is not None else []
    for given, name in ((out, "out"), (scale_out, "scale_out")):
        if given is not None:
            writes.append((name, describe(given, name)))
    _check_norm_writes([("x", info), ("norm", w_info)], writes)
    norm_options = (*options, "norm", request.eps_norm, request.residual, request.r_batch_stride,
                    request.r_row_stride)  # fmt: skip
    plan = _PLANS.get((*device_signature(x)[:-1], *norm_options, _tuning.active()[0]))
    if plan is None:
        plan = _make_plan(info, request, norm_options)
    return plan, (w_info.ptr, 0 if r_info is None else r_info.ptr)


def _quantize_norm_device(x, info, request, options, w_info, r_info, out, scale_out):
    """The fused RMSNorm kernel; the pointers are passed per call."""
    plan, norm_ptrs = _norm_plan(x, info, request, options, w_info, r_info, out, scale_out)
    return plan.run(info.ptr, out, scale_out, norm_ptrs=norm_ptrs)


def _quantize_masked(x, options: tuple, masked_m, expected_m, out, scale_out):
    """The masked MoE layout. Every call checks ``masked_m`` (its address changes per call)."""
    if masked_m is None:
        raise ValueError("expected_m: a hint for the masked layout; pass masked_m too")
    if is_torch_cpu(x):
        if not is_torch_cpu(masked_m):
            raise ValueError("masked_m: expected a torch CPU tensor like x")
        q, scales = _quantize_masked(
            torch_cpu_to_numpy(x, "x"), options, torch_cpu_to_numpy(masked_m, "masked_m"),
            expected_m, None if out is None else torch_cpu_to_numpy(out, "out"),
            None if scale_out is None else torch_cpu_to_numpy(scale_out, "scale_out"),
        )  # fmt: skip
        return (
            out if out is not None else numpy_to_torch_cpu(q),
            scale_out if scale_out is not None else numpy_to_torch_cpu(scales),
        )
    info = describe(x, "x")
    masked_info = describe(masked_m, "masked_m")
    group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule = options
    request = make_request(
        info, group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule,
        masked_info, expected_m,
    )  # fmt: skip
    if info.kind == NUMPY:
        return _quantize_host(x, info, request, out, scale_out, counts=np.asarray(masked_m))
    signature = device_signature(x)
    key = (*signature[:-1], *options, masked_info.dtype, request.expected_m, _tuning.active()[0])
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(info, request, (*options, masked_info.dtype, request.expected_m))
    return plan.run(info.ptr, out, scale_out, masked_info.ptr)


def _quantize_host(x, info: ArrayInfo, request: Request, out, scale_out, counts=None):
    q_spec, scale_spec = _output_specs(request)
    q, q_info = _output(out, "out", info, q_spec)
    scales, s_info = _output(scale_out, "scale_out", info, scale_spec)
    _check_disjoint(info, info.ptr, (("out", q_info, q_spec), ("scale_out", s_info, scale_spec)))
    geometry = request.output
    if not geometry.empty:
        values = x
        if request.mode.name == "silu_mul":  # the fused input's values (activation.py)
            n = geometry.k
            values = _activation.silu_mul(x[..., :n], x[..., n:], request.input_dtype)
        storages = (
            _flat_storage(q_info, geometry.q_storage).view(np.uint8),
            _flat_storage(s_info, geometry.scale_storage),
        )
        arguments = (values, geometry, request.fmt, request.scale, request.eps, *storages)
        if counts is None:
            reference.quantize_into(*arguments, rule=request.scale_rule)
        else:
            reference.quantize_into_masked(*arguments, counts, rule=request.scale_rule)
    return q, scales


# outputs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputSpec:
    """An output array: shape, strides (elements), storage owned (elements), dtype."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage: int
    dtype: str  # the library's dtype name: float8_e4m3fn, int8, int32, float32, ...
    container: str  # the dtype that holds it where the library lacks it (cupy: uint8 for float8)

    @property
    def numpy_dtype(self) -> np.dtype:
        fmt = FORMATS_BY_DTYPE.get(self.dtype)
        return fmt.numpy_dtype if fmt is not None else np.dtype(self.dtype)

    def allocation(self, kind: str) -> tuple:
        """(shape, strides, storage, dtype name) as the allocators in _arrays take them."""
        return (
            self.shape,
            self.strides,
            self.storage,
            self.container if kind == CUPY else self.dtype,
        )


def _output_specs(request: Request) -> tuple[OutputSpec, OutputSpec]:
    g, fmt, layout = request.output, request.fmt, request.layout
    return (
        OutputSpec(g.shape, g.q_strides, g.q_storage, fmt.dtype_name, fmt.container),
        OutputSpec(g.scale_shape, g.scale_strides, g.scale_storage, layout.dtype, layout.dtype),
    )


def _same_strides(shape, got, expected) -> bool:
    """Strides agree where they matter: an empty array has none that do."""
    return 0 in shape or all(n <= 1 or g == e for n, g, e in zip(shape, got, expected))


def _output(given, name: str, x_info: ArrayInfo, spec: OutputSpec):
    """Allocate a host output, or validate the caller's. Returns (array, info)."""
    if given is None:  # host arrays only: device outputs come from _Plan's allocators
        array = _host_strided(np.empty(spec.storage, spec.numpy_dtype), spec.shape, spec.strides)
        return array, describe(array, name)

    info = describe(given, name)
    if info.kind != x_info.kind:
        raise TypeError(f"{name}: expected a {x_info.kind} array like x, got a {info.kind} one")
    if info.device != x_info.device:
        raise ValueError(
            f"{name}: expected device {x_info.device} like x, got device {info.device}"
        )
    allowed = tuple(dict.fromkeys((spec.dtype, spec.container)))
    if info.dtype not in allowed:
        raise TypeError(f"{name}: expected dtype {' or '.join(allowed)}, got {info.dtype}")
    if tuple(info.shape) != tuple(spec.shape):
        raise ValueError(f"{name}: expected shape {tuple(spec.shape)}, got {tuple(info.shape)}")
    if not _same_strides(spec.shape, info.strides, spec.strides):
        raise ValueError(
            f"{name}: expected strides {tuple(spec.strides)}, got {tuple(info.strides)}"
        )
    if info.kind == NUMPY and not given.flags.writeable:
        raise ValueError(f"{name}: the array is read-only")
    if not spec.storage:  # nothing is written: an empty output's pointer and strides are moot
        return given, info
    # NOTES: the blocked layout's padding is zeroed with 4- and 16-byte stores on the GPU
    vector = name == "out" or (info.kind != NUMPY and spec.dtype == "uint8")
    if vector and info.ptr % VECTOR_ALIGNMENT:
        raise ValueError(
            f"{name}: expected a {VECTOR_ALIGNMENT}-byte aligned pointer, got {info.ptr:#x}"
        )
    if info.ptr % info.itemsize:
        raise ValueError(f"{name}: pointer {info.ptr:#x} is not aligned to its item size")
    need = spec.storage * info.itemsize
    have = available_bytes(info)
    if have is None or have < need:
        raise ValueError(
            f"{name}: the layout owns {need} bytes of storage (padding included) from the first "
            f"element, but the allocation holds {have if have is not None else 'an unknown'} bytes"
        )
    return given, info


def _check_disjoint(x_info: ArrayInfo, x_ptr: int, outputs) -> None:
    """Raise if an output's storage overlaps the input or the other output.

    NOTES: the kernel reads x while it writes q and the scales; a shared byte is a race on the
    GPU and a wrong answer on the host. An output's extent is the storage its layout owns
    (padding included), the input's the bytes its view touches. ``outputs``: (name, info,
    spec) of each output the caller gave.
    """
    x_range = byte_extent(x_ptr, x_info.shape, x_info.strides, x_info.itemsize)
    ranges = [("x", x_range)]
    for name, info, spec in outputs:
        ranges.append((name, (info.ptr, info.ptr + spec.storage * info.itemsize)))
    for i, (name_a, (a0, a1)) in enumerate(ranges):
        for name_b, (b0, b1) in ranges[i + 1 :]:
            if a0 < b1 and b0 < a1:
                raise ValueError(f"{name_b}: its storage overlaps {name_a}'s memory")


# GPU plans -------------------------------------------------------------------------------------


class PlanCache:
    """Plans by (input signature, options as given): bounded, thread-safe, never cleared.

    NOTES: a full cache drops its oldest entry, one at a time, under the lock; a caller holding
    a plan keeps it whatever happens to the cache. Reads take no lock (a dict read is atomic).
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._plans: OrderedDict[tuple, _Plan] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple):
        try:
            return self._plans.get(key)
        except TypeError:  # an unhashable option: validation names it
            return None

    def put(self, key: tuple, plan: _Plan) -> None:
        try:
            hash(key)
        except TypeError:
            return
        with self._lock:
            while len(self._plans) >= self.capacity:
                self._plans.popitem(last=False)
            self._plans[key] = plan

    def __len__(self) -> int:
        return len(self._plans)


MAX_PLANS = 4096  # distinct (array layout, options) combinations remembered
_PLANS = PlanCache(MAX_PLANS)
_thread_state = threading.local()


def _make_plan(info: ArrayInfo, request: Request, options: tuple) -> _Plan:
    """The plan of a GPU call, remembered under the input's signature, ``options`` and the
    tuning table in force."""
    launch = None
    assert info.device is not None  # a GPU array
    token, tuning = _tuning.active()
    if not request.output.empty:
        launch = _plan.prepare(request, info.device, tuning)
    plan = _Plan(info, request, launch)
    signature = device_signature(info.obj)
    _PLANS.put((*signature[:-1], *options, token), plan)
    return plan


class _Plan:
    """Everything a GPU call of one kind needs: output specs, the launch, the caller's library."""

    def __init__(self, x_info: ArrayInfo, request: Request, launch):
        cupy = _jit.cupy_module()

        # NOTES: no reference to the first input: a cached plan must not pin its memory
        self.x_info = dataclasses.replace(x_info, obj=None, ptr=0)
        self.request = request
        self.kind = x_info.kind
        self.device = x_info.device
        self.launch = launch
        self.q_spec, self.scale_spec = _output_specs(request)
        kind, device = x_info.kind, x_info.device
        assert device is not None  # a GPU array
        q_allocation, scale_allocation = (
            self.q_spec.allocation(kind),
            self.scale_spec.allocation(kind),
        )
        self.q_alloc = device_allocator(kind, device, *q_allocation)
        self.scale_alloc = device_allocator(kind, device, *scale_allocation)
        self.alloc_both = pair_allocator(kind, device, q_allocation, scale_allocation)
        self.stream = stream_getter(x_info.kind)
        self._get_device = cupy.cuda.runtime.getDevice

    def run(self, x_ptr: int, out, scale_out, masked_ptr=None, norm_ptrs=None):
        if self.ready():
            return self._run(x_ptr, out, scale_out, masked_ptr, norm_ptrs)
        with self.on_device():
            return self._run(x_ptr, out, scale_out, masked_ptr, norm_ptrs)

    def _run(self, x_ptr: int, out, scale_out, masked_ptr=None, norm_ptrs=None):
        if out is None and scale_out is None:
            q, q_ptr, scales, scale_ptr = self.alloc_both()
        else:
            given = []  # the caller's outputs, checked against x and each other before the launch
            if out is None:
                q = self.q_alloc()
                q_ptr = pointer(q, self.kind)
            else:
                q_info = _output(out, "out", self.x_info, self.q_spec)[1]
                q, q_ptr = out, q_info.ptr
                given.append(("out", q_info, self.q_spec))
            if scale_out is None:
                scales = self.scale_alloc()
                scale_ptr = pointer(scales, self.kind)
            else:
                s_info = _output(scale_out, "scale_out", self.x_info, self.scale_spec)[1]
                scales, scale_ptr = scale_out, s_info.ptr
                given.append(("scale_out", s_info, self.scale_spec))
            _check_disjoint(self.x_info, x_ptr, given)
        if self.launch is None:
            pass
        elif norm_ptrs is not None:
            stream = self.stream(self.device)
            self.launch.launch_norm(x_ptr, q_ptr, scale_ptr, *norm_ptrs, stream)
        elif masked_ptr is None:
            self.launch.launch(x_ptr, q_ptr, scale_ptr, self.stream(self.device))
        else:
            stream = self.stream(self.device)
            self.launch.launch_masked(x_ptr, q_ptr, scale_ptr, masked_ptr, stream)
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
    buffers of a CUDA graph) and returns them; any other array raises ValueError. ``masked_m``,
    the norm's weight and the residual given to ``prepare`` are bound the same way: each call
    reads them (and writes the residual) where they were, so update them in place.
    """

    def __init__(self, plan: _Plan, key: tuple, q, scales, masked_ptr=None, norm_ptrs=None,
                 residual=None, bound=()):  # fmt: skip
        self._plan = plan
        # NOTES: the arrays whose addresses the launch keeps (masked_m, the weight, the
        # residual): held, so a temporary passed to prepare is not freed and its memory reused
        # under the kernel (the likely cause of an H200 failure: with a weight built inline in
        # the call, 1023 of 8192 codes of a later step differed; not re-run since)
        self._bound = bound
        self._key = key
        self.q = q
        self.scales = scales
        self._q_ptr = pointer(q, plan.kind)
        self._scale_ptr = pointer(scales, plan.kind)
        self._residual = (  # checked against each x: the kernel writes it
            None if residual is None else dataclasses.replace(residual, obj=None)
        )
        # bound once: the call below is the eager hot path
        launch = plan.launch
        self._launch = None
        if launch is not None and masked_ptr is not None:
            self._launch = lambda x, q, s, stream: launch.launch_masked(x, q, s, masked_ptr, stream)
        elif launch is not None and norm_ptrs is not None:
            self._launch = lambda x, q, s, stream: launch.launch_norm(x, q, s, *norm_ptrs, stream)
        elif launch is not None:
            self._launch = launch.launch
        self._ready, self._stream, self._device = plan.ready, plan.stream, plan.device

    def __call__(self, x):
        signature = device_signature(x)
        if signature is None or signature[:-1] != self._key:
            raise ValueError(
                f"x: this call was prepared for {self._key[:6]} (library, dtype, shape, strides, "
                f"device, 16-byte aligned), got {signature[:6] if signature else type(x)}"
            )
        if self._residual is not None:
            _check_norm_writes([("x", describe(x, "x"))], [("residual", self._residual)])
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
    dtype: OutputDType = "e4m3",
    scale: ScaleName = "float32",
    layout: LayoutName = "row",
    eps: float = DEFAULT_EPS,
    out=None,
    scale_out=None,
    pad_rows: bool = False,
    activation: ActivationName | None = None,
    masked_m=None,
    expected_m: int | None = None,
    norm: tuple | None = None,
    residual=None,
    scale_rule: ScaleRuleName = "rceil",
) -> PreparedQuantize:
    """Validate once and return a callable that quantizes arrays laid out like ``x``.

    Arguments as for ``quantize``; ``x`` must be a cupy array or torch CUDA tensor. The outputs
    (``out``/``scale_out``, or buffers allocated here) are reused by every call, and so are
    ``masked_m``, the norm's weight and ``residual``: the callable takes ``x`` alone and reads
    the others where they were (update them in place, as a CUDA graph's static buffers). This
    is the lowest-overhead eager path for decode-sized inputs; the first call here also
    compiles, and quantizes ``x`` (writing the residual, with ``norm``).
    """
    if nvfp4.is_nvfp4(dtype, scale):
        raise NotImplementedError("dtype='e2m1': NVFP4 has no prepared call yet; call quantize")
    signature = device_signature(x)
    if signature is None:
        raise TypeError(f"x: prepare needs a cupy array or torch CUDA tensor, got {type(x)}")
    info = describe(x, "x")
    options = (group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule)
    if norm is not None or residual is not None:
        weight, eps_norm = _norm_arguments(norm, options, masked_m, expected_m)
        w_info = describe(weight, "norm")
        r_info = None if residual is None else describe(residual, "residual")
        request = make_request(info, *options, norm=(w_info, eps_norm, r_info))
        plan, norm_ptrs = _norm_plan(x, info, request, options, w_info, r_info, out, scale_out)
        q, scales = plan.run(info.ptr, out, scale_out, norm_ptrs=norm_ptrs)
        return PreparedQuantize(plan, signature[:-1], q, scales, norm_ptrs=norm_ptrs,
                                residual=r_info, bound=(weight, residual))  # fmt: skip
    if masked_m is not None or expected_m is not None:
        if masked_m is None:
            raise ValueError("expected_m: a hint for the masked layout; pass masked_m too")
        masked_info = describe(masked_m, "masked_m")
        request = make_request(info, *options, masked_info, expected_m)
        plan = _make_plan(info, request, (*options, masked_info.dtype, request.expected_m))
        q, scales = plan.run(info.ptr, out, scale_out, masked_info.ptr)
        return PreparedQuantize(plan, signature[:-1], q, scales, masked_ptr=masked_info.ptr,
                                bound=(masked_m,))  # fmt: skip
    request = make_request(info, *options)
    plan = _make_plan(info, request, options)
    q, scales = plan.run(info.ptr, out, scale_out)
    return PreparedQuantize(plan, signature[:-1], q, scales)


def quantize_packed(
    x: Array,
    group_size: int = 128,
    eps: float = DEFAULT_EPS,
    out=None,
    scale_out=None,
    pad_rows: bool = False,
) -> tuple[Array, Array]:
    """FP8 e4m3 with UE8M0 scales packed four per int32 word, MN-major and TMA-aligned.

    The layout DeepGEMM's SM100 kernels read: ``scales`` int32 of shape ``[..., M, ceil(ng/4)]``
    and strides ``(..., 1, align(M, 4))``. Same as ``quantize(x, group_size, dtype="e4m3",
    scale="ue8m0", layout="packed", ...)``; see ``quantize`` for the parameters.
    """
    q, scales = quantize(
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
    return q, scales


def warmup(device: int | None = None, variants=None) -> list[str]:
    """Compile (or read from the disk cache) and load kernels on ``device`` before serving.

    ``device``: a CUDA ordinal (default: the current device). ``variants``: None for the default
    kernel (bfloat16, G = 128, e4m3, packed UE8M0 scales; all its paths: the one-pass kernel for
    contiguous rows and through x's strides, and the row loop), ``"all"`` for every instantiation
    (NVFP4's included), or
    an iterable of dicts of ``quantize`` options plus ``input_dtype`` (default ``"bfloat16"``),
    e.g. ``[{"input_dtype": "float16", "scale": "ue8m0", "layout": "col_tma"}]``. Kernels for
    16-byte aligned inputs are loaded; the unaligned fallback loads on first use. Returns the
    name expressions now loaded.
    """
    if device is None:
        device = _jit.cupy_module().cuda.runtime.getDevice()
    if variants is None:
        keys = list(_plan.DEFAULT_KEYS)
    elif isinstance(variants, str) and variants == "all":
        keys = []
    elif isinstance(variants, (str, dict)):
        raise TypeError(f"variants: expected None, 'all' or an iterable of dicts, got {variants!r}")
    else:
        keys = [key for v in variants for key in _warmup_keys(dict(v))]
    expressions = list(dict.fromkeys(k.name_expression for k in keys))
    if variants == "all":  # the same list, in the same chunks, as tools/precompile.py
        expressions = _plan.all_name_expressions()
    _jit.preload(_plan.SOURCE, expressions, int(device))
    return expressions


def _warmup_keys(options: dict) -> list[_plan.KernelKey]:
    input_dtype = options.pop("input_dtype", "bfloat16")
    unknown = set(options) - {
        "group_size", "dtype", "scale", "layout", "eps", "pad_rows", "activation", "scale_rule"
    }  # fmt: skip
    if unknown:
        raise TypeError(f"variants: unknown option(s) {', '.join(sorted(unknown))}")
    group_size, fmt, scale, layout, _, _, mode = check_options(
        options.get("group_size", 128), options.get("dtype", "e4m3"),
        options.get("scale", "float32"), options.get("layout", "row"),
        options.get("eps", DEFAULT_EPS), options.get("pad_rows", False),
        options.get("activation"),
    )  # fmt: skip
    if input_dtype not in INPUT_TYPES:
        raise ValueError(f"variants: input_dtype must be one of {', '.join(INPUT_TYPES)}")
    check_scale_rule(options.get("scale_rule", "rceil"), fmt, scale)
    trait = layout.kernel_trait
    key = _plan.KernelKey(
        input_dtype, group_size, fmt.name, scale.name, trait, vec16=True, activation=mode.name
    )
    if mode.name is not None:  # the fused modes have the one-pass kernel only
        return [dataclasses.replace(key, one_pass=True)]
    # every path: one pass for contiguous rows (the load linear in the slot, where the layout
    # has one-row tiles) and through x's strides, and the row loop
    keys = [dataclasses.replace(key, one_pass=one_pass) for one_pass in (True, False)]
    if _plan.tile_rows(layout, key.lanes_per_group) == 1:
        keys.insert(0, dataclasses.replace(key, one_pass=True, flat=True))
    return keys


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
    """The format of codes ``info``: ``dtype`` if given, else their own dtype (uint8: e4m3).
    A ``dtype`` that contradicts the codes' own float8 or int8 dtype is refused."""
    if dtype is not None:
        fmt = output_format(dtype)
        own = FORMATS_BY_DTYPE.get(info.dtype)
        if own is not None and own.name != fmt.name:
            raise ValueError(
                f"dtype: {dtype!r} contradicts the codes' own dtype {info.dtype} (format "
                f"{own.name!r}); leave dtype unset for typed codes"
            )
        return fmt.name
    if info.dtype == "uint8":
        return "e4m3"
    if info.dtype not in FORMATS_BY_DTYPE:
        raise TypeError(
            f"q: expected codes of {', '.join(FORMATS_BY_DTYPE)} or uint8, got {info.dtype}"
        )
    return FORMATS_BY_DTYPE[info.dtype].name


def unpack_scales(packed: Array, groups: int) -> Array:
    """Packed UE8M0 words ``[..., kp]`` (int32) to float32 scales ``[..., groups]``.

    Byte ``g % 4`` of word ``g // 4`` is the biased exponent ``e`` of group ``g``; the scale is
    ``2**(e - 127)`` (``e = 255`` is NaN). Works on numpy, cupy and torch arrays of any strides.
    """
    if is_torch_cpu(packed):
        return numpy_to_torch_cpu(unpack_scales(torch_cpu_to_numpy(packed, "packed"), groups))
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

        # byte g % 4 of word g // 4 (little-endian words): the bytes of a row-major copy
        codes = packed.contiguous().view(torch.uint8)[..., :groups]
        if hasattr(torch, "float8_e8m0fnu"):  # torch decodes UE8M0 itself (2.7 and later)
            decoded: Any = codes.view(torch.float8_e8m0fnu).to(torch.float32)
            return decoded.contiguous()
        exponents = codes.to(torch.int32)  # pragma: no cover - older torch
        bits = torch.where(exponents == 0, 0x00400000, exponents << 23)
        bits = torch.where(exponents == 255, 0x7FC00000, bits)
        decoded = bits.contiguous().view(torch.float32)
        return decoded
    if info.kind == NUMPY:  # ml_dtypes decodes UE8M0 itself: 2**(e - 127), e = 255 NaN
        import ml_dtypes

        codes = np.ascontiguousarray(packed).view(np.uint8)  # byte g % 4 of word g // 4
        codes = codes.reshape(*info.shape[:-1], 4 * info.shape[-1])[..., :groups]
        return codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    xp = _namespace(info)
    parts = [(packed >> (8 * j)) & 0xFF for j in range(4)]
    # NOTES: the width is spelled out: a -1 cannot be inferred when a leading dimension is 0
    exponents = xp.stack(parts, axis=-1).reshape(*info.shape[:-1], 4 * info.shape[-1])
    exponents = exponents[..., :groups]
    exponents = exponents.astype(xp.uint32)
    bits = xp.where(exponents == 0, xp.uint32(0x00400000), exponents << 23)
    bits = xp.where(exponents == 255, xp.uint32(0x7FC00000), bits)
    return xp.ascontiguousarray(bits).view(xp.float32)


def dequantize(
    q: Array,
    scales: Array,
    group_size: int = 128,
    dtype: OutputDType | None = None,
    global_scale=None,
) -> Array:
    """Float32 ``q_i * s_group`` with the shape of ``q``.

    ``scales`` is any layout ``quantize`` returns: float32 ``[..., ng]``, packed int32
    ``[..., kp]`` or the blocked layout's uint8 storage. ``dtype`` names the format of uint8
    codes (cupy's float8 container; default "e4m3"); other dtypes say it themselves.
    NVFP4 (``group_size=16, dtype="e2m1"``, with its ``global_scale``): ``q`` ``[..., K/2]``
    packed codes, float32 ``[..., K]`` of ``e2m1(code) * RN(S / global_scale)``.
    """
    if dtype == nvfp4.E2M1:
        if group_size != nvfp4.GROUP or global_scale is None:
            raise ValueError("dtype='e2m1': NVFP4 needs group_size=16 and its global_scale")
        return nvfp4.dequantize(q, scales, global_scale)
    if global_scale is not None:
        raise ValueError("global_scale: only NVFP4 (dtype='e2m1') takes one")
    if group_size == nvfp4.GROUP:
        raise ValueError("group_size=16 is NVFP4's: pass dtype='e2m1' and its global_scale")
    if is_torch_cpu(q) and is_torch_cpu(scales):  # through numpy views, back as a tensor
        values = dequantize(
            torch_cpu_to_numpy(q, "q"), torch_cpu_to_numpy(scales, "scales"), group_size, dtype
        )
        return numpy_to_torch_cpu(np.ascontiguousarray(values))
    q_info = describe(q, "q")
    s_info = describe(scales, "scales")
    fmt_name = _format_of(q_info, dtype)
    if len(q_info.shape) == 0 or q_info.shape[-1] % group_size:
        raise ValueError(f"q: last dimension must be a multiple of group_size={group_size}")
    groups = q_info.shape[-1] // group_size
    if s_info.dtype == "int32":
        _check_packed_width(scales, s_info, groups, group_size)
        scales = unpack_scales(scales, groups)
    elif s_info.dtype == "uint8":
        scales = _unblock_scales(scales, s_info, q_info, group_size)
    elif s_info.dtype != "float32":
        raise TypeError(
            f"scales: expected float32, packed int32 or blocked uint8, got {s_info.dtype}"
        )
    expected = tuple(q_info.shape[:-1]) + (groups,)
    if tuple(scales.shape) != expected:
        raise ValueError(f"scales: expected shape {expected}, got {tuple(scales.shape)}")
    if q_info.kind == TORCH:
        import torch

        if fmt_name == "int8":
            decoded = q.to(torch.float32)
        else:
            table = torch.from_numpy(_decode_table(fmt_name)).to(q.device)
            decoded = table[q.view(torch.uint8).to(torch.int64)]
        return decoded * scales.repeat_interleave(group_size, dim=-1)
    xp = _namespace(q_info)
    if fmt_name == "int8":
        values = q.astype(xp.float32)
    else:
        values = xp.asarray(_decode_table(fmt_name))[q.view(xp.uint8)]
    return values * xp.repeat(scales, group_size, axis=-1)


def _unblock_scales(scales, s_info: ArrayInfo, q_info: ArrayInfo, group_size: int):
    """The blocked layout's UE8M0 bytes as float32 scales ``[..., groups]`` for codes shaped
    like ``q``: each group's byte gathered from its place in the 128x4 tiles."""
    geometry = Geometry(tuple(q_info.shape), group_size, SCALE_LAYOUTS[BLOCKED], False)
    if tuple(s_info.shape) != geometry.scale_shape:
        raise ValueError(
            f"scales: blocked scales for q of shape {tuple(q_info.shape)} (G={group_size}) have "
            f"shape {geometry.scale_shape}, got {tuple(s_info.shape)}"
        )
    offsets = geometry.scale_byte_offsets().reshape(-1)
    shape = tuple(q_info.shape[:-1]) + (geometry.groups,)
    if s_info.kind == TORCH:
        import torch

        flat = scales.contiguous().reshape(-1)
        codes = flat[torch.from_numpy(offsets).to(flat.device)].to(torch.int32)
        bits = torch.where(codes == 0, 0x00400000, codes << 23)
        return torch.where(codes == 255, 0x7FC00000, bits).view(torch.float32).reshape(shape)
    xp = _namespace(s_info)
    codes = xp.ascontiguousarray(scales).reshape(-1)[xp.asarray(offsets)].astype(xp.uint32)
    bits = xp.where(codes == 0, xp.uint32(0x00400000), codes << 23)
    bits = xp.where(codes == 255, xp.uint32(0x7FC00000), bits)
    return xp.ascontiguousarray(bits).view(xp.float32).reshape(shape)


def _check_packed_width(packed, info: ArrayInfo, groups: int, group_size: int) -> None:
    """Packed scales must hold exactly ``groups`` exponents a row: ceil(groups / 4) words, and
    zero bytes after the last group (the kernel writes zeros there), so scales quantized with
    another group size are refused rather than misread."""
    words = -(-groups // 4)
    if info.shape and info.shape[-1] != words:
        raise ValueError(
            f"scales: {info.shape[-1]} packed words a row, but group_size={group_size} gives "
            f"{groups} groups in {words} word(s): were they quantized with another group_size?"
        )
    if groups % 4 and 0 not in info.shape:
        spare = (packed[..., -1] >> (8 * (groups % 4))) & ((1 << (32 - 8 * (groups % 4))) - 1)
        if bool((spare != 0).any()):
            raise ValueError(
                f"scales: the last packed word holds exponents past group {groups}: quantized "
                f"with a smaller group_size than {group_size}?"
            )


def as_float8(q, dtype: OutputDType = "e4m3"):
    """Reinterpret uint8 codes as a float8 dtype without copying.

    numpy: an ``ml_dtypes.float8_*`` view. torch: a ``torch.float8_*`` view. cupy has no float8
    dtype: a torch view of the same memory is returned through DLPack (torch must be installed).
    """
    fmt = output_format(dtype)
    if not fmt.is_float8:
        raise ValueError(f"dtype: expected a float8 format, got {dtype!r}")
    info = describe(q, "q")
    if info.dtype not in ("uint8", fmt.dtype_name):
        raise TypeError(f"q: expected uint8 codes, got {info.dtype}")
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
    return q.view(getattr(sys.modules["torch"], fmt.dtype_name))


def _namespace(info: ArrayInfo):
    if info.kind == CUPY:
        import cupy

        return cupy
    return np


# compile the production kernel when the package is imported on a GPU machine ---------------------


def _compile_on_import() -> None:
    """NVRTC into the disk cache for the visible devices' architectures; no CUDA context is
    created and no device selected (modules load at first use, or through ``warmup``)."""
    if not _settings.compile_on_import():
        return
    _jit.precompile(_plan.SOURCE, [key.name_expression for key in _plan.DEFAULT_KEYS])


_compile_on_import()
