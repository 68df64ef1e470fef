"""Pure CuPy: quantize on the GPU with float32 column-major TMA-aligned scales (DeepGEMM SM90).

python examples/cupy_gpu.py   (needs a CUDA GPU and fp8_group_quant[cuda12] or [cuda13])
"""

import sys

import ml_dtypes
import numpy as np

import fp8_group_quant as fgq

try:  # compile and load the default kernel; without a GPU, say so clearly and stop
    fgq.warmup()
except fgq.GpuUnavailableError as error:
    sys.exit(f"examples/cupy_gpu.py needs a CUDA GPU: {error}")

import cupy  # noqa: E402 - after the check above, which says why it cannot run

x = cupy.asarray(np.random.default_rng(0).standard_normal((4096, 7168)).astype(ml_dtypes.bfloat16))
q, scales = fgq.quantize(x, layout="col_tma")  # runs on CuPy's current stream
print("q:", q.dtype, q.shape, "(uint8 holding float8_e4m3fn bytes)")
print(
    "scales:", scales.dtype, scales.shape, "strides (elements):", [s // 4 for s in scales.strides]
)

q_ref, scales_ref = fgq.quantize(cupy.asnumpy(x), layout="col_tma")  # the NumPy reference
assert (q.get() == np.asarray(q_ref).view(np.uint8)).all()
assert (cupy.asnumpy(scales) == scales_ref).all()
print("bit-exact against the NumPy reference")
