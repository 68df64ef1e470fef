"""``bench --nvfp4``: NVFP4 (bfloat16 -> e2m1 with e4m3 blocked scales) against a same-traffic roof.

Each (M, K) is checked bit for bit against the NumPy backend, then timed by CUDA-graph replay
over rotating buffers (as ``bench``): with a given global scale (one kernel) and with the
computed one (a memset, the amax pass, then the kernel). The roof, ``roofline_narrow``, reads
32 bytes and writes 8 per thread: NVFP4's traffic less its scale bytes (1 per 32 read).
"""

from __future__ import annotations

import math

import numpy as np

import fp8_group_quant as fgq

from .._layout import BLOCKED, SCALE_LAYOUTS, Geometry
from .._sample import activation
from . import _hooks
from .timing import ROOFLINE_THREADS, ROTATE_BYTES, copy_bandwidth, interleaved_graph_times_us

GIVEN_GLOBAL = 1.5


NVFP4: dict = {"group_size": 16, "dtype": "e2m1", "scale": "e4m3", "layout": "blocked"}


def run_nvfp4(args) -> list[dict]:
    import cupy

    device = cupy.cuda.runtime.getDevice()
    name = cupy.cuda.runtime.getDeviceProperties(device)["name"].decode()
    bandwidth = copy_bandwidth(cupy)
    print(f"# {name}: device copy {bandwidth / 1e12:.2f} TB/s (read + write)")
    print(f"# {args.input_dtype} -> NVFP4 (e2m1, e4m3 blocked scales, G=16); GPU times from "
          "CUDA-graph replay")  # fmt: skip
    print(f"{'M':>6} {'K':>5} {'floor us':>9} {'roof us':>8} {'given us':>9} {'given/roof':>10} "
          f"{'computed us':>11} {'comp/roof':>9}")  # fmt: skip
    roof_kernel = _hooks.get_function("roofline.cu", "fgq::roofline_narrow", device)
    rows = []
    for k in args.k:
        for m in args.m:
            row = bench_shape(cupy, roof_kernel, bandwidth, m, k, args)
            rows.append(row)
            print(f"{m:>6} {k:>5} {row['floor_us']:>9.2f} {row['roofline_us']:>8.2f} "
                  f"{row['given_us']:>9.2f} {row['given_over_roofline']:>10.3f} "
                  f"{row['computed_us']:>11.2f} {row['computed_over_roofline']:>9.3f}")  # fmt: skip
    return rows


def bench_shape(cupy, roof_kernel, bandwidth: float, m: int, k: int, args) -> dict:
    x_host = activation(m, k, seed=m + k).astype(args.input_dtype_np)
    geometry = Geometry((m, k), 16, SCALE_LAYOUTS[BLOCKED], False)
    n_buffers = max(2, min(64, math.ceil(ROTATE_BYTES / x_host.nbytes)))
    repeat = max(1, 32 // n_buffers)
    inputs = [cupy.asarray(x_host) for _ in range(n_buffers)]
    for given in (GIVEN_GLOBAL, None):  # bit for bit against the NumPy backend first
        got = fgq.quantize(inputs[0], **NVFP4, global_scale=given)
        want = fgq.quantize(x_host, **NVFP4, global_scale=given)
        for a, b in zip(got, want):
            if b is not None and not np.array_equal(cupy.asnumpy(a), b):
                raise AssertionError(f"NVFP4 differs from the reference at {(m, k)}")
    keep = []

    def call(x, given):
        """The library's launches of one NVFP4 call into fixed buffers, as a graph replays
        them: a computed global scale zeroes its scratch words first."""
        q = cupy.empty((m, k // 2), cupy.uint8)
        s = cupy.empty(geometry.scale_shape, cupy.uint8)
        plan = _hooks.device_plan(x, **NVFP4, global_scale=given)
        scratch, extra = plan.new_scratch() if plan.scratch is not None else (None, ())
        keep.append((q, s, scratch))

        def run():
            stream = cupy.cuda.get_current_stream().ptr
            if scratch is not None:
                scratch.fill(0)
            for launch in plan.launches:
                launch.launch(x.data.ptr, q.data.ptr, s.data.ptr, stream, extra)

        return run

    chunks = m * k * x_host.itemsize // 32
    grid, block = (-(-chunks // ROOFLINE_THREADS), 1, 1), (ROOFLINE_THREADS, 1, 1)
    q_roof = cupy.empty(chunks * 8, cupy.uint8)

    def roof(x):
        return lambda: roof_kernel(grid, block, (x, q_roof, np.int64(chunks)))

    roof_us, given_us, computed_us = interleaved_graph_times_us(
        cupy,
        [[roof(x) for x in inputs] * repeat]
        + [[call(x, given) for x in inputs] * repeat for given in (GIVEN_GLOBAL, None)],
    )
    moved = x_host.nbytes + m * k // 2 + geometry.scale_storage_bytes
    floor_us = moved / bandwidth * 1e6
    return {"M": m, "K": k, "bytes": moved, "floor_us": floor_us, "roofline_us": roof_us,
            "given_us": given_us, "given_over_roofline": given_us / roof_us,
            "computed_us": computed_us,
            "computed_over_roofline": computed_us / roof_us}  # fmt: skip
