"""The NumPy backend: docs/spec.md sections 3 to 6 (4a NVFP4, 4b MXFP4), vectorised, in float32,
and the upstream kernels' arithmetic the drop-ins take (3a, 3b, 3c, 4a's "reciprocal").

This is the oracle for every test and benchmark and the backend for NumPy inputs. Every CUDA
kernel matches it bit for bit. Formats come from ``_spec.OUTPUT_FORMATS`` and scale layouts
write through their address map (``Geometry.scale_byte_offsets``), as the kernel does.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ._layout import Geometry
from ._spec import (
    FP4_FORMATS,
    UE8M0_FLOOR,
    OutputFormat,
    ScaleFormat,
    output_format,
    scale_format,
)

__all__ = [
    "quantize_groups", "encode", "ue8m0_exponents", "floor_exponents", "quantize_into",
    "quantize_into_masked", "nvfp4_global_scale", "nvfp4_groups", "mxfp4_groups", "pack_e2m1",
    "store_scales", "quantize_blocks", "quantize_token_groups", "unfloored_groups",
    "fp4_reciprocal_groups", "float_scales",
]  # fmt: skip

_ABS_MASK = np.uint32(0x7FFFFFFF)
_INF_BITS = np.uint32(0x7F800000)
_SIGN_BITS = np.uint32(0x80000000)


def ue8m0_exponents(y: np.ndarray) -> np.ndarray:
    """Exponent byte of the smallest power of two >= max(y, 1e-10), as uint32."""
    bits = np.maximum(y, UE8M0_FLOOR).astype(np.float32).view(np.uint32)
    return (bits >> 23) + ((bits & 0x7FFFFF) != 0)


def floor_exponents(amax: np.ndarray, emax_elem: int) -> np.ndarray:
    """scale_rule="floor" (OCP MX v1.0): the biased exponent of ``amax`` (positive, normal)
    minus ``emax_elem``, at least 1 (the scale stays a normal float32), as uint32."""
    biased = (np.asarray(amax, np.float32).view(np.uint32) >> 23).astype(np.int64)
    return np.maximum(biased - emax_elem, 1).astype(np.uint32)


def rule_exponents(amax: np.ndarray, fmax, emax_elem, rule: str) -> np.ndarray:
    """The UE8M0 exponent bytes (uint32) of section 3 for float32 ``amax`` (eps applied) and a
    format's ``fmax``: the exact ceiling of ``amax / fmax`` ("rceil") or the "floor" rule."""
    if rule == "floor":
        return floor_exponents(amax, emax_elem)
    return ue8m0_exponents((amax / np.float32(fmax)).astype(np.float32))


def finite_amax(values: np.ndarray) -> np.ndarray:
    """The largest ``|v|`` over the finite float32 ``values`` along the last axis (0 if none)."""
    magnitude = values.view(np.uint32) & _ABS_MASK
    finite = np.where(magnitude < _INF_BITS, magnitude, np.uint32(0)).view(np.float32)
    return finite.max(axis=-1, initial=np.float32(0))


def encode(t: np.ndarray, values: np.ndarray, fmt: OutputFormat) -> np.ndarray:
    """Codes (uint8 bytes) of the scaled values ``t``; ``values`` are the inputs they came from."""
    with np.errstate(invalid="ignore"):
        clamped = np.clip(t, -fmt.fmax, fmt.fmax)
        if fmt.is_float8:
            # ml_dtypes rounds to nearest even; formats without -0 (fnuz) give +0 for it
            codes = clamped.astype(fmt.numpy_dtype).view(np.uint8)
        else:
            codes = np.rint(np.nan_to_num(clamped, nan=0.0)).astype(np.int8).view(np.uint8)
    bits = values.view(np.uint32)
    magnitude = bits & _ABS_MASK
    # +NaN, -NaN, +Inf, -Inf: the same table the kernel reads (Params.nonfinite_codes)
    which = np.where(magnitude == _INF_BITS, 2, 0) + ((bits & _SIGN_BITS) != 0)
    table = np.array(fmt.nonfinite_codes, np.uint8)
    return np.where(magnitude >= _INF_BITS, table[which], codes).astype(np.uint8)


