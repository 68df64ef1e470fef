"""quantize_weight (docs/spec.md, section 4c): 128x128 and 256x256 blocks, bit for bit against
the scalar model into poisoned outputs on the NumPy backend and the GPU, the four scale layouts'
shapes and strides, partial edge blocks, batched experts, known answers and argument checks."""

import numpy as np
import pytest
from backends import (
    NUMPY_AND_GPU,
    assert_allocated,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    gpu_only_past_one_input,
    poisoned_spec,
    to_device,
    to_host_bytes,
)
from helpers import NP_INPUT, Q_POISON, SCALE_POISON, activations, assert_same_bytes

import fp8_group_quant as fgq
from fp8_group_quant import spec_model
from fp8_group_quant._arrays import describe
from fp8_group_quant._outputs import weight_specs
from fp8_group_quant._request import check_weight_options, make_weight_request

INPUTS = ["bfloat16", "float16", "float32"]
# every layout with the scale kinds it takes
LAYOUT_SCALES = [("row", "float32"), ("row", "ue8m0"), ("col", "float32"), ("col", "ue8m0"),
                 ("bytes", "ue8m0"), ("packed", "ue8m0")]  # fmt: skip


def weights(rng, shape, dtype: str, block: int = 128) -> np.ndarray:
    """Activations-like values with outliers, NaN and Inf, plus an all-zero block and a block
    of 672.0 where the shape has room for them."""
    w = activations(rng, shape, dtype, specials=True).astype(np.float32)
    flat = w.reshape(-1, *shape[-2:])
    if shape[-2] >= 2 * block and shape[-1] >= 2 * block:
        flat[0, :block, block : 2 * block] = 0.0  # a block of zeros: the UE8M0 floor, codes 0
        flat[-1, block : 2 * block, :block] = 672.0  # a tie at 336 in UE8M0, 448 with floats
    return w.astype(NP_INPUT[dtype])


def check_weight(w, lib, dtype="e4m3", scale="float32", layout="row", eps=1e-10, rule="rceil",
                 block=128, arithmetic="float32"):  # fmt: skip
    """quantize_weight of ``w`` on ``lib`` in ``block`` x ``block`` blocks into poisoned
    outputs: every byte of both storages against the scalar model, then the allocated call
    against the same bytes."""
    request = make_weight_request(describe(w, "w"), check_weight_options(
        (block, block), dtype, scale, layout, eps, rule, arithmetic))  # fmt: skip
    q_spec, s_spec = weight_specs(request)
    q, q_buf = poisoned_spec(q_spec, lib, Q_POISON)
    s, s_buf = poisoned_spec(s_spec, lib, SCALE_POISON)
    w_device = to_device(w, lib)
    options = dict(dtype=dtype, scale=scale, layout=layout, eps=eps, scale_rule=rule,
                   arithmetic=arithmetic)  # fmt: skip
    got = fgq.quantize_weight(w_device, (block, block), **options, out=q, scale_out=s)
    assert got[0] is q and got[1] is s
    codes, block_scales = spec_model.quantize_weight(w, dtype, scale, eps, rule, arithmetic,
                                                     block)  # fmt: skip
    what = f"{lib} {w.dtype} {w.shape} {block} {dtype} {scale} {layout} {arithmetic}"
    assert_same_bytes(to_host_bytes(q_buf), codes, f"q ({what})", inputs=w)
    expected = spec_model.weight_scale_bytes(block_scales, w.shape[-2], layout)
    assert_same_bytes(to_host_bytes(s_buf), expected, f"scales ({what})")
    allocated = fgq.quantize_weight(w_device, (block, block), **options)
    assert tuple(allocated[1].shape) == tuple(s_spec.shape)
    assert_allocated(allocated, (codes, to_host_bytes(s)), what)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("layout, scale", LAYOUT_SCALES)
