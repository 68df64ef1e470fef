"""Scale layouts and padding (SPEC 4) through the NumPy backend, unpack_scales and dequantize on
the NumPy backend and the GPU, and the launch grid that walks the layouts."""

import contextlib
import types

import numpy as np
import pytest
from backends import (
    NUMPY_AND_GPU,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    to_device,
    to_host,
)
from helpers import ISSUE_SHAPES, NP_INPUT, activations

import fp8_group_quant as fgq
from fp8_group_quant import _arrays, _request, reference
from fp8_group_quant._arrays import TORCH, describe, device_allocator, strided_extent
from fp8_group_quant._layout import Geometry
from fp8_group_quant._outputs import specs, transposed_specs
from fp8_group_quant._tuning import Tuning


@pytest.mark.parametrize("shape", ISSUE_SHAPES)  # helpers.ISSUE_SHAPES says why
def test_packed_layout_and_padding(shape):
    m, k = shape
    ng, kp, tma = k // 128, -(-k // 512), -(-m // 4) * 4
    x = activations(np.random.default_rng(m * k), shape, "bfloat16", specials=True)
    q, s = fgq.quantize_packed(x)
    assert s.shape == (m, kp) and s.dtype == np.int32
    assert s.strides == (4, 4 * tma)

    # SPEC 4: group g of row m is byte g % 4 of the word at storage index (g // 4) * tma + m
    geometry = Geometry(shape, 128, "packed", False)
    storage = np.full(geometry.scale_storage, 0x7F7F7F7F, np.int32)  # poisoned
    q_storage = np.full(geometry.q_storage, 0xFF, np.uint8)
    reference.quantize_into(x, geometry, "e4m3", "ue8m0", 1e-10, q_storage, storage)
    assert storage.size == tma * kp
    data = storage.view(np.uint8)
    _, _, exponents = reference.quantize_groups(
        x.astype(np.float32).reshape(m, ng, 128), "e4m3", "ue8m0", 1e-10
    )
    written = np.zeros(data.size, bool)
    for row in range(m):
        for g in range(ng):
            index = 4 * ((g // 4) * tma + row) + g % 4
            assert data[index] == exponents[row, g]
            written[index] = True
    assert not data[~written].any(), "padding bytes must be zero"
    assert 0x7F not in data[~written]
    np.testing.assert_array_equal(s, storage.reshape(kp, tma).T[:m])  # the public view
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8).reshape(-1), q_storage)


LAYOUT_STRIDES = {  # (M=3, K=640, G=128): ng = 5, kp = 2, tma = 4
    "row": ((3, 5), (5, 1), 15),
    "col": ((3, 5), (1, 3), 15),
    "col_tma": ((3, 5), (1, 4), 20),
    "packed": ((3, 2), (1, 4), 8),
    "packed_row": ((3, 2), (2, 1), 6),
}


