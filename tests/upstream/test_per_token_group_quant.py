# Ported from vllm-project/vllm, tests/kernels/quantization/test_per_token_group_quant.py at
# commit 06c4e1f5cbae1273b05948bf83367893ab8df684. SPDX-License-Identifier: Apache-2.0;
# Copyright contributors to the vLLM project. The cases and assertions are upstream's,
# re-expressed; upstream's reference (vLLM's Triton per_token_group_quant_fp8 path, taken by
# patching is_cuda) is carried as its float32 steps in torch; each change is marked "CHANGE:".
"""vLLM's tests of ``per_token_group_quant_fp8`` and its packed DeepGEMM variant."""

import pytest
import torch
from _port import DEVICES

# CHANGE: the functions under test are the drop-ins, not vllm's fp8_utils / int8_utils
from fp8_group_quant.compat import (
    per_token_group_quant_fp8,
    per_token_group_quant_fp8_packed_for_deepgemm,
)

FP8 = torch.float8_e4m3fn


def triton_reference(x: torch.Tensor, group_size: int, use_ue8m0: bool):
    """CHANGE: vLLM's Triton _per_token_group_quant_fp8 (row-major scales) as its float32 steps
    in torch: absmax floored at eps, scale absmax / fp8_max, the UE8M0 scale
    exp2(ceil(log2(scale))), codes clamp(y / scale)."""
    finfo = torch.finfo(FP8)
    y = x.to(torch.float32).view(*x.shape[:-1], -1, group_size)
    absmax = y.abs().amax(dim=-1).clamp(min=1e-10)
    scale = absmax / finfo.max
    if use_ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    q = torch.clamp(y / scale[..., None], finfo.min, finfo.max).to(FP8)
    return q.view(x.shape), scale


# CHANGE: every case also runs on torch CPU tensors (the NumPy backend)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(31, 128), (32, 128), (63, 256), (64, 256), (16, 512)])
@pytest.mark.parametrize("column_major", [False, True])
@pytest.mark.parametrize("tma_aligned", [False, True])
@pytest.mark.parametrize("scale_ue8m0", [False, True])
@pytest.mark.parametrize("group_size", [64, 128])
def test_per_token_group_quant_fp8(
    shape, column_major: bool, tma_aligned: bool, scale_ue8m0: bool, group_size: int, device
):
    torch.manual_seed(42)
    num_tokens, hidden_dim = shape
    x = torch.randn((num_tokens, hidden_dim), device=device, dtype=torch.bfloat16) * 8
    out_q, scale = per_token_group_quant_fp8(
        x,
        group_size,
        column_major_scales=column_major,
        tma_aligned_scales=tma_aligned,
        use_ue8m0=scale_ue8m0,
    )
    ref_q, ref_s = triton_reference(x, group_size, scale_ue8m0)
    assert torch.allclose(out_q.float(), ref_q.float(), atol=0.15, rtol=0.15)
    assert torch.allclose(scale, ref_s, atol=0.01, rtol=0.01)


