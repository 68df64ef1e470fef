"""The blocked scale layout (Blackwell block-scaled MMA): offsets, padding, values, round trip,
on the NumPy backend and the GPU."""

import ml_dtypes
import numpy as np
import pytest
from backends import (
    check,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    plain_kernel_path,  # noqa: F401 - the fixture kernel_path
    to_device,
)
from helpers import activations

import fp8_group_quant as fgq
from fp8_group_quant import spec_model
from fp8_group_quant._layout import SCALE_LAYOUTS, Geometry

BLOCKED = SCALE_LAYOUTS["blocked"]
SHAPES = [(1, 1), (5, 3), (127, 4), (128, 4), (129, 5), (300, 56), (256, 224)]  # (rows, groups)


# inside one 128x4 tile, a tile exactly, one past it, many tiles
@pytest.mark.parametrize("rows, groups", SHAPES)
def test_offsets_follow_the_spec_formula(rows, groups):
    geometry = Geometry((rows, groups * 32), 32, BLOCKED, False)
    offsets = geometry.scale_byte_offsets()[0]
    for r in range(rows):
        for c in range(groups):
            assert offsets[r, c] == spec_model.blocked_offset(r, c, groups), (r, c)
    # every scale has its own byte, inside the padded storage of align(R, 128) * align(C, 4)
    storage = -(-rows // 128) * 128 * -(-groups // 4) * 4
    assert geometry.scale_storage == storage
    assert len(set(offsets.ravel().tolist())) == rows * groups and offsets.max() < storage


# inside one 128x4 tile, a tile exactly, one past it, many tiles
@pytest.mark.parametrize("rows, groups", SHAPES)
def test_offsets_match_torchs_blocked_helper(rows, groups):
    torch = pytest.importorskip("torch")
    try:
        from torch.testing._internal.common_quantized import to_blocked
    except ImportError:  # pragma: no cover - older torch
        pytest.skip("this torch has no to_blocked testing helper")
    ids = torch.arange(1, rows * groups + 1, dtype=torch.float32).reshape(rows, groups)
    swizzled = to_blocked(ids).reshape(-1).numpy()
    offsets = Geometry((rows, groups * 32), 32, BLOCKED, False).scale_byte_offsets()[0]
    assert np.array_equal(swizzled[offsets.ravel()], np.arange(1, rows * groups + 1))
    padding = np.ones(swizzled.size, bool)
    padding[offsets.ravel()] = False
    assert not swizzled[padding].any()  # torch's padding is zero, like ours


# partial tiles, batches, four dimensions, one whole tile
@pytest.mark.parametrize("shape", [(5, 96), (2, 130, 7 * 32), (2, 3, 4, 256), (128, 128)])
# both UE8M0 exponent rules
@pytest.mark.parametrize("rule", ["rceil", "floor"])
def test_blocked_holds_the_row_layouts_exponents_and_zero_padding(shape, rule):
    rng = np.random.default_rng(len(shape) + shape[-1])
    x = activations(rng, shape, "bfloat16", specials=True)
    geometry = Geometry(shape, 32, BLOCKED, False)
    out = np.full(geometry.scale_shape, 0x7F, np.uint8)  # poisoned: every byte must be written
    q, s = fgq.quantize(x, 32, scale="ue8m0", layout="blocked", scale_rule=rule, scale_out=out)
    assert s is out and s.dtype == np.uint8 and s.shape == geometry.scale_shape
    q_row, s_row = fgq.quantize(x, 32, scale="ue8m0", layout="row", scale_rule=rule)
    assert np.array_equal(np.asarray(q).view(np.uint8), np.asarray(q_row).view(np.uint8))
    exponents = (np.asarray(s_row, np.float32).view(np.uint32) >> 23).astype(np.uint8)
    flat = s.reshape(geometry.batches, -1)
    offsets = geometry.scale_byte_offsets()
    placed = np.zeros_like(flat)
    for b in range(geometry.batches):
        placed[b, offsets[b].ravel() - b * flat.shape[1]] = exponents.reshape(geometry.batches, -1)[
            b
        ]
    assert np.array_equal(flat, placed)  # the exponents where they belong, zeros elsewhere


def test_dequantize_reads_blocked_scales():
    rng = np.random.default_rng(3)
    x = activations(rng, (2, 200, 160), "float16")
    q, s = fgq.quantize(x, 32, dtype="e5m2", scale="ue8m0", layout="blocked")
    q_row, s_row = fgq.quantize(x, 32, dtype="e5m2", scale="ue8m0", layout="row")
    assert np.array_equal(fgq.dequantize(q, s, 32), fgq.dequantize(q_row, s_row, 32))
    with pytest.raises(ValueError, match="scales: blocked scales for q of shape"):
        fgq.dequantize(q, s[:, :128], 32)


def test_torch_cpu_tensors_get_blocked_scales_too():
    torch = pytest.importorskip("torch")
    x = activations(np.random.default_rng(4), (7, 64), "float32")
    q, s = fgq.quantize(torch.from_numpy(x), 32, scale="ue8m0", layout="blocked")
    _, s_np = fgq.quantize(x, 32, scale="ue8m0", layout="blocked")
    assert s.dtype == torch.uint8 and np.array_equal(s.numpy(), s_np)


def test_blocked_needs_ue8m0_scales():
    x = np.zeros((4, 64), ml_dtypes.bfloat16)
    with pytest.raises(ValueError, match="layout='blocked' holds one UE8M0 exponent byte"):
        fgq.quantize(x, 32, layout="blocked")
    for dtype in ("int8", "e4m3fnuz"):  # not MX element formats: no block-scaled MMA takes them
        with pytest.raises(ValueError, match="layout='blocked' is the scale layout of Blackwell"):
            fgq.quantize(x, 32, dtype=dtype, scale="ue8m0", layout="blocked")
    with pytest.raises(ValueError, match="scale_out: expected shape"):
        fgq.quantize(x, 32, scale="ue8m0", layout="blocked", scale_out=np.zeros((4, 4), np.uint8))


# the GPU against the NumPy backend ----------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["rceil", "floor"])  # both UE8M0 exponent rules
def test_blocked_scales_across_tiles_batches_and_padding(rule, kernel_path):
    # rows past one 128-row tile, a partial last tile, group columns past one 4-group tile with
    # padding columns, batches that each own their padded tiles, one token (127 padding rows)
    rng = np.random.default_rng(25)
    shapes = [((129, 5 * 32), 32), ((300, 56 * 32), 32), ((2, 130, 7 * 32), 32),
              ((1, 7168), 32), ((3, 2, 257, 2048), 64), ((256, 1024), 128)]  # fmt: skip
    for i, (shape, group_size) in enumerate(shapes):
        for input_dtype in ("bfloat16", "float32"):
            x = activations(rng, shape, input_dtype, specials=True)
            lib = ("cupy", "torch")[i % 2]
            for dtype in ("e4m3", "e5m2"):
                check(x, to_device(x, lib), lib, group_size, dtype, "ue8m0", "blocked",
                      pad_rows=i % 3 == 0, scale_rule=rule)  # fmt: skip


@pytest.mark.gpu
def test_blocked_scale_out_must_be_16_byte_aligned():
    import cupy

    x = cupy.asarray(activations(np.random.default_rng(26), (5, 128), "bfloat16"))
    storage = cupy.zeros(128 * 4 + 16, cupy.uint8)
    misaligned = storage[4 : 4 + 128 * 4].reshape(128, 4)
    with pytest.raises(ValueError, match="scale_out: expected a 16-byte aligned pointer"):
        fgq.quantize(x, 32, scale="ue8m0", layout="blocked", scale_out=misaligned)
    aligned = storage[16:].reshape(128, 4)
    q, s = fgq.quantize(x, 32, scale="ue8m0", layout="blocked", scale_out=aligned)
    _, want = fgq.quantize(cupy.asnumpy(x), 32, scale="ue8m0", layout="blocked")
    assert s is aligned and np.array_equal(cupy.asnumpy(s), want)
