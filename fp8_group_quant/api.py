"""The public entry points. Each call goes one way: ``_run`` describes the arrays, validates
them into a Request (``_request``), and runs the NumPy backend or a GPU plan."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, TypeVar

from . import _device, _jit, _plan, _run, _settings
from ._arrays import device_signature, is_dynamo_compiling, kind_of
from ._dequantize import as_float8, dequantize, dequantize_weight, scale_offsets, unpack_scales
from ._device import PreparedQuantize
from ._layout import PACKED, WEIGHT_BLOCK, LayoutName, WeightLayoutName
from ._outputs import BothOrientations
from ._request import (
    Options,
    check_global_given,
    check_options,
    check_weight_options,
    split_norm,
)
from ._spec import (
    DEFAULT_EPS,
    INPUT_TYPES,
    ActivationName,
    OrientationName,
    OutputDType,
    ScaleName,
    ScaleRuleName,
)

Array = TypeVar("Array", bound=Any)  # numpy, cupy, torch (CPU or CUDA), JAX or numba

__all__ = [
    "BothOrientations",
    "PreparedQuantize",
    "as_float8",
    "dequantize",
    "dequantize_weight",
    "prepare",
    "quantize",
    "quantize_packed",
    "quantize_weight",
    "scale_offsets",
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
    orientation: OrientationName = "row",
    clamp_limit: float | None = None,
    arithmetic: str = "float32",
    norm_rounding: str = "once",
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
        float8_e4m3fnuz (AMD; clamped at 224 as vLLM and SGLang do on ROCm); "e2m1" is FP4,
        codes two to a byte in uint8 ``[..., K/2]`` (first value in the low nibble): NVFP4 with
        ``scale="e4m3"`` (see ``global_scale``), MXFP4 with ``scale="ue8m0"``
        (``group_size=32``, layout ``"row"`` or ``"blocked"``, ``eps`` and ``scale_rule`` apply;
        ``docs/spec.md``, section 4b).
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
    activation : {None, "silu_mul", "gelu_tanh_mul"}
        ``"silu_mul"``: ``x`` is ``[..., 2N]``, gate then up, and the values quantized are
        ``round(round(silu(gate)) * up)`` in x's dtype (the engines' ``silu_and_mul`` output,
        defined op by op in ``fp8_group_quant.activation``); ``q`` is ``[..., N]``.
        ``"gelu_tanh_mul"``: the same with the tanh-approximate GELU (GeGLU; ``docs/spec.md``,
        section 2c). Each input byte is read once; ``x`` must be 16-byte aligned on the GPU.
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
        ``amax`` minus the format's ``emax_elem`` (8 for e4m3, 15 for e5m2, 2 for e2m1), at
        least 2^-126; values beyond ``fmax`` saturate. Needs ``scale="ue8m0"`` and e4m3, e5m2
        or MXFP4's e2m1 (``docs/spec.md``, section 3).
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
        third output, a one-element float32 array. No other option applies to NVFP4 but
        ``arithmetic``. MXFP4 takes one with ``arithmetic="reciprocal"`` only (None: 1).
    orientation : {"row", "col", "both"}
        ``"row"``: groups of channels (everything above). ``"col"``: ``x [M, K]`` quantized
        transposed, for the weight-gradient GEMM: ``qt [K, M]`` with each value in its group
        of ``group_size`` consecutive tokens of one channel (the last group partial when
        ``M % group_size``: its maximum over the tokens that exist), scales in ``layout``
        over ``[K, ceil(M / group_size)]`` (``"col"``: strides ``(1, K)``, what
        ``torch._scaled_mm`` reads). ``"both"``: ``BothOrientations(q, scales, qt,
        scales_t)`` from one read of ``x``; ``out`` and ``scale_out`` are then pairs (row,
        col). Not with ``pad_rows``, ``activation``, ``norm``, ``masked_m``, FP4 or
        ``layout="blocked"`` (``docs/spec.md``, section 4d).
    clamp_limit : float, optional
        With a gated ``activation``: the clamped SwiGLU of gpt-oss-style models, the gate
        clamped from above and the up value on both sides at ``clamp_limit`` (rounded to x's
        dtype) before the activation (``docs/spec.md``, section 2a).
    arithmetic : {"float32", "bfloat16", "unfloored", "reciprocal", "multiplier"}
        ``"float32"`` (default): sections 3, 4a and 4b. The others are upstream kernels'
        steps, for drop-ins that must match them bit for bit. ``"bfloat16"``: bfloat16 input
        only, the group maximum, scale, reciprocal and scaled values rounded to bfloat16 as
        vLLM's masked SiLU kernel does (section 3a). ``"unfloored"``: MXFP8 (e4m3, UE8M0,
        ``group_size=32``) as FlashInfer's ``mxfp8_quantize`` computes it: no floor under
        the scale (a zero group has byte 0 and zero codes), infinities in the maximum
        (section 3b). ``"reciprocal"``: NVFP4 and MXFP4 as vLLM's ``scaled_fp4_quant`` and
        FlashInfer's ``fp4_quantize`` compute them, multiplying by ``RN(1/6)`` and by
        reciprocals where section 4a divides; MXFP4 then takes ``global_scale`` too
        (default 1) (section 4a). ``"multiplier"``: e4m3 with float scales in groups of 128
        or 256, as torchao's blockwise training quantizers compute it: each value times
        ``r = RN(448 / amax)``, the scale stored ``RN(1 / r)`` (``eps >= 2**-64``; section 3c).
    norm_rounding : {"once", "twice", "twice_unrounded_sum"}
        With ``norm``: ``"once"`` (default) rounds ``x * r * weight`` once (section 2b);
        ``"twice"`` rounds ``x * r`` to x's dtype before the weight, as vLLM's RMSNorm does;
        ``"twice_unrounded_sum"`` is ``"twice"`` that, with ``residual``, normalises the
        float32 sum ``x + residual`` unrounded, as vLLM's add-RMSNorm does (the sum written
        back to ``residual`` is rounded to x's dtype in every mode).

    Returns
    -------
    q : array of ``x``'s library, shape ``x.shape``
        numpy: ``ml_dtypes.float8_*`` / ``int8``; torch: ``torch.float8_*`` / ``torch.int8``;
        cupy: ``uint8`` holding the float8 bytes (see ``as_float8``) / ``int8``.
    scales : array of ``x``'s library, shape ``x.shape[:-1] + (ng or kp,)``, strides as above.
    global_scale : NVFP4 with ``global_scale=None`` only: the computed global scale.
    """
    plain = clamp_limit is None and arithmetic == "float32" and norm_rounding == "once"
    # NOTES: the hot path: a plan made for the same input layout and options serves the call
    # without validating again (the options were, when it was made). Only for the numeric
    # options' own types: 128.0 == 128 and 1 == True would find the plan of a valid call and
    # skip the check that refuses them.
    exact = type(group_size) is int and type(pad_rows) is bool and type(eps) is float
    alone = masked_m is None and norm is None and residual is None and global_scale is None
    if exact and plain and alone and expected_m is None:
        done = cached_run(x, (group_size, dtype, scale, layout, eps, pad_rows, activation,
                              scale_rule, orientation), out, scale_out)  # fmt: skip
        if done is not None:
            return done
    if _dynamo_tracing(x):  # torch.compile: the custom op, which dynamo traces
        from . import torch_ops

        if orientation != "row":
            raise ValueError(
                f"orientation: torch.compile traces the row-wise quantizer only, got "
                f"{orientation!r}; call it outside the compiled region"
            )

        return torch_ops.quantize_traced(
            x, group_size, out, scale_out, dtype=dtype, scale=scale, layout=layout, eps=eps,
            pad_rows=pad_rows, activation=activation, masked_m=masked_m, expected_m=expected_m,
            norm=norm, residual=residual, scale_rule=scale_rule, global_scale=global_scale,
            clamp_limit=clamp_limit, arithmetic=arithmetic, norm_rounding=norm_rounding,
        )  # fmt: skip
    call = _call(group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule,
                 masked_m, expected_m, norm, residual, global_scale, orientation,
                 (clamp_limit, arithmetic, norm_rounding))  # fmt: skip
    return _run.quantize(x, call, out, scale_out)


