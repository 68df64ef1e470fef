"""NVFP4 (docs/spec.md, section 4a) on the NumPy backend against the scalar model: the
building blocks, quantize(dtype="e2m1") and dequantize, and the checks; and the kernel on the
GPU against this backend."""

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
from helpers import assert_same_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8_group_quant as fgq
from fp8_group_quant import reference, spec_model
from fp8_group_quant._layout import Geometry
from fp8_group_quant._spec import INPUT_TYPES


def groups(rng, count: int) -> np.ndarray:
    """[count, 16] float32 groups: heavy-tailed magnitudes, e2m1 ties, NaN and Inf, zeros."""
    out = (rng.standard_normal((count, 16)) * np.exp(rng.standard_normal((count, 1)) * 4)).astype(
        np.float32
    )
    out[1::7] = (rng.integers(-24, 25, (len(out[1::7]), 16)) * 0.25).astype(np.float32)  # ties
    out[2::7, rng.integers(16)] = np.nan
    out[3::7, rng.integers(16)] = np.inf
    out[4::7, rng.integers(16)] = -np.inf
    out[5::7] = 0.0
    out[6::7] *= np.float32(1e-30)  # tiny groups: subnormal e4m3 scales
    return out


# the global scale computed from x, and given
@pytest.mark.parametrize("source", ["computed", "given"])
def test_the_numpy_backend_matches_the_scalar_model(source):
    rng = np.random.default_rng(51)
    values = groups(rng, 2100)
    for row in values.reshape(-1, 300, 16):
        g = (
            reference.nvfp4_global_scale(row)
            if source == "computed"
            else np.float32(np.exp(rng.standard_normal() * 6))
        )
        codes, scales = reference.nvfp4_groups(row, g)
        for i, group in enumerate(row.tolist()):
            want_codes, want_scale = spec_model.nvfp4_group(group, float(g))
            assert list(codes[i]) == want_codes and int(scales[i]) == want_scale, (group, g)


def test_known_answers():
    # amax 3 with the computed global scale 2688 / 3 = 896: s = e4m3(448) = 0x7E, d = 0.5
    v = np.array([[1.0, -2.0, 3.0, 0.1, 0.25, -0.0, 1.25, 2.5] + [0.0] * 8], np.float32)
    g = reference.nvfp4_global_scale(v)
    assert g == np.float32(896)
    codes, scales = reference.nvfp4_groups(v, g)
    assert scales[0] == 0x7E
    # 2 -> 2.0 (4), -4 -> -4.0 (14), 6 -> 6.0 (7), 0.2 -> 0, 0.5 -> 0.5 (1), -0 -> 8,
    # 2.5 ties to 2.0 (4), 5 ties to 4.0 (6)
    assert list(codes[0, :8]) == [4, 14, 7, 0, 1, 8, 4, 6]
    zero_codes, zero_scales = reference.nvfp4_groups(np.zeros((1, 16), np.float32), 1.0)
    assert zero_scales[0] == 0 and not zero_codes.any()  # s = 0: every code +0
    # a global scale too large for the group: s saturates at 448 and so do the codes (at 6)
    big, _ = reference.nvfp4_groups(np.full((1, 16), 3.0, np.float32), 1e6)
    assert set(big[0].tolist()) == {7}


def test_the_global_scale_edges():
    assert reference.nvfp4_global_scale(np.zeros(32, np.float32)) == 1
    assert reference.nvfp4_global_scale(np.array([np.nan, np.inf], np.float32)) == 1
    tiny = np.array([1e-40], np.float32)  # 2688 / amax overflows float32
    assert reference.nvfp4_global_scale(tiny) == np.finfo(np.float32).max


def test_pack_puts_the_first_value_in_the_low_nibble():
    codes = np.array([[1, 2, 3, 4, 15, 0]], np.uint8)
    assert list(reference.pack_e2m1(codes)[0]) == [0x21, 0x43, 0x0F]
    # the packed bytes decode as torch's float4_e2m1fn_x2 would: low nibble first
    values = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    packed = reference.pack_e2m1(np.arange(16, dtype=np.uint8)[None])[0]
    assert values[packed[0] & 0xF] == 0.0 and values[packed[0] >> 4] == 0.5


