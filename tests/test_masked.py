"""The masked MoE layout on the CPU: rows t < masked_m[e] only, everything else untouched."""

import ml_dtypes
import numpy as np
import pytest
from helpers import activations, host_poisoned
from hypothesis import given, settings
from hypothesis import strategies as st

import fp8_group_quant as fgq
from fp8_group_quant._layout import Geometry
from fp8_group_quant._spec import output_format
from fp8_group_quant.activation import silu_mul
from fp8_group_quant.compat import (
    persistent_masked_m_silu_mul_quant,
    sglang_per_token_group_quant_fp8,
)

Q_POISON, SCALE_POISON = 0x55, 0x7F


def poisoned(geometry: Geometry):
    return host_poisoned(geometry, "e4m3", Q_POISON)


def expected_storage(x, counts, geometry, scale, activation, fmt="e4m3"):
    """Poisoned storage with each expert's first rows written as a plain call writes them."""
    q_buf = np.full(geometry.q_storage, Q_POISON, np.uint8)
    s_buf = np.full(geometry.scale_storage_bytes, SCALE_POISON, np.uint8)
    full_q, full_s, fq_buf, fs_buf = poisoned(geometry)
    full_q = full_q.view(np.uint8).view(output_format(fmt).numpy_dtype)
    fgq.quantize(x, geometry.group_size, dtype=fmt, scale=scale, layout=geometry.layout.name,
                 activation=activation, out=full_q, scale_out=full_s)  # fmt: skip
    rows = np.clip(counts.astype(np.int64), 0, geometry.rows)
    q_rows = q_buf.reshape(geometry.batches, geometry.q_rows, geometry.k)
    q_rows[:] = fq_buf.reshape(q_rows.shape)
    for e, n in enumerate(rows):
        q_rows[e, n:] = Q_POISON
    offsets = geometry.scale_byte_offsets()
    width = geometry.layout.scale_bytes
    per_word = geometry.layout.scales_per_word
    for e, n in enumerate(rows):
        for t in range(n):
            for g in range(geometry.groups):
                at = offsets[e, t, g]
                s_buf[at : at + width] = fs_buf[at : at + width]
            if per_word == 4 or width == 1:  # the row's last word (blocked: 4-byte slot), zeros too
                last = offsets[e, t, geometry.groups - 1] - (geometry.groups - 1) % 4
                s_buf[last : last + 4] = fs_buf[last : last + 4]
    return q_buf, s_buf


CASES = [  # (experts, tokens, K, group size, scale, layout, activation, counts)
    (3, 6, 640, 128, "ue8m0", "packed", None, [0, 6, 2]),  # 5 groups: a partly used word
    (4, 5, 512, 64, "float32", "col_tma", "silu_mul", [5, 1, -3, 99]),  # clamped both ways
    (1, 9, 256, 32, "ue8m0", "row", None, [9]),
    (32, 8, 1024, 128, "ue8m0", "packed", "silu_mul", list(range(-2, 30))),
]


