"""Validate a call once, into a frozen ``Request`` that every backend reads.

Every entry point goes through ``make_request``: the options become one ``Options`` value, the
input and the other arrays of the call (masked_m, the norm's weight, the residual, NVFP4's
global scale) are described once and checked, and the output geometry is fixed. Nothing below
this module checks an argument again. Input geometry (dtype, shape, strides) and output
geometry (``Geometry``: q and the scales) are separate, so an input mode whose output shape
differs from its input (SiLU-and-multiply halves K) changes ``output_shape`` alone.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ._abi import LANE_BYTES, MAX_NORM_LANES, NORM_ROUNDINGS
from ._arrays import NUMPY, ArrayInfo, check_companion
from ._layout import (
    BLOCKED,
    PACKED,
    WEIGHT_BLOCK,
    WEIGHT_BLOCKS,
    WEIGHT_LAYOUTS,
    WEIGHT_NEEDS_UE8M0,
    Geometry,
    ScaleLayout,
    WeightGeometry,
    combination_error,
    row_strides,
    scale_layout,
    transposed_geometry,
)
from ._plan import (
    MULTIPLIER,
    MULTIPLIER_GROUPS,
    RECIPROCAL,
    TILE_FORMAT,
    UNFLOORED,
    KernelKey,
    compiled_arithmetic,
    fp4_key,
    grid_limits_error,
    max_experts,
)
from ._spec import (
    DEFAULT_EPS,
    E2M1,
    FP4_BY_SCALE,
    FP4_FORMATS,
    INPUT_TYPES,
    Fp4Format,
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
NVFP4_GROUP = FP4_FORMATS["nvfp4"].group_size  # NVFP4: values a scale
E4M3_SCALE = FP4_FORMATS["nvfp4"].scale  # NVFP4's block scale format
NVFP4_GIVEN, NVFP4_ON_DEVICE, NVFP4_COMPUTED = 0, 1, 2  # where NVFP4's global scale comes from
ROW_WISE, COLUMN_WISE, BOTH = "row", "col", "both"  # orientations (docs/spec.md, section 4d)
ORIENTATIONS = (ROW_WISE, COLUMN_WISE, BOTH)
WEIGHT_FORMATS = ("e4m3", "e5m2")  # the formats torch._scaled_mm and DeepGEMM read


@dataclass(frozen=True)
class Options:
    """Every option of a call, checked. ``fp4``: e2m1 codes two a byte, the FP4 format's scales."""

    group_size: int
    fmt: OutputFormat | None  # None for FP4, whose e2m1 codes have no FP8 format row
    scale: ScaleFormat | None  # None for FP4, whose scales its Fp4Format row names
    layout: ScaleLayout
    eps: float
    pad_rows: bool
    mode: InputMode
    scale_rule: str = "rceil"
    expected_m: int | None = None  # masked layout: rows per expert the grid is sized for
    eps_norm: float | None = None  # fused RMSNorm when set
    fp4: Fp4Format | None = None  # dtype="e2m1": NVFP4 or MXFP4
    orientation: str = ROW_WISE  # "col": x transposed, groups along tokens; "both": both
    clamp_limit: float | None = None  # gated activations: the gate and up clamp (float32 value)
    arithmetic: str = "float32"  # an upstream kernel's steps: a key of ARITHMETIC_CODES
    norm_rounding: str = "once"  # NORM_ROUNDINGS: vLLM's RMSNorm arithmetic, section 2b

    @property
    def norm(self) -> bool:
        return self.eps_norm is not None

    @property
    def nvfp4(self) -> bool:
        """An FP4 format with a global scale: NVFP4's amax pass, scratch and third output."""
        return self.fp4 is not None and self.fp4.global_scale

    @property
    def takes_global(self) -> bool:
        """A global scale is read: NVFP4's, or MXFP4's with arithmetic='reciprocal' (1 where
        none is given)."""
        return self.nvfp4 or (self.fp4 is not None and self.arithmetic == RECIPROCAL)


def is_fp4(dtype, scale) -> bool:
    """The call asks for an FP4 format: e2m1 values, or NVFP4's e4m3 scales (which need them)."""
    named = lambda value, name: isinstance(value, str) and value == name  # noqa: E731
    return named(dtype, E2M1) or named(scale, E4M3_SCALE)


