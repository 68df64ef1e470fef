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


# the traced path of every entry point (api.quantize under torch.compile): outputs allocated
# in the graph, written by a mutating op that takes every option and operand of a call
_OPTIONS = (
    "int group_size, str dtype, str scale, str layout, float eps, bool pad_rows, "
    "str? activation, str scale_rule, float? clamp_limit, str arithmetic, "
    "int? expected_m, float? eps_norm, str norm_rounding"
)
_LIBRARY.define(f"outputs(Tensor x, {_OPTIONS}) -> (Tensor, Tensor)")
_LIBRARY.define(
    f"quantize_into(Tensor x, Tensor(a!) q, Tensor(b!) scales, {_OPTIONS}, Tensor? masked_m, "
    "Tensor? weight, Tensor(c!)? residual) -> ()"
)


def _quantize_op(
    x, group_size, dtype, scale, layout, eps, pad_rows, activation=None, scale_rule="rceil"
):
    # NOTES: the schema hands over exactly an int, a float and a bool, which is what the plan
    # cache's key needs, so a repeated call goes to the cached plan without api.quantize's
    # keyword binding (0.8 us a call on the CPU host, ahead of the dispatcher's 2.8)
    done = api.cached_run(x, (group_size, dtype, scale, layout, eps, pad_rows, activation,
                              scale_rule, "row"))  # fmt: skip
    if done is not None:
        return done
    q, scales = api.quantize(x, group_size, dtype=dtype, scale=scale, layout=layout, eps=eps,
                             pad_rows=pad_rows, activation=activation,
                             scale_rule=scale_rule)  # fmt: skip
    return q, scales


def _quantize_into_op(x, q, scales, group_size, dtype, scale, layout, eps, pad_rows, activation,
                      scale_rule, clamp_limit, arithmetic, expected_m, eps_norm, norm_rounding,
                      masked_m, weight, residual) -> None:  # fmt: skip
    norm = None if weight is None else (weight, eps_norm)
    api.quantize(x, group_size, dtype=dtype, scale=scale, layout=layout, eps=eps, out=q,
                 scale_out=scales, pad_rows=pad_rows, activation=activation, masked_m=masked_m,
                 expected_m=expected_m, norm=norm, residual=residual, scale_rule=scale_rule,
                 clamp_limit=clamp_limit, arithmetic=arithmetic,
                 norm_rounding=norm_rounding)  # fmt: skip


for _key in ("CUDA", "CPU"):
    _LIBRARY.impl("quantize", _quantize_op, _key)
    _LIBRARY.impl("quantize_into", _quantize_into_op, _key)
# NOTES: the overload itself, looked up once: through torch.ops' namespace and overload packet
# a call costs 0.4 us more (3.17 against 2.77 us a call of a no-op kernel on the CPU host)
_QUANTIZE_OP = torch.ops.fp8_group_quant.quantize.default


def _empty_outputs(x, options, shape: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised (q, scales) for an input of ``shape``: the real call's shapes, dtypes and
    strides, over storage of the size its layout owns."""
    if options.fp4 is not None:
        raise NotImplementedError(_FP4_OP)
    fmt, mode, group_size = options.fmt, options.mode, options.group_size
    if shape[-1] % (group_size * mode.width_factor):
        raise ValueError(
            f"x: the last dimension K={shape[-1]} is not a multiple of "
            f"{group_size * mode.width_factor} (group_size={group_size}, "
            f"activation={mode.name!r})"
        )
    geometry = Geometry(output_shape(mode, shape), group_size, options.layout, options.pad_rows)
    q = x.new_empty((geometry.q_storage,), dtype=getattr(torch, fmt.dtype_name))
    s = x.new_empty((geometry.scale_storage,), dtype=_TORCH_DTYPES[geometry.layout.dtype])
    return (
        q.as_strided(geometry.shape, geometry.q_strides),
        s.as_strided(geometry.scale_shape, geometry.scale_strides),
    )


@torch.library.register_fake("fp8_group_quant::quantize", lib=_LIBRARY)
def _quantize_fake(
    x, group_size, dtype, scale, layout, eps, pad_rows, activation=None, scale_rule="rceil"
):
    """Outputs shaped, typed and strided as the real call's, over storage of the same size."""
    options = check_options(group_size, dtype, scale, layout, eps, pad_rows, activation,
                            scale_rule)  # fmt: skip
    return _empty_outputs(x, options, tuple(x.shape))


@torch.library.register_fake("fp8_group_quant::quantize_into", lib=_LIBRARY)
def _quantize_into_fake(x, q, scales, *args) -> None:
    """The op writes its outputs in place and returns nothing."""


def _outputs_op(x, group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule,
                clamp_limit, arithmetic, expected_m, eps_norm, norm_rounding):  # fmt: skip
    """Uninitialised outputs of a call, its options checked; real and fake alike, so that the
    checks run outside dynamo's trace."""
    options = check_options(group_size, dtype, scale, layout, eps, pad_rows, activation,
                            scale_rule, expected_m, eps_norm, clamp_limit=clamp_limit,
                            arithmetic=arithmetic, norm_rounding=norm_rounding)  # fmt: skip
    return _empty_outputs(x, options, tuple(x.shape))


for _key in ("CUDA", "CPU"):
    _LIBRARY.impl("outputs", _outputs_op, _key)
torch.library.register_fake("fp8_group_quant::outputs", _outputs_op, lib=_LIBRARY)


def _name(value) -> str:
    """A dtype argument as the op's string: a name as given, torch.float8_e4m3fn as its name."""
    return value if isinstance(value, str) else str(value).removeprefix("torch.")


def quantize_traced(x: torch.Tensor, group_size: int, out, scale_out, **kwargs):
    """``api.quantize`` under ``torch.compile``: (q, scales) written by the mutating custom op
    into outputs the graph allocates (``outputs``) unless given; every option of
    ``api.quantize`` but the FP4 formats and a global scale."""
    if kwargs.get("global_scale") is not None or is_fp4(kwargs["dtype"], kwargs["scale"]):
        raise NotImplementedError(_FP4_OP)
    weight, eps_norm = kwargs["norm"] if kwargs["norm"] is not None else (None, None)
    options = (group_size, _name(kwargs["dtype"]), kwargs["scale"], kwargs["layout"],
               kwargs["eps"], kwargs["pad_rows"], kwargs["activation"], kwargs["scale_rule"],
               kwargs["clamp_limit"], kwargs["arithmetic"], kwargs["expected_m"],
               eps_norm, kwargs["norm_rounding"])  # fmt: skip
    q, scales = out, scale_out
    if q is None or scales is None:
        q_new, scales_new = torch.ops.fp8_group_quant.outputs(x, *options)
        q = q_new if q is None else q
        scales = scales_new if scales is None else scales
    torch.ops.fp8_group_quant.quantize_into(x, q, scales, *options, kwargs["masked_m"], weight,
                                            kwargs["residual"])  # fmt: skip
    return q, scales


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
    return _QUANTIZE_OP(x, group_size, dtype, scale, layout, eps, pad_rows, activation, scale_rule)


def quantize_packed(
    x: torch.Tensor, group_size: int = 128, eps: float = DEFAULT_EPS, pad_rows: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fgq.quantize_packed`` through the custom op: e4m3, UE8M0 scales packed for DeepGEMM."""
    return quantize(x, group_size, scale="ue8m0", layout="packed", eps=eps, pad_rows=pad_rows)
