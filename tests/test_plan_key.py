"""The plan cache's key covers everything that decides a plan: a call that differs from a cached
plan's in any one of them is planned anew, never served the stale plan.

The key (``api.quantize``'s fast path, ``_run.device_plan``, ``PreparedQuantize``) is x's
library, dtype, shape, strides, device and 16-byte alignment (``_arrays.device_signature``),
the options as given, the layout of the call's other arrays, and the tuning table in force
(which holds PDL). Nothing else decides a plan: the stream is read at each call, and the other
pointers (out, scale_out, masked_m, the norm's weight and residual) are checked at each call.

On the CPU the planner's GPU steps are stood in for (``fake_gpu``, tests/fake_gpu.py): CuPy
arrays over invented addresses (CuPy builds them without a device), a ``_plan.prepare`` that
records each plan and returns launches that record each call. Everything else is the library's
own code. The GPU tests
at the end run the real kernels on arrays differing in each field, torch and CuPy.
"""

import numpy as np
import pytest
from backends import (
    assert_allocated,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    to_device,
    to_host_bytes,
    wider_rows,
)
from fake_gpu import fake
from helpers import activations

import fp8_group_quant as fgq
from fp8_group_quant import _tuning

cupy = pytest.importorskip("cupy", reason="the key is read from CuPy and torch arrays")

K = 256
PACKED = dict(scale="ue8m0", layout="packed")


def planned_for(state, x, **options):
    """quantize(x) twice; the request of the one plan that served both calls, made now."""
    before = len(state.plans)
    for _ in range(2):  # the second call takes the cache
        fgq.quantize(x, **options)
    assert len(state.plans) == before + 1, "the call was served a plan made for another call"
    request, device, _ = state.plans[-1]
    launch, x_ptr, _, _ = state.launches[-1]
    assert launch.request is request and x_ptr == x.data.ptr  # the new plan launched, on x
    assert device == x.data.device_id
    return request


# x's description --------------------------------------------------------------------------------


def test_the_shape_is_in_the_key(fake_gpu):
    assert planned_for(fake_gpu, fake((4, K))).input_shape == (4, K)
    assert planned_for(fake_gpu, fake((8, K))).input_shape == (8, K)
    assert planned_for(fake_gpu, fake((4, 2 * K))).input_shape == (4, 2 * K)
    assert planned_for(fake_gpu, fake((2, 2, K))).input_shape == (2, 2, K)  # batches


def test_the_strides_are_in_the_key(fake_gpu):
    assert planned_for(fake_gpu, fake(row=K)).x_row_stride == K
    wide = planned_for(fake_gpu, fake(row=K + 64))  # the same shape, rows further apart
    assert wide.x_row_stride == K + 64 and wide.input_shape == (4, K)


def test_the_dtype_is_in_the_key(fake_gpu):
    assert planned_for(fake_gpu, fake(dtype="float16")).input_dtype == "float16"
    assert planned_for(fake_gpu, fake(dtype="float32")).input_dtype == "float32"


def test_the_alignment_of_x_is_in_the_key(fake_gpu):
    assert planned_for(fake_gpu, fake()).x_aligned
    assert not planned_for(fake_gpu, fake(offset=8)).x_aligned  # vector loads refused
    x = fake(offset=16)  # another aligned address: the aligned plan serves it
    fgq.quantize(x)
    assert len(fake_gpu.plans) == 2 and fake_gpu.launches[-1][1] == x.data.ptr


def test_the_device_is_in_the_key(fake_gpu):
    planned_for(fake_gpu, fake(device=0))
    planned_for(fake_gpu, fake(device=1))  # asserts the plan was made for device 1
    assert fake_gpu.device == 0  # the caller's device is current again


# the options, the tuning table, the other arrays ------------------------------------------------

# one change of each option from the baseline (float32 row scales, G = 128)
OPTION_CHANGES = {
    "group_size": dict(group_size=64),
    "dtype": dict(dtype="e5m2"),
    "scale": dict(scale="ue8m0"),
    "layout": dict(layout="col"),
    "eps": dict(eps=2.0**-20),  # exact in float32, as the options hold it
    "pad_rows": dict(pad_rows=True),
    "activation": dict(activation="silu_mul"),
    "scale_rule": dict(scale="ue8m0", scale_rule="floor"),
    "clamp_limit": dict(activation="silu_mul", clamp_limit=7.0),
}


@pytest.mark.parametrize("option", list(OPTION_CHANGES))
def test_each_option_is_in_the_key(fake_gpu, option):
    x = fake()
    baseline = planned_for(fake_gpu, x)
    changed = OPTION_CHANGES[option]
    if "clamp_limit" in changed:  # against the same activation without the clamp
        baseline = planned_for(fake_gpu, x, activation="silu_mul")
    request = planned_for(fake_gpu, x, **changed)
    assert request.options != baseline.options
    got = request.options
    read = {"dtype": got.fmt.name, "scale": got.scale.name, "layout": got.layout.name,
            "activation": got.mode.name}  # fmt: skip
    for name, value in changed.items():
        assert read.get(name, getattr(got, name, None)) == value, name


@pytest.mark.parametrize(  # equal to the cached options' values, but refused by validation
    "option, value", [("group_size", 128.0), ("pad_rows", 1), ("eps", True)]
)
def test_an_option_of_another_type_is_validated_not_served(fake_gpu, option, value):
    x = fake()
    fgq.quantize(x, 128, eps=1.0, pad_rows=False)  # 1.0 == True, 128.0 == 128, 1 == True
    fgq.quantize(x, 128, eps=1.0, pad_rows=True)
    options = {**dict(group_size=128, eps=1.0, pad_rows=True), option: value}
    with pytest.raises(TypeError, match=option):
        fgq.quantize(x, **options)