def check_options(
    group_size, dtype, scale, layout, eps=DEFAULT_EPS, pad_rows=False, activation=None,
    scale_rule="rceil", expected_m=None, eps_norm=None, orientation=ROW_WISE, clamp_limit=None,
    arithmetic="float32", norm_rounding="once",
) -> Options:  # fmt: skip
    """The ``Options`` of a call's arguments, each checked (TypeError or ValueError naming it)."""
    norm_rounding = _check_norm_rounding(norm_rounding, eps_norm)
    if not isinstance(orientation, str) or orientation not in ORIENTATIONS:
        raise ValueError(
            f"orientation: expected one of {', '.join(map(repr, ORIENTATIONS))}, got "
            f"{orientation!r}"
        )
    if is_fp4(dtype, scale):
        if orientation != ROW_WISE:
            raise ValueError(f"orientation: {orientation!r} is not supported with dtype='e2m1'")
        if clamp_limit is not None:
            raise ValueError("clamp_limit: not supported with dtype='e2m1'")
        return _fp4_options(group_size, dtype, scale, layout, eps, pad_rows, activation,
                            scale_rule, expected_m, eps_norm, arithmetic)  # fmt: skip
    group_size = check_group_size(group_size)
    fmt, scale, layout = output_format(dtype), scale_format(scale), scale_layout(layout)
    error = combination_error(fmt, scale, layout)
    if error:
        raise ValueError(error)
    mode = input_mode(activation)
    if eps_norm is not None:
        eps_norm = _check_eps_norm(eps_norm)
        if mode.name is not None:
            raise ValueError("norm: cannot be combined with activation")
    options = Options(
        group_size, fmt, scale, layout, check_eps(eps), check_flag(pad_rows, "pad_rows"), mode,
        check_scale_rule(scale_rule, fmt, scale), _check_expected_m(expected_m), eps_norm,
        orientation=orientation,
        clamp_limit=_check_clamp_limit(clamp_limit, mode),
        arithmetic=_check_arithmetic(arithmetic, fmt, scale, scale_rule, group_size, eps,
                                     orientation, mode.name is not None or eps_norm is not None),
        norm_rounding=norm_rounding,
    )  # fmt: skip
    _check_orientation(options)
    return options


def _check_orientation(options: Options) -> None:
    """The options the column-wise kernel does not take (docs/spec.md, section 4d)."""
    if options.orientation == ROW_WISE:
        return
    refused = {
        "layout": options.layout.name == BLOCKED,
        "pad_rows": options.pad_rows,
        "activation": options.mode.name is not None,
        "norm": options.norm,
        "expected_m": options.expected_m is not None,
    }
    for name, given in refused.items():
        if given:
            value = getattr(options, name, None)
            shown = value.name if isinstance(value, ScaleLayout) else value
            raise ValueError(
                f"{name}: not supported with orientation={options.orientation!r}, got {shown!r}"
            )


def _check_norm_rounding(norm_rounding, eps_norm) -> str:
    """norm_rounding: one of NORM_ROUNDINGS (section 2b); other than "once" with norm only."""
    if not isinstance(norm_rounding, str) or norm_rounding not in NORM_ROUNDINGS:
        raise ValueError(
            f"norm_rounding: expected one of {', '.join(map(repr, NORM_ROUNDINGS))}, got "
            f"{norm_rounding!r}"
        )
    if norm_rounding != "once" and eps_norm is None:
        raise ValueError("norm_rounding: applies to the fused RMSNorm; pass norm=(weight, eps)")
    return norm_rounding


def _check_clamp_limit(clamp_limit, mode: InputMode) -> float | None:
    """clamp_limit as a float32 value: positive and finite, with a gated activation only."""
    if clamp_limit is None:
        return None
    if isinstance(clamp_limit, bool) or not isinstance(clamp_limit, (int, float)):
        raise TypeError(f"clamp_limit: expected a float or None, got {type(clamp_limit).__name__}")
    value = float(np.float32(clamp_limit))
    if not (0.0 < value < math.inf):
        raise ValueError(
            f"clamp_limit: expected a positive finite float32 value, got {clamp_limit}"
        )
    if mode.width_factor != 2:
        raise ValueError(
            f"clamp_limit: clamps a gated activation's gate and up; pass activation='silu_mul' "
            f"or 'gelu_tanh_mul' (got activation={mode.name!r})"
        )
    return value


# docs/spec.md, sections 3, 3a, 3b, 3c and 4a; all but bfloat16 are instantiations of their own
ARITHMETICS = ("float32", "bfloat16", RECIPROCAL, UNFLOORED, MULTIPLIER)
MX_GROUP = 32  # values an MX scale covers (OCP MX v1.0): arithmetic="unfloored"'s groups
PLAIN_ONLY = (UNFLOORED, MULTIPLIER)  # arithmetics of plain input (no activation, norm, mask)
# section 3c: the least eps of the modes that multiply by a reciprocal (every quotient and
# reciprocal of theirs then a normal float32)
MIN_PRODUCT_EPS = 2.0**-64


def _arithmetic_name(arithmetic) -> str:
    if not isinstance(arithmetic, str) or arithmetic not in ARITHMETICS:
        raise ValueError(f"arithmetic: expected one of {ARITHMETICS}, got {arithmetic!r}")
    return arithmetic


