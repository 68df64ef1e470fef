"""Back from codes to values: dequantize, unpack_scales and as_float8, for checks and tests.

Each layout is read through the same descriptor ``quantize`` writes with (``_layout``), so a
scale is found where the kernel put it.
"""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np

from ._arrays import (
    CUPY,
    NUMPY,
    TORCH,
    ArrayInfo,
    check_companion,
    describe,
    is_torch_cpu,
    kind_of,
    numpy_to_torch_cpu,
    to_cupy,
    torch_bytes,
    torch_cpu_to_numpy,
)
from ._layout import BLOCKED, SCALE_LAYOUTS, WEIGHT_BLOCK, WEIGHT_BLOCKS, Geometry, scale_layout
from ._request import NVFP4_GROUP
from ._spec import FORMATS_BY_DTYPE, FP4_FORMATS, GROUP_SIZES, OUTPUT_FORMATS, output_format

MXFP4_GROUP = FP4_FORMATS["mxfp4"].group_size

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
    """The format of codes ``info``: ``dtype`` if given, else their own dtype. uint8 codes (the
    container cupy holds float8 in) say nothing of their format: ``dtype`` is required. A
    ``dtype`` that contradicts the codes' own float8 or int8 dtype is refused."""
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
        raise TypeError(
            "dtype: q holds uint8 codes, which do not say their format; pass the format "
            "quantize wrote, e.g. dtype='e4m3' or dtype='e5m2'"
        )
    if info.dtype not in FORMATS_BY_DTYPE:
        raise TypeError(
            f"q: expected codes of {', '.join(FORMATS_BY_DTYPE)} or uint8, got {info.dtype}"
        )
    return FORMATS_BY_DTYPE[info.dtype].name


