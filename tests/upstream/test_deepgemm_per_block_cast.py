# DeepGEMM (deepseek-ai/DeepGEMM) has no test of per_block_cast_to_fp8: its tests call it to
# make the GEMMs' operands (tests/generators.py) and check the GEMMs. This file checks the
# drop-in against DeepGEMM's function itself, carried below as test data from
# deep_gemm/utils/math.py at commit 38939a4c494ce6e904b54da94a1183955a5e9497 (with the
# ceil_to_ue8m0 and align it calls), re-expressed, on the inputs its tests give it: bfloat16
# randn weights of the shapes tests/generators.py draws, with and without use_ue8m0. Its one
# change is marked "CHANGE:".
# SPDX-License-Identifier: MIT; Copyright (c) 2025 DeepSeek.
"""``per_block_cast_to_fp8`` against DeepGEMM's own, bit for bit on codes and scales."""

import pytest
import torch
from _port import DEVICES, skip_large_on_cpu

from fp8_group_quant.compat import per_block_cast_to_fp8

# DeepGEMM's reference (deep_gemm/utils/math.py) --------------------------------------------------


def align(x: int, y: int) -> int:
    return -(-x // y) * y


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """The smallest power of two not below ``|x|``, taken on the bits: the exponent raised by
    one where any mantissa bit is set, clamped to [1, 254]."""
    bits = x.abs().float().view(torch.int)
    exponent = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool().int()
    return (exponent.clamp(1, 254) << 23).view(torch.float)


def reference_per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128):
    """DeepGEMM's ``per_block_cast_to_fp8``: x zero-padded to whole ``gran_k`` x ``gran_k``
    blocks; each block's float32 maximum floored at 1e-4; the scale ``amax / 448`` (or its
    ceil_to_ue8m0); codes ``e4m3(x * (1 / scale))``. Returns the codes ``[m, n]`` and the scales
    ``[ceil(m / gran_k), ceil(n / gran_k)]``.

    CHANGE: upstream writes ``amax / 448.0``, which torch evaluates on CUDA tensors as
    ``amax * RN(1 / 448)`` (aten's div_true_kernel_cuda takes a Python divisor's reciprocal) and
    on CPU tensors as a division, an ulp apart for half the blocks; DeepGEMM runs on CUDA, so
    the product is written out here, the same on both devices."""
    assert x.dim() == 2
    m, n = x.shape
    padded = torch.zeros((align(m, gran_k), align(n, gran_k)), dtype=x.dtype, device=x.device)
    padded[:m, :n] = x
    blocks = padded.view(-1, gran_k, padded.size(1) // gran_k, gran_k)
    amax = blocks.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    sf = amax * (1.0 / 448.0)
    sf = ceil_to_ue8m0(sf) if use_ue8m0 else sf
    codes = (blocks * (1.0 / sf)).to(torch.float8_e4m3fn)
    return codes.view_as(padded)[:m, :n].contiguous(), sf.view(blocks.size(0), blocks.size(2))


# the checks --------------------------------------------------------------------------------------


def _assert_bits_equal(what: str, got: torch.Tensor, expected: torch.Tensor, x, block) -> None:
    """``got`` and ``expected`` hold the same bytes; else the first mismatch, the largest input
    value of its block and both results."""
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != {expected.dtype}"
    view = torch.uint8 if got.element_size() == 1 else torch.int32
    a, b = got.contiguous().view(view).cpu(), expected.contiguous().view(view).cpu()
    if torch.equal(a, b):
        return
    mismatch = (a != b).nonzero()
    i = tuple(int(v) for v in mismatch[0])
    r, c = block(i)
    amax = x[r : r + 128, c : c + 128].abs().max().item()
    raise AssertionError(
        f"{what}: {len(mismatch)} of {a.numel()} differ; first at {i}: got "
        f"{got[i].float().item()!r} (bits {int(a[i]):#x}), expected {expected[i].float().item()!r}"
        f" (bits {int(b[i]):#x}); its block [{r}:{r + 128}, {c}:{c + 128}] has max |x| {amax!r}"
    )


def check_against_deepgemm(x: torch.Tensor, use_ue8m0: bool) -> None:
    q, sf = per_block_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    ref_q, ref_sf = reference_per_block_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    assert q.is_contiguous() and sf.is_contiguous()
    _assert_bits_equal("codes", q, ref_q, x, lambda i: (i[0] // 128 * 128, i[1] // 128 * 128))
    _assert_bits_equal("scales", sf, ref_sf, x, lambda i: (i[0] * 128, i[1] * 128))


# the B operands tests/generators.py casts with per_block_cast_to_fp8: [N, K] of its forward GEMMs
# (bf16_output_nk) and m-grouped GEMMs (n_k_list), [K, N] of its Dgrad GEMMs; 576, 2112 and 1536
# are not multiples of 128, so partial edge blocks are covered
SHAPES = [
    (2112, 7168), (576, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168),
    (7168, 2048), (6144, 7168), (7168, 3072), (4096, 4096), (4096, 2048),
    (7168, 2112), (7168, 576), (1536, 24576), (512, 32768), (16384, 7168), (2048, 7168),
]  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_ue8m0", [False, True])  # SM90's float scales, SM100's UE8M0
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_per_block_cast_to_fp8_matches_deepgemm(shape, use_ue8m0, device):
    skip_large_on_cpu(device, shape[0] * shape[1])
    torch.manual_seed(0)  # DeepGEMM's reset_seed()
    x = torch.randn(shape, dtype=torch.bfloat16, device=device)
    check_against_deepgemm(x, use_ue8m0)


# known inputs: all zero (the 1e-4 floor sets the scale), one block of 672 beside tiny values
# (a tie in e4m3 under UE8M0 scales, values under the floor elsewhere), and the extremes of
# bfloat16, a partial block at each edge
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("use_ue8m0", [False, True])
@pytest.mark.parametrize("fill", ["zeros", "672_and_tiny", "extremes"])
def test_per_block_cast_to_fp8_known_inputs(fill, use_ue8m0, device):
    x = torch.zeros((200, 300), dtype=torch.bfloat16, device=device)
    if fill == "672_and_tiny":
        x[:128, :128] = 672.0
        x[128:, 128:] = 3e-6
    elif fill == "extremes":
        finfo = torch.finfo(torch.bfloat16)
        x[::2] = finfo.max
        x[1::2] = -finfo.tiny
    check_against_deepgemm(x, use_ue8m0)