def test_the_tuning_table_is_in_the_key(fake_gpu):
    x = fake()
    assert planned_for(fake_gpu, x) is not None
    with _tuning.override(pdl=False):
        planned_for(fake_gpu, x)
        assert fake_gpu.plans[-1][2].pdl is False
    fgq.quantize(x)  # the first table's plan again
    assert len(fake_gpu.plans) == 2 and fake_gpu.launches[-1][0].tuning.pdl is _tuning.DEFAULT.pdl


def test_the_stream_is_read_at_each_call(fake_gpu):
    x = fake()
    for stream in (0, 0x1111, 0x2222):
        fake_gpu.stream = stream
        fgq.quantize(x, **PACKED)
        assert fake_gpu.launches[-1][2] == stream
    assert len(fake_gpu.plans) == 1


def test_the_layout_of_the_other_arrays_is_in_the_key(fake_gpu):
    x = fake((4, 8, K))  # the masked layout: 4 experts of 8 rows
    masked32, masked64 = fake((4,), "int32"), fake((4,), "int64")
    for counts, dtype in ((masked32, "int32"), (masked64, "int64"), (masked32, "int32")):
        fgq.quantize(x, masked_m=counts, **PACKED)
        launch, _, _, extra = fake_gpu.launches[-1]
        assert launch.request.masked == dtype and extra["masked_m"] == counts.data.ptr
    assert len(fake_gpu.plans) == 2  # int32, int64; the int32 plan served the third call
    weight, residual = fake((K,)), fake((4, K))
    fgq.quantize(fake(), norm=(weight, 1e-6))
    fgq.quantize(fake(), norm=(weight, 1e-6), residual=residual)
    without, with_residual = (plan[0] for plan in fake_gpu.plans[-2:])
    assert not without.residual and with_residual.residual and len(fake_gpu.plans) == 4


def test_a_prepared_call_refuses_every_other_description(fake_gpu):
    x = fake()
    prepared = fgq.prepare(x, **PACKED)
    others = [fake((8, K)), fake(row=K + 64), fake(dtype="float32"), fake(offset=8),
              fake(device=1)]  # fmt: skip
    for other in others:
        with pytest.raises(ValueError, match="x: this call was prepared"):
            prepared(other)
    moved = fake(offset=32)  # the same description at another aligned address
    prepared(moved)
    assert fake_gpu.launches[-1][1] == moved.data.ptr and len(fake_gpu.plans) == 1


# the GPU: the real kernels on arrays differing in each field -----------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("lib", ["cupy", "torch"])  # both GPU libraries
def test_no_stale_plan_on_the_gpu(lib):
    rng = np.random.default_rng(45)
    host = activations(rng, (8, 1024), "bfloat16")
    cases = [  # (input on the host, on the device, options): one field changed each time
        (host, to_device(host, lib), PACKED),
        (host[:4], to_device(host[:4], lib), PACKED),  # shape
        (host, wider_rows(host, 64, lib, 0), PACKED),  # strides
        (host, wider_rows(host, 8, lib, 4), PACKED),  # strides and 16-byte alignment
        (host.astype(np.float16), to_device(host.astype(np.float16), lib), PACKED),  # dtype
        (host, to_device(host, lib), dict(scale="ue8m0", layout="col")),  # an option
        (host, to_device(host, lib), dict(scale="ue8m0", layout="col", group_size=64)),
    ]
    for when in ("planned", "cached"):
        for number, (values, x, options) in enumerate(cases):
            q_ref, s_ref = fgq.quantize(values, **options)
            expected = (np.asarray(q_ref).view(np.uint8), np.ascontiguousarray(s_ref))
            assert_allocated(fgq.quantize(x, **options), expected, f"case {number}, {when}")


@pytest.mark.gpu
def test_torch_and_cupy_views_of_one_array_get_their_own_plans():
    import torch

    host = activations(np.random.default_rng(46), (16, 1024), "bfloat16")
    x = to_device(host, "cupy")
    xt = torch.from_dlpack(x)  # the same memory, shape, strides and dtype
    for _ in range(2):
        q, s = fgq.quantize_packed(x)
        qt, st = fgq.quantize_packed(xt)
        assert isinstance(q, cupy.ndarray) and isinstance(qt, torch.Tensor)
        assert isinstance(st, torch.Tensor) and st.stride() == tuple(v // 4 for v in s.strides)
        assert np.array_equal(to_host_bytes(qt), to_host_bytes(q))


# the description a key and every check reads ---------------------------------------------------


def test_descriptions_name_dtypes_as_numpy_does_and_remember_a_bounded_number(monkeypatch):
    import ml_dtypes

    from fp8_group_quant import _arrays

    monkeypatch.setattr(_arrays, "_dtype_names", {})  # the process's own memo left as it was

    for dtype in (np.float16, np.float32, ml_dtypes.bfloat16, np.int8, ">f4"):
        array = np.zeros((2, 8), dtype)
        assert _arrays.describe(array, "x").dtype == array.dtype.name
        assert _arrays.describe(fake((2, 8), dtype), "x").dtype == array.dtype.name
    for i in range(_arrays.MAX_DTYPE_NAMES + 8):  # more distinct dtypes than are remembered
        named = np.dtype([(f"f{i}", np.uint8)])
        assert _arrays.dtype_name(named) == named.name
    assert len(_arrays._dtype_names) <= _arrays.MAX_DTYPE_NAMES
    uneven = np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), (3,), (6,))
    with pytest.raises(ValueError, match="x: strides must be multiples of the item size"):
        _arrays.describe(uneven, "x")
    assert _arrays.describe(np.zeros((3, 4), np.float32)[:, ::2], "x").strides == (4, 2)