def cached_run(x, raw: tuple, out=None, scale_out=None):
    """The hot path: ``x`` run by the plan cached for its layout and the options ``raw``
    (group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule, orientation, of
    exactly the types a valid call's are: ints, a float, a bool), or None where none is (a
    host array, a layout or options not seen yet)."""
    signature = device_signature(x)
    if signature is None:
        return None
    plan = _device.cached((*signature[:-1], raw))
    return None if plan is None else plan.run(signature[-1], out, scale_out)


def _dynamo_tracing(x) -> bool:
    """``x`` is a torch tensor that torch.compile's dynamo is tracing (a folded constant there)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor) and is_dynamo_compiling(torch)


def _call(group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule, masked_m,
          expected_m, norm, residual, global_scale, orientation="row",
          modes=(None, "float32", "once")) -> _run.Call:  # fmt: skip
    """The validated options of a call and its other arrays; ``modes``: (clamp_limit,
    arithmetic, norm_rounding)."""
    weight, eps_norm = split_norm(norm, residual)
    options = check_options(group_size, dtype, scale, layout, eps, pad_rows, activation,
                            scale_rule, expected_m, eps_norm, orientation, *modes)  # fmt: skip
    raw: tuple = (group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule,
                  orientation)  # fmt: skip
    if expected_m is not None or eps_norm is not None or modes != (None, "float32", "once"):
        raw += (expected_m, eps_norm, *modes)
    check_global_given(options, global_scale is not None)
    arrays, global_value = _run.global_scale_arguments(global_scale)
    given = {"masked_m": masked_m, "weight": weight, "residual": residual, **arrays}
    arrays = {name: array for name, array in given.items() if array is not None}
    return _run.Call(options, raw, arrays, global_value)


def quantize_weight(
    w: Array,
    block: tuple[int, int] = (WEIGHT_BLOCK, WEIGHT_BLOCK),
    *,
    dtype: OutputDType = "e4m3",
    scale: ScaleName = "float32",
    layout: WeightLayoutName = "row",
    eps: float = DEFAULT_EPS,
    scale_rule: ScaleRuleName = "rceil",
    out=None,
    scale_out=None,
    arithmetic: str = "float32",
) -> tuple[Array, Array]:
    """Quantize a weight ``w [N, K]`` (or experts ``[E, N, K]``) in 128x128 (or 256x256) blocks.

    For each block ``v`` of ``B = 128`` (or 256) rows by ``B`` columns (cut at ``N`` and
    ``K``: a partial edge block's maximum is over the values that exist): ``amax = max(eps,
    max|v_i| over finite v_i)``, ``s = amax / fmax`` or its UE8M0 power of two,
    ``q_i = RNE(clamp(v_i / s))``: the arithmetic of ``quantize`` (``docs/spec.md``, section
    4c), bit for bit.

    Parameters
    ----------
    w : numpy.ndarray or torch CPU tensor, ``[N, K]`` or ``[E, N, K]``
        bfloat16, float16 or float32; last dimension contiguous; any ``N`` and ``K``.
    block : (128, 128) or (256, 256)
        256x256: torchao's other block size (every layout but ``packed``).
    dtype : {"e4m3", "e5m2"}
    scale : {"float32", "ue8m0"}
    layout : {"row", "col", "bytes", "packed"}
        With ``nb = ceil(N/B)``, ``kb = ceil(K/B)``: ``row`` float32 ``[nb, kb]`` strides
        ``(kb, 1)`` (DeepGEMM on SM90; ``torch._scaled_mm`` takes its ``.t()``); ``col``
        float32 ``[nb, kb]`` strides ``(1, nb)``; ``bytes`` uint8 exponent bytes ``[nb, kb]``
        (UE8M0); ``packed`` int32 ``[N, ceil(kb/4)]`` strides ``(1, align(N, 4))``, row ``n``
        holding block row ``n // 128``'s exponents four to a word (UE8M0; DeepGEMM on SM100).
        Batched weights put the expert dimension first (stride ``nb*kb``, or
        ``align(N, 4) * ceil(kb/4)`` for ``packed``).
    eps, scale_rule : as for ``quantize``.
    out, scale_out : optional, with exactly the shapes, dtypes and strides returned.
    arithmetic : {"float32", "reciprocal", "multiplier"}
        ``"float32"`` (default): section 3's. The others multiply each value where the default
        divides by the scale, for drop-ins that must match an upstream bit for bit (e4m3,
        float scales, ``eps >= 2**-64``; section 3c): ``"reciprocal"`` by ``RN(1 / s)`` of
        ``s = RN(amax * RN(1 / 448))``, as DeepGEMM's ``per_block_cast_to_fp8`` on CUDA;
        ``"multiplier"`` by ``r = RN(448 / amax)``, storing ``s = RN(1 / r)``, as torchao's
        blockwise quantizers.

    Returns
    -------
    q : ``w``'s shape, float8 codes (numpy ``ml_dtypes``, torch ``float8``).
    scales : as ``layout`` says.
    """
    # NOTES: the hot path, as quantize's: a plan made for the same weight layout and options
    # (of their own types: 128.0 == 128) serves the call without validating again
    raw = None
    if type(eps) is float and type(block) is tuple and all(type(b) is int for b in block):
        raw = ("weight", block, dtype, scale, layout, eps, scale_rule, arithmetic)
        signature = device_signature(w)
        plan = None if signature is None else _device.cached((*signature[:-1], raw))
        if plan is not None:
            return plan.run(signature[-1], out, scale_out)
    options = check_weight_options(block, dtype, scale, layout, eps, scale_rule, arithmetic)
    return _run.quantize_weight(w, options, out, scale_out, raw)


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
    global_scale=None,
) -> PreparedQuantize:
    """Validate once and return a callable that quantizes arrays laid out like ``x``.

    Arguments as for ``quantize``; ``x`` must be a cupy array or torch CUDA tensor. The outputs
    (``out``/``scale_out``, or buffers allocated here) are reused by every call, and so are
    ``masked_m``, the norm's weight and ``residual``: the callable takes ``x`` alone and reads
    the others where they were (update them in place, as a CUDA graph's static buffers). This
    is the lowest-overhead eager path for decode-sized inputs; the first call here also
    compiles, and quantizes ``x`` (writing the residual, with ``norm``). NVFP4 with a
    computed global scale returns a fresh scale from each call (a third output).
    """
    signature = device_signature(x)
    if signature is None:
        raise TypeError(
            f"x: prepare needs a cupy array or torch CUDA tensor (it binds GPU buffers; it is "
            f"GPU-only), got {kind_of(x)}; call quantize for host arrays"
        )
    call = _call(group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule,
                 masked_m, expected_m, norm, residual, global_scale)  # fmt: skip
    plan, info, request, described = _run.device_plan(x, call, out, scale_out)
    extra = _run.extra_pointers(request, described)
    outputs = plan.run(info.ptr, out, scale_out, extra)
    r_info = described.get("residual")
    residual_info = None if r_info is None else dataclasses.replace(r_info, obj=None)
    return PreparedQuantize(plan, signature[:-1], outputs, extra, residual_info,
                            bound=tuple(call.arrays.values()))  # fmt: skip


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
    # NOTES: quantize's hot path, reached without binding its 21 parameters (0.4-0.8 us a call
    # on the H100 and the H200); the key is the one quantize builds for these options (tested)
    if type(group_size) is int and type(pad_rows) is bool and type(eps) is float:
        done = cached_run(x, (group_size, "e4m3", "ue8m0", PACKED, eps, pad_rows, None, "rceil",
                              "row"), out, scale_out)  # fmt: skip
        if done is not None:
            return done
    q, scales = quantize(x, group_size, dtype="e4m3", scale="ue8m0", layout=PACKED, eps=eps,
                         out=out, scale_out=scale_out, pad_rows=pad_rows)  # fmt: skip
    return q, scales


_WARMUP_OPTIONS = ("group_size", "dtype", "scale", "layout", "eps", "pad_rows", "activation",
                   "scale_rule")  # fmt: skip


def warmup(device: int | None = None, variants=None) -> list[str]:
    """Compile (or read from the disk cache) and load kernels on ``device`` before serving.

    ``device``: a CUDA ordinal (default: the current device). ``variants``: None for the default
    kernel (bfloat16, G = 128, e4m3, packed UE8M0 scales; all its paths: the one-pass kernel for
    contiguous rows and through x's strides, and the row loop), ``"all"`` for every instantiation
    (NVFP4's included), or an iterable of dicts of ``quantize`` options plus ``input_dtype``
    (default ``"bfloat16"``), e.g. ``[{"input_dtype": "float16", "scale": "ue8m0", "layout":
    "col_tma"}]``. Kernels for 16-byte aligned inputs are loaded; the unaligned fallback loads
    on first use. Returns the name expressions now loaded.
    """
    if isinstance(variants, (str, dict)) and variants != "all":
        raise TypeError(f"variants: expected None, 'all' or an iterable of dicts, got {variants!r}")
    if variants is None:
        expressions = [key.name_expression for key in _plan.DEFAULT_KEYS]
    elif variants == "all":  # the same list, in the same chunks, as tools/precompile.py
        expressions = _plan.all_name_expressions()
    else:
        keys = [key for v in variants for key in _plan.warmup_keys(*_warmup_options(dict(v)))]
        expressions = list(dict.fromkeys(key.name_expression for key in keys))
    if device is None:
        if not _jit.device_count():  # ask the driver first: CuPy's own error names no cause
            raise _jit.GpuUnavailableError(
                "device: warmup loads kernels on a CUDA device, and none is visible here (no "
                "NVIDIA driver or no GPU); on a machine without one, quantize runs on the host"
            )
        device = _jit.cupy_module().cuda.runtime.getDevice()
    _jit.preload(_plan.SOURCE, expressions, int(device))
    return expressions


def _warmup_options(variant: dict) -> tuple[str, Options]:
    input_dtype = variant.pop("input_dtype", "bfloat16")
    unknown = set(variant) - set(_WARMUP_OPTIONS)
    if unknown:
        raise TypeError(f"variants: unknown option(s) {', '.join(sorted(unknown))}")
    if input_dtype not in INPUT_TYPES:
        raise ValueError(f"variants: input_dtype must be one of {', '.join(INPUT_TYPES)}")
    defaults = dict(group_size=128, dtype="e4m3", scale="float32", layout="row")
    return input_dtype, check_options(**{**defaults, **variant})


def _compile_on_import() -> None:
    """NVRTC into the disk cache for the visible devices' architectures; no CUDA context is
    created and no device selected (modules load at first use, or through ``warmup``)."""
    if _settings.compile_on_import():
        _jit.precompile(_plan.SOURCE, [key.name_expression for key in _plan.DEFAULT_KEYS])


_compile_on_import()
