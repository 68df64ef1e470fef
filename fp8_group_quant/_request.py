"""Validate a call once, into a frozen ``Request`` that every backend reads.

The plan cache, the NumPy backend and the launch layer all take a ``Request``; nothing below
this module checks an argument again. Input geometry (dtype, shape, strides) and output geometry
(``Geometry``: q and the scales) are separate, so an input mode whose output shape differs from
its input (a fused SiLU-and-multiply halves K) changes ``output_shape`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ._abi import LANE_BYTES, MAX_NORM_LANES
from ._arrays import NUMPY, ArrayInfo
from ._layout import Geometry, ScaleLayout, combination_error, row_strides, scale_layout
from ._plan import KernelKey, grid_limits_error, max_experts
from ._spec import (
    INPUT_TYPES,
    InputMode,
    OutputFormat,
    ScaleFormat,
    check_eps,
    check_flag,
    check_group_size,
    check_scale_rule,
    input_mode,
    output_format,
    scale_format,
)

VECTOR_ALIGNMENT = 16  # bytes: the kernel's vector loads and q's 16-byte stores


@dataclass(frozen=True)
class Request:
    """One validated call: what to read, what to compute, where to write."""

    input_dtype: str  # a key of INPUT_TYPES
    input_shape: tuple[int, ...]
    x_batch_stride: int  # elements
    x_row_stride: int  # elements
    x_aligned: bool  # base and strides allow 16-byte vector loads
    fmt: OutputFormat
    scale: ScaleFormat
    layout: ScaleLayout
    mode: InputMode
    group_size: int
    eps: float
    pad_rows: bool
    masked: str | None = None  # masked layout: the dtype of masked_m (int32 or int64)
    expected_m: int | None = None  # masked layout: rows per expert the grid is sized for
    scale_rule: str = "rceil"  # UE8M0 exponent rule: "rceil" or "floor" (OCP MX)
    norm: bool = False  # fused RMSNorm: the weight and (optionally) residual pointers per call
    eps_norm: float = 0.0  # fused RMSNorm: float32 eps_norm
    residual: bool = False  # fused add-RMSNorm: a residual is read and written back
    r_batch_stride: int = 0  # residual elements between batches
    r_row_stride: int = 0  # residual elements between rows

    @cached_property
    def output(self) -> Geometry:
        return Geometry(output_shape(self.mode, self.input_shape), self.group_size, self.layout,
                        self.pad_rows)  # fmt: skip

    def kernel_key(self) -> KernelKey:
        return KernelKey(
            self.input_dtype,
            self.group_size,
            self.fmt.name,
            self.scale.name,
            self.layout.kernel_trait,
            self.x_aligned,
            activation=self.mode.name,
            masked=self.masked is not None,
            norm=self.norm,
        )

    @property
    def x_up_offset(self) -> int:
        """Elements from a gate value to its up value (SiLU-and-multiply), else 0."""
        return self.output.k if self.mode.width_factor == 2 else 0


def output_shape(mode: InputMode, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of q for an input of ``input_shape`` in ``mode``."""
    if not input_shape:
        return tuple(input_shape)
    return (*input_shape[:-1], input_shape[-1] // mode.width_factor)


def check_options(group_size, dtype, scale, layout, eps, pad_rows, activation=None):
    """(group size, format, scale format, layout, eps, pad_rows, input mode), each checked."""
    group_size = check_group_size(group_size)
    fmt = output_format(dtype)
    scale = scale_format(scale)
    layout = scale_layout(layout)
    error = combination_error(fmt, scale, layout)
    if error:
        raise ValueError(error)
    eps = check_eps(eps)
    pad_rows = check_flag(pad_rows, "pad_rows")
    mode = input_mode(activation)
    return group_size, fmt, scale, layout, eps, pad_rows, mode


def make_request(
    info: ArrayInfo,
    group_size,
    dtype,
    scale,
    layout,
    eps,
    pad_rows,
    activation=None,
    scale_rule="rceil",
    masked_info: ArrayInfo | None = None,
    expected_m=None,
    norm: tuple | None = None,
) -> Request:
    """Check every argument of a call on ``info`` (the input) and return its Request.

    ``masked_info`` describes ``masked_m`` for the masked MoE layout; ``norm`` is (weight
    info, eps_norm, residual info or None) for the fused RMSNorm. Raises TypeError or
    ValueError naming the argument; nothing has been launched or written.
    """
    group_size, fmt, scale, layout, eps, pad_rows, mode = check_options(
        group_size, dtype, scale, layout, eps, pad_rows, activation
    )
    scale_rule = check_scale_rule(scale_rule, fmt, scale)
    if info.dtype not in INPUT_TYPES:
        raise TypeError(f"x: expected {', '.join(INPUT_TYPES)}, got {info.dtype}")
    if len(info.shape) == 0:
        raise ValueError("x: expected at least one dimension [..., K], got a scalar")
    k = info.shape[-1]
    if mode.width_factor == 2 and k % (2 * group_size):
        raise ValueError(
            f"x: activation={mode.name!r} reads gate and up halves [..., 2N] with N a multiple "
            f"of group_size={group_size}; the last dimension {k} is not a multiple of "
            f"{2 * group_size}"
        )
    if k % group_size:
        raise ValueError(
            f"x: the last dimension K={k} is not a multiple of group_size={group_size}"
        )
    shape = tuple(info.shape)
    strides = (0, k)
    empty = 0 in shape
    if not empty:
        if k > 1 and info.strides[-1] != 1:
            raise ValueError(
                f"x: the last dimension must be contiguous (stride 1), got strides {info.strides}"
            )
        collapsed = row_strides(shape, tuple(info.strides))
        if collapsed is None:
            raise ValueError(
                f"x: the dimensions between the batch and K must collapse into one row stride; "
                f"got shape {shape} with strides {tuple(info.strides)} (make it contiguous first)"
            )
        strides = collapsed
    batch_stride, row_stride = strides
    geometry = Geometry(output_shape(mode, shape), group_size, layout, pad_rows)
    aligned = (
        info.ptr % VECTOR_ALIGNMENT == 0
        and (geometry.rows <= 1 or row_stride * info.itemsize % VECTOR_ALIGNMENT == 0)
        and (geometry.batches <= 1 or batch_stride * info.itemsize % VECTOR_ALIGNMENT == 0)
    )
    masked = _check_masked(info, masked_info, expected_m)
    norm_fields = {}
    if norm is not None:
        norm_fields = _check_norm(info, *norm)
    fused = mode.name if mode.name is not None else ("masked_m" if masked else None)
    if norm is not None:
        fused = "norm"
    if info.kind != NUMPY and not empty:
        error = grid_limits_error(geometry, info.itemsize, fused)
        if error:
            raise ValueError(error)
        if mode.name is not None and not masked and max(map(abs, strides)) >= 2**31:
            raise ValueError(
                f"x: activation={mode.name!r} takes row and batch strides of fewer than 2**31 "
                f"elements (its one-pass kernel indexes x in 32 bits); got {strides}: pass a "
                f"contiguous copy"
            )
        if fused is not None and not aligned:
            what = f"activation={mode.name!r}" if mode.name is not None else fused
            raise ValueError(
                f"x: {what} needs a 16-byte aligned input (base, row and batch strides); got "
                f"address {info.ptr:#x}, strides {tuple(info.strides)} ({info.itemsize}-byte "
                f"elements): pass a contiguous copy"
            )
    return Request(
        info.dtype, shape, batch_stride, row_stride, aligned, fmt, scale, layout, mode,
        group_size, eps, pad_rows, masked, None if expected_m is None else int(expected_m),
        scale_rule, **norm_fields,
    )  # fmt: skip


def _check_norm(info: ArrayInfo, weight: ArrayInfo, eps_norm, residual: ArrayInfo | None) -> dict:
    """The Request fields of a valid fused RMSNorm on input ``info``."""
    k = info.shape[-1]
    if weight.kind != info.kind or weight.device != info.device:
        raise ValueError(
            f"norm: the weight must be an array of x's library on x's device ({info.kind}, "
            f"device {info.device}), got {weight.kind} on device {weight.device}"
        )
    if weight.dtype != info.dtype or tuple(weight.shape) != (k,):
        raise ValueError(
            f"norm: the weight must be a {info.dtype} array of shape ({k},) like x's rows, got "
            f"{weight.dtype} of shape {tuple(weight.shape)}"
        )
    eps_value = np.float32(eps_norm) if isinstance(eps_norm, (int, float, np.floating)) else None
    if isinstance(eps_norm, bool) or eps_value is None or not (np.isfinite(eps_value)
                                                              and eps_value > 0):  # fmt: skip
        raise ValueError(f"norm: eps_norm must be a positive finite float, got {eps_norm!r}")
    row_bytes = MAX_NORM_LANES * LANE_BYTES
    if k * info.itemsize > row_bytes:
        raise ValueError(
            f"x: norm takes rows of at most {row_bytes // info.itemsize} {info.dtype} values "
            f"(one thread block a row), got K={k}"
        )
    device = info.kind != NUMPY
    if device and k > 1 and weight.strides[0] != 1:
        raise ValueError(f"norm: the weight must be contiguous, got stride {weight.strides[0]}")
    if device and weight.ptr % VECTOR_ALIGNMENT:
        raise ValueError(
            f"norm: the weight must be 16-byte aligned, got address {weight.ptr:#x}: pass a "
            f"contiguous copy"
        )
    fields = {"norm": True, "eps_norm": float(eps_value)}
    if residual is None:
        return fields
    if residual.kind != info.kind or residual.device != info.device:
        raise ValueError(
            f"residual: expected an array of x's library on x's device ({info.kind}, device "
            f"{info.device}), got {residual.kind} on device {residual.device}"
        )
    if residual.dtype != info.dtype or tuple(residual.shape) != tuple(info.shape):
        raise ValueError(
            f"residual: expected a {info.dtype} array of x's shape {tuple(info.shape)}, got "
            f"{residual.dtype} of shape {tuple(residual.shape)}"
        )
    fields["residual"] = True
    if not device or 0 in info.shape:
        return fields
    collapsed = None
    if k == 1 or residual.strides[-1] == 1:
        collapsed = row_strides(tuple(residual.shape), tuple(residual.strides))
    if collapsed is None:
        raise ValueError(
            f"residual: the last dimension must be contiguous and the others collapse into one "
            f"row stride, got strides {tuple(residual.strides)} (make it contiguous first)"
        )
    batch_stride, row_stride = collapsed
    geometry = Geometry(tuple(info.shape), 32, scale_layout("row"), False)  # batches, rows
    # NOTES: the kernel writes the residual back, one block a row: rows that share bytes (a
    # broadcast or overlapping view) would race, so each row and batch must own its bytes;
    # rows or batches in reverse order (negative strides) own theirs as well
    rows, batches = geometry.rows, geometry.batches
    if (rows > 1 and abs(row_stride) < k) or (
        batches > 1 and abs(batch_stride) < (rows - 1) * abs(row_stride) + k
    ):
        raise ValueError(
            f"residual: its rows overlap (strides {tuple(residual.strides)} for shape "
            f"{tuple(residual.shape)}); the fused add writes every row back: pass a separate "
            f"array for each row"
        )
    size = residual.itemsize
    if (
        residual.ptr % VECTOR_ALIGNMENT
        or (geometry.rows > 1 and row_stride * size % VECTOR_ALIGNMENT)
        or (geometry.batches > 1 and batch_stride * size % VECTOR_ALIGNMENT)
    ):
        raise ValueError(
            f"residual: needs a 16-byte aligned array (base, row and batch strides); got "
            f"address {residual.ptr:#x}, strides {tuple(residual.strides)}: pass a contiguous copy"
        )
    fields.update(r_batch_stride=batch_stride, r_row_stride=row_stride)
    return fields


def _check_masked(info: ArrayInfo, masked: ArrayInfo | None, expected_m) -> str | None:
    """The dtype of a valid ``masked_m`` for input ``info`` (None without one)."""
    if masked is None:
        if expected_m is not None:
            raise ValueError("expected_m: a hint for the masked layout; pass masked_m too")
        return None
    if len(info.shape) != 3:
        raise ValueError(f"x: masked_m needs x of shape [E, T, K], got shape {tuple(info.shape)}")
    experts, tokens = info.shape[0], info.shape[1]
    if masked.kind != info.kind or masked.device != info.device:
        where = f"{masked.kind} on device {masked.device}"
        raise ValueError(
            f"masked_m: expected an array of x's library on x's device ({info.kind}, device "
            f"{info.device}), got {where}"
        )
    if masked.dtype not in ("int32", "int64"):
        raise TypeError(f"masked_m: expected int32 or int64 counts, got {masked.dtype}")
    if tuple(masked.shape) != (experts,):
        raise ValueError(f"masked_m: expected shape ({experts},), one count per expert, got "
                         f"{tuple(masked.shape)}")  # fmt: skip
    if experts > 1 and masked.strides[0] != 1:
        raise ValueError(f"masked_m: expected a contiguous array, got strides {masked.strides}")
    if experts > max_experts():
        raise ValueError(f"x: masked_m takes at most {max_experts()} experts, got {experts}")
    if expected_m is not None and (
        isinstance(expected_m, bool) or not isinstance(expected_m, int | np.integer)
        or not 0 <= expected_m <= tokens
    ):  # fmt: skip
        raise ValueError(f"expected_m: expected an int in [0, {tokens}], got {expected_m!r}")
    return masked.dtype
