"""The supported matrix as data: input types, output formats and scale formats.

Each row is the one definition of its facts. Validation, the NumPy backend, the allocators and
the launch layer read these rows; the kernel gets the numbers through its Params struct and
selects its instructions by the C++ trait a row names. docs/spec.md is the contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Literal, Union

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    import torch

GROUP_SIZES = (32, 64, 128, 256)
DEFAULT_EPS = 1e-10
UE8M0_FLOOR = np.float32(1e-10)  # the floor of amax / fmax before the power-of-two ceiling


def _numpy_dtype(name: str) -> np.dtype:
    """numpy dtype of a name, the float8 and bfloat16 types from ml_dtypes."""
    return np.dtype(getattr(ml_dtypes, name, None) or name)


@dataclass(frozen=True)
class InputType:
    name: str  # the dtype's name in numpy (ml_dtypes), torch and cupy alike
    kernel_trait: str  # Input<> specialisation in kernels/common.cuh

    @cached_property
    def numpy_dtype(self) -> np.dtype:
        return _numpy_dtype(self.name)

    @property
    def itemsize(self) -> int:
        return self.numpy_dtype.itemsize


INPUT_TYPES = {
    t.name: t
    for t in (
        InputType("bfloat16", "fgq::kBF16"),
        InputType("float16", "fgq::kF16"),
        InputType("float32", "fgq::kF32"),
    )
}


@dataclass(frozen=True)
class OutputFormat:
    """One output format: its names, dtypes, clamp and the codes of non-finite inputs."""

    name: str
    aliases: tuple[str, ...]
    dtype_name: str  # the dtype's attribute name in ml_dtypes / numpy, torch and jax.numpy
    fmax: float  # the clamp: |v / s| is saturated here
    nan_code: int  # the code of a NaN input, before its sign bit
    signed_nan: bool  # a NaN's code carries the input's sign bit
    keeps_inf: bool  # +-Inf inputs stay +-Inf (inf_code) rather than saturating to +-fmax
    inf_code: int
    kernel_trait: str  # the Output<> trait of its binary in kernels/formats.cuh
    kernel_code: int  # its own OutputType code in kernels/formats.cuh (Params.output)
    emax_elem: int | None = None  # OCP MX: the largest normal's exponent (scale_rule="floor")
    notes: str = field(default="", compare=False)

    @property
    def is_float8(self) -> bool:
        return not np.issubdtype(self.numpy_dtype, np.integer)

    @cached_property
    def numpy_dtype(self) -> np.dtype:
        """The host dtype of q."""
        return _numpy_dtype(self.dtype_name)

    @property
    def container(self) -> str:
        """The dtype holding the codes where the library has no such type (cupy: no float8)."""
        return "uint8" if self.is_float8 else self.dtype_name

    @cached_property
    def saturated_codes(self) -> tuple[int, int]:
        """Codes of +fmax and -fmax."""
        values = np.array([self.fmax, -self.fmax], np.float32)
        if not self.is_float8:
            plus, minus = (int(c) for c in np.rint(values).astype(np.int8).view(np.uint8))
        else:
            plus, minus = (int(c) for c in values.astype(self.numpy_dtype).view(np.uint8))
        return plus, minus

    @cached_property
    def nonfinite_codes(self) -> tuple[int, int, int, int]:
        """Codes of +NaN, -NaN, +Inf and -Inf inputs."""
        sign = 0x80 if self.signed_nan else 0
        nan = (self.nan_code, self.nan_code | sign)
        inf = (self.inf_code, self.inf_code | 0x80) if self.keeps_inf else self.saturated_codes
        return (*nan, *inf)

    @cached_property
    def nonfinite_word(self) -> int:
        """``nonfinite_codes`` one byte each, lowest first: the kernel's Params.nonfinite_codes."""
        return sum(code << (8 * i) for i, code in enumerate(self.nonfinite_codes))

    @property
    def kernel_format(self) -> str:
        """The format that names this one's binary (KernelKey.output): the first of the same
        kernel trait. e4m3 and e5m2 share one, kFloat8, which branches on Params.output."""
        return next(f.name for f in OUTPUT_FORMATS.values() if f.kernel_trait == self.kernel_trait)

    @cached_property
    def inverse_fmax(self) -> np.float32:
        """RN(1 / fmax) in float32."""
        return np.float32(1) / np.float32(self.fmax)


