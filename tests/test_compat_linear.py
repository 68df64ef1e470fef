"""Drop-ins for DeepGEMM's per_block_cast_to_fp8 and torchao's blockwise training quantizers
(fp8_group_quant.compat): their shapes, dtypes and strides, and their values against emulations
of the upstream arithmetic written from its formulas (DeepGEMM deep_gemm/utils/math.py at
38939a4; torchao prototype/blockwise_fp8_training/kernels.py at 0598012), bit for bit (section
3c's modes); tests/upstream/ holds the comparisons with upstream's own functions."""

import ml_dtypes
import numpy as np
import pytest
from backends import NUMPY_AND_GPU, to_device, to_host_bytes

from fp8_group_quant import compat

E4M3 = ml_dtypes.float8_e4m3fn


def _weight(rng, shape):
    return (rng.standard_normal(shape) * np.exp(rng.standard_normal(shape) * 0.5)).astype(
        np.float32
    )


def deepgemm_block_cast(x: np.ndarray, use_ue8m0: bool):
    """DeepGEMM's formula as torch computes it on CUDA: zero-pad to 128 multiples, amax per
    128x128 block clamped at 1e-4, sf = amax * RN(1 / 448) (torch's CUDA division by a Python
    number; ceiled to a power of two with use_ue8m0), codes of x * RN(1 / sf)."""
    m, n = x.shape
    mb, nb = -(-m // 128), -(-n // 128)
    padded = np.zeros((mb * 128, nb * 128), np.float32)
    padded[:m, :n] = x
    blocks = padded.reshape(mb, 128, nb, 128)
    amax = np.maximum(np.abs(blocks).max(axis=(1, 3)), np.float32(1e-4)).astype(np.float32)
    sf = (amax * (np.float32(1) / np.float32(448))).astype(np.float32)
    if use_ue8m0:
        bits = sf.view(np.uint32)
        exponent = (bits >> 23) + ((bits & 0x7FFFFF) != 0)
        sf = (np.clip(exponent, 1, 254).astype(np.uint32) << 23).view(np.float32)
    inverse = (np.float32(1) / sf).astype(np.float32)
    scaled = (blocks * inverse[:, None, :, None]).astype(np.float32)
    codes = np.clip(scaled, -448, 448).astype(E4M3).reshape(mb * 128, nb * 128)[:m, :n]
    return codes, sf


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# partial blocks both ways; bit for bit with either scale kind
@pytest.mark.parametrize("use_ue8m0", [True, False])
def test_per_block_cast_to_fp8(backend, use_ue8m0):
    x = _weight(np.random.default_rng(int(use_ue8m0)), (300, 200))
    q, s = compat.per_block_cast_to_fp8(to_device(x, backend), use_ue8m0=use_ue8m0)
    codes, sf = deepgemm_block_cast(x, use_ue8m0)
    assert tuple(q.shape) == (300, 200) and tuple(s.shape) == (3, 2)
    assert np.array_equal(to_host_bytes(s).view(np.float32).reshape(3, 2), sf)
    differ = np.mean(to_host_bytes(q).reshape(300, 200) != codes.view(np.uint8))
    assert differ == 0, differ


def test_per_block_cast_refuses_other_blocks():
    with pytest.raises(ValueError, match="gran_k"):
        compat.per_block_cast_to_fp8(np.ones((4, 4), np.float32), True, gran_k=64)


def torchao_act_scale(amax: np.ndarray) -> np.ndarray:
    """torchao's stored factor: RN(1 / RN32(448 / amax in float64)), amax clamped at 1e-12."""
    scale = (448.0 / np.maximum(amax.astype(np.float64), 1e-12)).astype(np.float32)
    return (np.float32(1) / scale).astype(np.float32)


def test_torchao_shapes_strides_and_values():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(_weight(np.random.default_rng(3), (256, 384)))
    m, k = x.shape
    q, s = compat.act_quant_lhs(x)
    assert tuple(q.shape) == (m, k) and q.stride() == (k, 1) and q.dtype == torch.float8_e4m3fn
    assert tuple(s.shape) == (m, k // 128) and s.stride() == (1, m)
    amax = x.abs().reshape(m, k // 128, 128).amax(-1).numpy()
    np.testing.assert_array_equal(s.numpy(), torchao_act_scale(amax))  # section 3c
    qt, st = compat.act_quant_transposed_lhs(x)
    assert tuple(qt.shape) == (k, m) and qt.stride() == (m, 1)
    assert tuple(st.shape) == (k, m // 128) and st.stride() == (1, k)
    qr, sr = compat.act_quant_rhs(x)
    assert tuple(qr.shape) == (m, k) and qr.stride() == (1, m)
    assert tuple(sr.shape) == (m // 128, k) and sr.stride() == (k, 1)
    assert torch.equal(qr.t().contiguous().view(torch.uint8), qt.view(torch.uint8))
    w = x[:, :256].contiguous()  # [256, 256]: 2 x 2 blocks
    qw, sw = compat.weight_quant_rhs(w)
    assert tuple(qw.shape) == (256, 256) and qw.stride() == (1, 256) and sw.stride() == (1, 2)
    qwt, swt = compat.weight_quant_transposed_rhs(w)
    assert qwt.stride() == (1, 256) and tuple(swt.shape) == (2, 2) and swt.stride() == (1, 2)
    # the same blocks, transposed: one set of codes and scales seen both ways
    assert torch.equal(qw.contiguous().view(torch.uint8), qwt.t().contiguous().view(torch.uint8))
    assert torch.equal(sw, swt.t())


def test_torchao_refuses_other_blocks_and_formats():
    x = np.ones((128, 128), np.float32)
    with pytest.raises(ValueError, match="block_size"):
        compat.act_quant_lhs(x, 64)
    with pytest.raises(ValueError, match="block_size: expected 128 or 256, got 512"):
        compat.weight_quant_transposed_rhs(np.ones((512, 512), np.float32), 512)
    with pytest.raises(ValueError, match="block_size: expected 128 or 256, got 64"):
        compat.act_quant_rhs(x, 64)
    with pytest.raises(ValueError, match="dtype"):
        compat.weight_quant_rhs(x, 128, dtype="float8_e5m2")


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
def test_torchao_transposed_lhs_takes_any_channel_count(backend):
    # torchao asks M (its token groups) to be whole and any K; K = 200 is quantized as zero
    # channels up to 256 would be, and returned with torchao's strides
    x = _weight(np.random.default_rng(5), (256, 384))
    qt, st = compat.act_quant_transposed_lhs(to_device(np.ascontiguousarray(x[:, :200]), backend))
    want_qt, want_st = compat.act_quant_transposed_lhs(x)
    assert tuple(qt.shape) == (200, 256) and tuple(st.shape) == (200, 2)
    is_torch = callable(getattr(st, "stride", None))  # numpy's and cupy's strides are bytes
    strides = st.stride() if is_torch else tuple(b // st.itemsize for b in st.strides)
    assert tuple(strides) == (1, 200)
    np.testing.assert_array_equal(to_host_bytes(qt), to_host_bytes(want_qt[:200]))
    np.testing.assert_array_equal(to_host_bytes(st), to_host_bytes(want_st[:200]))