def quantize_groups(
    values: np.ndarray, fmt, scale, eps: float, rule: str = "rceil", arithmetic: str = "float32"
):
    """Quantize groups along the last axis of float32 ``values`` [..., G].

    ``fmt`` and ``scale`` are formats or their names; ``rule`` the UE8M0 exponent rule;
    ``arithmetic`` "float32" (section 3), "bfloat16" (section 3a, ``bfloat16_groups``),
    "unfloored" (section 3b, ``unfloored_groups``; ``eps`` and ``rule`` do not apply), or with
    float scales "reciprocal" or "multiplier" (section 3c: a product in place of the division).
    Returns ``(codes uint8 [..., G], scales float32 [...], exponents uint32 [...] or None)``.
    """
    fmt, scale = output_format(fmt), scale_format(scale)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if arithmetic == "bfloat16":
        return bfloat16_groups(values, fmt, scale.power_of_two, eps)
    if arithmetic == "unfloored":
        return unfloored_groups(values, fmt)
    amax = np.maximum(finite_amax(values), np.float32(eps))
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if scale.power_of_two:
            exponents = rule_exponents(amax, fmt.fmax, fmt.emax_elem, rule)
            scales = (exponents << 23).view(np.float32)
            inverse = ((np.uint32(254) - exponents) << 23).view(np.float32)
            t = values * inverse[..., None]
        else:
            exponents = None
            scales, factors = float_scales(amax, fmt.fmax, arithmetic)
            t = values / scales[..., None] if factors is None else values * factors[..., None]
    return encode(t, values, fmt), scales, exponents


def float_scales(amax: np.ndarray, fmax, arithmetic: str = "float32"):
    """(float32 scales, float32 factors or None) of the maxima ``amax`` (eps applied): section
    3's ``amax / fmax`` and no factor (the values are divided by the scale), or section 3c's
    "reciprocal" (the scale ``RN(amax * RN(1 / fmax))`` and the factor ``RN(1 / s)``) or
    "multiplier" (the factor ``RN(fmax / amax)`` and the scale ``RN(1 / factor)``)."""
    one, fmax = np.float32(1), np.float32(fmax)
    if arithmetic == "multiplier":
        factors = (fmax / amax).astype(np.float32)
        return (one / factors).astype(np.float32), factors
    if arithmetic == "reciprocal":
        scales = (amax * (one / fmax)).astype(np.float32)
        return scales, (one / scales).astype(np.float32)
    return (amax / fmax).astype(np.float32), None


