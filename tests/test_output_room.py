"""A caller's output buffer holds everything the layout writes (padding included), counted
against the view's own extent, or the call is refused before anything is written: on the NumPy
backend, on torch CPU tensors and on the GPU alike (issue 43, items 1 and 3), for the row-wise
outputs and the tile kernels' (orientation "both", quantize_weight).

Each case places the view at the start of a region inside a larger buffer poisoned before and
after it; after the call every byte outside the view's extent is unchanged, and the storage the
view was given holds the NumPy reference bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from backends import (
    HOST_AND_GPU,
    compiled_kernels,  # noqa: F401 - GPU tests find the kernels compiled
    poisoned_bytes,
    poisoned_spec,
    spec_itemsize,
    strided_view,
    to_device,
    to_host_bytes,
)
from helpers import activations, assert_same_bytes, reference_storage

import fp8_group_quant as fgq
from fp8_group_quant._arrays import describe, strided_extent
from fp8_group_quant._layout import Geometry
from fp8_group_quant._outputs import specs as output_specs
from fp8_group_quant._outputs import transposed_specs, weight_specs
from fp8_group_quant._request import (
    check_options,
    check_weight_options,
    make_request,
    make_weight_request,
)
from fp8_group_quant._spec import OUTPUT_FORMATS

# (group size, dtype, scale) each layout takes; K = 384 gives 3 groups of 128 (a packed word
# with a spare byte) and 12 of 32 (three blocked tile columns)
LAYOUT_OPTIONS = {
    "row": (128, "e4m3", "float32"),
    "col": (128, "e4m3", "float32"),
    "col_tma": (128, "e4m3", "ue8m0"),
    "packed": (128, "e4m3", "ue8m0"),
    "packed_row": (128, "e4m3", "ue8m0"),
    "blocked": (32, "e4m3", "ue8m0"),
}
# M: one row, every residue of the TMA alignment of 4, both sides of the blocked layout's 128-row
# tile, and a batched input (each batch padded on its own)
SHAPES = [(m, 384) for m in (1, 2, 3, 4, 5, 6, 7, 8, 31, 127, 128, 129, 255, 300)]
SHAPES += [(2, 7, 384), (3, 4, 384)]
BEFORE, AFTER = 64, 1024  # poisoned bytes around the region (AFTER outruns CuPy's 512 rounding)
POISON = 0x7F


def _case(shape, layout, backend, seed=0):
    group_size, dtype, scale = LAYOUT_OPTIONS[layout]
    x_host = activations(np.random.default_rng(seed + len(shape)), shape, "bfloat16")
    geometry = Geometry(shape, group_size, layout, False)
    options = dict(dtype=dtype, scale=scale, layout=layout)
    return to_device(x_host, backend), x_host, geometry, options


def _scale_view(buffer, geometry: Geometry, backend: str):
    return strided_view(buffer, geometry.layout.dtype, geometry.scale_shape,
                        geometry.scale_strides, backend)  # fmt: skip


def _extent(geometry: Geometry) -> int:
    """Bytes the scale view of ``geometry`` covers from its first element."""
    return strided_extent(geometry.scale_shape, geometry.scale_strides) * geometry.layout.word_bytes


@pytest.mark.parametrize("backend", HOST_AND_GPU)
@pytest.mark.parametrize("layout", list(LAYOUT_OPTIONS))  # every scale layout
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scale_out_inside_a_larger_buffer(shape, layout, backend):
    x, x_host, geometry, options = _case(shape, layout, backend)
    need, extent = geometry.scale_storage_bytes, _extent(geometry)
    buffer = poisoned_bytes(BEFORE + need + AFTER, POISON, backend)
    view = _scale_view(buffer[BEFORE:], geometry, backend)
    _, s_ref = reference_storage(x_host, geometry, options["dtype"], options["scale"], 1e-10)
    if extent < need:  # the last padding rows lie past the view, on the caller's other data
        with pytest.raises(ValueError, match=f"scale_out: the layout owns {need} bytes"):
            fgq.quantize(x, geometry.group_size, **options, scale_out=view)
        assert (to_host_bytes(buffer) == POISON).all(), "a refused call wrote"
        return
    _, s = fgq.quantize(x, geometry.group_size, **options, scale_out=view)
    assert s is view
    got = to_host_bytes(buffer)
    assert (got[:BEFORE] == POISON).all() and (got[BEFORE + extent :] == POISON).all()
    assert_same_bytes(got[BEFORE : BEFORE + need], s_ref, f"scales {layout} {shape}")


@pytest.mark.parametrize("backend", HOST_AND_GPU)
@pytest.mark.parametrize("layout", list(LAYOUT_OPTIONS))  # every scale layout
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_scale_out_over_a_buffer_of_exactly_the_storage(shape, layout, backend):
    # a buffer that ends where the layout's storage ends: the padding is the caller's to give
    x, x_host, geometry, options = _case(shape, layout, backend, seed=1)
    buffer = poisoned_bytes(geometry.scale_storage_bytes, POISON, backend)
    view = _scale_view(buffer, geometry, backend)
    _, s = fgq.quantize(x, geometry.group_size, **options, scale_out=view)
    assert s is view
    _, s_ref = reference_storage(x_host, geometry, options["dtype"], options["scale"], 1e-10)
    assert_same_bytes(to_host_bytes(buffer), s_ref, f"scales {layout} {shape}")


@pytest.mark.parametrize("backend", HOST_AND_GPU)
@pytest.mark.parametrize("shape", [(7, 384), (2, 5, 384), (8, 384)], ids=str)  # padded, not
def test_out_with_padding_rows_inside_a_larger_buffer(shape, backend):
    # q with pad_rows owns align(M, 4) rows: its last rows lie past a view of M rows
    x, x_host, _, _ = _case(shape, "row", backend)
    geometry = Geometry(shape, 128, "row", True)
    need, rows = geometry.q_storage, geometry.rows
    extent = need - (geometry.q_rows - rows) * geometry.k
    buffer = poisoned_bytes(BEFORE + need + AFTER, POISON, backend)
    dtype = OUTPUT_FORMATS["e4m3"].dtype_name
    out = strided_view(buffer[BEFORE:], dtype, geometry.shape, geometry.q_strides, backend)
    if extent < need:
        with pytest.raises(ValueError, match=f"out: the layout owns {need} bytes"):
            fgq.quantize(x, 128, pad_rows=True, out=out)
        assert (to_host_bytes(buffer) == POISON).all(), "a refused call wrote"
        return
    q, _ = fgq.quantize(x, 128, pad_rows=True, out=out)
    got = to_host_bytes(buffer)
    assert (got[:BEFORE] == POISON).all() and (got[BEFORE + need :] == POISON).all()
    q_ref, _ = reference_storage(x_host, geometry, "e4m3", "float32", 1e-10)
    assert_same_bytes(got[BEFORE : BEFORE + need], q_ref, f"q {shape}")


@pytest.mark.parametrize("backend", HOST_AND_GPU)
def test_the_issue_view_of_31_floats_is_refused(backend):
    # issue 43: col_tma, M = 7, a (7, 4) view with strides (1, 8) over the first 31 floats of a
    # larger buffer; float 31 is the caller's neighbouring data
    x, _, geometry, options = _case((7, 512), "col_tma", backend)
    buffer = poisoned_bytes(4096, POISON, backend)
    view = strided_view(buffer, "float32", (7, 4), (1, 8), backend)
    with pytest.raises(ValueError, match="scale_out: .* the view covers 124"):
        fgq.quantize(x, 128, layout="col_tma", scale_out=view)
    assert (to_host_bytes(buffer) == POISON).all()


# the tile kernels' outputs (issue 44): orientation "both" (q, scales, qt, scales_t) and
# quantize_weight (q, scales), each inside a larger buffer poisoned before and after it --------

BOTH_LAYOUTS = {"row": "float32", "col": "float32", "col_tma": "ue8m0", "packed": "ue8m0",
                "packed_row": "ue8m0"}  # fmt: skip
WEIGHT_LAYOUTS = {"row": "float32", "col": "ue8m0", "bytes": "ue8m0", "packed": "ue8m0"}


def _storage_bytes(outputs) -> list:
    """Each output's storage bytes (``poisoned_spec``'s buffers), on the host."""
    return [to_host_bytes(buffer) for _, buffer in outputs]


def _guarded_call(backend, specs, call):
    """Place each of ``specs`` BEFORE bytes into a buffer poisoned BEFORE + storage + AFTER and
    call ``call(views)``. Where a layout's storage runs past its view (padding on the caller's
    neighbouring data) the call must be refused with nothing written; else every byte outside
    each storage stays poisoned. Returns the storages' bytes, or None where refused."""
    buffers, views, refused = [], [], False
    for spec in specs:
        need = spec.storage * spec_itemsize(spec)
        refused |= strided_extent(spec.shape, spec.strides) * spec_itemsize(spec) < need
        buffers.append(poisoned_bytes(BEFORE + need + AFTER, POISON, backend))
        views.append(strided_view(buffers[-1][BEFORE:], spec.dtype, spec.shape, spec.strides,
                                  backend))  # fmt: skip
    if refused:
        with pytest.raises(ValueError, match="owns"):
            call(views)
        assert all((to_host_bytes(b) == POISON).all() for b in buffers), "a refused call wrote"
        return None
    call(views)
    stored = []
    for spec, buffer in zip(specs, buffers):
        got, need = to_host_bytes(buffer), spec.storage * spec_itemsize(spec)
        assert (got[:BEFORE] == POISON).all() and (got[BEFORE + need :] == POISON).all()
        stored.append(got[BEFORE : BEFORE + need])
    return stored


