"""The plain path (quantize of plain input) on the GPU and the NumPy backend, bit for bit against
the reference into poisoned outputs: every format and layout, shapes, strides and views, grid
edges, padding and empty input."""

import dataclasses

import numpy as np
import pytest
from backends import (
    COMBINATIONS,
    NUMPY_AND_GPU,
    check,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    plain_kernel_path,  # noqa: F401 - the fixture kernel_path
    poisoned_outputs,
    to_device,
    wider_rows,
)
from helpers import ISSUE_SHAPES, activations, assert_same_bytes

import fp8_group_quant as fgq
from fp8_group_quant import _jit, _plan, _tuning
from fp8_group_quant._layout import Geometry
from fp8_group_quant._spec import INPUT_TYPES

# every supported combination ----------------------------------------------------------------------


@pytest.mark.gpu
# every input type, group size and registered (format, scale, layout)
@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS)
def test_every_combination(input_dtype, group_size, dtype, scale, layout, kernel_path):
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("cupy", "torch")[index % 2]  # both libraries see every format and layout
    rng = np.random.default_rng(index)
    args = (lib, group_size, dtype, scale, layout)

    # odd group count (21 groups), NaN/Inf/zero groups, rows not a multiple of 4
    x = activations(rng, (5, 21 * group_size), input_dtype, specials=True)
    check(x, to_device(x, lib), *args)
    # one token; K = 7168
    x = activations(rng, (1, 7168), input_dtype, specials=True)
    check(x, to_device(x, lib), *args)
    # batched, rows strided inside a wider buffer (16-byte aligned), padded q rows
    x = activations(rng, (2, 3, 7168), input_dtype, specials=True)
    check(x, wider_rows(x, 256, lib, 128), *args, pad_rows=True)
    # base and rows not 16-byte aligned: the element-wise load path
    x = activations(rng, (7, 2 * group_size), input_dtype, specials=True)
    check(x, wider_rows(x, 3, lib, 1), *args)
    # many rows
    x = activations(rng, (301, 1024 if group_size < 256 else 2048), input_dtype)
    check(x, to_device(x, lib), *args)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["col", "col_tma", "row"])  # tiles of several rows, and one
@pytest.mark.parametrize(
    "input_dtype, group_size", [("bfloat16", 32), ("float32", 64), ("float16", 128)]
)  # tiles of 8, 4 and 4 rows (2, 8 and 8 lanes per group), and the row layout's single rows
def test_row_tiles_over_many_rows_and_batches(input_dtype, group_size, layout, kernel_path):
    # blocks of several rows (column layouts) walking more tiles than the grid holds, with tiles
    # that straddle batch boundaries and a partial last tile
    rng = np.random.default_rng(group_size)
    lanes = group_size * INPUT_TYPES[input_dtype].itemsize // _plan.lane_bytes()
    assert layout == "row" or _plan.tile_rows(layout, lanes) > 1
    for shape in [(4099, 1024), (3, 1501, 512)]:
        x = activations(rng, shape, input_dtype, specials=True)
        check(x, to_device(x, "cupy"), "cupy", group_size, "e4m3", "float32", layout)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)  # the NumPy backend, and the GPU from both
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])  # every input type
@pytest.mark.parametrize("scale", ["float32", "ue8m0"])  # subnormal float scales, and exponents
def test_tiny_eps_and_subnormal_groups(input_dtype, scale, backend):
    # eps = FLT_MIN makes subnormal scales: CuPy compiles with -ftz=true, the kernel must not flush
    tiny = float(np.finfo(np.float32).tiny)
    rng = np.random.default_rng(11)
    x = activations(rng, (4, 512), input_dtype, specials=True)
    small = {"bfloat16": 1e-38, "float16": 1e-7, "float32": 1e-41}[input_dtype]
    x[1] = (rng.standard_normal(512) * small).astype(x.dtype)
    check(x, to_device(x, backend), backend, 128, "e4m3", scale, "row", eps=tiny)


# the production path: the issue's shapes, large M, both libraries ---------------------------------

