# Ported from vllm-project/vllm,
# tests/kernels/moe/test_silu_mul_per_token_group_quant_fp8_colmajor.py at commit
# cf34c18c302ae4b2702d03afe903f5ccf71e2599. SPDX-License-Identifier: Apache-2.0; Copyright
# contributors to the vLLM project. The cases and assertions are upstream's, re-expressed;
# upstream's reference (vLLM's silu_and_mul CUDA op, then vLLM's Triton
# _per_token_group_quant_fp8_colmajor) is carried as test data: the Triton kernel's steps as a
# Triton kernel on the GPU, and the same float32 steps in torch; each change is marked
# "CHANGE:".
"""vLLM's test of ``silu_mul_per_token_group_quant_fp8_colmajor``, clamped SwiGLU included."""

import pytest
import torch
from _port import DEVICES, skip_large_on_cpu

# CHANGE: the function under test is the drop-in, not vllm's
from fp8_group_quant.compat import silu_mul_per_token_group_quant_fp8_colmajor

FLOAT8_DTYPE = torch.float8_e4m3fn
GROUP_SIZE = 128
# CHANGE: vllm.utils.deep_gemm.is_deep_gemm_e8m0_used() is False on Hopper (SM90), where these
# run; both values are tested
USE_UE8M0 = [False, True]