@pytest.mark.parametrize("backend", HOST_AND_GPU)
@pytest.mark.parametrize("layout", list(BOTH_LAYOUTS))
# M: one token, the TMA alignment's residues, both sides of a token group, a partial third
@pytest.mark.parametrize("m", [1, 3, 4, 127, 129, 300])
def test_both_orientations_inside_larger_buffers(m, layout, backend):
    scale = BOTH_LAYOUTS[layout]
    x_host = activations(np.random.default_rng(m), (m, 256), "bfloat16", specials=True)
    options = check_options(128, "e4m3", scale, layout, orientation="both")
    request = make_request(describe(x_host, "x"), options)
    specs = [*output_specs(request), *transposed_specs(request)]
    reference = [poisoned_spec(spec, "numpy", POISON) for spec in specs]
    fgq.quantize(x_host, 128, scale=scale, layout=layout, orientation="both",
                 out=(reference[0][0], reference[2][0]),
                 scale_out=(reference[1][0], reference[3][0]))  # fmt: skip
    x = to_device(x_host, backend)
    stored = _guarded_call(backend, specs, lambda v: fgq.quantize(
        x, 128, scale=scale, layout=layout, orientation="both", out=(v[0], v[2]),
        scale_out=(v[1], v[3])))  # fmt: skip
    if stored is not None:
        for name, got, want in zip(("q", "scales", "qt", "scales_t"), stored,
                                   _storage_bytes(reference)):  # fmt: skip
            assert_same_bytes(got, want, f"{name} ({backend} both {layout} M={m})")


