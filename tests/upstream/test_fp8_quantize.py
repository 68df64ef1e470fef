# Ported from flashinfer-ai/flashinfer, tests/utils/test_fp8_quantize.py at commit
# 0218dc6c5a3c1ba85b7cfceea4cb18a433420d7f, with the reference it imports from
# tests/utils_fp8.py (mxfp8_quantize_reference, _swizzle_mxfp8_scales and
# assert_mxfp8_quantize_exact, carried here as test data; read from the copy the search index
# holds, which names no commit of its own: the version that commit's test imports).
# SPDX-License-Identifier: Apache-2.0; Copyright (c) 2025 by FlashInfer team. The cases and
# assertions are upstream's, re-expressed; each change is marked "CHANGE:".
"""FlashInfer's tests of ``mxfp8_quantize`` against its bit-exact torch reference."""

import pytest
import torch
from _port import skip_large_on_cpu

# CHANGE: the function under test is the drop-in, not flashinfer's; SfLayout as its names
from fp8_group_quant.compat import mxfp8_quantize

LAYOUT_128X4, LAYOUT_8X4, LAYOUT_LINEAR = "layout_128x4", "layout_8x4", "layout_linear"

# CHANGE: upstream's device parameter, with the gpu marker on "cuda"; upstream skips CUDA below
# compute capability 10.0 ("mxfp8 quantization is not supported on compute capability < 10"),
# where FlashInfer's kernel is not built; the drop-in's kernel runs on SM90, so the CUDA cases
# run on the H200, and the cases upstream runs on CUDA only also run on torch CPU tensors
CUDA = pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")
DEVICES = [CUDA, pytest.param("cpu", id="cpu")]
BACKENDS = ["cuda", "cute-dsl"]


def skip_backend(backend: str, device: str) -> None:
    """Upstream skips the cute-dsl backend on CPU. CHANGE: the drop-in takes backend= and has
    one implementation for both names, so on CUDA both run (upstream needs CuTe-DSL)."""
    if backend == "cute-dsl" and device == "cpu":
        pytest.skip("cute-dsl backend only supports CUDA")


def special_inputs(test):
    """The parametrisation upstream repeats on its CUDA tests (the device one, the special
    inputs: denormal, zero, mixed, extreme): dtype x layout x backend x device."""
    for name, values in (("device", DEVICES), ("backend", BACKENDS),
                         ("is_sf_swizzled_layout", [True, False]),
                         ("dtype", [torch.half, torch.bfloat16])):  # fmt: skip
        test = pytest.mark.parametrize(name, values)(test)
    return test


# upstream's reference (tests/utils_fp8.py) ------------------------------------------------------


