"""FP8 per-token group quantization at memory bandwidth, with DeepGEMM-ready scale layouts."""

from ._jit import CompileError, GpuUnavailableError
from ._layout import LayoutName
from ._spec import FormatName, ScaleName, ScaleRuleName
from .api import (
    PreparedQuantize,
    as_float8,
    dequantize,
    prepare,
    quantize,
    quantize_packed,
    scale_offsets,
    unpack_scales,
    warmup,
)

__all__ = [
    "CompileError",
    "FormatName",
    "GpuUnavailableError",
    "LayoutName",
    "PreparedQuantize",
    "ScaleName",
    "ScaleRuleName",
    "as_float8",
    "dequantize",
    "prepare",
    "quantize",
    "quantize_packed",
    "scale_offsets",
    "unpack_scales",
    "warmup",
]
__version__ = "0.1.0"
