"""The plain quantizer's tables: ``bench`` (the default), ``--matrix`` and ``--cold-start``.

``bench``: the device copy bandwidth; the roofline kernel (kernels/roofline.cu: the quantizer's
loads and stores, no work); and the quantizer, as GPU time per call from CUDA-graph replay over
rotating buffers (median of replays) and as host-inclusive time per eager call (cupy and torch
inputs). Every provider is checked bit for bit against the NumPy backend before it is timed.
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

import numpy as np

from .. import api
from .._layout import Geometry, supported_combinations
from .._sample import activation
from .._spec import GROUP_SIZES
from ..reference import quantize_into
from . import _hooks
from .shapes import INPUT_BYTES, bytes_moved
from .timing import (
    CALLS,
    ROOFLINE_THREADS,
    ROTATE_BYTES,
    copy_bandwidth,
    eager_time_us,
    graph_time_us,
    interleaved_graph_times_us,
)


def _optional_torch() -> Any:
    """torch if installed, else None: the benchmark times torch inputs too where it can."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def check(x_host, q_dev, s_dev, geometry, fmt_name, scale, cupy, rule="rceil") -> None:
    """Bit-exact check of a device result against the NumPy backend, before any timing."""
    q_ref = np.empty(geometry.q_storage, np.uint8)
    s_ref = np.empty(geometry.scale_storage, geometry.layout.dtype)
    quantize_into(x_host, geometry, fmt_name, scale, 1e-10, q_ref, s_ref, rule=rule)
    s_logical = np.lib.stride_tricks.as_strided(
        s_ref, geometry.scale_shape, tuple(s_ref.itemsize * s for s in geometry.scale_strides)
    )
    if not (
        np.array_equal(cupy.asnumpy(q_dev).view(np.uint8).reshape(-1), q_ref)
        and np.array_equal(cupy.asnumpy(s_dev), s_logical)
    ):
        raise AssertionError(f"quantizer output differs from the reference at {geometry.shape}")


# the table ---------------------------------------------------------------------------------------


def run(args) -> list[dict]:
    """The table: roofline kernel and quantizer per (M, K)."""
    import cupy

    torch = _optional_torch()
    device = cupy.cuda.runtime.getDevice()
    name = cupy.cuda.runtime.getDeviceProperties(device)["name"].decode()
    bandwidth = copy_bandwidth(cupy)
    print(f"# {name}: device copy {bandwidth / 1e12:.2f} TB/s (read + write)")
    print(
        f"# {args.input_dtype} -> {args.dtype}, {args.scale} scales, layout {args.layout}, "
        f"G={args.group_size}; GPU times from CUDA-graph replay, eager = host-inclusive per call"
    )
    roofline = _hooks.get_function("roofline.cu", "fgq::roofline_copy", device)
    print(
        f"{'M':>6} {'K':>5} {'floor us':>9} {'roofline':>9} {'ours':>8} {'ours/roof':>9} "
        f"{'%floor':>7} {'GB/s':>7} {'eager cupy':>10} {'eager torch':>11} {'prep cupy':>9} "
        f"{'prep torch':>10} {'torch op':>8}"
    )
    rows = []
    for k in args.k:
        for m in args.m:
            r = bench_shape(cupy, torch, roofline, bandwidth, m, k, args)
            rows.append(r)
            _print_row(m, k, r)
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _print_row(m: int, k: int, r: dict) -> None:
    nan = float("nan")
    torch_us, prep_torch, op_torch = (
        nan if r[key] is None else r[key]
        for key in ("eager_torch_us", "prepared_torch_us", "op_torch_us")
    )
    print(
        f"{m:>6} {k:>5} {r['floor_us']:>9.2f} {r['roofline_us']:>9.2f} "
        f"{r['ours_us']:>8.2f} {r['ours_over_roofline']:>9.3f} "
        f"{100 * r['fraction_of_floor']:>6.1f}% {r['GBps']:>7.0f} "
        f"{r['eager_cupy_us']:>10.1f} {torch_us:>11.1f} {r['prepared_cupy_us']:>9.1f} "
        f"{prep_torch:>10.1f} {op_torch:>8.1f}",
        flush=True,
    )


