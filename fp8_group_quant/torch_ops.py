"""The quantizer as a torch custom op, for ``torch.compile`` and CUDA-graph capture.

Importing this module registers ``torch.ops.fp8_group_quant.quantize`` (CUDA tensors through
the kernel, CPU tensors through the NumPy backend) with a fake implementation that gives the
exact shapes, dtypes and strides of both outputs, padded layouts included, so dynamo traces
through it without a graph break::

    from fp8_group_quant import torch_ops

    @torch.compile(fullgraph=True)
    def step(x):
        q, scales = torch_ops.quantize(x, 128, scale="ue8m0", layout="packed")
        ...

NOTES: the op is functional (it allocates its outputs); a direct ``fgq.quantize`` call stays
the lowest-overhead eager path, as the dispatcher adds its own cost per call.
"""

from __future__ import annotations

from typing import Any

import torch

from . import api
from ._layout import Geometry, LayoutName
from ._request import check_options, is_fp4, output_shape
from ._spec import (
    DEFAULT_EPS,
    ActivationName,
    FormatName,
    ScaleName,
    ScaleRuleName,
)

__all__ = ["quantize", "quantize_packed"]

_FP4_OP = (
    "dtype='e2m1': NVFP4 and MXFP4 (codes two a byte) are not custom ops yet; call "
    "fp8_group_quant.quantize"
)
_TORCH_DTYPES = {"int32": torch.int32, "float32": torch.float32, "uint8": torch.uint8}


# NOTES: registered through torch.library.Library rather than @custom_op: the wrapper
# custom_op adds cost about 30 us a call on the eager path (measured on CPU tensors, where the
# difference is the dispatcher alone: 32 us against 9 us over a direct call), and an op
# without a backward needs none of its autograd plumbing.
_LIBRARY = torch.library.Library("fp8_group_quant", "DEF")
_LIBRARY.define(
    "quantize(Tensor x, int group_size, str dtype, str scale, str layout, float eps, "
    'bool pad_rows, str? activation=None, str scale_rule="rceil") -> (Tensor, Tensor)'
)


def _quantize_op(
    x, group_size, dtype, scale, layout, eps, pad_rows, activation=None, scale_rule="rceil"
):
    options: dict[str, Any] = dict(dtype=dtype, scale=scale, layout=layout, activation=activation)
    q, scales = api.quantize(
        x, group_size, eps=eps, pad_rows=pad_rows, scale_rule=scale_rule, **options
    )
    return q, scales


for _key in ("CUDA", "CPU"):
    _LIBRARY.impl("quantize", _quantize_op, _key)


@torch.library.register_fake("fp8_group_quant::quantize", lib=_LIBRARY)
def _quantize_fake(
    x, group_size, dtype, scale, layout, eps, pad_rows, activation=None, scale_rule="rceil"
):
    """Outputs shaped, typed and strided as the real call's, over storage of the same size."""
    options = check_options(group_size, dtype, scale, layout, eps, pad_rows, activation,
                            scale_rule)  # fmt: skip
    if options.fp4 is not None:
        raise NotImplementedError(_FP4_OP)
    fmt, mode = options.fmt, options.mode
    if x.shape[-1] % (group_size * mode.width_factor):
        raise ValueError(
            f"x: the last dimension K={x.shape[-1]} is not a multiple of "
            f"{group_size * mode.width_factor} (group_size={group_size}, activation={activation!r})"
        )
    shape = output_shape(mode, tuple(x.shape))
    geometry = Geometry(shape, group_size, options.layout, options.pad_rows)
    q_dtype = getattr(torch, fmt.dtype_name)
    s_dtype = _TORCH_DTYPES[geometry.layout.dtype]
    q = x.new_empty((geometry.q_storage,), dtype=q_dtype)
    s = x.new_empty((geometry.scale_storage,), dtype=s_dtype)
    return (
        q.as_strided(geometry.shape, geometry.q_strides),
        s.as_strided(geometry.scale_shape, geometry.scale_strides),
    )


def quantize(
    x: torch.Tensor,
    group_size: int = 128,
    *,
    dtype: FormatName = "e4m3",
    scale: ScaleName = "float32",
    layout: LayoutName = "row",
    eps: float = DEFAULT_EPS,
    pad_rows: bool = False,
    activation: ActivationName | None = None,
    scale_rule: ScaleRuleName = "rceil",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fgq.quantize`` through the custom op (no ``out=``): traceable by ``torch.compile``."""
    if is_fp4(dtype, scale):
        raise NotImplementedError(_FP4_OP)
    return torch.ops.fp8_group_quant.quantize(
        x, group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule
    )


def quantize_packed(
    x: torch.Tensor, group_size: int = 128, eps: float = DEFAULT_EPS, pad_rows: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fgq.quantize_packed`` through the custom op: e4m3, UE8M0 scales packed for DeepGEMM."""
    return quantize(x, group_size, scale="ue8m0", layout="packed", eps=eps, pad_rows=pad_rows)
