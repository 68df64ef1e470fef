"""Drop-in replacements for the quantizers vLLM, SGLang and FlashInfer call, with their
signatures.

Outputs have the shapes, dtypes and strides those functions return, and the values of
fp8_group_quant's contract (see the README). Swap by changing an import::

    # from vllm.model_executor.layers.quantization.utils.fp8_utils import per_token_group_quant_fp8
    from fp8_group_quant.compat import per_token_group_quant_fp8

    # from sglang.srt.layers.quantization.fp8_kernel import sglang_per_token_group_quant_fp8
    from fp8_group_quant.compat import sglang_per_token_group_quant_fp8

    # from flashinfer import fp4_quantize, mxfp8_quantize
    from fp8_group_quant.compat import fp4_quantize, mxfp8_quantize

    # from vllm._custom_ops import scaled_fp4_quant
    from fp8_group_quant.compat import scaled_fp4_quant

    # from deep_gemm.utils.math import per_block_cast_to_fp8
    from fp8_group_quant.compat import per_block_cast_to_fp8

    # from torchao.prototype.blockwise_fp8_training.kernels import (
    #     triton_fp8_blockwise_act_quant_lhs, ...)
    from fp8_group_quant.compat import act_quant_lhs, act_quant_rhs, act_quant_transposed_lhs
"""

from __future__ import annotations

import math
import sys

from ._arrays import kind_of, library_of
from ._layout import COL, COL_TMA, PACKED, PACKED_COL, ROW, Geometry, LayoutName, scale_layout
from ._spec import ScaleName
from .api import quantize, quantize_weight

__all__ = [
    "per_token_group_quant_fp8",
    "per_token_group_quant_fp8_packed_for_deepgemm",
    "sglang_per_token_group_quant_fp8",
    "silu_mul_per_token_group_quant_fp8_colmajor",
    "persistent_masked_m_silu_mul_quant",
    "rms_norm_per_block_quant",
    "mxfp8_quantize",
    "fp4_quantize",
    "scaled_fp4_quant",
    "per_block_cast_to_fp8",
    "act_quant_lhs",
    "act_quant_rhs",
    "act_quant_transposed_lhs",
    "weight_quant_rhs",
    "weight_quant_transposed_rhs",
]


def per_token_group_quant_fp8(
    x,
    group_size: int,
    eps: float = 1e-10,
    dtype=None,
    column_major_scales: bool = False,
    tma_aligned_scales: bool = False,
    out_q=None,
    use_ue8m0: bool | None = None,
):
    """vLLM's ``per_token_group_quant_fp8``: float32 scales, row-major or column-major.

    ``x_s`` is ``[..., M, K/G]`` float32: row-major by default; with ``column_major_scales`` it
    has strides ``(1, M)``; adding ``tma_aligned_scales`` gives ``(1, align(M, 4))`` (per batch for
    3-D input, as vLLM's ``(tma*ng, 1, tma)``). ``use_ue8m0`` makes the scales powers of two
    (vLLM's default follows its DeepGEMM setting; here None means False). ``dtype`` defaults to
    float8_e4m3fn.

    Example: ``q, s = per_token_group_quant_fp8(x, 128, column_major_scales=True,
    tma_aligned_scales=True, use_ue8m0=True)`` is DeepGEMM's SM90 input.
    """
    layout = ROW
    if column_major_scales:
        layout = COL_TMA if tma_aligned_scales else COL
    return quantize(
        x,
        group_size,
        dtype="e4m3" if dtype is None else dtype,
        scale="ue8m0" if use_ue8m0 else "float32",
        layout=layout,
        eps=eps,
        out=out_q,
    )


def per_token_group_quant_fp8_packed_for_deepgemm(
    x, group_size: int, eps: float = 1e-10, use_ue8m0: bool | None = None, out_q=None
):
    """vLLM's packed variant: e4m3 with UE8M0 scales packed four per int32, MN-major, TMA-aligned.

    As vLLM's (``vllm/model_executor/layers/quantization/utils/fp8_utils.py``): ``x_q`` has the
    shape of ``x``; ``x_s`` is int32 ``[M, ceil(K/G/4)]`` with strides ``(1, align(M, 4))``,
    ``M`` the product of ``x``'s leading dimensions, what DeepGEMM reads on SM100. vLLM's
    ``use_ue8m0=None`` reads its DeepGEMM setting and then requires True; the packed layout holds
    nothing else, so here None means True and False is refused.

    Example: ``q, s = per_token_group_quant_fp8_packed_for_deepgemm(x, 128)``.
    """
    if use_ue8m0 is not None and not use_ue8m0:
        raise ValueError(
            f"use_ue8m0: the packed layout holds UE8M0 exponents only; got {use_ue8m0!r}"
        )
    shape = tuple(x.shape)
    if len(shape) > 2:
        x = x.reshape(-1, shape[-1])
    flat_out = None if out_q is None else out_q.reshape(-1, out_q.shape[-1])
    q, scales = quantize(
        x, group_size, dtype="e4m3", scale="ue8m0", layout=PACKED, eps=eps, out=flat_out
    )
    if out_q is not None:
        return out_q, scales
    return (q.reshape(shape) if len(shape) > 2 else q), scales


