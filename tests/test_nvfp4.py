"""NVFP4's arithmetic (docs/spec.md, section 4a) on the NumPy backend against the scalar model.

quantize() does not write NVFP4 yet (issue 14): these tests pin the definition that its kernel
and its NumPy path will follow.
"""

import ml_dtypes
import numpy as np
import pytest

from fp8_group_quant import reference, spec_model


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
