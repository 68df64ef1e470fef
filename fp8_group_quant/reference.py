"""The NumPy backend: SPEC sections 3 and 4, vectorised, in float32.

This is the oracle for every test and benchmark and the backend for NumPy inputs. Every CUDA
kernel matches it bit for bit.
"""

from __future__ import annotations

import numpy as np

from ._layout import GROUPS_PER_WORD, PACKED_LAYOUTS, Geometry
from ._spec import UE8M0_FLOOR, OutputFormat

__all__ = ["quantize_groups", "encode", "ue8m0_exponents", "quantize_into"]

_ABS_MASK = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)


def ue8m0_exponents(y: np.ndarray) -> np.ndarray:
    """Exponent byte of the smallest power of two >= max(y, 1e-10) (SPEC 3.3), as uint32."""
    bits = np.maximum(y, UE8M0_FLOOR).astype(np.float32).view(np.uint32)
    return (bits >> 23) + ((bits & 0x7FFFFF) != 0)


def encode(t: np.ndarray, values: np.ndarray, fmt: OutputFormat) -> np.ndarray:
    """Codes (uint8 bytes) of the scaled values ``t``; ``values`` are the inputs they came from."""
    with np.errstate(invalid="ignore"):
        clamped = np.clip(t, -fmt.fmax, fmt.fmax)
        if fmt.is_float8:
            codes = clamped.astype(fmt.numpy_dtype).view(np.uint8)
        else:
            codes = np.rint(np.nan_to_num(clamped, nan=0.0)).astype(np.int8).view(np.uint8)
    bits = values.view(np.uint32)
    magnitude = bits & _ABS_MASK
    sign = ((bits >> 24) & 0x80).astype(np.uint8) if fmt.signed_nan else np.uint8(0)
    codes = np.where(magnitude > _INF_BITS, np.uint8(fmt.nan_code) | sign, codes)
    if fmt.keeps_inf:
        codes = np.where(magnitude == _INF_BITS, np.uint8(fmt.inf_code) | sign, codes)
    return codes.astype(np.uint8)


def quantize_groups(values: np.ndarray, fmt: OutputFormat, ue8m0: bool, eps: float):
    """Quantize groups along the last axis of float32 ``values`` [..., G].

    Returns ``(codes uint8 [..., G], scales float32 [...], exponents uint32 [...] or None)``.
    """
    values = np.ascontiguousarray(values, dtype=np.float32)
    magnitude = values.view(np.uint32) & _ABS_MASK
    finite = np.where(magnitude < _INF_BITS, magnitude, np.uint32(0)).view(np.float32)
    amax = np.maximum(finite.max(axis=-1, initial=np.float32(0)), np.float32(eps))
    y = (amax / np.float32(fmt.fmax)).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if ue8m0:
            exponents = ue8m0_exponents(y)
            scales = (exponents << 23).view(np.float32)
            inverse = ((np.uint32(254) - exponents) << 23).view(np.float32)
            t = values * inverse[..., None]
        else:
            exponents = None
            scales = y
            t = values / scales[..., None]
    return encode(t, values, fmt), scales, exponents


def quantize_into(
    x: np.ndarray,
    geometry: Geometry,
    fmt: OutputFormat,
    ue8m0: bool,
    eps: float,
    q_storage: np.ndarray,
    scale_storage: np.ndarray,
) -> None:
    """Quantize host ``x`` into flat storages laid out by ``geometry``, padding included.

    ``q_storage`` is uint8 of ``geometry.q_storage`` bytes; ``scale_storage`` is float32 or int32
    of ``geometry.scale_storage`` elements. Padding is written as zero.
    """
    b, m, ng, g = geometry.batches, geometry.rows, geometry.groups, geometry.group_size
    values = np.asarray(x).astype(np.float32).reshape(b, m, ng, g)
    codes, scales, exponents = quantize_groups(values, fmt, ue8m0, eps)

    q = q_storage.reshape(b, geometry.q_rows, geometry.k)
    q[:, :m] = codes.reshape(b, m, geometry.k)
    q[:, m:] = 0

    if geometry.layout in PACKED_LAYOUTS:
        data = np.zeros((b, m, geometry.packed_words * GROUPS_PER_WORD), np.uint8)
        data[..., :ng] = exponents
        data = data.view("<i4").astype(np.int32)  # byte g % 4 of word g // 4, little end first
    else:
        data = scales
    scale_storage[...] = 0
    batch, row, column = geometry.scale_kernel_strides
    itemsize = scale_storage.itemsize
    view = np.lib.stride_tricks.as_strided(
        scale_storage,
        shape=(b, m, geometry.scale_columns),
        strides=(batch * itemsize, row * itemsize, column * itemsize),
    )
    view[...] = data
