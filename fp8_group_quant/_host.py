"""The NumPy backend of a request: every mode, written through the layouts' address maps.

The arithmetic is ``reference`` (quantization) and ``activation`` (SiLU-and-multiply and
RMSNorm); this module only allocates or checks the outputs, picks the values a mode
quantizes and writes the results where the kernels would.
"""

from __future__ import annotations

import numpy as np

from . import activation, reference
from ._arrays import ArrayInfo, describe
from ._layout import PACKED, WEIGHT_BLOCK, WEIGHT_BYTES
from ._outputs import (
    BothOrientations,
    OutputSpec,
    check_disjoint,
    check_output,
    check_writes,
    oriented_names,
    output_pair,
    specs,
    transposed_specs,
    weight_specs,
)
from ._request import BOTH, NVFP4_COMPUTED, Request, WeightRequest


def _strided(array: np.ndarray, shape, strides) -> np.ndarray:
    """``as_strided`` in elements, through a same-size integer view (numpy's ``as_strided``
    cannot rebuild the ml_dtypes float8 types)."""
    raw = array.view(f"u{array.itemsize}")
    view = np.lib.stride_tricks.as_strided(raw, shape, tuple(s * array.itemsize for s in strides))
    return view.view(array.dtype)


def _output(given, name: str, x_info: ArrayInfo, spec: OutputSpec):
    """(array, info): a new host output of ``spec``, or the caller's, checked."""
    if given is None:
        array = _strided(np.empty(spec.storage, spec.numpy_dtype), spec.shape, spec.strides)
        return array, describe(array, name)
    return given, check_output(given, name, x_info, spec)


def _flat(info: ArrayInfo, storage: int) -> np.ndarray:
    """A flat view of ``storage`` elements from the first element of a host output."""
    return _strided(info.obj, (storage,), (1,))


def run(request: Request, x: np.ndarray, x_info: ArrayInfo, out, scale_out, operands) -> tuple:
    """Quantize host ``x`` as ``request`` says; ``operands``: the call's other host arrays
    (masked_m, weight, residual) by name. Every check runs before anything is written."""
    q, q_info, scales, s_info, given = _checked(x_info, *specs(request), out, scale_out)
    residual = operands.get("residual")
    if residual is not None:
        _check_residual(residual, x_info, operands["weight"], given)
    if request.fp4 is not None:
        return (q, scales, *_fp4(request, x, q_info, s_info, operands.get("global_scale")))
    geometry = request.output
    if geometry.empty:
        return q, scales
    values = x
    if request.norm:
        values, new = activation.rms_norm(x, operands["weight"], request.eps_norm, x_info.dtype,
                                          residual, request.norm_rounding)  # fmt: skip
        if residual is not None and new is not None:
            residual[...] = new.astype(residual.dtype)
    elif request.mode.name is not None:  # a gated activation: gate then up
        n = geometry.k
        values = activation.gated_mul(request.mode.name, x[..., :n], x[..., n:],
                                      request.input_dtype, request.clamp_limit)  # fmt: skip
    storages = (_flat(q_info, geometry.q_storage).view(np.uint8),
                _flat(s_info, geometry.scale_storage))  # fmt: skip
    arguments = (values, geometry, request.fmt, request.scale, request.eps, *storages)
    rules = dict(rule=request.scale_rule, arithmetic=request.arithmetic)
    if request.masked is None:
        reference.quantize_into(*arguments, **rules)
    else:
        counts = np.asarray(operands["masked_m"])
        reference.quantize_into_masked(*arguments, counts, **rules)
    return q, scales


def _checked(x_info: ArrayInfo, q_spec, s_spec, out, scale_out, others=(),
             names=("out", "scale_out")) -> tuple:  # fmt: skip
    """(q, q_info, scales, s_info, given): both outputs, allocated or the caller's, checked
    against their specs and for overlap with x and ``others`` (name, info, spec), given too;
    ``names``: theirs in messages."""
    q, q_info = _output(out, names[0], x_info, q_spec)
    scales, s_info = _output(scale_out, names[1], x_info, s_spec)
    given = [(name, info, spec) for name, info, spec, array in (
        (names[0], q_info, q_spec, out), (names[1], s_info, s_spec, scale_out)
    ) if array is not None]  # fmt: skip
    check_disjoint(x_info, x_info.ptr, given + list(others))
    return q, q_info, scales, s_info, given


def _check_residual(residual: np.ndarray, x_info: ArrayInfo, weight, given) -> None:
    if not residual.flags.writeable:
        raise ValueError("residual: the array is read-only; the fused add writes it")
    r_info = describe(residual, "residual")
    check_writes([("x", x_info), ("norm", describe(weight, "norm"))],
                 [("residual", r_info)] + [(name, info) for name, info, _ in given])  # fmt: skip


