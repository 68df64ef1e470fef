"""Bad input raises a clear exception naming the argument, and writes nothing (SPEC 6)."""

import ml_dtypes
import numpy as np
import pytest
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
        fgq.dequantize(q, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="scales: expected float32"):
        fgq.dequantize(q, np.zeros((2, 2), np.float64))
    with pytest.raises(TypeError, match="q: expected codes of float8_e4m3fn"):
        fgq.dequantize(np.zeros((2, 256), np.float32), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="groups"):
        fgq.unpack_scales(np.zeros((2, 1), np.int32), 5)


def test_a_cached_plan_does_not_keep_its_first_input_alive():
    import gc
    import weakref

    pytest.importorskip("cupy", reason="plans are built for CuPy and torch arrays")
    from helpers import make_request

    from fp8_group_quant._arrays import CUPY, ArrayInfo
    from fp8_group_quant._device import DevicePlan
    from fp8_group_quant._tuning import Tuning

    class Input:  # stands in for a device array: plans never read it after they are built
        pass

    first = Input()
    info = ArrayInfo(CUPY, first, 4096, (0, 256), (256, 1), "bfloat16", 2, 0)  # nothing to launch
    request = make_request(info, 128, "e4m3", "ue8m0", "packed", 1e-10, False)
    plan = DevicePlan(info, request, Tuning())
    alive = weakref.ref(first)
    del first, info
    gc.collect()
    assert alive() is None and plan.x_info.obj is None and plan.device == 0


def test_the_plan_cache_is_bounded_and_keeps_its_newest():
    from fp8_group_quant._device import PlanCache

    cache = PlanCache(3)
    for i in range(5):
        cache.put(("key", i), f"plan {i}")
    assert len(cache) == 3
    assert cache.get(("key", 0)) is None and cache.get(("key", 4)) == "plan 4"
    assert cache.get(("key", [1])) is None  # an unhashable option is no key
    cache.put(("key", [1]), "never stored")
    assert len(cache) == 3


def test_the_plan_cache_is_safe_under_threads():
    import threading

    from fp8_group_quant._device import PlanCache

    cache = PlanCache(64)
    errors = []

    def work(start):
        try:
            for i in range(2000):
                cache.put((start, i), i)
                cache.get((start, i - 1))
        except Exception as error:  # pragma: no cover - the assertion below reports it
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(cache) == 64


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


def test_storage_check_sees_through_as_strided_views():  # item 3
    x = activations(np.random.default_rng(3), (7, 512), "bfloat16")
    expected = fgq.quantize(x, 128, layout="col_tma")[1]
    storage = np.full(8 * 4, np.nan, np.float32)  # tma = 8 rows, 4 groups
    view = np.lib.stride_tricks.as_strided(storage, (7, 4), (4, 32))
    q, s = fgq.quantize(x, 128, layout="col_tma", scale_out=view)
    assert s is view
    np.testing.assert_array_equal(view, expected)
    assert (storage.reshape(4, 8)[:, 7] == 0).all()  # the padding row, written as zeros
    short = np.full(31, np.nan, np.float32)  # one float short of the padded storage
    view = np.lib.stride_tricks.as_strided(short, (7, 4), (4, 32))
    with pytest.raises(ValueError, match="scale_out: the layout owns 128 bytes .* holds 124"):
        fgq.quantize(x, 128, layout="col_tma", scale_out=view)
    assert np.isnan(short).all()


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


@pytest.mark.parametrize("typestr", ["<V2", "|V0", "<c8", "bfloat16"])
def test_cuda_array_interface_without_a_numeric_type_is_named(typestr):  # item 5
    with pytest.raises(TypeError, match=r"x: its __cuda_array_interface__ typestr"):
        fgq.quantize(_CudaArrayInterface(typestr))