# each input type; partial blocks in both dimensions, NaN/Inf, zero and 672 blocks
@pytest.mark.parametrize("input_dtype", INPUTS)
def test_weight_against_model(backend, layout, scale, input_dtype):
    seed = LAYOUT_SCALES.index((layout, scale)) * 3 + INPUTS.index(input_dtype)
    rng = np.random.default_rng(seed)  # fixed per case: a failure reproduces
    check_weight(weights(rng, (300, 260), input_dtype), backend, scale=scale, layout=layout)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# the OCP floor rule goes through the same blocks
def test_weight_floor_rule(backend):
    w = weights(np.random.default_rng(7), (257, 384), "bfloat16")
    check_weight(w, backend, scale="ue8m0", layout="row", rule="floor")


# e5m2 on the NumPy backend (the GPU's tile kernels write e4m3 only: test_gpu_refuses_e5m2)
@pytest.mark.parametrize("scale", ["float32", "ue8m0"])
def test_weight_e5m2(scale):
    w = weights(np.random.default_rng(8), (257, 384), "float16")
    check_weight(w, "numpy", dtype="e5m2", scale=scale, layout="row")


@pytest.mark.gpu
def test_gpu_refuses_e5m2():
    torch = pytest.importorskip("torch")
    w = torch.ones((128, 128), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="dtype: the GPU kernels"):
        fgq.quantize_weight(w, dtype="e5m2")
    with pytest.raises(ValueError, match="dtype: the GPU kernels"):
        fgq.quantize(w, 128, dtype="e5m2", orientation="both")


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# N and K across 1..300: below, at and past one and two blocks, odd and multiple-of-4 rows; and
# 9 x 5 blocks, partial both ways (more tiles than a few SMs hold at once)
@pytest.mark.parametrize("n, k", [(1, 1), (1, 300), (3, 127), (4, 128), (127, 129), (128, 128),
                                  (129, 255), (200, 256), (256, 17), (300, 300),
                                  (1030, 520)])  # fmt: skip
def test_weight_shape_sweep(backend, n, k):
    w = weights(np.random.default_rng(n * 1000 + k), (n, k), "bfloat16")
    check_weight(w, backend, scale="ue8m0", layout="packed")
    check_weight(w, backend, scale="float32", layout="col")


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# experts: batches with partial blocks, each with its own padding in the packed layout
@pytest.mark.parametrize("layout, scale", [("row", "float32"), ("bytes", "ue8m0"),
                                           ("packed", "ue8m0")])  # fmt: skip
def test_weight_batched(backend, layout, scale):
    w = weights(np.random.default_rng(3), (3, 130, 200), "bfloat16")
    check_weight(w, backend, scale=scale, layout=layout)


# 256x256 blocks (torchao's other block size) ------------------------------------------------

# the layouts 256x256 blocks take (packed is DeepGEMM's 128x128 layout)
LAYOUT_SCALES_256 = [ls for ls in LAYOUT_SCALES if ls[0] != "packed"]


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("layout, scale", LAYOUT_SCALES_256)
# each input type; partial blocks in both dimensions, NaN/Inf, zero and 672 blocks
@pytest.mark.parametrize("input_dtype", INPUTS)
def test_weight_256_against_model(backend, layout, scale, input_dtype):
    seed = 100 + LAYOUT_SCALES_256.index((layout, scale)) * 3 + INPUTS.index(input_dtype)
    rng = np.random.default_rng(seed)
    w = weights(rng, (600, 520), input_dtype, block=256)
    check_weight(w, backend, scale=scale, layout=layout, block=256)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# N and K below, at and past one, two and four blocks of 256; 9 x 5 blocks, partial both ways
@pytest.mark.parametrize("n, k", [(1, 1), (1, 600), (3, 255), (4, 256), (255, 257), (256, 256),
                                  (257, 511), (512, 512), (513, 17), (1024, 1030),
                                  (2100, 1100)])  # fmt: skip
def test_weight_256_shape_sweep(backend, n, k):
    if backend == "numpy" and n > 2000:
        pytest.skip("45 blocks: the GPU's grid; smaller shapes check the NumPy backend's loop")
    w = weights(np.random.default_rng(n * 1000 + k + 7), (n, k), "bfloat16", block=256)
    check_weight(w, backend, scale="ue8m0", layout="bytes", block=256)
    check_weight(w, backend, scale="float32", layout="col", block=256)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# experts; section 3c's arithmetics (DeepGEMM's, torchao's) and the floor rule
