"""FlashInfer's mxfp8_quantize and fp4_quantize and vLLM's scaled_fp4_quant drop-ins: the
signatures, shapes, dtypes and layouts upstream returns, and the values of quantize() in the
upstream arithmetic each takes ("unfloored", "reciprocal"; tests/upstream/ holds upstream's own
tests of them)."""

import inspect

import ml_dtypes
import numpy as np
import pytest
from helpers import activations

import fp8_group_quant as fgq
from fp8_group_quant import compat, spec_model
from fp8_group_quant._layout import Geometry

EMPTY = inspect.Parameter.empty

# (function, upstream source, parameters with defaults), read from the public sources:
# flashinfer/quantization/fp8_quantization.py, flashinfer/quantization/fp4_quantization.py,
# vllm/_custom_ops.py
UPSTREAM_SIGNATURES = [
    (compat.mxfp8_quantize, "flashinfer/quantization/fp8_quantization.py",
     [("input", EMPTY), ("is_sf_swizzled_layout", True), ("alignment", 32),
      ("enable_pdl", None), ("backend", "cuda"), ("sf_swizzle_layout", None)]),
    (compat.fp4_quantize, "flashinfer/quantization/fp4_quantization.py",
     [("input", EMPTY), ("global_scale", None), ("sf_vec_size", 16), ("sf_use_ue8m0", False),
      ("is_sf_swizzled_layout", True), ("is_sf_8x4_layout", False),
      ("is_global_scale_inversed", False), ("enable_pdl", None), ("backend", "cuda")]),
    (compat.scaled_fp4_quant, "vllm/_custom_ops.py",
     [("input", EMPTY), ("input_global_scale", EMPTY), ("is_sf_swizzled_layout", True),
      ("backend", "none"), ("padded_n", None)]),
]  # fmt: skip


@pytest.mark.parametrize("function, source, expected", UPSTREAM_SIGNATURES,
                         ids=lambda v: getattr(v, "__name__", ""))  # fmt: skip
def test_the_signatures_are_upstreams(function, source, expected):
    got = [(n, p.default) for n, p in inspect.signature(function).parameters.items()]
    assert got == expected, source


def row_major(blocked: np.ndarray, rows: int, groups: int) -> np.ndarray:
    """The scales of blocked storage gathered row-major by the spec's own offset formula."""
    flat = np.asarray(blocked).reshape(-1)
    return np.array(
        [
            [flat[spec_model.blocked_offset(r, c, groups)] for c in range(groups)]
            for r in range(rows)
        ],
        np.uint8,
    ).reshape(rows, groups)


