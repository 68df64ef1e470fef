"""The modes that let a drop-in reproduce an upstream kernel (docs/spec.md, sections 2a, 3a, 3b,
3c and 4a): ``clamp_limit`` (the clamped SwiGLU), ``arithmetic="bfloat16"`` (vLLM's masked SiLU
kernel), ``"unfloored"`` (FlashInfer's MXFP8), ``"reciprocal"`` (vLLM's and FlashInfer's NVFP4
and MXFP4; DeepGEMM's FP8 weight blocks) and ``"multiplier"`` (torchao's blockwise FP8), on the
NumPy backend and on the GPU against it, bit for bit; ``packed_col`` (vLLM's masked scales for
any T)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from backends import NUMPY_AND_GPU, to_device, to_host_bytes
from helpers import PLAIN_PATHS, activations, force_path

import fp8_group_quant as fgq
from fp8_group_quant import activation, reference, spec_model

BF16 = ml_dtypes.bfloat16
NP_TYPES = {"bfloat16": BF16, "float16": np.float16, "float32": np.float32}


def _bf16(values) -> np.ndarray:
    return np.asarray(values, np.float32).astype(BF16).astype(np.float32)


# clamp_limit ------------------------------------------------------------------------------------


# 7.0 and 10.0 are gpt-oss's and DeepSeek-V4's limits; 7.3 is no bfloat16 value (rounded first)
@pytest.mark.parametrize("limit", [7.0, 10.0, 7.3])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_clamp_limit_quantizes_the_clamped_gate_and_up(dtype, limit):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 512)) * 8).astype(NP_TYPES[dtype])
    q, s = fgq.quantize(x, 128, activation="silu_mul", clamp_limit=limit)
    lx = np.float32(np.float32(limit).astype(NP_TYPES[dtype]))
    gate, up = x[:, :256].astype(np.float32), x[:, 256:].astype(np.float32)
    assert (gate > lx).any() and (np.abs(up) > lx).any()  # both clamps bind
    clamped = np.concatenate([np.minimum(gate, lx), np.clip(up, -lx, lx)], axis=-1)
    q_ref, s_ref = fgq.quantize(clamped.astype(NP_TYPES[dtype]), 128, activation="silu_mul")
    np.testing.assert_array_equal(q.view(np.uint8), q_ref.view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)
    unclamped, _ = fgq.quantize(x, 128, activation="silu_mul")
    assert (unclamped.view(np.uint8) != q.view(np.uint8)).any()


def test_clamp_limit_keeps_nan_and_clamps_infinities():
    gate = np.array([np.nan, np.inf, -np.inf, 3.0], np.float32)
    up = np.array([1.0, 1.0, -np.inf, np.inf], np.float32)
    g, u = activation.clamp_gate_up(gate, up, 7.0, "float32")
    assert np.isnan(g[0]) and g[1] == 7.0 and g[2] == -np.inf and g[3] == 3.0
    assert u[2] == -7.0 and u[3] == 7.0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"clamp_limit": 7.0}, ValueError, "gated activation"),  # without an activation
        ({"clamp_limit": -1.0, "activation": "silu_mul"}, ValueError, "positive finite"),
        ({"clamp_limit": float("inf"), "activation": "silu_mul"}, ValueError, "positive"),
        ({"clamp_limit": True, "activation": "silu_mul"}, TypeError, "clamp_limit"),
        ({"arithmetic": "float16"}, ValueError, "arithmetic"),
        ({"arithmetic": "bfloat16", "dtype": "int8"}, ValueError, "FP8 dtype"),
        ({"arithmetic": "reciprocal"}, ValueError, "FP4's"),  # FP8 takes it in quantize_weight
        ({"arithmetic": "multiplier", "dtype": "e5m2"}, ValueError, "dtype='e5m2'"),
        ({"arithmetic": "multiplier", "scale": "ue8m0"}, ValueError, "scale='ue8m0'"),
        ({"arithmetic": "multiplier", "eps": 1e-20}, ValueError, "eps=1e-20"),  # below 2**-64
        ({"arithmetic": "multiplier", "group_size": 64}, ValueError, "group_size=64"),
        ({"arithmetic": "multiplier", "activation": "silu_mul"}, ValueError, "fused=True"),
        ({"arithmetic": "unfloored"}, ValueError, "group_size=128"),  # MX groups are 32
        ({"arithmetic": "unfloored", "group_size": 32, "dtype": "e5m2", "scale": "ue8m0"},
         ValueError, "dtype='e5m2'"),
        ({"arithmetic": "unfloored", "group_size": 32, "scale": "ue8m0", "eps": 1e-6},
         ValueError, "eps=1e-06"),
        ({"arithmetic": "unfloored", "group_size": 32, "scale": "ue8m0",
          "activation": "silu_mul"}, ValueError, "fused=True"),
        ({"arithmetic": "reciprocal", "group_size": 32, "dtype": "e2m1", "scale": "ue8m0",
          "eps": 1e-6}, ValueError, "floors nothing"),
        ({"arithmetic": "bfloat16", "group_size": 16, "dtype": "e2m1", "scale": "e4m3",
          "layout": "blocked"}, ValueError, "takes 'float32' or 'reciprocal'"),
        ({"group_size": 32, "dtype": "e2m1", "scale": "ue8m0", "global_scale": 2.0},
         ValueError, "MXFP4 with arithmetic='reciprocal'"),
    ],
)  # fmt: skip
def test_mode_options_are_checked(kwargs, error, match):
    x = np.zeros((2, 256), BF16)
    kwargs = {"group_size": 128, **kwargs}
    with pytest.raises(error, match=match):
        fgq.quantize(x, kwargs.pop("group_size"), **kwargs)


def test_unfloored_refuses_the_masked_layout():
    with pytest.raises(ValueError, match="masked_m: arithmetic='unfloored'"):
        fgq.quantize(np.zeros((2, 4, 64), BF16), 32, scale="ue8m0", arithmetic="unfloored",
                     masked_m=np.array([4, 1], np.int32))  # fmt: skip
    with pytest.raises(ValueError, match="masked_m: arithmetic='multiplier'"):
        fgq.quantize(np.zeros((2, 4, 128), BF16), 128, arithmetic="multiplier",
                     masked_m=np.array([4, 1], np.int32))  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"arithmetic": "bfloat16"}, "quantize_weight takes one of"),
        ({"arithmetic": "reciprocal", "scale": "ue8m0"}, "scale='ue8m0'"),
        ({"arithmetic": "multiplier", "dtype": "e5m2"}, "dtype='e5m2'"),
        ({"arithmetic": "reciprocal", "eps": 2.0**-65}, "eps >= 2\\*\\*-64"),
    ],
)
def test_weight_arithmetic_is_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fgq.quantize_weight(np.zeros((4, 128), BF16), **kwargs)


def test_bfloat16_arithmetic_needs_bfloat16_input():
    with pytest.raises(TypeError, match="bfloat16 input"):
        fgq.quantize(np.zeros((2, 128), np.float16), 128, arithmetic="bfloat16")


@pytest.mark.parametrize("orientation", ["col", "both"])
@pytest.mark.parametrize("group_size", [128, 256])
def test_bfloat16_arithmetic_is_row_wise_only(orientation, group_size, fake_gpu):
    # the column kernels have no bfloat16 steps: refused on both backends, before any launch,
    # so that neither answers with section 3's arithmetic where 3a's was asked
    from fake_gpu import fake

    for array in (np.ones((256, 512), BF16), fake((256, 512), "bfloat16")):
        with pytest.raises(ValueError, match="arithmetic='bfloat16'.*orientation='row'"):
            fgq.quantize(array, group_size, orientation=orientation, arithmetic="bfloat16")
    assert not fake_gpu.plans and not fake_gpu.launches


# arithmetic="bfloat16" ----------------------------------------------------------------------------


def test_log2_of_every_bfloat16_scale_is_far_from_a_rounding_boundary():
    # section 3a: ceil(B(log2 s)) must not depend on which float32 log2 computes it; the
    # boundaries that move the ceiling are the midpoints next to an integer
    bits = np.arange(0x0080, 0x7F80, dtype=np.uint16)  # every positive normal bfloat16
    s = bits.view(BF16).astype(np.float64)
    exact = np.log2(s)
    k = np.round(exact)
    kb = k.astype(np.float32).astype(BF16)
    neighbour = np.where(exact > k, np.nextafter(kb, BF16(np.inf)), np.nextafter(kb, BF16(-np.inf)))
    margin = np.abs(exact - (k + neighbour.astype(np.float64)) / 2)[exact != k]
    assert margin.min() > 8e-4, margin.min()
    # so a float32 log2 off by up to 8 ulp gives the same ceiling
    ceiling = np.ceil(_bf16(exact.astype(np.float32)))
    f32 = np.log2(s.astype(np.float32)).astype(np.float32)
    for ulps in range(-8, 9):
        moved = (f32.view(np.int32) + ulps).view(np.float32)
        moved = np.where(f32 == 0, f32, moved)
        np.testing.assert_array_equal(np.ceil(_bf16(moved)), ceiling)


def test_bfloat16_arithmetic_rounds_the_logarithm_to_bfloat16():
    # a group of maximum 448 * 2^-5 * 1.0078125 has s = 2^-5 * 1.0078125: log2(s) = -4.9888
    # rounds to -5 in bfloat16, so the scale is 2^-5 and that value saturates to 448
    amax = np.float32(448 * 2**-5 * 1.0078125)
    x = np.full((1, 128), 0.5, np.float32)
    x[0, 0] = amax
    q, s = fgq.quantize(x.astype(BF16), 128, scale="ue8m0", arithmetic="bfloat16")
    assert s[0, 0] == np.float32(2**-5)
    assert q.view(np.uint8)[0, 0] == 0x7E  # 448, saturated
    q_ceil, s_ceil = fgq.quantize(x.astype(BF16), 128, scale="ue8m0")
    assert s_ceil[0, 0] == np.float32(2**-4)  # section 3's exact ceiling


def test_bfloat16_arithmetic_known_float_scale():
    # amax 100: s = B(100 * B(1/448)) = B(0.22278) = 0.22265625 (section 3: RN(100 / 448));
    # r = B(1 / s) = B(4.4912) = 4.5, so 100 scales to 450 and saturates to 448 (0x7E)
    x = np.full((1, 128), 10.0, np.float32)
    x[0, 0] = 100.0
    q, s = fgq.quantize(x.astype(BF16), 128, arithmetic="bfloat16")
    assert _bf16(np.float32(1) / np.float32(448)).view(np.uint32) >> 16 == 0x3B12
    assert s[0, 0] == np.float32(0.22265625)
    codes = q.view(np.uint8)[0]
    assert codes[0] == 0x7E and codes[1] == np.float32(45).astype(ml_dtypes.float8_e4m3fn).view(
        np.uint8)  # 10 * 4.5 = 45, exact  # fmt: skip
    _, s_default = fgq.quantize(x.astype(BF16), 128)
    assert s_default[0, 0] == np.float32(100) / np.float32(448)


def test_bfloat16_groups_match_a_step_by_step_model():
    rng = np.random.default_rng(3)
    values = _bf16(activations(rng, (64, 128), "float32") * 50)
    for power in (False, True):
        codes, scales, _ = reference.bfloat16_groups(values, _e4m3(), power, 1e-10)
        for row in range(0, 64, 9):
            v = values[row]
            amax = max(np.abs(v).max(), _bf16(np.float32(1e-10)))
            s = _bf16(amax * _bf16(np.float32(1) / np.float32(448)))
            if power:
                s = np.float32(2.0 ** np.ceil(_bf16(np.log2(s))))
            t = _bf16(v * _bf16(np.float32(1) / s))
            expected = np.clip(t, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
            assert scales[row] == s
            np.testing.assert_array_equal(codes[row], expected)


def _e4m3():
    from fp8_group_quant._spec import output_format

    return output_format("e4m3")


# the GPU against the NumPy backend ----------------------------------------------------------------


# both modes on each kernel path that takes them: one pass, and the masked persistent grid
@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("scale, layout", [("float32", "col"), ("ue8m0", "col"),
                                           ("ue8m0", "packed_col")])  # fmt: skip
@pytest.mark.parametrize("masked", [False, True])
def test_modes_on_every_backend_match_the_numpy_backend(backend, scale, layout, masked):
    rng = np.random.default_rng(11)
    y = (activations(rng, (3, 5, 2 * 384), "float32", specials=True) * 12).astype(BF16)
    counts = np.array([5, 0, 3], np.int32)
    options = dict(scale=scale, layout=layout, activation="silu_mul", clamp_limit=7.0,
                   arithmetic="bfloat16", masked_m=counts if masked else None)  # fmt: skip
    q_ref, s_ref = fgq.quantize(y, 128, **options)
    if masked:
        options["masked_m"] = to_device(counts, backend)
    q, s = fgq.quantize(to_device(y, backend), 128, **options)
    got_q = to_host_bytes(q).reshape(3, 5, -1)
    got_s = to_host_bytes(s).reshape(3, 5, -1)
    want_q = to_host_bytes(q_ref).reshape(3, 5, -1)
    want_s = to_host_bytes(s_ref).reshape(3, 5, -1)
    rows = counts if masked else [5, 5, 5]
    for e, n in enumerate(rows):
        np.testing.assert_array_equal(got_q[e, :n], want_q[e, :n])
        np.testing.assert_array_equal(got_s[e, :n], want_s[e, :n])


# norm_rounding="twice" (vLLM's RMSNorm rounds x * r to x's dtype before the weight) ---------------


def test_norm_rounding_twice_rounds_before_the_weight():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((4, 1024)) / 32).astype(BF16)
    w = (1 + rng.standard_normal(1024) / 10).astype(BF16)
    y, _ = activation.rms_norm(x, w, 1e-6, "bfloat16", rounding="twice")
    # the steps of section 2b with the extra rounding, for each row
    r = activation.rsqrt(
        (activation.sum_of_squares(x.astype(np.float32), 2) / np.float32(1024)) + np.float32(1e-6)
    )
    expected = _bf16(_bf16(x.astype(np.float32) * r[:, None]) * w.astype(np.float32))
    np.testing.assert_array_equal(y, expected)
    once, _ = activation.rms_norm(x, w, 1e-6, "bfloat16")
    assert (once != y).any()  # the two roundings differ somewhere
    q, s = fgq.quantize(x, 128, norm=(w, 1e-6), norm_rounding="twice")
    q_ref, s_ref = fgq.quantize(y.astype(BF16), 128)
    np.testing.assert_array_equal(q.view(np.uint8), q_ref.view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)
    with pytest.raises(ValueError, match="norm_rounding"):
        fgq.quantize(x, 128, norm_rounding="twice")


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_norm_rounding_twice_on_every_backend(backend, dtype):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((6, 2048)) / 16).astype(NP_TYPES[dtype])
    w = (1 + rng.standard_normal(2048) / 10).astype(NP_TYPES[dtype])
    q_ref, s_ref = fgq.quantize(x, 128, norm=(w, 1e-6), norm_rounding="twice")
    q, s = fgq.quantize(to_device(x, backend), 128, norm=(to_device(w, backend), 1e-6),
                        norm_rounding="twice")  # fmt: skip
    np.testing.assert_array_equal(to_host_bytes(q), to_host_bytes(q_ref))
    np.testing.assert_array_equal(to_host_bytes(s), to_host_bytes(s_ref))


# arithmetic="unfloored" (FlashInfer's MXFP8, section 3b) -----------------------------------------

E4M3_MAX_BITS = int(np.float32(448).view(np.uint32))
TINY = np.float32(448 * 2.0**-127)  # fmax * 2^-127: the quotient's 2^-127


def _unfloored(groups) -> tuple[np.ndarray, np.ndarray]:
    """(codes [n, 32], exponent bytes [n]) of float32 groups by the mode."""
    q, s = fgq.quantize(np.asarray(groups, np.float32), 32, scale="ue8m0",
                        arithmetic="unfloored")  # fmt: skip
    return q.view(np.uint8), (s.view(np.uint32) >> 23).reshape(-1)


def test_unfloored_known_answers():
    step = lambda v, k: (np.float32(v).view(np.uint32) + k).view(np.float32)  # noqa: E731
    rows = np.zeros((7, 32), np.float32)
    rows[1, :2] = (448.0, -1.0)  # the ceiling of 1.0 is exact: byte 127, codes 448 and -1
    rows[2, :2] = (np.inf, 1.0)  # Inf enters the maximum: byte 254, 1 * 2^-127 codes 0
    rows[3, :2] = (np.nan, 1.0)  # NaN does not: 1 / 448 rounds up to 2^-8, byte 119, 1 -> 256
    rows[4, :2] = (TINY, -TINY)  # the quotient is 2^-127: byte 0, codes +0 and -0
    rows[5, 0] = step(TINY, 1)  # one step above: still rounds to 2^-127 (byte 0)
    rows[6, 0] = step(TINY, 2)  # two steps: rounds above it, byte 1 (scale 2^-126)
    codes, exponents = _unfloored(rows)
    assert exponents.tolist() == [0, 127, 254, 119, 0, 0, 1]
    assert not codes[0].any() and not codes[4, 2:].any() and codes[4, 1] == 0x80
    assert codes[1, :2].tolist() == [0x7E, 0xB8] and codes[2, :2].tolist() == [0x7E, 0x00]
    assert codes[3, :2].tolist() == [0x7F, 0x78] and codes[6, 0] == 0x76  # +NaN, 256; 224
    assert not codes[5].any()
    _, default = fgq.quantize(rows, 32, scale="ue8m0")
    assert (default.view(np.uint32) >> 23).reshape(-1)[0] == 0x5E  # section 3 floors at 1e-10


def _kernel_exponent(amax: np.ndarray) -> np.ndarray:
    """kernels/group.cuh's unfloored_exponent, transcribed: from amax's bits, no division."""
    a = np.asarray(amax, np.float32).view(np.uint32).astype(np.int64)
    f = E4M3_MAX_BITS
    ceiling = (a >> 23) - ((f >> 23) - 127) + ((a & 0x7FFFFF) > (f & 0x7FFFFF))
    small = np.where(a >= f - (127 << 23) + 2, 1, 0)
    normal = np.maximum(ceiling, 0)  # ue8m0_exponent with a floor of 0.0
    return np.where(a >= 0x7F800000, 254, np.where(a >= f - (126 << 23), normal, small))


def test_the_kernels_exponent_equals_the_division():
    # every non-negative bfloat16 and float16 maximum (subnormals, +Inf) and float32 maxima
    # around both thresholds and over every binade, against section 3b's RN(amax / 448)
    bf16 = (np.arange(0, 0x7F81, dtype=np.uint32) << 16).view(np.float32)
    f16 = np.arange(0, 0x7C01, dtype=np.uint16).view(np.float16).astype(np.float32)
    tiny = int(TINY.view(np.uint32))  # and fmax * 2^-126, one binade up
    near = np.concatenate([np.arange(-64, 65) + b for b in (tiny, tiny + (1 << 23))])
    rng = np.random.default_rng(5)
    spread = rng.integers(0, 0x7F800000, 200_000, dtype=np.int64)
    f32 = np.concatenate([near, spread]).astype(np.uint32).view(np.float32)
    for amax in (bf16, f16, f32):
        groups = np.zeros((amax.size, 32), np.float32)
        groups[:, 0] = amax
        exponents = reference.unfloored_groups(groups, _e4m3())[2]
        np.testing.assert_array_equal(_kernel_exponent(amax), exponents)


# the MXFP8 drop-in's shapes on both layouts and the GPU's paths, with zero, subnormal and
# non-finite groups
@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("layout", ["blocked", "row"])
@pytest.mark.parametrize("path", sorted(PLAIN_PATHS))
def test_unfloored_on_every_backend_matches_the_numpy_backend(backend, dtype, layout, path):
    rng = np.random.default_rng(13)
    x = activations(rng, (131, 320), "float32", specials=True) * 16
    x[5:9] *= np.float32(1e-38)  # subnormal scales
    x[9:12] *= np.float32(1e-41)
    x[12, :64] = 0.0
    x[13, 32:64] = np.inf
    with np.errstate(over="ignore"):  # the specials' largest values are Inf in float16
        x = x.astype(NP_TYPES[dtype])
    options = dict(scale="ue8m0", layout=layout, arithmetic="unfloored")
    given = to_device(x, backend)
    ahead = np.concatenate([x.reshape(-1)[:1], x.reshape(-1)])  # x one element further on
    unaligned = to_device(ahead, backend)[1:].reshape(x.shape)
    # contiguous rows, rows K apart in a wider one, a base off 16 bytes: each kernel path
    for array, values in ((given, x), (given[:, 32:], x[:, 32:]), (unaligned, x)):
        with force_path(**PLAIN_PATHS[path]):
            q, s = fgq.quantize(array, 32, **options)
        want_q, want_s = fgq.quantize(np.ascontiguousarray(values), 32, **options)
        np.testing.assert_array_equal(to_host_bytes(q), to_host_bytes(want_q))
        np.testing.assert_array_equal(to_host_bytes(s), to_host_bytes(want_s))
    bytes_ = _unfloored(x.astype(np.float32).reshape(-1, 32))[1]
    assert (bytes_ == 0).any() and (bytes_ == 254).any()  # zero and infinite groups were met


# arithmetic="reciprocal" (vLLM's and FlashInfer's NVFP4 and MXFP4, section 4a) ------------------


def test_reciprocal_known_answers():
    # NVFP4, g = 1: amax 45/256 gives S = 15/512 in both arithmetics; 75/2048 / S = 1.25 is a
    # tie that goes to 1 (code 2), but 75/2048 * RN(512/15) = 1.2500001 rounds to 1.5 (code 3)
    x = np.zeros((1, 16), np.float32)
    x[0, :2] = (45 / 256, 75 / 2048)
    options = dict(dtype="e2m1", scale="e4m3", layout="blocked", global_scale=1.0)
    q, s = fgq.quantize(x, 16, arithmetic="reciprocal", **options)
    q_default, s_default = fgq.quantize(x, 16, **options)
    assert s.reshape(-1)[0] == s_default.reshape(-1)[0] == np.float32(15 / 512).astype(
        ml_dtypes.float8_e4m3fn).view(np.uint8)  # fmt: skip
    assert q[0, 0] >> 4 == 3 and q_default[0, 0] >> 4 == 2
    # MXFP4 with a global scale 3: u = RN(3 * RN(1/6)) = 0.5 (byte 126), c = RN(0.5 * RN(1/3)),
    # 1 * RN(1 / c) = 5.9999998 rounds to 6 (code 7); without it, 1 / 0.25 = 4 (code 6)
    y = np.zeros((1, 32), np.float32)
    y[0, 0] = 1.0
    q4, s4 = fgq.quantize(y, 32, dtype="e2m1", scale="ue8m0", layout="row", global_scale=3.0,
                          arithmetic="reciprocal")  # fmt: skip
    assert s4[0, 0] == 0.5 and q4[0, 0] & 0xF == 7
    q1, s1 = fgq.quantize(y, 32, dtype="e2m1", scale="ue8m0", layout="row",
                          arithmetic="reciprocal")  # fmt: skip
    assert s1[0, 0] == 0.25 and q1[0, 0] & 0xF == 6  # no global scale: 1


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("fp4, layout", [("e4m3", "blocked"), ("ue8m0", "blocked"),
                                         ("ue8m0", "row")])  # fmt: skip
@pytest.mark.parametrize("on_device", [False, True])  # the global scale a number or an array
def test_reciprocal_on_every_backend_matches_the_numpy_backend(backend, dtype, fp4, layout,
                                                               on_device):  # fmt: skip
    rng = np.random.default_rng(17)
    with np.errstate(over="ignore"):  # the specials' largest values are Inf in float16
        x = (activations(rng, (130, 192), "float32", specials=True) * 4).astype(NP_TYPES[dtype])
    g = reference.nvfp4_global_scale(x)
    group = 16 if fp4 == "e4m3" else 32
    options = dict(dtype="e2m1", scale=fp4, layout=layout, arithmetic="reciprocal")
    q_ref, s_ref = fgq.quantize(x, group, global_scale=float(g), **options)
    given = to_device(np.array([g], np.float32), backend) if on_device else float(g)
    q, s = fgq.quantize(to_device(x, backend), group, global_scale=given, **options)
    np.testing.assert_array_equal(to_host_bytes(q), to_host_bytes(q_ref))
    np.testing.assert_array_equal(to_host_bytes(s), to_host_bytes(s_ref))


# arithmetic="reciprocal" and "multiplier" of FP8 (DeepGEMM's and torchao's, section 3c) --------

PRODUCT_MODES = ("reciprocal", "multiplier")


def _weight_results(w: np.ndarray) -> dict:
    """(codes of row 0 as a tuple, the first block's scale bits) of ``w`` by each arithmetic."""
    results = {}
    for mode in ("float32", *PRODUCT_MODES):
        q, s = fgq.quantize_weight(w, arithmetic=mode)
        results[mode] = (tuple(int(c) for c in q.view(np.uint8)[0]), int(s.view(np.uint32)[0, 0]))
    return results


def test_product_arithmetic_known_answers():
    # amax 13: section 3 scales 39/4096 and 13/65536 to exact ties, 0.328125 (between 0x2A and
    # 0x2B) and 3.5 * 2^-9 (between the subnormals 0x03 and 0x04), which go to the even codes.
    # "multiplier" keeps the scale RN(13/448) and multiplies by RN(448/13), a hair above 448/13:
    # 0x2B. "reciprocal" rounds the scale one ulp up, RN(13 * RN(1/448)), and multiplies by its
    # reciprocal, a hair below: 0x03
    w = np.zeros((3, 3), np.float32)
    w[0] = (13.0, 39 / 4096, 13 / 65536)
    default = (np.float32(13) / np.float32(448)).view(np.uint32)
    assert _weight_results(w) == {"float32": ((0x7E, 0x2A, 0x04), default),
                                  "reciprocal": ((0x7E, 0x2A, 0x03), default + 1),
                                  "multiplier": ((0x7E, 0x2B, 0x04), default)}  # fmt: skip
    # amax 11: both modes' scales one ulp above RN(11/448)
    w[0] = (11.0, 0.0, 0.0)
    default = (np.float32(11) / np.float32(448)).view(np.uint32)
    assert {mode: bits for mode, (_, bits) in _weight_results(w).items()} == {
        "float32": default, "reciprocal": default + 1, "multiplier": default + 1}  # fmt: skip
    # the same arithmetic row-wise and column-wise (torchao's lhs and rhs groups)
    x = np.zeros((128, 128), np.float32)
    x[0, :2] = (13.0, 39 / 4096)
    q, _ = fgq.quantize(x, 128, arithmetic="multiplier")
    qt, _ = fgq.quantize(np.ascontiguousarray(x.T), 128, orientation="col", arithmetic="multiplier")
    assert q.view(np.uint8)[0, 1] == qt.view(np.uint8)[0, 1] == 0x2B


def _plant_known_groups(x: np.ndarray, rows: slice, cols: slice, step: int) -> None:
    """Two groups of the known answers above at the start of ``x[rows, cols]``: 13, 39/4096
    and 13/65536 (codes each mode moves), then ``step`` values on, 11 (a scale both move)."""
    x[rows, cols] = 0.0
    flat = x[rows, cols].reshape(-1)
    flat[:3], flat[step] = (13.0, 39 / 4096, 13 / 65536), 11.0
    x[rows, cols] = flat.reshape(x[rows, cols].shape)


def test_torchaos_float64_multiplier_is_the_float32_quotient():
    # torchao takes 448 / amax in float64 (torch computes it as RN64(1 / amax) * 448) and rounds
    # it to float32: section 3c's RN(448 / amax), for every float32 mantissa (the quotient's
    # rounding depends on amax's mantissa alone while it stays normal), and for its EPS floor
    # applied in float64 (1e-12) or in float32
    amax = (np.arange(2**23, dtype=np.uint32) | np.uint32(0x3F800000)).view(np.float32)
    torchao = ((1.0 / amax.astype(np.float64)) * 448.0).astype(np.float32)
    np.testing.assert_array_equal(torchao, np.float32(448) / amax)
    assert np.float32(448.0 / 1e-12) == np.float32(448) / np.float32(1e-12)


def test_deepgemms_cuda_scale_rounds_up_to_section_3s_power_of_two():
    # DeepGEMM's UE8M0 scale is the power of two above RN(amax * RN(1/448)) (torch on CUDA),
    # section 3's the one above RN(amax / 448): the same for every float32 mantissa, while an
    # ulp apart for half of them as float scales
    amax = (np.arange(2**23, dtype=np.uint32) | np.uint32(0x3F800000)).view(np.float32)
    product = (amax * (np.float32(1) / np.float32(448))).astype(np.float32).view(np.uint32)
    quotient = (amax / np.float32(448)).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal((product + 0x7FFFFF) >> 23, (quotient + 0x7FFFFF) >> 23)
    assert 0.5 < np.mean(product != quotient) < 0.6


# random groups with the specials and the known answers, and a tiny eps (1e-19, above 2**-64)
# that the subnormal runs reach: the scalar model of section 3c against the NumPy backend, rows,
# columns and weights
@pytest.mark.parametrize("mode", PRODUCT_MODES)
@pytest.mark.parametrize("eps", [1e-10, 1e-19])
def test_product_arithmetic_matches_the_scalar_model(mode, eps):
    rng = np.random.default_rng(19)
    x = activations(rng, (5, 256), "float32", specials=True)
    w = activations(rng, (130, 260), "float32", specials=True)
    _plant_known_groups(x, slice(0, 2), slice(0, 128), 128)
    _plant_known_groups(w, slice(128, 130), slice(128, 260), 128)  # two partial blocks
    want_q, want_s = spec_model.quantize_weight(w, "e4m3", "float32", eps, arithmetic=mode)
    q, s = fgq.quantize_weight(w, eps=eps, arithmetic=mode)
    np.testing.assert_array_equal(q.view(np.uint8), want_q[0])
    np.testing.assert_array_equal(s, want_s[0].astype(np.float32))
    default_q, default_s = fgq.quantize_weight(w, eps=eps)
    assert (default_q.view(np.uint8) != q.view(np.uint8)).any() and (default_s != s).any()
    if mode != "multiplier":  # quantize takes "multiplier" only
        return
    want_q, want_s = spec_model.quantize(x, 128, "e4m3", "float32", eps, arithmetic=mode)
    q, s = fgq.quantize(x, 128, eps=eps, arithmetic=mode)
    np.testing.assert_array_equal(q.view(np.uint8), want_q)
    np.testing.assert_array_equal(s, want_s.astype(np.float32))
    default_q, default_s = fgq.quantize(x, 128, eps=eps)
    assert (default_q.view(np.uint8) != q.view(np.uint8)).any() and (default_s != s).any()
    tokens = np.ascontiguousarray(w[:200, :256])  # a partial last token group
    want_q, want_s = spec_model.quantize_columns(tokens, 128, "e4m3", "float32", eps,
                                                 arithmetic=mode)  # fmt: skip
    q, s = fgq.quantize(tokens, 128, orientation="col", eps=eps, arithmetic=mode)
    np.testing.assert_array_equal(q.view(np.uint8), want_q)
    np.testing.assert_array_equal(s, want_s.astype(np.float32))


def _random_with_specials(shape, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    with np.errstate(over="ignore"):  # the specials' largest values are Inf in float16
        return (activations(rng, shape, "float32", specials=True) * 4).astype(NP_TYPES[dtype])


# torchao's act_quant_lhs groups on the GPU's paths (one pass, row loop; contiguous, a view of
# a wider row, an unaligned base) in every float layout
@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("group_size", [128, 256])
@pytest.mark.parametrize("layout", ["row", "col", "col_tma"])
@pytest.mark.parametrize("path", sorted(PLAIN_PATHS))
def test_multiplier_rows_on_every_backend_match_the_numpy_backend(backend, dtype, group_size,
                                                                  layout, path):  # fmt: skip
    x = _random_with_specials((37, 768), dtype, 23)
    options = dict(layout=layout, eps=1e-12, arithmetic="multiplier")
    given = to_device(x, backend)
    ahead = np.concatenate([x.reshape(-1)[:1], x.reshape(-1)])  # x one element further on
    unaligned = to_device(ahead, backend)[1:].reshape(x.shape)
    for array, values in ((given, x), (given[:, 256:], x[:, 256:]), (unaligned, x)):
        with force_path(**PLAIN_PATHS[path]):
            q, s = fgq.quantize(array, group_size, **options)
        want_q, want_s = fgq.quantize(np.ascontiguousarray(values), group_size, **options)
        np.testing.assert_array_equal(to_host_bytes(q), to_host_bytes(want_q))
        np.testing.assert_array_equal(to_host_bytes(s), to_host_bytes(want_s))


# torchao's act_quant_rhs and transposed_lhs (column-wise), and "both" (the row-wise groups of
# the column kernel), with a partial last token group
@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("orientation", ["col", "both"])
def test_multiplier_columns_on_every_backend_match_the_numpy_backend(backend, dtype,
                                                                     orientation):  # fmt: skip
    x = _random_with_specials((300, 384), dtype, 29)
    options = dict(layout="col", eps=1e-12, orientation=orientation, arithmetic="multiplier")
    got = fgq.quantize(to_device(x, backend), 128, **options)
    want = fgq.quantize(x, 128, **options)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(to_host_bytes(g), to_host_bytes(w))


# DeepGEMM's and torchao's weight blocks: partial edge blocks, experts, both float layouts
@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("mode", PRODUCT_MODES)
@pytest.mark.parametrize("layout", ["row", "col"])
def test_product_weights_on_every_backend_match_the_numpy_backend(backend, dtype, mode, layout):
    w = _random_with_specials((2, 200, 300), dtype, 31)
    options = dict(layout=layout, eps=1e-4, arithmetic=mode)
    q, s = fgq.quantize_weight(to_device(w, backend), **options)
    want_q, want_s = fgq.quantize_weight(w, **options)
    np.testing.assert_array_equal(to_host_bytes(q), to_host_bytes(want_q))
    np.testing.assert_array_equal(to_host_bytes(s), to_host_bytes(want_s))