@pytest.mark.parametrize("count_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("experts, tokens, k, group, scale, layout, activation, counts", CASES)
def test_only_the_counted_rows_are_written(
    experts, tokens, k, group, scale, layout, activation, counts, count_dtype
):
    rng = np.random.default_rng(experts * k)
    x = activations(rng, (experts, tokens, k), "bfloat16", specials=True)
    counts = np.array(counts, count_dtype)
    n = k // 2 if activation else k
    geometry = Geometry((experts, tokens, n), group, layout, False)
    q, s, q_buf, s_buf = poisoned(geometry)
    got = fgq.quantize(x, group, scale=scale, layout=layout, activation=activation,
                       masked_m=counts, out=q, scale_out=s)  # fmt: skip
    assert got[0] is q and got[1] is s
    q_ref, s_ref = expected_storage(x, counts, geometry, scale, activation)
    np.testing.assert_array_equal(q_buf, q_ref)
    np.testing.assert_array_equal(s_buf, s_ref)


def test_the_written_rows_equal_the_fused_values_quantized():
    rng = np.random.default_rng(1)
    x = activations(rng, (2, 4, 512), "float16", specials=True)
    q, s = fgq.quantize(x, 128, scale="ue8m0", layout="packed", activation="silu_mul",
                        masked_m=np.array([3, 4], np.int32))  # fmt: skip
    values = silu_mul(x[..., :256], x[..., 256:], "float16").astype(np.float16)
    q_ref, s_ref = fgq.quantize(values, 128, scale="ue8m0", layout="packed")
    np.testing.assert_array_equal(q.view(np.uint8)[0, :3], q_ref.view(np.uint8)[0, :3])
    np.testing.assert_array_equal(q.view(np.uint8)[1], q_ref.view(np.uint8)[1])
    np.testing.assert_array_equal(s[1], s_ref[1])


@pytest.mark.parametrize(
    "x_shape, masked_m, kwargs, error, message",
    [
        ((2, 4, 256), np.array([1.0, 2.0]), {}, TypeError, "masked_m: expected int32 or int64"),
        ((2, 4, 256), np.array([1, 2, 3], np.int32), {}, ValueError, r"expected shape \(2,\)"),
        ((8, 256), np.array([1], np.int32), {}, ValueError, r"x: masked_m needs x of shape"),
        ((2, 4, 256), np.array([[1, 2]], np.int32), {}, ValueError, "masked_m: expected shape"),
        ((2, 4, 256), np.array([1, 2], np.int32), {"expected_m": 5}, ValueError, "expected_m"),
        ((2, 4, 256), np.array([1, 2], np.int32), {"expected_m": True}, ValueError, "expected_m"),
        ((2, 4, 256), None, {"expected_m": 2}, ValueError, "expected_m: .* pass masked_m"),
        ((2, 4, 256), [1, 2], {}, TypeError, "masked_m"),
    ],
)  # fmt: skip
def test_bad_masked_arguments_are_named_and_nothing_is_written(
    x_shape, masked_m, kwargs, error, message
):
    x = activations(np.random.default_rng(2), x_shape, "bfloat16")
    out = np.full(x_shape, Q_POISON, np.uint8).view(ml_dtypes.float8_e4m3fn)
    with pytest.raises(error, match=message):
        fgq.quantize(x, 128, masked_m=masked_m, out=out, **kwargs)
    assert (out.view(np.uint8) == Q_POISON).all()


def test_sglang_masked_m_with_fused_silu():
    # SGLang's DeepEP low-latency call: [E, T, 2H] with masked_m, packed UE8M0 scales
    rng = np.random.default_rng(3)
    x = activations(rng, (4, 8, 1024), "bfloat16", specials=True)
    counts = np.array([8, 0, 3, 5], np.int32)
    q, s = sglang_per_token_group_quant_fp8(
        x, 128, column_major_scales=True, scale_tma_aligned=True, scale_ue8m0=True,
        fuse_silu_and_mul=True, masked_m=counts,
    )  # fmt: skip
    assert q.shape == (4, 8, 512) and s.shape == (4, 8, 1) and s.strides == (32, 4, 32)
    q_ref, s_ref = fgq.quantize(x, 128, scale="ue8m0", layout="packed", activation="silu_mul")
    for e, n in enumerate(counts):
        np.testing.assert_array_equal(q.view(np.uint8)[e, :n], q_ref.view(np.uint8)[e, :n])
        np.testing.assert_array_equal(s[e, :n], s_ref[e, :n])


@pytest.mark.parametrize(
    "fmt, dtype, shape, strides",
    [
        ("FLOAT32", np.float32, (3, 8, 4), (32, 1, 8)),  # vLLM: (E, T, G), (T*G, 1, T)
        ("FLOAT32_CEIL_UE8M0", np.float32, (3, 8, 4), (32, 1, 8)),
        ("UE8M0", np.int32, (3, 8, 1), (8, 1, 8)),  # (E, T, ceil(G/4)), (T*ceil(G/4), 1, T)
    ],
)
def test_vllm_persistent_masked_m_silu_mul_quant(fmt, dtype, shape, strides):
    rng = np.random.default_rng(4)
    y = activations(rng, (3, 8, 1024), "bfloat16", specials=True)
    counts = np.array([2, 8, 0], np.int32)
    q, s = persistent_masked_m_silu_mul_quant(y, counts, quant_scale_fmt=fmt)
    assert q.shape == (3, 8, 512) and q.dtype == ml_dtypes.float8_e4m3fn
    assert s.shape == shape and s.dtype == dtype
    assert tuple(v // 4 for v in s.strides) == strides
    scale = "float32" if fmt == "FLOAT32" else "ue8m0"
    layout = "packed" if fmt == "UE8M0" else "col"
    q_ref, s_ref = fgq.quantize(y, 128, scale=scale, layout=layout, activation="silu_mul")
    for e, n in enumerate(counts):
        np.testing.assert_array_equal(q.view(np.uint8)[e, :n], q_ref.view(np.uint8)[e, :n])
        np.testing.assert_array_equal(s[e, :n], s_ref[e, :n])
        assert (s[e, n:] == 0).all()  # vLLM zeroes the scales of the rows past the count
    with pytest.raises(ValueError, match="quant_scale_fmt"):
        persistent_masked_m_silu_mul_quant(y, counts, quant_scale_fmt="E8M0_SPARSE")
    with pytest.raises(ValueError, match="T to be a multiple of 4"):
        persistent_masked_m_silu_mul_quant(y[:, :6], counts, quant_scale_fmt="UE8M0")


@st.composite
def masked_cases(draw):
    from fp8_group_quant._layout import supported_combinations
    from fp8_group_quant._spec import GROUP_SIZES, INPUT_TYPES

    fmt, scale, layout = draw(st.sampled_from(supported_combinations()))
    experts, tokens = draw(st.integers(1, 6)), draw(st.integers(1, 9))
    group = draw(st.sampled_from(GROUP_SIZES))
    activation_name = draw(st.sampled_from([None, "silu_mul"]))
    width = group * draw(st.integers(1, 6)) * (2 if activation_name else 1)
    counts = draw(st.lists(st.integers(-3, tokens + 3), min_size=experts, max_size=experts))
    return dict(
        input_dtype=draw(st.sampled_from(sorted(INPUT_TYPES))),
        fmt=fmt,
        scale=scale, layout=layout, group=group, activation=activation_name,
        shape=(experts, tokens, width),
        counts=np.array(counts, draw(st.sampled_from([np.int32, np.int64]))),
        seed=draw(st.integers(0, 2**32 - 1)),
    )  # fmt: skip


@settings(max_examples=300)
@given(masked_cases())
def test_masked_property(case):
    # any registered format, layout, scale and group size, with and without SiLU: the counted
    # rows of each expert as a plain call writes them, every other byte untouched
    x = activations(np.random.default_rng(case["seed"]), case["shape"], case["input_dtype"],
                    specials=True)  # fmt: skip
    n = case["shape"][-1] // (2 if case["activation"] else 1)
    geometry = Geometry((*case["shape"][:-1], n), case["group"], case["layout"], False)
    q, s, q_buf, s_buf = poisoned(geometry)
    q = q.view(np.uint8).view(output_format(case["fmt"]).numpy_dtype)
    fgq.quantize(x, case["group"], dtype=case["fmt"], scale=case["scale"], layout=case["layout"],
                 activation=case["activation"], masked_m=case["counts"], out=q,
                 scale_out=s)  # fmt: skip
    q_ref, s_ref = expected_storage(
        x, case["counts"], geometry, case["scale"], case["activation"], case["fmt"]
    )
    np.testing.assert_array_equal(q_buf, q_ref)
    np.testing.assert_array_equal(s_buf, s_ref)