# the computed global scale and two given ones (docs/spec.md quotes each share)
@pytest.mark.parametrize("given", [None, 3.0, 1.0])
def test_how_often_a_reciprocal_rule_differs(given):
    # vLLM's and FlashInfer's kernels scale by reciprocals: s = e4m3(g * (amax * (1/6))) and
    # codes e2m1(v * 1/(s * (1/g))), their reciprocals approximate (rcp.approx); emulated here
    # with correctly rounded ones, which isolates the order of operations. docs/spec.md,
    # section 4a, quotes these shares (bfloat16 input, 800,000 values).
    rng = np.random.default_rng(52)
    values = rng.standard_normal((50000, 16)) * np.exp(rng.standard_normal((50000, 1)))
    values = values.astype(ml_dtypes.bfloat16).astype(np.float32)
    f32 = np.float32
    g = reference.nvfp4_global_scale(values) if given is None else f32(given)
    codes, scales = reference.nvfp4_groups(values, g)
    amax = np.abs(values).max(axis=-1)
    sf = (g * (amax * (f32(1) / f32(6)))).astype(np.float32)
    their_scales = np.minimum(sf, f32(448)).astype(ml_dtypes.float8_e4m3fn)
    s = their_scales.astype(np.float32)
    with np.errstate(divide="ignore"):
        output_scale = np.where(s > 0, f32(1) / (s * (f32(1) / g)), f32(0)).astype(np.float32)
    t = np.clip((values * output_scale[:, None]).astype(np.float32), -6, 6)
    their_codes = t.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0x0F
    scale_share = float((their_scales.view(np.uint8) != scales).mean())
    code_share = float((their_codes != codes).mean())
    if given is None:  # the computed global scale (20.06 here): identical
        assert scale_share == 0 and code_share == 0, (scale_share, code_share)
    elif given == 3.0:  # 0.73% of the scales and 0.17% of the codes
        assert 0 < scale_share < 0.02 and 0 < code_share < 0.01, (scale_share, code_share)
    else:  # g = 1: the scales agree, 0.066% of the codes differ at e2m1 ties
        assert scale_share == 0 and 0 < code_share < 0.005, (scale_share, code_share)


# quantize(dtype="e2m1") on the NumPy backend ------------------------------------------------------


