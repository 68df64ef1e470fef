# Ported from flashinfer-ai/flashinfer, tests/utils/test_fp4_quantize.py at commit
# 856f9189c7dc8b1ff0c526a8bf0f2cde4de55e1b, with the helpers it imports from
# tests/test_helpers/utils_fp4.py at commit 78096bae3d47541f364895ea6d05041c1a6332e3 (its
# cast_from_fp4 and ref_fp4_quant, carried here as test data; its cast_to_fp4 and
# get_reciprocal, which vLLM's test defines too, in _e2m1.py).
# SPDX-License-Identifier: Apache-2.0; Copyright (c) 2025 by FlashInfer team. The cases and
# assertions are upstream's, re-expressed; each change is marked "CHANGE:".
"""FlashInfer's tests of ``fp4_quantize`` (NVFP4, and MXFP4 through ``sf_use_ue8m0``)."""

import functools

import pytest
import torch
from _e2m1 import E2M1_TO_FLOAT32, cast_to_fp4, get_reciprocal
from _port import DEVICES

# CHANGE: the function under test is the drop-in, not flashinfer's
from fp8_group_quant.compat import fp4_quantize

# CHANGE: upstream skips every case below compute capability 10.0 ("Nvfp4 Requires compute
# capability >= 10 and CUDA >= 12.8"), where FlashInfer's FP4 kernels are not built; the
# drop-in's kernel runs on SM90, so the cases run on the H200 (and on torch CPU tensors)

DTYPES = [torch.float16, torch.bfloat16]
# the batch dimension need not be a multiple of 128
SHAPES = [(128, 64), (256, 128), (120, 64), (200, 256)]
SEEDS = [42]

FLOAT4_E2M1_MAX = 6.0
FLOAT8_E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
BLOCK_SIZE = 16

# upstream's helpers (tests/test_helpers/utils_fp4.py) ------------------------------------------


def cast_from_fp4(x: torch.Tensor) -> torch.Tensor:
    """Packed bytes [..., n/2] (first value in the low nibble) -> float32 values [..., n]."""
    codes = torch.stack((x & 0xF, (x >> 4) & 0xF), dim=-1)
    shape = codes.shape[:-2] + (codes.shape[-2] * codes.shape[-1],)
    table = torch.tensor(E2M1_TO_FLOAT32, device=codes.device)
    return table[codes.to(torch.long)].reshape(shape).to(torch.float32)