@pytest.mark.parametrize("input_dtype, scale, arithmetic, rule", [
    ("bfloat16", "float32", "float32", "rceil"), ("float32", "float32", "multiplier", "rceil"),
    ("float16", "float32", "reciprocal", "rceil"), ("bfloat16", "ue8m0", "float32", "floor"),
])  # fmt: skip
def test_weight_256_batched_and_arithmetics(backend, input_dtype, scale, arithmetic, rule):
    w = weights(np.random.default_rng(31), (3, 520, 300), input_dtype, block=256)
    check_weight(w, backend, scale=scale, layout="row", block=256, arithmetic=arithmetic,
                 rule=rule)  # fmt: skip


@pytest.mark.gpu
def test_weight_256_unaligned_view():
    """Whole 256x256 blocks read through a device view whose base is 2 bytes past a 16-byte
    boundary (the kernel's scalar loads) and whose row stride is wider than K."""
    torch = pytest.importorskip("torch")
    base = weights(np.random.default_rng(5), (512, 520), "bfloat16", block=256)
    whole = torch.from_numpy(base.view(np.int16)).cuda().view(torch.bfloat16)
    q, s = fgq.quantize_weight(whole[:, 1:513], (256, 256), scale="ue8m0")
    codes, scales = spec_model.quantize_weight(base[:, 1:513], "e4m3", "ue8m0", 1e-10, block=256)
    assert_same_bytes(q.view(torch.uint8).cpu().numpy().reshape(-1), codes.reshape(-1),
                      "q through an unaligned view")  # fmt: skip
    assert_same_bytes(
        s.cpu().numpy().view(np.uint8).reshape(-1),
        spec_model.weight_scale_bytes(scales, 512, "row"),
        "scales",
    )


def _nonfinite_tiles(rng, shape, dtype: str, block: int) -> np.ndarray:
    """A 3 x 3 grid of blocks, the last row and column partial, where Inf and NaN sit where a
    tile's maximum over every value is not its finite maximum: beside the block's largest
    finite value, alone in a block of small values, filling a whole block, at the last real
    row or column of a partial block; one block with none."""
    w = activations(rng, shape, dtype).astype(np.float32)
    n, k = w.shape[-2:]
    b = block
    w[..., 3, 5], w[..., 70, 9] = np.inf, 1000.0  # (0, 0): Inf beside the largest finite value
    w[..., 1:b, b : 2 * b] *= 1e-3
    w[..., 0, b + 1], w[..., b - 1, 2 * b - 1] = np.nan, -np.nan  # (0, 1): NaN among small values
    w[..., b : 2 * b, :b] = np.nan  # (1, 0): all NaN, the finite maximum 0 (eps)
    w[..., b + 2, b + 3], w[..., 2 * b - 1, b] = -np.inf, np.inf  # (1, 1): both infinities
    w[..., n - 1, k - 1] = np.nan  # (2, 2), partial both ways: its last real value
    w[..., n - 1, 0] = -np.inf  # (2, 0), partial rows
    w[..., 0, k - 1] = np.inf  # (0, 2), partial columns; (1, 2) and (2, 1) hold none
    return w.astype(NP_INPUT[dtype])


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@pytest.mark.parametrize("block", [128, 256])
@pytest.mark.parametrize("input_dtype", INPUTS)
# the GPU takes a block's maximum with Inf and NaN counted, then its finite maximum again for a
# block where that is one of them: each placement, both scale kinds, a batch of two experts
# (the first free of them)
def test_weight_nonfinite_maxima(backend, block, input_dtype):
    gpu_only_past_one_input(backend, input_dtype)
    rng = np.random.default_rng(block + INPUTS.index(input_dtype))
    # K = 2 blocks + 19: rows not 16-byte aligned, every load guarded; + 16: whole blocks take
    # the straight vector loads
    for k in (2 * block + 19, 2 * block + 16):
        w = _nonfinite_tiles(rng, (2 * block + 37, k), input_dtype, block)
        check_weight(w, backend, scale="ue8m0", layout="row", block=block)
        check_weight(w, backend, scale="float32", layout="col", block=block)
    # experts: the first free of Inf and NaN, the second holding them (the batch stride)
    experts = np.stack([activations(rng, w.shape, input_dtype), w])
    check_weight(experts, backend, scale="float32", layout="row", block=block)