# the issue's list (single rows, odd rows, K % 512 != 0), then M > 65535 and a large M
SHAPES = [*ISSUE_SHAPES, (65537, 2048), (4096, 7168)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)  # SHAPES' comment says why
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16"])  # the 16-bit inputs of serving
@pytest.mark.parametrize("lib", ["cupy", "torch"])  # both GPU libraries
def test_quantize_packed_shapes(shape, input_dtype, lib):
    rng = np.random.default_rng(list(shape))
    x = activations(rng, shape, input_dtype, specials=True)
    xd = to_device(x, lib)
    for pad_rows in (False, True):
        check(x, xd, lib, 128, "e4m3", "ue8m0", "packed", pad_rows=pad_rows)
    q, s = fgq.quantize_packed(xd)
    geometry = Geometry(shape, 128, "packed", False)
    assert tuple(s.shape) == geometry.scale_shape
    if lib == "torch":
        import torch

        assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.int32
        assert s.stride() == geometry.scale_strides
    else:
        assert q.dtype == np.uint8 and s.dtype == np.int32
        assert tuple(st // 4 for st in s.strides) == geometry.scale_strides


@pytest.mark.gpu
def test_more_than_2_to_the_31_elements():
    import torch

    m, k = 2**31 // 7168 + 3, 7168
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    x[-1, -5] = 3e4  # an outlier in the very last group
    q, s = fgq.quantize_packed(x)
    torch.cuda.synchronize()
    for rows in (slice(0, 8), slice(m - 8, m)):
        part = x[rows].contiguous()
        q_ref, s_ref = fgq.quantize_packed(part)
        assert torch.equal(q[rows].view(torch.uint8), q_ref.view(torch.uint8))
        assert torch.equal(s[rows], s_ref)
    del x, q, s
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m, k", [(131072, 7168), (64, 16384), (1_048_576, 128), (1, 16384), (3, 128)]
)  # many rows, the widest K, a million one-group rows, one token
def test_extreme_sizes_sampled_rows_and_full_padding(m, k):
    import cupy

    rng = np.random.default_rng(m + k)
    x = cupy.random.default_rng(m).standard_normal((m, k), dtype=cupy.float32)
    x = x.astype(INPUT_TYPES["bfloat16"].numpy_dtype)
    rows = sorted({0, 1, m // 2, m - 2, m - 1, *rng.integers(0, m, 6).tolist()} & set(range(m)))
    x[rows[-1], -1] = 3.0e4  # an outlier in the last group of a sampled row
    geometry = Geometry((m, k), 128, "packed", True)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, "cupy", "e4m3")
    fgq.quantize_packed(x, out=q, scale_out=s, pad_rows=True)
    x_rows = x[rows].get()
    q_ref, s_ref = fgq.quantize_packed(x_rows)
    assert_same_bytes(q[rows].get().view(np.uint8), q_ref.view(np.uint8), f"q rows {rows}")
    assert_same_bytes(s[rows].get(), np.ascontiguousarray(s_ref), f"scales rows {rows}")
    # every padding byte, of q and of the scales, is zero
    tma = geometry.q_rows
    assert bool((q_buf.reshape(tma, k)[m:] == 0).all())
    s_words = s_buf.reshape(geometry.scale_columns, tma)
    assert bool((s_words[:, m:] == 0).all())
    assert not bool((s_words[:, :m] == 0x7F7F7F7F).any())  # every real word written


# grid edges: more batches than grid z holds, offsets that need 64 bits ----------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["row", "packed"])  # batches unpadded, and padded to 4 rows
def test_more_batches_than_grid_z_holds(layout, kernel_path):
    # 70000 batches of one row: the launch folds batches into grid x and the kernel divides;
    # packed pads each batch to four rows
    rng = np.random.default_rng(12)
    x = activations(rng, (70000, 1, 256), "bfloat16", specials=True)
    check(x, to_device(x, "cupy"), "cupy", 128, "e4m3", "ue8m0", layout)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["packed", "row"])  # tiles of one row, padded and not
