"""Quantize on the CPU with the NumPy backend, inspect the packed scales, dequantize.

Runs anywhere: python examples/numpy_cpu.py
"""

import ml_dtypes
import numpy as np

import fp8_group_quant as fgq

rng = np.random.default_rng(0)
x = (rng.standard_normal((6, 1024)) * 3).astype(ml_dtypes.bfloat16)
x[2, 130] = 900.0  # an outlier: only its own group (row 2, group 1) gets a larger scale

q, scales = fgq.quantize_packed(x)  # e4m3 codes, UE8M0 scales packed 4 per int32, MN-major
print("q:", q.dtype, q.shape)
print(
    "packed scales:",
    scales.dtype,
    scales.shape,
    "strides (elements):",
    [s // 4 for s in scales.strides],
)
print("exponent bytes of row 2:", [hex(b) for b in np.ascontiguousarray(scales[2]).view(np.uint8)])
print("scales of row 2 as floats:", fgq.unpack_scales(scales, groups=8)[2])

x_back = fgq.dequantize(q, scales, 128)  # packed scales: the group size is given
error = np.linalg.norm(x_back - x.astype(np.float32)) / np.linalg.norm(x.astype(np.float32))
print(f"relative error after a round trip: {error:.3%}")
assert error < 0.05