# every layout in LAYOUT_STRIDES' table
@pytest.mark.parametrize("layout", list(LAYOUT_STRIDES))
def test_layout_shapes_strides_and_storage(layout):
    shape, strides, storage = LAYOUT_STRIDES[layout]
    geometry = Geometry((3, 640), 128, layout, False)
    assert geometry.scale_shape == shape
    assert geometry.scale_strides == strides
    assert geometry.scale_storage == storage
    scale = "ue8m0" if layout.startswith("packed") else "float32"
    x = activations(np.random.default_rng(5), (3, 640), "float16")
    _, s = fgq.quantize(x, scale=scale, layout=layout)
    assert s.shape == shape
    assert tuple(st // 4 for st in s.strides) == strides


# every layout of plain input but blocked (test_blocked.py has it)
@pytest.mark.parametrize("layout", ["row", "col", "col_tma", "packed", "packed_row"])
def test_batched_input_has_per_batch_padding(layout):
    # [B, M, K] with M = 3: each batch has its own tma = 4 rows, as grouped GEMMs read them
    scale = "ue8m0" if layout.startswith("packed") else "float32"
    x = activations(np.random.default_rng(9), (2, 3, 640), "bfloat16", specials=True)
    qb, sb = fgq.quantize(x, scale=scale, layout=layout)
    geometry = Geometry((2, 3, 640), 128, layout, False)
    assert tuple(st // 4 for st in sb.strides) == geometry.scale_strides
    expected_batch = {"row": 15, "col": 15, "col_tma": 20, "packed": 8, "packed_row": 6}[layout]
    assert sb.strides[0] // 4 == expected_batch
    for b in range(2):
        q1, s1 = fgq.quantize(x[b], scale=scale, layout=layout)
        np.testing.assert_array_equal(
            np.asarray(qb[b]).view(np.uint8), np.asarray(q1).view(np.uint8)
        )
        np.testing.assert_array_equal(sb[b], s1)


def test_more_leading_dimensions_flatten_into_rows():
    x = activations(np.random.default_rng(3), (2, 3, 5, 256), "float32")
    q, s = fgq.quantize(x, layout="col_tma")
    q2, s2 = fgq.quantize(x.reshape(2, 15, 256), layout="col_tma")
    assert s.shape == (2, 3, 5, 2)
    np.testing.assert_array_equal(np.asarray(s).reshape(2, 15, 2), s2)
    np.testing.assert_array_equal(
        np.asarray(q).view(np.uint8).reshape(2, 15, 256), np.asarray(q2).view(np.uint8)
    )


def test_pad_rows_backs_q_with_zero_rows():
    x = activations(np.random.default_rng(4), (5, 256), "bfloat16")
    q, _ = fgq.quantize_packed(x, pad_rows=True)
    assert q.shape == (5, 256) and q.strides == (256, 1)
    storage = np.lib.stride_tricks.as_strided(q.view(np.uint8), (8, 256), (256, 1))
    assert not storage[5:].any()
    q_plain, _ = fgq.quantize_packed(x)
    np.testing.assert_array_equal(storage[:5], np.asarray(q_plain).view(np.uint8))


def test_strided_rows_equal_contiguous_rows():
    wide = activations(np.random.default_rng(6), (7, 1024), "bfloat16")
    view = wide[:, 256:768]
    q1, s1 = fgq.quantize(view, layout="col")
    q2, s2 = fgq.quantize(np.ascontiguousarray(view), layout="col")
    np.testing.assert_array_equal(np.asarray(q1).view(np.uint8), np.asarray(q2).view(np.uint8))
    np.testing.assert_array_equal(s1, s2)


# every layout of plain input but blocked (test_blocked.py has it)
@pytest.mark.parametrize("layout", ["row", "col", "col_tma", "packed", "packed_row"])
def test_dequantize_and_unpack_round_trip(layout):
    scale = "ue8m0" if layout.startswith("packed") else "float32"
    x = activations(np.random.default_rng(7), (9, 1024), "float32")
    q, s = fgq.quantize(x, scale=scale, layout=layout)
    if layout.startswith("packed"):
        floats = fgq.unpack_scales(s, 8)
        _, expected = fgq.quantize(x, scale="ue8m0", layout="row")
        np.testing.assert_array_equal(floats, expected)
    xr = fgq.dequantize(q, s, 128)
    error = np.abs(xr - x) / np.maximum(np.abs(x).reshape(9, 8, 128).max(-1).repeat(128, -1), 1e-30)
    assert error.max() <= 2.0**-3  # e4m3 keeps 3 mantissa bits: half-ulp is 1/16, relative to amax
    assert np.median(np.abs(xr - x) / np.abs(x)) < 0.05


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)  # the NumPy backend, and the GPU from both
def test_unpack_scales_decodes_every_exponent_as_ue8m0(backend):
    # all 256 exponent bytes, in packed words of every width, against 2**(e - 127) (255: NaN)
    exponents = np.arange(256, dtype=np.uint8)
    for groups in (256, 255, 253):
        words = np.zeros(64, np.uint32)
        words.view(np.uint8)[:groups] = exponents[:groups]
        words = to_device(words.view(np.int32).reshape(1, 64), backend)
        got = to_host(fgq.unpack_scales(words, groups))[0]
        expected = np.ldexp(np.float64(1.0), exponents[:groups].astype(int) - 127)
        assert got.dtype == np.float32 and np.isnan(got[255:]).all()
        np.testing.assert_array_equal(got[:255], expected[:255].astype(np.float32))
    # MN-major strides, as the packed layout has them
    words = np.arange(12, dtype=np.int32).reshape(3, 4).T  # strides (1, 4) elements
    got = to_host(fgq.unpack_scales(to_device(np.ascontiguousarray(words.T), backend).T, 10))
    assert got.shape == (4, 10)
    np.testing.assert_array_equal(got[:, 0], np.ldexp(1.0, np.arange(4) - 127).astype(np.float32))
    # all 256 exponent bytes in MN-major packed words (the packed layout's strides), against the
    # NumPy backend's decoding (ml_dtypes' float8_e8m0fnu)
    words = np.zeros((3, 64), np.uint32)
    words.view(np.uint8)[...] = np.arange(256 * 3, dtype=np.uint32).reshape(3, 256) % 256
    words = words.view(np.int32)
    device = to_device(np.ascontiguousarray(words.T), backend).T  # strides (1, 3)
    for groups in (256, 253):
        host = to_host(fgq.unpack_scales(device, groups))
        expected = fgq.unpack_scales(words, groups)  # numpy: ml_dtypes' float8_e8m0fnu
        assert host.shape == (3, groups) and host.dtype == np.float32
        np.testing.assert_array_equal(host, expected)
        assert np.isnan(host[:, 255:]).all() and (host[:, :255] > 0).all()


@pytest.mark.gpu
def test_dequantize_and_unpack_on_device_match_host():
    import cupy
    import torch

    data = activations(np.random.default_rng(6), (33, 1024), "bfloat16")
    q_ref, s_ref = fgq.quantize_packed(data)
    x_ref = fgq.dequantize(q_ref, s_ref, 128)
    for lib in ("cupy", "torch"):
        q, s = fgq.quantize_packed(to_device(data, lib))
        x_back = fgq.dequantize(q, s, 128, dtype="e4m3")  # cupy: uint8 codes
        host = cupy.asnumpy(x_back) if lib == "cupy" else x_back.cpu().numpy()
        np.testing.assert_array_equal(host, x_ref)
        floats = fgq.unpack_scales(s, 8)
        host = cupy.asnumpy(floats) if lib == "cupy" else floats.cpu().numpy()
        np.testing.assert_array_equal(host, fgq.unpack_scales(s_ref, 8))
    view = fgq.as_float8(cupy.asarray(np.asarray(q_ref).view(np.uint8)))
    assert view.dtype == torch.float8_e4m3fn


# the launch grid (kernel-side layout of work) ---------------------------------------------------


# every layout (tiles differ by layout) x every lane count a group can have (G * itemsize / 32)
@pytest.mark.parametrize("layout", ["row", "col", "col_tma", "packed", "packed_row"])
@pytest.mark.parametrize("lanes", [2, 4, 8, 16, 32])
def test_block_shape_covers_every_group_with_whole_warps(layout, lanes):
    from fp8_group_quant import _plan

    rows = _plan.tile_rows(layout, lanes)
    assert rows & (rows - 1) == 0 and 1 <= rows <= _plan.MAX_TILE_ROWS
    assert lanes * rows <= _plan.WARP  # a warp never spans two group columns' rows
    if layout in ("col", "col_tma"):
        assert rows * 4 >= min(32, _plan.WARP // lanes * 4)  # a warp's scales are one run
    for groups in [1, 2, 3, 5, 7, 21, 56, 64, 100, 224, 1000, 4097]:
        threads, blocks = _plan.block_shape(groups, lanes, rows)
        per_block = threads // (lanes * rows)
        assert threads <= _plan.max_threads_per_block() and threads % _plan.WARP == 0
        assert per_block * blocks >= groups  # every group has a slot
        assert per_block * (blocks - 1) < groups  # and no block is empty


def test_grid_limit_names_k_for_huge_rows():
    from fp8_group_quant import _plan

    assert _plan.grid_limits_error(Geometry((4, 128 * 2**20), 128, "row", False), 2) is None
    too_wide = Geometry((4, 32 * 2**24), 32, "col", False)
    assert "K=" in _plan.grid_limits_error(too_wide, 2)
    assert "rows" in _plan.grid_limits_error(Geometry((2**31, 128), 128, "row", False), 2)


# small and odd divisors, powers of two and their neighbours, a Fermat factor, 2**31 - 1
@pytest.mark.parametrize(
    "d", [1, 2, 3, 7, 21, 56, 100, 127, 128, 129, 641, 6700417, 2**16 + 1, 2**30 + 3, 2**31 - 1]
)
def test_the_kernels_multiplicative_division_is_exact(d):
    # the kernel's divide_u31: (n * magic) >> shift in 64 bits, for every n below 2**31
    from fp8_group_quant._plan import divisor

    magic, shift = divisor(d)
    assert 0 < magic < 2**32 and shift < 64
    assert 0 <= magic * d - 2**shift < 2 ** (shift - 31)  # the exactness condition (theorem 4.2)
    rng = np.random.default_rng(d)
    q = np.unique(np.concatenate([np.arange(0, 300), (2**31 - 1) // d - np.arange(300),
                                  rng.integers(0, (2**31 - 1) // d + 1, 3000)]))  # fmt: skip
    q = q[(q >= 0) & (q * d < 2**31)]
    n = np.concatenate([q * d, q * d - 1, q * d + d - 1, [2**31 - 1]])
    n = np.unique(n[(n >= 0) & (n < 2**31)]).astype(object)
    assert all((v * magic) >> shift == v // d for v in n)


def test_the_division_refuses_divisors_it_cannot_serve():
    from fp8_group_quant._plan import divisor

    for d in (0, -1, 2**31):
        with pytest.raises(ValueError, match="divisor"):
            divisor(d)


# whole warps up to 256 and the default; what is refused: no warp, too many, negative
@pytest.mark.parametrize("threads, ok", [(None, True), (64, True), (256, True), (96, True),
                                         (32, True), (48, False), (512, False), (-32, False),
                                         (16, False), (0, False)])  # fmt: skip
def test_the_one_pass_block_size_is_checked(threads, ok):
    from fp8_group_quant import _plan
    from fp8_group_quant._tuning import Tuning

    if ok:
        tuning = Tuning() if threads is None else Tuning(one_pass_threads=threads)
        assert _plan.one_pass_threads(tuning) == (threads or 128)
    else:
        with pytest.raises(ValueError, match="one_pass_threads"):
            Tuning(one_pass_threads=threads)


# the default (None) and blocks of one to eight warps
@pytest.mark.parametrize("threads", [None, 32, 64, 96, 256])
# 8, 2 and 32 lanes a group
@pytest.mark.parametrize("group_size, input_dtype", [(128, "bfloat16"), (32, "bfloat16"),
                                                     (256, "float32")])  # fmt: skip
def test_the_one_pass_block_slots_follow_the_block_launched(
    monkeypatch, threads, group_size, input_dtype
):
    # the one-pass kernel numbers its slots by Params.block_slots, not blockDim.x (docs/perf.md):
    # whatever the block size knob says, they agree
    from helpers import make_request

    from fp8_group_quant import _jit, _plan
    from fp8_group_quant._arrays import describe

    tuning = Tuning() if threads is None else Tuning(one_pass_threads=threads)
    monkeypatch.setattr(_jit, "get_function", lambda source, expression, device: _FakeFunction)
    monkeypatch.setattr(_jit, "current_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(_plan, "resident_blocks", lambda *args: (6, 132))
    monkeypatch.setattr(_plan, "pdl_supported", lambda device, enabled=True: False)
    monkeypatch.setattr(
        _plan, "Launch", lambda handle, grid, block, params, pdl: (handle, grid, block, params)
    )
    x = np.empty((37, 2048), NP_INPUT[input_dtype])
    request = make_request(describe(x, "x"), group_size, "e4m3", "ue8m0", "row", 1e-10, False)
    _, grid, block, params = _plan.prepare(request, 0, tuning)[-1]
    lanes = request.kernel_key().lanes_per_group
    assert grid[1] == 1 and params.block_slots * lanes == block[0] == (threads or 128)
    assert grid[0] * params.block_slots >= params.slots > (grid[0] - 1) * params.block_slots


class _FakeFunction:
    class kernel:  # noqa: N801 - mimics RawKernel.kernel.ptr
        ptr = 0x1234


@pytest.mark.parametrize(
    "shape, layout, max_waves, one_pass, grid, per_sm",
    [
        ((64, 7168), "packed", 16, True, (224, 1, 1), 6),  # decode: 3584 slots of 8 lanes
        ((2, 3, 7168), "col_tma", 16, True, (28, 1, 1), 6),  # tiles of 4 rows (3 real), 2 batches
        ((70000, 1, 256), "row", 16, True, (8750, 1, 1), 6),  # 140000 slots, batches flat
        ((70000, 1, 256), "row", 1, False, (6336, 1, 1), 6),  # 8750 blocks > 1 wave: the loop
        ((16384, 7168), "packed", 16, False, (3168, 2, 1), 6),  # 57344 blocks > 16 waves
        # no limit given: by occupancy. 12 blocks of 128 threads (lean) take one pass at any size;
        # 10 (a 48-register kernel) switch to the loop past 16 waves of 1320 blocks
        ((16384, 7168), "packed", None, True, (57344, 1, 1), 12),
        ((16384, 7168), "packed", None, False, (5280, 2, 1), 10),
        ((2048, 7168), "packed", None, True, (7168, 1, 1), 10),
        # x's strides in and outside the one-pass kernel's 32 bits
        (("reversed", 64, 7168), "packed", 16, True, (224, 1, 1), 6),  # negative: one pass
        (("wide batches", 2, 64, 256), "packed", 16, False, (128, 1, 1), 6),
    ],
)  # each branch of the path and grid choice, with a device of 132 SMs fitting 6 blocks each
def test_the_launch_picks_its_path_and_grid(
    monkeypatch, shape, layout, max_waves, one_pass, grid, per_sm
):
    import ml_dtypes
    from helpers import make_request

    from fp8_group_quant import _jit, _plan
    from fp8_group_quant._arrays import describe

    loaded = []

    def get_function(source, expression, device):
        loaded.append(expression)
        return _FakeFunction

    monkeypatch.setattr(_jit, "get_function", get_function)
    monkeypatch.setattr(_jit, "current_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(_plan, "resident_blocks", lambda *args: (per_sm, 132))
    tuning = Tuning(one_pass_max_waves=max_waves)
    monkeypatch.setattr(_plan, "pdl_supported", lambda device, enabled=True: False)
    if shape[0] == "reversed":  # a negative row stride
        x = np.empty(shape[1:], ml_dtypes.bfloat16)[::-1]
    elif shape[0] == "wide batches":  # batches 2**31 elements apart (never read here)
        b, m, k = shape[1:]
        x = np.lib.stride_tricks.as_strided(
            np.empty((m, k), ml_dtypes.bfloat16), (b, m, k), (2**32, 2 * k, 2)
        )
    else:
        x = np.empty(shape, ml_dtypes.bfloat16)
    request = make_request(describe(x, "x"), 128, "e4m3", "ue8m0", layout, 1e-10, False)
    monkeypatch.setattr(  # no driver here: record the launch, do not make it
        _plan, "Launch", lambda handle, grid, block, params, pdl: (handle, grid, block, params)
    )
    handle, got_grid, block, params = _plan.prepare(request, 0, tuning)[-1]
    assert f"{'true' if one_pass else 'false'}, fgq::kIdentity" in loaded[-1]
    # contiguous rows take the one-pass kernel whose load is linear in the slot
    tile = _plan.tile_rows(layout, request.kernel_key().lanes_per_group)
    flat = one_pass and _plan.flat_slots(request, tile)
    assert loaded[-1].endswith(", fgq::kIdentity, 0, true>" if flat else ", fgq::kIdentity>")
    contiguous = ((64, 7168), (70000, 1, 256), (16384, 7168), (2048, 7168))
    assert flat == (one_pass and shape in contiguous)
    assert got_grid == grid and handle == 0x1234 and block[0] % 32 == 0
    assert params.rows == request.output.rows and params.batches == request.output.batches
    if one_pass:  # the flat grid covers every slot, with less than one block to spare
        lanes = request.kernel_key().lanes_per_group
        threads = params.slots * lanes
        assert got_grid[0] * block[0] >= threads > (got_grid[0] - 1) * block[0]
        assert params.block_slots * lanes == block[0]  # the kernel reads no blockDim.x


@pytest.mark.parametrize(
    "shape, layout, persistent",
    [
        ((4096, 7168), "packed", True),  # 14336 one-pass blocks, past 8 waves of 1320
        ((2048, 7168), "packed", False),  # 7168: one pass
        ((3017, 7168), "row", False),  # 10560 blocks: 8 waves exactly
        ((3018, 7168), "row", True),  # 10563: past them
        ((3020, 7168), "packed", True),  # 10570, no padded scale rows
        ((512, 7168), "packed", False),  # 1792 blocks: one pass, under the persistent threshold
        ((368, 7168), "packed", False),  # 1288 blocks: one wave
        ((128, 7168), "packed", False),  # 448 blocks: a third of one
        ((472, 7168), "packed", False),  # 1652 blocks: past 1.25 waves
        ((510, 7168), "packed", False),  # padded scale rows
        ((4097, 7168), "packed", False),  # padded scale rows, which that kernel does not write
        ((4097, 7168), "row", True),  # no padding rows in this layout
        ((1025, 8, 7168), "row", False),  # more batches than its scan holds
        ((16, 1024, 7168), "packed", True),  # batches, none padded
    ],
)  # a device of 132 SMs fitting 10 blocks of either kernel
def test_large_fused_silu_inputs_take_the_persistent_grid(monkeypatch, shape, layout, persistent):

    launched, grid, block, params = prepare_silu_mul(monkeypatch, shape, layout)
    assert launched.startswith("fgq::quantize_masked<" if persistent else "fgq::quantize_groups<")
    assert launched.endswith(("fgq::kSiluMul>", "fgq::kSiluMul, 6>")) and not params.masked_m
    if persistent:  # one resident wave of 128-thread blocks walking every slot
        assert grid == (10 * 132, 1, 1) and block == (128, 1, 1)
    else:  # the one-pass blocks copy the SiLU table with every thread past half a wave
        assert grid[0] * block[0] >= params.slots * 8
        assert params.table_by_threads == (grid[0] > Tuning().silu_table_waves * 10 * 132)
        assert params.table_by_threads == (grid[0] > 660)  # the default, half a wave


@pytest.mark.parametrize("input_dtype", ["float16", "float32"])
@pytest.mark.parametrize("shape, layout", [((4096, 7168), "packed"), ((3018, 7168), "row"),
                                           ((16, 1024, 7168), "packed")])  # fmt: skip
def test_large_fused_inputs_of_other_gates_keep_the_one_pass_grid(
    monkeypatch, shape, layout, input_dtype
):
    # shapes whose bfloat16 gates take the persistent grid (above): float16 and float32 gates
    # keep one pass, which was 3-19% faster for them (docs/perf.md)
    assert prepare_silu_mul(monkeypatch, shape, layout)[0].startswith("fgq::quantize_masked<")
    launched, _, _, params = prepare_silu_mul(monkeypatch, shape, layout, input_dtype=input_dtype)
    assert launched.startswith("fgq::quantize_groups<") and not params.masked_m


def prepare_silu_mul(
    monkeypatch, shape, layout, scale="ue8m0", input_dtype="bfloat16", tuning=None
):
    """(the instantiation launched, grid, block, Params) of a plain SiLU-and-multiply call on
    ``shape`` (N last), prepared for a device of 132 SMs fitting 10 blocks of every kernel."""
    from helpers import make_request

    from fp8_group_quant import _jit, _plan
    from fp8_group_quant._arrays import describe

    loaded = []

    def get_function(source, expression, device):  # a handle that names the instantiation
        loaded.append(expression)
        return types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=len(loaded) - 1))

    monkeypatch.setattr(_jit, "get_function", get_function)
    monkeypatch.setattr(_jit, "current_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(_plan, "resident_blocks", lambda *args: (10, 132))
    monkeypatch.setattr(_plan, "pdl_supported", lambda device, enabled=True: False)
    monkeypatch.setattr(
        _plan, "Launch", lambda handle, grid, block, params, pdl: (handle, grid, block, params)
    )
    x = np.empty((*shape[:-1], 2 * shape[-1]), NP_INPUT[input_dtype])
    request = make_request(
        describe(x, "x"), 128, "e4m3", scale, layout, 1e-10, False, activation="silu_mul"
    )
    handle, grid, block, params = _plan.prepare(request, 0, tuning or Tuning())[-1]
    return loaded[handle], grid, block, params


@pytest.mark.parametrize(
    "shape, layout, scale, input_dtype, six",
    [
        ((512, 7168), "packed", "ue8m0", "bfloat16", False),  # 1792 blocks: 1.36 waves
        ((829, 7168), "packed", "ue8m0", "bfloat16", False),  # 2902 blocks: 2.2 waves
        ((830, 7168), "packed", "ue8m0", "bfloat16", True),  # 2905: past them
        ((2048, 7168), "packed", "ue8m0", "bfloat16", True),
        ((3017, 7168), "row", "ue8m0", "bfloat16", True),  # 8 waves: still one pass
        ((2048, 7168), "col_tma", "ue8m0", "bfloat16", True),
        ((2048, 7168), "blocked", "ue8m0", "bfloat16", False),  # it spills at 40 registers
        ((2048, 7168), "row", "float32", "bfloat16", False),  # 47 registers: no such kernel
        ((2048, 7168), "packed", "ue8m0", "float16", False),  # SiLU by arithmetic
        ((4096, 7168), "packed", "ue8m0", "bfloat16", False),  # the persistent grid
    ],
)
def test_large_one_pass_silu_grids_take_the_six_block_kernel(
    monkeypatch, shape, layout, scale, input_dtype, six
):
    # one-pass bfloat16 SiLU grids of more than SILU_SIX_BLOCKS_WAVES resident waves of the
    # five-block kernel (here 2.2 x 1320 = 2904 blocks) take its six-block instantiation

    launched, grid, _, params = prepare_silu_mul(monkeypatch, shape, layout, scale, input_dtype)
    assert launched.endswith(", fgq::kSiluMul, 6>" if six else ", fgq::kSiluMul>")
    assert grid[0] == -(-shape[0] * shape[1] // 128 // 16) or launched.startswith(
        "fgq::quantize_masked<"
    )
    every = Tuning(silu_six_blocks_waves=0.0)  # the table's entry at zero: every grid
    launched, *_ = prepare_silu_mul(monkeypatch, (1, 7168), layout, scale, input_dtype, every)
    has = layout != "blocked" and scale == "ue8m0" and input_dtype == "bfloat16"
    assert launched.endswith(", fgq::kSiluMul, 6>" if has else ", fgq::kSiluMul>")


def test_the_one_pass_prologue_reads_one_constant_line():
    # the fields the one-pass kernel reads before its load sit in Params' first 48 bytes, one
    # 64-byte line of the constant cache on sm_90 (docs/perf.md)
    import ctypes

    from fp8_group_quant import _plan

    params = _plan.params_type()
    prologue = ("x", "x_row_stride32", "x_batch_stride32", "slots", "tile_slots",
                "tile_slots_magic", "batch_tiles", "batch_tiles_magic", "rows", "tile_slots_shift",
                "batch_tiles_shift", "tile_rows_log2", "block_slots")  # fmt: skip
    for name in prologue:
        field = getattr(params, name)
        assert field.offset + field.size <= 48, name
    assert ctypes.sizeof(params) % 8 == 0


def _flat_slots(x, layout="packed", activation=None):
    from helpers import make_request

    from fp8_group_quant import _plan
    from fp8_group_quant._arrays import describe

    request = make_request(
        describe(x, "x"), 128, "e4m3", "ue8m0", layout, 1e-10, False, activation=activation
    )
    tile = _plan.tile_rows(request.output.layout, request.kernel_key().lanes_per_group)
    return _plan.flat_slots(request, tile)


def test_the_one_pass_load_is_linear_in_the_slot_only_for_contiguous_rows():
    # flat_slots: slot s's values at x + s * G, so the load waits for no division (docs/perf.md);
    # only where every slot's place over (batch, row, group) is that address, and the
    # rows are 16-byte aligned (the kernel's vector loads)
    import ml_dtypes

    def x(shape):
        return np.zeros(shape, ml_dtypes.bfloat16)

    assert _flat_slots(x((1, 7168))) is True
    assert _flat_slots(x((5, 3, 2048))) is True  # batches rows * K apart
    assert _flat_slots(x((70000, 1, 256)), "row") is True
    assert _flat_slots(x((3, 5, 2048))[:, :4]) is False  # batches 5 rows apart, 4 real
    assert _flat_slots(x((4, 2304))[:, :2048]) is False  # rows inside wider rows
    assert _flat_slots(x((4, 2304))[2:3, :2048]) is True  # one row: its stride unused
    assert _flat_slots(x((3, 1, 2304))[:, :, :2048]) is False  # batches of one such row
    assert _flat_slots(x((6, 2048))[::2]) is False  # every other row
    assert _flat_slots(x((6, 2048))[::-1]) is False  # rows in reverse
    assert _flat_slots(x((1, 2, 2048))[:, ::-1]) is False  # one batch, reversed rows
    assert _flat_slots(x((64, 2048)), "col_tma") is False  # tiles of 4 rows
    assert _flat_slots(x((4, 4096)), activation="silu_mul") is False  # gate, then up
    assert _flat_slots(x(4 * 2048 + 1)[1:].reshape(4, 2048)) is False  # 2 bytes past alignment


@pytest.mark.parametrize("rows, residual, knob, blocks", [
    (4096, False, None, 264),  # 15.5 rows a block: one wave of walking blocks
    (265, False, None, 264),  # past one wave: walking blocks
    (263, False, None, 263),  # within it: a block a row
    (4096, True, None, 4096),  # the residual, two lanes: a block a row
    (4096, True, 1.0, 264), (4096, False, 0.0, 4096), (100, False, 2.0, 100),  # the knob
    (1, False, None, 1), (0, False, None, 1),  # never an empty grid
])  # fmt: skip
def test_norm_grid_policy(monkeypatch, rows, residual, knob, blocks):
    from fp8_group_quant import _plan

    tuning = Tuning(norm_waves=knob)
    assert _plan.norm_blocks(rows, residual, 2, 132, 2, tuning) == blocks
    # one lane a thread with the residual (norm_lanes' window): a wave of walking blocks
    one_lane = _plan.norm_blocks(rows, residual, 2, 132, 1, tuning)
    walks = knob is None and residual and rows > 264
    assert one_lane == (264 if walks else blocks)


# every layout, M with and without the padding's multiple, batched (not blocked: 2-D only) and not
@pytest.mark.parametrize("layout, shape", [
    (layout, shape)
    for layout in ("row", "col", "col_tma", "packed", "packed_row", "blocked")
    for shape in ((1, 512), (4, 512), (6, 1024), (128, 512), (2, 5, 512))
    if layout != "blocked" or len(shape) == 2
])  # fmt: skip
def test_torch_allocation_owns_the_layouts_storage(monkeypatch, layout, shape):
    """The torch allocator takes empty_strided only where the view's extent is the storage the
    layout owns (the kernel writes padding past the view): every output of every layout gets
    at least its storage, with the spec's shape and strides (both orientations' outputs)."""
    torch = pytest.importorskip("torch")

    class CpuTorch:  # torch with "cuda" devices mapped to the CPU
        def __getattr__(self, name):
            return getattr(torch, name)

        def device(self, kind, index=None):
            return torch.device("cpu")

    monkeypatch.setattr(_arrays, "_torch", lambda: CpuTorch())
    scale = "ue8m0" if layout.startswith(("packed", "blocked")) else "float32"
    x = np.zeros(shape, np.float32)
    oriented = len(shape) == 2 and layout != "blocked"  # and the column-wise result's
    options = _request.check_options(128, "e4m3", scale, layout,
                                     orientation="both" if oriented else "row")  # fmt: skip
    request = _request.make_request(describe(x, "x"), options)
    for spec in specs(request) + (transposed_specs(request) if oriented else ()):
        extent = strided_extent(spec.shape, spec.strides)
        assert extent <= spec.storage  # the view lies inside its storage
        if spec.shape:  # against numpy's reading of the same strides
            span = np.lib.stride_tricks.as_strided(np.arange(spec.storage + 1), spec.shape,
                                                   [s * 8 for s in spec.strides])  # fmt: skip
            assert extent == (int(span.max()) + 1 if span.size else 0)
        made = device_allocator(TORCH, 0, *spec.allocation(TORCH))()
        assert tuple(made.shape) == tuple(spec.shape)
        assert made.untyped_storage().nbytes() >= spec.storage * made.element_size()
        if made.numel() > 1:
            assert _same_view_strides(made, spec)


def _same_view_strides(made, spec) -> bool:
    return all(n <= 1 or a == b for n, a, b in zip(spec.shape, made.stride(), spec.strides))
