"""MXFP4 (docs/spec.md, section 4b): the NumPy backend against the scalar model, quantize and
dequantize in both layouts, the options it refuses, and the kernel on the GPU against the
NumPy backend over a dense sweep of shapes."""

import ml_dtypes
import numpy as np
import pytest
from backends import (
    NUMPY_AND_GPU,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    to_device,
    to_host,
    to_host_bytes,
    wider_rows,
)
from helpers import NP_INPUT, assert_same_bytes

import fp8_group_quant as fgq
from fp8_group_quant import _plan, reference, spec_model
from fp8_group_quant._layout import Geometry
from fp8_group_quant._request import check_options
from fp8_group_quant._spec import INPUT_TYPES

TINY = float(np.finfo(np.float32).tiny)  # the smallest eps: 2^-126
MID = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)  # e2m1's midpoints


def mx_groups(rng, count: int) -> np.ndarray:
    """[count, 32] float32 groups: heavy-tailed magnitudes with outliers, values on e2m1 ties
    once scaled, +-0, subnormals, NaN and +-Inf, all-zero groups, huge and tiny magnitudes."""
    out = rng.standard_normal((count, 32)) * np.exp(rng.standard_normal((count, 1)) * 4)
    out = out.astype(np.float32)
    out[0::9, rng.integers(32)] *= np.float32(300)  # an outlier channel
    # ties: amax 6 * 2^k makes the scale exactly 2^k (both rules), the rest sit on midpoints
    k = rng.integers(-30, 30, (len(out[1::9]), 1)).astype(np.float32)
    ties = rng.choice(MID, (len(k), 32)) * rng.choice([-1, 1], (len(k), 32)).astype(np.float32)
    ties[:, 0] = 6
    out[1::9] = ties * np.exp2(k)
    out[2::9, rng.integers(32)] = np.nan
    out[3::9, rng.integers(32)] = np.inf
    out[3::9, rng.integers(32)] = -np.inf
    out[4::9] = 0.0
    out[4::18, rng.integers(32)] = -0.0
    out[5::9] *= np.float32(1e-39) / np.abs(out[5::9]).max(-1, keepdims=True)  # subnormals
    with np.errstate(over="ignore"):
        out[6::9] = np.clip(out[6::9] * np.float32(1e36), -3e38, 3e38)  # huge
    out[7::9] *= np.float32(1e-30)  # tiny: below the default eps
    out[8::9, :16] = np.float32(-1e-3)  # negatives that round to -0 beside an outlier
    out[8::9, 16] = np.float32(100)
    return out