def test_dequantize_weight_256():
    w = weights(np.random.default_rng(9), (520, 300), "float32", block=256)
    for layout, scale in LAYOUT_SCALES_256:
        q, s = fgq.quantize_weight(w, (256, 256), scale=scale, layout=layout)
        back = fgq.dequantize_weight(q, s, (256, 256))
        codes, scales = spec_model.quantize_weight(w, "e4m3", scale, 1e-10, block=256)
        spread = np.repeat(np.repeat(scales[0], 256, 0), 256, 1)[:520, :300]
        decoded = np.asarray(q).astype(np.float32)
        assert np.array_equal(back, decoded * spread.astype(np.float32), equal_nan=True)
    with pytest.raises(ValueError, match="block"):
        fgq.dequantize_weight(q, s, (128, 256))
    q, s = fgq.quantize_weight(w, scale="ue8m0", layout="packed")  # of 128x128 blocks
    with pytest.raises(ValueError, match="packed int32 scales are of 128x128 blocks"):
        fgq.dequantize_weight(q, s, (256, 256))


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
# an empty weight in each dimension returns empty outputs; packed padding still zero
@pytest.mark.parametrize("shape", [(0, 128), (128, 0), (0, 5, 7)])
def test_weight_empty(backend, shape):
    w = np.zeros(shape, np.float32)
    check_weight(w, backend, scale="ue8m0", layout="packed")


# known answers ------------------------------------------------------------------------------


def test_weight_known_answers():
    w = np.zeros((256, 256), np.float32)
    w[128:, :128] = 672.0
    w[:128, 128:] = np.nan
    w[128:, 128:] = 1.0
    w[200, 200] = np.inf  # Inf never enters the maximum
    q, s = fgq.quantize_weight(w, scale="ue8m0", layout="bytes")
    assert s.tolist() == [[0x5E, 0x5E], [0x80, 0x77]]  # zero and all-NaN blocks: the floor
    codes = q.view(np.uint8)
    assert codes[0, 0] == 0x00 and codes[0, 200] == 0x7F  # +NaN keeps its code
    assert codes[130, 5] == 0x7A  # 672 / 2 = 336, a tie that rounds to 320
    assert codes[200, 200] == 0x7E  # +Inf saturates to 448
    assert float(q[130, 130]) == 256.0  # 1.0 / 2^-8: y = 1/448 rounds up to 2^-8
    _, s = fgq.quantize_weight(w, layout="row")
    assert s[1, 0] == np.float32(1.5) and s[1, 1] == np.float32(1.0) / np.float32(448.0)


def test_partial_block_reads_only_what_exists():
    """The same weight cut at N and K gives the block maximum of what remains."""
    w = np.ones((200, 200), np.float32)
    w[150:, 150:] = 1000.0  # a value in the part the cut removes
    _, s = fgq.quantize_weight(np.ascontiguousarray(w[:150, :150]), layout="row")
    assert s.tolist() == [[np.float32(1) / np.float32(448)] * 2] * 2


def test_torch_cpu_weight_and_dequantize():
    torch = pytest.importorskip("torch")
    w = weights(np.random.default_rng(5), (140, 300), "float32")
    w = np.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)
    q, s = fgq.quantize_weight(torch.from_numpy(w), scale="ue8m0", layout="packed")
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.int32
    assert tuple(s.shape) == (140, 1) and tuple(s.stride()) == (1, 140)
    back = fgq.dequantize_weight(q, s)
    codes, scales = spec_model.quantize_weight(w, "e4m3", "ue8m0", 1e-10)
    expected = codes[0].view(__import__("ml_dtypes").float8_e4m3fn).astype(np.float32)
    expected *= np.repeat(np.repeat(scales[0], 128, 0), 128, 1)[:140, :300]
    assert np.array_equal(back.numpy(), expected)


