"""The NumPy backend against hand-checked answers and an independent scalar model of SPEC 3."""

import ml_dtypes
import numpy as np
import pytest
from helpers import activations

import fp8_group_quant as fgq
from fp8_group_quant import reference
from fp8_group_quant._spec import OUTPUT_FORMATS
from fp8_group_quant.spec_model import scalar_group

FORMATS = tuple(OUTPUT_FORMATS)  # every registered format


def codes(q):
    return np.asarray(q).view(np.uint8)


def group(values, k=128, dtype=np.float32):
    row = np.zeros((1, k), np.float32)
    row[0, : len(values)] = values
    return row.astype(dtype)


# known answers ----------------------------------------------------------------------------------


def test_all_zero_group_gives_exponent_0x5e_and_zero_codes():
    q, s = fgq.quantize_packed(np.zeros((1, 128), ml_dtypes.bfloat16))
    assert int(s[0, 0]) == 0x5E
    assert not codes(q).any()


def test_constant_672_gives_scale_2_and_code_320():
    q, s = fgq.quantize_packed(np.full((1, 128), 672.0, ml_dtypes.bfloat16))
    assert int(s[0, 0]) == 0x80
    assert set(np.asarray(q).astype(np.float32).ravel()) == {320.0}  # 336 rounds to even


def test_constant_672_with_float_scales_reaches_fmax():
    q, s = fgq.quantize(np.full((1, 128), 672.0, np.float32))
    assert s[0, 0] == np.float32(1.5)
    assert set(np.asarray(q).astype(np.float32).ravel()) == {448.0}


@pytest.mark.parametrize("fmt", FORMATS)
def test_non_finite_values_do_not_touch_their_neighbours(fmt):
    # NaN keeps its sign (int8: 0); Inf saturates (e5m2: stays Inf); the rest ignores them
    values = [np.nan, -np.nan, np.inf, -np.inf, 2.0, -1.0, 0.5]
    q, s = fgq.quantize(group(values), dtype=fmt)
    clean_q, clean_s = fgq.quantize(group([0, 0, 0, 0, 2.0, -1.0, 0.5]), dtype=fmt)
    assert s[0, 0] == clean_s[0, 0] == np.float32(2.0) / np.float32(OUTPUT_FORMATS[fmt].fmax)
    got, clean = codes(q)[0], codes(clean_q)[0]
    np.testing.assert_array_equal(got[4:], clean[4:])
    expected = {
        "e4m3": [0x7F, 0xFF, 0x7E, 0xFE],
        "e5m2": [0x7E, 0xFE, 0x7C, 0xFC],
        "int8": [0x00, 0x00, 0x7F, 0x81],
        "e4m3fnuz": [0x80, 0x80, 0x7E, 0xFE],  # one unsigned NaN; Inf saturates to +-224
    }[fmt]
    assert list(got[:4]) == expected


def test_all_non_finite_group_uses_eps():
    q, s = fgq.quantize(group([np.nan] * 128), scale="ue8m0", layout="packed")
    assert int(s[0, 0]) == 0x5E
    assert set(codes(q)[0]) == {0x7F}


def test_e4m3fnuz_clamps_at_224_and_has_no_negative_zero():
    # amax 224 makes the float scale 0.5 (codes are v / 0.5); fnuz reaches 240 (0x7F), but the
    # clamp is 224 (0x7E) as on ROCm; negative values that round to zero give 0x00, never 0x80
    values = [224.0, -224.0, -1e-30, -0.0, 0.0, 1.0, -1.0]
    q, s = fgq.quantize(group(values), dtype="e4m3fnuz")
    assert q.dtype == ml_dtypes.float8_e4m3fnuz and s[0, 0] == np.float32(224.0 / 224.0)
    got = codes(q)[0]
    assert list(got[:5]) == [0x7E, 0xFE, 0x00, 0x00, 0x00]
    assert 0x80 not in got  # the NaN code appears only for NaN input
    np.testing.assert_array_equal(np.asarray(q)[0, 5:7].astype(np.float32), [1.0, -1.0])
    # UE8M0: 672 / 224 = 3 -> scale 4 (byte 0x81); 672 / 4 = 168 lies between 160 and 176,
    # a tie that rounds to the even mantissa, 160
    q, s = fgq.quantize(
        np.full((1, 128), 672.0, np.float32), dtype="e4m3fnuz", scale="ue8m0", layout="packed"
    )
    assert int(s[0, 0]) == 0x81
    assert set(np.asarray(q).astype(np.float32).ravel()) == {160.0}


