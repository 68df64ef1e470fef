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
