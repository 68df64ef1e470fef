"""torch CPU tensors go through the NumPy backend and come back as torch CPU tensors."""

import ml_dtypes
import numpy as np
import pytest
from helpers import activations

import fp8_group_quant as fgq
from fp8_group_quant.compat import per_token_group_quant_fp8_packed_for_deepgemm

torch = pytest.importorskip("torch")


def to_torch(x: np.ndarray):
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(x.copy())


@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize(
    "dtype, scale, layout",
    [("e4m3", "ue8m0", "packed"), ("e5m2", "float32", "col_tma"), ("int8", "float32", "row"),
     ("e4m3fnuz", "ue8m0", "packed_row")],
)  # fmt: skip
def test_torch_cpu_tensors_give_the_numpy_backends_bytes(input_dtype, dtype, scale, layout):
    x = activations(np.random.default_rng(5), (2, 7, 512), input_dtype, specials=True)
    q, s = fgq.quantize(to_torch(x), 128, dtype=dtype, scale=scale, layout=layout)
    q_ref, s_ref = fgq.quantize(x, 128, dtype=dtype, scale=scale, layout=layout)
    assert isinstance(q, torch.Tensor) and q.device.type == "cpu" and isinstance(s, torch.Tensor)
    assert str(q.dtype).removeprefix("torch.") == np.asarray(q_ref).dtype.name
    assert tuple(s.shape) == s_ref.shape
    assert tuple(s.stride()) == tuple(v // s_ref.itemsize for v in s_ref.strides)
    np.testing.assert_array_equal(q.view(torch.uint8).numpy(), np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(s.numpy(), s_ref)
    back = fgq.dequantize(q, s, 128)
    assert isinstance(back, torch.Tensor)
    np.testing.assert_array_equal(back.numpy(), fgq.dequantize(q_ref, s_ref, 128))


def test_torch_cpu_outputs_are_written_in_place_and_checked():
    x = activations(np.random.default_rng(6), (4, 256), "bfloat16")
    out = torch.full((4, 256), 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
    q, _ = fgq.quantize_packed(to_torch(x), out=out)
    assert q is out
    np.testing.assert_array_equal(
        out.view(torch.uint8).numpy(), np.asarray(fgq.quantize_packed(x)[0]).view(np.uint8)
    )
    with pytest.raises(TypeError, match="out: expected a torch CPU tensor"):
        fgq.quantize_packed(to_torch(x), out=np.empty((4, 256), ml_dtypes.float8_e4m3fn))
    with pytest.raises(ValueError, match="out: expected shape"):
        fgq.quantize_packed(to_torch(x), out=torch.empty((4, 128), dtype=torch.float8_e4m3fn))
    q3, _ = per_token_group_quant_fp8_packed_for_deepgemm(to_torch(x).reshape(2, 2, 256), 128)
    assert isinstance(q3, torch.Tensor) and tuple(q3.shape) == (2, 2, 256)


def test_the_issue_packed_view_over_exactly_its_storage_is_accepted():
    # issue 43: an (5, 1) int32 view with strides (1, 8) over an allocation of 8 words (32
    # bytes, the layout's storage with its padding rows) was refused as holding 20 bytes
    x = activations(np.random.default_rng(6), (5, 256), "bfloat16")
    view = torch.full((8,), -1, dtype=torch.int32).as_strided((5, 1), (1, 8))
    q, s = fgq.quantize(to_torch(x), 128, layout="packed", scale="ue8m0", scale_out=view)
    assert s is view
    s_ref = fgq.quantize(x, 128, layout="packed", scale="ue8m0")[1]
    storage = np.lib.stride_tricks.as_strided(s_ref, (8,), (4,))  # the reference's padding too
    np.testing.assert_array_equal(view.as_strided((8,), (1,)).numpy(), storage)


@pytest.mark.parametrize("layout", ["col", "col_tma"])  # the column-major float layouts
@pytest.mark.parametrize("m", [4, 5, 8])  # with and without TMA padding rows
def test_3d_scale_out_made_with_empty_strided(layout, m):
    # issue 43: buffers made by empty_strided with exactly the returned strides were refused as
    # holding "an unknown" number of bytes; they are right where their allocation holds the
    # layout's storage, and refused with what it lacks where it does not (col_tma, M % 4 != 0)
    x = activations(np.random.default_rng(7), (2, m, 384), "bfloat16")
    s_ref = fgq.quantize(x, 128, layout=layout)[1]
    given = torch.empty_strided(s_ref.shape, tuple(v // 4 for v in s_ref.strides))
    if layout == "col_tma" and m % 4:
        with pytest.raises(ValueError, match="scale_out: the layout owns 192 bytes .* holds 180"):
            fgq.quantize(to_torch(x), 128, layout=layout, scale_out=given)
        return
    q, s = fgq.quantize(to_torch(x), 128, layout=layout, scale_out=given)
    assert s is given
    np.testing.assert_array_equal(s.numpy(), s_ref)


@pytest.mark.parametrize("m", [3, 8])  # with and without TMA padding rows
def test_persistent_masked_m_silu_mul_quant_default_format_on_torch_cpu(m):
    # issue 43: its default quant_scale_fmt="FLOAT32" failed on every torch CPU input
    from fp8_group_quant.compat import persistent_masked_m_silu_mul_quant

    y = activations(np.random.default_rng(8), (2, m, 512), "bfloat16")
    counts = np.array([m, 1], np.int32)
    q, s = persistent_masked_m_silu_mul_quant(to_torch(y), torch.from_numpy(counts))
    q_ref, s_ref = persistent_masked_m_silu_mul_quant(y, counts)
    for e, n in enumerate(counts):  # the rows each expert's count covers
        np.testing.assert_array_equal(
            q[e, :n].view(torch.uint8).numpy(), np.asarray(q_ref)[e, :n].view(np.uint8)
        )
        np.testing.assert_array_equal(s[e, :n].numpy(), np.asarray(s_ref)[e, :n])


def test_tensor_that_requires_grad_is_read_as_on_the_gpu():
    # issue 43: a tensor with requires_grad had "no numpy view"; no gradient flows through
    # quantization on any backend, so it is read as it is
    x = activations(np.random.default_rng(9), (3, 256), "float32")
    q, s = fgq.quantize(to_torch(x).requires_grad_(), 128)
    q_ref, s_ref = fgq.quantize(x, 128)
    np.testing.assert_array_equal(q.view(torch.uint8).numpy(), np.asarray(q_ref).view(np.uint8))
    np.testing.assert_array_equal(s.numpy(), s_ref)