@pytest.mark.parametrize("lib", ["cupy", "torch"])  # both GPU libraries (cupy: reversed rows)
def test_the_linear_slot_load_only_where_rows_are_contiguous(lib, layout, kernel_path):
    # the one-pass kernel loads slot s at x + s * G where rows are K apart and batches rows * K
    # (its kFlat instantiation, _plan.flat_slots; docs/perf.md); every other
    # arrangement of the same values reads through the strides, and each writes what NumPy does
    import cupy
    from helpers import make_request

    from fp8_group_quant._arrays import describe

    rng = np.random.default_rng(25)
    args = (lib, 128, "e4m3", "ue8m0", layout)
    x = activations(rng, (3, 5, 2048), "bfloat16", specials=True)
    cases = [
        (x, to_device(x, lib), 1),  # contiguous batches
        (x[:, :4], to_device(x, lib)[:, :4], 0),  # batches 5 rows apart, 4 real
        (x[1], wider_rows(x[1], 256, lib, 128), 0),  # rows inside wider rows
        (x[1, 2:3], wider_rows(x[1], 256, lib, 128)[2:3], 1),  # one row of a wider buffer
        (x[:, 1:2], to_device(x, lib)[:, 1:2], 0),  # batches of one row, 5 rows apart
    ]
    if lib == "cupy":  # rows in reverse (torch has no negative strides)
        cases.append((x[0, ::-1], to_device(x, lib)[0, ::-1], 0))
    ordinal = cupy.cuda.runtime.getDevice()
    for host, device, flat in cases:
        request = make_request(describe(device, "x"), *args[1:], 1e-10, False)
        key = request.kernel_key()
        assert _plan.flat_slots(request, _plan.tile_rows(layout, key.lanes_per_group)) == flat
        if kernel_path == "one pass":  # the launch takes that instantiation
            expression = dataclasses.replace(key, one_pass=True, flat=bool(flat)).name_expression
            function = _jit.get_function(_plan.SOURCE, expression, ordinal)
            (launch,) = _plan.prepare(request, ordinal, _tuning.active()[1])
            assert launch.handle == function.kernel.ptr, host.shape
        check(np.ascontiguousarray(host), device, *args)


@pytest.mark.gpu
def test_negative_row_strides_take_64_bit_offsets():
    import cupy
    from helpers import make_request

    from fp8_group_quant._arrays import describe

    rng = np.random.default_rng(13)
    x = activations(rng, (37, 1024), "float16", specials=True)
    reversed_rows = cupy.asarray(x)[::-1]
    request = make_request(
        describe(reversed_rows, "x"), 128, "e4m3", "ue8m0", "packed", 1e-10, False
    )
    assert request.x_row_stride < 0
    check(x[::-1].copy(), reversed_rows, "cupy", 128, "e4m3", "ue8m0", "packed")


# empty input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)  # the NumPy backend, and the GPU from both
@pytest.mark.parametrize("shape", [(4, 0), (0, 256), (2, 0, 128), (0,)])  # K = 0, M = 0, both
def test_empty_inputs_return_empty_outputs(backend, shape):  # issue 11, item 5
    x = to_device(np.empty(shape, INPUT_TYPES["bfloat16"].numpy_dtype), backend)
    for layout in ("packed", "col_tma", "row"):
        q, s = fgq.quantize(x, 128, scale="ue8m0", layout=layout)
        geometry = Geometry(tuple(shape), 128, layout, False)
        assert tuple(q.shape) == tuple(shape) and tuple(s.shape) == geometry.scale_shape


@pytest.mark.gpu
def test_empty_input_launches_nothing():
    import cupy
    import torch

    q, s = fgq.quantize_packed(torch.empty((0, 7168), dtype=torch.bfloat16, device="cuda"))
    assert tuple(q.shape) == (0, 7168) and tuple(s.shape) == (0, 14)
    q, s = fgq.quantize(cupy.empty((2, 0, 512), dtype=cupy.float16), layout="col_tma")
    assert q.shape == (2, 0, 512) and s.shape == (2, 0, 4)
