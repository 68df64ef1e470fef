"""Bad input raises a clear exception naming the argument, and writes nothing (SPEC 6), on the
NumPy backend and the GPU."""

import ml_dtypes
import numpy as np
import pytest
from backends import (
    allocation_of_exactly,
    array_module,
    backends,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    to_device,
    to_host,
    to_host_bytes,
)
from helpers import activations

import fp8_group_quant as fgq

BF16 = ml_dtypes.bfloat16


@pytest.fixture
def x():
    return activations(np.random.default_rng(0), (4, 512), "bfloat16")


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"group_size": 16}, ValueError, "group_size"),
        ({"group_size": 512}, ValueError, "group_size"),
        ({"group_size": 100}, ValueError, "group_size"),
        ({"group_size": True}, TypeError, "group_size"),
        ({"group_size": 128.0}, TypeError, "group_size"),
        ({"dtype": "e3m4"}, ValueError, "dtype"),
        ({"scale": "bf16"}, ValueError, "scale"),
        ({"layout": "tma"}, ValueError, "layout"),
        ({"layout": "packed"}, ValueError, "scale='ue8m0'"),
        ({"layout": "packed_row", "scale": "float32"}, ValueError, "scale='ue8m0'"),
        ({"eps": 0.0}, ValueError, "eps"),
        ({"eps": -1e-10}, ValueError, "eps"),
        ({"eps": float("nan")}, ValueError, "eps"),
        ({"eps": float("inf")}, ValueError, "eps"),
        ({"eps": 1e-45}, ValueError, "eps"),  # subnormal in float32
        ({"eps": 1e-39}, ValueError, "eps"),  # subnormal in float32
        ({"eps": 1e39}, ValueError, "eps"),  # overflows float32
        ({"eps": "1e-10"}, TypeError, "eps"),
        ({"pad_rows": 1}, TypeError, "pad_rows"),
    ],
)  # every option's rejection, with the edge values of each rule
def test_bad_options(x, kwargs, error, words):
    with pytest.raises(error, match=words):
        fgq.quantize(x, **kwargs)


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: np.zeros((4, 512), np.float64), TypeError, "x: expected one of bfloat16"),
        (lambda: np.zeros((4, 512), np.int32), TypeError, "x: expected one of bfloat16"),
        (lambda: np.zeros((4, 500), BF16), ValueError, "K=500"),
        (lambda: np.zeros((4, 1024), BF16)[:, ::2], ValueError, "contiguous"),
        (lambda: np.zeros((2, 4, 512), BF16).transpose(1, 0, 2)[None], ValueError, "collapse"),
        (lambda: np.array(1.0, BF16), ValueError, "at least one dimension"),
        (lambda: [[1.0] * 128], TypeError, "x: expected a numpy array"),
    ],
)  # dtype, K, non-contiguous K, non-collapsible rows, scalar, non-array
def test_bad_input(make, error, words):
    with pytest.raises(error, match=words):
        fgq.quantize(make())


def test_transposed_rows_are_rejected_not_misread():
    x = np.zeros((3, 2, 256), BF16).transpose(1, 0, 2)  # batch 2 of rows with stride 512
    q, s = fgq.quantize(x)  # three dims: batch stride 256 and rows stride 512 are fine
    assert q.shape == (2, 3, 256)
    with pytest.raises(ValueError, match="collapse"):
        fgq.quantize(np.zeros((2, 3, 2, 256), BF16).transpose(0, 2, 1, 3))


def poisoned(shape, dtype, strides=None):
    array = np.full(shape, 0x7F, np.uint8).view(dtype) if np.dtype(dtype).itemsize == 1 else None
    if array is None:
        array = np.full(shape, 0x7F7F7F7F, np.int32).view(dtype)
    return array