def quantize_blocks(values: np.ndarray, fmt, scale, eps: float, rule: str = "rceil",
                    block: int = 128, arithmetic: str = "float32"):  # fmt: skip
    """Quantize ``[B, N, K]`` float32 ``values`` in blocks of ``block`` x ``block`` (section 4c):
    each block's values are one group of ``quantize_groups`` (by its ``arithmetic``). A partial
    edge block is padded with zeros, which never raise a maximum floored at ``eps``. Returns
    ``(codes uint8 [B, N, K], scales float32 [B, nb, kb], exponents uint32 [B, nb, kb] or
    None)``."""
    b, n, k = values.shape
    nb, kb = -(-n // block), -(-k // block)
    padded = np.zeros((b, nb * block, kb * block), np.float32)
    padded[:, :n, :k] = values
    tiles = padded.reshape(b, nb, block, kb, block).transpose(0, 1, 3, 2, 4)
    codes, scales, exponents = quantize_groups(
        tiles.reshape(b, nb, kb, block * block), fmt, scale, eps, rule, arithmetic
    )
    codes = codes.reshape(b, nb, kb, block, block).transpose(0, 1, 3, 2, 4)
    return codes.reshape(b, nb * block, kb * block)[:, :n, :k], scales, exponents


def quantize_token_groups(values: np.ndarray, fmt, scale, eps: float, rule: str, group: int,
                          arithmetic: str = "float32"):  # fmt: skip
    """The column-wise result of float32 ``values [M, K]`` (section 4d): each channel's runs of
    ``group`` consecutive tokens are groups (of ``quantize_groups``, by its ``arithmetic``), the
    last one partial where ``group`` does not divide ``M`` (zero-padded, as for weight blocks).
    Returns ``(codes uint8 [K, M], scales float32 [K, cg], exponents uint32 [K, cg] or
    None)``."""
    m, k = values.shape
    groups = -(-m // group)
    padded = np.zeros((groups * group, k), np.float32)
    padded[:m] = values
    codes, scales, exponents = quantize_groups(padded.T.reshape(k, groups, group), fmt, scale,
                                               eps, rule, arithmetic)  # fmt: skip
    return codes.reshape(k, groups * group)[:, :m], scales, exponents


def _bf16(values) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest even) and back, exactly."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def bfloat16_groups(values: np.ndarray, fmt: OutputFormat, power_of_two: bool, eps: float):
    """Section 3a (vLLM's masked SiLU kernel): the maximum, scale, reciprocal and scaled values
    each rounded to bfloat16; a power-of-two scale is ``2^ceil(bf16(log2(s)))``, no 1e-10 floor.
    ``values`` are bfloat16 values as float32 [..., G]; returns what quantize_groups does."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        amax = np.maximum(finite_amax(values), _bf16(np.float32(eps)))
        scales = _bf16(amax * _bf16(np.float32(1) / np.float32(fmt.fmax)))
        exponents = None
        if power_of_two:
            # log2 of a bfloat16 value lies at least 8e-4 from the rounding boundaries that move
            # the ceiling: any float32 log2 within a few ulp agrees (tests/test_upstream_modes.py)
            ceiling = np.ceil(_bf16(np.log2(scales))).astype(np.int64)
            exponents = np.clip(ceiling + 127, 1, 254).astype(np.uint32)
            scales = (exponents << 23).view(np.float32)
        inverse = _bf16(np.float32(1) / scales)
        t = _bf16(values * inverse[..., None])
    return encode(t, values, fmt), scales, exponents


def unfloored_groups(values: np.ndarray, fmt: OutputFormat):
    """Section 3b (FlashInfer's MXFP8): ``amax`` over the non-NaN ``|v|`` (infinities
    included), ``y = RN(amax / fmax)`` unfloored, its UE8M0 byte the exact ceiling on its bits
    (a subnormal ``y`` gives 1 above ``2^-127``, else 0), at most 254, and 0 where ``y`` is 0;
    codes ``RN(v * 2^(127 - e))``, 0 times v where the byte is 0; NaN and +-Inf get the
    format's codes (section 4). ``values`` float32 [..., G]; returns what quantize_groups
    does."""
    magnitude = values.view(np.uint32) & _ABS_MASK
    not_nan = np.where(magnitude <= _INF_BITS, magnitude, np.uint32(0)).view(np.float32)
    amax = not_nan.max(axis=-1, initial=np.float32(0))
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = (amax / np.float32(fmt.fmax)).astype(np.float32)
        bits = y.view(np.uint32)
        biased, mantissa = bits >> 23, bits & np.uint32(0x7FFFFF)
        up = (mantissa != 0) & ((biased != 0) | (mantissa > 0x400000))
        exponents = np.where(y > 0, np.minimum(biased + up, 254), 0).astype(np.uint32)
        # 2^(127 - e): normal for e <= 253, the subnormal 2^-127 at 254, 0 for byte 0
        inverse_bits = np.where(exponents == 254, np.uint32(0x00400000),
                                (np.uint32(254) - exponents) << 23)  # fmt: skip
        inverse = np.where(exponents == 0, np.uint32(0), inverse_bits).view(np.float32)
        t = (values * inverse[..., None]).astype(np.float32)
    scales = (exponents << 23).view(np.float32)
    return encode(t, values, fmt), scales, exponents


def quantize_into(
    x: np.ndarray,
    geometry: Geometry,
    fmt: OutputFormat | str,
    scale: ScaleFormat | str,
    eps: float,
    q_storage: np.ndarray,
    scale_storage: np.ndarray,
    rule: str = "rceil",
    arithmetic: str = "float32",
) -> None:
    """Quantize host ``x`` into flat storages laid out by ``geometry``, padding included.

    ``q_storage`` is uint8 of ``geometry.q_storage`` bytes; ``scale_storage`` holds
    ``geometry.scale_storage`` words (float32 or int32). Padding is written as zero.
    """
    b, m, ng, g = geometry.batches, geometry.rows, geometry.groups, geometry.group_size
    values = np.asarray(x).astype(np.float32).reshape(b, m, ng, g)
    codes, scales, exponents = quantize_groups(values, fmt, scale, eps, rule, arithmetic)

    q = q_storage.reshape(b, geometry.q_rows, geometry.k)
    q[:, :m] = codes.reshape(b, m, geometry.k)
    q[:, m:] = 0
    store_scales(geometry, scale_storage, scales, exponents)


def store_scales(geometry: Geometry, scale_storage: np.ndarray, scales, exponents) -> None:
    """Write every scale of ``geometry`` into its flat storage, padding zero: the float32
    ``scales`` in a float layout, the exponent bytes ``exponents`` in the others."""
    b, m, ng = geometry.batches, geometry.rows, geometry.groups
    # each scale's bytes, little end first, written at the layout's byte offsets
    width = geometry.layout.scale_bytes
    if width == 4:
        scale_bytes = np.asarray(scales).astype("<f4").view(np.uint8).reshape(b, m, ng, 4)
    else:
        scale_bytes = np.asarray(exponents).astype(np.uint8).reshape(b, m, ng, 1)
    storage = scale_storage.view(np.uint8)
    storage[...] = 0
    offsets = geometry.scale_byte_offsets()[..., None] + np.arange(width)
    storage[offsets] = scale_bytes


def quantize_into_masked(
    x: np.ndarray,
    geometry: Geometry,
    fmt: OutputFormat | str,
    scale: ScaleFormat | str,
    eps: float,
    q_storage: np.ndarray,
    scale_storage: np.ndarray,
    counts: np.ndarray,
    rule: str = "rceil",
    arithmetic: str = "float32",
) -> None:
    """The masked MoE layout: as ``quantize_into``, for rows ``t < counts[e]`` of each batch
    ``e`` only (counts clamped to ``[0, T]``). Every other byte of both storages, padding rows
    included, is left as it was; the unused bytes of a written row's last packed word are zero.
    """
    b, m, ng, g = geometry.batches, geometry.rows, geometry.groups, geometry.group_size
    counts = np.clip(np.asarray(counts).astype(np.int64), 0, m)
    valid = np.arange(m)[None, :] < counts[:, None]  # [b, m]
    values = np.asarray(x).astype(np.float32).reshape(b, m, ng, g)
    codes, scales, exponents = quantize_groups(values, fmt, scale, eps, rule, arithmetic)
    q = q_storage.reshape(b, geometry.q_rows, geometry.k)
    q[:, :m][valid] = codes.reshape(b, m, geometry.k)[valid]

    storage = scale_storage.view(np.uint8)
    offsets = geometry.scale_byte_offsets()[valid]  # [rows written, ng]
    if geometry.layout.scale_bytes == 4:
        scale_bytes = scales.astype("<f4").view(np.uint8).reshape(b, m, ng, 4)[valid]
        storage[offsets[..., None] + np.arange(4)] = scale_bytes
        return
    storage[offsets] = exponents.astype(np.uint8).reshape(b, m, ng)[valid]
    if ng % 4:  # the bytes after the last group in its word
        last = offsets[:, -1:] + np.arange(1, 4 - ng % 4 + 1)
        storage[last] = 0


# NVFP4 (docs/spec.md, section 4a): the NumPy backend of quantize(dtype="e2m1") ---------------

NVFP4_GROUP = 16
E2M1_MAX = np.float32(6.0)
_E4M3_MAX = np.float32(448.0)
_FLT_MAX = np.finfo(np.float32).max


def nvfp4_global_scale(x: np.ndarray) -> np.float32:
    """The computed global scale ``RN(448 * 6 / amax)``, ``amax`` over the finite ``|x|``: 1 when
    there is none (or all are zero), the largest float32 where the quotient overflows."""
    magnitude = np.abs(np.asarray(x).astype(np.float32))
    finite = magnitude[np.isfinite(magnitude)]
    amax = finite.max() if finite.size else np.float32(0)
    if amax == 0:
        return np.float32(1)
    with np.errstate(over="ignore"):
        scale = np.float32(2688) / np.float32(amax)  # 448 * 6, exact
    return scale if np.isfinite(scale) else _FLT_MAX


def nvfp4_groups(values: np.ndarray, global_scale) -> tuple[np.ndarray, np.ndarray]:
    """(e2m1 codes uint8 ``[..., 16]``, one per value, 0-15; e4m3 scale bytes ``[...]``) of
    float32 ``values`` ``[..., 16]``, each step one IEEE float32 operation (section 4a):
    ``amax`` over the finite ``|v|`` (0 if none); ``s = e4m3(RN(RN(g * amax) / 6))`` rounded to
    nearest even with saturation to 448; ``d = RN(s / g)``; each code ``e2m1(RN(v / d))``
    rounded to nearest even with saturation to +-6, or ``e2m1(v * 0)`` where ``d`` is 0. NaN
    gives +0 (e2m1 has no NaN), +-Inf +-6."""
    g = np.float32(global_scale)
    values = np.ascontiguousarray(values, dtype=np.float32)
    amax = finite_amax(values)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        u = ((g * amax).astype(np.float32) / np.float32(6)).astype(np.float32)
        scale = np.minimum(u, _E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
        d = (scale.astype(np.float32) / g).astype(np.float32)[..., None]
        t = np.where(d > 0, values / np.where(d > 0, d, np.float32(1)), values * np.float32(0))
    return e2m1_codes(t.astype(np.float32), values), scale.view(np.uint8)


_INVERSE_E2M1_MAX = np.float32(1) / E2M1_MAX  # RN(1 / 6)


def fp4_reciprocal_groups(values: np.ndarray, global_scale, ue8m0: bool):
    """Section 4a's ``arithmetic="reciprocal"`` (vLLM's and FlashInfer's NVFP4 and MXFP4):
    ``u = RN(g * RN(amax * RN(1/6)))``, ``amax`` over the finite ``|v|``; the scale ``S`` is
    e4m3(min(u, 448)) or, with ``ue8m0``, ``u`` rounded up to a power of two on its bits;
    ``r = RN(1 / RN(S * RN(1/g)))`` (0 where that product is 0); each code
    ``e2m1(RN(v * r))`` as ``e2m1_codes``. Returns (codes uint8 ``[..., G]``, scale bytes
    uint8 ``[...]``: e4m3, or the UE8M0 exponent)."""
    g = np.float32(global_scale)
    values = np.ascontiguousarray(values, dtype=np.float32)
    amax = finite_amax(values)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        u = (g * (amax * _INVERSE_E2M1_MAX).astype(np.float32)).astype(np.float32)
        if ue8m0:
            exponents = ((u.view(np.uint32) + np.uint32(0x7FFFFF)) & _INF_BITS) >> 23
            scale_bytes, s = exponents.astype(np.uint8), (exponents << 23).view(np.float32)
        else:
            e4m3 = np.minimum(u, _E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
            scale_bytes, s = e4m3.view(np.uint8), e4m3.astype(np.float32)
        inverse_g = np.float32(0) if g == 0 else np.float32(1) / g
        c = (s * inverse_g).astype(np.float32)
        r = np.where(c == 0, np.float32(0), np.float32(1) / np.where(c == 0, 1, c))
        t = (values * r.astype(np.float32)[..., None]).astype(np.float32)
    return e2m1_codes(t, values), scale_bytes


def e2m1_codes(t: np.ndarray, values: np.ndarray) -> np.ndarray:
    """e2m1 codes (uint8, 0-15) of the float32 scaled values ``t``, rounded to nearest even and
    saturated to +-6, a negative zero keeping its sign; the ``values`` they came from give NaN
    +0 and +-Inf +-6."""
    with np.errstate(invalid="ignore"):
        clipped = np.clip(t, -E2M1_MAX, E2M1_MAX)
        codes = clipped.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & np.uint8(0x0F)
    codes = np.where(np.isnan(values), np.uint8(0), codes)
    codes = np.where(np.isposinf(values), np.uint8(0x07), codes)
    codes = np.where(np.isneginf(values), np.uint8(0x0F), codes)
    return codes.astype(np.uint8)


# MXFP4 (docs/spec.md, section 4b) -------------------------------------------------------------

_MXFP4 = FP4_FORMATS["mxfp4"]


def mxfp4_groups(values: np.ndarray, eps: float, rule: str = "rceil"):
    """(e2m1 codes uint8 ``[..., 32]``, one per value, 0-15; UE8M0 exponent bytes uint8 ``[...]``)
    of float32 ``values`` ``[..., 32]``: section 3 with fmax 6 and emax_elem 2, each code
    ``e2m1(RN(v * 2^(127 - e)))`` rounded to nearest even and saturated to +-6."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    amax = np.maximum(finite_amax(values), np.float32(eps))
    exponents = rule_exponents(amax, _MXFP4.fmax, _MXFP4.emax_elem, rule)
    inverse = ((np.uint32(254) - exponents) << 23).view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        t = (values * inverse[..., None]).astype(np.float32)
    return e2m1_codes(t, values), exponents.astype(np.uint8)


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """4-bit codes ``[..., K]`` (K even) two to a byte, the first in the low nibble: ``[..., K/2]``
    (torch's ``float4_e2m1fn_x2``)."""
    codes = np.asarray(codes, np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
