"""What the experiments share: inputs, compiled variants, and CUDA-graph timing of launches.

Each experiment times kernels by graph replay over rotating buffers, as `bench` does, so its
figures compare with the benchmark's. Run from the repository root with PYTHONPATH=.

NOTES: the experiments that edit the kernel's text (latency_stages.py, prefetch_depth.py) were
written against the kernel of commit 1c70942, which their logs in docs/logs/ measured; to repeat
them, check that commit out. The harness itself follows the current launch layer.
"""

import cupy
import ml_dtypes
import numpy as np

from fp8_group_quant import _jit, _launch, api, bench
from fp8_group_quant._arrays import describe
from fp8_group_quant._request import make_request

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


def roofline_calls(roofline, inputs, outputs) -> list:
    """Launches of the roofline kernel over the inputs, one per buffer (at least CALLS)."""
    chunks = inputs[0].size * 2 // 32
    grid = (-(-chunks // 256), 1, 1)

    def call(i):
        x, (q, _) = inputs[i % len(inputs)], outputs[i % len(outputs)]
        return lambda: roofline(grid, (256, 1, 1), (x, q, np.int64(chunks)))

    return [call(i) for i in range(max(len(inputs), CALLS))]


def time_roofline(roofline, inputs, outputs) -> float:
    """Graph-replay us per call of the roofline kernel over the inputs."""
    return bench.graph_time_us(cupy, roofline_calls(roofline, inputs, outputs), 9)


def default_launch(m: int, k: int) -> tuple[_launch.Launch, object]:
    """The library's launch of the default kernel at (m, k), and its Params."""
    x = cupy.empty((m, k), dtype=ml_dtypes.bfloat16)
    request = make_request(describe(x, "x"), 128, "e4m3", "ue8m0", "packed", 1e-10, False)
    launch = _launch.prepare(request, cupy.cuda.runtime.getDevice())
    return launch, launch.params


def variant_launch(function, grid, block, params) -> _launch.Launch:
    """A launch of a variant kernel taking the same Params (a copy: launches fill in pointers)."""
    copy = type(params).from_buffer_copy(params)
    with _jit.current_device(cupy.cuda.runtime.getDevice()):
        return _launch.Launch(function.kernel.ptr, grid, block, copy)


def run_launch(launch, x, outputs) -> None:
    q, scales = outputs
    launch.launch(x.data.ptr, q.data.ptr, scales.data.ptr, cupy.cuda.get_current_stream().ptr)


def launch_calls(launch, inputs, outputs) -> list:
    """Calls of a prepared launch over the inputs, one per buffer (at least CALLS)."""

    def call(i):
        x, out = inputs[i % len(inputs)], outputs[i % len(outputs)]
        return lambda: run_launch(launch, x, out)

    return [call(i) for i in range(max(len(inputs), CALLS))]


def time_launch(launch, inputs, outputs) -> float:
    """Graph-replay us per call of a prepared launch over the inputs."""
    return bench.graph_time_us(cupy, launch_calls(launch, inputs, outputs), 9)


def print_times(m: int, k: int, times: dict, header: bool) -> None:
    """One row of us per call (``times``: column -> us), after a header line when ``header``."""
    if header:
        print(f"{'M':>6} {'K':>5} " + " ".join(f"{c:>10}" for c in times), flush=True)
    print(f"{m:>6} {k:>5} " + " ".join(f"{t:>10.2f}" for t in times.values()), flush=True)