def bench_shape(cupy, torch, roofline, bandwidth: float, m: int, k: int, args) -> dict:
    """One table row: check, then time the roofline kernel and the quantizer at (M, K)."""
    options = dict(dtype=args.dtype, scale=args.scale, layout=args.layout)
    options["scale_rule"] = args.scale_rule
    geometry = Geometry((m, k), args.group_size, args.layout, False)
    moved = bytes_moved(m, k, args.input_dtype, geometry)
    x_host = activation(m, k, seed=m + k).astype(args.input_dtype_np)
    n_buffers = max(2, min(64, math.ceil(ROTATE_BYTES / (m * k * INPUT_BYTES[args.input_dtype]))))
    inputs = [cupy.asarray(x_host) for _ in range(n_buffers)]
    outputs = [api.quantize(x, args.group_size, **options) for x in inputs]
    cupy.cuda.runtime.deviceSynchronize()
    q_first, s_first = outputs[0]
    check(x_host, q_first, s_first, geometry, args.dtype, args.scale, cupy, args.scale_rule)
    calls = max(n_buffers, CALLS)

    def quantizer(i):
        x, (q, s) = inputs[i % n_buffers], outputs[i % n_buffers]
        return lambda: api.quantize(x, args.group_size, **options, out=q, scale_out=s)

    chunks = m * k * INPUT_BYTES[args.input_dtype] // 32
    grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)

    def roof(i):
        x, (q, _) = inputs[i % n_buffers], outputs[i % n_buffers]
        return lambda: roofline(grid, (ROOFLINE_THREADS, 1, 1), (x, q, np.int64(chunks)))

    ours, roof_us = interleaved_graph_times_us(
        cupy, [[quantizer(i) for i in range(calls)], [roof(i) for i in range(calls)]], replays=11
    )
    eager = _eager_times(cupy, torch, inputs[0], args.group_size, options)
    floor_us = moved / bandwidth * 1e6
    return {
        "M": m, "K": k, "bytes": moved, "floor_us": floor_us, "roofline_us": roof_us,
        "ours_us": ours, "ours_over_roofline": ours / roof_us, "fraction_of_floor": floor_us / ours,
        "GBps": moved / ours / 1e3, **eager,
    }  # fmt: skip


def _eager_times(cupy, torch, x0, group_size: int, options: dict) -> dict:
    """Host-inclusive us per call on ``x0``: plain and prepared calls on cupy input, and on
    torch input (plain, prepared and through the custom op) where torch is installed."""
    eager_cupy = eager_time_us(
        cupy.cuda.runtime.deviceSynchronize, lambda: api.quantize(x0, group_size, **options)
    )
    prepared = api.prepare(x0, group_size, **options)
    eager_prepared_cupy = eager_time_us(cupy.cuda.runtime.deviceSynchronize, lambda: prepared(x0))
    eager_torch = eager_prepared_torch = op_torch = None
    if torch is not None:
        from .. import torch_ops

        xt = torch.from_dlpack(x0)
        eager_torch = eager_time_us(
            torch.cuda.synchronize, lambda: api.quantize(xt, group_size, **options)
        )
        prepared_t = api.prepare(xt, group_size, **options)
        eager_prepared_torch = eager_time_us(torch.cuda.synchronize, lambda: prepared_t(xt))
        op_torch = eager_time_us(  # through the dispatcher: the custom op (torch_ops.py)
            torch.cuda.synchronize, lambda: torch_ops.quantize(xt, group_size, **options)
        )
    return {
        "eager_cupy_us": eager_cupy, "eager_torch_us": eager_torch,
        "prepared_cupy_us": eager_prepared_cupy, "prepared_torch_us": eager_prepared_torch,
        "op_torch_us": op_torch,
    }  # fmt: skip


# --matrix ----------------------------------------------------------------------------------------

MATRIX_BASELINE = ("bfloat16", 128, "e4m3", "ue8m0", "packed")


