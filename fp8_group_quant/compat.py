"""Drop-in replacements for the quantizers vLLM and SGLang call, with their signatures.

Outputs have the shapes, dtypes and strides those functions return, and the values of
fp8_group_quant's contract (see the README). Swap by changing an import::

    # from vllm.model_executor.layers.quantization.utils.fp8_utils import per_token_group_quant_fp8
    from fp8_group_quant.compat import per_token_group_quant_fp8

    # from sglang.srt.layers.quantization.fp8_kernel import sglang_per_token_group_quant_fp8
    from fp8_group_quant.compat import sglang_per_token_group_quant_fp8
"""

from __future__ import annotations

from ._layout import COL, COL_TMA, PACKED, ROW
from .api import quantize

__all__ = [
    "per_token_group_quant_fp8",
    "per_token_group_quant_fp8_packed_for_deepgemm",
    "sglang_per_token_group_quant_fp8",
    "silu_mul_per_token_group_quant_fp8_colmajor",
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
    (``fp8_group_quant.activation``) into ``[..., N]``. The masked MoE layout (``masked_m``) is
    not implemented yet and raises NotImplementedError.

    Example: ``q, s = sglang_per_token_group_quant_fp8(x, 128, column_major_scales=True,
    scale_tma_aligned=True, scale_ue8m0=True)``.
    """
    if masked_m is not None:
        raise NotImplementedError("masked_m: the masked MoE layout is not implemented yet")
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
    )


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
    powers of two (None means False here; vLLM reads its DeepGEMM setting). Values follow this
    library's contract: vLLM scales by a rounded ``1/448`` and takes ``exp`` from Triton, so a
    few codes differ (docs/spec.md, section 8). The gate variants vLLM adds (``clamp_limit``,
    ``alpha``/``beta`` for SwiGLU-OAI) and the expert-ends layout are not implemented and raise
    NotImplementedError; unlike vLLM, ``M`` need not be a multiple of 8.
    """
    for name, value, default in (
        ("clamp_limit", clamp_limit, None), ("alpha", alpha, 1.0), ("beta", beta, 0.0),
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
    )
