# Ported from vllm-project/vllm, tests/kernels/quantization/test_nvfp4_quant.py at commit
# 07b13497a9b52274d334090a9a8e04d5ec9ca7e9. SPDX-License-Identifier: Apache-2.0; Copyright
# contributors to the vLLM project. The cases, the reference (upstream's ref_nvfp4_quant in
# torch, carried here as test data; the e2m1 table, cast_to_fp4 and get_reciprocal, which
# FlashInfer's helpers define too, in _e2m1.py) and the assertions are upstream's,
# re-expressed; each change is marked "CHANGE:".
"""vLLM's test of ``scaled_fp4_quant`` (NVFP4) against its own torch reference."""

import pytest
import torch
from _e2m1 import E2M1_TO_FLOAT32, cast_to_fp4, get_reciprocal
from _port import DEVICES

# CHANGE: the function under test is the drop-in, not vllm._custom_ops'
from fp8_group_quant.compat import scaled_fp4_quant

# CHANGE: upstream skips the whole module below compute capability 10.0, where vLLM's NVFP4
# kernel is not built; the drop-in's kernel runs on SM90, so every case runs on the H200 (and
# on torch CPU tensors)

DTYPES = [torch.float16, torch.bfloat16]
SHAPES = [(128, 64), (128, 128), (256, 64), (256, 128)]
# rows not a multiple of 128 and groups not a multiple of 4: the blocked layout's padding
PAD_SHAPES = [(90, 64), (150, 64), (128, 48), (128, 80), (150, 80), (90, 48), (90, 128),
              (150, 128), (150, 48), (90, 80)]  # fmt: skip
SEEDS = [42]

# CHANGE: scalar_types.float4_e2m1f.max() as its value
FLOAT4_E2M1_MAX = 6.0
FLOAT8_E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
BLOCK_SIZE = 16


def cast_from_fp4(x: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """Packed bytes [m, n/2] (first value in the low nibble) -> float32 values [m, n]."""
    low, high = x & 0xF, (x >> 4) & 0xF
    codes = torch.stack((low, high), dim=-1).flatten()
    out = torch.tensor([E2M1_TO_FLOAT32[int(c)] for c in codes])
    return out.reshape(m, n).to(torch.float32)


def ref_nvfp4_quant(x: torch.Tensor, global_scale: torch.Tensor):
    """Upstream's reference: the block scale e4m3(g * (amax * (1/6))), the values
    x * 1 / (scale * (1/g)) clipped to +-6 and rounded to e2m1; values and scales as float32."""
    assert global_scale.dtype == torch.float32
    assert x.ndim == 2
    m, n = x.shape
    x = torch.reshape(x, (m, n // BLOCK_SIZE, BLOCK_SIZE))
    vec_max = torch.max(torch.abs(x), dim=-1, keepdim=True)[0].to(torch.float32)
    scale = global_scale * (vec_max * get_reciprocal(FLOAT4_E2M1_MAX))
    scale = scale.to(torch.float8_e4m3fn).to(torch.float32)
    output_scale = get_reciprocal(scale * get_reciprocal(global_scale))
    scaled_x = x.to(torch.float32) * output_scale
    clipped_x = torch.clamp(scaled_x, -6.0, 6.0).reshape(m, n)
    return cast_to_fp4(clipped_x), scale.squeeze(-1)


def recover_swizzled_scales(scale: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """The 128x4 tiles back to a row-major [m, n/16] float32 matrix."""
    rounded_m = -(-m // 128) * 128
    scale_n = n // BLOCK_SIZE
    rounded_n = -(-scale_n // 4) * 4
    tiles = torch.reshape(scale, (1, rounded_m // 128, rounded_n // 4, 32, 4, 4))
    tiles = torch.permute(tiles, (0, 1, 4, 3, 2, 5))
    result = torch.reshape(tiles, (rounded_m, rounded_n)).to(torch.float32)
    return result[:m, :scale_n]


def _seed_everything(seed: int) -> None:
    """CHANGE: current_platform.seed_everything seeds Python, NumPy and torch; torch's is the
    one these cases draw from."""
    torch.manual_seed(seed)


def _check(m: int, n: int, dtype, device: str) -> None:
    x = torch.randn((m, n), dtype=dtype, device=device)
    tensor_amax = torch.abs(x).max().to(torch.float32)
    global_scale = FLOAT8_E4M3_MAX * FLOAT4_E2M1_MAX / tensor_amax
    out_ref, scale_ref = ref_nvfp4_quant(x, global_scale)

    out, out_scale = scaled_fp4_quant(x, global_scale)
    # CHANGE: the helpers' Python loops run on host tensors
    scale_ans = recover_swizzled_scales(out_scale.cpu(), m, n)
    out_ans = cast_from_fp4(out.cpu(), m, n)

    torch.testing.assert_close(out_ans, out_ref.cpu())
    torch.testing.assert_close(scale_ans, scale_ref.cpu())


# CHANGE: every case also runs on torch CPU tensors (the NumPy backend)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", SEEDS)
@torch.inference_mode()
def test_quantize_to_fp4(dtype, shape, seed: int, device: str) -> None:
    _seed_everything(seed)
    m, n = shape
    _check(m, n, dtype, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad_shape", PAD_SHAPES)
@torch.inference_mode()
def test_quantize_to_fp4_padded(pad_shape, device: str) -> None:
    _seed_everything(42)
    m, n = pad_shape
    _check(m, n, torch.float16, device)
