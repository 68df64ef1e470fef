# Ported from pytorch/ao, test/prototype/blockwise_fp8_training/test_blockwise_kernels.py at
# commit 07e859bf9c1713827768a0b62d4692237da1f971, with the torch references it imports from
# torchao/prototype/blockwise_fp8_training/kernels.py (torch_blockwise_scale_act_quant_lhs,
# torch_blockwise_scale_act_quant_rhs, torch_blockwise_scale_weight_quant and EPS; read at commit
# 0598012907d6f6e88734088a65f788c38d294a65, the version of that file the search index holds,
# whose Triton kernels return the reciprocal scales this test compares) and compute_error from
# torchao/float8/float8_utils.py, carried here as test data.
# SPDX-License-Identifier: BSD-3-Clause; Copyright (c) Meta Platforms, Inc. and affiliates.
# The cases and assertions are upstream's, re-expressed; each change is marked "CHANGE:".
"""torchao's tests of its blockwise FP8 training quantizers against its torch references."""

import pytest
import torch
from _port import DEVICES, skip_large_on_cpu

# CHANGE: the functions under test are the drop-ins, not torchao's Triton kernels; upstream's
# variable names (triton_fp8, triton_scale) are kept and hold the drop-ins' outputs
from fp8_group_quant.compat import (
    act_quant_lhs,
    act_quant_rhs,
    act_quant_transposed_lhs,
    weight_quant_rhs,
    weight_quant_transposed_rhs,
)

FP8 = torch.float8_e4m3fn
e4m3_dtype = FP8  # torchao.float8.config's e4m3_dtype on CUDA

# CHANGE: upstream skips without Triton >= 3.3, CUDA or an SM90 device; here every case runs on
# torch CPU tensors (the NumPy backend) and on CUDA (the gpu marker), the largest on CUDA only


# upstream's references (torchao/prototype/blockwise_fp8_training/kernels.py) -------------------

EPS = 1e-12  # torchao's floor of a group's maximum


def torch_blockwise_scale_act_quant_lhs(x: torch.Tensor, tile_size: int = 128):
    """Groups of 1 x ``tile_size``: the maximum in float64, floored at EPS; the multiplier
    ``448 / amax`` rounded to float32; codes ``e4m3(clamp(x * multiplier))``. Returns the codes
    ``[M, K]`` and the reciprocal scales ``1 / multiplier`` ``[M, K / tile_size]``."""
    assert x.is_contiguous(), "input tensor must be contiguous"
    groups = x.reshape(-1, tile_size)
    amax = groups.abs().max(dim=1, keepdim=True).values.to(torch.float64)
    amax = torch.clamp(amax, min=EPS, max=float("inf"))
    finfo = torch.finfo(FP8)
    multiplier = (finfo.max / amax).to(torch.float32)
    codes = (groups * multiplier).clamp(min=finfo.min, max=finfo.max).to(FP8)
    return codes.reshape(x.shape), 1.0 / multiplier.reshape(x.shape[0], -1).to(torch.float)


