"""The plan cache's key covers everything that decides a plan: a call that differs from a cached
plan's in any one of them is planned anew, never served the stale plan.

The key (``api.quantize``'s fast path, ``_run.device_plan``, ``PreparedQuantize``, and the tile
calls' ``_device.tile_plan``: ``quantize_weight`` and orientation "col" / "both") is x's library,
dtype, shape, strides, device and 16-byte alignment (``_arrays.device_signature``), the options
as given (a weight's block, format, scale, layout, eps, rule and arithmetic), the layout of the
call's other arrays, and the tuning table in force (which holds PDL). Nothing else decides a
plan: the stream is read at each call, and the other pointers (out, scale_out, masked_m, the
norm's weight and residual) are checked at each call.

On the CPU the planner's GPU steps are stood in for (``fake_gpu``, tests/fake_gpu.py): CuPy
arrays over invented addresses (CuPy builds them without a device), a ``_plan.prepare`` (and
the tile kernels' ``prepare_weight`` / ``prepare_columns``) that records each plan and returns
launches that record each call. Everything else is the library's
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


@pytest.mark.parametrize("function", ["quantize", "quantize_packed"])  # each its own shortcut
@pytest.mark.parametrize(  # equal to the cached options' values, but refused by validation
    "option, value", [("group_size", 128.0), ("pad_rows", 1), ("eps", True)]
)
def test_an_option_of_another_type_is_validated_not_served(fake_gpu, function, option, value):
    call = getattr(fgq, function)
    x = fake()
    call(x, 128, eps=1.0, pad_rows=False)  # 1.0 == True, 128.0 == 128, 1 == True
    call(x, 128, eps=1.0, pad_rows=True)
    options = {**dict(group_size=128, eps=1.0, pad_rows=True), option: value}
    with pytest.raises(TypeError, match=option):
        call(x, **options)
    assert len(fake_gpu.plans) == 2


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


def _no_fallback(*args, **kwargs):
    raise AssertionError("quantize_packed's repeated call fell back to quantize")


@pytest.mark.parametrize("options", [{}, dict(group_size=64), dict(eps=2.0**-20),
                                     dict(pad_rows=True)])  # fmt: skip
def test_quantize_packed_and_quantize_share_one_plan(fake_gpu, monkeypatch, options):
    # quantize_packed's shortcut to the plan cache builds the key quantize builds and stores a
    # new plan under, for each of its options: each call finds the other's plan, both ways
    from fp8_group_quant import api

    same = dict(options, dtype="e4m3", scale="ue8m0", layout="packed")
    x, y = fake(), fake(offset=16)
    fgq.quantize(x, **same)  # the plan made by quantize ...
    with monkeypatch.context() as patch:
        patch.setattr(api, "quantize", _no_fallback)
        fgq.quantize_packed(y, **options)  # ... serves quantize_packed without quantize
    assert len(fake_gpu.plans) == 1 and fake_gpu.launches[-1][1] == y.data.ptr
    z = fake((8, K))
    fgq.quantize_packed(z, **options)  # the plan made through quantize_packed's fallback ...
    fgq.quantize(z, **same)  # ... serves quantize
    assert len(fake_gpu.plans) == 2 and fake_gpu.launches[-1][1] == z.data.ptr


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
@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_no_stale_tile_plan_on_the_gpu(lib):
    # the tile paths' plans (orientation "both" and "col", quantize_weight) planned, then served
    # from the cache to a fresh array of the same layout, on inputs differing in one field
    # each; every output against the NumPy backend
    rng = np.random.default_rng(47)
    host = activations(rng, (256, 512), "bfloat16")
    half = host.astype(np.float16)
    both = dict(group_size=128, layout="col", orientation="both")
    quantize, weight = fgq.quantize, fgq.quantize_weight
    cases = [  # (function, input on the host, a maker of it on the device, options)
        (quantize, host, lambda: to_device(host, lib), both),
        (quantize, host[:200], lambda: to_device(host[:200], lib), both),  # a partial tile
        (quantize, host, lambda: wider_rows(host, 64, lib, 0), both),  # strides
        (quantize, host, lambda: wider_rows(host, 8, lib, 4), both),  # strides and alignment
        (quantize, half, lambda: to_device(half, lib), both),  # dtype
        (quantize, host, lambda: to_device(host, lib), dict(both, scale="ue8m0")),  # an option
        (quantize, host, lambda: to_device(host, lib), dict(both, orientation="col")),
        (weight, host, lambda: to_device(host, lib), {}),
        (weight, host[:200], lambda: to_device(host[:200], lib), {}),
        (weight, host, lambda: wider_rows(host, 8, lib, 4), {}),
        (weight, host, lambda: to_device(host, lib), dict(scale="ue8m0", layout="bytes")),
    ]
    for when in ("planned", "cached"):
        for number, (function, values, make, options) in enumerate(cases):
            expected = tuple(np.ascontiguousarray(np.asarray(a)).view(np.uint8)
                             for a in function(values, **options))  # fmt: skip
            got = tuple(to_host_bytes(a).view(np.uint8) for a in function(make(), **options))
            assert len(got) == len(expected), f"case {number}, {when}"
            for i, (g, e) in enumerate(zip(got, expected)):
                assert np.array_equal(g.reshape(-1), e.reshape(-1)), f"case {number} {when} {i}"


@pytest.mark.gpu
@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("shape, options", [((5, 1024), {}), ((64, 7168), dict(pad_rows=True)),
                                            ((3, 7, 512), dict(group_size=64))])  # fmt: skip
def test_quantize_packeds_repeated_call_takes_the_cached_plan(lib, shape, options, monkeypatch):
    # the shortcut alone on the second call (a fall back to quantize fails), on fresh data
    # each time, every byte against the NumPy backend
    from fp8_group_quant import api

    rng = np.random.default_rng(48)
    for call in range(2):
        host = activations(rng, shape, "bfloat16")
        q_ref, s_ref = fgq.quantize_packed(host, **options)
        expected = (np.asarray(q_ref).view(np.uint8), np.ascontiguousarray(s_ref))
        if call:
            monkeypatch.setattr(api, "quantize", _no_fallback)
        assert_allocated(fgq.quantize_packed(to_device(host, lib), **options), expected, lib)


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


# the tile kernels' plans (quantize_weight, orientation "col" / "both") -------------------------


@pytest.fixture
def tile_builds(fake_gpu, monkeypatch):
    """The tile launches built, each recorded as (kind, request, device, tuning), and each of
    their launches as (kind, x, q, scales, stream, extra)."""
    from fp8_group_quant import _plan

    built, launched = [], []

    class Launch:
        def __init__(self, kind):
            self.kind = kind

        def launch(self, x_ptr, q_ptr, s_ptr, stream, extra=()):
            launched.append((self.kind, x_ptr, q_ptr, s_ptr, stream, dict(extra)))

    def recorder(kind):
        def prepare(request, *args):
            built.append((kind, request, args[-2], args[-1]))
            return Launch(kind)

        return prepare

    monkeypatch.setattr(_plan, "prepare_weight", recorder("weight"))
    monkeypatch.setattr(_plan, "prepare_columns", recorder("columns"))
    return built, launched


TILE_CALLS = {
    "both": lambda x, **o: fgq.quantize(x, 128, layout="col", orientation="both", **o),
    "col": lambda x, **o: fgq.quantize(x, 128, layout="col", orientation="col", **o),
    "both ue8m0": lambda x, **o: fgq.quantize(
        x, 128, layout="col", orientation="both", scale="ue8m0", **o
    ),  # fmt: skip
    "weight": lambda x, **o: fgq.quantize_weight(x, **o),
    "weight ue8m0": lambda x, **o: fgq.quantize_weight(x, scale="ue8m0", **o),
    # tiles of 256: a plan of 128 must never serve them, nor theirs a call of 128
    "col 256": lambda x, **o: fgq.quantize(x, 256, layout="col", orientation="col", **o),
    "weight 256": lambda x, **o: fgq.quantize_weight(x, (256, 256), **o),
}


@pytest.mark.parametrize("name", list(TILE_CALLS))
def test_an_equal_tile_call_reuses_its_plan_and_any_difference_makes_one(
    tile_builds, monkeypatch, name
):
    from fp8_group_quant import _run

    built, launched = tile_builds
    call = TILE_CALLS[name]
    slow = []  # calls that missed the entry point's cache lookup
    for function in ("quantize", "quantize_weight"):
        original = getattr(_run, function)
        counted = lambda *a, f=original, **k: slow.append(1) or f(*a, **k)  # noqa: E731
        monkeypatch.setattr(_run, function, counted)
    arrays = [fake((256, 512), "bfloat16"), fake((384, 512), "bfloat16"),
              fake((256, 512), "float16"), fake((256, 512), "bfloat16", row=640),
              fake((256, 512), "bfloat16", offset=8),
              fake((256, 512), "bfloat16", device=1)]  # fmt: skip
    for x in arrays:
        before = len(built)
        call(x)
        again = fake(tuple(x.shape), x.dtype.name, row=x.strides[0] // x.itemsize,
                     offset=x.data.ptr % 256, device=x.data.device_id)  # fmt: skip
        missed = len(slow)
        call(again)  # the same layout elsewhere: the plan made for x, launched on `again`
        assert len(built) == before + 1, "an equal call made another plan"
        assert len(slow) == missed, "an equal call missed the entry point's lookup"
        assert launched[-1][1] == again.data.ptr and launched[-2][1] == x.data.ptr
        request = built[-1][1]
        shape = request.output.shape if name.startswith("weight") else request.input_shape
        row_stride = request.row_stride if name.startswith("weight") else request.x_row_stride
        assert shape == tuple(x.shape) and request.input_dtype == x.dtype.name
        assert row_stride == x.strides[0] // x.itemsize
        assert request.x_aligned == (x.data.ptr % 16 == 0) and built[-1][2] == x.data.device_id
    with _tuning.override(pdl=False):
        call(arrays[0])
    assert len(built) == len(arrays) + 1 and built[-1][3].pdl is False  # the tuning is keyed


def test_tile_plans_of_other_options_are_their_own(tile_builds):
    built, _ = tile_builds
    x = fake((256, 512), "bfloat16")
    for call in TILE_CALLS.values():
        call(x)
        call(x)
    requests = [request for _, request, _, _ in built]
    assert len(requests) == len(TILE_CALLS) and len(set(requests)) == len(TILE_CALLS)
    fgq.quantize_weight(x, eps=2.0**-20)
    fgq.quantize_weight(x, layout="bytes", scale="ue8m0")
    assert len(built) == len(TILE_CALLS) + 2


@pytest.mark.parametrize(  # equal to a cached call's values, but refused by validation
    "options, error", [(dict(block=(128.0, 128)), TypeError), (dict(eps=True), TypeError)]
)
def test_a_weight_option_of_another_type_is_validated_not_served(tile_builds, options, error):
    x = fake((256, 512), "bfloat16")
    fgq.quantize_weight(x, eps=1.0)
    with pytest.raises(error, match=next(iter(options))):
        fgq.quantize_weight(x, **{"eps": 1.0, **options})


def test_a_tile_plan_reads_the_stream_and_checks_given_outputs_at_each_call(fake_gpu, tile_builds):
    built, launched = tile_builds
    x = fake((256, 512), "bfloat16")
    for stream in (0, 0x1111, 0x2222):
        fake_gpu.stream = stream
        qt, st = fgq.quantize(x, 128, layout="col", orientation="col")
        assert launched[-1][4] == stream
        assert launched[-1][5] == {"qt": qt.data.ptr, "scales_t": st.data.ptr}
    given = fake((512, 256), "uint8")  # qt's shape: [K, M]
    qt, _ = fgq.quantize(x, 128, layout="col", orientation="col", out=given)
    assert qt is given and launched[-1][5]["qt"] == given.data.ptr
    with pytest.raises(ValueError, match="out"):  # [M, K] is not qt's shape
        fgq.quantize(x, 128, layout="col", orientation="col", out=fake((256, 512), "uint8"))
    with pytest.raises(ValueError, match="overlaps"):  # qt over x's own memory
        overlapping = cupy.ndarray((512, 256), "uint8", x.data)
        fgq.quantize(x, 128, layout="col", orientation="col", out=overlapping)
    assert len(built) == 1 and len(launched) == 4  # one plan; nothing launched when refused
    q, s = fgq.quantize_weight(x)
    w_launch = launched[-1]
    assert w_launch[0] == "weight" and w_launch[2:4] == (q.data.ptr, s.data.ptr)
