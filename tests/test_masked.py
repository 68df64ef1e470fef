"""The masked MoE layout: rows t < masked_m[e] only, everything else untouched, on the NumPy
backend, and the kernel on the GPU against it byte for byte."""

import helpers
import ml_dtypes
import numpy as np
import pytest
from backends import (
    COMBINATIONS,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    poisoned_outputs,
    to_device,
    to_host_bytes,
)
from helpers import NP_INPUT, activations, assert_same_bytes, host_poisoned
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


# both count types masked_m takes
@pytest.mark.parametrize("count_dtype", [np.int32, np.int64])
# a partly used scale word, counts clamped both ways, one expert, 32 experts with SiLU
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


# each way masked_m and expected_m can be wrong
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
    layout = "packed_col" if fmt == "UE8M0" else "col"
    q_ref, s_ref = fgq.quantize(y, 128, scale=scale, layout=layout, activation="silu_mul",
                                arithmetic="bfloat16")  # fmt: skip
    for e, n in enumerate(counts):
        np.testing.assert_array_equal(q.view(np.uint8)[e, :n], q_ref.view(np.uint8)[e, :n])
        np.testing.assert_array_equal(s[e, :n], s_ref[e, :n])
        assert (s[e, n:] == 0).all()  # vLLM zeroes the scales of the rows past the count
    with pytest.raises(ValueError, match="quant_scale_fmt"):
        persistent_masked_m_silu_mul_quant(y, counts, quant_scale_fmt="E8M0_SPARSE")
    # any T, as vLLM: T = 6 is not a multiple of 4 and the strides stay (T*kp', 1, T)
    q6, s6 = persistent_masked_m_silu_mul_quant(y[:, :6], counts, quant_scale_fmt=fmt)
    assert s6.shape == (3, 6, shape[2]) and tuple(v // 4 for v in s6.strides) == (
        6 * shape[2], 1, 6)  # fmt: skip
    for e, n in enumerate(np.minimum(counts, 6)):
        np.testing.assert_array_equal(s6[e, :n], s_ref[e, :n])
        np.testing.assert_array_equal(q6.view(np.uint8)[e, :n], q_ref.view(np.uint8)[e, :n])


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


# the masked kernel on the GPU against the NumPy backend -------------------------------------------


def check_masked(x_host, counts, lib, group_size, dtype, scale, layout, activation, **kwargs):
    """The masked kernel into poisoned device storage against the NumPy backend into poisoned
    host storage: every byte, the untouched ones included."""
    n = x_host.shape[-1] // (2 if activation else 1)
    geometry = Geometry((*x_host.shape[:-1], n), group_size, layout, False)
    options = dict(dtype=dtype, scale=scale, layout=layout, activation=activation)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, lib, dtype)
    counts_device = to_device(counts, lib)
    fgq.quantize(to_device(x_host, lib), group_size, **options, masked_m=counts_device, out=q,
                 scale_out=s, **kwargs)  # fmt: skip
    hq, hs, hq_buf, hs_buf = host_poisoned(geometry, dtype)
    fgq.quantize(x_host, group_size, **options, masked_m=counts, out=hq, scale_out=hs)
    what = f"masked {lib} {x_host.dtype} G={group_size} {dtype} {scale} {layout} {activation} "
    what += f"{x_host.shape} counts={list(counts)[:8]}"
    assert_same_bytes(to_host_bytes(q_buf), hq_buf, f"q ({what})")
    assert_same_bytes(to_host_bytes(s_buf), hs_buf, f"scales ({what})")


