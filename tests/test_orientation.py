"""quantize(..., orientation="col" | "both") (docs/spec.md, section 4d): the column-wise result
of x transposed, groups of G tokens of one channel, against the scalar model into poisoned
outputs on the NumPy backend and the GPU; "both" equal to the row-wise and column-wise calls;
partial last token groups, layouts' shapes and strides, argument checks."""

import numpy as np
import pytest
from backends import (
    HOST_AND_GPU,
    NUMPY_AND_GPU,
    assert_allocated,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    gpu_only_past_one_input,
    poisoned_bytes,
    poisoned_spec,
    strided_view,
    to_device,
    to_host_bytes,
)
from helpers import NP_INPUT, Q_POISON, SCALE_POISON, activations, assert_same_bytes

import fp8_group_quant as fgq
from fp8_group_quant import spec_model
from fp8_group_quant._layout import Geometry
from fp8_group_quant._outputs import OutputSpec, specs, transposed_specs
from fp8_group_quant._request import make_request

INPUTS = ["bfloat16", "float16", "float32"]
# the layouts the column-wise result takes, with the scale kinds each holds
LAYOUT_SCALES = [("row", "float32"), ("col", "float32"), ("col_tma", "ue8m0"),
                 ("packed", "ue8m0"), ("packed_row", "ue8m0"), ("col", "ue8m0")]  # fmt: skip


def _specs(x, group_size, dtype, scale, layout, orientation):
    from fp8_group_quant._arrays import describe
    from fp8_group_quant._request import check_options

    options = check_options(group_size, dtype, scale, layout, orientation=orientation)
    request = make_request(describe(x, "x"), options)
    return specs(request), transposed_specs(request)


