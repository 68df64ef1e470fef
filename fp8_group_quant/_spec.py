"""The supported matrix of SPEC sections 2 and 3, as data: one place for names and limits."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from ._layout import LAYOUTS, PACKED_LAYOUTS

GROUP_SIZES = (32, 64, 128, 256)
INPUT_DTYPES = ("bfloat16", "float16", "float32")
SCALE_FORMATS = ("float32", "ue8m0")
DEFAULT_EPS = 1e-10
UE8M0_FLOOR = np.float32(1e-10)  # SPEC 3.3: y = max(amax / fmax, 1e-10)


@dataclass(frozen=True)
class OutputFormat:
    name: str
    fmax: float
    numpy_dtype: np.dtype  # the host dtype of q
    nan_code: int  # code of a NaN input, before its sign bit
    keeps_inf: bool  # +-Inf inputs stay +-Inf rather than saturating
    inf_code: int
    signed_nan: bool

    @property
    def is_float8(self) -> bool:
        return self.name != "int8"


OUTPUT_FORMATS = {
    "e4m3": OutputFormat("e4m3", 448.0, np.dtype(ml_dtypes.float8_e4m3fn), 0x7F, False, 0, True),
    "e5m2": OutputFormat("e5m2", 57344.0, np.dtype(ml_dtypes.float8_e5m2), 0x7E, True, 0x7C, True),
    "int8": OutputFormat("int8", 127.0, np.dtype(np.int8), 0x00, False, 0, False),
}
OUTPUT_ALIASES = {
    "float8_e4m3fn": "e4m3",
    "fp8_e4m3": "e4m3",
    "float8_e5m2": "e5m2",
    "fp8_e5m2": "e5m2",
}


def output_format(dtype) -> OutputFormat:
    """Accepts "e4m3" / "e5m2" / "int8", their numpy/ml_dtypes/torch dtypes, and aliases."""
    name = getattr(dtype, "name", None)
    if name is None and isinstance(dtype, type):  # a scalar type such as ml_dtypes.float8_e5m2
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    name = (name or str(dtype)).removeprefix("torch.")
    name = OUTPUT_ALIASES.get(name, name)
    if name not in OUTPUT_FORMATS:
        raise ValueError(
            f"dtype: expected one of {', '.join(OUTPUT_FORMATS)} "
            f"(or float8_e4m3fn / float8_e5m2), got {dtype!r}"
        )
    return OUTPUT_FORMATS[name]


def check_options(group_size, scale, layout, eps) -> float:
    """Validate the scalar options; returns eps as a float. Raises ValueError/TypeError."""
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise TypeError(f"group_size: expected an int, got {type(group_size).__name__}")
    if int(group_size) not in GROUP_SIZES:
        raise ValueError(
            f"group_size: expected one of {', '.join(map(str, GROUP_SIZES))}, got {group_size}"
        )
    if scale not in SCALE_FORMATS:
        raise ValueError(f"scale: expected 'float32' or 'ue8m0', got {scale!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    if layout in PACKED_LAYOUTS and scale != "ue8m0":
        raise ValueError(
            f"layout={layout!r} packs UE8M0 exponent bytes into int32 words; it needs "
            f"scale='ue8m0', got scale={scale!r}"
        )
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