OUTPUT_FORMATS = {
    f.name: f
    for f in (
        OutputFormat(
            "e4m3", ("float8_e4m3fn", "fp8_e4m3"), "float8_e4m3fn", 448.0,
            nan_code=0x7F, signed_nan=True, keeps_inf=False, inf_code=0,
            kernel_trait="fgq::kFloat8", kernel_code=0, emax_elem=8,
            notes="the default; NVIDIA GPUs",
        ),
        OutputFormat(
            "e5m2", ("float8_e5m2", "fp8_e5m2"), "float8_e5m2", 57344.0,
            nan_code=0x7E, signed_nan=True, keeps_inf=True, inf_code=0x7C,
            kernel_trait="fgq::kFloat8", kernel_code=1, emax_elem=15,
        ),
        OutputFormat(
            "int8", (), "int8", 127.0,
            nan_code=0x00, signed_nan=False, keeps_inf=False, inf_code=0,
            kernel_trait="fgq::kInt8", kernel_code=2,
            notes="rounds half to even; NaN has no code and becomes 0",
        ),
        OutputFormat(
            "e4m3fnuz", ("float8_e4m3fnuz", "fp8_e4m3fnuz"), "float8_e4m3fnuz", 224.0,
            nan_code=0x80, signed_nan=False, keeps_inf=False, inf_code=0,
            kernel_trait="fgq::kE4M3FNUZ", kernel_code=3,
            notes="AMD MI300; clamped at 224 as vLLM and SGLang do on ROCm (the format reaches "
            "240); 0x80 is its NaN, so there is no -0",
        ),
    )
}  # fmt: skip
_FORMAT_NAMES = {
    name: fmt.name for fmt in OUTPUT_FORMATS.values() for name in (fmt.name, *fmt.aliases)
}
FORMATS_BY_DTYPE = {fmt.dtype_name: fmt for fmt in OUTPUT_FORMATS.values()}

# the names of OUTPUT_FORMATS and their aliases, for type checkers (a test keeps them equal)
FormatName = Literal[
    "e4m3", "float8_e4m3fn", "fp8_e4m3", "e5m2", "float8_e5m2", "fp8_e5m2", "int8",
    "e4m3fnuz", "float8_e4m3fnuz", "fp8_e4m3fnuz",
]  # fmt: skip
# ``dtype=`` takes a name or a numpy / ml_dtypes / torch dtype of one of the formats, or "e2m1"
# (the FP4 formats of FP4_FORMATS below: two codes a byte, chosen by ``scale=``)
OutputDType = Union[FormatName, Literal["e2m1"], np.dtype, type, "torch.dtype"]


@dataclass(frozen=True)
class Fp4Format:
    """One FP4 format: e2m1 codes two to a byte, first value in the low nibble (``dtype="e2m1"``),
    told apart by ``scale=``. The kernel gets fmax and emax_elem through Params and selects its
    scale rule by the C++ trait (kernels/fp4.cuh)."""

    name: str  # what messages call it; lower-cased, its key in FP4_FORMATS
    group_size: int  # values a scale
    scale: str  # the ``scale=`` that selects it
    layouts: tuple[str, ...]  # the scale layouts it is written in (_layout.SCALE_LAYOUTS keys)
    global_scale: bool  # a float32 tensor scale besides the block scales (NVFP4)
    options: tuple[str, ...]  # the options it takes besides the layout ("eps", "scale_rule")
    kernel_trait: str  # the Fp4Kind code in kernels/fp4.cuh
    fmax: float = 6.0  # e2m1's largest value
    emax_elem: int = 2  # e2m1's largest normal is 1.5 * 2^2 (scale_rule="floor")


E2M1 = "e2m1"  # the dtype= of every FP4 format
FP4_FORMATS = {
    f.name.lower(): f
    for f in (
        Fp4Format("NVFP4", 16, "e4m3", ("blocked",), True, (), "fgq::kNvfp4"),
        Fp4Format("MXFP4", 32, "ue8m0", ("row", "blocked"), False, ("eps", "scale_rule"),
                  "fgq::kMxfp4"),
    )
}  # fmt: skip
FP4_BY_SCALE = {f.scale: f for f in FP4_FORMATS.values()}


def output_format(dtype) -> OutputFormat:
    """The format named by ``dtype``: a name, an alias, or a numpy / ml_dtypes / torch dtype."""
    if isinstance(dtype, OutputFormat):
        return dtype
    name = getattr(dtype, "name", None)
    if name is None and isinstance(dtype, type):  # a scalar type such as ml_dtypes.float8_e5m2
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    name = (name or str(dtype)).removeprefix("torch.")
    if name not in _FORMAT_NAMES:
        raise ValueError(
            f"dtype: expected one of {', '.join(OUTPUT_FORMATS)} "
            f"(or {', '.join(f.dtype_name for f in OUTPUT_FORMATS.values() if f.is_float8)}), "
            f"got {dtype!r}"
        )
    return OUTPUT_FORMATS[_FORMAT_NAMES[name]]


