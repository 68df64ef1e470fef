"""scale_rule="floor" (OCP MX v1.0) against hand-checked answers and the scalar model (SPEC 3.6)."""

import ml_dtypes
import numpy as np
import pytest
from helpers import NP_INPUT, activations

import fp8_group_quant as fgq
from fp8_group_quant.spec_model import scalar_group

FLOOR_FORMATS = ("e4m3", "e5m2")


def one_group(values, k=32, dtype=np.float32):
    row = np.zeros((1, k), np.float32)
    row[0, : len(values)] = values
    return row.astype(dtype)


def test_floor_takes_amax_exponent_minus_emax_elem_and_saturates():
    # amax = 15.2 = 1.9 * 2^3: floor gives 2^(3 - 8) for e4m3, so 15.2 scales to 486.4 and
    # saturates to 448 (code 0x7E); the ceiling rule gives 2^-4 and 243.2 (code 0x77 = 240)
    x = one_group([15.2, -15.2, 1.0])
    q, s = fgq.quantize(x, 32, scale="ue8m0", layout="packed_row", scale_rule="floor")
    assert int(s[0, 0]) & 0xFF == 127 + 3 - 8
    assert list(np.asarray(q).view(np.uint8)[0, :3]) == [0x7E, 0xFE, 0x60]  # 448, -448, 32
    q, s = fgq.quantize(x, 32, scale="ue8m0", layout="packed_row")
    assert int(s[0, 0]) & 0xFF == 127 - 4
    assert np.asarray(q).view(np.uint8)[0, 0] == 0x77
    # e5m2: emax_elem 15, fmax 57344 = 1.75 * 2^15
    q, s = fgq.quantize(x, 32, dtype="e5m2", scale="ue8m0", scale_rule="floor")
    assert float(s[0, 0]) == 2.0 ** (3 - 15)


@pytest.mark.parametrize("fmt", FLOOR_FORMATS)
def test_powers_of_two_get_the_same_scale_under_both_rules(fmt):
    for k in range(-30, 30, 7):
        x = one_group([2.0**k, 0.5])
        q_floor, s_floor = fgq.quantize(x, 32, dtype=fmt, scale="ue8m0", scale_rule="floor")
        q_ceil, s_ceil = fgq.quantize(x, 32, dtype=fmt, scale="ue8m0")
        assert np.array_equal(s_floor, s_ceil) and np.array_equal(q_floor, q_ceil), k


def test_floor_keeps_the_scale_normal_for_tiny_eps():
    # amax = FLT_MIN (the smallest eps): its exponent minus 8 would be below the float32 range
    tiny = float(np.finfo(np.float32).tiny)
    q, s = fgq.quantize(one_group([0.0]), 32, scale="ue8m0", eps=tiny, scale_rule="floor")
    assert float(s[0, 0]) == 2.0**-126 and not np.asarray(q).view(np.uint8).any()


@pytest.mark.parametrize("fmt", FLOOR_FORMATS)
@pytest.mark.parametrize("input_dtype", list(NP_INPUT))
def test_floor_matches_the_scalar_model(fmt, input_dtype):
    rng = np.random.default_rng(21)
    for group_size in (32, 64, 128, 256):
        x = activations(rng, (6, 2 * group_size), input_dtype, specials=True)
        q, s = fgq.quantize(x, group_size, dtype=fmt, scale="ue8m0", scale_rule="floor")
        values = x.astype(np.float32).reshape(-1, group_size)
        codes = np.asarray(q).view(np.uint8).reshape(-1, group_size)
        for i, row in enumerate(values.tolist()):
            want_codes, want_scale = scalar_group(row, fmt, True, 1e-10, "floor")
            assert list(codes[i]) == want_codes, (group_size, i)
            assert float(s.reshape(-1)[i]) == want_scale


@pytest.mark.parametrize("layout", ["row", "col", "col_tma", "packed", "packed_row"])
def test_floor_writes_every_ue8m0_layout_alike(layout):
    rng = np.random.default_rng(22)
    x = activations(rng, (2, 5, 4 * 128), "bfloat16", specials=True)
    q_ref, s_ref = fgq.quantize(x, 128, scale="ue8m0", layout="row", scale_rule="floor")
    q, s = fgq.quantize(x, 128, scale="ue8m0", layout=layout, scale_rule="floor")
    assert np.array_equal(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8))
    assert np.array_equal(fgq.unpack_scales(s, 4) if "packed" in layout else s, s_ref)


def test_bad_scale_rules_are_named():
    x = np.zeros((2, 128), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="scale_rule: expected one of 'rceil', 'floor'"):
        fgq.quantize(x, 128, scale="ue8m0", scale_rule="round")
    with pytest.raises(ValueError, match="scale_rule: expected one of"):
        fgq.quantize(x, 128, scale="ue8m0", scale_rule=None)
    with pytest.raises(ValueError, match="scale_rule='floor' chooses a UE8M0 exponent"):
        fgq.quantize(x, 128, scale_rule="floor")
    for fmt in ("int8", "e4m3fnuz"):
        with pytest.raises(ValueError, match=f"dtype='{fmt}' has no emax_elem"):
            fgq.quantize(x, 128, dtype=fmt, scale="ue8m0", scale_rule="floor")