def nvfp4_inputs(rng, shape, dtype="bfloat16") -> np.ndarray:
    """Random rows with outliers, e2m1 ties, NaN/Inf, zero and tiny groups, in ``dtype``."""
    flat = groups(rng, -(-int(np.prod(shape)) // 16)).reshape(-1)[: int(np.prod(shape))]
    return flat.reshape(shape).astype(getattr(ml_dtypes, dtype, None) or np.dtype(dtype))


def expected_nvfp4(x: np.ndarray, g: float):
    """(q bytes, blocked scale storage) group by group from the scalar model and the spec's
    blocked offset formula: independent of the backend's vectorised path."""
    shape = x.shape
    geometry = Geometry(shape, 16, "blocked", False)
    rows = np.asarray(x, np.float32).reshape(geometry.batches, geometry.rows, geometry.groups, 16)
    codes = np.zeros(rows.shape, np.uint8)
    storage = np.zeros((geometry.batches, geometry.scale_rows * geometry.scale_columns), np.uint8)
    for b in range(geometry.batches):
        for r in range(geometry.rows):
            for c in range(geometry.groups):
                got_codes, scale = spec_model.nvfp4_group(rows[b, r, c].tolist(), g)
                codes[b, r, c] = got_codes
                storage[b, spec_model.blocked_offset(r, c, geometry.groups)] = scale
    codes = codes.reshape(shape)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), storage.reshape(geometry.scale_shape)


# one group, odd rows, past a 128-row tile, batched, empty
@pytest.mark.parametrize(
    "shape", [(1, 16), (5, 48), (129, 80), (2, 3, 64), (2, 130, 32), (3, 0, 32), (4, 0)]
)
# every input type
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_quantize_writes_nvfp4_as_the_scalar_model(shape, dtype):
    rng = np.random.default_rng(sum(shape) + len(dtype))
    x = nvfp4_inputs(rng, shape, dtype)
    q, s, g = fgq.quantize(x, 16, dtype="e2m1", scale="e4m3", layout="blocked")
    assert g.dtype == np.float32 and g.shape == (1,)
    assert g[0] == reference.nvfp4_global_scale(x)
    want_q, want_s = expected_nvfp4(x, float(g[0]))
    assert q.dtype == np.uint8 and q.shape == (*shape[:-1], shape[-1] // 2)
    assert np.array_equal(q, want_q) and np.array_equal(s, want_s)
    for value in (3.0, np.array([0.25], np.float32)):  # a float, or a one-element array
        q2, s2 = fgq.quantize(x, 16, dtype="e2m1", scale="e4m3", layout="blocked",
                              global_scale=value)  # fmt: skip
        want_q, want_s = expected_nvfp4(x, float(np.float32(np.asarray(value).reshape(-1)[0])))
        assert np.array_equal(q2, want_q) and np.array_equal(s2, want_s)


def test_nvfp4_round_trip_and_torch_cpu():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((300, 256)).astype(np.float32)
    q, s, g = fgq.quantize(x, 16, dtype="e2m1", scale="e4m3", layout="blocked")
    back = fgq.dequantize(q, s, 16, dtype="e2m1", global_scale=g)
    assert back.shape == x.shape and back.dtype == np.float32
    # e2m1 keeps 2 significant bits: each value within half a step of its group's grid, which
    # is at most amax / 6 (the scale's own rounding adds at most 1/16 of it)
    amax = np.abs(x.reshape(300, 16, 16)).max(-1, keepdims=True)
    err = np.abs(back - x).reshape(300, 16, 16)
    assert (err <= amax / 6 * 1.07).all()
    assert np.sqrt(np.mean((back - x) ** 2) / np.mean(x**2)) < 0.15
    torch = pytest.importorskip("torch")
    tq, ts, tg = fgq.quantize(torch.from_numpy(x), 16, dtype="e2m1", scale="e4m3",
                              layout="blocked")  # fmt: skip
    assert tq.dtype == torch.uint8 and np.array_equal(tq.numpy(), q)
    assert np.array_equal(ts.numpy(), s) and tg.numpy()[0] == g[0]
    assert np.array_equal(fgq.dequantize(tq, ts, 16, dtype="e2m1", global_scale=tg).numpy(), back)


def test_the_kernels_e2m1_rounding_matches_the_spec():
    # kernels/common.cuh e2m1_magnitude (and the sign, bit 3, from the input), transcribed:
    # k = (m >= 2) + (m >= 4), then the code is
    # RNE(m * 2^(1-k)) + 2k capped at 7, the rounding one float32 add of 1.5 * 2^23 (an FMA);
    # checked against the scalar model at every tie and midpoint, their neighbours, and a
    # sweep of random magnitudes
    def kernel_code(t):
        t = np.float32(t)
        m = np.abs(t)
        k = int(m >= 2) + int(m >= 4)
        step = np.uint32(0x40000000 - (k << 23)).view(np.float32)
        with np.errstate(over="ignore"):
            total = np.float32(np.float64(m) * np.float64(step) + 12582912.0)  # one rounding
        rounded = (int(total.view(np.uint32)) - 0x4B400000) & 0xFFFFFFFF
        return min(rounded + 2 * k, 7) | (8 if np.signbit(t) else 0)

    points = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0]
    values = []
    for p in points:
        for v in (np.float32(p), np.nextafter(np.float32(p), np.float32(0)),
                  np.nextafter(np.float32(p), np.float32(100))):  # fmt: skip
            values += [v, -v]
    rng = np.random.default_rng(5)
    values += list(np.exp(rng.uniform(-20, 5, 20000)).astype(np.float32))
    values += [np.float32(np.inf), np.float32(-np.inf), np.float32(1e-45), np.float32(3e38)]
    for v in values:
        assert kernel_code(v) == spec_model.e2m1_code(float(v)), v


FP4_OPTIONS = {
    "nvfp4": dict(group_size=16, dtype="e2m1", scale="e4m3", layout="blocked"),
    "mxfp4": dict(group_size=32, dtype="e2m1", scale="ue8m0", layout="row"),
}


# every option each FP4 format does not take, each kind of bad global_scale, and MXFP4's bad
# eps and scale_rule (it takes both)
@pytest.mark.parametrize(
    "fp4, kwargs, error, words",
    [
        ("nvfp4", dict(group_size=32), ValueError, "group_size: NVFP4 scales groups of 16"),
        ("nvfp4", dict(scale="float32"), ValueError, r"dtype='e2m1' takes scale='e4m3' \(NVFP4\)"),
        ("nvfp4", dict(scale="ue8m0"), ValueError, "group_size: MXFP4 scales groups of 32"),
        ("nvfp4", dict(dtype="e4m3"), ValueError, "it needs dtype='e2m1'"),
        ("nvfp4", dict(layout="row"), ValueError, "layout: NVFP4's e4m3 scales are written in the"),
        ("nvfp4", dict(pad_rows=True), ValueError, "pad_rows: not supported with dtype='e2m1'"),
        ("nvfp4", dict(scale_rule="floor"), ValueError, "scale_rule: not supported"),
        ("nvfp4", dict(eps=1e-3), ValueError, "eps: not supported"),
        ("nvfp4", dict(activation="silu_mul"), ValueError, "activation: not supported"),
        ("nvfp4", dict(masked_m=np.ones(2, np.int32)), ValueError, "masked_m: not supported"),
        ("nvfp4", dict(out=np.zeros((4, 32), np.uint8)), ValueError, "out: not supported"),
        ("nvfp4", dict(global_scale=0.0), ValueError, "global_scale: expected a positive finite"),
        ("nvfp4", dict(global_scale=float("nan")), ValueError, "global_scale: expected a positive"),
        ("nvfp4", dict(global_scale=-1.0), ValueError, "global_scale: expected a positive finite"),
        ("nvfp4", dict(global_scale=np.ones(2, np.float32)), ValueError, "one-element float32"),
        ("nvfp4", dict(global_scale=np.ones(1, np.float64)), ValueError, "one-element float32"),
        ("nvfp4", dict(global_scale=[1.0]), TypeError, "global_scale: expected a float or a one-"),
        ("mxfp4", dict(group_size=16), ValueError, "group_size: MXFP4 scales groups of 32"),
        ("mxfp4", dict(group_size=64), ValueError, "group_size: MXFP4 scales groups of 32"),
        ("mxfp4", dict(layout="col"), ValueError, "layout: MXFP4's ue8m0 scales are written in"),
        ("mxfp4", dict(layout="col_tma"), ValueError, "layout: MXFP4's"),
        ("mxfp4", dict(layout="packed"), ValueError, "layout: MXFP4's"),
        ("mxfp4", dict(layout="packed_row"), ValueError, "layout: MXFP4's"),
        ("mxfp4", dict(scale="float32"), ValueError, r"or scale='ue8m0' \(MXFP4\)"),
        ("mxfp4", dict(pad_rows=True), ValueError, r"pad_rows: not supported .*\(MXFP4\)"),
        ("mxfp4", dict(activation="silu_mul"), ValueError, "activation: not supported"),
        ("mxfp4", dict(norm=(np.ones(64, ml_dtypes.bfloat16), 1e-6)), ValueError, "norm: not supp"),
        ("mxfp4", dict(masked_m=np.ones(4, np.int32)), ValueError, r"masked_m: not supported with"),
        ("mxfp4", dict(expected_m=2), ValueError, "expected_m: not supported"),
        ("mxfp4", dict(global_scale=1.0), ValueError, "global_scale: only NVFP4"),
        ("mxfp4", dict(eps=0.0), ValueError, "eps: expected a positive"),
        ("mxfp4", dict(scale_rule="even"), ValueError, "scale_rule: expected one of"),
    ],
)
def test_fp4_refuses_what_it_does_not_do(fp4, kwargs, error, words):
    x = np.ones((4, 64), ml_dtypes.bfloat16)
    with pytest.raises(error, match=words):
        fgq.quantize(x, **(FP4_OPTIONS[fp4] | kwargs))


def test_nvfp4_input_checks():
    with pytest.raises(ValueError, match="NVFP4 needs K a multiple of 16"):
        fgq.quantize(np.ones((2, 24), np.float32), 16, dtype="e2m1", scale="e4m3",
                     layout="blocked")  # fmt: skip
    with pytest.raises(TypeError, match="x: expected one of"):
        fgq.quantize(np.ones((2, 32), np.int32), 16, dtype="e2m1", scale="e4m3", layout="blocked")
    with pytest.raises(ValueError, match="global_scale: only NVFP4"):
        fgq.quantize(np.ones((2, 32), np.float32), 32, global_scale=1.0)
    q, s, g = fgq.quantize(np.ones((2, 32), np.float32), 16, dtype="e2m1", scale="e4m3",
                           layout="blocked")  # fmt: skip
    with pytest.raises(ValueError, match="NVFP4 needs group_size=16 .* and its global_scale"):
        fgq.dequantize(q, s, 16, dtype="e2m1")
    with pytest.raises(ValueError, match="group_size=16 is NVFP4's: pass dtype='e2m1'"):
        fgq.dequantize(q, s, 16)
    with pytest.raises(ValueError, match="scales: blocked scales for K = 32"):
        fgq.dequantize(q, s[:, :2], 16, dtype="e2m1", global_scale=g)


# inputs where a -ftz comparison would call a subnormal amax or d zero (the kernel compares bits)
SUBNORMAL_CASES = [
    (np.full((1, 16), 5e-38, np.float32), "bfloat16", None),  # g saturates at FLT_MAX
    (np.full((2, 16), 1e-39, np.float32), "bfloat16", None),  # subnormal amax
    (np.full((1, 16), 6 * 2.0**-127, np.float32), "float32", 2.0**127),  # subnormal d
    (np.full((1, 32), 1e-45, np.float32), "float32", None),  # the smallest subnormal
]


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)  # the NumPy backend, and the GPU from both
@pytest.mark.parametrize("values, dtype, given", SUBNORMAL_CASES)  # SUBNORMAL_CASES says why
def test_nvfp4_subnormal_edges_follow_the_scalar_model(values, dtype, given, backend):
    # -ftz=true must not turn a subnormal amax or d into zero (the kernel compares bits): the
    # GPU writes the NumPy backend's bytes, and both what the scalar model says
    x = values.astype(getattr(ml_dtypes, dtype, None) or np.dtype(dtype))
    got = nvfp4_call(to_device(x, backend), given)
    want = nvfp4_call(x, given)  # the NumPy backend
    for name, a, b in zip(("q", "scales", "global"), got, want):
        assert_same_bytes(to_host_bytes(a), b, f"{name} ({backend} {dtype} {values[0, 0]})")
    outputs = [to_host(a) for a in got]
    g = float(outputs[2][0]) if given is None else given
    if given is None:
        assert outputs[2][0] == reference.nvfp4_global_scale(x)
    want_q, want_s = expected_nvfp4(x, g)
    assert np.array_equal(outputs[0], want_q) and np.array_equal(outputs[1], want_s)