def sglang_per_token_group_quant_fp8(
    x,
    group_size: int,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_tma_aligned: bool = False,
    scale_ue8m0: bool = False,
    fuse_silu_and_mul: bool = False,
    masked_m=None,
    *,
    output_q=None,
    output_s=None,
):
    """SGLang's ``sglang_per_token_group_quant_fp8``.

    Scales as SGLang allocates them: float32 row-major ``[..., M, K/G]``, column-major
    ``(1, M)`` or TMA-aligned ``(1, align(M, 4))`` (per batch for batched input). With
    ``scale_ue8m0`` they are UE8M0: int32 words packed four exponents each,
    ``[..., M, ceil(K/G/4)]`` with strides ``(..., 1, align(M, 4))``, when
    ``column_major_scales`` and ``scale_tma_aligned`` are set; float32 powers of two row-major
    when neither is (SGLang refuses column-major UE8M0 without TMA alignment, and so does this).
    ``output_q`` / ``output_s`` receive the results in place. ``fuse_silu_and_mul`` reads
    ``x`` as ``[..., 2N]`` (gate then up) and quantizes ``round(round(silu(gate)) * up)``
    (``fp8_group_quant.activation``) into ``[..., N]``. ``masked_m`` (int32 or int64 ``[E]``,
    with ``x`` ``[E, T, K]``) quantizes rows ``t < masked_m[e]`` only; the other rows of both
    outputs are left unwritten, as in SGLang.

    Example: ``q, s = sglang_per_token_group_quant_fp8(x, 128, column_major_scales=True,
    scale_tma_aligned=True, scale_ue8m0=True)``.
    """
    layout = ROW
    if column_major_scales:
        layout = COL_TMA if scale_tma_aligned else COL
    if scale_ue8m0 and layout == COL:
        raise ValueError(
            "scale_ue8m0: column-major UE8M0 scales are packed and TMA-aligned; pass "
            "scale_tma_aligned=True (or column_major_scales=False for float32 powers of two)"
        )
    return quantize(
        x,
        group_size,
        dtype="e4m3",
        scale="ue8m0" if scale_ue8m0 else "float32",
        layout=PACKED if scale_ue8m0 and layout == COL_TMA else layout,
        eps=eps,
        out=output_q,
        scale_out=output_s,
        activation="silu_mul" if fuse_silu_and_mul else None,
        masked_m=masked_m,
    )


_SCALE_FMTS: dict[str, tuple[ScaleName, LayoutName]] = {  # DeepGemmQuantScaleFMT: (scale, layout)
    "FLOAT32": ("float32", COL),
    "FLOAT32_CEIL_UE8M0": ("ue8m0", COL),
    "UE8M0": ("ue8m0", PACKED_COL),
}