def _triton_reference_kernel():
    """vLLM's Triton _per_token_group_quant_fp8_colmajor, step for step (the GPU reference)."""
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def quant_colmajor(y_ptr, y_q_ptr, y_s_ptr, group_size, y_num_columns, y_row_stride,
                       y_s_col_stride, eps, fp8_min, fp8_max, use_ue8m0: tl.constexpr,
                       BLOCK: tl.constexpr, PRECISE: tl.constexpr = True):  # fmt: skip
        groups_per_row = y_num_columns // group_size
        g_id = tl.program_id(0)
        row = g_id // groups_per_row
        row_g_id = g_id % groups_per_row
        y_ptr += (row.to(tl.int64) * y_row_stride) + (row_g_id.to(tl.int64) * group_size)
        y_q_ptr += g_id.to(tl.int64) * group_size
        y_s_ptr += row_g_id * y_s_col_stride + row
        cols = tl.arange(0, BLOCK)
        mask = cols < group_size
        y = tl.load(y_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        absmax = tl.maximum(tl.max(tl.abs(y)), eps)
        # CHANGE: Triton's float32 '/' is PTX div.full.f32 (within 2 ulp, not correctly rounded);
        # bfloat16 products make exact e4m3 ties common, which an ulp then rounds a code apart
        # from IEEE division (0.15% of codes with float32 scales on the H200, none with UE8M0).
        # Both divisions are IEEE here (div_rn), as on the CPU and in docs/spec.md
        if PRECISE:
            scale_raw = tl.math.div_rn(absmax, fp8_max)
        else:
            scale_raw = absmax / fp8_max
        y_s = tl.math.exp2(tl.ceil(tl.log2(scale_raw))) if use_ue8m0 else scale_raw
        y_q = tl.math.div_rn(y, y_s) if PRECISE else y / y_s
        y_q = tl.clamp(y_q, fp8_min, fp8_max).to(y_q_ptr.dtype.element_ty)
        tl.store(y_q_ptr + cols, y_q, mask=mask)
        tl.store(y_s_ptr, y_s)

    return triton, quant_colmajor


def reference_quant(x: torch.Tensor, use_ue8m0: bool, precise: bool = True):
    """Upstream's reference quantizer: column-major float32 scales [M, N/G], strides (1, M)."""
    finfo = torch.finfo(FLOAT8_DTYPE)
    shape = (x.shape[-1] // GROUP_SIZE,) + x.shape[:-1]
    x_s = torch.empty(shape, device=x.device, dtype=torch.float32).permute(-1, -2)
    if x.is_cuda:
        triton, kernel = _triton_reference_kernel()
        x_q = torch.empty_like(x, device=x.device, dtype=FLOAT8_DTYPE)
        block = triton.next_power_of_2(GROUP_SIZE)
        kernel[(x.numel() // GROUP_SIZE,)](
            x, x_q, x_s, GROUP_SIZE, x.shape[1], x.stride(0), x_s.stride(1), eps=1e-10,
            fp8_min=finfo.min, fp8_max=finfo.max, use_ue8m0=use_ue8m0, BLOCK=block, PRECISE=precise,
            num_warps=min(max(block // 256, 1), 8), num_stages=1,
        )  # fmt: skip
        return x_q, x_s
    # CHANGE: on the CPU the same float32 steps in torch (IEEE division, as on the GPU)
    y = x.to(torch.float32).view(x.shape[0], -1, GROUP_SIZE)
    absmax = y.abs().amax(dim=-1).clamp(min=1e-10)
    y_s = absmax / finfo.max
    if use_ue8m0:
        y_s = torch.exp2(torch.ceil(torch.log2(y_s)))
    x_q = torch.clamp(y / y_s[..., None], finfo.min, finfo.max).to(FLOAT8_DTYPE)
    x_s.copy_(y_s)
    return x_q.view(x.shape), x_s


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """CHANGE: torch.ops._C.silu_and_mul (vLLM's CUDA op) in torch: SiLU in float32 with
    expf, rounded to the input dtype, times up, rounded again (its act_and_mul_kernel)."""
    n = x.size(-1) // 2
    gate = x[..., :n].to(torch.float32)
    act = (gate / (1.0 + torch.exp(-gate))).to(x.dtype)
    return act * x[..., n:]


def reference(x: torch.Tensor, use_ue8m0: bool):
    return reference_quant(silu_and_mul(x).to(torch.bfloat16), use_ue8m0)


def reference_with_clamp(x: torch.Tensor, use_ue8m0: bool, clamp_limit: float):
    """Gate clamped from above, up on both sides, in float32 and rounded to the input dtype,
    then the unclamped reference."""
    n = x.size(1) // 2
    gate = x[..., :n].to(torch.float32).clamp(max=clamp_limit).to(x.dtype)
    up = x[..., n:].to(torch.float32).clamp(min=-clamp_limit, max=clamp_limit).to(x.dtype)
    return reference(torch.cat([gate, up], dim=-1), use_ue8m0)


# CHANGE: every case also runs on torch CPU tensors (the NumPy backend), and over use_ue8m0
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_ue8m0", USE_UE8M0)
@pytest.mark.parametrize("T", [128, 256, 512])
@pytest.mark.parametrize("N", [128 * 2, 256 * 2, 768 * 2, 2048 * 2, 7168 * 2])
def test_silu_mul_fp8_quant_deep_gemm(T: int, N: int, use_ue8m0: bool, device):
    skip_large_on_cpu(device, T * N)
    torch.manual_seed(42)  # CHANGE: vllm's set_random_seed(42)
    input = torch.rand((T, N), dtype=torch.bfloat16, device=device)
    output, output_scales = silu_mul_per_token_group_quant_fp8_colmajor(input, use_ue8m0=use_ue8m0)
    ref_output, ref_output_scales = reference(input, use_ue8m0)
    torch.testing.assert_close(output.to(torch.float32), ref_output.to(torch.float32))
    torch.testing.assert_close(output_scales, ref_output_scales)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_ue8m0", USE_UE8M0)
@pytest.mark.parametrize("T", [128, 256, 512])
@pytest.mark.parametrize("N", [128 * 2, 256 * 2, 768 * 2, 2048 * 2, 7168 * 2])
@pytest.mark.parametrize("clamp_limit", [7.0, 10.0])
def test_silu_mul_fp8_quant_deep_gemm_clamp(T: int, N: int, clamp_limit: float, use_ue8m0, device):
    skip_large_on_cpu(device, T * N)
    torch.manual_seed(42)
    # wide enough that values pass both limits and the clamp binds
    input = torch.randn((T, N), dtype=torch.bfloat16, device=device) * 8.0
    output, output_scales = silu_mul_per_token_group_quant_fp8_colmajor(
        input, use_ue8m0=use_ue8m0, clamp_limit=clamp_limit
    )
    ref_output, ref_output_scales = reference_with_clamp(input, use_ue8m0, clamp_limit)
    torch.testing.assert_close(output.to(torch.float32), ref_output.to(torch.float32))
    torch.testing.assert_close(output_scales, ref_output_scales)