def _fp4(request: Request, x, q_info: ArrayInfo, s_info: ArrayInfo, global_scale) -> tuple:
    """NVFP4 or MXFP4 into the outputs described by ``q_info`` and ``s_info``, by the call's
    arithmetic; NVFP4's computed global scale, if asked for, as a tuple."""
    computed = request.nvfp4 and request.global_mode == NVFP4_COMPUTED
    g = reference.nvfp4_global_scale(x) if computed else np.float32(request.global_value)
    geometry = request.output
    storage = _flat(s_info, geometry.scale_storage)
    if geometry.empty:
        storage[...] = 0
        return (np.array([g], np.float32),) if computed else ()
    values = np.asarray(x).astype(np.float32)
    groups = values.reshape(geometry.batches, geometry.rows, geometry.groups, -1)
    if request.arithmetic == "reciprocal":
        codes, exponents = reference.fp4_reciprocal_groups(groups, g, not request.nvfp4)
    elif request.nvfp4:
        codes, exponents = reference.nvfp4_groups(groups, g)
    else:
        codes, exponents = reference.mxfp4_groups(groups, request.eps, request.scale_rule)
    q_info.obj[...] = reference.pack_e2m1(codes.reshape(geometry.shape))
    # a float layout holds the power of two 2^(e - 127); the others the bytes (e4m3 or UE8M0)
    powers = (exponents.astype(np.uint32) << 23).view(np.float32)
    reference.store_scales(geometry, storage, powers, exponents)
    return (np.array([g], np.float32),) if computed else ()


def run_oriented(request: Request, x: np.ndarray, x_info: ArrayInfo, out, scale_out):
    """orientation="col" (qt, scales_t) or "both" (BothOrientations) of host ``x [M, K]``;
    ``out`` and ``scale_out`` are pairs (row, col) for "both". Every check runs before
    anything is written."""
    both = request.orientation == BOTH
    row_out, col_out = output_pair(out, "out", both)
    row_scale_out, col_scale_out = output_pair(scale_out, "scale_out", both)
    q_spec, s_spec = transposed_specs(request)
    row_names, col_names = oriented_names(both)
    rows_given = _row_outputs(request, x_info, row_out, row_scale_out, row_names)
    qt, qt_info, st, st_info, _ = _checked(x_info, q_spec, s_spec, col_out, col_scale_out,
                                           rows_given, col_names)  # fmt: skip
    rows = run(request, x, x_info, row_out, row_scale_out, {}) if both else (None, None)
    geometry = request.transposed
    values = np.asarray(x).astype(np.float32)
    codes, scales, exponents = reference.quantize_token_groups(
        values,
        request.fmt,
        request.scale,
        request.eps,
        request.scale_rule,
        request.group_size,
        request.arithmetic,
    )
    _flat(qt_info, q_spec.storage).view(np.uint8)[...] = codes.reshape(-1)
    reference.store_scales(geometry, _flat(st_info, geometry.scale_storage), scales, exponents)
    return BothOrientations(rows[0], rows[1], qt, st) if both else (qt, st)


def _row_outputs(request: Request, x_info: ArrayInfo, out, scale_out, names) -> list:
    """(name, info, spec) of the row-wise outputs a "both" call was given, checked; ``names``:
    theirs in messages."""
    q_spec, scale_spec = specs(request)
    found = []
    for name, array, spec in ((names[0], out, q_spec), (names[1], scale_out, scale_spec)):
        if array is not None:
            found.append((name, check_output(array, name, x_info, spec), spec))
    return found


def run_weight(request: WeightRequest, w: np.ndarray, w_info: ArrayInfo, out, scale_out):
    """``quantize_weight`` of host ``w``: (q, scales). Every check runs before any write."""
    q_spec, s_spec = weight_specs(request)
    q, q_info, scales, s_info, _ = _checked(w_info, q_spec, s_spec, out, scale_out)
    g, options = request.output, request.options
    values = np.asarray(w).astype(np.float32).reshape(g.batches, g.n, g.k)
    codes, block_scales, exponents = reference.quantize_blocks(
        values,
        options.fmt,
        options.scale,
        options.eps,
        options.scale_rule,
        block=g.block,
        arithmetic=options.arithmetic,
    )
    _flat(q_info, q_spec.storage).view(np.uint8)[...] = codes.reshape(-1)
    storage = _flat(s_info, s_spec.storage)
    if g.layout == WEIGHT_BYTES:
        storage[...] = np.asarray(exponents, np.uint8).reshape(-1)
        return q, scales
    if g.layout == PACKED:  # row n holds block row n // 128 (DeepGEMM's SM100 weight layout)
        block_scales, exponents = (None if a is None else np.repeat(a, WEIGHT_BLOCK, 1)[:, : g.n]
                                   for a in (block_scales, exponents))  # fmt: skip
    reference.store_scales(g.scales, storage, block_scales, exponents)
    return q, scales
