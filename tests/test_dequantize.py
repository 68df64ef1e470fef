"""dequantize infers the group size where the shapes determine it, requires it where they do
not, refuses one that contradicts the scales, and requires the format of uint8 codes (issue 43,
item 1): on the NumPy backend, torch CPU tensors and the GPU alike."""

from __future__ import annotations

import ctypes
from functools import partial

import numpy as np
import pytest
from backends import HOST_AND_GPU, to_device, to_host
from helpers import activations

import fp8_group_quant as fgq

# the float layouts (their groups a row are K / G), the padded and packed ones (they are not)
FLOAT_LAYOUTS = ["row", "col", "col_tma"]
PADDED_LAYOUTS = [("packed", 128), ("packed_row", 128), ("blocked", 32)]


def _reference(x, group_size, **options):
    """(q, scales, values) of the NumPy backend: values decoded by hand, group by group."""
    q, s = fgq.quantize(x, group_size, **options)
    codes = np.asarray(q).astype(np.float32)
    rows = codes.reshape(*codes.shape[:-1], -1, group_size)
    if s.dtype == np.float32:
        scales = np.asarray(s)
    elif s.dtype == np.int32:
        scales = fgq.unpack_scales(s, x.shape[-1] // group_size)
    else:  # blocked: the row layout's scales are the same values
        scales = fgq.unpack_scales(
            fgq.quantize(x, group_size, **{**options, "layout": "packed_row"})[1],
            x.shape[-1] // group_size,
        )
    return q, s, (rows * scales[..., None]).reshape(codes.shape)


def _format(backend: str) -> dict:
    """cupy holds e4m3 codes as uint8, whose format dequantize must be told."""
    return {"dtype": "e4m3"} if backend == "cupy" else {}


@pytest.mark.parametrize("backend", HOST_AND_GPU)
@pytest.mark.parametrize("layout", FLOAT_LAYOUTS)
@pytest.mark.parametrize("group_size", [32, 64, 128, 256])  # every supported size
def test_float_scales_determine_the_group_size(group_size, layout, backend):
    x = activations(np.random.default_rng(group_size), (8, 512), "bfloat16")
    q, s, expected = _reference(x, group_size, layout=layout)
    q, s = to_device(np.asarray(q), backend), to_device(np.asarray(s), backend)
    dequantize = partial(fgq.dequantize, **_format(backend))
    np.testing.assert_array_equal(to_host(dequantize(q, s)), expected)
    np.testing.assert_array_equal(to_host(dequantize(q, s, group_size)), expected)
    wrong = 128 if group_size != 128 else 64
    with pytest.raises(ValueError, match=f"group_size: {wrong} contradicts the shapes"):
        dequantize(q, s, wrong)


@pytest.mark.parametrize("backend", HOST_AND_GPU)
@pytest.mark.parametrize("layout, smallest", PADDED_LAYOUTS)
def test_packed_and_blocked_scales_need_the_group_size(layout, smallest, backend):
    # the issue's repro: blocked scales of G = 64 for (8, 256) have the shape of G = 128's
    x = activations(np.random.default_rng(43), (8, 256), "bfloat16")
    for group_size in (g for g in (32, 64, 128) if g >= smallest):
        options = dict(scale="ue8m0", layout=layout)
        q, s, expected = _reference(x, group_size, **options)
        q, s = to_device(np.asarray(q), backend), to_device(np.asarray(s), backend)
        dequantize = partial(fgq.dequantize, **_format(backend))
        with pytest.raises(TypeError, match="group_size: .* do not determine it"):
            dequantize(q, s)
        np.testing.assert_array_equal(to_host(dequantize(q, s, group_size)), expected)
        for wrong in (g for g in (32, 64, 128) if g != group_size and g >= smallest):
            with pytest.raises(ValueError, match="group_size|scales"):
                dequantize(q, s, wrong)


@pytest.mark.parametrize(
    "backend", ["numpy", "torch_cpu", pytest.param("cupy", marks=pytest.mark.gpu)]
)
def test_uint8_codes_need_their_format(backend):
    # uint8 codes (cupy's float8 container) holding e5m2 were read as e4m3 without a word
    x = activations(np.random.default_rng(5), (4, 256), "bfloat16")
    q, s = fgq.quantize(x, 128, dtype="e5m2")
    codes = to_device(np.asarray(q).view(np.uint8), backend)
    scales = to_device(s, backend)
    with pytest.raises(TypeError, match="dtype: q holds uint8 codes"):
        fgq.dequantize(codes, scales)
    got = fgq.dequantize(codes, scales, dtype="e5m2")
    np.testing.assert_array_equal(to_host(got), fgq.dequantize(q, s))


PAIRS = [(a, b) for a in ("numpy", "torch_cpu", "cupy", "torch")
         for b in ("numpy", "torch_cpu", "cupy", "torch") if a != b]  # fmt: skip


@pytest.mark.parametrize(
    "q_lib, s_lib",
    [
        pytest.param(*pair, marks=pytest.mark.gpu) if {"cupy", "torch"} & set(pair) else pair
        for pair in PAIRS
    ],  # fmt: skip
)
@pytest.mark.parametrize("entry", ["dequantize", "dequantize_weight", "mxfp4"])
def test_codes_and_scales_of_two_libraries_are_refused(entry, q_lib, s_lib):
    # each dequantize path checks the pair before it reads either: a TypeError naming the
    # argument of the other library, never the libraries' own errors about mixed operands
    x = activations(np.random.default_rng(6), (128, 256), "bfloat16")
    if entry == "dequantize":
        (q, s), call = fgq.quantize(x, 128), partial(fgq.dequantize, dtype="e4m3")
    elif entry == "dequantize_weight":
        (q, s), call = fgq.quantize_weight(x), partial(fgq.dequantize_weight, dtype="e4m3")
    else:
        q, s = fgq.quantize(x, 32, dtype="e2m1", scale="ue8m0")
        call = partial(fgq.dequantize, group_size=32, dtype="e2m1")
    q = to_device(np.asarray(q).view(np.uint8), q_lib)
    s = to_device(np.asarray(s), s_lib)
    with pytest.raises(TypeError, match="(q|scales): expected a"):
        call(q, s)


@pytest.mark.parametrize("layout", ["row", "col", "col_tma", "packed", "packed_row", "blocked"])
@pytest.mark.parametrize("shape", [(5, 256), (2, 3, 256)], ids=str)  # padded rows; batches
def test_scale_offsets_find_every_scale_where_quantize_put_it(shape, layout):
    # the public address map the notebook reads instead of the private Geometry
    x = activations(np.random.default_rng(11), shape, "bfloat16")
    q_row, s_row = fgq.quantize(x, 32, scale="ue8m0", layout="row")
    _, s = fgq.quantize(x, 32, scale="ue8m0", layout=layout)
    offsets = fgq.scale_offsets(shape, 32, layout)
    assert offsets.shape == shape[:-1] + (shape[-1] // 32,)
    size = int(offsets.max()) + s.itemsize  # the storage bytes up to the last scale
    storage = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(s.ctypes.data))
    if layout in ("row", "col", "col_tma"):
        got = storage.view(np.float32)[offsets // 4]
        np.testing.assert_array_equal(got, s_row)
    else:  # one exponent byte a scale
        expected = np.asarray(s_row).view(np.int32) >> 23
        np.testing.assert_array_equal(storage[offsets], expected)
    with pytest.raises(ValueError, match="layout: expected one of"):
        fgq.scale_offsets(shape, 32, "diagonal")


def test_the_notebook_imports_no_private_module():
    import json
    import pathlib

    notebook = pathlib.Path(__file__).parents[1] / "examples" / "quickstart.ipynb"
    cells = json.loads(notebook.read_text())["cells"]
    code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "fp8_group_quant._" not in code and "from fp8_group_quant import _" not in code


# packed words of one word a row ([M, 1], strides (1, M)), batched, of several words, an
# MN-major [M, 2], and one word (M = 1: quantize's [1, 1] has strides (1, 4), the rows padded to
# four): every stride pattern torch's byte view must see through
@pytest.mark.parametrize("shape, strides", [((8, 1), (1, 8)), ((2, 8, 1), (8, 1, 8)),
                                            ((5, 2), (1, 5)), ((4, 3), (3, 1)),
                                            ((1, 1), (1, 4)), ((1, 1), (4, 4)),
                                            ((3, 1, 1), (1, 1, 4))])  # fmt: skip
def test_torch_exponent_bytes_of_any_strides(shape, strides):
    torch = pytest.importorskip("torch")
    from fp8_group_quant._dequantize import torch_exponent_bytes

    storage = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    words = np.random.default_rng(len(shape) + strides[-1]).integers(
        -(2**31), 2**31, storage, dtype=np.int64
    ).astype(np.int32)  # fmt: skip
    packed = torch.from_numpy(words).as_strided(shape, strides)
    expected = np.ascontiguousarray(packed.numpy()).view(np.uint8)
    expected = expected.reshape(*shape[:-1], 4 * shape[-1])
    for groups in range(4 * shape[-1] + 1):
        got = torch_exponent_bytes(packed, groups)
        np.testing.assert_array_equal(got.numpy(), expected[..., :groups])


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(8, 256), (3, 8, 512), (1, 384)], ids=str)
def test_packed_scales_of_one_word_a_row_straight_from_quantize(shape):
    """K <= 512: the packed scales are [..., M, 1] with strides (..., 1, M), as quantize gives
    them (not a copy): unpack_scales and dequantize read them on torch's GPU path."""
    torch = pytest.importorskip("torch")
    x = activations(np.random.default_rng(shape[-1]), shape, "bfloat16")
    q, s = fgq.quantize(to_device(x, "torch"), 128, scale="ue8m0", layout="packed")
    q_ref, s_ref = fgq.quantize(x, 128, scale="ue8m0", layout="packed")
    assert tuple(s.shape) == tuple(s_ref.shape) and s.shape[-1] == 1
    groups = shape[-1] // 128
    expected = fgq.unpack_scales(s_ref, groups)
    np.testing.assert_array_equal(fgq.unpack_scales(s, groups).cpu().numpy(), expected)
    np.testing.assert_array_equal(
        to_host(fgq.dequantize(q, s, group_size=128)), fgq.dequantize(q_ref, s_ref, group_size=128)
    )
    assert isinstance(q, torch.Tensor)