def _expected_packed(ref_s: torch.Tensor, mn: int, groups_per_row: int) -> torch.Tensor:
    """The packed storage vLLM expects: UE8M0 bytes of the reference's scales, four a word,
    word (g // 4) of row r at (g // 4) * align(mn, 4) + r, every other byte zero."""
    k_num_packed = (groups_per_row + 3) // 4
    tma_aligned_mn = ((mn + 3) // 4) * 4
    num_scale_elems = mn + (k_num_packed - 1) * tma_aligned_mn
    exponents = (ref_s.reshape(mn, groups_per_row).view(torch.int32) >> 23) & 0xFF
    expected = torch.zeros(num_scale_elems, dtype=torch.int32, device="cpu")
    for row in range(mn):
        for g in range(groups_per_row):
            idx = (g // 4) * tma_aligned_mn + row
            expected[idx] |= int(exponents[row, g].item()) << ((g % 4) * 8)
    return expected


def _packed_storage(out_s_packed: torch.Tensor, num_scale_elems: int) -> torch.Tensor:
    return torch.as_strided(out_s_packed, (num_scale_elems,), (1,)).cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "num_tokens,hidden_dim,group_size",
    [
        (4, 7168, 128),  # no padding: mn = 4, groups_per_row = 56
        (1, 7168, 128),  # MN padding only
        (3, 7168, 128),
        (4, 640, 128),  # K padding only: 5 groups
        (4, 768, 128),  # 6 groups
        (4, 384, 128),  # one packed column, no padding
        (1, 384, 128),  # MN and K padding
        (3, 640, 128),
        (64, 7168, 128),  # larger, no padding
        (128, 14336, 128),
        (127, 7168, 128),  # larger, padding
        (253, 640, 128),
    ],
)
@pytest.mark.parametrize("poisoned_scales", [False, True])
def test_per_token_group_quant_fp8_packed(
    num_tokens, hidden_dim, group_size, poisoned_scales, device
):
    torch.manual_seed(42)
    x = torch.randn((num_tokens, hidden_dim), device=device, dtype=torch.bfloat16) * 8
    mn = num_tokens
    groups_per_row = hidden_dim // group_size
    k_num_packed = (groups_per_row + 3) // 4
    tma_aligned_mn = ((mn + 3) // 4) * 4
    num_scale_elems = mn + (k_num_packed - 1) * tma_aligned_mn
    if poisoned_scales:
        # CHANGE: upstream calls torch.ops._C.per_token_group_fp8_quant_packed on a poisoned
        # buffer; the drop-in's fgq.quantize takes the same buffer as scale_out
        import fp8_group_quant as fgq

        out_q = torch.empty_like(x, dtype=FP8)
        out_s_packed = torch.empty_strided(
            (mn, k_num_packed), (1, tma_aligned_mn), device=device, dtype=torch.int32
        )
        torch.as_strided(out_s_packed, (num_scale_elems,), (1,)).fill_(0x7F7F7F7F)
        if mn % 4:
            # CHANGE: a known departure, kept visible: vLLM's exact-size buffer ends at the last
            # real row of its last word column, and the drop-in refuses it, as the packed layout
            # owns align(M, 4) rows of every column (docs/spec.md, section 7)
            with pytest.raises(ValueError, match="owns .* bytes of storage"):
                fgq.quantize(x, group_size, scale="ue8m0", layout="packed", out=out_q,
                             scale_out=out_s_packed)  # fmt: skip
            return
        fgq.quantize(x, group_size, scale="ue8m0", layout="packed", out=out_q,
                     scale_out=out_s_packed)  # fmt: skip
    else:
        out_q, out_s_packed = per_token_group_quant_fp8_packed_for_deepgemm(
            x, group_size=group_size, use_ue8m0=True
        )
    ref_q, ref_s = triton_reference(x, group_size, use_ue8m0=True)
    assert torch.equal(out_q.view(torch.uint8), ref_q.view(torch.uint8)), "q mismatch"
    expected = _expected_packed(ref_s, mn, groups_per_row)
    actual = _packed_storage(out_s_packed, num_scale_elems)
    assert torch.equal(actual, expected), "packed scale storage mismatch"


@pytest.mark.parametrize("device", DEVICES)
def test_per_token_group_quant_fp8_packed_all_zero(device):
    # all-zero input: the 1e-10 floor gives 2^-33, UE8M0 byte 0x5E, and zero codes
    num_tokens, hidden_dim, group_size = 4, 7168, 128
    x = torch.zeros((num_tokens, hidden_dim), device=device, dtype=torch.bfloat16)
    out_q, out_s_packed = per_token_group_quant_fp8_packed_for_deepgemm(
        x, group_size=group_size, use_ue8m0=True
    )
    assert torch.equal(out_q.view(torch.uint8), torch.zeros_like(out_q, dtype=torch.uint8))
    mn, groups_per_row = num_tokens, hidden_dim // group_size
    k_num_packed = (groups_per_row + 3) // 4
    num_scale_elems = mn + (k_num_packed - 1) * (((mn + 3) // 4) * 4)
    ref_s = torch.full((mn, groups_per_row), 2.0**-33, dtype=torch.float32)
    expected = _expected_packed(ref_s, mn, groups_per_row)
    assert torch.equal(_packed_storage(out_s_packed, num_scale_elems), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_per_token_group_quant_fp8_packed_mantissa_rounds_up(device):
    # groups of 672 = 1.5 * 448: the scale 1.5 rounds up to 2 (the exponent byte + 1)
    num_tokens, hidden_dim, group_size = 4, 7168, 128
    x = torch.full((num_tokens, hidden_dim), 672.0, device=device, dtype=torch.bfloat16)
    out_q, out_s_packed = per_token_group_quant_fp8_packed_for_deepgemm(
        x, group_size=group_size, use_ue8m0=True
    )
    ref_q, ref_s = triton_reference(x, group_size, use_ue8m0=True)
    assert torch.equal(out_q.view(torch.uint8), ref_q.view(torch.uint8))
    mn, groups_per_row = num_tokens, hidden_dim // group_size
    k_num_packed = (groups_per_row + 3) // 4
    num_scale_elems = mn + (k_num_packed - 1) * (((mn + 3) // 4) * 4)
    expected = _expected_packed(ref_s, mn, groups_per_row)
    assert torch.equal(_packed_storage(out_s_packed, num_scale_elems), expected)


# CHANGE: upstream's test_per_token_group_quant_int8 tests vLLM's int8_utils, for which compat
# has no drop-in; not ported
