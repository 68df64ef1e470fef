"""Drop-in entry points: the shapes, dtypes and strides vLLM's and SGLang's functions return."""

import inspect

import ml_dtypes
import numpy as np
import pytest
from helpers import activations

import fp8_group_quant as fgq
from fp8_group_quant.activation import silu_mul
from fp8_group_quant.compat import (
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_packed_for_deepgemm,
    persistent_masked_m_silu_mul_quant,
    rms_norm_per_block_quant,
    sglang_per_token_group_quant_fp8,
    silu_mul_per_token_group_quant_fp8_colmajor,
)

EMPTY = inspect.Parameter.empty


# Signatures taken from upstream's code: (function, source, parameters with defaults). vLLM 0.33.0
# and SGLang 0.5.23, the wheels on PyPI; "file:line" is where the function is defined.
UPSTREAM_SIGNATURES = [
    (
        per_token_group_quant_fp8,
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py:632",
        [("x", EMPTY), ("group_size", EMPTY), ("eps", 1e-10), ("dtype", None),
         ("column_major_scales", False), ("tma_aligned_scales", False), ("out_q", None),
         ("use_ue8m0", None)],
    ),
    (
        per_token_group_quant_fp8_packed_for_deepgemm,
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py:766",
        [("x", EMPTY), ("group_size", EMPTY), ("eps", 1e-10), ("use_ue8m0", None),
         ("out_q", None)],
    ),
    (
        sglang_per_token_group_quant_fp8,
        "sglang/kernels/ops/quantization/fp8_kernel.py:489",
        [("x", EMPTY), ("group_size", EMPTY), ("eps", 1e-10), ("column_major_scales", False),
         ("scale_tma_aligned", False), ("scale_ue8m0", False), ("fuse_silu_and_mul", False),
         ("masked_m", None), ("output_q", None), ("output_s", None)],
    ),
    (
        silu_mul_per_token_group_quant_fp8_colmajor,
        "vllm/model_executor/layers/quantization/utils/fp8_utils.py:472",
        [("input", EMPTY), ("output", None), ("use_ue8m0", None), ("eps", 1e-10),
         ("clamp_limit", None), ("group_size", 128), ("alpha", 1.0), ("beta", 0.0),
         ("expert_ends", None), ("expert_alignment", 0)],
    ),
    (
        persistent_masked_m_silu_mul_quant,
        "vllm/model_executor/layers/fused_moe/experts/batched_deep_gemm_moe.py:134",
        [("y", EMPTY), ("tokens_per_expert", EMPTY), ("num_parallel_tokens", 16),
         ("group_size", 128), ("quant_scale_fmt", "FLOAT32")],  # vLLM: the enum's FLOAT32
    ),
    (
        rms_norm_per_block_quant,
        "vllm/_custom_ops.py:456",
        [("input", EMPTY), ("weight", EMPTY), ("epsilon", EMPTY), ("quant_dtype", EMPTY),
         ("group_size", EMPTY), ("scale_ub", None), ("residual", None),
         ("is_scale_transposed", False), ("tma_alignment", 0)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    "function, source, expected", UPSTREAM_SIGNATURES, ids=lambda v: getattr(v, "__name__", "")
)
def test_the_signatures_are_upstreams(function, source, expected):
    parameters = inspect.signature(function).parameters
    got = [(name, p.default) for name, p in parameters.items()]
    assert got == expected, source
    if function is sglang_per_token_group_quant_fp8:  # SGLang's outputs are keyword-only
        kinds = {name: p.kind for name, p in parameters.items()}
        assert kinds["output_q"] == kinds["output_s"] == inspect.Parameter.KEYWORD_ONLY


def elements(strides, itemsize=4):
    return tuple(s // itemsize for s in strides)


@pytest.fixture
def x():
    return activations(np.random.default_rng(0), (5, 1024), "bfloat16", specials=True)


# (keyword arguments, layout and scale they mean, expected scale strides for M = 5, ng = 8):
# the scale allocation of vLLM 0.33.0, fp8_utils.py lines 680-701
VLLM_CASES = [
    ({}, "row", "float32", (8, 1)),
    ({"column_major_scales": True}, "col", "float32", (1, 5)),
    ({"column_major_scales": True, "tma_aligned_scales": True}, "col_tma", "float32", (1, 8)),
    ({"use_ue8m0": True}, "row", "ue8m0", (8, 1)),
    (
        {"column_major_scales": True, "tma_aligned_scales": True, "use_ue8m0": True},
        "col_tma",
        "ue8m0",
        (1, 8),
    ),
]  # fmt: skip  every branch of vLLM's scale allocation


@pytest.mark.parametrize("kwargs, layout, scale, strides", VLLM_CASES)
def test_vllm_per_token_group_quant_fp8(x, kwargs, layout, scale, strides):
    q, s = per_token_group_quant_fp8(x, 128, **kwargs)
    q_ref, s_ref = fgq.quantize(x, 128, scale=scale, layout=layout)
    assert q.dtype == ml_dtypes.float8_e4m3fn and q.shape == x.shape
    assert s.dtype == np.float32 and s.shape == (5, 8) and elements(s.strides) == strides
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)


def test_vllm_three_dimensional_tma_scales_are_per_batch():
    x = activations(np.random.default_rng(1), (2, 5, 1024), "float16")
    q, s = per_token_group_quant_fp8(x, 128, column_major_scales=True, tma_aligned_scales=True)
    assert s.shape == (2, 5, 8) and elements(s.strides) == (8 * 8, 1, 8)  # vLLM: (tma*ng, 1, tma)
    q_ref, s_ref = fgq.quantize(x, 128, layout="col_tma")
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)


def test_vllm_dtype_and_out_q(x):
    out = np.zeros(x.shape, ml_dtypes.float8_e5m2)
    q, s = per_token_group_quant_fp8(x, 64, eps=1e-6, dtype=ml_dtypes.float8_e5m2, out_q=out)
    q_ref, s_ref = fgq.quantize(x, 64, dtype="e5m2", eps=1e-6)
    assert q is out
    np.testing.assert_array_equal(out.view(np.uint8), np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)


# vLLM's per_token_group_quant_fp8_packed_for_deepgemm (vllm/model_executor/layers/quantization/
# utils/fp8_utils.py:766 in 0.33.0; x_s at lines 806-811, x_q at 836): signature (x, group_size,
# eps=1e-10, use_ue8m0=None, out_q=None); x_q is
# x_q_local.view_as(x), the shape of x; x_s_packed is empty_strided((mn, ceil(ng/4)),
# (1, align(mn, 4)), int32) with mn = x.numel() // K; use_ue8m0 None reads DeepGEMM's setting
# and is then asserted true.
def test_vllm_packed_for_deepgemm_matches_upstream_shapes():
    parameters = inspect.signature(per_token_group_quant_fp8_packed_for_deepgemm).parameters
    assert [(n, p.default) for n, p in parameters.items()][2:] == [
        ("eps", 1e-10), ("use_ue8m0", None), ("out_q", None),
    ]  # fmt: skip
    x = activations(np.random.default_rng(2), (2, 5, 1536), "bfloat16")
    q, s = per_token_group_quant_fp8_packed_for_deepgemm(x, 128)  # use_ue8m0 left at None
    assert q.shape == (2, 5, 1536) and q.dtype == ml_dtypes.float8_e4m3fn
    assert s.dtype == np.int32 and s.shape == (10, 3) and elements(s.strides) == (1, 12)
    q_ref, s_ref = fgq.quantize_packed(x.reshape(10, 1536))
    np.testing.assert_array_equal(s, s_ref)
    np.testing.assert_array_equal(
        np.asarray(q).view(np.uint8).reshape(10, 1536), np.asarray(q_ref).view(np.uint8)
    )
    out = np.zeros(x.shape, ml_dtypes.float8_e4m3fn)  # out_q shaped like x comes back as is
    q2, s2 = per_token_group_quant_fp8_packed_for_deepgemm(x, 128, use_ue8m0=True, out_q=out)
    assert q2 is out and q2.shape == x.shape
    np.testing.assert_array_equal(out.view(np.uint8), np.asarray(q).view(np.uint8))
    with pytest.raises(ValueError, match="use_ue8m0: .* got False"):
        per_token_group_quant_fp8_packed_for_deepgemm(x, 128, use_ue8m0=False)


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_vllm_silu_mul_colmajor(use_ue8m0):
    # vLLM 0.33.0 fp8_utils.py:504-509: output [M, N/2] e4m3; scales empty((N/2/G, M)).T
    x = activations(np.random.default_rng(8), (6, 1024), "bfloat16", specials=True)
    q, s = silu_mul_per_token_group_quant_fp8_colmajor(x, use_ue8m0=use_ue8m0)
    assert q.shape == (6, 512) and q.dtype == ml_dtypes.float8_e4m3fn
    assert s.shape == (6, 4) and s.dtype == np.float32 and elements(s.strides) == (1, 6)
    values = silu_mul(x[:, :512], x[:, 512:], "bfloat16").astype(ml_dtypes.bfloat16)
    q_ref, s_ref = fgq.quantize(values, 128, scale="ue8m0" if use_ue8m0 else "float32")
    np.testing.assert_array_equal(q.view(np.uint8), q_ref.view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)
    out = np.zeros((6, 512), ml_dtypes.float8_e4m3fn)
    q2, _ = silu_mul_per_token_group_quant_fp8_colmajor(x, out, use_ue8m0=use_ue8m0)
    assert q2 is out and np.array_equal(out.view(np.uint8), q.view(np.uint8))


@pytest.mark.parametrize("kwargs", [{"alpha": 1.702}, {"beta": 1.0}, {"expert_alignment": 8}])
def test_vllm_silu_mul_variants_not_implemented_are_named(kwargs):
    x = activations(np.random.default_rng(9), (8, 512), "bfloat16")
    with pytest.raises(NotImplementedError, match=next(iter(kwargs))):
        silu_mul_per_token_group_quant_fp8_colmajor(x, **kwargs)


def test_sglang_fuse_silu_and_mul():
    # SGLang: out_shape = (*x.shape[:-1], K // 2), scales allocated for out_shape
    x = activations(np.random.default_rng(10), (2, 5, 1024), "bfloat16", specials=True)
    q, s = sglang_per_token_group_quant_fp8(
        x, 128, column_major_scales=True, scale_tma_aligned=True, scale_ue8m0=True,
        fuse_silu_and_mul=True,
    )  # fmt: skip
    assert q.shape == (2, 5, 512) and s.shape == (2, 5, 1) and elements(s.strides) == (8, 1, 8)
    values = silu_mul(x[..., :512], x[..., 512:], "bfloat16").astype(ml_dtypes.bfloat16)
    q_ref, s_ref = fgq.quantize(values, 128, scale="ue8m0", layout="packed")
    np.testing.assert_array_equal(q.view(np.uint8), q_ref.view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)


# SGLang 0.5.23, create_per_token_group_quant_fp8_output_scale (sglang/kernels/ops/quantization/
# fp8_kernel.py:346): (keyword arguments, scale strides for M = 5 and 8 groups, dtype, layout,
# scale) for every branch of the allocation
SGLANG_CASES = [
    ({}, (8, 1), np.float32, "row", "float32"),
    ({"column_major_scales": True}, (1, 5), np.float32, "col", "float32"),
    ({"column_major_scales": True, "scale_tma_aligned": True}, (1, 8), np.float32, "col_tma",
     "float32"),
    ({"scale_ue8m0": True}, (8, 1), np.float32, "row", "ue8m0"),  # float32 powers of two
    ({"column_major_scales": True, "scale_tma_aligned": True, "scale_ue8m0": True}, (1, 8),
     np.int32, "packed", "ue8m0"),
]  # fmt: skip


@pytest.mark.parametrize("kwargs, strides, dtype, layout, scale", SGLANG_CASES)
def test_sglang_per_token_group_quant_fp8(x, kwargs, strides, dtype, layout, scale):
    q, s = sglang_per_token_group_quant_fp8(x, 128, **kwargs)
    assert q.dtype == ml_dtypes.float8_e4m3fn and q.shape == x.shape and s.dtype == dtype
    assert elements(s.strides) == strides
    q_ref, s_ref = fgq.quantize(x, 128, scale=scale, layout=layout)
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)
    assert s.shape == ((5, 2) if dtype == np.int32 else (5, 8))
    if scale == "ue8m0" and dtype == np.float32:  # powers of two
        assert (np.frexp(s)[0] == 0.5).all()