def _swizzle_mxfp8_scales(scales: torch.Tensor, sf_layout: str) -> torch.Tensor:
    """Row-major UE8M0 bytes [m, cols] -> the flat bytes of ``sf_layout``, padding zero."""
    if sf_layout == LAYOUT_LINEAR:
        return scales.contiguous().reshape(-1)
    m, num_cols = scales.shape
    padded_cols = -(-num_cols // 4) * 4
    rows = torch.arange(m, dtype=torch.int64, device=scales.device).unsqueeze(1)
    cols = torch.arange(num_cols, dtype=torch.int64, device=scales.device).unsqueeze(0)
    if sf_layout == LAYOUT_128X4:
        padded_rows = -(-m // 128) * 128
        indices = (cols % 4 + (cols // 4) * 512 + (rows % 32) * 16 + ((rows % 128) // 32) * 4
                   + (rows // 128) * (128 * padded_cols))  # fmt: skip
    elif sf_layout == LAYOUT_8X4:
        padded_rows = -(-m // 8) * 8
        indices = ((rows // 8) * (padded_cols // 4 * 32) + (cols // 4) * 32 + (rows % 8) * 4
                   + cols % 4)  # fmt: skip
    else:
        raise ValueError(f"Unsupported MXFP8 scale layout: {sf_layout}")
    out = torch.zeros(padded_rows * padded_cols, dtype=torch.uint8, device=scales.device)
    out[indices.reshape(-1)] = scales.reshape(-1)
    return out


@torch.no_grad()
def mxfp8_quantize_reference(a, *, is_sf_swizzled_layout=True, alignment=32,
                             sf_swizzle_layout=None):  # fmt: skip
    """Upstream's reference: x zero-padded to a multiple of ``alignment`` columns; per 32
    values the scale amax / 448, its UE8M0 byte the exact ceiling taken on the bits (a
    subnormal scale rounds up only above 2^-127), at most 254, and 0 for a zero scale; the
    codes RNE(x * 2^(127 - byte)) in e4m3, and 0 where the byte is 0."""
    sf_vec_size = 32
    assert alignment % sf_vec_size == 0
    if sf_swizzle_layout is None:
        sf_swizzle_layout = LAYOUT_128X4 if is_sf_swizzled_layout else LAYOUT_LINEAR
    x = a.reshape(-1, a.shape[-1]).to(torch.float32)
    m, k = x.shape
    assert k % sf_vec_size == 0
    padded_k = -(-k // alignment) * alignment
    if padded_k != k:
        padded = x.new_zeros((m, padded_k))
        padded[:, :k] = x
        x = padded
    blocks = x.reshape(m, padded_k // sf_vec_size, sf_vec_size)
    block_scale = blocks.abs().amax(dim=-1) / 448.0
    scale_bits = block_scale.contiguous().view(torch.int32)
    exp = (scale_bits >> 23) & 0xFF
    mantissa = scale_bits & 0x7FFFFF
    round_up = (mantissa != 0) & ((exp != 0) | (mantissa > 0x400000))
    exp = (exp + round_up.to(exp.dtype)).clamp(max=254)
    scales = torch.where(block_scale > 0, exp, 0).to(torch.uint8)
    inv_scale = torch.ldexp(torch.ones_like(block_scale), 127 - scales.to(torch.int32))
    inv_scale.masked_fill_(scales == 0, 0)
    # CHANGE: saturated at +-448 before torch's cast, as FlashInfer's kernel converts (satfinite):
    # torch's own cast saturates +-Inf from 2.13 on the CPU, but torch 2.11's CUDA cast makes it
    # NaN (0x7F), so upstream's reference depends on the torch release and device
    quantized = (blocks * inv_scale.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return (quantized.reshape(*a.shape[:-1], padded_k),
            _swizzle_mxfp8_scales(scales, sf_swizzle_layout))  # fmt: skip


def _assert_equal(what: str, actual: torch.Tensor, expected: torch.Tensor, show) -> None:
    """Upstream's element check: equal, or the count of mismatches and the first one, its
    values as ``show(index)`` gives them."""
    if torch.equal(actual, expected):
        return
    mismatch = actual != expected
    count = int(mismatch.sum().item())
    i = tuple(int(j) for j in torch.nonzero(mismatch, as_tuple=False)[0].cpu())
    raise AssertionError(f"{what} element mismatch: {count}/{actual.numel()} elements differ; "
                         f"first mismatch at index {i}: {show(i)}")  # fmt: skip


def _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, *, is_sf_swizzled_layout=True, alignment=32,
                                 sf_swizzle_layout=None):  # fmt: skip
    """Upstream's check: codes and scale bytes equal the reference's, bit for bit."""
    ref_fp8, ref_sf = mxfp8_quantize_reference(
        a, is_sf_swizzled_layout=is_sf_swizzled_layout, alignment=alignment,
        sf_swizzle_layout=sf_swizzle_layout,
    )  # fmt: skip
    values = a_fp8.contiguous().view(torch.float8_e4m3fn) if a_fp8.dtype == torch.uint8 else a_fp8
    actual_bits = a_fp8.contiguous().view(torch.uint8)
    ref_bits = ref_fp8.contiguous().view(torch.uint8)
    assert values.shape == ref_fp8.shape, (
        f"quantized output shape mismatch: actual={values.shape}, expected={ref_fp8.shape}"
    )
    _assert_equal("quantized output", actual_bits, ref_bits, lambda i: (
        f"actual={values[i].float().item()} (bits={int(actual_bits[i].item())}), "
        f"expected={ref_fp8[i].float().item()} (bits={int(ref_bits[i].item())})"))  # fmt: skip
    assert a_sf.shape == ref_sf.shape, (
        f"scale factors shape mismatch: actual={a_sf.shape}, expected={ref_sf.shape}"
    )
    _assert_equal("scale factors", a_sf, ref_sf, lambda i: (
        f"actual={int(a_sf[i].item())}, expected={int(ref_sf[i].item())}"))  # fmt: skip


# the tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 3, 16, 64, 1024])
@pytest.mark.parametrize("k", [128, 1024, 8192])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_sf_swizzled_layout", [True, False])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_mxfp8_quantize_torch(m, k, dtype, is_sf_swizzled_layout, device, backend):
    skip_backend(backend, device)
    skip_large_on_cpu(device, m * k)
    a = 16 * torch.randn([m, k], dtype=dtype).to(device).contiguous()
    if device == "cpu":
        a = a.float()
    a_fp8, a_sf = mxfp8_quantize(a, is_sf_swizzled_layout, backend=backend)
    _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, is_sf_swizzled_layout=is_sf_swizzled_layout)


# CHANGE: upstream's grouped tests (test_mxfp8_grouped_quantize and its empty-group, CUDA-graph,
# GEMM-layout and fake-op variants) test flashinfer.mxfp8_grouped_quantize (cuTile), for which
# compat has no drop-in; not ported


@pytest.mark.parametrize("m", [1, 2, 16, 1024])
@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("dtype", [torch.half, torch.bfloat16])
@pytest.mark.parametrize("is_sf_swizzled_layout", [True, False])
def test_mxfp8_quantize_torch_host(m, k, dtype, is_sf_swizzled_layout):
    torch.random.manual_seed(0)
    a = (torch.randn([m, k], dtype=torch.float) * 16).cpu().contiguous()
    a_fp8, a_sf = mxfp8_quantize(a, is_sf_swizzled_layout)
    _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, is_sf_swizzled_layout=is_sf_swizzled_layout)


@pytest.mark.parametrize("m", [1, 2, 3, 16, 64, 1024])
@pytest.mark.parametrize("k", [128, 512, 1024, 8192])
@special_inputs
def test_mxfp8_quantize_torch_device(m, k, dtype, is_sf_swizzled_layout, backend, device):
    skip_backend(backend, device)
    skip_large_on_cpu(device, m * k)
    torch.random.manual_seed(0)
    a = (torch.randn([m, k], dtype=torch.float) * 16).to(dtype).to(device).contiguous()
    a_fp8, a_sf = mxfp8_quantize(a, is_sf_swizzled_layout, 32, backend=backend)
    _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, is_sf_swizzled_layout=is_sf_swizzled_layout)


@pytest.mark.parametrize("m", [1, 2, 16, 1024])
@pytest.mark.parametrize("k", [1568])
@pytest.mark.parametrize("dtype", [torch.half, torch.bfloat16])
@pytest.mark.parametrize("is_sf_swizzled_layout", [True, False])
@pytest.mark.parametrize("alignment", [64, 128])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_mxfp8_quantize_alignment_torch_device(m, k, dtype, is_sf_swizzled_layout, alignment,
                                               backend, device):  # fmt: skip
    skip_backend(backend, device)
    torch.random.manual_seed(0)
    a = (torch.randn([m, k], dtype=torch.float) * 16).to(dtype).to(device).contiguous()
    padded_k = -(-k // alignment) * alignment
    a_fp8, a_sf = mxfp8_quantize(a, is_sf_swizzled_layout, alignment, backend=backend)
    assert a_fp8.shape[1] == padded_k
    # the padding columns' bits are zero
    paddings = a_fp8.view(torch.int8)[:, k:]
    assert torch.all(paddings == 0), "Paddings should be zero"
    _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, is_sf_swizzled_layout=is_sf_swizzled_layout,
                                 alignment=alignment)  # fmt: skip


@pytest.mark.parametrize("m", [1, 3, 128, 2048])
@pytest.mark.parametrize("k", [128, 1024])
@special_inputs
def test_mxfp8_quantize_denormal_inputs(m, k, dtype, is_sf_swizzled_layout, backend, device):
    """Inputs small enough to underflow the UE8M0 scale give no NaN (0 * Inf)."""
    skip_backend(backend, device)
    torch.random.manual_seed(42)
    # below float32's normal range (about 1.17e-38)
    a = (torch.randn([m, k], dtype=torch.float32) * 1e-38).to(dtype).to(device).contiguous()
    a_fp8, a_sf = mxfp8_quantize(a, is_sf_swizzled_layout, backend=backend)
    nan_count = torch.isnan(a_fp8.float()).sum().item()
    assert nan_count == 0, f"Found {nan_count} NaN values in output (expected 0)"
    inf_count = torch.isinf(a_fp8.float()).sum().item()
    assert inf_count == 0, f"Found {inf_count} Inf values in output (expected 0)"
    _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, is_sf_swizzled_layout=is_sf_swizzled_layout)


@special_inputs
def test_mxfp8_quantize_all_zeros(dtype, is_sf_swizzled_layout, backend, device):
    """All-zero input gives all-zero codes and no NaN."""
    skip_backend(backend, device)
    m, k = 128, 1024
    a = torch.zeros([m, k], dtype=dtype, device=device).contiguous()
    a_fp8, a_sf = mxfp8_quantize(a, is_sf_swizzled_layout, backend=backend)
    assert not torch.isnan(a_fp8.float()).any(), "NaN found in output for zero input"
    assert (a_fp8.float() == 0).all(), "Non-zero output for zero input"
    _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, is_sf_swizzled_layout=is_sf_swizzled_layout)


@special_inputs
def test_mxfp8_quantize_mixed_magnitude(dtype, is_sf_swizzled_layout, backend, device):
    """Blocks of normal magnitude beside blocks of subnormal ones."""
    skip_backend(backend, device)
    torch.random.manual_seed(123)
    m, k = 256, 1024
    a = torch.randn([m, k], dtype=torch.float32)
    # rows 0-63 and 128-191 normal, 64-127 very small, 192-255 smaller still
    a[64:128, :] *= 1e-38
    a[192:256, :] *= 1e-40
    a = a.to(dtype).to(device).contiguous()
    a_fp8, a_sf = mxfp8_quantize(a, is_sf_swizzled_layout, backend=backend)
    nan_mask = torch.isnan(a_fp8.float())
    nan_count = nan_mask.sum().item()
    if nan_count > 0:
        rows, cols = torch.where(nan_mask)
        pytest.fail(f"Found {nan_count} NaN values. First NaN at row={rows[0].item()}, "
                    f"col={cols[0].item()}")  # fmt: skip
    _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, is_sf_swizzled_layout=is_sf_swizzled_layout)


@special_inputs
def test_mxfp8_quantize_single_denormal_in_block(dtype, is_sf_swizzled_layout, backend, device):
    """A block of small normal values holding one float32 subnormal (NaN from 0 * Inf where a
    flush to zero met it, in the bug this covers)."""
    skip_backend(backend, device)
    m, k = 64, 1024
    a = torch.full([m, k], 1e-36, dtype=torch.float32)
    for row, col in [(0, 498), (0, 911), (32, 100), (63, 512)]:
        a[row, col] = 9.18e-40
    a = a.to(dtype).to(device).contiguous()
    a_fp8, a_sf = mxfp8_quantize(a, is_sf_swizzled_layout, backend=backend)
    nan_mask = torch.isnan(a_fp8.float())
    assert not nan_mask.any(), f"Found NaN at positions: {torch.where(nan_mask)}"
    _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, is_sf_swizzled_layout=is_sf_swizzled_layout)


@special_inputs
def test_mxfp8_quantize_extreme_scale_inputs(dtype, is_sf_swizzled_layout, backend, device):
    # the reference's codes of +Inf: 448 (0x7E), saturated (docs/spec.md section 3b)
    skip_backend(backend, device)
    a = torch.zeros((2, 128), dtype=dtype, device=device)
    a[:, 32:64] = float("inf")
    a[:, 64:96] = 448.0
    a[:, 96:128] = -448.0
    a_fp8, a_sf = mxfp8_quantize(a, is_sf_swizzled_layout, backend=backend)
    _assert_mxfp8_quantize_exact(a, a_fp8, a_sf, is_sf_swizzled_layout=is_sf_swizzled_layout)


# CHANGE: upstream's test_cute_dsl_compilation_cache_* tests inspect the caches of FlashInfer's
# CuTe-DSL kernels; the drop-in has none; not ported


@pytest.mark.parametrize("m", [1, 3, 16, 64, 1024])
@pytest.mark.parametrize("k", [128, 1024, 8192])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sf_layout", [LAYOUT_128X4, LAYOUT_8X4, LAYOUT_LINEAR])
@pytest.mark.parametrize("device", DEVICES)
def test_mxfp8_quantize_layout_backend_parity(m, k, dtype, sf_layout, device):
    """The cuda and cute-dsl backends agree element for element. CHANGE: the drop-in has one
    implementation for both names, so this checks that backend= changes nothing and that the
    call is deterministic; on CPU too."""
    skip_large_on_cpu(device, m * k)
    torch.random.manual_seed(0)
    a = (torch.randn([m, k], dtype=torch.float) * 16).to(dtype).to(device).contiguous()
    a_fp8_cuda, a_sf_cuda = mxfp8_quantize(a, sf_swizzle_layout=sf_layout, backend="cuda")
    a_fp8_cute, a_sf_cute = mxfp8_quantize(a, sf_swizzle_layout=sf_layout, backend="cute-dsl")
    assert a_fp8_cuda.shape == a_fp8_cute.shape, (
        f"Quantized output shape mismatch for {sf_layout}: "
        f"cuda={a_fp8_cuda.shape}, cute={a_fp8_cute.shape}"
    )
    # CHANGE: compared as bytes (torch.equal on float8 tensors is not implemented on CPU)
    cuda_bits, cute_bits = a_fp8_cuda.view(torch.uint8), a_fp8_cute.view(torch.uint8)
    _assert_equal(f"Quantized output ({sf_layout})", cuda_bits, cute_bits, lambda i: (
        f"cuda={a_fp8_cuda[i].float().item()}, cute={a_fp8_cute[i].float().item()}"))  # fmt: skip
    assert a_sf_cuda.shape == a_sf_cute.shape, (
        f"Scale factor shape mismatch for {sf_layout}: "
        f"cuda={a_sf_cuda.shape}, cute={a_sf_cute.shape}"
    )
    _assert_equal(f"Scale factor ({sf_layout})", a_sf_cuda, a_sf_cute, lambda i: (
        f"cuda={int(a_sf_cuda[i].item())}, cute={int(a_sf_cute[i].item())}"))  # fmt: skip