@pytest.mark.parametrize(
    "out, scale_out, words",
    [
        (lambda: poisoned((4, 256), np.uint8), None, "out: expected shape"),
        (lambda: poisoned((4, 512), np.int8), None, "out: expected dtype"),
        (lambda: poisoned((512, 4), np.uint8).T, None, "out: expected strides"),
        (lambda: poisoned((4 * 512 + 1,), np.uint8)[1:].reshape(4, 512), None, "aligned"),
        (None, lambda: poisoned((4, 4), np.float32), "scale_out: expected dtype"),
        (None, lambda: poisoned((4, 2), np.int32), "scale_out: expected shape"),
        (None, lambda: poisoned((8, 1), np.int32)[::2], "scale_out: expected strides"),
        (None, lambda: poisoned((1, 4), np.int32).T[:3], "scale_out: expected shape"),
    ],
)  # shape, dtype, strides and alignment of either output
def test_bad_outputs_write_nothing(x, out, scale_out, words):
    q_good = poisoned((4, 512), np.uint8)
    s_good = poisoned((1, 4), np.int32).T
    q = out() if out else q_good
    s = scale_out() if scale_out else s_good
    before = (q.copy(), s.copy())
    with pytest.raises((ValueError, TypeError), match=words):
        fgq.quantize_packed(x, out=q, scale_out=s)
    np.testing.assert_array_equal(q.view(np.uint8), before[0].view(np.uint8))
    np.testing.assert_array_equal(s.view(np.uint8), before[1].view(np.uint8))
    assert (q_good.view(np.uint8) == 0x7F).all() and (s_good.view(np.uint32) == 0x7F7F7F7F).all()


def test_padded_scale_out_must_own_its_padding():
    x = activations(np.random.default_rng(1), (3, 512), "bfloat16")
    short = np.empty(3, np.int32).reshape(3, 1)  # the view's extent, without the padding row
    with pytest.raises(ValueError, match="scale_out: the layout owns 16 bytes"):
        fgq.quantize_packed(x, scale_out=short)


def test_valid_outputs_are_used_in_place(x):
    q = poisoned((4, 512), np.uint8)
    s = poisoned((1, 4), np.int32).T
    q2, s2 = fgq.quantize_packed(x, out=q, scale_out=s)
    assert q2 is q and s2 is s
    q_ref, s_ref = fgq.quantize_packed(x)
    np.testing.assert_array_equal(q, np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)


def test_mixed_libraries_are_rejected(x):
    with pytest.raises(TypeError, match="out: expected a numpy array"):
        fgq.quantize(x, out=[0] * 2048)