def persistent_masked_m_silu_mul_quant(
    y,
    tokens_per_expert,
    num_parallel_tokens=16,
    group_size: int = 128,
    quant_scale_fmt="FLOAT32",
):
    """vLLM's ``persistent_masked_m_silu_mul_quant`` (batched DeepGEMM MoE experts).

    ``y`` ``[E, T, 2H]`` bfloat16 (gate then up) and ``tokens_per_expert`` ``[E]``: the
    SiLU-and-multiply of the first ``tokens_per_expert[e]`` tokens of each expert, quantized to
    e4m3 ``[E, T, H]``. Scales as vLLM allocates them: ``quant_scale_fmt`` ``FLOAT32`` (or
    ``FLOAT32_CEIL_UE8M0``, powers of two) gives float32 ``[E, T, H/G]`` with strides
    ``(T*H/G, 1, T)``; ``UE8M0`` gives int32 ``[E, T, ceil(H/G/4)]`` with strides
    ``(T*ceil(H/G/4), 1, T)`` for any T (the ``packed_col`` layout). As in vLLM, the scales of
    tokens past the counts are zero and their codes unwritten. ``quant_scale_fmt`` is vLLM's
    ``DeepGemmQuantScaleFMT`` or its name; ``num_parallel_tokens`` is vLLM's tuning knob and is
    ignored. Values are vLLM's kernel's, bit for bit: ``arithmetic="bfloat16"``
    (docs/spec.md, section 3a).
    """
    name = getattr(quant_scale_fmt, "name", quant_scale_fmt)
    if name not in _SCALE_FMTS:
        raise ValueError(
            f"quant_scale_fmt: expected one of {', '.join(_SCALE_FMTS)}, got {quant_scale_fmt!r}"
        )
    scale, layout = _SCALE_FMTS[name]
    shape = tuple(getattr(y, "shape", ()))
    if len(shape) != 3:
        raise ValueError(f"y: expected [E, T, 2H], got shape {shape}")
    geometry = Geometry(
        (shape[0], shape[1], shape[2] // 2), group_size, scale_layout(layout), False
    )
    scale_out = _zeroed_like(y, geometry)
    return quantize(
        y,
        group_size,
        dtype="e4m3",
        scale=scale,
        layout=layout,
        scale_out=scale_out,
        activation="silu_mul",
        masked_m=tokens_per_expert,
        arithmetic="bfloat16",
    )


def _zeroed_like(x, geometry: Geometry):
    """Zeroed scale storage of ``geometry``'s layout in ``x``'s library and device."""
    import numpy as np

    shape, strides = geometry.scale_shape, geometry.scale_strides
    dtype = geometry.layout.dtype
    module = library_of(x)
    if module == "torch":
        import torch

        zeros = torch.zeros(geometry.scale_storage, dtype=getattr(torch, dtype), device=x.device)
        return zeros.as_strided(shape, strides)
    if module == "cupy":
        import cupy

        device_zeros = cupy.zeros(geometry.scale_storage, dtype)
        return cupy.lib.stride_tricks.as_strided(device_zeros, shape, tuple(4 * s for s in strides))
    host_zeros = np.zeros(geometry.scale_storage, dtype)
    return np.lib.stride_tricks.as_strided(host_zeros, shape, tuple(4 * s for s in strides))


def silu_mul_per_token_group_quant_fp8_colmajor(
    input,
    output=None,
    use_ue8m0: bool | None = None,
    eps: float = 1e-10,
    clamp_limit: float | None = None,
    group_size: int = 128,
    alpha: float = 1.0,
    beta: float = 0.0,
    *,
    expert_ends=None,
    expert_alignment: int = 0,
):
    """vLLM's ``silu_mul_per_token_group_quant_fp8_colmajor``: SiLU-and-multiply, then e4m3.

    ``input`` ``[M, 2N]`` holds gate then up; returns ``(output [M, N] e4m3, scales)`` with
    float32 scales ``[M, N/G]`` column-major, strides ``(1, M)``; ``use_ue8m0`` makes them
    powers of two (None means False here; vLLM reads its DeepGEMM setting). ``clamp_limit``:
    the clamped SwiGLU (gate clamped from above, up on both sides, before the activation;
    ``docs/spec.md``, section 2a). Values follow this library's contract, which equals vLLM's
    test reference (its ``silu_and_mul`` then its Triton quantizer); vLLM's fused kernel scales
    by a rounded ``1/448`` and takes ``exp`` from Triton, so a few of its codes differ (0.07% on
    random data, float scales; docs/spec.md, section 8). SwiGLU-OAI's ``alpha``/``beta`` and
    the expert-ends layout are not implemented and raise NotImplementedError; unlike vLLM,
    ``M`` need not be a multiple of 8.
    """
    for name, value, default in (
        ("alpha", alpha, 1.0), ("beta", beta, 0.0),
        ("expert_ends", expert_ends, None), ("expert_alignment", expert_alignment, 0),
    ):  # fmt: skip
        if value != default if default is not None else value is not None:
            raise NotImplementedError(
                f"{name}: only SiLU ({name}={default!r}) is implemented, got {value!r}"
            )
    if len(getattr(input, "shape", ())) != 2:
        raise ValueError(f"input: expected [M, 2N], got shape {getattr(input, 'shape', None)}")
    return quantize(
        input,
        group_size,
        dtype="e4m3",
        scale="ue8m0" if use_ue8m0 else "float32",
        layout=COL,
        eps=eps,
        out=output,
        activation="silu_mul",
        clamp_limit=clamp_limit,
    )


def rms_norm_per_block_quant(
    input,
    weight,
    epsilon: float,
    quant_dtype,
    group_size: list[int],
    scale_ub=None,
    residual=None,
    is_scale_transposed: bool = False,
    tma_alignment: int = 0,
):
    """vLLM's ``rms_norm_per_block_quant`` (``vllm/_custom_ops.py``): fused (add-)RMSNorm, then
    per-token-group quantization to ``quant_dtype`` (float8_e4m3fn or int8).

    ``group_size`` is vLLM's ``[1, G]``. Scales as vLLM allocates them: float32
    ``[rows, K/G]`` row-major, with ``is_scale_transposed`` column-major ``(1, rows)`` (rows =
    every leading dimension flattened), or with ``tma_alignment=4`` TMA-aligned and per batch
    for 3-D input. ``residual`` is updated in place to ``input + residual``. Values follow
    ``docs/spec.md`` section 2b with ``norm_rounding="twice_unrounded_sum"``, vLLM's
    arithmetic: ``x * r`` rounded to the input dtype before the weight multiply, and with a
    residual the float32 sum ``input + residual`` normalised unrounded (written back rounded).
    Runs on every backend (CUDA tensors through the fused kernel); ``scale_ub`` is not
    implemented.
    """
    if scale_ub is not None:
        raise NotImplementedError("scale_ub: an upper bound on the scales is not implemented")
    if not isinstance(group_size, (list, tuple)):
        raise TypeError(f"group_size: expected [1, G] as vLLM takes it, got {group_size!r}")
    if list(group_size)[:1] != [1] or len(group_size) != 2:
        raise ValueError(f"group_size: expected [1, G] as vLLM takes it, got {group_size!r}")
    if tma_alignment not in (0, 4):
        raise ValueError(f"tma_alignment: expected 0 or 4, got {tma_alignment!r}")
    layout = ROW
    if is_scale_transposed:
        layout = COL_TMA if tma_alignment else COL
    shape = tuple(input.shape)
    flatten = len(shape) > 2 and layout != COL_TMA  # vLLM's row and col scales are 2-D
    x = input.reshape(-1, shape[-1]) if flatten else input
    r = residual.reshape(-1, shape[-1]) if flatten and residual is not None else residual
    q, scales = quantize(x, group_size[1], dtype=quant_dtype, layout=layout,
                         norm=(weight, epsilon), residual=r,
                         norm_rounding="twice_unrounded_sum")  # fmt: skip
    if r is not None and r is not residual:  # a reshape may have copied: write the sum back
        if hasattr(residual, "copy_"):
            residual.copy_(r.reshape(shape))
        else:
            residual[...] = r.reshape(shape)
    return (q.reshape(shape) if flatten else q), scales


# Blackwell block-scaled formats (issue 14): FlashInfer's and vLLM's quantizers ------------------


def _rows_2d(x):
    """``x`` as ``[rows, K]``, every leading dimension flattened (a 1-D x is one row)."""
    if not hasattr(x, "reshape") or not getattr(x, "shape", ()):
        raise TypeError(
            f"input: expected an array [..., K] of numpy, torch or cupy, got {kind_of(x)}"
        )
    return x.reshape(-1, x.shape[-1])


def _scale_bytes_view(scales, float8: str):
    """uint8 scale bytes as ``float8`` (torch's and ml_dtypes' name), where the library has it."""
    library = library_of(scales)
    if library == "torch":
        import torch

        return scales.view(getattr(torch, float8))
    if library == "numpy":
        import ml_dtypes

        return scales.view(getattr(ml_dtypes, float8))
    return scales  # cupy has no float8 dtype: the bytes


def _in_library_of(array, values):
    """NumPy ``values`` (an index array) as an array of ``array``'s library and device."""
    import numpy as np

    library = library_of(array)
    if library == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(values)).to(array.device)
    if library == "cupy":
        import cupy

        return cupy.asarray(values)
    return np.asarray(values)