def test_prepare_of_nvfp4_takes_device_arrays_only():
    # a prepared call binds GPU buffers (NVFP4's included); host arrays are named, not bound
    with pytest.raises(TypeError, match="x: prepare needs a cupy array or torch CUDA tensor"):
        fgq.prepare(np.ones((4, 32), np.float32), 16, dtype="e2m1", scale="e4m3",
                    layout="blocked")  # fmt: skip


@st.composite
def nvfp4_cases(draw):
    batched = draw(st.booleans())
    lead = (draw(st.integers(1, 3)),) if batched else ()
    rows = draw(st.integers(0 if not batched else 1, 9))
    groups = draw(st.integers(1, 5))
    scale = draw(st.one_of(st.none(), st.floats(2.0**-100, 2.0**100, width=32)))
    return dict(
        shape=(*lead, *((1,) if batched else ()), rows, groups * 16),
        dtype=draw(st.sampled_from(["bfloat16", "float16", "float32"])),
        given=scale,
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@settings(max_examples=150, deadline=None)
@given(nvfp4_cases())
def test_nvfp4_property(case):
    # any shape (batched or not, any rows, any count of 16-groups), dtype and global scale: the
    # NumPy backend writes what the scalar model and the spec's blocked offsets say
    x = nvfp4_inputs(np.random.default_rng(case["seed"]), case["shape"], case["dtype"])
    outputs = fgq.quantize(x, 16, dtype="e2m1", scale="e4m3", layout="blocked",
                           global_scale=case["given"])  # fmt: skip
    g = float(outputs[2][0]) if case["given"] is None else case["given"]
    want_q, want_s = expected_nvfp4(x, g)
    assert np.array_equal(outputs[0], want_q) and np.array_equal(outputs[1], want_s)


# the kernel on the GPU against the NumPy backend --------------------------------------------------


def poison_pool(lib: str, sizes) -> None:
    """Fill and free blocks of these byte sizes, so that the pool hands them out poisoned next:
    bytes a kernel leaves unwritten then show up as 0xAB (a best effort: the pools reuse freed
    blocks of the same size)."""
    if lib == "cupy":
        import cupy

        blocks = [cupy.full(n, 0xAB, cupy.uint8) for n in sizes]
    else:
        import torch

        blocks = [torch.full((n,), 0xAB, dtype=torch.uint8, device="cuda") for n in sizes]
    del blocks


def nvfp4_call(x, global_scale):
    return fgq.quantize(x, 16, dtype="e2m1", scale="e4m3", layout="blocked",
                        global_scale=global_scale)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("input_dtype", list(INPUT_TYPES))  # every input type
@pytest.mark.parametrize("lib", ["cupy", "torch"])  # both GPU libraries
def test_nvfp4_kernel_matches_the_numpy_backend(input_dtype, lib):
    rng = np.random.default_rng(len(input_dtype) + len(lib))
    shapes = [(1, 16), (5, 48), (129, 80), (2, 3, 64), (2, 130, 224), (1, 7168), (300, 2048),
              (4, 0), (3, 0, 32)]  # fmt: skip
    for shape in shapes:
        x = nvfp4_inputs(rng, shape, input_dtype)
        geometry = Geometry(shape, 16, "blocked", False)
        device_g = to_device(np.array([0.75], np.float32), lib)
        for device_given, host_given in ((None, None), (3.0, 3.0), (device_g, 0.75)):
            expected = nvfp4_call(x, host_given)
            for inputs in (to_device(x, lib), wider_rows(x, 64, lib, 32)):
                poison_pool(lib, (x.size // 2, geometry.scale_storage, 8))
                got = nvfp4_call(inputs, device_given)
                assert len(got) == len(expected)
                what = f"NVFP4 {lib} {input_dtype} {shape} global={host_given}"
                for name, a, b in zip(("q", "scales", "global"), got, expected):
                    assert tuple(a.shape) == b.shape, (what, name)
                    assert_same_bytes(to_host_bytes(a), b, f"{name} ({what})")
                got_g = got[2] if device_given is None else device_given
                back = fgq.dequantize(got[0], got[1], 16, dtype="e2m1", global_scale=got_g)
                host_g = expected[2] if device_given is None else host_given
                want = fgq.dequantize(expected[0], expected[1], 16, dtype="e2m1",
                                      global_scale=host_g)  # fmt: skip
                assert_same_bytes(to_host_bytes(back), np.asarray(want), f"dequantize ({what})")


@pytest.mark.gpu
def test_nvfp4_device_checks():
    import cupy

    x = cupy.zeros((4, 64), cupy.float32)
    with pytest.raises(ValueError, match="16-byte aligned base"):
        nvfp4_call(x[:, 1:33], 1.0)  # the base 4 bytes past an aligned address
    with pytest.raises(TypeError, match="global_scale: expected a float or a one-element"):
        nvfp4_call(x, np.ones(1, np.float32))  # a host array for a GPU call
    with pytest.raises(ValueError, match="global_scale: expected one float32 element"):
        nvfp4_call(x, cupy.ones(2, cupy.float32))