@pytest.mark.parametrize("which", ["out", "scale_out", "both"])
def test_outputs_overlapping_the_input_or_each_other_are_refused(which):  # item 6
    memory = np.zeros(4 * 512 * 2 + 4096, np.uint8)
    x = memory[: 4 * 512 * 2].view(BF16).reshape(4, 512)
    x[...] = activations(np.random.default_rng(6), (4, 512), "bfloat16")
    before = memory.copy()
    spare_q = poisoned((4, 512), np.uint8)
    spare_s = poisoned((1, 4), np.int32).T
    if which == "out":  # q over the second half of x
        out, scale_out, words = memory[2048:4096].reshape(4, 512), spare_s, "out: .* overlaps x"
    elif which == "scale_out":  # scales over x's last row
        view = memory[4096 - 64 : 4096].view(np.int32)
        out, scale_out, words = spare_q, view.reshape(1, 16)[:, :4].T, "scale_out: .* overlaps x"
    else:  # the scales inside q
        tail = memory[4096:]
        out = tail[:2048].reshape(4, 512)
        scale_out = tail[1024:1040].view(np.int32).reshape(1, 4).T
        words = "scale_out: .* overlaps out"
    with pytest.raises(ValueError, match=words):
        fgq.quantize_packed(x, out=out, scale_out=scale_out)
    np.testing.assert_array_equal(memory, before)
    # disjoint neighbours are fine: q right after x
    q, _ = fgq.quantize_packed(x, out=memory[4096 : 4096 + 2048].reshape(4, 512))
    np.testing.assert_array_equal(q.view(np.uint8), fgq.quantize_packed(x)[0].view(np.uint8))


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


@pytest.mark.parametrize("shape", [(0, 256), (2, 0, 256), (0, 3, 128)])
@pytest.mark.parametrize("layout, scale", [("packed", "ue8m0"), ("col_tma", "float32")])
def test_dequantize_and_unpack_take_empty_outputs(shape, layout, scale):
    q, s = fgq.quantize(np.zeros(shape, BF16), 128, scale=scale, layout=layout)
    assert fgq.dequantize(q, s).shape == shape
    if layout == "packed":
        assert fgq.unpack_scales(s, shape[-1] // 128).shape == shape[:-1] + (shape[-1] // 128,)


def test_unpack_scales_decodes_every_exponent_as_ue8m0():
    # all 256 exponent bytes, in packed words of every width, against 2**(e - 127) (255: NaN)
    exponents = np.arange(256, dtype=np.uint8)
    for groups in (256, 255, 253):
        words = np.zeros(64, np.uint32)
        words.view(np.uint8)[:groups] = exponents[:groups]
        got = fgq.unpack_scales(words.view(np.int32).reshape(1, 64), groups)[0]
        expected = np.ldexp(np.float64(1.0), exponents[:groups].astype(int) - 127)
        assert got.dtype == np.float32 and np.isnan(got[255:]).all()
        np.testing.assert_array_equal(got[:255], expected[:255].astype(np.float32))
    # MN-major strides, as the packed layout has them
    words = np.arange(12, dtype=np.int32).reshape(3, 4).T  # strides (1, 4) elements
    got = fgq.unpack_scales(words, 10)
    assert got.shape == (4, 10)
    np.testing.assert_array_equal(got[:, 0], np.ldexp(1.0, np.arange(4) - 127).astype(np.float32))


@pytest.mark.parametrize("strides", [(2**31, 1024, 1), (1024, -(2**31), 1)])
def test_silu_refuses_strides_its_kernel_cannot_index(strides):
    # the fused SiLU path's one-pass kernel indexes x in 32 bits (docs/perf.md step 22), and
    # inputs of any size may take it (the persistent grid only those without padding rows):
    # wider or negative strides are refused by name before anything is launched
    pytest.importorskip("cupy", reason="the grid checks are made for device arrays")
    from helpers import make_request

    from fp8_group_quant._arrays import CUPY, ArrayInfo

    info = ArrayInfo(CUPY, None, 4096, (2, 4, 1024), strides, "bfloat16", 2, 0)
    with pytest.raises(ValueError, match=r"x: activation='silu_mul' takes row and batch strides"):
        make_request(info, 128, "e4m3", "ue8m0", "packed", 1e-10, False, activation="silu_mul")
