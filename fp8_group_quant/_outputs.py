"""The outputs of a request: their specs, and the checks of a caller's ``out`` / ``scale_out``.

A caller's buffer is accepted only if the storage the layout owns (padding included) lies
inside the view's own extent, or past it only as far as a buffer that ends where the storage
ends, and overlaps neither the input nor the other output; every backend (NumPy, torch CPU,
GPU) runs the same checks before it writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ._arrays import CUPY, NUMPY, ArrayInfo, allocation_bytes, byte_extent, describe
from ._layout import Geometry
from ._request import VECTOR_ALIGNMENT, Request, WeightRequest
from ._spec import FORMATS_BY_DTYPE


@dataclass(frozen=True)
class OutputSpec:
    """An output array: shape, strides (elements), storage owned (elements), dtype."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage: int
    dtype: str  # the library's dtype name: float8_e4m3fn, int8, int32, float32, uint8
    container: str  # the dtype that holds it where the library lacks it (cupy: uint8 for float8)

    @property
    def numpy_dtype(self) -> np.dtype:
        fmt = FORMATS_BY_DTYPE.get(self.dtype)
        return fmt.numpy_dtype if fmt is not None else np.dtype(self.dtype)

    def allocation(self, kind: str) -> tuple:
        """(shape, strides, storage, dtype name) as the allocators in _arrays take them."""
        dtype = self.container if kind == CUPY else self.dtype
        return self.shape, self.strides, self.storage, dtype


class BothOrientations(NamedTuple):
    """What ``quantize(..., orientation="both")`` returns (docs/spec.md, section 4d): the
    row-wise codes and scales of ``x [M, K]`` and the column-wise ones of ``x`` transposed
    (TransformerEngine's row-wise and column-wise data and scales). Unpacks as four."""

    q: Any  # [M, K], groups of G channels
    scales: Any  # the layout asked for, over [M, K / G]
    qt: Any  # [K, M], groups of G tokens
    scales_t: Any  # the layout asked for, over [K, ceil(M / G)]


def _scale_spec(g: Geometry, dtype: str | None = None) -> OutputSpec:
    dtype = dtype or g.layout.dtype
    return OutputSpec(g.scale_shape, g.scale_strides, g.scale_storage, dtype, dtype)


def transposed_specs(request: Request) -> tuple[OutputSpec, OutputSpec]:
    """(qt, scales_t): the column-wise result of ``request``."""
    m, k = request.input_shape
    fmt = request.fmt
    assert fmt is not None
    q = OutputSpec((k, m), (m, 1), k * m, fmt.dtype_name, fmt.container)
    return q, _scale_spec(request.transposed)


def weight_specs(request: WeightRequest) -> tuple[OutputSpec, OutputSpec]:
    """(q, scales) of a ``quantize_weight`` request."""
    g, fmt = request.output, request.options.fmt
    q = OutputSpec(g.shape, g.q_strides, g.batches * g.n * g.k, fmt.dtype_name, fmt.container)
    return q, _scale_spec(g.scales, g.scale_dtype)


