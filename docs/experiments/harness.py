"""What the experiments share: inputs, compiled variants, and CUDA-graph timing of launches.

Each experiment times kernels by graph replay over rotating buffers, as `bench` does, so its
figures compare with the benchmark's. Run from the repository root with PYTHONPATH=.
"""

import cupy
import ml_dtypes
import numpy as np

from fp8_group_quant import _jit, _launch, api, bench
from fp8_group_quant._layout import Geometry

ROTATE_BYTES = 256 * 2**20  # input bytes rotated through, several times the 50 MB L2
CALLS = 32  # launches per graph (at least one per buffer)


def rotating_inputs(m: int, k: int) -> tuple[list, list]:
    """bf16 inputs of random data (the same values in each buffer) and their packed outputs."""
    host = np.random.default_rng(m).standard_normal((m, k), dtype=np.float32)
    host = host.astype(ml_dtypes.bfloat16)
    buffers = max(2, min(64, -(-ROTATE_BYTES // host.nbytes)))
    inputs = [cupy.asarray(host) for _ in range(buffers)]
    return inputs, [api.quantize_packed(x) for x in inputs]


def compile_function(text: str, name_expression: str):
    """``name_expression`` compiled from the kernel source ``text`` (a variant of ours)."""
    module = cupy.RawModule(
        code=text, options=_jit.nvrtc_options(), name_expressions=(name_expression,)
    )
    return module.get_function(name_expression)


def roofline_function():
    return compile_function(_jit.source_text("roofline.cu"), "fgq::roofline_copy")


def time_roofline(roofline, inputs, outputs) -> float:
    """Graph-replay us per call of the roofline kernel over the inputs."""
    chunks = inputs[0].size * 2 // 32
    grid = (-(-chunks // 256), 1, 1)

    def call(i):
        x, (q, _) = inputs[i % len(inputs)], outputs[i % len(outputs)]
        return lambda: roofline(grid, (256, 1, 1), (x, q, np.int64(chunks)))

    return bench.graph_time_us(cupy, [call(i) for i in range(max(len(inputs), CALLS))], 9)


def default_launch(m: int, k: int) -> tuple[_launch.Launch, tuple]:
    """The library's launch of the default kernel at (m, k), and its argument values."""
    geometry = Geometry((m, k), 128, "packed", False)
    device = cupy.cuda.runtime.getDevice()
    launch = _launch.prepare(_launch.DEFAULT_KEY, geometry, device, k, k, 1e-10)
    return launch, (0, 0, 0) + tuple(a.value for a in launch._args)


def variant_launch(function, grid, block, values) -> _launch.Launch:
    with _jit.current_device(cupy.cuda.runtime.getDevice()):
        return _launch.Launch(function.kernel.ptr, grid, block, values)


def run_launch(launch, x, outputs) -> None:
    q, scales = outputs
    launch.launch(x.data.ptr, q.data.ptr, scales.data.ptr, cupy.cuda.get_current_stream().ptr)


def time_launch(launch, inputs, outputs) -> float:
    """Graph-replay us per call of a prepared launch over the inputs."""

    def call(i):
        x, out = inputs[i % len(inputs)], outputs[i % len(outputs)]
        return lambda: run_launch(launch, x, out)

    return bench.graph_time_us(cupy, [call(i) for i in range(max(len(inputs), CALLS))], 9)