def model_columns(x, group_size, dtype, scale, layout, rule="rceil", eps=1e-10):
    """(qt bytes, scale storage bytes) of the column-wise result, from the scalar model and
    section 6's layout over K rows of ceil(M / G) groups."""
    codes, scales = spec_model.quantize_columns(x, group_size, dtype, scale, eps, rule)
    m, k = x.shape
    groups = -(-m // group_size)
    storage = spec_model.Storage((k, groups * group_size), group_size, layout, False)
    return codes, spec_model.expected_scale_bytes(scales, storage)


def model_rows(x, group_size, dtype, scale, layout, eps=1e-10):
    codes, scales = spec_model.quantize(x, group_size, dtype, scale, eps)
    storage = spec_model.Storage(tuple(x.shape), group_size, layout, False)
    return spec_model.expected_storage(codes, scales, storage)


def check_col(x, lib, group_size=128, dtype="e4m3", scale="float32", layout="col"):
    """orientation="col" into poisoned outputs: every byte against the model."""
    _, (qt_spec, st_spec) = _specs(x, group_size, dtype, scale, layout, "col")
    qt, qt_buf = poisoned_spec(qt_spec, lib, Q_POISON)
    st, st_buf = poisoned_spec(st_spec, lib, SCALE_POISON)
    x_device = to_device(x, lib)
    got = fgq.quantize(x_device, group_size, dtype=dtype, scale=scale, layout=layout,
                       orientation="col", out=qt, scale_out=st)  # fmt: skip
    assert got[0] is qt and got[1] is st and len(got) == 2
    codes, scale_bytes = model_columns(x, group_size, dtype, scale, layout)
    what = f"{lib} {x.dtype} {x.shape} G={group_size} {dtype} {scale} {layout}"
    assert_same_bytes(to_host_bytes(qt_buf), codes, f"qt ({what})", inputs=x.T)
    assert_same_bytes(to_host_bytes(st_buf), scale_bytes, f"scales_t ({what})")
    allocated = fgq.quantize(x_device, group_size, dtype=dtype, scale=scale, layout=layout,
                             orientation="col")  # fmt: skip
    assert tuple(allocated[0].shape) == (x.shape[1], x.shape[0])
    assert tuple(allocated[1].shape) == tuple(st_spec.shape)
    assert_allocated(allocated, (codes, to_host_bytes(st)), what)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("layout, scale", LAYOUT_SCALES)
# each input type; M = 300: two whole token groups and a partial one of 44 tokens
@pytest.mark.parametrize("input_dtype", INPUTS)
def test_col_against_model(backend, layout, scale, input_dtype):
    seed = LAYOUT_SCALES.index((layout, scale)) * 3 + INPUTS.index(input_dtype)
    rng = np.random.default_rng(seed)  # fixed per case: a failure reproduces
    check_col(activations(rng, (300, 384), input_dtype, specials=True), backend, scale=scale,
              layout=layout)  # fmt: skip


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# M across 1..300 (partial groups of every size class), K of 1 to 3 groups
@pytest.mark.parametrize("m, k", [(1, 128), (2, 256), (3, 128), (4, 384), (127, 128),
                                  (128, 128), (129, 256), (200, 128), (255, 128), (256, 256),
                                  (257, 128), (300, 128), (0, 128), (5, 0)])  # fmt: skip
def test_col_shape_sweep(backend, m, k):
    rng = np.random.default_rng(m * 7 + k)
    x = activations(rng, (m, k), "bfloat16", specials=True) if m * k else np.zeros((m, k), "f4")
    check_col(x, backend, scale="ue8m0", layout="packed")
    check_col(x, backend, scale="float32", layout="col_tma")


# the other group sizes and e5m2, on the NumPy backend (the GPU's tiles: 128 or 256 tokens, e4m3)
@pytest.mark.parametrize("group_size, dtype", [(32, "e4m3"), (64, "e5m2"), (256, "e4m3")])
def test_col_group_sizes(group_size, dtype):
    x = activations(np.random.default_rng(group_size), (301, 512), "float16", specials=True)
    check_col(x, "numpy", group_size=group_size, dtype=dtype, scale="ue8m0", layout="col")


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("layout, scale", LAYOUT_SCALES)
# token groups of 256 (torchao's other block size): M = 600, two whole groups and one of 88
@pytest.mark.parametrize("input_dtype", INPUTS)
def test_col_256_against_model(backend, layout, scale, input_dtype):
    seed = 50 + LAYOUT_SCALES.index((layout, scale)) * 3 + INPUTS.index(input_dtype)
    x = activations(np.random.default_rng(seed), (600, 512), input_dtype, specials=True)
    x[256:512, :128] = 0  # an all-zero token group in each of 128 channels: the eps floor
    check_col(x, backend, group_size=256, scale=scale, layout=layout)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# M below, at and past one, two and four groups of 256; K of one to three groups
@pytest.mark.parametrize("m, k", [(1, 256), (2, 512), (255, 256), (256, 256), (257, 768),
                                  (511, 256), (512, 512), (513, 256), (1100, 256), (0, 256),
                                  (5, 0)])  # fmt: skip
def test_col_256_shape_sweep(backend, m, k):
    rng = np.random.default_rng(m * 7 + k + 1)
    x = activations(rng, (m, k), "bfloat16", specials=True) if m * k else np.zeros((m, k), "f4")
    check_col(x, backend, group_size=256, scale="ue8m0", layout="packed")
    check_col(x, backend, group_size=256, scale="float32", layout="col_tma")


@pytest.mark.gpu
def test_col_256_torchao_arithmetic_and_unaligned_view():
    """torchao's arithmetic (section 3c) in 256-token groups, and a device view whose base is
    2 bytes past a 16-byte boundary (the kernel's scalar loads)."""
    torch = pytest.importorskip("torch")
    host = activations(np.random.default_rng(77), (520, 520), "float32", specials=False)
    x = host[:, 1:513]
    qt, st = fgq.quantize(to_device(np.ascontiguousarray(x), "torch"), 256, layout="col",
                          orientation="col", arithmetic="multiplier")  # fmt: skip
    codes, scales = spec_model.quantize_columns(x, 256, "e4m3", "float32", 1e-10,
                                                arithmetic="multiplier")  # fmt: skip
    assert_same_bytes(to_host_bytes(qt), codes, "qt, multiplier")
    assert np.array_equal(st.cpu().numpy(), scales.astype(np.float32))
    whole = torch.from_numpy(host.astype(np.float32)).cuda()
    qt, st = fgq.quantize(whole[:, 1:513], 256, layout="col", orientation="col")
    codes, scales = spec_model.quantize_columns(x, 256, "e4m3", "float32", 1e-10)
    assert_same_bytes(to_host_bytes(qt), codes, "qt through an unaligned view")
    assert np.array_equal(st.cpu().numpy(), scales.astype(np.float32))


@pytest.mark.gpu
def test_gpu_refuses_other_token_groups():
    torch = pytest.importorskip("torch")
    x = torch.ones((256, 256), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="group_size: orientation='col' on the GPU"):
        fgq.quantize(x, 64, orientation="col")
    # "both": its tile holds one row-wise group of 128 channels
    with pytest.raises(ValueError, match="group_size: orientation='both' on the GPU"):
        fgq.quantize(x, 256, orientation="both")


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# the OCP floor rule, column-wise and both
@pytest.mark.parametrize("orientation", ["col", "both"])
def test_col_floor_rule(backend, orientation):
    x = activations(np.random.default_rng(9), (130, 256), "bfloat16", specials=True)
    got = fgq.quantize(to_device(x, backend), 128, scale="ue8m0", layout="col",
                       scale_rule="floor", orientation=orientation)  # fmt: skip
    codes, scales = spec_model.quantize_columns(x, 128, "e4m3", "ue8m0", 1e-10, "floor")
    assert_same_bytes(to_host_bytes(got[-2]), codes, "qt", inputs=x.T)
    assert_same_bytes(to_host_bytes(got[-1]), scales.astype("<f4"), "scales_t (logical order)")


def _as_param(backend):
    """A backend of NUMPY_AND_GPU as a pytest param (values, marks, id)."""
    return backend if hasattr(backend, "values") else pytest.param(backend, id=backend)


def check_both(x, backend, layout, scale, eps=1e-10):
    """orientation="both" into four poisoned outputs: every byte of both results against the
    model, then the allocating call."""
    (q_spec, s_spec), (qt_spec, st_spec) = _specs(x, 128, "e4m3", scale, layout, "both")
    outs = [poisoned_spec(spec, backend, poison) for spec, poison in (
        (q_spec, Q_POISON), (s_spec, SCALE_POISON), (qt_spec, Q_POISON), (st_spec, SCALE_POISON)
    )]  # fmt: skip
    (q, q_buf), (s, s_buf), (qt, qt_buf), (st, st_buf) = outs
    got = fgq.quantize(to_device(x, backend), 128, scale=scale, layout=layout, eps=eps,
                       orientation="both", out=(q, qt), scale_out=(s, st))  # fmt: skip
    assert isinstance(got, fgq.BothOrientations)
    assert got.q is q and got.scales is s and got.qt is qt and got.scales_t is st
    what = f"{backend} {x.dtype} {x.shape} both {layout} {scale}"
    q_bytes, s_bytes = model_rows(x, 128, "e4m3", scale, layout, eps)
    qt_bytes, st_bytes = model_columns(x, 128, "e4m3", scale, layout, eps=eps)
    assert_same_bytes(to_host_bytes(q_buf), q_bytes, f"q ({what})", inputs=x)
    assert_same_bytes(to_host_bytes(s_buf), s_bytes, f"scales ({what})")
    assert_same_bytes(to_host_bytes(qt_buf), qt_bytes, f"qt ({what})", inputs=x.T)
    assert_same_bytes(to_host_bytes(st_buf), st_bytes, f"scales_t ({what})")
    allocated = fgq.quantize(to_device(x, backend), 128, scale=scale, layout=layout, eps=eps,
                             orientation="both")  # fmt: skip
    expected = (q_bytes, to_host_bytes(s), qt_bytes, to_host_bytes(st))
    assert_allocated(allocated, expected, what)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("layout, scale", [("col", "float32"), ("packed", "ue8m0")])
# a partial last group, NaN/Inf: both results of one call, every byte, into poisoned pairs
def test_both_against_model(backend, layout, scale):
    x = activations(np.random.default_rng(1), (200, 256), "bfloat16", specials=True)
    check_both(x, backend, layout, scale)


@pytest.mark.parametrize("layout, scale", LAYOUT_SCALES)
@pytest.mark.parametrize("input_dtype", INPUTS)
# every input type and layout; M from one token to eight token groups and a partial ninth (more
# tiles than a few SMs hold at once: the GPU's alone, the NumPy backend's tiles are a loop),
# K of one to three groups
@pytest.mark.parametrize("backend, m, k", [
    pytest.param(*backend.values, m, k, marks=backend.marks, id=f"{backend.id}-{m}-{k}")
    for backend in map(_as_param, NUMPY_AND_GPU)
    for m, k in ((1, 128), (127, 384), (129, 256), (1100, 128))
    if m < 1100 or backend.id != "numpy"
])  # fmt: skip
def test_both_sweep(backend, layout, scale, input_dtype, m, k):
    seed = (LAYOUT_SCALES.index((layout, scale)) * 3 + INPUTS.index(input_dtype)) * 7 + m + k
    x = activations(np.random.default_rng(seed), (m, k), input_dtype, specials=True)
    check_both(x, backend, layout, scale)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float32"])
# float scales below 2^-80 (the smallest eps, channels of tiny values) take the exact division
# on the GPU: one token group with such a channel, one with none and Inf or NaN in a few rows
# only, one whole and finite (the common encoding), a partial fourth; every byte of both results
def test_both_tiny_scales_and_lone_specials(backend, input_dtype):
    rng = np.random.default_rng(44)
    x = activations(rng, (430, 256), input_dtype)
    x[:128, 5] = rng.standard_normal(128) * 1e-30  # scale about 1e-32
    x[:128, 200] = 0.0  # all zero: the scale is eps / 448, subnormal
    x[130, 17], x[250, 128], x[255, 3] = np.inf, np.nan, -np.inf
    x[400, 100] = np.nan  # the partial group
    check_both(x, backend, "col", "float32", eps=float(np.finfo(np.float32).tiny))
    check_both(x, backend, "packed", "ue8m0", eps=float(np.finfo(np.float32).tiny))


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("tokens", [128, 256])
@pytest.mark.parametrize("input_dtype", INPUTS)
# the GPU takes each channel's maximum with Inf and NaN counted, then reads a channel whose
# maximum is one of them again for its finite maximum: beside the channel's largest finite
# value, alone, filling a whole token group of a channel, at the last real token of the
# partial group; "both" (128 tokens) too
def test_columns_nonfinite_maxima(backend, tokens, input_dtype):
    gpu_only_past_one_input(backend, input_dtype)
    rng = np.random.default_rng(tokens + INPUTS.index(input_dtype))
    m = 2 * tokens + 45
    x = activations(rng, (m, 512), input_dtype).astype(np.float32)
    x[3, 5], x[70, 5] = np.inf, 1000.0
    x[tokens + 1, 130], x[tokens + 9, 131] = np.nan, -np.nan
    x[:tokens, 300] = np.nan  # one channel's whole token group: its finite maximum is 0 (eps)
    x[m - 1, 7], x[m - 1, 511], x[2 * tokens, 200] = -np.inf, np.nan, np.inf
    x = x.astype(NP_INPUT[input_dtype])
    check_col(x, backend, group_size=tokens, scale="ue8m0", layout="packed")
    check_col(x, backend, group_size=tokens, scale="float32", layout="col")
    if tokens == 128:
        check_both(x, backend, "col", "float32")
        check_both(x, backend, "packed", "ue8m0")


@pytest.mark.parametrize("backend", HOST_AND_GPU)
@pytest.mark.parametrize("input_dtype, tokens", [("bfloat16", 128), ("float32", 256)])
# a channel's finite maximum read again through a view of a taller, wider buffer: rows wider
# than K, a base one element past the buffer's, and below the view's M rows Inf and values
# larger than any in it, which no read may reach
def test_columns_nonfinite_maxima_through_a_view(backend, input_dtype, tokens):
    m, k = 300, 512
    tall = activations(np.random.default_rng(78 + tokens), (m + 40, k + 8), input_dtype)
    tall = tall.astype(np.float32)
    tall[17, 100], tall[m - 1, 400], tall[140, 3] = np.inf, np.nan, -np.inf
    tall[m:, :] = 1e30
    tall[m, 100], tall[m + 1, 400], tall[m + 2, 3] = np.inf, np.inf, -np.inf
    tall = tall.astype(NP_INPUT[input_dtype])
    x = tall[:m, 1 : k + 1]
    view = x if backend == "numpy" else to_device(tall, backend)[:m, 1 : k + 1]
    qt, st = fgq.quantize(view, tokens, scale="ue8m0", layout="col", orientation="col")
    codes, scales = spec_model.quantize_columns(np.ascontiguousarray(x), tokens, "e4m3",
                                                "ue8m0", 1e-10)  # fmt: skip
    assert_same_bytes(to_host_bytes(qt), codes, f"qt through a view ({backend})")
    assert np.array_equal(to_host_bytes(st).view(np.float32).reshape(-1),
                          scales.astype(np.float32).reshape(-1))  # fmt: skip


def test_both_row_half_equals_row_call():
    x = activations(np.random.default_rng(2), (77, 384), "float32", specials=True)
    both = fgq.quantize(x, 128, scale="ue8m0", layout="col_tma", orientation="both")
    q, s = fgq.quantize(x, 128, scale="ue8m0", layout="col_tma")
    assert_same_bytes(both.q, q, "q")
    assert_same_bytes(to_host_bytes(both.scales), to_host_bytes(s), "scales")


def test_partial_group_is_the_tokens_that_exist():
    """The last token group's maximum ignores the tokens a longer x would add."""
    x = np.ones((300, 128), np.float32)
    longer = np.vstack([x, np.full((84, 128), 1000.0, np.float32)])  # 384: the group is whole
    _, st = fgq.quantize(x, 128, layout="row", orientation="col")
    _, st_longer = fgq.quantize(longer, 128, layout="row", orientation="col")
    assert st.shape == (128, 3) and st_longer.shape == (128, 3)
    assert (st[:, 2] == np.float32(1) / np.float32(448)).all()
    assert (st_longer[:, 2] == np.float32(1000) / np.float32(448)).all()


def test_col_dequantize_and_torch_cpu():
    torch = pytest.importorskip("torch")
    x = activations(np.random.default_rng(4), (130, 256), "float32")
    both = fgq.quantize(torch.from_numpy(x), 128, layout="col", orientation="both")
    assert isinstance(both, fgq.BothOrientations)
    assert tuple(both.qt.shape) == (256, 130) and both.qt.dtype == torch.float8_e4m3fn
    assert tuple(both.scales_t.stride()) == (1, 256)  # MN-major: what torch._scaled_mm reads
    back = fgq.dequantize(both.qt, both.scales_t, 128).numpy()
    codes, scales = spec_model.quantize_columns(x, 128, "e4m3", "float32", 1e-10)
    import ml_dtypes

    expected = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    expected = expected * np.repeat(scales.astype(np.float32), 128, axis=1)[:, :130]
    assert np.array_equal(back, expected)
    # a partial last group needs its group size: K / groups does not give it
    with pytest.raises(ValueError, match="scales"):
        fgq.dequantize(both.qt, both.scales_t)


# layouts of the column-wise scales (section 4d over K rows of cg groups) ----------------------


# M = 300 (cg = 3, kp = 1), K = 130 * 128 / 128... K = 384 rows of scales: tma 384
@pytest.mark.parametrize("layout, scale, dtype, shape, strides", [
    ("row", "float32", np.float32, (384, 3), (3, 1)),
    ("col", "float32", np.float32, (384, 3), (1, 384)),
    ("col_tma", "float32", np.float32, (384, 3), (1, 384)),
    ("packed", "ue8m0", np.int32, (384, 1), (1, 384)),
    ("packed_row", "ue8m0", np.int32, (384, 1), (1, 1)),
])  # fmt: skip
def test_col_layouts(layout, scale, dtype, shape, strides):
    qt, st = fgq.quantize(np.ones((300, 384), np.float32), 128, scale=scale, layout=layout,
                          orientation="col")  # fmt: skip
    assert qt.shape == (384, 300) and qt.flags.c_contiguous
    assert st.dtype == dtype and st.shape == shape
    assert st.strides == tuple(np.dtype(dtype).itemsize * v for v in strides)


def test_col_tma_pads_channels():
    """K = 130 channels are not a multiple of 4: col_tma and packed own align(K, 4) rows."""
    g = Geometry((130, 256), 128, "col_tma", False)
    assert g.scale_strides == (1, 132) and g.scale_storage == 132 * 2
    _, st = fgq.quantize(np.ones((256, 130 * 0 + 128), np.float32), 128, layout="col_tma",
                         orientation="col")  # fmt: skip
    assert st.strides == (4, 4 * 128)


# argument checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, match", [
    ({"orientation": "column"}, ValueError, "orientation"),
    ({"orientation": None}, ValueError, "orientation"),
    ({"orientation": "col", "pad_rows": True}, ValueError, "pad_rows"),
    ({"orientation": "col", "activation": "silu_mul"}, ValueError, "activation"),
    ({"orientation": "both", "layout": "blocked", "scale": "ue8m0"}, ValueError, "layout"),
    ({"orientation": "col", "dtype": "e2m1", "scale": "ue8m0", "group_size": 32}, ValueError,
     "orientation"),
    ({"orientation": "col", "norm": (np.ones(256, np.float32), 1e-6)}, ValueError, "norm"),
])  # fmt: skip
def test_orientation_bad_options(kwargs, error, match):
    group_size = kwargs.pop("group_size", 128)
    with pytest.raises(error, match=match):
        fgq.quantize(np.ones((8, 256), np.float32), group_size, **kwargs)