def _check_arithmetic(arithmetic, fmt: OutputFormat, scale: ScaleFormat, scale_rule,
                      group_size: int, eps, orientation, fused: bool) -> str:  # fmt: skip
    """arithmetic for the FP8 formats: "float32" (section 3), "bfloat16" (section 3a: FP8
    formats, "rceil", row-wise), "unfloored" (section 3b: MXFP8, e4m3 with UE8M0 scales of 32 values
    by "rceil", the default eps, row-wise, plain input) or "multiplier" (section 3c: e4m3 with
    float scales, groups of 128 or 256, plain input); "reciprocal" is FP4's (and
    quantize_weight's)."""
    arithmetic = _arithmetic_name(arithmetic)
    if arithmetic == "bfloat16" and (
        not fmt.is_float8 or scale_rule != "rceil" or orientation != ROW_WISE
    ):
        raise ValueError(
            f"arithmetic='bfloat16': takes an FP8 dtype, scale_rule='rceil' and "
            f"orientation='row', got dtype={fmt.name!r}, scale_rule={scale_rule!r}, "
            f"orientation={orientation!r}"
        )
    if arithmetic == RECIPROCAL:
        raise ValueError("arithmetic='reciprocal': is FP4's (dtype='e2m1') here, and FP8's in "
                         f"quantize_weight; got dtype={fmt.name!r}")  # fmt: skip
    if arithmetic == MULTIPLIER:
        check_product_arithmetic(arithmetic, fmt, scale, eps)
        if group_size not in MULTIPLIER_GROUPS or fused:
            raise ValueError(
                f"arithmetic='multiplier': takes plain input (no activation or norm) in groups of "
                f"{' or '.join(map(str, MULTIPLIER_GROUPS))}, got group_size={group_size}, "
                f"fused={fused}"
            )
    unfloored = (fmt.name, scale.name, scale_rule, group_size, eps, orientation, fused)
    if arithmetic == UNFLOORED and unfloored != ("e4m3", "ue8m0", "rceil", MX_GROUP,
                                                 DEFAULT_EPS, ROW_WISE, False):  # fmt: skip
        raise ValueError(
            "arithmetic='unfloored': takes MXFP8 of plain input (dtype='e4m3', scale='ue8m0', "
            "scale_rule='rceil', group_size=32, the default eps, orientation='row', no "
            f"activation or norm), got dtype={fmt.name!r}, scale={scale.name!r}, "
            f"scale_rule={scale_rule!r}, group_size={group_size}, eps={eps!r}, "
            f"orientation={orientation!r}, fused={fused}"
        )
    return arithmetic


def check_product_arithmetic(arithmetic: str, fmt: OutputFormat, scale: ScaleFormat, eps) -> None:
    """Section 3c's modes ("reciprocal" and "multiplier" of FP8): e4m3 codes, float32 scales
    and an eps of at least MIN_PRODUCT_EPS (``eps`` already checked by check_eps)."""
    if (fmt.name, scale.name) != ("e4m3", "float32") or np.float32(eps) < MIN_PRODUCT_EPS:
        raise ValueError(
            f"arithmetic={arithmetic!r}: takes dtype='e4m3', scale='float32' and eps >= 2**-64, "
            f"got dtype={fmt.name!r}, scale={scale.name!r}, eps={eps!r}"
        )


def _fp4_options(group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule,
                 expected_m, eps_norm, arithmetic="float32") -> Options:  # fmt: skip
    if dtype != E2M1:
        raise ValueError(
            f"scale='e4m3' holds NVFP4's block scales; it needs dtype='e2m1', got {dtype!r}"
        )
    fp4 = FP4_BY_SCALE.get(scale) if isinstance(scale, str) else None
    if fp4 is None:
        named = " or ".join(f"scale={f.scale!r} ({f.name})" for f in FP4_FORMATS.values())
        raise ValueError(f"dtype='e2m1' takes {named}: pass one of them, got {scale!r}")
    if isinstance(group_size, bool) or group_size != fp4.group_size:
        raise ValueError(
            f"group_size: {fp4.name} scales groups of {fp4.group_size} values, got {group_size!r}"
        )
    if not isinstance(layout, str) or layout not in fp4.layouts:
        raise ValueError(
            f"layout: {fp4.name}'s {fp4.scale} scales are written in the "
            f"{' or '.join(map(repr, fp4.layouts))} layout, got {layout!r}"
        )
    others = {"eps": (eps, DEFAULT_EPS), "pad_rows": (pad_rows, False),
              "activation": (activation, None), "expected_m": (expected_m, None),
              "norm": (eps_norm, None), "scale_rule": (scale_rule, "rceil")}  # fmt: skip
    for name, (value, default) in others.items():
        refused = (value is not None) if default is None else (value != default)
        if refused and name not in fp4.options:
            raise ValueError(f"{name}: not supported with dtype='e2m1' ({fp4.name}); got {value!r}")
    if "scale_rule" in fp4.options:
        scale_rule = check_scale_rule(scale_rule, fp4, scale_format(fp4.scale))
    arithmetic = _check_fp4_arithmetic(arithmetic, fp4, eps, scale_rule)
    eps = check_eps(eps) if "eps" in fp4.options else DEFAULT_EPS
    return Options(fp4.group_size, None, None, scale_layout(layout), eps, False, input_mode(None),
                   scale_rule, fp4=fp4, arithmetic=arithmetic)  # fmt: skip