@pytest.mark.parametrize("layout, scale", LAYOUT_SCALES)
def test_dequantize_weight_every_layout(layout, scale):
    w = weights(np.random.default_rng(11), (2, 150, 140), "float32")
    w = np.nan_to_num(w, nan=0.0, posinf=1.0, neginf=-1.0)
    q, s = fgq.quantize_weight(w, scale=scale, layout=layout)
    reference, _ = fgq.quantize_weight(w, scale=scale, layout="row")
    _, rows = fgq.quantize_weight(w, scale=scale, layout="row")
    expected = q.astype(np.float32) * np.repeat(np.repeat(rows, 128, 1), 128, 2)[:, :150, :140]
    assert np.array_equal(fgq.dequantize_weight(q, s), expected)
    assert np.array_equal(q.view(np.uint8), reference.view(np.uint8))


def test_packed_weight_is_activation_packed_of_repeated_rows():
    """DeepGEMM's SM100 weight scales read back by the activation dequantize (K = 2 * 128)."""
    w = weights(np.random.default_rng(2), (300, 256), "bfloat16").astype(np.float32)
    w = np.nan_to_num(w, nan=0.0, posinf=1.0, neginf=-1.0)
    q, packed = fgq.quantize_weight(w, scale="ue8m0", layout="packed")
    assert np.array_equal(fgq.dequantize(q, packed, 128), fgq.dequantize_weight(q, packed))


# layouts: shapes, dtypes, strides (the table of section 4c) -----------------------------------


# N = 300, K = 600: nb = 3, kb = 5, kp = 2, tma = 300; batched E = 2
@pytest.mark.parametrize("layout, scale, dtype, shape, strides", [
    ("row", "float32", np.float32, (3, 5), (5, 1)),
    ("col", "float32", np.float32, (3, 5), (1, 3)),
    ("bytes", "ue8m0", np.uint8, (3, 5), (5, 1)),
    ("packed", "ue8m0", np.int32, (301, 2), (1, 304)),
])  # fmt: skip
def test_weight_layouts(layout, scale, dtype, shape, strides):
    n = shape[0] if layout == "packed" else 300
    for lead in ((), (2,)):
        w = np.ones((*lead, n, 600), np.float32)
        q, s = fgq.quantize_weight(w, scale=scale, layout=layout)
        per_batch = shape[0] * shape[1] if layout != "packed" else 304 * 2
        assert s.dtype == dtype and s.shape == (*lead, *shape)
        itemsize = np.dtype(dtype).itemsize
        assert s.strides == tuple(itemsize * v for v in (per_batch,) * len(lead) + strides)
        assert q.shape == w.shape and q.flags.c_contiguous


# argument checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, error, match", [
    ({"block": (64, 64)}, ValueError, "block"),
    ({"block": (128, 256)}, ValueError, "block"),
    ({"block": (512, 512)}, ValueError, "block"),
    ({"block": (256, 256), "layout": "packed", "scale": "ue8m0"}, ValueError, "layout='packed'"),
    ({"block": (True, True)}, TypeError, "block"),
    ({"block": 128}, TypeError, "block"),
    ({"block": (128, 128.0)}, TypeError, "block"),
    ({"dtype": "int8"}, ValueError, "dtype"),
    ({"dtype": "e4m3fnuz"}, ValueError, "dtype"),
    ({"dtype": "e2m1"}, ValueError, "dtype"),
    ({"layout": "packed"}, ValueError, "layout='packed'"),
    ({"layout": "bytes"}, ValueError, "layout='bytes'"),
    ({"layout": "blocked"}, ValueError, "layout"),
    ({"layout": "col_tma"}, ValueError, "layout"),
    ({"scale": "e4m3"}, ValueError, "scale"),
    ({"eps": 0.0}, ValueError, "eps"),
    ({"scale_rule": "floor"}, ValueError, "scale_rule"),
    ({"scale_rule": "nearest", "scale": "ue8m0"}, ValueError, "scale_rule"),
])  # fmt: skip
def test_weight_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        fgq.quantize_weight(np.ones((4, 4), np.float32), **kwargs)