def test_orientation_bad_input_and_outputs():
    with pytest.raises(ValueError, match=r"x: orientation='col' needs x of shape \[M, K\]"):
        fgq.quantize(np.ones((2, 8, 128), np.float32), 128, orientation="col")
    with pytest.raises(ValueError, match="x: the last dimension"):
        fgq.quantize(np.ones((8, 100), np.float32), 128, orientation="both")
    with pytest.raises(ValueError, match="masked_m"):
        fgq.quantize(np.ones((8, 128), np.float32), 128, orientation="col",
                     masked_m=np.ones(2, np.int32))  # fmt: skip
    x = np.ones((8, 128), np.float32)
    with pytest.raises(TypeError, match="out: orientation='both' takes a pair"):
        fgq.quantize(x, 128, orientation="both", out=np.zeros((128, 8), np.uint8))
    st = np.full((128, 1), 5.0, np.float32)
    with pytest.raises(ValueError, match="out: expected shape"):
        fgq.quantize(x, 128, orientation="col", out=np.zeros((8, 128), np.uint8), scale_out=st)
    assert (st == 5.0).all()  # nothing written on a rejected call
    row_s = np.full((8, 1), 5.0, np.float32)
    with pytest.raises(ValueError, match=r"scale_out\[1\]: expected strides"):
        fgq.quantize(
            x, 128, orientation="both", scale_out=(row_s, np.zeros((128, 2), np.float32)[:, :1])
        )
    assert (row_s == 5.0).all()


