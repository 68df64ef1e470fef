"""FP8 per-token group quantization at memory bandwidth, with DeepGEMM-ready scale layouts."""

from ._jit import CompileError, GpuUnavailableError
from ._layout import LayoutName, WeightLayoutName
from ._spec import FormatName, OrientationName, ScaleName, ScaleRuleName
from .api import (
    BothOrientations,
    PreparedQuantize,
    as_float8,
    dequantize,
    dequantize_weight,
    prepare,
    quantize,
    quantize_packed,
    quantize_weight,
    scale_offsets,
    unpack_scales,
    warmup,
)

__all__ = [
    "BothOrientations",
    "CompileError",
    "FormatName",
    "GpuUnavailableError",
    "LayoutName",
    "OrientationName",
    "PreparedQuantize",
    "ScaleName",
    "ScaleRuleName",
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
    "WeightLayoutName",
]
__version__ = "0.1.0"