def run_matrix(args) -> list[dict]:
    """GPU time per byte of every supported combination at one shape, against bf16 G=128 packed.

    Each variant is checked bit for bit against the NumPy backend on 64 rows, then timed by
    graph replay at (M, K) over rotating buffers.
    """
    import cupy

    # every instantiation in one NVRTC call (or one disk-cache read), not one compile per variant
    _hooks.preload_every_kernel(cupy.cuda.runtime.getDevice())
    m, k = args.m[0], args.k[0]
    combos = _matrix_combos(args.only)
    variant = _MatrixVariant(cupy, m, k)
    print(f"# GPU time per call at M={m}, K={k}; 'per byte' = (t / bytes) / baseline (t / bytes)")
    print(f"# timing {len(combos)} variants (the baseline first and again last)", flush=True)
    timed = [(combo, *variant.time(*combo)) for combo in combos]
    again, _ = variant.time(*MATRIX_BASELINE)
    return _matrix_rows(timed, again)


def _host_dtypes() -> dict:
    import ml_dtypes

    return {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def _matrix_combos(only: str | None) -> list[tuple]:
    """Every (input, G, format, scale, layout) to time, ``--only``'s matches, baseline first."""
    import itertools

    combos = [
        (i, g, *combination)
        for i, g in itertools.product(_host_dtypes(), GROUP_SIZES)
        for combination in supported_combinations()
    ]
    if only:
        combos = [c for c in combos if re.search(only, " ".join(map(str, c)))]
    if MATRIX_BASELINE in combos:
        combos.remove(MATRIX_BASELINE)
    combos.insert(0, MATRIX_BASELINE)
    return combos


class _MatrixVariant:
    """Times one variant at (M, K), over rotating inputs made once per input type."""

    def __init__(self, cupy, m: int, k: int):
        self.cupy, self.m, self.k = cupy, m, k
        self.host_dtypes = _host_dtypes()
        self.inputs_by_dtype: dict[str, list] = {}

    def time(self, input_dtype, group, fmt, scale, layout) -> tuple[float, int]:
        """Check on 64 rows, then (GPU us per call, bytes moved) at (M, K)."""
        cupy, m, k = self.cupy, self.m, self.k
        options = dict(dtype=fmt, scale=scale, layout=layout)
        small = activation(64, k, seed=1).astype(self.host_dtypes[input_dtype])
        q, s = api.quantize(cupy.asarray(small), group, **options)
        check(small, q, s, Geometry(small.shape, group, layout, False), fmt, scale, cupy)
        if input_dtype not in self.inputs_by_dtype:
            x_host = activation(m, k, seed=m + k).astype(self.host_dtypes[input_dtype])
            n = max(2, min(16, math.ceil(ROTATE_BYTES / x_host.nbytes)))
            self.inputs_by_dtype[input_dtype] = [cupy.asarray(x_host) for _ in range(n)]
        inputs = self.inputs_by_dtype[input_dtype]
        outputs = [api.quantize(x, group, **options) for x in inputs]

        def call(i):
            x, (q, s) = inputs[i % len(inputs)], outputs[i % len(inputs)]
            return lambda: api.quantize(x, group, **options, out=q, scale_out=s)

        us = graph_time_us(cupy, [call(i) for i in range(max(len(inputs), CALLS))], replays=9)
        return us, bytes_moved(m, k, input_dtype, Geometry((m, k), group, layout, False))


def _matrix_rows(timed: list[tuple], again: float) -> list[dict]:
    """Print and return the matrix's rows: each variant's time per byte against the baseline's."""
    # NOTES: the baseline's time per byte is the mean of its first and last timing, so a drift of
    # the GPU over the minutes of the sweep does not tilt every ratio one way
    base_us = (timed[0][1] + again) / 2
    base_per_byte = base_us / timed[0][2]
    print(f"# baseline {' '.join(map(str, MATRIX_BASELINE))}: {timed[0][1]:.2f} us first, "
          f"{again:.2f} us last, {base_us:.2f} us used")  # fmt: skip
    columns = ("input", 9), ("G", 4), ("out", 5), ("scale", 8), ("layout", 11), ("us", 8)
    print(" ".join(f"{name:>{width}}" for name, width in columns), f"{'GB/s':>6} {'per byte':>9}")
    rows = []
    for (input_dtype, group, fmt, scale, layout), us, moved in timed:
        row = {"input": input_dtype, "G": group, "dtype": fmt, "scale": scale, "layout": layout,
               "us": us, "bytes": moved, "GBps": moved / us / 1e3,
               "per_byte_vs_baseline": us / moved / base_per_byte}  # fmt: skip
        rows.append(row)
        print(f"{input_dtype:>9} {group:>4} {fmt:>5} {scale:>8} {layout:>11} {us:>8.2f} "
              f"{row['GBps']:>6.0f} {row['per_byte_vs_baseline']:>9.3f}")  # fmt: skip
    ratios = [r["per_byte_vs_baseline"] for r in rows]
    worst = max(rows, key=lambda r: r["per_byte_vs_baseline"])
    print(f"# {sum(x <= 1.05 for x in ratios)} of {len(rows)} variants within 1.05x the baseline "
          f"per byte; median {statistics.median(ratios):.3f}; slowest "
          f"{worst['per_byte_vs_baseline']:.3f}: {worst}")  # fmt: skip
    return rows


# --cold-start ------------------------------------------------------------------------------------

COLD_START = """
import time
start = time.perf_counter()
import cupy, ml_dtypes, numpy
cupy.empty(1)  # the CUDA context: every CUDA program pays it before its first kernel
ready = time.perf_counter()
import fp8_group_quant
x = cupy.asarray(numpy.ones((64, 7168), ml_dtypes.bfloat16))
fp8_group_quant.quantize_packed(x)
cupy.cuda.runtime.deviceSynchronize()
end = time.perf_counter()
print(end - start, end - ready)
"""


def cold_start() -> dict:
    """Seconds for import + first call in a new process, on an empty and on a warm kernel cache.

    Each is split: numpy, ml_dtypes and cupy imports plus CUDA context creation (paid by any CuPy
    program), and this package's own share (its import, with the compile or cache load of the
    default kernel, and the first call).
    """
    import os
    import subprocess
    import sys
    import tempfile

    result = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FP8_GROUP_QUANT_CACHE_DIR=cache)
        for name in ("fresh_cache", "warm_cache"):
            done = subprocess.run(
                [sys.executable, "-c", COLD_START], env=env, capture_output=True, text=True
            )
            if done.returncode:
                raise RuntimeError(f"cold-start run failed:\n{done.stderr}")
            total, ours = map(float, done.stdout.split()[-2:])
            result[f"{name}_s"], result[f"{name}_ours_s"] = total, ours
    print(
        f"# cold start, import + first call: {result['fresh_cache_s']:.2f} s on an empty kernel "
        f"cache, NVRTC included ({result['fresh_cache_ours_s']:.2f} s of it this package's), "
        f"{result['warm_cache_s']:.2f} s on a warm one ({result['warm_cache_ours_s']:.3f} s this "
        "package's; the rest is importing numpy, ml_dtypes and cupy and creating the CUDA context)"
    )
    return result


# --plot ------------------------------------------------------------------------------------------


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for k in sorted({r["K"] for r in rows}):
        sel = [r for r in rows if r["K"] == k]
        ms = [r["M"] for r in sel]
        left.plot(ms, [r["GBps"] for r in sel], "o-", label=f"ours, K={k}")
        left.plot(
            ms, [r["bytes"] / r["roofline_us"] / 1e3 for r in sel], "--", label=f"roofline, K={k}"
        )
        right.plot(ms, [r["fraction_of_floor"] for r in sel], "o-", label=f"K={k}")
    for axis in (left, right):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("tokens M")
        axis.grid(alpha=0.3)
        axis.legend()
    left.set_ylabel("GB/s (graph replay)")
    right.set_ylabel("fraction of the memory floor")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