def specs(request: Request) -> tuple[OutputSpec, OutputSpec]:
    """(q, scales) of ``request``."""
    g = request.output
    scales = _scale_spec(g)
    if request.fp4 is not None:  # e2m1 codes, two a byte; no padding rows
        shape = (*g.shape[:-1], g.k // 2)
        strides = tuple(s // 2 for s in g.q_strides[:-1]) + (1,)
        return OutputSpec(shape, strides, g.rows * g.batches * g.k // 2, "uint8", "uint8"), scales
    fmt = request.fmt
    assert fmt is not None
    q = OutputSpec(g.shape, g.q_strides, g.q_storage, fmt.dtype_name, fmt.container)
    return q, scales


def check_outputs_taken(options, out, scale_out) -> None:
    """NVFP4 allocates its outputs: a given ``out`` or ``scale_out`` is refused."""
    if options.nvfp4:
        for given, name in ((out, "out"), (scale_out, "scale_out")):
            if given is not None:
                raise ValueError(f"{name}: not supported with dtype='e2m1' (NVFP4)")


def _same_strides(shape, got, expected) -> bool:
    """Strides agree where they matter: an empty array has none that do."""
    return 0 in shape or all(n <= 1 or g == e for n, g, e in zip(shape, got, expected))


def check_output(given, name: str, x_info: ArrayInfo, spec: OutputSpec) -> ArrayInfo:
    """The description of a caller's output, checked against ``spec`` and ``x_info``."""
    info = describe(given, name)
    if info.kind != x_info.kind:
        raise TypeError(f"{name}: expected a {x_info.kind} array like x, got a {info.kind} one")
    if info.device != x_info.device:
        raise ValueError(
            f"{name}: expected device {x_info.device} like x, got device {info.device}"
        )
    if info.dtype != spec.dtype and info.dtype != spec.container:
        allowed = dict.fromkeys((spec.dtype, spec.container))
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
        return info
    # NOTES: codes are stored 16 bytes at a time (q, and each orientation's codes: "out[i]");
    # the blocked layout's padding is zeroed with 4- and 16-byte stores on the GPU
    vector = name.split("[")[0] == "out" or (info.kind != NUMPY and spec.dtype == "uint8")
    if vector and info.ptr % VECTOR_ALIGNMENT:
        raise ValueError(
            f"{name}: expected a {VECTOR_ALIGNMENT}-byte aligned pointer, got {info.ptr:#x}"
        )
    if info.ptr % info.itemsize:
        raise ValueError(f"{name}: pointer {info.ptr:#x} is not aligned to its item size")
    _check_room(info, name, spec.storage * info.itemsize)
    return info


def _check_room(info: ArrayInfo, name: str, need: int) -> None:
    """Raise unless the ``need`` bytes the layout writes from the first element (padding
    included) are the caller's: inside the view's own extent, or past it (a padded layout's
    last padding rows lie after its last real row) only up to the end of a buffer that ends
    where the layout's storage ends, so that no byte of a neighbour is written."""
    have, rounding = allocation_bytes(info)
    holds = f"{have} bytes" if have is not None else "an unknown number of bytes"
    if have is not None and have < need:
        raise ValueError(
            f"{name}: the layout owns {need} bytes of storage (padding included) from the first "
            f"element, but the allocation holds {holds}"
        )
    extent = byte_extent(info.ptr, info.shape, info.strides, info.itemsize)[1] - info.ptr
    if extent < need and (have is None or have - need >= rounding):
        raise ValueError(
            f"{name}: the layout owns {need} bytes of storage (padding included) from the first "
            f"element; the view covers {extent} and its buffer holds {holds}, so the padding "
            f"after the view would land on memory that may hold other data: give a view of a "
            f"buffer of exactly {need} bytes, or let quantize allocate"
        )


def check_disjoint(x_info: ArrayInfo, x_ptr: int, outputs) -> None:
    """Raise if an output's storage overlaps the input or the other output.

    NOTES: the kernel reads x while it writes q and the scales; a shared byte is a race on the
    GPU and a wrong answer on the host. An output's extent is the storage its layout owns
    (padding included), the input's the bytes its view touches. ``outputs``: (name, info,
    spec) of each output the caller gave.
    """
    ranges = [("x", byte_extent(x_ptr, x_info.shape, x_info.strides, x_info.itemsize))]
    for name, info, spec in outputs:
        ranges.append((name, (info.ptr, info.ptr + spec.storage * info.itemsize)))
    _check_ranges(ranges, 1)


def check_writes(reads, writes) -> None:
    """Raise if a written array (``writes``: name, ArrayInfo) overlaps any other array, read
    (``reads``: name, ArrayInfo; reads may share memory with each other) or written."""
    ranges = [(name, byte_extent(a.ptr, a.shape, a.strides, a.itemsize)) for name, a in reads]
    ranges += [(name, byte_extent(a.ptr, a.shape, a.strides, a.itemsize)) for name, a in writes]
    _check_ranges(ranges, len(reads), message="{b}: its memory overlaps {a}'s")


def _check_ranges(ranges, reads: int, message: str = "{b}: its storage overlaps {a}'s memory"):
    """Raise on the first two (name, (start, end)) ranges that overlap, but for two of the
    first ``reads``, which are only read and may share memory."""
    for i, (name_a, (a0, a1)) in enumerate(ranges):
        for j in range(i + 1, len(ranges)):
            name_b, (b0, b1) = ranges[j]
            if a0 < b1 and b0 < a1 and j >= reads:
                raise ValueError(message.format(a=name_a, b=name_b))


def oriented_names(both: bool) -> tuple:
    """((row q, row scales), (col q, col scales)): how an oriented call's outputs are named in
    messages, as the caller gave them (a pair's items for "both", the arrays for "col")."""
    if both:
        return ("out[0]", "scale_out[0]"), ("out[1]", "scale_out[1]")
    return (None, None), ("out", "scale_out")


def output_pair(given, name: str, both: bool) -> tuple:
    """(row, col) outputs of an oriented call: "both" takes a pair (either may be None),
    "col" one array (its column-wise result)."""
    if not both:
        return None, given
    if given is None:
        return None, None
    if not isinstance(given, tuple) or len(given) != 2:
        raise TypeError(
            f"{name}: orientation='both' takes a pair (row-wise, column-wise) of arrays or "
            f"None, got {type(given).__name__}"
        )
    return given