# each orientation's codes, as a "both" call takes them (out[0] row-wise, out[1] column-wise)
@pytest.mark.parametrize("which", [0, 1])
@pytest.mark.parametrize("backend", HOST_AND_GPU)
def test_both_refuses_codes_not_16_byte_aligned(backend, which):
    """The kernels store codes 16 bytes at a time: a code output one byte past an aligned
    base is refused, named as the caller gave it, with nothing written (on the GPU it was
    launched with the row-wise codes misaligned: a misaligned-address fault)."""
    x = activations(np.random.default_rng(which), (32, 256), "bfloat16")
    (q_spec, _), (qt_spec, _) = _specs(x, 128, "e4m3", "float32", "col", "both")
    spec = (q_spec, qt_spec)[which]
    buffer = poisoned_bytes(spec.storage + 16, Q_POISON, backend)
    view = strided_view(buffer[1:], spec.dtype, spec.shape, spec.strides, backend)
    out = (view, None) if which == 0 else (None, view)
    with pytest.raises(ValueError, match=rf"out\[{which}\]: expected a 16-byte aligned pointer"):
        fgq.quantize(to_device(x, backend), 128, layout="col", orientation="both", out=out)
    assert (to_host_bytes(buffer) == Q_POISON).all()


@pytest.mark.parametrize("which", [0, 1])
def test_both_refuses_misaligned_codes_before_the_launch(fake_gpu, which):
    """The GPU path's checks, on the CPU (fake_gpu): nothing is planned or launched."""
    from fake_gpu import fake

    x = fake((32, 256), "bfloat16")
    out = (fake((32, 256), "uint8", offset=1), None) if which == 0 else (
        None, fake((256, 32), "uint8", offset=1))  # fmt: skip
    with pytest.raises(ValueError, match=rf"out\[{which}\]: expected a 16-byte aligned pointer"):
        fgq.quantize(x, 128, layout="col", orientation="both", out=out)
    assert not fake_gpu.launches
    aligned = (fake((32, 256), "uint8"), fake((256, 32), "uint8"))
    fgq.quantize(x, 128, layout="col", orientation="both", out=aligned)
    assert len(fake_gpu.launches) == 1  # the same call with aligned codes is launched