def test_int8_rounds_half_to_even():
    # amax 127 makes the float scale exactly 1
    values = [127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5]
    q, s = fgq.quantize(group(values), dtype="int8")
    assert s[0, 0] == 1.0
    assert list(np.asarray(q)[0, :8]) == [127, 0, 2, 2, 0, -2, -2, 126]


def test_e4m3_ties_round_to_even():
    # amax 448 makes the scale 1; spacing is 2 in [16, 32): 17 -> 16, 19 -> 20, 21 -> 20
    q, _ = fgq.quantize(group([448.0, 17.0, 19.0, 21.0, -17.0, 0.0009765625 * 1.5]))
    got = np.asarray(q)[0, :6].astype(np.float32)
    np.testing.assert_array_equal(got, [448, 16, 20, 20, -16, 0.001953125])


@pytest.mark.parametrize("fmt", FORMATS)
def test_ue8m0_exponent_is_the_exact_ceiling(fmt):
    fmax = OUTPUT_FORMATS[fmt].fmax
    exact = np.float32(fmax * 2.0**-3)
    above = np.nextafter(exact, np.float32(np.inf))
    for amax, expected in ((exact, 127 - 3), (above, 127 - 2)):
        _, s = fgq.quantize(group([amax]), dtype=fmt, scale="ue8m0", layout="packed")
        assert int(s[0, 0]) == expected, (amax, int(s[0, 0]))


def kernel_ue8m0_exponent(amax, fmax, floor):
    """kernels/common.cuh ue8m0_exponent, transcribed: the exponent byte from bits alone."""
    a = np.asarray(amax, np.float32).view(np.uint32).astype(np.int64)
    f = int(np.float32(fmax).view(np.uint32))
    b = int(np.float32(floor).view(np.uint32))
    ceiling = (a >> 23) - ((f >> 23) - 127) + ((a & 0x7FFFFF) > (f & 0x7FFFFF))
    return np.maximum(ceiling, (b >> 23) + ((b & 0x7FFFFF) != 0))


def every_mantissa(exponent: int) -> np.ndarray:
    """All 2**23 float32 values of one binade, [2**exponent, 2**(exponent + 1))."""
    bits = np.arange(2**23, dtype=np.uint32) | np.uint32((exponent + 127) << 23)
    return bits.view(np.float32)