@pytest.mark.parametrize("w, error, match", [
    (np.ones(8, np.float32), ValueError, r"w: expected \[N, K\]"),
    (np.ones((2, 2, 2, 2), np.float32), ValueError, r"w: expected \[N, K\]"),
    (np.ones((4, 4), np.int32), TypeError, "w: expected one of"),
    (np.ones((4, 8), np.float32)[:, ::2], ValueError, "w: the last dimension"),
])  # fmt: skip
def test_weight_bad_input(w, error, match):
    with pytest.raises(error, match=match):
        fgq.quantize_weight(w)


def test_weight_bad_outputs_write_nothing():
    w = np.ones((130, 130), np.float32)
    s = np.full((2, 2), 7.0, np.float32)
    with pytest.raises(ValueError, match="out: expected shape"):
        fgq.quantize_weight(w, out=np.zeros((130, 129), np.uint8), scale_out=s)
    assert (s == 7.0).all()
    with pytest.raises(ValueError, match="scale_out: expected strides"):
        fgq.quantize_weight(w, scale_out=np.zeros((2, 2), np.float32).T)
    with pytest.raises(TypeError, match="scale_out: expected dtype int32"):
        fgq.quantize_weight(w, scale="ue8m0", layout="packed", scale_out=np.zeros((130, 1)))


def test_weight_layout_names_match():
    from typing import get_args

    from fp8_group_quant._layout import WEIGHT_LAYOUTS

    assert set(get_args(fgq.WeightLayoutName)) == set(WEIGHT_LAYOUTS)


# the launch's Params against the layout (no GPU needed: the kernel's address arithmetic) -----


def _kernel_scale_bytes(params, scales: np.ndarray, n: int) -> np.ndarray:
    """The scale storage quantize_weight_blocks writes with ``params``, by its address
    arithmetic (kernels/tile.cuh), from block scales ``[E, nb, kb]``: float words, bytes, or
    the packed rows' bytes with the padding and the spare bytes above the last block zeroed."""
    e, nb, kb = scales.shape
    size = params.s_batch_stride * e if e else 0
    out = np.zeros(max(size, 1), np.uint8)
    for b, i, j in np.ndindex(e, nb, kb):
        s = np.float32(scales[b, i, j])
        exponent = int(np.float32(s).view(np.uint32) >> 23)
        base = b * params.s_batch_stride
        if params.weight_layout == 2:
            for row in range(i * 128, min(i * 128 + 128, params.scale_rows)):
                word = base + row * params.s_row_stride + (j // 4) * params.s_word_stride
                out[word + j % 4] = exponent if row < n else 0
                if j == params.groups_per_row - 1:
                    out[word + j % 4 + 1 : word + 4] = 0
        elif params.weight_layout == 1:
            out[base + i * params.s_row_stride + j * params.s_word_stride] = exponent
        else:
            at = base + i * params.s_row_stride + j * params.s_word_stride
            out[at : at + 4] = np.frombuffer(s.tobytes(), np.uint8)
    return out[:size]


# each layout, a batch of experts with partial blocks both ways
@pytest.mark.parametrize("layout, scale", LAYOUT_SCALES)
def test_weight_params_address_the_layout(layout, scale):
    from fp8_group_quant._plan import weight_params

    w = weights(np.random.default_rng(12), (2, 300, 600), "float32")
    request = make_weight_request(describe(w, "w"), check_weight_options(
        (128, 128), "e4m3", scale, layout, 1e-10, "rceil"))  # fmt: skip
    params = weight_params(request, True)
    assert (params.rows, params.cols, params.groups_per_row, params.batches) == (300, 600, 5, 2)
    assert params.x_row_stride == 600 and params.x_batch_stride == 300 * 600
    assert params.q_batch_stride == 300 * 600
    _, block_scales = spec_model.quantize_weight(w, "e4m3", scale, 1e-10)
    got = _kernel_scale_bytes(params, block_scales, 300)
    assert_same_bytes(got, spec_model.weight_scale_bytes(block_scales, 300, layout), layout)