def _check_fp4_arithmetic(arithmetic, fp4: Fp4Format, eps, scale_rule) -> str:
    """FP4's arithmetic: "float32" (sections 4a, 4b) or "reciprocal" (section 4a's upstream
    steps), which has no eps and no scale rule of its own (MXFP4 takes the defaults)."""
    arithmetic = _arithmetic_name(arithmetic)
    if arithmetic not in ("float32", RECIPROCAL):
        raise ValueError(f"arithmetic: {fp4.name} takes 'float32' or 'reciprocal', got "
                         f"{arithmetic!r}")  # fmt: skip
    if arithmetic == RECIPROCAL and (eps != DEFAULT_EPS or scale_rule != "rceil"):
        raise ValueError(
            f"arithmetic='reciprocal': floors nothing and rounds the scale up; pass the default "
            f"eps and scale_rule, got eps={eps!r}, scale_rule={scale_rule!r}"
        )
    return arithmetic


def _check_eps_norm(eps_norm) -> float:
    value = None
    if isinstance(eps_norm, (int, float, np.floating)) and not isinstance(eps_norm, bool):
        value = np.float32(eps_norm)
    if value is None or not (np.isfinite(value) and value > 0):
        raise ValueError(f"norm: eps_norm must be a positive finite float, got {eps_norm!r}")
    return float(value)


def _check_expected_m(expected_m) -> int | None:
    if expected_m is None:
        return None
    if isinstance(expected_m, bool) or not isinstance(expected_m, int | np.integer):
        raise ValueError(f"expected_m: expected an int, got {expected_m!r}")
    return int(expected_m)


@dataclass(frozen=True)
class Operands:
    """The arrays of a call besides x and its outputs, described (None where not given)."""

    masked_m: ArrayInfo | None = None
    weight: ArrayInfo | None = None
    residual: ArrayInfo | None = None
    global_scale: ArrayInfo | None = None  # NVFP4, an array (a number is in global_value)
    global_value: float | None = None  # NVFP4, a number


@dataclass(frozen=True)
class Request:
    """One validated call: what to read, what to compute, where to write."""

    options: Options
    input_dtype: str  # a key of INPUT_TYPES
    input_shape: tuple[int, ...]
    x_batch_stride: int  # elements
    x_row_stride: int  # elements
    x_aligned: bool  # base and strides allow 16-byte vector loads
    masked: str | None = None  # masked layout: the dtype of masked_m (int32 or int64)
    residual: bool = False  # fused add-RMSNorm: a residual is read and written back
    r_batch_stride: int = 0  # residual elements between batches
    r_row_stride: int = 0  # residual elements between rows
    global_mode: int = NVFP4_GIVEN  # NVFP4: NVFP4_GIVEN, NVFP4_ON_DEVICE or NVFP4_COMPUTED
    global_value: float = 0.0  # NVFP4, NVFP4_GIVEN: the global scale

    # the options, as the plan and the backends read them
    fmt = property(lambda self: self.options.fmt)
    scale = property(lambda self: self.options.scale)
    layout = property(lambda self: self.options.layout)
    mode = property(lambda self: self.options.mode)
    group_size = property(lambda self: self.options.group_size)
    eps = property(lambda self: self.options.eps)
    pad_rows = property(lambda self: self.options.pad_rows)
    scale_rule = property(lambda self: self.options.scale_rule)
    expected_m = property(lambda self: self.options.expected_m)
    norm = property(lambda self: self.options.norm)
    eps_norm = property(lambda self: self.options.eps_norm or 0.0)
    nvfp4 = property(lambda self: self.options.nvfp4)
    takes_global = property(lambda self: self.options.takes_global)
    fp4 = property(lambda self: self.options.fp4)
    clamp_limit = property(lambda self: self.options.clamp_limit)
    arithmetic = property(lambda self: self.options.arithmetic)
    norm_rounding = property(lambda self: self.options.norm_rounding)

    orientation = property(lambda self: self.options.orientation)

    @cached_property
    def output(self) -> Geometry:
        shape = output_shape(self.mode, self.input_shape)
        return Geometry(shape, self.group_size, self.layout, self.pad_rows)

    @cached_property
    def transposed(self) -> Geometry:
        """The column-wise result's scales: ``K`` rows of ``ceil(M / G)`` token groups."""
        m, k = self.input_shape
        return transposed_geometry(m, k, self.group_size, self.layout)

    def kernel_key(self) -> KernelKey:
        arithmetic = compiled_arithmetic(self.arithmetic)
        if self.fp4 is not None:
            return fp4_key(self.input_dtype, self.fp4, self.layout, arithmetic)
        assert self.fmt is not None and self.scale is not None
        return KernelKey(
            self.input_dtype, self.group_size, self.fmt.kernel_format, self.scale.name,
            self.layout.kernel_trait, self.x_aligned, activation=self.mode.name,
            masked=self.masked is not None, norm=self.norm, arithmetic=arithmetic,
        )  # fmt: skip

    @property
    def x_up_offset(self) -> int:
        """Elements from a gate value to its up value (SiLU-and-multiply), else 0."""
        return self.output.k if self.mode.width_factor == 2 else 0

    @property
    def fused(self) -> str | None:
        """The option whose kernels are one-pass only (they number group slots in 31 bits)."""
        if self.norm:
            return "norm"
        if self.mode.name is not None:
            return f"activation={self.mode.name!r}"
        return "masked_m" if self.masked is not None else None