@pytest.mark.gpu
# every input type, group size and registered (format, scale, layout)
@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS)
def test_masked_every_combination(input_dtype, group_size, dtype, scale, layout):
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("cupy", "torch")[index % 2]
    activation = ("silu_mul", None)[index // 2 % 2]
    rng = np.random.default_rng(2000 + index)
    width = 3 * group_size * (2 if activation else 1)  # three groups: a partly used word
    x = activations(rng, (5, 7, width), input_dtype, specials=True)
    counts = np.array([0, 7, 3, -1, 12], (np.int32, np.int64)[index % 3 == 0])
    check_masked(x, counts, lib, group_size, dtype, scale, layout, activation)
    # rows of 64 groups: a block's slots of one step lie within two row tiles, so with at most
    # 32 experts the kernel keeps the scan in its lanes (kernels/quantize.cu, quantize_masked)
    x = activations(rng, (5, 7, 64 * group_size * (2 if activation else 1)), input_dtype)
    check_masked(x, counts, lib, group_size, dtype, scale, layout, activation)


@pytest.mark.gpu
# the 16-bit types: every bit pattern is a gate
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16"])
def test_masked_silu_mul_every_16_bit_gate(input_dtype):
    # every 16-bit pattern as a gate through the masked kernel (bfloat16: its band table), four
    # experts of 64 rows with one row left out of each
    rng = np.random.default_rng(15)
    gate = np.arange(65536, dtype=np.uint16).view(NP_INPUT[input_dtype]).reshape(4, 64, 256)
    x = np.concatenate([gate, activations(rng, (4, 64, 256), input_dtype)], axis=-1)
    counts = np.array([63, 64, 64, 62], np.int32)
    check_masked(x, counts, "cupy", 128, "e4m3", "ue8m0", "packed", "silu_mul")


@pytest.mark.gpu
# both GPU libraries
@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_masked_many_experts_and_unbalanced_counts(lib):
    rng = np.random.default_rng(8)
    x = activations(rng, (32, 64, 2 * 1024), "bfloat16", specials=True)
    for counts in (
        rng.integers(0, 65, 32),  # random, some zero, some full
        np.where(np.arange(32) == 5, 64, 0),  # one expert holds every token
        np.zeros(32, np.int64),  # nothing at all
        np.full(32, 64),  # everything
    ):
        for hint in ({}, {"expected_m": 1}):  # a small hint still covers every row
            check_masked(x, counts.astype(np.int32), lib, 128, "e4m3", "ue8m0", "packed",
                         "silu_mul", **hint)  # fmt: skip
    one = activations(rng, (1, 300, 7168), "bfloat16")  # E = 1, many rows
    check_masked(one, np.array([257], np.int64), lib, 128, "e4m3", "float32", "col_tma", None)
    # 33 and 40 experts: past the 32 that the kernel scans in a warp's lanes (shared memory)
    for experts in (33, 40):
        x = activations(rng, (experts, 16, 1024), "bfloat16", specials=True)
        counts = rng.integers(-2, 19, experts)
        counts[[0, experts - 1]] = [16, 0]
        check_masked(x, counts, lib, 128, "e4m3", "ue8m0", "packed", None)
        check_masked(x, counts, lib, 64, "e5m2", "float32", "row", None, expected_m=3)


@pytest.mark.gpu
def test_masked_replays_in_a_cuda_graph_with_new_counts():
    import torch

    rng = np.random.default_rng(9)
    x_host = activations(rng, (8, 32, 2048), "bfloat16", specials=True)
    x = to_device(x_host, "torch")
    counts = torch.zeros(8, dtype=torch.int32, device="cuda")
    geometry = Geometry((8, 32, 1024), 128, "packed", False)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, "torch", "e4m3")
    options = dict(scale="ue8m0", layout="packed", activation="silu_mul")
    fgq.quantize(x, 128, **options, masked_m=counts, out=q, scale_out=s)  # plan and warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fgq.quantize(x, 128, **options, masked_m=counts, out=q, scale_out=s)
    for step in range(4):
        new = rng.integers(0, 33, 8).astype(np.int32)
        counts.copy_(torch.from_numpy(new))
        q_buf.fill_(helpers.Q_POISON)  # the poisons poisoned_outputs and host_poisoned use
        s_buf.view(torch.uint8).fill_(helpers.SCALE_POISON)  # bytewise: s_buf is the int32 view
        graph.replay()
        torch.cuda.synchronize()
        hq, hs, hq_buf, hs_buf = host_poisoned(geometry, "e4m3")
        fgq.quantize(x_host, 128, **options, masked_m=new, out=hq, scale_out=hs)
        assert_same_bytes(to_host_bytes(q_buf), hq_buf, f"q, replay {step}, counts {new}")
        assert_same_bytes(to_host_bytes(s_buf), hs_buf, f"scales, replay {step}, counts {new}")


@pytest.mark.gpu
def test_masked_m_must_live_with_x():
    import cupy
    import torch

    x = to_device(activations(np.random.default_rng(10), (2, 4, 256), "bfloat16"), "torch")
    with pytest.raises(TypeError, match="masked_m: expected an array of x's library"):
        fgq.quantize(x, 128, masked_m=cupy.asarray(np.array([1, 2], np.int32)))
    with pytest.raises((ValueError, TypeError), match="masked_m"):
        fgq.quantize(x, 128, masked_m=torch.tensor([1, 2], dtype=torch.int32))  # on the CPU
    with pytest.raises(TypeError, match="masked_m: expected int32 or int64"):
        fgq.quantize(x, 128, masked_m=torch.tensor([1, 2], dtype=torch.int16, device="cuda"))