def test_gpu_token_groups_before_the_launch(fake_gpu):
    """The GPU path's group sizes, on the CPU (fake_gpu): "col" takes 128 and 256, "both" 128."""
    from fake_gpu import fake

    x = fake((300, 512), "bfloat16")
    for group_size, orientation in [(64, "col"), (256, "both"), (32, "both")]:
        with pytest.raises(ValueError, match=f"group_size: orientation='{orientation}' on the"):
            fgq.quantize(x, group_size, orientation=orientation)
    assert not fake_gpu.plans
    for group_size in (128, 256):
        fgq.quantize(x, group_size, layout="col", orientation="col")
    assert [request.group_size for request, *_ in fake_gpu.plans] == [128, 256]


def test_specs_are_what_the_spec_says():
    """The qt spec itself: [K, M], contiguous, K * M bytes."""
    _, (qt_spec, st_spec) = _specs(np.ones((5, 256), np.float32), 128, "e4m3", "ue8m0",
                                   "packed", "col")  # fmt: skip
    assert qt_spec == OutputSpec((256, 5), (5, 1), 1280, "float8_e4m3fn", "uint8")
    assert st_spec.shape == (256, 1) and st_spec.strides == (1, 256)


# the launch's Params against the layouts (no GPU needed: the kernel's address arithmetic) ----