@dataclass(frozen=True)
class ScaleFormat:
    name: str
    power_of_two: bool  # UE8M0: the scale is 2^(e - 127), e the exponent byte
    kernel_trait: str  # the ScaleFormat code in kernels/common.cuh


# the keys of SCALE_FORMATS (a test keeps them equal), and NVFP4's e4m3 block scales
ScaleName = Literal["float32", "ue8m0", "e4m3"]
SCALE_FORMATS = {
    s.name: s
    for s in (
        ScaleFormat("float32", False, "fgq::kFloat32Scale"),
        ScaleFormat("ue8m0", True, "fgq::kUE8M0Scale"),
    )
}


@dataclass(frozen=True)
class InputMode:
    """How the kernel turns the bytes of x into the values it quantizes."""

    name: str | None  # the quantize(activation=...) value, None for plain input
    kernel_trait: str  # the Activation code in kernels/activation.cuh
    width_factor: int  # input columns per output column
    notes: str = ""


ActivationName = Literal[
    "silu_mul", "gelu_tanh_mul"
]  # the named keys of INPUT_MODES (a test keeps them equal)
INPUT_MODES = {
    m.name: m
    for m in (
        InputMode(None, "fgq::kIdentity", 1),
        InputMode("silu_mul", "fgq::kSiluMul", 2,
                  "x [..., 2N] holds gate then up; q is [..., N] (docs/spec.md, section 2a)"),
        InputMode("gelu_tanh_mul", "fgq::kGeluTanhMul", 2,
                  "as silu_mul, with the tanh-approximate GELU (docs/spec.md, section 2c)"),
    )
}  # fmt: skip


def input_mode(activation) -> InputMode:
    if activation is not None and (
        not isinstance(activation, str) or activation not in INPUT_MODES
    ):
        named = ", ".join(repr(m) for m in INPUT_MODES if m is not None)
        raise ValueError(f"activation: expected None or one of {named}, got {activation!r}")
    return INPUT_MODES[activation]


def scale_format(scale) -> ScaleFormat:
    if isinstance(scale, ScaleFormat):
        return scale
    if not isinstance(scale, str) or scale not in SCALE_FORMATS:
        raise ValueError(
            f"scale: expected one of {', '.join(map(repr, SCALE_FORMATS))}, got {scale!r}"
        )
    return SCALE_FORMATS[scale]


def check_group_size(group_size) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise TypeError(f"group_size: expected an int, got {type(group_size).__name__}")
    if int(group_size) not in GROUP_SIZES:
        raise ValueError(
            f"group_size: expected one of {', '.join(map(str, GROUP_SIZES))}, got {group_size}"
        )
    return int(group_size)


def check_eps(eps) -> float:
    """eps as a float32 value: positive, finite and normal."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise TypeError(f"eps: expected a float, got {type(eps).__name__}")
    tiny = np.finfo(np.float32).tiny
    with np.errstate(over="ignore"):
        eps32 = np.float32(eps)
    if not (np.isfinite(eps32) and eps32 >= tiny and float(eps) > 0):
        raise ValueError(
            f"eps: expected a positive, finite, normal float32 value (>= {tiny:.3g}), got {eps!r}"
        )
    return float(eps32)


ScaleRuleName = Literal["rceil", "floor"]
OrientationName = Literal["row", "col", "both"]  # docs/spec.md, section 4d
SCALE_RULES = ("rceil", "floor")  # the UE8M0 exponent rules (docs/spec.md, section 3)


def check_scale_rule(scale_rule, fmt: OutputFormat | Fp4Format, scale: ScaleFormat) -> str:
    """A valid ``scale_rule`` for the output format and scale format."""
    if not isinstance(scale_rule, str) or scale_rule not in SCALE_RULES:
        raise ValueError(
            f"scale_rule: expected one of {', '.join(map(repr, SCALE_RULES))}, got {scale_rule!r}"
        )
    if scale_rule == "floor" and not scale.power_of_two:
        raise ValueError(
            f"scale_rule='floor' chooses a UE8M0 exponent; it needs scale='ue8m0', got "
            f"scale={scale.name!r}"
        )
    if scale_rule == "floor" and fmt.emax_elem is None:
        floors = ", ".join(repr(f.name) for f in OUTPUT_FORMATS.values() if f.emax_elem)
        raise ValueError(
            f"scale_rule='floor' is OCP MX's rule for {floors}; dtype={fmt.name!r} has no emax_elem"
        )
    return scale_rule


def check_flag(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return bool(value)