@pytest.mark.parametrize("fmax", sorted({f.fmax for f in OUTPUT_FORMATS.values()} | {6.0, 1.1}))
def test_kernel_ue8m0_exponent_from_bits_equals_the_division(fmax):
    # the kernel skips the division y = RN(amax / fmax) of SPEC 3 item 3 (common.cuh says why
    # that is exact); here both agree over every positive finite bfloat16 at least eps, every
    # float32 mantissa of two binades, and every mantissa of the binades where the quotient
    # crosses the 1e-10 floor
    floor = np.float32(1e-10)
    bf16 = np.arange(0x0080, 0x7F80, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    edge = int(np.floor(np.log2(float(floor) * fmax)))
    pools = [bf16] + [every_mantissa(e) for e in (0, 7, edge - 1, edge, edge + 1)]
    at_floor = above_floor = 0
    for amax in pools:
        amax = amax[amax >= np.float32(2.0**-126)]
        y = (amax / np.float32(fmax)).astype(np.float32)
        expected = reference.ue8m0_exponents(y).astype(np.int64)
        got = kernel_ue8m0_exponent(amax, fmax, floor)
        wrong = np.flatnonzero(got != expected)
        assert wrong.size == 0, (fmax, amax[wrong[:5]], got[wrong[:5]], expected[wrong[:5]])
        at_floor += int((expected == 0x5E).sum())
        above_floor += int((expected > 0x5E).sum())
    assert at_floor > 2**22 and above_floor > 2**22  # both sides of the floor were covered


def test_e4m3fnuz_doubling_folded_into_the_power_of_two_equals_the_spec():
    # kernels: Output<kE4M3FNUZ>::kCodeExponent = 1, so the UE8M0 path multiplies by
    # 2^(128 - e) in one step and converts with e4m3fn's instruction (clip +-448, -0 -> +0);
    # the spec multiplies by 2^(127 - e) and converts to fnuz (clip +-224). Every finite
    # bfloat16 value against every exponent byte the UE8M0 rule can give
    fmt = OUTPUT_FORMATS["e4m3fnuz"]
    bf16 = np.arange(0x10000, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32)
    v = bf16[np.isfinite(bf16)]
    for e in range(0x5E, 0xFA):
        with np.errstate(over="ignore"):  # huge values at small e: both sides saturate
            t = (v * np.float32(2.0 ** (127 - e))).astype(np.float32)
            doubled = np.clip((v * np.float32(2.0 ** (128 - e))).astype(np.float32), -448, 448)
        spec = reference.encode(t, v, fmt)
        kernel = doubled.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        kernel = np.where((kernel & 0x7F) == 0, 0, kernel).astype(np.uint8)
        wrong = np.flatnonzero(kernel != spec)
        assert wrong.size == 0, (hex(e), v[wrong[:5]], kernel[wrong[:5]], spec[wrong[:5]])


def test_ue8m0_scales_as_float_layouts_are_powers_of_two():
    x = activations(np.random.default_rng(1), (8, 512), "float32")
    _, s = fgq.quantize(x, scale="ue8m0", layout="col")
    mantissa, _ = np.frexp(np.asarray(s))
    assert np.all(mantissa == 0.5)


def test_tiny_eps_with_subnormal_groups_keeps_subnormal_arithmetic():
    # eps = FLT_MIN: the float scale itself is subnormal, nothing may flush to zero
    tiny = np.finfo(np.float32).tiny
    values = np.float32(tiny) * np.array([1.0, 0.5, 0.25, -0.75], np.float32)
    q, s = fgq.quantize(group(values), eps=float(tiny))
    assert s[0, 0] == np.float32(tiny) / np.float32(448.0) and s[0, 0] > 0
    # -0.75 * 448 = -336 lies halfway between -320 and -352: even mantissa wins
    np.testing.assert_array_equal(np.asarray(q)[0, :4].astype(np.float32), [448, 224, 112, -320])


def test_empty_input_returns_empty_outputs():
    q, s = fgq.quantize_packed(np.zeros((0, 256), ml_dtypes.bfloat16))
    assert q.shape == (0, 256) and s.shape == (0, 1) and s.dtype == np.int32


def test_one_dimensional_input_is_one_row():
    x = activations(np.random.default_rng(2), (1, 384), "bfloat16")
    q1, s1 = fgq.quantize(x[0], layout="col_tma")
    q2, s2 = fgq.quantize(x, layout="col_tma")
    assert q1.shape == (384,) and s1.shape == (3,)
    np.testing.assert_array_equal(codes(q1), codes(q2)[0])
    np.testing.assert_array_equal(s1, s2[0])


# the independent scalar model of SPEC 3 (fp8_group_quant/spec_model.py) ----------------------


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ue8m0", [False, True])
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
def test_reference_matches_scalar_model(fmt, ue8m0, input_dtype):
    rng = np.random.default_rng([FORMATS.index(fmt), ue8m0, len(input_dtype)])
    x = activations(rng, (6, 256), input_dtype, specials=True)
    values = x.astype(np.float32).reshape(-1, 32)
    scale = "ue8m0" if ue8m0 else "float32"
    got_codes, got_scales, _ = reference.quantize_groups(values, fmt, scale, 1e-10)
    for row in range(values.shape[0]):
        expected, scale = scalar_group([float(v) for v in values[row]], fmt, ue8m0, 1e-10)
        assert list(got_codes[row]) == expected, (row, values[row])
        assert float(got_scales[row]) == scale