@pytest.mark.parametrize("shape", [(5, 96), (2, 3, 256), (130, 64)])
def test_mxfp8_quantize(shape):
    x = activations(np.random.default_rng(sum(shape)), shape, "bfloat16", specials=True)
    rows, k = int(np.prod(shape[:-1])), shape[-1]
    q, sf = compat.mxfp8_quantize(x)
    q_ref, s_ref = fgq.quantize(x.reshape(rows, k), 32, scale="ue8m0", layout="blocked",
                                arithmetic="unfloored")  # fmt: skip
    assert q.dtype == ml_dtypes.float8_e4m3fn and q.shape == shape
    assert np.array_equal(
        q.view(np.uint8).reshape(rows, k), s_ref.dtype.type(0) + q_ref.view(np.uint8)
    )
    padded = -(-rows // 128) * 128 * -(-(k // 32) // 4) * 4
    assert sf.dtype == np.uint8 and sf.shape == (padded,)  # flat, as FlashInfer returns it
    assert np.array_equal(sf, s_ref.reshape(-1))
    _, linear = compat.mxfp8_quantize(x, is_sf_swizzled_layout=False)
    assert linear.shape == (rows * k // 32,)
    assert np.array_equal(linear.reshape(rows, k // 32), row_major(sf, rows, k // 32))
    _, by_name = compat.mxfp8_quantize(x, sf_swizzle_layout="layout_linear")
    assert np.array_equal(by_name, linear)
    # FlashInfer's 8x4 tiles: scale (r, c) at (r // 8) * 8 * align(C, 4) + (c // 4) * 32 +
    # (r % 8) * 4 + c % 4, padding zero
    _, tiles = compat.mxfp8_quantize(x, sf_swizzle_layout="layout_8x4")
    groups, cols = k // 32, -(-(k // 32) // 4) * 4
    assert tiles.shape == (-(-rows // 8) * 8 * cols,)
    expected = np.zeros_like(tiles)
    for r in range(rows):
        for c in range(groups):
            expected[(r // 8) * 8 * cols + (c // 4) * 32 + (r % 8) * 4 + c % 4] = linear[
                r * groups + c
            ]
    assert np.array_equal(tiles, expected)


@pytest.mark.parametrize("alignment", [64, 256])
def test_mxfp8_quantize_pads_k_to_the_alignment(alignment):
    x = activations(np.random.default_rng(alignment), (3, 96), "bfloat16")
    q, sf = compat.mxfp8_quantize(x, is_sf_swizzled_layout=False, alignment=alignment)
    padded = -(-96 // alignment) * alignment
    assert q.shape == (3, padded)
    q_ref, s_ref = compat.mxfp8_quantize(x, is_sf_swizzled_layout=False)
    codes = q.view(np.uint8)
    assert np.array_equal(codes[:, :96], q_ref.view(np.uint8)) and not codes[:, 96:].any()
    bytes_ = sf.reshape(3, padded // 32)  # the padding groups are zero groups: byte 0
    assert np.array_equal(bytes_[:, :3], s_ref.reshape(3, 3)) and not bytes_[:, 3:].any()


def test_fp4_quantize_takes_mxfp4():
    x = activations(np.random.default_rng(4), (6, 96), "bfloat16", specials=True)
    scales = []
    for g in (None, 2.0):
        q, sf = compat.fp4_quantize(x, g, 32, True)  # FlashInfer's MXFP4: no global scale is 1
        q_ref, s_ref = fgq.quantize(x, 32, dtype="e2m1", scale="ue8m0", layout="blocked",
                                    global_scale=g, arithmetic="reciprocal")  # fmt: skip
        assert np.array_equal(q, q_ref) and np.array_equal(sf, s_ref)
        scales.append(sf)
    assert not np.array_equal(*scales)  # the global scale multiplies MXFP4's scale too


@pytest.mark.parametrize("function", [compat.fp4_quantize, compat.scaled_fp4_quant])
@pytest.mark.parametrize("shape", [(5, 64), (2, 3, 160), (129, 32)])
def test_nvfp4_drop_ins(function, shape):
    x = activations(np.random.default_rng(sum(shape)), shape, "bfloat16", specials=True)
    rows, k = int(np.prod(shape[:-1])), shape[-1]
    g = np.array([2.5], np.float32)
    q, sf = function(x, g)
    q_ref, s_ref = fgq.quantize(x.reshape(rows, k), 16, dtype="e2m1", scale="e4m3",
                                layout="blocked", global_scale=g,
                                arithmetic="reciprocal")  # fmt: skip
    # FlashInfer keeps x's leading dimensions, vLLM flattens them
    q_shape = (*shape[:-1], k // 2) if function is compat.fp4_quantize else (rows, k // 2)
    assert q.dtype == np.uint8 and q.shape == q_shape
    assert np.array_equal(q.reshape(rows, k // 2), q_ref)
    geometry = Geometry((rows, k), 16, "blocked", False)
    assert sf.shape == geometry.scale_shape
    assert np.array_equal(np.asarray(sf).view(np.uint8), s_ref)
    if function is compat.scaled_fp4_quant:  # vLLM views its scales as float8_e4m3fn
        assert sf.dtype == ml_dtypes.float8_e4m3fn
    _, linear = function(x, g, is_sf_swizzled_layout=False)
    assert linear.dtype == sf.dtype and linear.shape == (rows, k // 16)
    assert np.array_equal(linear.view(np.uint8), row_major(s_ref, rows, k // 16))


def test_torch_tensors_get_torch_dtypes():
    torch = pytest.importorskip("torch")
    x = torch.from_numpy(np.random.default_rng(2).standard_normal((7, 64)).astype(np.float32))
    g = torch.tensor([1.5])
    q, sf = compat.scaled_fp4_quant(x, g)
    assert q.dtype == torch.uint8 and sf.dtype == torch.float8_e4m3fn and sf.shape == (128, 4)
    q8, sf8 = compat.mxfp8_quantize(x)
    assert q8.dtype == torch.float8_e4m3fn and sf8.dtype == torch.uint8 and sf8.shape == (512,)
    _, linear = compat.fp4_quantize(x, g, is_sf_swizzled_layout=False)
    assert linear.dtype == torch.uint8 and linear.shape == (7, 4)
    _, linear = compat.scaled_fp4_quant(x, g, is_sf_swizzled_layout=False)
    assert linear.dtype == torch.float8_e4m3fn and linear.shape == (7, 4)
    q3, _ = compat.fp4_quantize(x.reshape(7, 2, 32), g)  # FlashInfer keeps leading dimensions
    assert q3.shape == (7, 2, 16)
    big = torch.zeros(40, 64)  # m > 32: vLLM's trtllm backend keeps the 128x4 layout
    assert compat.scaled_fp4_quant(big, g, backend="trtllm")[1].shape == (128, 4)


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda x: compat.fp4_quantize(x, None), ValueError, "global_scale: FlashInfer"),
        (lambda x: compat.fp4_quantize(x, 1.0, sf_vec_size=32), NotImplementedError,
         "NVFP4 \\(16, False\\) and MXFP4 \\(32, True\\)"),
        (lambda x: compat.fp4_quantize(x, 1.0, is_sf_8x4_layout=True), NotImplementedError, "8x4"),
        (lambda x: compat.fp4_quantize(x, 1.0, is_global_scale_inversed=True),
         NotImplementedError, "inverted global scale"),
        (lambda x: compat.scaled_fp4_quant(x, 1.0, backend="trtllm"), NotImplementedError, "8x4"),
        (lambda x: compat.scaled_fp4_quant(x, None), ValueError, "input_global_scale: vLLM"),
        (lambda x: compat.fp4_quantize(x, 1.0, backend="triton"), ValueError, "backend: expected"),
        (lambda x: compat.scaled_fp4_quant(x, 1.0, padded_n=128), NotImplementedError, "padded_n"),
        (lambda x: compat.mxfp8_quantize(x, alignment=48), ValueError, "alignment: expected"),
        (lambda x: compat.mxfp8_quantize(x, sf_swizzle_layout="layout_4x4"),
         ValueError, "sf_swizzle_layout: expected an SfLayout"),
    ],
)  # fmt: skip
def test_what_the_drop_ins_do_not_do_is_named(call, error, words):
    with pytest.raises(error, match=words):
        call(np.ones((4, 64), np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("swizzled", [True, False])
def test_the_drop_ins_on_cuda_tensors_equal_the_cpu(swizzled):
    torch = pytest.importorskip("torch")
    x = activations(np.random.default_rng(9), (3, 70, 256), "bfloat16", specials=True)
    x_cpu = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    x_gpu = x_cpu.cuda()
    g = torch.tensor([0.75])
    calls = [
        lambda t, g: compat.mxfp8_quantize(t, is_sf_swizzled_layout=swizzled),
        lambda t, g: compat.mxfp8_quantize(t, swizzled, alignment=96),  # pads K to 288
        lambda t, g: compat.mxfp8_quantize(t, sf_swizzle_layout="layout_8x4"),
        lambda t, g: compat.fp4_quantize(t, g, is_sf_swizzled_layout=swizzled),
        lambda t, g: compat.fp4_quantize(t, g, 32, True, is_sf_swizzled_layout=swizzled),
        lambda t, g: compat.scaled_fp4_quant(t, g, is_sf_swizzled_layout=swizzled),
    ]
    for call in calls:
        got, want = call(x_gpu, g.cuda()), call(x_cpu, g)
        for a, b in zip(got, want):
            assert a.is_cuda and a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.cpu().view(torch.uint8), b.view(torch.uint8))