def test_sglang_batched_scales_are_per_batch_and_outputs_in_place():
    x = activations(np.random.default_rng(4), (3, 6, 1024), "bfloat16", specials=True)
    # SGLang: empty((*batch, ceil(ng/4), align(M, 4))).transpose(-1, -2)[..., :M, :]
    q, s = sglang_per_token_group_quant_fp8(
        x, 128, column_major_scales=True, scale_tma_aligned=True, scale_ue8m0=True
    )
    assert s.shape == (3, 6, 2) and elements(s.strides) == (2 * 8, 1, 8)
    # float32 TMA-aligned: empty((*batch, ng, align(M, 4))).transpose(-1, -2)[..., :M, :]
    _, s2 = sglang_per_token_group_quant_fp8(x, 128, column_major_scales=True,
                                             scale_tma_aligned=True)  # fmt: skip
    assert s2.shape == (3, 6, 8) and elements(s2.strides) == (8 * 8, 1, 8)
    q_out = np.full(x.shape, 0x55, np.uint8).view(ml_dtypes.float8_e4m3fn)
    s_out = np.full((3, 6, 8), np.nan, np.float32)
    q3, s3 = sglang_per_token_group_quant_fp8(x, 128, output_q=q_out, output_s=s_out)
    assert q3 is q_out and s3 is s_out
    q_ref, s_ref = fgq.quantize(x, 128)
    np.testing.assert_array_equal(q_out.view(np.uint8), np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(s_out, s_ref)
    q_packed, s_packed = fgq.quantize(x, 128, scale="ue8m0", layout="packed")
    np.testing.assert_array_equal(np.asarray(q).view(np.uint8), q_packed.view(np.uint8))
    np.testing.assert_array_equal(s, s_packed)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"masked_m": np.array([3], np.int32)}, ValueError, r"x: masked_m needs x of shape"),
        ({"scale_ue8m0": True, "column_major_scales": True}, ValueError, "scale_tma_aligned=True"),
    ],
)  # a masked call on 2-D input, and SGLang's own precondition for column-major UE8M0
def test_sglang_rejections(x, kwargs, error, message):
    with pytest.raises(error, match=message):
        sglang_per_token_group_quant_fp8(x, 128, **kwargs)


@pytest.mark.gpu
def test_compat_with_torch_returns_torch_layouts():
    import torch

    data = activations(np.random.default_rng(3), (37, 7168), "bfloat16", specials=True)
    x = torch.from_numpy(data.view(np.int16).copy()).view(torch.bfloat16).cuda()
    q, s = per_token_group_quant_fp8(x, 128, column_major_scales=True, tma_aligned_scales=True)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == (37, 56) and s.stride() == (1, 40)
    _, s_ref = fgq.quantize(data, 128, layout="col_tma")
    np.testing.assert_array_equal(s.cpu().numpy(), s_ref)
    out = torch.empty_like(q)
    q2, s2 = per_token_group_quant_fp8_packed_for_deepgemm(x, 128, out_q=out)
    assert q2 is out and s2.dtype == torch.int32 and s2.stride() == (1, 40)
    q3, s3 = sglang_per_token_group_quant_fp8(
        x, 128, column_major_scales=True, scale_tma_aligned=True, scale_ue8m0=True
    )
    assert torch.equal(s3, s2) and torch.equal(q3.view(torch.uint8), out.view(torch.uint8))
    np.testing.assert_array_equal(s3.cpu().numpy(), fgq.quantize_packed(data)[1])