def output_shape(mode: InputMode, input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of q's values for an input of ``input_shape`` in ``mode``."""
    if not input_shape:
        return tuple(input_shape)
    return (*input_shape[:-1], input_shape[-1] // mode.width_factor)


_RESIDUAL_WITHOUT_NORM = "residual: the fused add needs norm=(weight, eps_norm) too"


def split_norm(norm, residual) -> tuple:
    """(weight, eps_norm) of a call's ``norm`` argument, or (None, None) without one."""
    if norm is None:
        if residual is not None:
            raise ValueError(_RESIDUAL_WITHOUT_NORM)
        return None, None
    if not isinstance(norm, tuple) or len(norm) != 2:
        got = f"a tuple of {len(norm)} items" if isinstance(norm, tuple) else type(norm).__name__
        raise TypeError(f"norm: expected a (weight, eps_norm) tuple, got {got}")
    return norm


def check_global_given(options: Options, given: bool) -> None:
    """A global_scale given is one that the options take."""
    if given and not options.takes_global:
        raise ValueError(
            "global_scale: only NVFP4 (dtype='e2m1', scale='e4m3') takes one, and MXFP4 with "
            "arithmetic='reciprocal'"
        )


def make_request(info: ArrayInfo, options: Options, operands: Operands = Operands()) -> Request:
    """Check the input ``info`` and the ``operands`` against ``options``; the Request.

    Raises TypeError or ValueError naming the argument; nothing has been launched or written.
    """
    _check_mode_operands(info, options, operands)
    if info.dtype not in INPUT_TYPES:
        convert = {"torch": "x.float()", "cupy": "x.astype(cupy.float32)"}
        numpy = "x.astype(numpy.float32), or x.float() for a torch tensor"
        hint = f" (convert it: {convert.get(info.kind, numpy)})"
        raise TypeError(f"x: expected one of {', '.join(INPUT_TYPES)}, got {info.dtype}{hint}")
    if len(info.shape) == 0:
        raise ValueError("x: expected at least one dimension [..., K], got a scalar")
    _check_k(info.shape[-1], options)
    shape = tuple(info.shape)
    strides = (0, shape[-1])
    if 0 not in shape:
        if shape[-1] > 1 and info.strides[-1] != 1:
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
    output = Geometry(output_shape(options.mode, shape), options.group_size, options.layout,
                      options.pad_rows)  # fmt: skip
    aligned = (
        info.ptr % VECTOR_ALIGNMENT == 0
        and (output.rows <= 1 or row_stride * info.itemsize % VECTOR_ALIGNMENT == 0)
        and (output.batches <= 1 or batch_stride * info.itemsize % VECTOR_ALIGNMENT == 0)
    )
    if options.arithmetic == "bfloat16" and info.dtype != "bfloat16":
        raise TypeError(f"x: arithmetic='bfloat16' reads bfloat16 input, got {info.dtype}")
    fields: dict = dict(masked=_check_masked(info, options, operands.masked_m))
    if options.norm:
        fields.update(_check_norm(info, operands.weight, operands.residual))
    elif operands.weight is not None or operands.residual is not None:
        raise ValueError(_RESIDUAL_WITHOUT_NORM)
    if options.takes_global:
        fields.update(_check_global(info, operands, options.nvfp4))
    request = Request(options, info.dtype, shape, batch_stride, row_stride, aligned, **fields)
    if info.kind != NUMPY and 0 not in shape:
        _check_device_limits(request, info)
    return request


def check_preparable(request: Request) -> None:
    """A request that a device plan (``prepare``, the cached path) can bind: row-wise."""
    if request.orientation != ROW_WISE:
        raise ValueError(
            f"orientation: prepare binds the row-wise kernel; call quantize for "
            f"orientation={request.orientation!r}"
        )


def _check_mode_operands(info: ArrayInfo, options: Options, operands: Operands) -> None:
    """What the column-wise orientations and the FP4 formats refuse of x and the operands."""
    if options.orientation != ROW_WISE:
        if len(info.shape) != 2:
            raise ValueError(
                f"x: orientation={options.orientation!r} needs x of shape [M, K], got shape "
                f"{tuple(info.shape)}"
            )
        if operands.masked_m is not None:
            raise ValueError(f"masked_m: not supported with orientation={options.orientation!r}")
        if info.kind != NUMPY:
            _check_columns_on_device(info, options)
    if options.fp4 is not None:
        for name in ("masked_m", "residual"):
            if getattr(operands, name) is not None:
                raise ValueError(f"{name}: not supported with dtype='e2m1' ({options.fp4.name})")


def _check_columns_on_device(info: ArrayInfo, options: Options) -> None:
    """The column kernel's limits: tiles of 128 or 256 tokens by 128 channels ("both": 128
    tokens, whose tile is one row-wise group), e4m3."""
    g = options.group_size
    sizes = WEIGHT_BLOCKS if options.orientation == COLUMN_WISE else (WEIGHT_BLOCK,)
    if g not in sizes:
        raise ValueError(
            f"group_size: orientation={options.orientation!r} on the GPU takes groups of "
            f"{' or '.join(map(str, sizes))} tokens (its tiles), got {g}; other sizes run on "
            f"the NumPy backend"
        )
    assert options.fmt is not None
    _check_tile_limits(options.fmt, -(-info.shape[0] // g), 1, "x")


def _check_k(k: int, options: Options) -> None:
    g = options.group_size
    if options.fp4 is not None and k % g:
        raise ValueError(f"x: {options.fp4.name} needs K a multiple of {g}, got K={k}")
    if options.mode.width_factor == 2 and k % (2 * g):
        raise ValueError(
            f"x: activation={options.mode.name!r} reads gate and up halves [..., 2N] with N a "
            f"multiple of group_size={g}; the last dimension {k} is not a multiple of {2 * g}"
        )
    if k % g:
        raise ValueError(f"x: the last dimension K={k} is not a multiple of group_size={g}")


def _check_device_limits(request: Request, info: ArrayInfo) -> None:
    """What the GPU kernels cannot index or need aligned."""
    strides = (request.x_batch_stride, request.x_row_stride)
    if request.fp4 is not None:
        geometry = request.output
        groups = geometry.batches * geometry.rows * geometry.groups
        if not request.x_aligned:
            raise ValueError(
                f"x: {request.fp4.name} on the GPU needs a 16-byte aligned base and row and "
                f"batch strides; got address {info.ptr:#x}, strides {info.strides} "
                f"({info.itemsize}-byte elements)"
            )
        if groups * 2 >= 2**31:
            raise ValueError(
                f"x: {groups} groups of {geometry.group_size} are more than one launch covers "
                f"(2**30)"
            )
        return
    error = grid_limits_error(request.output, info.itemsize, request.fused)
    if error:
        raise ValueError(error)
    if request.mode.name is not None and request.masked is None and max(map(abs, strides)) >= 2**31:
        raise ValueError(
            f"x: activation={request.mode.name!r} takes row and batch strides of fewer than 2**31 "
            f"elements (its one-pass kernel indexes x in 32 bits); got {strides}: pass a "
            f"contiguous copy"
        )
    if request.fused is not None and not request.x_aligned:
        raise ValueError(
            f"x: {request.fused} needs a 16-byte aligned input (base, row and batch strides); got "
            f"address {info.ptr:#x}, strides {tuple(info.strides)} ({info.itemsize}-byte "
            f"elements): pass a contiguous copy"
        )


def _check_norm(info: ArrayInfo, weight: ArrayInfo | None, residual: ArrayInfo | None) -> dict:
    """The Request fields of a valid fused RMSNorm on input ``info``."""
    assert weight is not None, "the entry points pass the weight with eps_norm"
    k = info.shape[-1]
    check_companion(info, weight, "norm", what="the weight must be an array")
    if weight.dtype != info.dtype or tuple(weight.shape) != (k,):
        raise ValueError(
            f"norm: the weight must be a {info.dtype} array of shape ({k},) like x's rows, got "
            f"{weight.dtype} of shape {tuple(weight.shape)}"
        )
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
    return {} if residual is None else _check_residual(info, residual)


def _check_residual(info: ArrayInfo, residual: ArrayInfo) -> dict:
    """The Request fields of a valid residual of input ``info`` (the fused add-RMSNorm)."""
    k = info.shape[-1]
    device = info.kind != NUMPY
    check_companion(info, residual, "residual")
    if residual.dtype != info.dtype or tuple(residual.shape) != tuple(info.shape):
        raise ValueError(
            f"residual: expected a {info.dtype} array of x's shape {tuple(info.shape)}, got "
            f"{residual.dtype} of shape {tuple(residual.shape)}"
        )
    fields: dict = {"residual": True}
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
    rows = Geometry(tuple(info.shape), 32, scale_layout("row"), False)
    # NOTES: the kernel writes the residual back, one block a row: rows that share bytes (a
    # broadcast or overlapping view) would race, so each row and batch must own its bytes;
    # rows or batches in reverse order (negative strides) own theirs as well
    if (rows.rows > 1 and abs(row_stride) < k) or (
        rows.batches > 1 and abs(batch_stride) < (rows.rows - 1) * abs(row_stride) + k
    ):
        raise ValueError(
            f"residual: its rows overlap (strides {tuple(residual.strides)} for shape "
            f"{tuple(residual.shape)}); the fused add writes every row back: pass a separate "
            f"array for each row"
        )
    size = residual.itemsize
    if (
        residual.ptr % VECTOR_ALIGNMENT
        or (rows.rows > 1 and row_stride * size % VECTOR_ALIGNMENT)
        or (rows.batches > 1 and batch_stride * size % VECTOR_ALIGNMENT)
    ):
        raise ValueError(
            f"residual: needs a 16-byte aligned array (base, row and batch strides); got "
            f"address {residual.ptr:#x}, strides {tuple(residual.strides)}: pass a contiguous copy"
        )
    fields.update(r_batch_stride=batch_stride, r_row_stride=row_stride)
    return fields


def _check_masked(info: ArrayInfo, options: Options, masked: ArrayInfo | None) -> str | None:
    """The dtype of a valid ``masked_m`` for input ``info`` (None without one)."""
    if masked is None:
        if options.expected_m is not None:
            raise ValueError("expected_m: a hint for the masked layout; pass masked_m too")
        return None
    if options.norm:
        raise ValueError("norm: cannot be combined with masked_m")
    if options.arithmetic in PLAIN_ONLY:
        raise ValueError(f"masked_m: arithmetic={options.arithmetic!r} quantizes plain input only")
    if len(info.shape) != 3:
        raise ValueError(f"x: masked_m needs x of shape [E, T, K], got shape {tuple(info.shape)}")
    experts, tokens = info.shape[0], info.shape[1]
    check_companion(info, masked, "masked_m")
    if masked.dtype not in ("int32", "int64"):
        raise TypeError(f"masked_m: expected int32 or int64 counts, got {masked.dtype}")
    if tuple(masked.shape) != (experts,):
        raise ValueError(f"masked_m: expected shape ({experts},), one count per expert, got "
                         f"{tuple(masked.shape)}")  # fmt: skip
    if experts > 1 and masked.strides[0] != 1:
        raise ValueError(f"masked_m: expected a contiguous array, got strides {masked.strides}")
    if experts > max_experts():
        raise ValueError(f"x: masked_m takes at most {max_experts()} experts, got {experts}")
    expected_m = options.expected_m
    if expected_m is not None and not 0 <= expected_m <= tokens:
        raise ValueError(f"expected_m: expected an int in [0, {tokens}], got {expected_m!r}")
    return masked.dtype


def host_global_value(global_scale) -> np.float32:
    """NVFP4: a global scale given as a number or a one-element float32 host array, checked."""
    if isinstance(global_scale, numbers.Real) and not isinstance(global_scale, bool):
        value = np.float32(global_scale)
    else:
        if not isinstance(global_scale, np.ndarray):
            raise TypeError(
                f"global_scale: expected a float or a one-element float32 array on the host, "
                f"like x, got {type(global_scale).__name__}"
            )
        if global_scale.size != 1 or global_scale.dtype != np.float32:
            raise ValueError(
                f"global_scale: expected a float or a one-element float32 array, got "
                f"{global_scale.dtype} of shape {global_scale.shape}"
            )
        value = global_scale.reshape(-1)[0]
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"global_scale: expected a positive finite float32, got {value!r}")
    return value


def _check_global(info: ArrayInfo, operands: Operands, computed: bool) -> dict:
    """The global scale: a number, an array on x's device, or None (NVFP4: computed; MXFP4
    with arithmetic='reciprocal': 1)."""
    if operands.global_value is not None:
        return {"global_value": float(host_global_value(operands.global_value))}
    array = operands.global_scale
    if array is None:
        return {"global_mode": NVFP4_COMPUTED} if computed else {"global_value": 1.0}
    if info.kind == NUMPY:
        return {"global_value": float(host_global_value(array.obj))}
    if array.kind != info.kind or array.device != info.device:
        raise TypeError(
            f"global_scale: expected a float or a one-element float32 array of x's library and "
            f"device ({info.kind}, device {info.device}), got {array.kind} on device "
            f"{array.device}"
        )
    if math.prod(array.shape) != 1 or array.dtype != "float32":
        raise ValueError(
            f"global_scale: expected one float32 element, got {array.dtype} of shape {array.shape}"
        )
    return {"global_mode": NVFP4_ON_DEVICE}


# 128x128 and 256x256 weight blocks (docs/spec.md, section 4c) --------------------------------


@dataclass(frozen=True)
class WeightOptions:
    """Every option of a ``quantize_weight`` call, checked."""

    fmt: OutputFormat
    scale: ScaleFormat
    layout: str  # a key of WEIGHT_LAYOUTS
    eps: float
    scale_rule: str = "rceil"
    arithmetic: str = "float32"  # a key of WEIGHT_ARITHMETICS (section 3c's modes)
    block: int = WEIGHT_BLOCK  # a block's rows and columns: WEIGHT_BLOCKS


# the arithmetics of quantize_weight: section 3, and 3c's (DeepGEMM's and torchao's)
WEIGHT_ARITHMETICS = ("float32", RECIPROCAL, MULTIPLIER)


def check_weight_options(block, dtype, scale, layout, eps, scale_rule,
                         arithmetic="float32") -> WeightOptions:  # fmt: skip
    """The ``WeightOptions`` of a ``quantize_weight`` call (TypeError or ValueError naming it)."""
    squares = " or ".join(str((b, b)) for b in WEIGHT_BLOCKS)
    if not isinstance(block, (tuple, list)) or len(block) != 2 or any(
        isinstance(b, bool) or not isinstance(b, int | np.integer) for b in block
    ):  # fmt: skip
        raise TypeError(f"block: expected a pair of ints, {squares}, got {block!r}")
    side = int(block[0])
    if block[1] != side or side not in WEIGHT_BLOCKS:
        raise ValueError(f"block: expected {squares}, got {tuple(block)}")
    if side != WEIGHT_BLOCK and layout == PACKED:
        raise ValueError(
            f"layout='packed' is DeepGEMM's layout of 128x128 weight scales; it needs "
            f"block=(128, 128), got {tuple(block)}"
        )
    fmt = output_format(dtype)
    if fmt.name not in WEIGHT_FORMATS:
        raise ValueError(
            f"dtype: quantize_weight writes {' or '.join(WEIGHT_FORMATS)}, got {dtype!r}"
        )
    scale = scale_format(scale)
    if not isinstance(layout, str) or layout not in WEIGHT_LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(WEIGHT_LAYOUTS)}, got {layout!r}")
    if layout in WEIGHT_NEEDS_UE8M0 and not scale.power_of_two:
        raise ValueError(
            f"layout={layout!r} holds UE8M0 exponent bytes; it needs scale='ue8m0', got "
            f"scale={scale.name!r}"
        )
    eps, scale_rule = check_eps(eps), check_scale_rule(scale_rule, fmt, scale)
    if not isinstance(arithmetic, str) or arithmetic not in WEIGHT_ARITHMETICS:
        raise ValueError(
            f"arithmetic: quantize_weight takes one of {WEIGHT_ARITHMETICS}, got {arithmetic!r}"
        )
    if arithmetic != "float32":
        check_product_arithmetic(arithmetic, fmt, scale, eps)
    return WeightOptions(fmt, scale, layout, eps, scale_rule, arithmetic, side)


@dataclass(frozen=True)
class WeightRequest:
    """One validated ``quantize_weight`` call."""

    options: WeightOptions
    input_dtype: str
    output: WeightGeometry
    batch_stride: int  # elements
    row_stride: int  # elements
    x_aligned: bool = False  # base and strides allow 16-byte vector loads


def make_weight_request(info: ArrayInfo, options: WeightOptions) -> WeightRequest:
    """Check the weight ``info``; the WeightRequest (nothing launched or written)."""
    if info.dtype not in INPUT_TYPES:
        raise TypeError(f"w: expected one of {', '.join(INPUT_TYPES)}, got {info.dtype}")
    shape = tuple(info.shape)
    if len(shape) not in (2, 3):
        raise ValueError(f"w: expected [N, K] or [E, N, K], got shape {shape}")
    strides: tuple[int, int] | None = (0, shape[-1])
    if 0 not in shape:
        if shape[-1] > 1 and info.strides[-1] != 1:
            raise ValueError(
                f"w: the last dimension must be contiguous (stride 1), got strides {info.strides}"
            )
        strides = row_strides(shape, tuple(info.strides))
    assert strides is not None  # rows of [N, K] or [E, N, K] always collapse
    geometry = WeightGeometry(shape, options.layout, options.block)
    aligned = _aligned(info, strides, geometry.n, geometry.batches)
    request = WeightRequest(options, info.dtype, geometry, *strides, aligned)
    if info.kind != NUMPY:
        _check_tile_limits(options.fmt, geometry.blocks[0], geometry.batches, "w")
    return request


def _aligned(info: ArrayInfo, strides: tuple[int, int], rows: int, batches: int) -> bool:
    """Whether x's base and its row and batch strides (elements) allow 16-byte loads."""
    batch_stride, row_stride = strides
    return (
        info.ptr % VECTOR_ALIGNMENT == 0
        and (rows <= 1 or row_stride * info.itemsize % VECTOR_ALIGNMENT == 0)
        and (batches <= 1 or batch_stride * info.itemsize % VECTOR_ALIGNMENT == 0)
    )


def _check_tile_limits(fmt: OutputFormat, tiles_y: int, tiles_z: int, name: str) -> None:
    """What the GPU's tile kernels cannot do: formats but e4m3, grids past 65,535 in y or z."""
    if fmt.name != TILE_FORMAT:
        raise ValueError(
            f"dtype: the GPU kernels of quantize_weight and orientation='col'/'both' write "
            f"{TILE_FORMAT!r}; {fmt.name!r} runs on the NumPy backend (docs/spec.md, section 9)"
        )
    if tiles_y > 65535 or tiles_z > 65535:
        raise ValueError(f"{name}: more than 65,535 tiles of rows (or batches) on the GPU")