def torch_blockwise_scale_act_quant_rhs(x: torch.Tensor, block_size: int = 128,
                                        dtype: torch.dtype = FP8, eps: float = 1e-12):  # fmt: skip
    """Groups of ``block_size`` x 1 (the tokens of one channel): the maximum floored at ``eps``
    in x's dtype, then in float64; the multiplier ``448 / amax`` rounded to float32; codes
    ``e4m3(clamp(x * multiplier))``, returned column-major ``[M, K]`` with the reciprocal scales
    ``[M / block_size, K]``. Upstream walks the channels one at a time; here all at once."""
    assert x.is_contiguous(), "Input tensor must be contiguous"
    assert x.size(-1) % block_size == 0
    assert dtype in [FP8], "dtype must be torch.float8_e4m3fn"
    m, k = x.size()
    blocks = x.view(m // block_size, block_size, k)
    amax = torch.clamp(blocks.abs().max(dim=1, keepdim=True).values, min=eps).to(torch.float64)
    multiplier = (448.0 / amax).to(torch.float32)
    codes = torch.clamp(blocks * multiplier, min=-448.0, max=448.0).to(dtype)
    y = codes.view(-1, k)[:m, :].t().contiguous().t()
    return y, 1.0 / multiplier.squeeze(1)


def torch_blockwise_scale_weight_quant(x: torch.Tensor, tile_size: int = 128):
    """Blocks of ``tile_size`` x ``tile_size`` of a 2-D ``x``: the arithmetic of
    ``torch_blockwise_scale_act_quant_lhs`` over each block's values. Returns the codes of x's
    shape and the reciprocal scales ``[M / tile_size, N / tile_size]``."""
    assert len(x.shape) == 2, "input shape must be 2D"
    assert x.is_contiguous(), "input tensor must be contiguous"
    height, width = x.shape
    t_h, t_w = height // tile_size, width // tile_size
    tiles = x.reshape(t_h, tile_size, t_w, tile_size).permute(0, 2, 1, 3)
    tiles = tiles.reshape(-1, tile_size * tile_size)
    amax = tiles.abs().max(dim=1).values.unsqueeze(1).to(torch.float64)
    amax = torch.clamp(amax, min=EPS, max=float("inf"))
    finfo = torch.finfo(FP8)
    multiplier = (finfo.max / amax).to(torch.float32)
    codes = (tiles * multiplier).clamp(min=finfo.min, max=finfo.max).to(FP8)
    codes = codes.reshape(t_h, t_w, tile_size, tile_size).permute(0, 2, 1, 3)
    return codes.reshape(height, width), 1.0 / multiplier.reshape(t_h, t_w).to(torch.float)


def compute_error(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """torchao's SQNR in dB: ``20 log10(|x| / |x - y|)``, Frobenius norms."""
    return 20 * torch.log10(torch.linalg.norm(x) / torch.linalg.norm(x - y))


# the GEMMs upstream feeds the quantized operands to ------------------------------------------


def _expand(scales: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Each scale repeated over the values it covers: ``[rows, cols]`` float32."""
    r, c = -(-rows // scales.shape[0]), -(-cols // scales.shape[1])
    full = scales.float().repeat_interleave(r, 0).repeat_interleave(c, 1)
    return full[:rows, :cols]


def blockwise_gemm(a_q, b_q, a_s, b_s, out_dtype=torch.bfloat16) -> torch.Tensor:
    """CHANGE: upstream's Triton GEMMs (triton_fp8_gemm_1x128_128x128 and _1x128_128x1), which
    compat does not offer, as their arithmetic in torch: ``a [M, K]`` times its scales (1 x 128
    groups), ``b [K, N]`` times its own (128 x 128 blocks or 128 x 1 groups), a float32 product
    rounded to ``out_dtype``. It reads the scales as the GEMMs do: as factors to multiply by."""
    a = a_q.float() * _expand(a_s, *a_q.shape)
    b = b_q.float() * _expand(b_s, *b_q.shape)
    return (a @ b).to(out_dtype)


def randn_with_zeros(m: int, k: int, device: str, rows: int, cols: int) -> torch.Tensor:
    """Upstream's input: float32 randn ``[m, k]`` with ``x[:rows, :cols]`` zero, one all-zero
    group or block, whose codes would be NaN without the EPS floor. CHANGE: seeded, so that a
    failure reproduces."""
    torch.manual_seed(0)
    x = torch.randn(m, k, device=device)
    x[:rows, :cols] = 0.0
    return x


# the tests ---------------------------------------------------------------------------------------

# upstream's GEMM shapes: few tokens M, N and K multiples of 128
BLOCKWISE_SIZE_MNK = [
    (2, 512, 128),
    (2, 5120, 1280),
    (3, 2048, 2048),
    (4, 3584, 640),
    (13, 8704, 8576),
    (26, 18944, 1664),
    (67, 6656, 1408),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("M, N, K", BLOCKWISE_SIZE_MNK)
@pytest.mark.parametrize("dtype", [e4m3_dtype])
def test_triton_fp8_gemm_1x128_128x128(M, N, K, dtype, device):
    skip_large_on_cpu(device, N * K)
    torch.manual_seed(0)  # CHANGE: seeded, so that a failure reproduces
    A = torch.randn(M, K, dtype=torch.bfloat16, device=device)
    B = torch.randn(N, K, dtype=torch.bfloat16, device=device)
    C = A @ B.T
    A_q, A_s = act_quant_lhs(A, dtype=dtype)
    B_t_q, B_t_s = weight_quant_transposed_rhs(B, dtype=dtype)
    C_q = blockwise_gemm(A_q, B_t_q, A_s, B_t_s, out_dtype=torch.bfloat16)
    assert not C_q.isnan().any(), "C_q must not contain NaNs"

    sqnr = compute_error(C, C_q)
    min_sqnr = 28.0
    assert sqnr >= min_sqnr, f"SQNR {sqnr:.2f} must be >= {min_sqnr}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("M, N, K", BLOCKWISE_SIZE_MNK)
@pytest.mark.parametrize("dtype", [e4m3_dtype])
def test_triton_fp8_gemm_1x128_128x1(M, N, K, dtype, device):
    skip_large_on_cpu(device, N * K)
    torch.manual_seed(0)  # CHANGE: seeded, so that a failure reproduces
    A = torch.randn(K, M, dtype=torch.bfloat16, device=device)
    B = torch.randn(K, N, dtype=torch.bfloat16, device=device)
    C = A.T @ B
    A_t_q, A_t_s = act_quant_transposed_lhs(A, dtype=dtype)
    B_q, B_s = act_quant_rhs(B, dtype=dtype)
    C_q = blockwise_gemm(A_t_q, B_q, A_t_s, B_s, out_dtype=torch.bfloat16)

    assert not C_q.isnan().any(), "C_q must not contain NaNs"
    assert C.dtype == torch.bfloat16
    assert C_q.dtype == torch.bfloat16

    sqnr = compute_error(C, C_q)
    min_sqnr = 28.0
    assert sqnr >= min_sqnr, f"SQNR {sqnr:.2f} must be >= {min_sqnr}"


def _assert_exact(triton_fp8, triton_scale, ref_fp8, ref_scale) -> None:
    """Upstream's checks: no NaN codes, then codes and scales equal to the reference's (atol =
    rtol = 0). CHANGE: upstream repeats them in each quantizer test; here they are written once."""
    assert not triton_fp8.isnan().any(), "fp8 output must not contain NaNs"
    assert not ref_fp8.isnan().any(), "fp8 output must not contain NaNs"

    triton_fp32 = triton_fp8.to(torch.float32)
    ref_fp32 = ref_fp8.to(torch.float32)

    torch.testing.assert_close(
        triton_fp32,
        ref_fp32,
        atol=0,
        rtol=0,
        msg=f"Quantized tensors differ: max diff = {(triton_fp32 - ref_fp32).abs().max().item()}",
    )

    torch.testing.assert_close(
        triton_scale,
        ref_scale,
        atol=0,
        rtol=0,
        msg=f"Scales differ: max diff = {(triton_scale - ref_scale).abs().max().item()}",
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [128, 256])
def test_triton_quantize_fp8_act_quant_lhs(block_size, device):
    M, K = 4096, 1024
    x = randn_with_zeros(M, K, device, 1, block_size)

    triton_fp8, triton_scale = act_quant_lhs(x, block_size=block_size)

    ref_fp8, ref_scale = torch_blockwise_scale_act_quant_lhs(x, tile_size=block_size)

    _assert_exact(triton_fp8, triton_scale, ref_fp8, ref_scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [128, 256])
def test_triton_quantize_fp8_act_quant_rhs(block_size: int, device):
    M, K = 4096, 1024
    x = randn_with_zeros(M, K, device, block_size, block_size)

    triton_fp8, triton_scale = act_quant_rhs(x, block_size=block_size)

    ref_fp8, ref_scale = torch_blockwise_scale_act_quant_rhs(x, block_size=block_size)

    _assert_exact(triton_fp8, triton_scale, ref_fp8, ref_scale)


# upstream's sizes: 4M values (on CPU too) and 64M (GPU only)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [128, 256])
@pytest.mark.parametrize("M,K", [(4096, 1024), (4096, 4 * 4096)])
def test_triton_quantize_fp8_act_quant_transposed_lhs(M, K, block_size: int, device):
    skip_large_on_cpu(device, M * K)
    x = randn_with_zeros(M, K, device, 1, block_size)

    triton_fp8, triton_scale = act_quant_transposed_lhs(x, block_size=block_size)

    ref_fp8, ref_scale = torch_blockwise_scale_act_quant_lhs(
        x.t().contiguous(), tile_size=block_size
    )

    _assert_exact(triton_fp8, triton_scale, ref_fp8, ref_scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [128, 256])
@pytest.mark.parametrize("M,K", [(4096, 1024), (4096, 4 * 4096)])
def test_triton_quantize_fp8_weight_quant_rhs(M, K, block_size: int, device):
    skip_large_on_cpu(device, M * K)
    x = randn_with_zeros(M, K, device, block_size, block_size)

    triton_fp8, triton_scale = weight_quant_rhs(x, block_size=block_size)
    ref_fp8, ref_scale = torch_blockwise_scale_weight_quant(x, tile_size=block_size)

    _assert_exact(triton_fp8, triton_scale, ref_fp8, ref_scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [128, 256])
def test_triton_quantize_fp8_weight_quant_transposed_rhs(block_size: int, device):
    M = 512
    K = 2048
    x = randn_with_zeros(M, K, device, block_size, block_size)

    triton_fp8, triton_scale = weight_quant_transposed_rhs(x, block_size=block_size)
    ref_fp8, ref_scale = torch_blockwise_scale_weight_quant(
        x.t().contiguous(), tile_size=block_size
    )

    _assert_exact(triton_fp8, triton_scale, ref_fp8, ref_scale)