def _group_size(q_info: ArrayInfo, s_info: ArrayInfo, given) -> int:
    """The group size of codes ``q_info`` and scales ``s_info``: K over the groups a row of
    float32 scales (``given`` must agree); packed and blocked scales round the groups up to
    whole words or tiles, so there it must be given."""
    if given is not None and (not isinstance(given, int) or isinstance(given, bool) or given < 1):
        raise TypeError(f"group_size: expected a positive int, got {given!r}")
    if not q_info.shape:
        raise ValueError("q: expected codes of shape [..., K], got a 0-d array")
    if s_info.dtype not in ("float32", "int32", "uint8"):
        raise TypeError(
            f"scales: expected float32, packed int32 or blocked uint8, got {s_info.dtype}"
        )
    k = q_info.shape[-1]
    if s_info.dtype == "float32" and s_info.shape and s_info.shape[-1]:
        groups = s_info.shape[-1]
        if given is not None and k % given and -(-k // given) == groups:
            return given  # a partial last group (the column-wise result, section 4d)
        if k % groups:
            raise ValueError(
                f"scales: expected a number of groups a row that divides q's K = {k}, got {groups}"
            )
        if given is not None and given * groups != k:
            raise ValueError(
                f"group_size: {given} contradicts the shapes: q has K = {k} and scales hold "
                f"{groups} groups a row, which makes group_size {k // groups}"
            )
        if given is None and k // groups not in GROUP_SIZES:
            raise ValueError(
                f"scales: {groups} groups a row of q's K = {k} make group_size {k // groups}, "
                f"which quantize never writes: pass group_size (a partial last group, as "
                f"orientation='col' writes, needs it)"
            )
        return k // groups
    if given is None:
        kind = "packed int32" if s_info.dtype == "int32" else "blocked uint8"
        raise TypeError(
            f"group_size: {kind} scales (padded to whole words or tiles) do not determine it; "
            f"pass the group_size quantize used"
        )
    return given


def torch_exponent_bytes(packed, groups: int):
    """The exponent bytes ``[..., groups]`` (uint8) of torch int32 words ``[..., kp]`` of any
    strides: byte ``g % 4`` of word ``g // 4`` (little-endian words), from a row-major copy."""
    shape = tuple(packed.shape)
    return torch_bytes(packed).reshape(*shape[:-1], 4 * shape[-1])[..., :groups]


def unpack_scales(packed, groups: int):
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

        codes = torch_exponent_bytes(packed, groups)
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
    return _exponents_to_float(exponents[..., :groups], info)


def dequantize(q, scales, group_size: int | None = None, dtype=None, global_scale=None):
    """Float32 ``q_i * s_group`` with the shape of ``q``.

    ``scales`` is any layout ``quantize`` returns: float32 ``[..., ng]`` (``group_size`` is
    then ``K / ng``, and a given one must agree), or packed int32 ``[..., kp]`` or the blocked
    layout's uint8 storage, which round the groups up to whole words or tiles: there
    ``group_size`` is required. ``dtype`` names the format of uint8 codes (cupy's float8
    container), and is required for them; other dtypes say it themselves.
    NVFP4 (``dtype="e2m1"``, with its ``global_scale``; ``group_size`` 16): ``q`` ``[..., K/2]``
    packed codes, float32 ``[..., K]`` of ``e2m1(code) * RN(S / global_scale)``. MXFP4
    (``dtype="e2m1"`` without a global scale; ``group_size`` 32): the same codes times
    ``2^(e - 127)``, from float32 row scales or blocked UE8M0 bytes.
    """
    if isinstance(dtype, str) and dtype == "e2m1":
        if global_scale is None and group_size in (None, MXFP4_GROUP):
            return dequantize_mxfp4(q, scales)
        if global_scale is None or group_size not in (None, NVFP4_GROUP):
            raise ValueError(
                f"dtype='e2m1': NVFP4 needs group_size=16 (or none) and its global_scale, MXFP4 "
                f"group_size=32 (or none) and no global_scale; got group_size={group_size!r} "
                f"and global_scale={global_scale!r}"
            )
        return dequantize_nvfp4(q, scales, global_scale)
    if global_scale is not None:
        raise ValueError("global_scale: only NVFP4 (dtype='e2m1') takes one")
    if group_size == NVFP4_GROUP:
        raise ValueError("group_size=16 is NVFP4's: pass dtype='e2m1' and its global_scale")
    if is_torch_cpu(q) or is_torch_cpu(scales):  # through numpy views, back as a tensor
        _same_host_library(q, scales)
        values = dequantize(
            torch_cpu_to_numpy(q, "q"), torch_cpu_to_numpy(scales, "scales"), group_size, dtype
        )
        return numpy_to_torch_cpu(np.ascontiguousarray(values))
    q_info, s_info = _described_pair(q, scales)
    fmt_name = _format_of(q_info, dtype)
    group_size = _group_size(q_info, s_info, group_size)
    k = q_info.shape[-1]
    groups = -(-k // group_size)  # the last group partial where group_size does not divide K
    scales = _float_scales(scales, s_info, q_info, group_size, groups)
    expected = tuple(q_info.shape[:-1]) + (groups,)
    if tuple(scales.shape) != expected:
        raise ValueError(f"scales: expected shape {expected}, got {tuple(scales.shape)}")
    return _decoded(q, q_info, fmt_name) * _spread(scales, q_info, group_size, k, -1)


def _decoded(q, q_info: ArrayInfo, fmt_name: str):
    """float32 values of codes ``q`` in format ``fmt_name``, in q's library."""
    if q_info.kind == TORCH:
        import torch

        if fmt_name == "int8":
            return q.to(torch.float32)
        table = torch.from_numpy(_decode_table(fmt_name)).to(q.device)
        return table[q.view(torch.uint8).to(torch.int64)]
    xp = _namespace(q_info)
    if fmt_name == "int8":
        return q.astype(xp.float32)
    return xp.asarray(_decode_table(fmt_name))[q.view(xp.uint8)]


def _spread(scales, info: ArrayInfo, width: int, extent: int, axis: int):
    """Each scale repeated ``width`` times along ``axis``, cut at ``extent`` (partial groups)."""
    if info.kind == TORCH:
        spread = scales.repeat_interleave(width, dim=axis)
        return spread.narrow(axis, 0, extent)
    spread = _namespace(info).repeat(scales, width, axis=axis)
    return spread[..., :extent] if axis == -1 else spread[..., :extent, :]


def dequantize_weight(q, scales, block=(128, 128), dtype=None):
    """Float32 ``q_i * s`` of the block (128x128 or 256x256) each value lies in, shape of ``q``
    ``[..., N, K]``, from any layout ``quantize_weight`` writes: float32 ``[..., nb, kb]``
    (``row`` or ``col``), uint8 exponent bytes ``[..., nb, kb]`` (``bytes``) or packed int32
    ``[..., N, ceil(kb / 4)]`` (``packed``, 128x128 blocks, row ``n`` holding block row
    ``n // 128``)."""
    if not isinstance(block, (tuple, list)) or len(block) != 2 or block[0] != block[1] or (
        block[0] not in WEIGHT_BLOCKS or isinstance(block[0], bool)
    ):  # fmt: skip
        squares = " or ".join(str((b, b)) for b in WEIGHT_BLOCKS)
        raise ValueError(f"block: expected {squares}, got {block!r}")
    side = int(block[0])
    if is_torch_cpu(q) or is_torch_cpu(scales):
        _same_host_library(q, scales)
        values = dequantize_weight(torch_cpu_to_numpy(q, "q"),
                                   torch_cpu_to_numpy(scales, "scales"), block, dtype)  # fmt: skip
        return numpy_to_torch_cpu(np.ascontiguousarray(values))
    q_info, s_info = _described_pair(q, scales)
    if len(q_info.shape) not in (2, 3):
        raise ValueError(f"q: expected [N, K] or [E, N, K] codes, got shape {q_info.shape}")
    n, k = q_info.shape[-2:]
    nb, kb = -(-n // side), -(-k // side)
    if s_info.dtype == "int32":
        if side != WEIGHT_BLOCK:
            raise ValueError(
                f"scales: packed int32 scales are of 128x128 blocks, got block {block}"
            )
        rows = unpack_scales(scales, kb)  # already one row of scales per weight row
    else:
        if tuple(s_info.shape[-2:]) != (nb, kb):
            raise ValueError(f"scales: expected [..., {nb}, {kb}] blocks, got {s_info.shape}")
        blocks = _exponents_to_float(scales, s_info) if s_info.dtype == "uint8" else scales
        rows = _spread(blocks, s_info, side, n, -2)
    if tuple(rows.shape) != tuple(q_info.shape[:-1]) + (kb,):
        raise ValueError(f"scales: expected {n} rows of {kb} blocks, got shape {s_info.shape}")
    return _decoded(q, q_info, _format_of(q_info, dtype)) * _spread(rows, q_info, side, k, -1)


def _described_pair(q, scales) -> tuple[ArrayInfo, ArrayInfo]:
    """The descriptions of codes and scales, which must share a library and a device."""
    q_info, s_info = describe(q, "q"), describe(scales, "scales")
    check_companion(q_info, s_info, "scales", leader="q")
    return q_info, s_info


def _same_host_library(q, scales) -> None:
    """A torch CPU ``q`` takes torch CPU ``scales``, and the other way round."""
    for name, array, other in (("q", q, "scales"), ("scales", scales, "q")):
        if not is_torch_cpu(array):
            raise TypeError(
                f"{name}: expected a torch CPU tensor like {other}, got {kind_of(array)}"
            )


def _float_scales(scales, s_info: ArrayInfo, q_info: ArrayInfo, group_size: int, groups: int):
    """float32 scales ``[..., groups]`` of any layout. Packed and blocked scales are refused
    where a zero exponent byte stands at a group's place: quantize never writes one there
    (its exponents are at least that of eps), only in padding, so the group size is wrong."""
    if s_info.dtype == "float32":
        return scales
    if s_info.dtype == "int32":
        _check_packed_width(scales, s_info, groups, group_size)
        values = unpack_scales(scales, groups)
    else:
        values = _unblock_scales(scales, s_info, tuple(q_info.shape), group_size)
    if 0 not in values.shape and bool((values == 2.0**-127).any()):
        raise ValueError(
            f"group_size: {group_size} reads padding as scales (zero exponent bytes where "
            f"groups of {group_size} lie): were the scales quantized with a larger group_size?"
        )
    return values


def _unblock_scales(scales, s_info: ArrayInfo, values_shape: tuple, group_size: int, what="q"):
    """The blocked layout's UE8M0 bytes as float32 scales ``[..., groups]`` for values of
    ``values_shape`` (``what`` has that shape): each group's byte gathered from its place in
    the 128x4 tiles."""
    geometry = Geometry(values_shape, group_size, SCALE_LAYOUTS[BLOCKED], False)
    if tuple(s_info.shape) != geometry.scale_shape:
        raise ValueError(
            f"scales: blocked scales for {what} of shape {values_shape} (G={group_size}) have "
            f"shape {geometry.scale_shape}, got {tuple(s_info.shape)}"
        )
    offsets = geometry.scale_byte_offsets().reshape(-1)
    padding = np.ones(geometry.scale_storage_bytes, bool)
    padding[offsets] = False  # the kernel writes zeros there
    padding = np.flatnonzero(padding)
    shape = values_shape[:-1] + (geometry.groups,)
    if s_info.kind == TORCH:
        import torch

        flat = scales.contiguous().reshape(-1)
        spare = flat[torch.from_numpy(padding).to(flat.device)]
        codes = flat[torch.from_numpy(offsets).to(flat.device)]
    else:
        xp = _namespace(s_info)
        flat = xp.ascontiguousarray(scales).reshape(-1)
        spare = flat[xp.asarray(padding)]
        codes = flat[xp.asarray(offsets)]
    if padding.size and bool((spare != 0).any()):
        raise ValueError(
            f"scales: the blocked storage holds exponents where group_size={group_size} puts "
            f"padding: were they quantized with a smaller group_size than {group_size}?"
        )
    return _exponents_to_float(codes, s_info).reshape(shape)


def _exponents_to_float(codes, info: ArrayInfo):
    """float32 ``2**(e - 127)`` of UE8M0 exponents ``codes`` (255: NaN) of ``info``'s library."""
    if info.kind == TORCH:
        import torch

        codes = codes.to(torch.int32)
        bits = torch.where(codes == 0, 0x00400000, codes << 23)
        return torch.where(codes == 255, 0x7FC00000, bits).view(torch.float32)
    xp = _namespace(info)
    codes = codes.astype(xp.uint32)
    bits = xp.where(codes == 0, xp.uint32(0x00400000), codes << 23)
    bits = xp.where(codes == 255, xp.uint32(0x7FC00000), bits)
    return xp.ascontiguousarray(bits).view(xp.float32)


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


def scale_offsets(shape, group_size: int, layout: str) -> np.ndarray:
    """Byte offset of every scale in the scale storage ``quantize`` returns, int64
    ``[rows, groups]`` for ``x`` of ``shape`` ``[..., K]`` (``[B, rows, groups]`` for three or
    more dimensions): where scale ``(row, group)`` is, in any layout, as the kernels and the
    NumPy backend write it. Bytes of the storage at no offset are padding, written as zeros.
    """
    shape = tuple(shape)
    if not shape or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise TypeError(f"shape: expected a tuple of sizes [..., K], got {shape!r}")
    if not isinstance(group_size, int) or group_size < 1 or shape[-1] % group_size:
        raise ValueError(
            f"group_size: expected a positive divisor of K = {shape[-1]}, got {group_size!r}"
        )
    geometry = Geometry(shape, group_size, scale_layout(layout), False)
    offsets = geometry.scale_byte_offsets()
    return offsets if geometry.batched else offsets[0]


def as_float8(q, dtype="e4m3"):
    """Reinterpret uint8 codes as a float8 dtype without copying.

    numpy: an ``ml_dtypes.float8_*`` view. torch: a ``torch.float8_*`` view. cupy has no float8
    dtype: a torch view of the same memory is returned through DLPack (torch must be installed).
    """
    fmt = output_format(dtype)
    if not fmt.is_float8:
        raise ValueError(f"dtype: expected a float8 format, got {dtype!r}")
    if is_torch_cpu(q):  # a torch view, as of a CUDA tensor
        return numpy_to_torch_cpu(as_float8(torch_cpu_to_numpy(q, "q"), dtype))
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


# NVFP4 -------------------------------------------------------------------------------------------

E2M1_VALUES = np.array(
    [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32
)


def dequantize_nvfp4(q, scales, global_scale):
    """Float32 ``[..., K]`` of NVFP4 codes ``q`` ``[..., K/2]`` and blocked e4m3 ``scales``:
    ``e2m1(code) * RN(S / global_scale)``, the ``d`` that quantize divided by."""
    if is_torch_cpu(q) or is_torch_cpu(scales):
        _same_host_library(q, scales)
        g = (
            torch_cpu_to_numpy(global_scale, "global_scale")
            if is_torch_cpu(global_scale)
            else global_scale
        )
        q_view, s_view = torch_cpu_to_numpy(q, "q"), torch_cpu_to_numpy(scales, "scales")
        values = dequantize_nvfp4(q_view, s_view, g)
        return numpy_to_torch_cpu(np.ascontiguousarray(values))
    q_info, s_info = _described_pair(q, scales)
    if s_info.dtype != "uint8":
        raise TypeError(f"scales: NVFP4's e4m3 scale bytes are uint8, got {s_info.dtype}")
    shape = _fp4_shape(q_info, NVFP4_GROUP)
    geometry = Geometry(shape, NVFP4_GROUP, SCALE_LAYOUTS[BLOCKED], False)
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
        values = dequantize_nvfp4(to_cupy(q, "q"), to_cupy(scales, "scales"), g)
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
    values = _e2m1_values(xp, q, shape, NVFP4_GROUP) * d
    return values.reshape(shape).astype(xp.float32)


def _fp4_shape(q_info: ArrayInfo, group_size: int) -> tuple:
    """The shape ``[..., K]`` of the values of FP4 codes ``q`` ``[..., K/2]``, checked."""
    if q_info.dtype != "uint8":
        raise TypeError(f"q: e2m1 codes are uint8, two a byte, got {q_info.dtype}")
    if not q_info.shape:
        raise ValueError("q: expected [..., K/2] packed codes, got a 0-d array")
    shape = (*q_info.shape[:-1], 2 * q_info.shape[-1])
    if shape[-1] % group_size:
        raise ValueError(f"q: K = 2 * {q_info.shape[-1]} is not a multiple of {group_size}")
    return shape


def _e2m1_values(xp, q, shape: tuple, group_size: int):
    """float32 ``[..., groups, group_size]`` of packed e2m1 codes ``q`` (numpy or cupy) whose
    values have ``shape``: the low nibble first."""
    codes = xp.ascontiguousarray(q)
    nibbles = xp.stack([codes & 15, codes >> 4], axis=-1)
    groups = shape[-1] // group_size  # spelled out: -1 is not inferred from a 0 extent
    return xp.asarray(E2M1_VALUES)[nibbles.reshape(*shape[:-1], groups, group_size)]


# MXFP4 -------------------------------------------------------------------------------------------


def dequantize_mxfp4(q, scales):
    """Float32 ``[..., K]`` of MXFP4 codes ``q`` ``[..., K/2]`` and UE8M0 ``scales``: float32
    ``[..., K/32]`` (the row layout) or the blocked layout's bytes; ``e2m1(code) * 2^(e-127)``."""
    if is_torch_cpu(q) or is_torch_cpu(scales):
        _same_host_library(q, scales)
        values = dequantize_mxfp4(torch_cpu_to_numpy(q, "q"), torch_cpu_to_numpy(scales, "scales"))
        return numpy_to_torch_cpu(np.ascontiguousarray(values))
    q_info, s_info = _described_pair(q, scales)
    if q_info.kind == TORCH:
        import torch

        return torch.from_dlpack(dequantize_mxfp4(to_cupy(q, "q"), to_cupy(scales, "scales")))
    shape = _fp4_shape(q_info, MXFP4_GROUP)
    row_shape = (*shape[:-1], shape[-1] // MXFP4_GROUP)
    if s_info.dtype == "uint8":
        scales = _unblock_scales(scales, s_info, shape, MXFP4_GROUP, "values")
    elif s_info.dtype != "float32" or tuple(s_info.shape) != row_shape:
        raise ValueError(
            f"scales: MXFP4 scales are float32 {row_shape} (row) or blocked uint8 bytes, got "
            f"{s_info.dtype} of shape {tuple(s_info.shape)}"
        )
    xp = _namespace(q_info)
    values = _e2m1_values(xp, q, shape, MXFP4_GROUP) * scales[..., None]
    return values.reshape(shape).astype(xp.float32)