@pytest.mark.parametrize("backend", HOST_AND_GPU)
@pytest.mark.parametrize("layout", list(WEIGHT_LAYOUTS))
# one block, partial blocks both ways, whole blocks, and experts with partial blocks
@pytest.mark.parametrize("shape", [(1, 128), (3, 200), (130, 300), (256, 256), (2, 130, 200)],
                         ids=str)  # fmt: skip
def test_weight_outputs_inside_larger_buffers(shape, layout, backend):
    scale = WEIGHT_LAYOUTS[layout]
    w_host = activations(np.random.default_rng(len(shape) + shape[-1]), shape, "bfloat16",
                         specials=True)  # fmt: skip
    options = check_weight_options((128, 128), "e4m3", scale, layout, 1e-10, "rceil")
    specs = list(weight_specs(make_weight_request(describe(w_host, "w"), options)))
    reference = [poisoned_spec(spec, "numpy", POISON) for spec in specs]
    fgq.quantize_weight(w_host, scale=scale, layout=layout, out=reference[0][0],
                        scale_out=reference[1][0])  # fmt: skip
    w = to_device(w_host, backend)
    stored = _guarded_call(backend, specs, lambda v: fgq.quantize_weight(
        w, scale=scale, layout=layout, out=v[0], scale_out=v[1]))  # fmt: skip
    if stored is not None:
        for name, got, want in zip(("q", "scales"), stored, _storage_bytes(reference)):
            assert_same_bytes(got, want, f"{name} ({backend} weight {layout} {shape})")
