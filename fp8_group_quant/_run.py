"""One path for every call: bring the arrays into a library we read, describe them once,
validate into a Request, then run the NumPy backend or the GPU plan.

torch CPU tensors run the NumPy backend on numpy views of their memory and come back as torch
tensors; JAX, numba and other DLPack / CUDA-array-interface arrays run on zero-copy CuPy views
and come back in their own library.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from . import _device, _host
from ._arrays import (
    JAX,
    NUMPY,
    describe,
    device_signature,
    foreign_library,
    from_cupy,
    is_torch_cpu,
    kind_of,
    numpy_to_torch_cpu,
    to_cupy,
    torch_cpu_to_numpy,
)
from ._outputs import BothOrientations, check_outputs_taken, check_writes
from ._request import (
    NVFP4_ON_DEVICE,
    ROW_WISE,
    Operands,
    Options,
    Request,
    WeightOptions,
    check_preparable,
    make_request,
    make_weight_request,
)

OPERANDS = ("masked_m", "weight", "residual", "global_scale")  # a call's arrays besides x


@dataclass(frozen=True)
class Call:
    """One call's arguments as given: ``raw`` (the options, hashable) keys the plan cache."""

    options: Options
    raw: tuple
    arrays: dict  # operand name -> the caller's array (absent when not given)
    global_value: float | None = None  # NVFP4's global scale given as a number


def quantize(x, call: Call, out, scale_out):
    """Quantize ``x`` as ``call`` says, on the backend of its library."""
    if is_torch_cpu(x):
        return _on_torch_cpu(x, call, out, scale_out)
    library = foreign_library(x)
    if library is not None:
        return _on_foreign(x, library, call, out, scale_out)
    check_outputs_taken(call.options, out, scale_out)
    info, request, described = _request_of(x, call)
    if request.orientation != ROW_WISE:
        if info.kind == NUMPY:
            return _host.run_oriented(request, x, info, out, scale_out)
        key = _plan_key(x, call, request, described)
        return _device.tile_plan(info, request, key).run(info.ptr, out, scale_out)
    if info.kind == NUMPY:
        return _host.run(request, x, info, out, scale_out, call.arrays)
    plan, info, request, described = device_plan(x, call, out, scale_out, info, request, described)
    return plan.run(info.ptr, out, scale_out, extra_pointers(request, described))


def _request_of(x, call: Call) -> tuple:
    """(x's description, the Request, the other arrays' descriptions by operand name)."""
    info = describe(x, "x")
    described = {name: describe(a, _name(name)) for name, a in call.arrays.items()}
    operands = Operands(**described, global_value=call.global_value)
    return info, make_request(info, call.options, operands), described


def device_plan(x, call: Call, out, scale_out, info=None, request=None, described=None):
    """(plan, x's description, Request, other arrays' descriptions) of a GPU call, its writes
    checked; the plan is made once per input layout, options and other arrays' layout."""
    if info is None:
        info, request, described = _request_of(x, call)
    check_preparable(request)
    if request.residual:
        _check_residual_writes(info, described, out, scale_out)
    key = _plan_key(x, call, request, described)
    plan = _device.cached(key) or _device.make_plan(info, request, key)
    return plan, info, request, described


def _name(operand: str) -> str:
    return "norm" if operand == "weight" else operand


def _plan_key(x, call: Call, request: Request, described: dict) -> tuple:
    """The plan cache's key of a GPU call: x's layout, the options as given, the other arrays'
    layout (the entry point's lookup builds the same for a call without them)."""
    return (*device_signature(x)[:-1], call.raw, *_operand_key(request, described))


def _operand_key(request: Request, described: dict) -> tuple:
    """What of the call's other arrays the plan depends on (their pointers are per call);
    nothing for a plain call, whose key the entry point's cache lookup also builds."""
    if request.masked is None and not request.norm and not request.takes_global:
        return ()
    masked = described.get("masked_m")
    return (masked.dtype if masked is not None else None, request.residual,
            request.r_batch_stride, request.r_row_stride, request.global_mode,
            request.global_value)  # fmt: skip


def extra_pointers(request: Request, described: dict) -> tuple:
    """(Params field, pointer) of each array of the call besides x and its outputs."""
    if request.masked is not None:
        return (("masked_m", described["masked_m"].ptr),)
    if request.norm:
        residual = described.get("residual")
        return (("weight", described["weight"].ptr),
                ("residual", residual.ptr if residual is not None else 0))  # fmt: skip
    if request.takes_global and request.global_mode == NVFP4_ON_DEVICE:
        return (("global_ptr", described["global_scale"].ptr),)
    return ()


def _check_residual_writes(info, described: dict, out, scale_out) -> None:
    writes = [("residual", described["residual"])]
    for given, name in ((out, "out"), (scale_out, "scale_out")):
        if given is not None:
            writes.append((name, describe(given, name)))
    check_writes([("x", info), ("norm", described["weight"])], writes)


def _on_torch_cpu(x, call: Call, out, scale_out):
    """The NumPy backend on numpy views of torch CPU tensors' memory, results back as torch
    tensors (the caller's own tensors when given)."""
    for given, name in [*_outputs_given(out, scale_out), *_named(call.arrays)]:
        if given is not None and not is_torch_cpu(given):
            raise TypeError(f"{name}: expected a torch CPU tensor like x, got {kind_of(given)}")
    view = lambda a, name: None if a is None else torch_cpu_to_numpy(a, name)  # noqa: E731
    arrays = {n: view(a, _name(n)) for n, a in call.arrays.items()}
    results = quantize(view(x, "x"), Call(call.options, call.raw, arrays, call.global_value),
                       _views(out, "out", view), _views(scale_out, "scale_out", view))  # fmt: skip
    return _as_torch(results, out, scale_out)