def test_dequantize_checks():
    q = np.zeros((2, 256), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="scales: expected shape"):
        fgq.dequantize(q, np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="scales: expected a number of groups a row that divides"):
        fgq.dequantize(q, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="scales: expected float32"):
        fgq.dequantize(q, np.zeros((2, 2), np.float64))
    with pytest.raises(TypeError, match="q: expected codes of float8_e4m3fn"):
        fgq.dequantize(np.zeros((2, 256), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="groups"):
        fgq.unpack_scales(np.zeros((2, 1), np.int32), 5)


# issue 11: the defects an adversarial run found, one regression test each ------------------------


def test_read_only_output_is_refused_before_anything_is_written(x):  # item 1
    q = poisoned((4, 512), np.uint8)
    s = poisoned((1, 4), np.int32).T
    s.flags.writeable = False
    with pytest.raises(ValueError, match="scale_out: the array is read-only"):
        fgq.quantize_packed(x, out=q, scale_out=s)
    assert (q == 0x7F).all() and (s.view(np.uint32) == 0x7F7F7F7F).all()
    q.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        fgq.quantize_packed(x, out=q)


@pytest.mark.parametrize(
    "shape, layout, q_shape, s_shape",
    [
        ((3, 0, 5, 128), "row", (3, 0, 5, 128), (3, 0, 5, 1)),
        ((0, 0, 256), "col_tma", (0, 0, 256), (0, 0, 2)),
        ((4, 0), "packed", (4, 0), (4, 0)),
        ((0, 256), "packed", (0, 256), (0, 1)),
    ],
)  # strides of an empty array carry no meaning; any empty output of the right shape will do
def test_empty_outputs_of_the_right_shape_are_accepted(shape, layout, q_shape, s_shape):
    x = np.empty(shape, BF16)
    scale = "ue8m0" if layout == "packed" else "float32"
    s_dtype = np.int32 if layout == "packed" else np.float32
    out, scale_out = np.empty(q_shape, ml_dtypes.float8_e4m3fn), np.empty(s_shape, s_dtype)
    q, s = fgq.quantize(x, 128, scale=scale, layout=layout, out=out, scale_out=scale_out)
    assert q is out and s is scale_out
    with pytest.raises(ValueError, match="scale_out: expected shape"):
        fgq.quantize(x, 128, scale=scale, layout=layout, scale_out=np.empty((7,), s_dtype))


@pytest.mark.parametrize("backend", backends("numpy", "cupy"))  # the NumPy backend and the GPU
def test_storage_check_sees_through_as_strided_views(backend):  # items 3 and 4
    # scale_out is held to the memory under it, through as_strided and slicing: a view whose
    # allocation holds the layout's padded storage is written in full, one a float short is
    # refused before anything is written (cupy's pool rounds blocks up to 512 bytes: the short
    # view is the tail of a block of exactly 512)
    xp = array_module(backend)
    x_host = activations(np.random.default_rng(3), (7, 512), "bfloat16")
    x = to_device(x_host, backend)
    expected = fgq.quantize(x_host, 128, layout="col_tma")[1]
    storage = xp.full(8 * 4, np.nan, xp.float32)  # tma = 8 rows, 4 groups
    view = xp.lib.stride_tricks.as_strided(storage, (7, 4), (4, 32))
    q, s = fgq.quantize(x, 128, layout="col_tma", scale_out=view)
    assert s is view
    np.testing.assert_array_equal(to_host(view), expected)
    assert (to_host(storage).reshape(4, 8)[:, 7] == 0).all()  # the padding row, written as zeros
    # a view whose padding row would fall on the caller's other data (float 31 of a larger
    # buffer, past the view's own extent of 31 floats) is refused: nothing is written
    room = xp.full(40, np.nan, xp.float32)
    view = room[:32].reshape(4, 8).T[:7]  # col_tma: 4 groups x tma = 8 rows, 7 real
    with pytest.raises(ValueError, match="scale_out: .* the view covers 124 and its buffer"):
        fgq.quantize(x, 128, layout="col_tma", scale_out=view)
    assert np.isnan(to_host(room)).all()
    short = allocation_of_exactly(31, np.float32, backend)  # a float short of the storage
    short.fill(np.nan)
    view = xp.lib.stride_tricks.as_strided(short, (7, 4), (4, 32))
    with pytest.raises(ValueError, match="scale_out: the layout owns 128 bytes .* holds 124"):
        fgq.quantize(x, 128, layout="col_tma", scale_out=view)
    assert np.isnan(to_host(short)).all()


def test_options_given_as_arrays_are_named(x):  # item 5
    for kwargs in ({"scale": np.array(["ue8m0"])}, {"dtype": np.array(["e4m3"])},
                   {"layout": np.array(["row"])}, {"eps": np.array([1e-10])},
                   {"pad_rows": np.array([True])}):  # fmt: skip
        name = next(iter(kwargs))
        with pytest.raises((TypeError, ValueError), match=f"^{name}: "):
            fgq.quantize(x, **kwargs)
    with pytest.raises(TypeError, match="^group_size: "):
        fgq.quantize(x, np.array([128]))


class _CudaArrayInterface:
    """A foreign CUDA array as some libraries export bfloat16: a void typestr."""

    def __init__(self, typestr):
        self.__cuda_array_interface__ = {
            "shape": (2, 128), "typestr": typestr, "data": (0, False), "version": 3,
        }  # fmt: skip


# typestrs with no numeric type: void of two and of zero bytes, complex, a dtype's name
@pytest.mark.parametrize("typestr", ["<V2", "|V0", "<c8", "bfloat16"])
def test_cuda_array_interface_without_a_numeric_type_is_named(typestr):  # item 5
    with pytest.raises(TypeError, match=r"x: its __cuda_array_interface__ typestr"):
        fgq.quantize(_CudaArrayInterface(typestr))


# q over x's second half or its middle, the scales over x's last row or across its end, the
# scales inside q (x and each output disjoint from the other)
OVERLAPS = ["out", "out inside x", "scale_out", "scale_out across x's end", "both"]


@pytest.mark.parametrize("backend", backends("numpy", "cupy"))  # the NumPy backend and the GPU
@pytest.mark.parametrize("which", OVERLAPS)  # OVERLAPS says why
def test_outputs_overlapping_the_input_or_each_other_are_refused(which, backend):  # item 6
    xp = array_module(backend)
    memory = xp.zeros(4 * 512 * 2 + 4096, xp.uint8)
    x = memory[: 4 * 512 * 2].view(BF16).reshape(4, 512)
    x[...] = to_device(activations(np.random.default_rng(6), (4, 512), "bfloat16"), backend)
    before = to_host(memory).copy()
    spare_q = to_device(poisoned((4, 512), np.uint8), backend)
    spare_s = to_device(poisoned((1, 4), np.int32), backend).T
    if which == "out":  # q over the second half of x
        out, scale_out, words = memory[2048:4096].reshape(4, 512), spare_s, "out: .* overlaps x"
    elif which == "out inside x":  # q over the middle of x, the scales allocated
        out, scale_out, words = memory[1024:3072].reshape(4, 512), None, "out: .* overlaps x"
    elif which == "scale_out":  # scales over x's last row
        view = memory[4096 - 64 : 4096].view(xp.int32)
        out, scale_out, words = spare_q, view.reshape(1, 16)[:, :4].T, "scale_out: .* overlaps x"
    elif which == "scale_out across x's end":  # half in x, half past it; q allocated
        view = memory[4096 - 8 : 4096 + 8].view(xp.int32)
        out, scale_out, words = None, view.reshape(1, 4).T, "scale_out: .* overlaps x"
    else:  # the scales inside q
        tail = memory[4096:]
        out = tail[:2048].reshape(4, 512)
        scale_out = tail[1024:1040].view(xp.int32).reshape(1, 4).T
        words = "scale_out: .* overlaps out"
    with pytest.raises(ValueError, match=words):
        fgq.quantize_packed(x, out=out, scale_out=scale_out)
    np.testing.assert_array_equal(to_host(memory), before)
    fgq.quantize_packed(x)  # the plan the refused call made (GPU) still serves a valid call
    assert (to_host(memory) == before).all()
    # disjoint neighbours are fine: q right after x
    q, _ = fgq.quantize_packed(x, out=memory[4096 : 4096 + 2048].reshape(4, 512))
    np.testing.assert_array_equal(to_host_bytes(q), to_host_bytes(fgq.quantize_packed(x)[0]))


# issue 12: dequantize refuses what it would misread ----------------------------------------------


def test_dequantize_refuses_packed_scales_of_another_group_size():
    x = activations(np.random.default_rng(12), (4, 512), "bfloat16")
    for group_size, wrong in ((64, 128), (32, 128), (128, 256), (32, 64)):
        q, s = fgq.quantize(x, group_size, scale="ue8m0", layout="packed")
        with pytest.raises(ValueError, match="scales: .*group_size"):
            fgq.dequantize(q, s, group_size=wrong)
        got = fgq.dequantize(q, s, group_size=group_size)
        values = np.asarray(q).astype(np.float32).reshape(4, -1, group_size)
        scales = fgq.unpack_scales(s, 512 // group_size)
        np.testing.assert_array_equal(got, (values * scales[..., None]).reshape(4, 512))


def test_dequantize_refuses_a_dtype_that_contradicts_the_codes():
    x = activations(np.random.default_rng(13), (2, 256), "bfloat16")
    q, s = fgq.quantize(x, 128)
    with pytest.raises(ValueError, match="dtype: 'e5m2' contradicts"):
        fgq.dequantize(q, s, dtype="e5m2")
    np.testing.assert_array_equal(fgq.dequantize(q, s, dtype="e4m3"), fgq.dequantize(q, s))
    codes = np.asarray(q).view(np.uint8)  # untyped codes: dtype says which format they are
    e5m2 = fgq.dequantize(codes, s, dtype="e5m2")
    assert not np.array_equal(e5m2, fgq.dequantize(q, s))


# no rows, an empty batch, no batches
@pytest.mark.parametrize("shape", [(0, 256), (2, 0, 256), (0, 3, 128)])
# packed words and float scales
@pytest.mark.parametrize("layout, scale", [("packed", "ue8m0"), ("col_tma", "float32")])
def test_dequantize_and_unpack_take_empty_outputs(shape, layout, scale):
    q, s = fgq.quantize(np.zeros(shape, BF16), 128, scale=scale, layout=layout)
    assert fgq.dequantize(q, s, 128).shape == shape
    if layout == "packed":
        assert fgq.unpack_scales(s, shape[-1] // 128).shape == shape[:-1] + (shape[-1] // 128,)


# a batch stride of 2**31 elements, and a negative row stride of that size
@pytest.mark.parametrize("strides", [(2**31, 1024, 1), (1024, -(2**31), 1)])
def test_silu_refuses_strides_its_kernel_cannot_index(strides):
    # the fused SiLU path's one-pass kernel indexes x in 32 bits (docs/perf.md), and
    # inputs of any size may take it (the persistent grid only those without padding rows):
    # wider or negative strides are refused by name before anything is launched
    pytest.importorskip("cupy", reason="the grid checks are made for device arrays")
    from helpers import make_request

    from fp8_group_quant._arrays import CUPY, ArrayInfo

    info = ArrayInfo(CUPY, None, 4096, (2, 4, 1024), strides, "bfloat16", 2, 0)
    with pytest.raises(ValueError, match=r"x: activation='silu_mul' takes row and batch strides"):
        make_request(info, 128, "e4m3", "ue8m0", "packed", 1e-10, False, activation="silu_mul")


# the GPU: arguments of another library or device are named, and nothing is written ---------------


@pytest.mark.gpu
def test_gpu_argument_checks_write_nothing():
    import torch

    x = torch.randn(8, 512, dtype=torch.bfloat16, device="cuda")
    q = torch.full((8 * 512 + 1,), 0x7F, dtype=torch.uint8, device="cuda")
    s = torch.full((8, 4), 0x7F7F7F7F, dtype=torch.int32, device="cuda").t().contiguous().t()
    with pytest.raises(ValueError, match="out: expected a 16-byte aligned"):
        fgq.quantize_packed(x, out=q[1:].view(8, 512), scale_out=s[:, :1])
    with pytest.raises(TypeError, match="out: expected a torch CPU tensor like x"):
        fgq.quantize_packed(x.cpu(), out=torch.empty(8, 512, dtype=torch.uint8, device="cuda"))
    with pytest.raises(TypeError, match="out: expected a CUDA tensor"):
        fgq.quantize_packed(x, out=torch.empty(8, 512, dtype=torch.float8_e4m3fn))
    with pytest.raises(TypeError, match="out: expected a torch array like x"):
        import cupy

        fgq.quantize_packed(x, out=cupy.empty((8, 512), cupy.uint8))
    torch.cuda.synchronize()
    assert (q == 0x7F).all() and (s == 0x7F7F7F7F).all()