def ref_fp4_quant(x, global_scale, block_size: int, sf_use_ue8m0: bool = False):
    """Upstream's reference: the block scale g * (amax * (1/6)), as e4m3 or rounded up to a
    power of two (UE8M0); the values x * 1 / (scale * (1/g)) clipped to +-6 and rounded to
    e2m1. Returns the values and the scales as float32."""
    assert isinstance(global_scale, (float, int)) or global_scale.dtype == torch.float32
    sliced = torch.reshape(x, x.shape[:-1] + (x.shape[-1] // block_size, block_size))
    vec_max = torch.max(torch.abs(sliced), dim=-1, keepdim=True)[0].to(torch.float32)
    scale = global_scale * (vec_max * get_reciprocal(FLOAT4_E2M1_MAX))
    if sf_use_ue8m0:
        scale = ((scale.view(torch.int32) + 0x007FFFFF) & 0x7F800000).view(torch.float32)
    else:
        scale = scale.to(torch.float8_e4m3fn).to(torch.float32)
    output_scale = get_reciprocal(scale * get_reciprocal(global_scale))
    scaled_x = sliced.to(torch.float32) * output_scale
    clipped_x = torch.clamp(scaled_x, -6.0, 6.0).reshape(x.shape)
    return cast_to_fp4(clipped_x), scale.squeeze(-1)


# upstream's layout helpers (this file's own) ----------------------------------------------------


def swizzle_sf(unswizzled_sf: torch.Tensor, original_row: int, original_col: int,
               scaling_vector_size: int = 16) -> torch.Tensor:  # fmt: skip
    """Row-major scales [row, col / vec] -> the 128x4 tiles [align(row, 128), align(col / vec,
    4)] (the inverse of unswizzle_sf), padding zero."""
    factor = scaling_vector_size * 4
    padded_row = -(-original_row // 128) * 128
    padded_col = -(-original_col // factor) * factor
    pad_rows = padded_row - original_row
    pad_cols = (padded_col - original_col) // scaling_vector_size
    padded = torch.nn.functional.pad(unswizzled_sf.contiguous(), (0, pad_cols, 0, pad_rows),
                                     mode="constant", value=0).contiguous()  # fmt: skip
    tiles = padded.view(padded_row // 128, 4, 32, padded_col // factor, 4).transpose(1, 3)
    return tiles.reshape(padded_row, padded_col // scaling_vector_size).contiguous()


def unswizzle_sf(sf: torch.Tensor, row: int, col: int, scaling_vector_size: int = 16):
    """The 128x4 tiles -> row-major scales [row, col / vec]."""
    factor = scaling_vector_size * 4
    tiles = sf.view(-(-row // 128), -(-col // factor), 32, 4, 4).transpose(1, 3)
    linear = tiles.reshape(-(-row // 128) * 128, -(-col // factor) * 4)
    return linear[:row, : col // scaling_vector_size].contiguous()


def e2m1_and_ufp8sf_scale_to_float(e2m1_tensor, ufp8_scale_tensor, global_scale_tensor,
                                   sf_vec_size: int, ufp8_type: int,
                                   is_sf_swizzled_layout: bool) -> torch.Tensor:  # fmt: skip
    """CHANGE: FlashInfer's host dequantizer (a C++ op), re-expressed in torch from its
    contract: each e2m1 value times its block's scale (ufp8_type 1: an e4m3 byte, 0: a UE8M0
    exponent byte) times global_scale_tensor (1 / the global scale); float32 on the host."""
    m, packed = e2m1_tensor.shape
    n = 2 * packed
    values = cast_from_fp4(e2m1_tensor.cpu()).reshape(m, n // sf_vec_size, sf_vec_size)
    sf = ufp8_scale_tensor.cpu().view(torch.uint8).reshape(-1)
    if is_sf_swizzled_layout:
        sf = unswizzle_sf(sf, m, n, sf_vec_size)
    sf = sf.reshape(m, n // sf_vec_size)
    if ufp8_type == 1:
        scale = sf.view(torch.float8_e4m3fn).to(torch.float32)
    else:
        scale = (sf.to(torch.int32) << 23).view(torch.float32)
    global_inverse = torch.as_tensor(global_scale_tensor, dtype=torch.float32).cpu()
    return (values * scale[..., None] * global_inverse).reshape(m, n)


# the tests ---------------------------------------------------------------------------------------


# CHANGE: every case also runs on torch CPU tensors (the NumPy backend)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sf_use_ue8m0", [False, True])
@pytest.mark.parametrize("is_swizzled", [False, True])
@torch.inference_mode()
def test_fp4_quantization(dtype, shape, seed, device, sf_use_ue8m0, is_swizzled) -> None:
    torch.manual_seed(seed)
    m, n = shape
    sf_vec_size = 32 if sf_use_ue8m0 else 16
    x = torch.randn((m, n), dtype=dtype, device=device)
    tensor_amax = torch.abs(x).max().to(torch.float32)
    if sf_use_ue8m0:
        global_scale = torch.tensor(1.0, dtype=torch.float32, device=device)
    else:
        global_scale = FLOAT8_E4M3_MAX * FLOAT4_E2M1_MAX / tensor_amax
    out_ref, scale_ref = ref_fp4_quant(x, global_scale, sf_vec_size, sf_use_ue8m0)
    out, out_scale = fp4_quantize(x, global_scale, sf_vec_size, sf_use_ue8m0, is_swizzled)
    assert n % sf_vec_size == 0, f"cols needs to be {sf_vec_size} divisible"
    if sf_use_ue8m0:
        out_scale = (out_scale.to(torch.int32) << 23).view(torch.float32)
    else:
        out_scale = out_scale.view(torch.float8_e4m3fn).to(torch.float32)
    if is_swizzled:
        scale_ans = unswizzle_sf(out_scale.reshape(-1, n // sf_vec_size), m, n, sf_vec_size)
    else:
        scale_ans = out_scale
    out_ans = cast_from_fp4(out).reshape(m, n)
    torch.testing.assert_close(out_ans, out_ref, rtol=1e0, atol=1e-1)
    torch.testing.assert_close(scale_ans, scale_ref, rtol=1e-1, atol=1e-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("device", DEVICES)
@torch.inference_mode()
def test_scale_swizzling(dtype, shape, seed, device) -> None:
    torch.manual_seed(seed)
    m, n = shape
    x = torch.randn((m, n), dtype=dtype, device=device)
    tensor_amax = torch.abs(x).max().to(torch.float32)
    global_scale = FLOAT8_E4M3_MAX * FLOAT4_E2M1_MAX / tensor_amax

    _, unswizzled_scale = fp4_quantize(x, global_scale, BLOCK_SIZE, False, False)
    _, swizzled_scale = fp4_quantize(x, global_scale, BLOCK_SIZE, False, True)
    assert n % BLOCK_SIZE == 0, f"cols needs to be {BLOCK_SIZE} divisible"
    recovered_unswizzled_scale = unswizzle_sf(swizzle_sf(unswizzled_scale, m, n), m, n)
    # swizzle_sf(unswizzled_scale) == swizzled_scale is not expected: the padding
    ref_unswizzled_scale = unswizzle_sf(swizzled_scale, m, n)
    assert_equal = functools.partial(torch.testing.assert_close, rtol=0, atol=0)
    assert_equal(recovered_unswizzled_scale, unswizzled_scale)
    assert_equal(ref_unswizzled_scale, unswizzled_scale)


# CHANGE: upstream's test_block_scale_interleave tests flashinfer.block_scale_interleave, for
# which compat has no drop-in; not ported


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sf_use_ue8m0", [True, False])
@torch.inference_mode()
def test_e2m1_dequantization(shape, seed, device, sf_use_ue8m0) -> None:
    """The round trip fp4_quantize -> e2m1_and_ufp8sf_scale_to_float."""
    torch.manual_seed(seed)
    m, n = shape
    x = torch.randn((m, n), dtype=torch.float16, device=device)
    tensor_amax = torch.abs(x).max().to(torch.float32)
    global_scale = FLOAT8_E4M3_MAX * FLOAT4_E2M1_MAX / tensor_amax
    is_sf_swizzled_layout = True
    block_size = 32 if sf_use_ue8m0 else 16

    quantized_tensor, scale_factors = fp4_quantize(x, global_scale, block_size, sf_use_ue8m0,
                                                   is_sf_swizzled_layout)  # fmt: skip
    ufp8_type = 0 if sf_use_ue8m0 else 1
    dequantized_tensor = e2m1_and_ufp8sf_scale_to_float(
        quantized_tensor, scale_factors, 1 / global_scale, sf_vec_size=block_size,
        ufp8_type=ufp8_type, is_sf_swizzled_layout=is_sf_swizzled_layout,
    )  # fmt: skip
    dequantized_tensor = dequantized_tensor.to(device)
    x_float32 = x.to(torch.float32)

    assert dequantized_tensor.shape == x.shape, (
        f"Shape mismatch: expected {x.shape}, got {dequantized_tensor.shape}"
    )
    assert dequantized_tensor.dtype == torch.float32, (
        f"Expected float32, got {dequantized_tensor.dtype}"
    )
    assert not torch.isnan(dequantized_tensor).any(), "Dequantized tensor contains NaN values"
    assert not torch.isinf(dequantized_tensor).any(), "Dequantized tensor contains Inf values"
    torch.testing.assert_close(dequantized_tensor, x_float32, rtol=0.3, atol=0.5,
                               msg="Quantize -> dequantize roundtrip failed")  # fmt: skip


# CHANGE: upstream's remaining tests (test_mxfp4_quantize_roundtrip, test_nvfp4_batched_quantize,
# test_scaled_fp4_grouped_quantize, test_silu_and_mul_scaled_nvfp4_experts_quantize) test
# flashinfer's mxfp4_quantize / mxfp4_dequantize, nvfp4_batched_quantize,
# scaled_fp4_grouped_quantize and silu_and_mul_scaled_nvfp4_experts_quantize, for which compat
# has no drop-in; not ported
