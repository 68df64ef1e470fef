# Ported from vllm-project/vllm, tests/kernels/moe/test_silu_mul_fp8_quant_deep_gemm.py at
# commit 054e784a427203f0516ac1ecdd8543c64a57eb6b. SPDX-License-Identifier: Apache-2.0;
# Copyright contributors to the vLLM project. The cases, the reference (upstream's torch
# emulation of its CUDA kernel, carried here as test data) and the assertions are upstream's,
# re-expressed; each change is marked "CHANGE:".
"""vLLM's test of ``persistent_masked_m_silu_mul_quant`` against its own reference."""

import random

import pytest
import torch
from _port import DEVICES, skip_large_on_cpu

# CHANGE: the function under test is the drop-in, not vllm's
from fp8_group_quant.compat import persistent_masked_m_silu_mul_quant

# CHANGE: vllm.utils.deep_gemm.DeepGemmQuantScaleFMT, vllm.utils.math_utils.cdiv and
# round_up, get_fp8_min_max and current_platform.fp8_dtype() on CUDA, as plain values
SCALE_FMTS = ["FLOAT32", "FLOAT32_CEIL_UE8M0", "UE8M0"]
FP8_DTYPE = torch.float8_e4m3fn
FP8_MIN, FP8_MAX = -448.0, 448.0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return cdiv(a, b) * b


# upstream's cases (E, T, H, fp8 type); its two fnuz cases run its CUDA branch with the
# platform's fp8 dtype, as upstream's test body does
CASES = [
    (1, 1, 128, FP8_DTYPE),
    (1, 4, 128 * 1, FP8_DTYPE),
    (2, 4, 128 * 2, FP8_DTYPE),
    (1, 4, 128 * 3, FP8_DTYPE),
    (8, 16, 128 * 4, FP8_DTYPE),
    (8, 16, 128 * 5, FP8_DTYPE),
    (8, 16, 128 * 6, FP8_DTYPE),
    (8, 16, 128 * 7, FP8_DTYPE),
    (8, 16, 128 * 8, FP8_DTYPE),
    (8, 16, 128 * 9, FP8_DTYPE),
    (8, 64, 7168, FP8_DTYPE),
    (8, 128, 128 * 33, FP8_DTYPE),
    (1, 4, 128 * 10, FP8_DTYPE),
    (8, 128, 7168, FP8_DTYPE),
    (8, 512, 7168, FP8_DTYPE),
    (8, 1024, 7168, FP8_DTYPE),
    (17, 31, 768, FP8_DTYPE),
    (32, 64, 256, FP8_DTYPE),
    (256, 8, 7168, FP8_DTYPE),
    (256, 32, 7168, FP8_DTYPE),
    (256, 64, 7168, FP8_DTYPE),
    (8, 512, 7168, torch.float8_e4m3fnuz),
    (8, 1024, 7168, torch.float8_e4m3fnuz),
]


def as_uint8(x) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x).view(torch.uint8)


# upstream's reference of its CUDA kernel (the "is_cuda" branches of silu and do_quant)
def silu(x: torch.Tensor) -> torch.Tensor:
    x_f32 = x.to(torch.float32)
    return (x_f32 / (1.0 + torch.exp(-x_f32))).to(torch.bfloat16)