def mx_inputs(rng, shape, dtype: str) -> np.ndarray:
    size = int(np.prod(shape))
    flat = mx_groups(rng, -(-size // 32)).reshape(-1)[:size]
    with np.errstate(over="ignore"):
        return flat.reshape(shape).astype(NP_INPUT[dtype])


# the NumPy backend against the scalar model ------------------------------------------------------


@pytest.mark.parametrize("rule", ["rceil", "floor"])  # both UE8M0 rules
# the default, a large one (it lifts amax), the smallest (floor then reaches byte 1), above 6
@pytest.mark.parametrize("eps", [1e-10, 1e-3, TINY, 100.0])
def test_the_numpy_backend_matches_the_scalar_model(rule, eps):
    rng = np.random.default_rng(len(rule) + 61)
    values = mx_groups(rng, 1800)
    codes, exponents = reference.mxfp4_groups(values, eps, rule)
    assert codes.shape == values.shape and exponents.shape == values.shape[:1]
    for i, group in enumerate(values.tolist()):
        want_codes, want_e = spec_model.mxfp4_group(group, eps, rule)
        assert list(codes[i]) == want_codes and int(exponents[i]) == want_e, (i, group)


def test_known_answers():
    # docs/spec.md, section 4b's examples
    zero, e = reference.mxfp4_groups(np.zeros((1, 32), np.float32), 1e-10)
    assert e[0] == 0x5E and not zero.any()
    seven = np.zeros((1, 32), np.float32)
    seven[0, :4] = [7.0, -0.0, -0.1, 1.5]
    codes, e = reference.mxfp4_groups(seven, 1e-10, "rceil")
    # scale 2: 3.5 ties to 4 (code 6); -0 and -0.05 keep the sign (8); 0.75 ties to 1 (2)
    assert e[0] == 0x80 and list(codes[0, :4]) == [6, 8, 8, 2]
    codes, e = reference.mxfp4_groups(seven, 1e-10, "floor")
    # scale 1: 7 saturates to 6 (code 7); 1.5 is exact (3)
    assert e[0] == 0x7F and list(codes[0, :4]) == [7, 8, 8, 3]
    # NaN +0, +-Inf +-6, and the scale as if they were absent
    specials = np.full((1, 32), 0.5, np.float32)
    specials[0, :3] = [np.nan, np.inf, -np.inf]
    codes, e = reference.mxfp4_groups(specials, 1e-10)
    # amax 0.5: y = 0.5 / 6 = 1.33 * 2^-4, so e = 0x7C (scale 2^-3) and 0.5 scales to 4 (code 6)
    assert list(codes[0, :4]) == [0, 7, 15, 6] and e[0] == 0x7C
    assert list(codes[0, :4]) == list(spec_model.mxfp4_group(specials[0].tolist(), 1e-10)[0][:4])


def test_the_two_e2m1_roundings_of_the_model_agree():
    # spec_model holds e2m1 twice: section 4a's nearest-code search and section 4's grid row
    # (Format.convert) that section 4b's group reuses; they agree at every tie and elsewhere
    row = spec_model.FORMATS["e2m1"]
    points = np.concatenate([np.arange(0, 7.25, 0.25), np.exp(np.linspace(-20, 2, 500))])
    for p in points.astype(np.float32):
        for v in (p, np.nextafter(p, np.float32(0)), np.nextafter(p, np.float32(9))):
            for t in (float(v), -float(v)):
                assert row.convert(min(max(t, -6.0), 6.0)) == spec_model.e2m1_code(t), t


# quantize(dtype="e2m1", scale="ue8m0") -----------------------------------------------------------


def mxfp4_call(x, layout, eps=1e-10, rule="rceil", **kwargs):
    return fgq.quantize(x, 32, dtype="e2m1", scale="ue8m0", layout=layout, eps=eps,
                        scale_rule=rule, **kwargs)  # fmt: skip


def expected_mxfp4(x: np.ndarray, layout: str, eps: float, rule: str):
    """(q bytes, scale storage) from the NumPy arithmetic (checked above against the scalar
    model), packed and laid out by the spec's words and spec_model's blocked offset formula,
    not by the backend's layout code."""
    shape = x.shape
    geometry = Geometry(shape, 32, layout, False)
    b, m, ng = geometry.batches, geometry.rows, geometry.groups
    values = np.asarray(x, np.float32).reshape(b, m, ng, 32)
    codes, e = reference.mxfp4_groups(values, eps, rule)
    codes = codes.reshape(*shape[:-1], shape[-1] // 2, 2)
    q = (codes[..., 0] | (codes[..., 1] << 4)).astype(np.uint8)
    if layout == "row":
        return q, (e.astype(np.uint32) << 23).view(np.float32).reshape(geometry.scale_shape)
    storage = np.zeros((b, geometry.scale_rows * geometry.scale_columns), np.uint8)
    if m and ng:
        rows, groups = np.meshgrid(np.arange(m), np.arange(ng), indexing="ij")
        offsets = np.vectorize(spec_model.blocked_offset)(rows, groups, ng)
        storage[:, offsets] = e
    return q, storage.reshape(geometry.scale_shape)


def poisoned_outputs(shape, layout: str, lib: str):
    """(q, scales) for out= and scale_out=: every byte 0xAB, in ``lib``."""
    geometry = Geometry(shape, 32, layout, False)
    q = np.full((*shape[:-1], shape[-1] // 2), 0xAB, np.uint8)
    s = np.full(geometry.scale_storage_bytes, 0xAB, np.uint8).view(geometry.layout.dtype)
    return to_device(q, lib), to_device(s.reshape(geometry.scale_shape), lib)


# M swept densely through 1..300 (inside, at and past the 128-row tiles of the blocked layout)
# at K = 32, and K of 1 to 224 groups (odd, even, fewer than a tile's 4 columns) at sampled M
SWEEP_M = (1, 2, 3, 5, 31, 32, 33, 100, 127, 128, 129, 130, 200, 255, 256, 257, 299, 300)
SHAPES = (
    [(m, 32) for m in range(1, 301)]
    + [(m, k) for k in (64, 96, 128, 160) for m in SWEEP_M]
    + [(m, 7168) for m in (1, 3, 127, 129, 300)]
    + [(7168,), (2, 3, 64), (3, 130, 96), (2, 1, 7168), (2, 2, 3, 160), (3, 0, 32), (4, 0), (0, 32)]
)  # fmt: skip
EPS = (1e-10, 1e-3, TINY)  # cycled over the shapes


def check_sweep(backend, input_dtype, layout, rule, shapes, strided=False):
    """Every shape on ``backend`` into poisoned outputs and into its own, against the expected
    bytes; ``strided`` also reads x as a view into rows 64 elements wider."""
    rng = np.random.default_rng(len(input_dtype) + len(layout) + len(rule) + len(backend))
    for i, shape in enumerate(shapes):
        eps = EPS[i % len(EPS)]
        x = mx_inputs(rng, shape, input_dtype)
        want_q, want_s = expected_mxfp4(x, layout, eps, rule)
        what = f"MXFP4 {backend} {input_dtype} {layout} {rule} eps={eps} {shape}"
        inputs = [to_device(x, backend)]
        if strided and len(shape) == 2 and 0 not in shape:
            inputs.append(wider_rows(x, 64, backend, 32))
        for x_in in inputs:
            out, scale_out = poisoned_outputs(shape, layout, backend)
            q, s = mxfp4_call(x_in, layout, eps, rule, out=out, scale_out=scale_out)
            assert q is out and s is scale_out
            assert_same_bytes(to_host_bytes(q), want_q, f"q ({what})", inputs=x)
            assert_same_bytes(to_host_bytes(s), want_s, f"scales ({what})")
            q2, s2 = mxfp4_call(x_in, layout, eps, rule)
            assert tuple(q2.shape) == want_q.shape and tuple(s2.shape) == want_s.shape, what
            assert str(q2.dtype).endswith("uint8") and str(s2.dtype).endswith(
                "float32" if layout == "row" else "uint8"
            )
            assert_same_bytes(to_host_bytes(q2), want_q, f"q, allocated ({what})")
            assert_same_bytes(to_host_bytes(s2), want_s, f"scales, allocated ({what})")


@pytest.mark.parametrize("layout", ["row", "blocked"])  # both layouts MXFP4 is written in
@pytest.mark.parametrize("rule", ["rceil", "floor"])  # both UE8M0 rules
def test_quantize_writes_mxfp4_on_the_numpy_backend(layout, rule):
    # the NumPy backend over the sweep, from bfloat16 (float16 and float32 below)
    check_sweep("numpy", "bfloat16", layout, rule, SHAPES)


@pytest.mark.parametrize("input_dtype", ["float16", "float32"])  # the other input types
def test_quantize_writes_mxfp4_from_each_input_type(input_dtype):
    shapes = [(m, k) for m in (1, 129, 300) for k in (32, 160)] + [(2, 3, 64)]
    for layout in ("row", "blocked"):
        check_sweep("numpy", input_dtype, layout, "rceil", shapes)


@pytest.mark.parametrize("layout", ["row", "blocked"])  # both layouts
def test_mxfp4_follows_the_scalar_model_end_to_end(layout):
    # the whole call, group by group from the scalar model (small shapes: the model is slow)
    rng = np.random.default_rng(9)
    for shape in [(1, 32), (5, 96), (129, 64), (2, 3, 160)]:
        x = mx_inputs(rng, shape, "bfloat16")
        q, s = mxfp4_call(x, layout, 1e-3, "floor")
        groups = np.asarray(x, np.float32).reshape(-1, 32)
        model = [spec_model.mxfp4_group(g.tolist(), 1e-3, "floor") for g in groups]
        codes = np.array([c for c, _ in model], np.uint8).reshape(*shape[:-1], -1, 2)
        assert np.array_equal(q, codes[..., 0] | (codes[..., 1] << 4))
        exponents = np.array([e for _, e in model], np.uint32).reshape(*shape[:-1], -1)
        if layout == "row":
            assert np.array_equal(s.view(np.uint32), exponents << 23)
        else:
            geometry = Geometry(shape, 32, layout, False)
            flat = s.reshape(geometry.batches, -1)
            for (b, r, c), e in np.ndenumerate(exponents.reshape(geometry.batches, -1,
                                                                 geometry.groups)):  # fmt: skip
                assert flat[b, spec_model.blocked_offset(r, c, geometry.groups)] == e


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)  # the NumPy backend, and the GPU from both
@pytest.mark.parametrize("layout", ["row", "blocked"])  # both layouts
def test_mxfp4_round_trip(backend, layout):
    # dequantize gives e2m1(code) * 2^(e - 127) exactly, and within half a step of the grid
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 256)).astype(np.float32)
    q, s = mxfp4_call(to_device(x, backend), layout)
    back = fgq.dequantize(q, s, 32, dtype="e2m1")
    assert tuple(back.shape) == x.shape and str(back.dtype).endswith("float32")
    codes = to_host(q)
    nibbles = np.stack([codes & 15, codes >> 4], -1).reshape(300, 8, 32)
    grid = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    _, e = reference.mxfp4_groups(x.reshape(300, 8, 32), 1e-10)
    want = grid[nibbles] * (e.astype(np.uint32) << 23).view(np.float32)[..., None]
    assert_same_bytes(to_host_bytes(back), want.reshape(300, 256), f"dequantize ({backend})")
    # the scale is at least amax / 6 and e2m1's step is at most 2 of it, so |error| <= scale
    err = np.abs(want.reshape(300, 8, 32) - x.reshape(300, 8, 32))
    assert (err <= (e.astype(np.uint32) << 23).view(np.float32)[..., None]).all()


def test_mxfp4_on_torch_cpu():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(4).standard_normal((7, 96)).astype(np.float32)
    for layout in ("row", "blocked"):
        q, s = mxfp4_call(x, layout)
        tq, ts = mxfp4_call(torch.from_numpy(x), layout)
        assert tq.dtype == torch.uint8 and np.array_equal(tq.numpy(), q)
        assert np.array_equal(ts.numpy(), s)
        back = fgq.dequantize(tq, ts, 32, dtype="e2m1")
        assert np.array_equal(back.numpy(), fgq.dequantize(q, s, 32, dtype="e2m1"))


# the options MXFP4 refuses: test_nvfp4.py's test_fp4_refuses_what_it_does_not_do, both formats


def test_mxfp4_input_and_dequantize_checks():
    with pytest.raises(ValueError, match="x: MXFP4 needs K a multiple of 32"):
        mxfp4_call(np.ones((2, 48), np.float32), "row")
    q, s = mxfp4_call(np.ones((2, 64), np.float32), "row")
    with pytest.raises(
        ValueError, match=r"MXFP4 group_size=32 \(or none\) and no global_scale; got group_size=64"
    ):
        fgq.dequantize(q, s, 64, dtype="e2m1")
    with pytest.raises(ValueError, match=r"scales: MXFP4 scales are float32 \(2, 2\)"):
        fgq.dequantize(q, s[:, :1], 32, dtype="e2m1")
    with pytest.raises(TypeError, match="q: e2m1 codes are uint8"):
        fgq.dequantize(q.view(np.int8), s, 32, dtype="e2m1")
    with pytest.raises(ValueError, match="scales: blocked scales for values of shape"):
        fgq.dequantize(q, np.zeros((128, 8), np.uint8), 32, dtype="e2m1")


def test_mxfp4_kernels_are_instantiated():
    # quantize_fp4 of MXFP4 in both layouts for every input type: `pytest --compile-all`
    # compiles them, and warmup and the plan name the same instantiations
    names = set(_plan.all_name_expressions())
    for input_type in INPUT_TYPES.values():
        for layout, trait in (("row", "kFloatWords"), ("blocked", "kBlockedExponents")):
            name = f"fgq::quantize_fp4<{input_type.kernel_trait}, fgq::kMxfp4, fgq::{trait}>"
            assert name in names
            options = check_options(32, "e2m1", "ue8m0", layout)
            keys = _plan.warmup_keys(input_type.name, options)
            assert [k.name_expression for k in keys] == [name]


# the kernel on the GPU against the NumPy backend --------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("input_dtype", list(INPUT_TYPES))  # every input type
@pytest.mark.parametrize("layout", ["row", "blocked"])  # both layouts
@pytest.mark.parametrize("rule", ["rceil", "floor"])  # both UE8M0 rules
@pytest.mark.parametrize("lib", ["cupy", "torch"])  # both GPU libraries
def test_mxfp4_kernel_matches_the_numpy_backend(input_dtype, layout, rule, lib):
    # every byte of q and of the scales (blocked padding included) over poisoned outputs, the
    # outputs the library allocates, and rows read through a wider buffer
    check_sweep(lib, input_dtype, layout, rule, SHAPES, strided=True)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["row", "blocked"])  # both layouts
def test_prepare_of_mxfp4(layout):
    import cupy

    x_host = mx_inputs(np.random.default_rng(8), (257, 160), "bfloat16")
    x = cupy.asarray(x_host)
    prepared = fgq.prepare(x, 32, dtype="e2m1", scale="ue8m0", layout=layout, scale_rule="floor")
    q, s = prepared(x)
    want_q, want_s = expected_mxfp4(x_host, layout, 1e-10, "floor")
    assert_same_bytes(to_host_bytes(q), want_q, f"q, prepared {layout}")
    assert_same_bytes(to_host_bytes(s), want_s, f"scales, prepared {layout}")


@pytest.mark.gpu
def test_mxfp4_device_checks():
    import cupy

    x = cupy.zeros((4, 128), cupy.float32)
    with pytest.raises(ValueError, match="x: MXFP4 on the GPU needs a 16-byte aligned base"):
        mxfp4_call(x[:, 1:65], "row")  # the base 4 bytes past an aligned address