def _outputs_given(out, scale_out) -> list:
    """(array, name) of each output a caller gave, pairs ("both") taken apart."""
    found = []
    for given, name in ((out, "out"), (scale_out, "scale_out")):
        if isinstance(given, tuple):
            found += [(a, f"{name}[{i}]") for i, a in enumerate(given)]
        else:
            found.append((given, name))
    return found


def _views(given, name: str, view):
    """A caller's output as a numpy view, or a pair of them ("both")."""
    if isinstance(given, tuple):
        return tuple(view(a, f"{name}[{i}]") for i, a in enumerate(given))
    return view(given, name)


def _as_torch(results, out, scale_out):
    """Host results as torch CPU tensors: the caller's own where given."""
    if isinstance(results, BothOrientations):
        row_out, col_out = out if isinstance(out, tuple) else (None, None)
        row_s, col_s = scale_out if isinstance(scale_out, tuple) else (None, None)
        return BothOrientations(*_as_torch(results[:2], row_out, row_s),
                                *_as_torch(results[2:], col_out, col_s))  # fmt: skip
    given = (out, scale_out)
    return tuple(
        given[i] if i < 2 and given[i] is not None else numpy_to_torch_cpu(result)
        for i, result in enumerate(results)
    )


def _on_foreign(x, library: str, call: Call, out, scale_out):
    """JAX, numba, DLPack: zero-copy cupy views in, the results back in ``library``."""
    if library == JAX and (out is not None or scale_out is not None):
        raise TypeError("out: JAX arrays are immutable; call without out= / scale_out=")
    for given, name in [(out, "out"), (scale_out, "scale_out"), *_named(call.arrays)]:
        if given is not None and foreign_library(given) is None:
            raise TypeError(f"{name}: expected an array of x's library, got {kind_of(given)}")
    view = lambda a, name: None if a is None else to_cupy(a, name)  # noqa: E731
    arrays = {n: view(a, _name(n)) for n, a in call.arrays.items()}
    results = quantize(to_cupy(x), Call(call.options, call.raw, arrays, call.global_value),
                       view(out, "out"), view(scale_out, "scale_out"))  # fmt: skip
    fmt = call.options.fmt
    float8 = fmt.dtype_name if fmt is not None and fmt.is_float8 else None
    if isinstance(results, BothOrientations):  # codes at 0 and 2, their scales at 1 and 3
        # (its out= pairs were refused above: a tuple is no array of x's library)
        return BothOrientations(*(from_cupy(result, library, None if i % 2 else float8)
                                  for i, result in enumerate(results)))  # fmt: skip
    given = (out, scale_out)
    return tuple(
        given[i] if i < 2 and given[i] is not None
        else from_cupy(result, library, float8 if i == 0 else None)
        for i, result in enumerate(results)
    )  # fmt: skip


def quantize_weight(w, options: WeightOptions, out, scale_out, raw=None):
    """``quantize_weight`` on the backend of ``w``'s library (docs/spec.md, section 4c); ``raw``:
    the options as given, where the entry point's cache lookup keys them so (else the checked
    options key the plan)."""
    signature = device_signature(w)
    if signature is not None:  # a GPU array: the plan of its layout and options, made once
        key = (*signature[:-1], options if raw is None else raw)
        plan = _device.cached(key)
        if plan is None:
            info = describe(w, "w")
            plan = _device.tile_plan(info, make_weight_request(info, options), key)
        return plan.run(signature[-1], out, scale_out)
    if is_torch_cpu(w):
        for given, name in ((out, "out"), (scale_out, "scale_out")):
            if given is not None and not is_torch_cpu(given):
                raise TypeError(f"{name}: expected a torch CPU tensor like w, got {kind_of(given)}")
        view = lambda a, name: None if a is None else torch_cpu_to_numpy(a, name)  # noqa: E731
        results = quantize_weight(view(w, "w"), options, view(out, "out"),
                                  view(scale_out, "scale_out"))  # fmt: skip
        return _as_torch(results, out, scale_out)
    info = describe(w, "w")
    request = make_weight_request(info, options)
    if info.kind != NUMPY:  # a GPU array without a signature (torch.compile's tracing)
        return _device.tile_plan(info, request, None).run(info.ptr, out, scale_out)
    return _host.run_weight(request, w, info, out, scale_out)


def _named(arrays: dict) -> list:
    return [(a, _name(n)) for n, a in arrays.items()]


def global_scale_arguments(global_scale) -> tuple[dict, float | None]:
    """NVFP4's global scale as an operand array or a number."""
    if global_scale is None:
        return {}, None
    if isinstance(global_scale, numbers.Real) and not isinstance(global_scale, bool):
        return {}, float(global_scale)
    if not hasattr(global_scale, "shape"):  # no array of any library
        raise TypeError(
            f"global_scale: expected a float or a one-element float32 array of x's library, got "
            f"{type(global_scale).__name__}"
        )
    return {"global_scale": global_scale}, None