def _linear_scales(blocked, rows: int, groups: int, group_size: int):
    """The scale bytes of the blocked storage as a row-major ``[rows, groups]`` uint8 array."""
    geometry = Geometry((rows, groups * group_size), group_size, scale_layout("blocked"), False)
    offsets = geometry.scale_byte_offsets().reshape(rows, groups)
    flat = blocked.reshape(-1)
    return flat[_in_library_of(flat, offsets)]


def _tiles_8x4(linear):
    """FlashInfer's 8x4 layout of row-major scale bytes ``[rows, groups]``: flat uint8 of
    ``align(rows, 8) * align(groups, 4)`` bytes, scale ``(r, c)`` at ``(r // 8) * 8 *
    align(groups, 4) + (c // 4) * 32 + (r % 8) * 4 + c % 4``, padding zero."""
    import numpy as np

    rows, groups = linear.shape
    cols = -(-groups // 4) * 4
    r, c = np.arange(rows)[:, None], np.arange(groups)[None, :]
    offsets = (r // 8) * (8 * cols) + (c // 4) * 32 + (r % 8) * 4 + c % 4
    out = _zeros_like(linear, (-(-rows // 8) * 8 * cols,))
    out[_in_library_of(out, offsets.reshape(-1))] = linear.reshape(-1)
    return out


def _zeros_like(array, shape: tuple):
    """Zeros of ``shape`` in ``array``'s library, dtype and device."""
    if library_of(array) == "torch":
        return array.new_zeros(shape)
    return sys.modules[library_of(array)].zeros(shape, array.dtype)


def _check_layout_name(value, name: str) -> str:
    """FlashInfer's SfLayout (an enum or its name): 'layout_128x4', 'layout_8x4' or
    'layout_linear'."""
    text = getattr(value, "name", value)
    if text in ("layout_128x4", "layout_8x4", "layout_linear"):
        return text
    raise ValueError(
        f"{name}: expected an SfLayout or its name (layout_128x4, layout_8x4, layout_linear), "
        f"got {value!r}"
    )


def _pad_columns(x, columns: int):
    """``x [..., K]`` with zero columns appended up to ``columns`` (a copy)."""
    padded = _zeros_like(x, (*x.shape[:-1], columns))
    padded[..., : x.shape[-1]] = x
    return padded


def mxfp8_quantize(
    input,
    is_sf_swizzled_layout: bool = True,
    alignment: int = 32,
    enable_pdl=None,
    backend: str = "cuda",
    sf_swizzle_layout=None,
):
    """FlashInfer's ``mxfp8_quantize`` (flashinfer/quantization/fp8_quantization.py): MXFP8.

    Returns ``(x_q, sf)``: ``x_q`` float8_e4m3fn shaped like ``input`` with K padded with
    zero columns to a multiple of ``alignment`` (a multiple of 32; the padding is a copy of
    ``input``); ``sf`` a flat uint8 array of UE8M0 bytes, the 128x4 blocked tiles of
    ``align(M, 128) * align(K/32, 4)`` bytes (every leading dimension flattened into M), or
    with ``is_sf_swizzled_layout=False`` the row-major ``M * K/32`` bytes;
    ``sf_swizzle_layout`` (an SfLayout or its name) overrides it and also takes FlashInfer's
    8x4 layout (``align(M, 8) * align(K/32, 4)`` bytes, written from the row-major ones).
    Values are FlashInfer's, bit for bit: ``arithmetic="unfloored"`` (``docs/spec.md``,
    section 3b: no floor under the scale, infinities in the maximum). ``enable_pdl`` and
    ``backend`` are accepted and ignored (PDL is on where the device has it).
    """
    layout = "layout_128x4" if is_sf_swizzled_layout else "layout_linear"
    if sf_swizzle_layout is not None:
        layout = _check_layout_name(sf_swizzle_layout, "sf_swizzle_layout")
    valid = isinstance(alignment, int) and not isinstance(alignment, bool)
    if not valid or alignment < 32 or alignment % 32:
        raise ValueError(f"alignment: expected a positive multiple of 32, got {alignment!r}")
    x = _rows_2d(input)
    k = x.shape[1]
    padded_k = -(-k // alignment) * alignment
    if padded_k != k:
        x = _pad_columns(x, padded_k)
    blocked = layout == "layout_128x4"
    q, scales = quantize(x, 32, dtype="e4m3", scale="ue8m0", layout="blocked" if blocked else ROW,
                         arithmetic="unfloored")  # fmt: skip
    if not blocked:  # float32 powers of two (0 for byte 0) -> their exponent bytes
        bits = scales.view("int32") if library_of(scales) != "torch" else _torch_int32(scales)
        scales = _exponent_bytes(bits)
        if layout == "layout_8x4":
            scales = _tiles_8x4(scales)
    return q.reshape(*input.shape[:-1], padded_k), scales.reshape(-1)


def _torch_int32(scales):
    import torch

    return scales.view(torch.int32)


def _exponent_bytes(bits):
    """The biased exponents of positive float32 bit patterns, as uint8."""
    shifted = bits >> 23
    if library_of(bits) == "torch":
        import torch

        return shifted.to(torch.uint8)
    return shifted.astype("uint8")


def fp4_quantize(
    input,
    global_scale=None,
    sf_vec_size: int = 16,
    sf_use_ue8m0: bool = False,
    is_sf_swizzled_layout: bool = True,
    is_sf_8x4_layout: bool = False,
    is_global_scale_inversed: bool = False,
    enable_pdl=None,
    backend: str = "cuda",
):
    """FlashInfer's ``fp4_quantize`` (flashinfer/quantization/fp4_quantization.py): NVFP4
    (``sf_vec_size=16``), or MXFP4 (``sf_vec_size=32, sf_use_ue8m0=True``).

    Returns ``(x_q, sf)``: ``x_q`` uint8 ``[..., K/2]`` (first value in the low nibble);
    ``sf`` uint8 scale bytes (e4m3, or UE8M0 for MXFP4), the blocked tiles as
    ``[align(M, 128), align(K/G, 4)]`` or with ``is_sf_swizzled_layout=False`` row-major
    ``[M, K/G]`` (M: every leading dimension flattened). ``global_scale`` (a float or a
    one-element float32 tensor) multiplies the scale; NVFP4 needs it, MXFP4 takes 1 without
    one, as FlashInfer's own MXFP4 calls pass. Values are FlashInfer's reference's, bit for
    bit: ``arithmetic="reciprocal"`` (``docs/spec.md``, section 4a: ``RN(1/6)`` and
    reciprocals where the default divides; its kernels take approximate reciprocals). The
    8x4 layout and an inverted global scale are not implemented.
    """
    if (sf_vec_size, bool(sf_use_ue8m0)) not in ((16, False), (32, True)):
        raise NotImplementedError(
            f"sf_vec_size={sf_vec_size}, sf_use_ue8m0={sf_use_ue8m0}: NVFP4 (16, False) and "
            "MXFP4 (32, True) are implemented"
        )
    if is_sf_8x4_layout:
        raise NotImplementedError("is_sf_8x4_layout: the 8x4 scale layout is not implemented")
    if is_global_scale_inversed:
        raise NotImplementedError(
            "is_global_scale_inversed: an inverted global scale is not implemented"
        )
    if global_scale is None and not sf_use_ue8m0:
        raise ValueError(
            "global_scale: FlashInfer's fp4_quantize needs it for NVFP4 (sf_vec_size=16)"
        )
    if backend not in ("cuda", "cute-dsl"):
        raise ValueError(f"backend: expected 'cuda' or 'cute-dsl', got {backend!r}")
    q, scales = _fp4(input, global_scale, is_sf_swizzled_layout, sf_vec_size)
    return q.reshape(*input.shape[:-1], input.shape[-1] // 2), scales


def scaled_fp4_quant(
    input,
    input_global_scale,
    is_sf_swizzled_layout: bool = True,
    backend: str = "none",
    padded_n: int | None = None,
):
    """vLLM's ``scaled_fp4_quant`` (vllm/_custom_ops.py): NVFP4.

    Returns ``(output, output_scale)``: ``output`` uint8 ``[m, n/2]`` (``input`` reshaped to
    ``[-1, n]``); ``output_scale`` the blocked e4m3 bytes ``[align(m, 128), align(n/16, 4)]``
    viewed as float8_e4m3fn (vLLM's int32 storage, viewed), or with
    ``is_sf_swizzled_layout=False`` ``[m, n/16]`` (also viewed). Values are vLLM's
    reference's, bit for bit: ``arithmetic="reciprocal"`` (``docs/spec.md``, section 4a).
    The TensorRT-LLM backend's 8x4 layout (vLLM takes it for m <= 32) and ``padded_n`` past
    ``n`` are not implemented.
    """
    rows = 1 if len(input.shape) == 1 else math.prod(input.shape[:-1])
    if "trtllm" in backend and rows <= 32:  # where vLLM switches to FlashInfer's 8x4 layout
        raise NotImplementedError(
            f"backend={backend!r} with m = {rows} <= 32: the 8x4 scale layout is not implemented"
        )
    if padded_n is not None and padded_n != input.shape[-1]:
        raise NotImplementedError(f"padded_n={padded_n}: padding n is not implemented")
    if input_global_scale is None:
        raise ValueError("input_global_scale: vLLM's scaled_fp4_quant needs it")
    q, scales = _fp4(input, input_global_scale, is_sf_swizzled_layout, 16)
    return q, _scale_bytes_view(scales, "float8_e4m3fn")  # vLLM views both layouts as fp8


def _fp4(input, global_scale, swizzled: bool, group_size: int):
    """(q ``[rows, K/2]``, uint8 scale bytes, blocked or row-major) of input as ``[rows, K]``:
    NVFP4 (16) or MXFP4 (32) by upstream's arithmetic."""
    x = _rows_2d(input)
    q, scales = quantize(x, group_size, dtype="e2m1", scale="e4m3" if group_size == 16 else
                         "ue8m0", layout="blocked", global_scale=global_scale,
                         arithmetic="reciprocal")  # fmt: skip
    if not swizzled:
        return q, _linear_scales(scales, x.shape[0], x.shape[1] // group_size, group_size)
    return q, scales


# 128x128 weights and the training orientations (docs/spec.md, sections 3c, 4c and 4d) -------

DEEPGEMM_EPS = 1e-4  # the clamp of DeepGEMM's amax (deep_gemm/utils/math.py)
TORCHAO_EPS = 1e-12  # torchao's blockwise training kernels' EPS


def per_block_cast_to_fp8(x, use_ue8m0: bool, gran_k: int = 128):
    """DeepGEMM's ``per_block_cast_to_fp8`` (deep_gemm/utils/math.py at commit 38939a4, the
    same function vLLM and SGLang copy): e4m3 codes ``[m, n]`` and float32 block scales
    ``[ceil(m/128), ceil(n/128)]`` of 128x128 blocks, partial edge blocks allowed, the block
    maximum clamped at 1e-4. ``use_ue8m0`` makes the scales powers of two (the ceiling of
    ``amax / 448``).

    Values are DeepGEMM's as it runs on CUDA tensors, bit for bit: with float scales
    ``s = RN(amax * RN(1 / 448))`` (torch's CUDA division by a Python number) and each value
    multiplied by ``RN(1 / s)``, ``arithmetic="reciprocal"`` (docs/spec.md, section 3c: 45% of
    the scales and 0.025% of the codes of random bfloat16 weights differ from section 3's);
    with ``use_ue8m0`` the default arithmetic is DeepGEMM's (the same powers of two, by which
    both multiply exactly). A NaN in a block makes DeepGEMM's whole block NaN (its maximum is
    NaN); here it stays in its own code (section 5).
    ``gran_k`` other than 128 is refused (the blocks here are 128x128).
    """
    if gran_k != 128:
        raise ValueError(f"gran_k: only 128 (128x128 blocks) is supported, got {gran_k!r}")
    if len(tuple(x.shape)) != 2:
        raise ValueError(f"x: expected a 2-D weight [m, n], got shape {tuple(x.shape)}")
    if use_ue8m0:
        return quantize_weight(x, scale="ue8m0", eps=DEEPGEMM_EPS)
    return quantize_weight(x, eps=DEEPGEMM_EPS, arithmetic="reciprocal")


TORCHAO_GROUPS = (128, 256)  # torchao's block sizes the activation drop-ins take
TORCHAO_BLOCKS = (128, 256)  # and the weight drop-ins (square blocks of these sides)


def _torchao_checks(block_size, dtype, sizes: tuple[int, ...]) -> None:
    """torchao's arguments: a ``block_size`` of ``sizes``, and e4m3 (as torchao asserts)."""
    if isinstance(block_size, bool) or block_size not in sizes:
        raise ValueError(f"block_size: expected {' or '.join(map(str, sizes))}, got {block_size!r}")
    if dtype is not None and "float8_e4m3fn" not in str(dtype):
        raise ValueError(f"dtype: torchao's blockwise kernels write float8_e4m3fn, got {dtype}")


# NOTES: torchao's kernels take the multiplier 448 / amax first and store its reciprocal
# (docs/spec.md, section 3c: 30% of the scales of random groups differ by an ulp from
# amax / 448, and a few codes); each drop-in below takes that arithmetic
TORCHAO_ARITHMETIC = "multiplier"


def act_quant_lhs(x, block_size: int = 128, dtype=None):
    """torchao's ``triton_fp8_blockwise_act_quant_lhs`` (torchao/prototype/blockwise_fp8_training/
    kernels.py at commit 0598012): ``x [M, K]`` in 1 x ``block_size`` groups (128 or 256);
    codes ``[M, K]`` row-major, scales ``[M, K/block_size]`` column-major (strides ``(1, M)``),
    the layout ``torch._scaled_mm`` reads. The scale is the dequantization factor (torchao
    calls it the reciprocal scale).

    Values are torchao's torch reference's, bit for bit: ``arithmetic="multiplier"``
    (docs/spec.md, section 3c: each value times ``r = RN(448 / amax)``, the scale stored
    ``RN(1 / r)``), with torchao's ``EPS`` (1e-12). NaN and Inf follow section 5.
    """
    _torchao_checks(block_size, dtype, TORCHAO_GROUPS)
    return quantize(x, block_size, layout=COL, eps=TORCHAO_EPS, arithmetic=TORCHAO_ARITHMETIC)


def act_quant_transposed_lhs(x, block_size: int = 128, dtype=None):
    """torchao's ``triton_fp8_blockwise_act_quant_transposed_lhs`` (same file and commit):
    ``x [M, K]`` quantized transposed, groups of ``block_size`` tokens of one channel; codes
    ``[K, M]`` row-major, scales ``[K, M/block_size]`` strides ``(1, K)``: ``quantize(x,
    block_size, orientation="col", layout="col")``. torchao requires M to be a multiple of
    ``block_size``; here the last token group may be partial. Any K, as torchao: where K is
    not a multiple of ``block_size``, a copy of x padded with zero channels is quantized and
    the scales are copied to strides ``(1, K)``. Values as ``act_quant_lhs``'s; ``block_size``
    128 or 256."""
    _torchao_checks(block_size, dtype, TORCHAO_GROUPS)
    k = x.shape[-1] if len(tuple(x.shape)) == 2 else 0
    padded_k = -(-k // block_size) * block_size
    source = x if padded_k == k else _pad_columns(x, padded_k)
    qt, scales_t = quantize(source, block_size, layout=COL, eps=TORCHAO_EPS, orientation="col",
                            arithmetic=TORCHAO_ARITHMETIC)  # fmt: skip
    if padded_k == k:
        return qt, scales_t
    return qt[:k], _contiguous(scales_t[:k].T).T


def act_quant_rhs(x, block_size: int = 128, dtype=None):
    """torchao's ``triton_fp8_blockwise_act_quant_rhs`` (same file and commit): ``x [M, K]`` in
    ``block_size`` x 1 groups (tokens of one channel); codes ``[M, K]`` column-major (strides
    ``(1, M)``), scales ``[M/block_size, K]`` row-major: the column-wise result's transposes,
    no copy. torchao returns ``1 / (448 / amax)`` here too (its docstring says scales).
    Values and block sizes as ``act_quant_transposed_lhs``'s."""
    _torchao_checks(block_size, dtype, TORCHAO_GROUPS)
    qt, scales_t = quantize(x, block_size, layout=COL, eps=TORCHAO_EPS, orientation="col",
                            arithmetic=TORCHAO_ARITHMETIC)  # fmt: skip
    return qt.T, scales_t.T


def weight_quant_rhs(x, block_size: int = 128, dtype=None):
    """torchao's ``triton_fp8_blockwise_weight_quant_rhs`` (same file and commit): ``B x B``
    blocks of ``x [M, N]`` (``B = block_size``, 128 or 256); codes ``[M, N]`` column-major
    (strides ``(1, M)``), scales ``[M/B, N/B]`` strides ``(1, M/B)``. Column-major codes are
    those of ``x`` transposed, so ``x.T`` is quantized (a copy of the input where it is not
    already column-major). Values as ``act_quant_lhs``'s."""
    _torchao_checks(block_size, dtype, TORCHAO_BLOCKS)
    q, scales = quantize_weight(_contiguous(x.T), (block_size, block_size), eps=TORCHAO_EPS,
                                arithmetic=TORCHAO_ARITHMETIC)  # fmt: skip
    return q.T, scales.T


def weight_quant_transposed_rhs(x, block_size: int = 128, dtype=None):
    """torchao's ``triton_fp8_blockwise_weight_quant_transposed_rhs`` (same file and commit):
    ``B x B`` blocks of ``x [M, N]``, returned transposed: codes ``[N, M]`` column-major (strides
    ``(1, N)``), scales ``[N/B, M/B]`` strides ``(1, N/B)``: the transposes of
    ``quantize_weight(x)``, no copy. Values and block sizes as ``weight_quant_rhs``'s."""
    _torchao_checks(block_size, dtype, TORCHAO_BLOCKS)
    q, scales = quantize_weight(x, (block_size, block_size), eps=TORCHAO_EPS,
                                arithmetic=TORCHAO_ARITHMETIC)  # fmt: skip
    return q.T, scales.T


def _contiguous(array):
    """``array`` row-major: torch's ``contiguous()``, or its library's ``ascontiguousarray``
    (numpy, cupy); no copy where it already is."""
    if hasattr(array, "contiguous"):
        return array.contiguous()
    library = sys.modules[library_of(array)]
    return library.ascontiguousarray(array)
