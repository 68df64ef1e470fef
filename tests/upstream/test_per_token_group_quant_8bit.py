# Ported from sgl-project/sglang, sgl-kernel/tests/test_per_token_group_quant_8bit.py at commit
# 01da1d0757479f006103c888b482a0398cba6dd8 (with sgl-kernel/python/sgl_kernel/test_utils.py's
# data generator and comparison). SPDX-License-Identifier: Apache-2.0; Copyright 2023-2024
# SGLang Team. The cases and assertions are upstream's, re-expressed; upstream's reference
# (SGLang's Triton per_token_group_quant_8bit) is carried as its float32 steps in torch; each
# change is marked "CHANGE:".
"""SGLang's test of ``sglang_per_token_group_quant_8bit`` (here the fp8 drop-in)."""

import itertools

import pytest
import torch
from _port import DEVICES, skip_large_on_cpu

# CHANGE: the function under test is the drop-in (fp8 only: compat has no int8 SGLang entry)
from fp8_group_quant.compat import sglang_per_token_group_quant_fp8

FP8 = torch.float8_e4m3fn
FLAG_SETS = [
    dict(column_major_scales=False, scale_tma_aligned=False, scale_ue8m0=False),
    dict(column_major_scales=True, scale_tma_aligned=False, scale_ue8m0=False),
    dict(column_major_scales=True, scale_tma_aligned=True, scale_ue8m0=False),
    dict(column_major_scales=True, scale_tma_aligned=True, scale_ue8m0=True),
]
# CHANGE: the fused SiLU and masked-layout configs (upstream's second product) need SGLang's
# silu_and_mul and its masked Triton reference, which are not carried yet; int8 has no
# SGLang drop-in in compat
CONFIGS = list(
    itertools.product(
        [1, 4, 16, 64, 127, 128, 512, 1024, 4096, 8192],  # num_tokens
        [512, 1024, 1536, 2048, 4096, 7168, 16384],  # hidden_dim
        [128],  # group_size
        range(len(FLAG_SETS)),
    )
)


def create_test_data(num_tokens: int, hidden_dim: int, device: str) -> torch.Tensor:
    """Upstream's non-masked data: randn bfloat16, about 0.1% of the values times 10."""
    gen = torch.Generator(device=device)
    gen.manual_seed(num_tokens * 10000 + hidden_dim)
    x = torch.randn(num_tokens, hidden_dim, device=device, dtype=torch.bfloat16, generator=gen)
    x[torch.randn(x.shape, device=device, generator=gen) < 0.001] *= 10
    return x


def triton_reference(x: torch.Tensor, group_size: int, eps: float, flags: dict):
    """CHANGE: SGLang's Triton per_token_group_quant_8bit as float32 steps: the scale
    max(absmax, eps) / fp8_max, with scale_ue8m0 exp2(ceil(log2(.))); codes clamp(y / s)."""
    finfo = torch.finfo(FP8)
    y = x.to(torch.float32).view(x.shape[0], -1, group_size)
    s = y.abs().amax(dim=-1).clamp(min=eps) / finfo.max
    if flags["scale_ue8m0"]:
        s = torch.exp2(torch.ceil(torch.log2(s)))
    q = torch.clamp(y / s[..., None], finfo.min, finfo.max).to(FP8).view(x.shape)
    if flags["scale_ue8m0"]:  # CHANGE: the exponent bytes, four a word, [M, ceil(G/4)]
        exponents = (s.view(torch.int32) >> 23).to(torch.uint8)
        words = -(-s.shape[1] // 4)
        packed = torch.zeros(s.shape[0], 4 * words, dtype=torch.uint8, device=x.device)
        packed[:, : s.shape[1]] = exponents
        return q, packed.view(torch.int32)
    return q, s


def assert_all_close_or_tiny_diff(a: torch.Tensor, b: torch.Tensor):
    """No sign flip, no code two steps apart, and few one step apart."""
    assert a.shape == b.shape and a.dtype == b.dtype, f"{a.shape=} {b.shape=} {a.dtype=} {b.dtype=}"
    numel = a.numel()
    a_u8, b_u8 = a.view(torch.uint8), b.view(torch.uint8)
    diff = (a_u8.to(torch.int16) - b_u8.to(torch.int16)).abs()
    count_diff_sign = ((a_u8 >= 0) & (b_u8 < 0)).sum().item()
    count_tiny_diff = (diff == 1).sum().item()
    count_large_diff = (diff >= 2).sum().item()
    assert (
        count_diff_sign == 0
        and count_large_diff == 0
        and (count_tiny_diff / numel < 0.005 or (count_tiny_diff / numel < 0.04 and numel <= 4096))
    ), f"{count_diff_sign=} {count_tiny_diff=} {count_large_diff=} {numel=}"


@pytest.mark.parametrize("device", DEVICES)  # CHANGE: torch CPU tensors too (NumPy backend)
@pytest.mark.parametrize("num_tokens, hidden_dim, group_size, flag_set", CONFIGS)
def test_per_token_group_quant_with_column_major(num_tokens, hidden_dim, group_size, flag_set,
                                                 device):  # fmt: skip
    skip_large_on_cpu(device, num_tokens * hidden_dim)
    flags = FLAG_SETS[flag_set]
    x = create_test_data(num_tokens, hidden_dim, device)
    x_q_triton, x_s_triton = triton_reference(x, group_size, 1e-10, flags)
    x_q_sglang, x_s_sglang = sglang_per_token_group_quant_fp8(x, group_size, eps=1e-10, **flags)
    assert_all_close_or_tiny_diff(x_q_triton, x_q_sglang)
    torch.testing.assert_close(
        x_s_triton.contiguous(), x_s_sglang.contiguous(), rtol=1e-3, atol=1e-5
    )
