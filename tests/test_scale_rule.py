"""scale_rule="floor" (OCP MX v1.0) against hand-checked answers and the scalar model (SPEC 3.6),
and the kernels' floor rule on the GPU against the NumPy backend."""

import ml_dtypes
import numpy as np
import pytest
from backends import (
    COMBINATIONS,
    check,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    plain_kernel_path,  # noqa: F401 - the fixture kernel_path
    to_device,
    wider_rows,
)
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


# the formats the floor rule is defined for (those with emax_elem)
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


# the formats the floor rule is defined for (those with emax_elem)
@pytest.mark.parametrize("fmt", FLOOR_FORMATS)
# every input type
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


# every layout of UE8M0 scales but blocked (test_blocked.py has it)
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


# the GPU: a runtime flag of every UE8M0 kernel, against the NumPy backend -------------------------

# every UE8M0 combination of the formats the floor rule is defined for (those with emax_elem)
FLOOR_COMBINATIONS = [c for c in COMBINATIONS if c[3] == "ue8m0" and c[2] in ("e4m3", "e5m2")]


@pytest.mark.gpu
# FLOOR_COMBINATIONS' comment says why
@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", FLOOR_COMBINATIONS)
def test_floor_rule_every_combination(input_dtype, group_size, dtype, scale, layout, kernel_path):
    index = FLOOR_COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("cupy", "torch")[index % 2]
    rng = np.random.default_rng(4000 + index)
    args = (lib, group_size, dtype, scale, layout)
    x = activations(rng, (5, 21 * group_size), input_dtype, specials=True)
    check(x, to_device(x, lib), *args, scale_rule="floor")
    x = activations(rng, (2, 3, 7168), input_dtype, specials=True)
    check(x, wider_rows(x, 256, lib, 128), *args, pad_rows=True, scale_rule="floor")
    x = activations(rng, (7, 2 * group_size), input_dtype)  # the element-wise load path
    check(x, wider_rows(x, 3, lib, 1), *args, scale_rule="floor")
    tiny = float(np.finfo(np.float32).tiny)  # exponents clamped at 1
    check(x * 0, to_device(x * 0, lib), *args, eps=tiny, scale_rule="floor")


@pytest.mark.gpu
def test_floor_rule_in_the_fused_kernels():
    import cupy

    rng = np.random.default_rng(23)
    options = dict(dtype="e4m3", scale="ue8m0", layout="packed", scale_rule="floor")
    x = activations(rng, (3, 4, 2 * 512), "bfloat16", specials=True)
    counts = np.array([4, 0, 2], np.int32)
    for kwargs in ({"activation": "silu_mul"}, {"activation": "silu_mul", "masked_m": counts},
                   {"masked_m": counts}):  # fmt: skip
        device = {k: cupy.asarray(v) if k == "masked_m" else v for k, v in kwargs.items()}
        q, s = fgq.quantize(cupy.asarray(x), 128, **options, **device)
        hq, hs = fgq.quantize(x, 128, **options, **kwargs)
        got_q, got_s = cupy.asnumpy(q).view(np.uint8), cupy.asnumpy(s)
        for e in range(3):
            rows = counts[e] if "masked_m" in kwargs else 4
            assert np.array_equal(got_q[e, :rows], hq[e, :rows].view(np.uint8)), (kwargs, e)
            assert np.array_equal(got_s[e, :rows], hs[e, :rows]), (kwargs, e)
    w = activations(rng, (1024,), "bfloat16")
    r = activations(rng, (3, 4, 1024), "bfloat16")
    xn = x[..., :1024].copy()
    r_device = cupy.asarray(r)
    q, s = fgq.quantize(cupy.asarray(xn), 128, **options, norm=(cupy.asarray(w), 1e-6),
                        residual=r_device)  # fmt: skip
    hq, hs = fgq.quantize(xn, 128, **options, norm=(w, 1e-6), residual=r)
    assert np.array_equal(cupy.asnumpy(q).view(np.uint8), hq.view(np.uint8))
    assert np.array_equal(cupy.asnumpy(s), hs)
    assert np.array_equal(cupy.asnumpy(r_device).view(np.uint16), r.view(np.uint16))