# the column kernel of 256-token groups: its name, grid and Params (K read from cols, as
# groups_per_row is K / 256), and its scale addresses for every layout; M = 600, K = 512
@pytest.mark.parametrize("layout, scale", LAYOUT_SCALES)
def test_columns_256_launch_and_addresses(layout, scale, monkeypatch):
    from fp8_group_quant import _plan
    from fp8_group_quant._arrays import describe
    from fp8_group_quant._request import check_options
    from fp8_group_quant._tuning import active

    launches = []
    monkeypatch.setattr(
        _plan, "_loaded", lambda name, *a, **k: launches.append(name) or (7, 2, 132)
    )
    monkeypatch.setattr(_plan, "pdl_supported", lambda *a: False)
    monkeypatch.setattr(_plan, "Launch", lambda *a, **k: launches.append(a) or a)
    x = np.ones((600, 512), np.float32)
    options = check_options(256, "e4m3", scale, layout, orientation="col")
    request = make_request(describe(x, "x"), options)
    _plan.prepare_columns(request, 0, active()[1])
    name, (handle, grid, block, params, *_) = launches
    assert name.startswith("fgq::quantize_columns<") and name.endswith(", 256>")
    assert grid == (512 // 128, 3, 1) and block == (256, 1, 1) and handle == 7
    assert (params.rows, params.cols, params.groups_per_row) == (600, 512, 2)
    assert (params.t_groups, params.t_scale_rows) == (3, 512)
    storage = spec_model.Storage((512, 3 * 256), 256, layout, False)
    packed = layout.startswith("packed")
    for c, j in np.ndindex(512, 3):  # (channel, token group): where the kernel's t Params put it
        word = c * params.t_row_stride + (j // 4 if packed else j) * params.t_word_stride
        assert word + (j % 4 if packed else 0) == storage.scale_offset(0, c, j), (c, j)


# every layout the column kernel takes; M = 300 (a partial token group), K = 384
@pytest.mark.parametrize("layout, scale", LAYOUT_SCALES)
def test_columns_params_address_the_layout(layout, scale):
    from fp8_group_quant._arrays import describe
    from fp8_group_quant._plan import columns_params
    from fp8_group_quant._request import check_options
    from fp8_group_quant._tuning import active

    x = np.ones((300, 384), np.float32)
    options = check_options(128, "e4m3", scale, layout, orientation="both")
    params = columns_params(make_request(describe(x, "x"), options), active()[1])
    assert (params.rows, params.cols, params.groups_per_row) == (300, 384, 3)
    assert (params.t_groups, params.t_scale_rows) == (3, 384)  # K = 384 is a multiple of 4
    storage = spec_model.Storage((384, 384), 128, layout, False)
    packed = layout.startswith("packed")
    for c, j in np.ndindex(384, 3):  # (channel, token group): where the kernel's t Params put it
        word = c * params.t_row_stride + (j // 4 if packed else j) * params.t_word_stride
        assert word + (j % 4 if packed else 0) == storage.scale_offset(0, c, j), (c, j)
    rows = spec_model.Storage((300, 384), 128, layout, False)
    for m, g in np.ndindex(300, 3):  # the row-wise result's, as every other kernel reads them
        word = m * params.s_row_stride + (g // 4 if packed else g) * params.s_word_stride
        assert word + (g % 4 if packed else 0) == rows.scale_offset(0, m, g), (m, g)