def do_quant(x: torch.Tensor, group_size: int, ceil_ue8m0: bool):
    bf16 = dict(device=x.device, dtype=torch.bfloat16)
    eps, one = torch.tensor([1e-10], **bf16), torch.tensor([1.0], **bf16)
    fp8_max, fp8_min = torch.tensor([FP8_MAX], **bf16), torch.tensor([FP8_MIN], **bf16)
    fp8_max_inv = one / fp8_max
    num_groups = x.numel() // group_size
    shape = x.shape
    x = x.to(torch.bfloat16).view((-1, group_size))
    amax = x.abs().amax(dim=1).clamp(min=eps)
    s = amax * fp8_max_inv
    if ceil_ue8m0:
        s = torch.exp2(torch.ceil(torch.log2(s).to(torch.bfloat16)).to(torch.bfloat16))
        s = s.to(torch.bfloat16)
    inv_s = (one / s).view((num_groups, 1))
    xq = torch.clamp(x * inv_s, min=fp8_min.item(), max=fp8_max.item()).to(FP8_DTYPE)
    xq = xq.view(shape)
    return xq, s.view((-1, xq.size(-1) // group_size))


def silu_mul_quant(gate, up, group_size: int, ceil_ue8m0: bool):
    assert gate.dtype == torch.bfloat16 and up.dtype == torch.bfloat16
    return do_quant(silu(gate) * up, group_size, ceil_ue8m0)


def pack_scales(x: torch.Tensor, tokens_per_expert: torch.Tensor, device) -> torch.Tensor:
    """float32 scales [E, T, G] -> their exponent bytes packed into int32 [E, T, ceil(G/4)]."""
    E, T, G = x.size()
    packed = torch.zeros((E, T, round_up(G, 4)), dtype=torch.uint8, device=device)
    for e in range(E):
        nt = tokens_per_expert[e].item()
        packed[e, :nt, :G] = x[e, :nt].view(torch.int32) >> 23
    return packed.view(torch.int32)


def ref_with_scale_fmt(E, T, H, group_size, tokens_per_expert, gate, up, scale_fmt, device):
    ceil_ue8m0 = scale_fmt in ("UE8M0", "FLOAT32_CEIL_UE8M0")
    ref_q = torch.empty((E, T, H), dtype=FP8_DTYPE, device=device)
    ref_s = torch.empty((E, T, cdiv(H, group_size)), dtype=torch.float32, device=device)
    for e in range(E):
        nt = tokens_per_expert[e].item()
        if nt == 0:
            continue
        ref_q[e, :nt], ref_s[e, :nt] = silu_mul_quant(gate[e, :nt], up[e, :nt], group_size,
                                                      ceil_ue8m0)  # fmt: skip
    if scale_fmt != "UE8M0":
        return ref_q, ref_s
    return ref_q, pack_scales(ref_s, tokens_per_expert, device)


def token_random(E, T, H2, tokens_per_expert, device):
    """Each token uniform in its own range, so that a range of scales is tested."""
    y = torch.empty((E, T, H2), dtype=torch.bfloat16, device=device)
    for e in range(E):
        for t in range(tokens_per_expert[e].item()):
            exp = random.choice(range(1, 20))
            y[e, t].uniform_(-(2**exp), 2**exp)
    return y


# CHANGE: every case also runs on torch CPU tensors (the NumPy backend) where small enough
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("E,T,H,fp8_type", CASES)
@torch.inference_mode()
def test_silu_mul_fp8_quant_deep_gemm(E: int, T: int, H: int, fp8_type, device):
    skip_large_on_cpu(device, E * T * 2 * H)
    group_size = 128
    # CHANGE: vllm's set_random_seed(42) seeds these two
    random.seed(42)
    torch.manual_seed(42)

    tokens_per_expert = torch.randint(0, T, (E,), dtype=torch.int32, device=device)
    tokens_per_expert[0] = T
    if E > 1:
        tokens_per_expert[1] = 0
    y = token_random(E, T, 2 * H, tokens_per_expert, device)
    gate = y[..., :H].to(torch.bfloat16)
    up = y[..., H:].to(torch.bfloat16)

    for scale_fmt in SCALE_FMTS:
        y_q, y_s = persistent_masked_m_silu_mul_quant(
            y, tokens_per_expert, group_size=group_size, quant_scale_fmt=scale_fmt
        )
        ref_y_q, ref_y_s = ref_with_scale_fmt(E, T, H, group_size, tokens_per_expert, gate, up,
                                              scale_fmt, device)  # fmt: skip
        # CHANGE: upstream's DeepGEMM layout check (transform_sf_into_required_layout) runs on
        # SM100 with DeepGEMM installed only; neither is here

        expected_scale_dtype = torch.int32 if scale_fmt == "UE8M0" else torch.float32
        assert y_s.dtype == expected_scale_dtype
        assert ref_y_s.dtype == expected_scale_dtype
        if scale_fmt == "UE8M0":
            G = H // group_size
            packed_G = cdiv(G, 4)
            assert y_s.shape == (E, T, packed_G)
            assert y_s.stride() == (T * packed_G, 1, T)

        for e in range(E):
            nt = tokens_per_expert[e].item()
            torch.testing.assert_close(
                y_q[e, :nt].to(torch.float32), ref_y_q[e, :nt].to(torch.float32)
            )
            if scale_fmt == "UE8M0":
                torch.testing.assert_close(as_uint8(y_s[e]), as_uint8(ref_y_s[e]))
            else:
                torch.testing.assert_close(y_s[e, :nt], ref_y_s[e, :nt])
