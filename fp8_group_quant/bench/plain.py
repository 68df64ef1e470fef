"""``python -m fp8_group_quant bench``: where the quantizer stands against the memory floor.

In one process: the device copy bandwidth; the roofline kernel (kernels/roofline.cu: the
quantizer's loads and stores, no work); and the quantizer, as GPU time per call from CUDA-graph
replay over rotating buffers (median of replays) and as host-inclusive time per eager call
(cupy and torch inputs). Every provider is checked before it is timed.

Bytes moved per call (the model every figure uses): ``M*K*in_bytes`` read, ``M*K`` written for q,
plus the scale storage written.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import re
import statistics
import sys
import time
from typing import Any

import numpy as np

from . import _jit, _launch, api
from ._layout import LAYOUTS, SCALE_LAYOUTS, Geometry, combination_error, supported_combinations
from ._spec import (
    GROUP_SIZES,
    INPUT_TYPES,
    OUTPUT_FORMATS,
    SCALE_FORMATS,
    SCALE_RULES,
    check_scale_rule,
)
from .reference import quantize_into

DEFAULT_M = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_K = (2048, 7168)
ROTATE_BYTES = 256 * 2**20  # rotate over at least this much input: several times the 50 MB L2
ROOFLINE_THREADS = 256
# the paths ``--fused`` times, in its order (``--paths`` picks some)
FUSED_PATHS = ("silu_mul", "add_rms_norm", "rms_norm", "masked")
INPUT_BYTES = {name: t.itemsize for name, t in INPUT_TYPES.items()}


def bytes_moved(m: int, k: int, input_dtype: str, geometry: Geometry) -> int:
    scale_bytes = geometry.scale_storage_bytes
    return m * k * INPUT_BYTES[input_dtype] + m * k + scale_bytes


def copy_bandwidth(cupy, nbytes: int = 2**31, repeats: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second (median of repeats)."""
    src = cupy.ones(nbytes // 4, cupy.float32)
    dst = cupy.empty_like(src)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats + 2):
        start.record()
        dst[...] = src
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    del src, dst
    return 2 * nbytes / statistics.median(times[2:])


def graph_time_us(cupy, calls, replays: int = 7) -> float:
    """Median GPU time per call of ``calls`` (a list of launches) captured in one CUDA graph."""
    return interleaved_graph_times_us(cupy, [calls], replays)[0]


def interleaved_graph_times_us(cupy, call_lists, replays: int = 7) -> list[float]:
    """Median GPU time per call of each list of launches, each captured in its own CUDA graph.

    NOTES: the graphs are replayed in turn (a, b, a, b, ...), so a drift of the GPU's clocks
    during the measurement (as after a run of large shapes) moves every list alike and their
    ratio stays fair; session 7 saw the same kernel at M = 16 take 1.50 us and 1.67 us minutes
    apart when timed one list after the other.
    """
    stream = cupy.cuda.Stream(non_blocking=True)
    graphs = []
    with stream:
        for calls in call_lists:
            for call in calls[:2]:  # warm up outside the capture
                call()
            stream.synchronize()
            stream.begin_capture()
            for call in calls:
                call()
            graphs.append(stream.end_capture())
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times: list[list[float]] = [[] for _ in graphs]
    for _ in range(replays + 1):
        for graph, calls, series in zip(graphs, call_lists, times):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            series.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / len(calls))
    return [statistics.median(series[1:]) for series in times]


def eager_time_us(sync, call, iterations: int = 200, repeats: int = 11) -> float:
    """Host-inclusive time per call, issuing back to back and synchronising once per repeat.

    NOTES: the garbage collector is paused while timing, as ``timeit`` does: a collection of the
    whole interpreter's objects landing in one 200-call loop would be charged to these calls.
    """
    for _ in range(10):
        call()
    sync()
    times = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(iterations):
                call()
            sync()
            times.append((time.perf_counter() - start) / iterations * 1e6)
    finally:
        if collecting:
            gc.enable()
    return statistics.median(times)


def _check(x_host, q_dev, s_dev, geometry, fmt_name, scale, cupy, rule="rceil") -> None:
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


def bench_shape(cupy, torch, roofline, bandwidth: float, m: int, k: int, args) -> dict:
    """One table row: check, then time the roofline kernel and the quantizer at (M, K)."""
    from .__main__ import activation

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
    _check(x_host, q_first, s_first, geometry, args.dtype, args.scale, cupy, args.scale_rule)
    calls = max(n_buffers, 32)

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
    x0 = inputs[0]
    eager_cupy = eager_time_us(
        cupy.cuda.runtime.deviceSynchronize, lambda: api.quantize(x0, args.group_size, **options)
    )
    prepared = api.prepare(x0, args.group_size, **options)
    eager_prepared_cupy = eager_time_us(cupy.cuda.runtime.deviceSynchronize, lambda: prepared(x0))
    eager_torch = eager_prepared_torch = op_torch = None
    if torch is not None:
        from . import torch_ops

        xt = torch.from_dlpack(x0)
        eager_torch = eager_time_us(
            torch.cuda.synchronize, lambda: api.quantize(xt, args.group_size, **options)
        )
        prepared_t = api.prepare(xt, args.group_size, **options)
        eager_prepared_torch = eager_time_us(torch.cuda.synchronize, lambda: prepared_t(xt))
        op_torch = eager_time_us(  # through the dispatcher: the custom op (torch_ops.py)
            torch.cuda.synchronize, lambda: torch_ops.quantize(xt, args.group_size, **options)
        )
    floor_us = moved / bandwidth * 1e6
    return {
        "M": m, "K": k, "bytes": moved, "floor_us": floor_us, "roofline_us": roof_us,
        "ours_us": ours, "ours_over_roofline": ours / roof_us, "fraction_of_floor": floor_us / ours,
        "GBps": moved / ours / 1e3, "eager_cupy_us": eager_cupy, "eager_torch_us": eager_torch,
        "prepared_cupy_us": eager_prepared_cupy, "prepared_torch_us": eager_prepared_torch,
        "op_torch_us": op_torch,
    }  # fmt: skip


def run_matrix(args) -> list[dict]:
    """GPU time per byte of every supported combination at one shape, against bf16 G=128 packed.

    Each variant is checked bit for bit against the NumPy backend on 64 rows, then timed by
    graph replay at (M, K) over rotating buffers.
    """
    import itertools

    import cupy
    import ml_dtypes

    from .__main__ import activation

    # every instantiation in one NVRTC call (or one disk-cache read), not one compile per variant
    expressions = [key.name_expression for key in _launch.all_kernel_keys()]
    _jit.preload(_launch.SOURCE, expressions, cupy.cuda.runtime.getDevice())
    m, k = args.m[0], args.k[0]
    host_dtypes = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
    combos = [
        (i, g, *combination)
        for i, g in itertools.product(host_dtypes, GROUP_SIZES)
        for combination in supported_combinations()
    ]
    baseline = ("bfloat16", 128, "e4m3", "ue8m0", "packed")
    if args.only:
        combos = [c for c in combos if re.search(args.only, " ".join(map(str, c)))]
    if baseline in combos:
        combos.remove(baseline)
    combos.insert(0, baseline)
    inputs_by_dtype = {}

    def time_variant(input_dtype, group, fmt, scale, layout) -> tuple[float, int]:
        """Check on 64 rows, then (GPU us per call, bytes moved) at (M, K)."""
        options = dict(dtype=fmt, scale=scale, layout=layout)
        small = activation(64, k, seed=1).astype(host_dtypes[input_dtype])
        q, s = api.quantize(cupy.asarray(small), group, **options)
        _check(small, q, s, Geometry(small.shape, group, layout, False), fmt, scale, cupy)
        if input_dtype not in inputs_by_dtype:
            x_host = activation(m, k, seed=m + k).astype(host_dtypes[input_dtype])
            n = max(2, min(16, math.ceil(ROTATE_BYTES / x_host.nbytes)))
            inputs_by_dtype[input_dtype] = [cupy.asarray(x_host) for _ in range(n)]
        inputs = inputs_by_dtype[input_dtype]
        outputs = [api.quantize(x, group, **options) for x in inputs]

        def call(i):
            x, (q, s) = inputs[i % len(inputs)], outputs[i % len(inputs)]
            return lambda: api.quantize(x, group, **options, out=q, scale_out=s)

        us = graph_time_us(cupy, [call(i) for i in range(max(len(inputs), 32))], replays=9)
        return us, bytes_moved(m, k, input_dtype, Geometry((m, k), group, layout, False))

    print(f"# GPU time per call at M={m}, K={k}; 'per byte' = (t / bytes) / baseline (t / bytes)")
    print(f"# timing {len(combos)} variants (the baseline first and again last)", flush=True)
    timed = [(combo, *time_variant(*combo)) for combo in combos]
    again, _ = time_variant(*baseline)
    # NOTES: the baseline's time per byte is the mean of its first and last timing, so a drift of
    # the GPU over the minutes of the sweep does not tilt every ratio one way
    base_us = (timed[0][1] + again) / 2
    base_per_byte = base_us / timed[0][2]
    print(f"# baseline {' '.join(map(str, baseline))}: {timed[0][1]:.2f} us first, "
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
    roofline = _jit.get_function("roofline.cu", "fgq::roofline_copy", device)
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
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The benchmark's options, on ``parser`` (its own, or the CLI's ``bench`` subcommand)."""
    parser.add_argument("--m", type=_positive, nargs="+", default=list(DEFAULT_M), help="tokens")
    parser.add_argument(
        "--k", type=_positive, nargs="+", default=list(DEFAULT_K), help="hidden size"
    )
    parser.add_argument("--input-dtype", default="bfloat16", choices=list(INPUT_BYTES))
    parser.add_argument("--dtype", default="e4m3", choices=list(OUTPUT_FORMATS))
    parser.add_argument("--scale", default="ue8m0", choices=list(SCALE_FORMATS))
    parser.add_argument("--layout", default="packed", choices=list(LAYOUTS))
    parser.add_argument("--group-size", type=int, default=128, choices=list(GROUP_SIZES))
    parser.add_argument("--scale-rule", default="rceil", choices=list(SCALE_RULES))
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument(
        "--plot", help="draw GB/s and fraction of floor against M (needs the plot extra)"
    )
    parser.add_argument(
        "--only", help="--matrix: time only variants whose 'input G dtype scale layout' matches"
    )
    parser.add_argument(
        "--cold-start", action="store_true", help="also time import + first call in new processes"
    )
    parser.add_argument(
        "--matrix", action="store_true", help="time every supported variant at --m[0] x --k[0]"
    )
    parser.add_argument(
        "--profile-host", action="store_true", help="time each host step of one small call"
    )
    parser.add_argument(
        "--fused",
        action="store_true",
        help="the fused SiLU-and-multiply, (add-)RMSNorm and masked paths against a same-traffic "
        "roof and the unfused steps (needs torch; --k sets N, --m the tokens)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=FUSED_PATHS,
        help="with --fused: time only these paths (default: all, in the order listed)",
    )
    parser.add_argument(
        "--nvfp4",
        action="store_true",
        help="NVFP4 (e2m1, e4m3 blocked scales, G=16), given and computed global scale, against "
        "a same-traffic roof",
    )
    parser.add_argument(
        "--chain",
        action="store_true",
        help="a graph of [producer -> quantize -> consumer] steps, with and without PDL",
    )
    return parser


def _optional_torch() -> Any:
    """torch if installed, else None: the benchmark times torch inputs too where it can."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def gpu_missing() -> str | None:
    """Why the benchmark cannot run here (no CuPy, no CUDA device), or None."""
    try:
        cupy = _jit.cupy_module()
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # no CuPy, no driver: say which
        return f"the benchmark needs a CUDA GPU and CuPy: {error}"
    return None if count else "the benchmark needs a CUDA GPU; none is visible"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp8_group_quant bench", description=__doc__)
    return run_parsed(add_arguments(parser).parse_args(argv), parser)


def run_parsed(args, parser: argparse.ArgumentParser) -> int:
    """Run the benchmark for parsed ``args``; usage errors go through ``parser``."""
    if args.paths and not args.fused:
        parser.error("--paths: only with --fused")
    group = 16 if args.nvfp4 else args.group_size  # NVFP4's groups are 16 values
    if any(k % group for k in args.k):
        parser.error(f"--k: every K must be a multiple of the group size {group}")
    error = combination_error(
        OUTPUT_FORMATS[args.dtype], SCALE_FORMATS[args.scale], SCALE_LAYOUTS[args.layout]
    )
    if error:
        parser.error(error)
    try:
        check_scale_rule(args.scale_rule, OUTPUT_FORMATS[args.dtype], SCALE_FORMATS[args.scale])
    except ValueError as rule_error:
        parser.error(str(rule_error))
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'fp8_group_quant[plot]'")
    missing = gpu_missing()
    if missing:
        print(f"python -m fp8_group_quant bench: {missing}", file=sys.stderr)
        return 1
    import ml_dtypes

    args.input_dtype_np = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16,
                           "float32": np.float32}[args.input_dtype]  # fmt: skip
    if args.profile_host:
        return profile_host(args)
    # NOTES: every timing table launches the quantizer without PDL, as the roofline kernels and
    # torch's kernels are launched: in a graph of back-to-back calls PDL lets each call overlap
    # the previous one, which they cannot, and a ratio would no longer compare like with like
    # (run 13 of session 7 had 0.92x the roof at M = 1). Until session 10 --fused and --matrix
    # kept PDL on (docs/perf.md, fused step 10). --chain measures PDL, between a producer, the
    # quantizer and a consumer.
    with pdl_launches(args.chain and _launch.PDL):
        if args.fused:
            from .bench_fused import run_fused

            rows = run_fused(args)
        elif args.chain:
            rows = run_chain(args)
        elif args.nvfp4:
            from .bench_nvfp4 import run_nvfp4

            rows = run_nvfp4(args)
        else:
            rows = run_matrix(args) if args.matrix else run(args)
    extra = cold_start() if args.cold_start else {}
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "input_dtype_np"}
        with open(args.json, "w") as handle:
            json.dump({"config": config, "rows": rows, **extra}, handle, indent=1)
    if args.plot:
        plot(rows, args.plot)
    return 0


@contextlib.contextmanager
def pdl_launches(on: bool):
    """Inside the block the library prepares its launches with PDL ``on`` (or off), with a
    plan cache of its own, so that no plan prepared the other way is reused; the setting and
    the cache are restored after."""
    saved = _launch.PDL, api._PLANS
    _launch.PDL, api._PLANS = on, api.PlanCache(api.MAX_PLANS)
    try:
        yield
    finally:
        _launch.PDL, api._PLANS = saved


CHAIN_M = (1, 4, 16, 64, 128, 256, 512)
CHAIN_STEPS = 32  # [producer, quantize, consumer] steps per graph
CHAIN_THREADS = 256


def run_chain(args) -> list[dict]:
    """GPU time per step of a CUDA graph of [producer writes x -> quantize -> consumer reads q
    and the scales] steps, with Programmatic Dependent Launch on every kernel and without.

    The producer and consumer (kernels/chain.cu) take part in PDL as the quantizer does, so the
    difference is what PDL saves at the two edges of each quantize call. Default M = 1..512
    (``--m`` overrides), K = ``--k[0]``, the default kernel's format and layout.
    """
    import ctypes

    import cupy
    import ml_dtypes

    device = cupy.cuda.runtime.getDevice()
    if not _launch.pdl_supported(device):
        raise SystemExit("--chain: PDL needs an SM90+ device and FP8_GROUP_QUANT_PDL not 0")
    produce = _jit.get_function("chain.cu", "fgq::produce_bf16", device)
    consume = _jit.get_function("chain.cu", "fgq::consume", device)
    with _jit.current_device(device):
        produce, consume = produce.kernel.ptr, consume.kernel.ptr
    k = args.k[0]
    m_values = args.m if args.m != list(DEFAULT_M) else list(CHAIN_M)
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    print(f"# chain of {CHAIN_STEPS} [producer -> quantize -> consumer] steps per CUDA graph, "
          f"K={k}; GPU us per step (median of replays)")  # fmt: skip
    print(f"{'M':>6} {'no PDL':>8} {'PDL':>8} {'saved':>8}")
    rows = []
    for m in m_values:
        x = cupy.empty((CHAIN_STEPS, m, k), dtype=np.uint16).view(ml_dtypes.bfloat16)
        scale_words = Geometry((m, k), 128, SCALE_LAYOUTS["packed"], False).scale_storage
        sink = cupy.zeros(sms * 4, dtype=np.uint32)
        times = {}
        for pdl in (False, True):
            with pdl_launches(pdl):
                outputs = [api.quantize_packed(x[i]) for i in range(CHAIN_STEPS)]
                steps = []
                for i, (q, s) in enumerate(outputs):
                    n = m * k
                    producer = _launch.KernelLaunch(
                        produce, (min(sms * 4, -(-n // CHAIN_THREADS)), 1, 1),
                        (CHAIN_THREADS, 1, 1),
                        [ctypes.c_uint64(x[i].data.ptr), ctypes.c_int64(n), ctypes.c_uint32(i)],
                        pdl,
                    )  # fmt: skip
                    q_words, s_words = q.nbytes // 4, scale_words
                    consumer = _launch.KernelLaunch(
                        consume, (sms * 4, 1, 1), (CHAIN_THREADS, 1, 1),
                        [ctypes.c_uint64(q.data.ptr), ctypes.c_int64(q_words),
                         ctypes.c_uint64(s.data.ptr), ctypes.c_int64(max(0, s_words)),
                         ctypes.c_uint64(sink.data.ptr)],
                        pdl,
                    )  # fmt: skip
                    steps.append((producer, x[i], q, s, consumer))

                def step(producer, xi, q, s, consumer):
                    def call():
                        stream = cupy.cuda.get_current_stream().ptr
                        producer(stream)
                        api.quantize_packed(xi, out=q, scale_out=s)
                        consumer(stream)

                    return call

                calls = [step(*parts) for parts in steps]
                times[pdl] = graph_time_us(cupy, calls, replays=15)
                # the chain computes what the quantizer alone computes on the produced x
                q_ref, s_ref = api.quantize_packed(x[-1].copy())
                if not (cupy.array_equal(outputs[-1][0], q_ref)
                        and cupy.array_equal(outputs[-1][1], s_ref)):  # fmt: skip
                    raise AssertionError(f"--chain: the chained quantizer's output differs, M={m}")
        row = {"M": m, "K": k, "no_pdl_us": times[False], "pdl_us": times[True]}
        rows.append(row)
        print(f"{m:>6} {times[False]:>8.2f} {times[True]:>8.2f} "
              f"{times[False] - times[True]:>8.2f}", flush=True)  # fmt: skip
    return rows


def profile_host(args) -> int:
    """Where the host time of an eager call at M = 1 goes: each step of the call timed alone."""
    import cupy

    torch = _optional_torch()
    from .__main__ import activation

    host = activation(1, args.k[0], seed=1).astype(args.input_dtype_np)
    inputs = [("cupy", cupy.asarray(host), cupy.cuda.runtime.deviceSynchronize)]
    if torch is not None:
        tensor = torch.from_dlpack(inputs[0][1])
        inputs.append(("torch", tensor, torch.cuda.synchronize))
    options = dict(dtype=args.dtype, scale=args.scale, layout=args.layout)
    print(f"# host time per step of one call, M=1 K={args.k[0]}, us (median of repeats)")
    for name, x, sync in inputs:
        print(f"# {name}")
        for step, (call, step_sync) in _host_steps(x, sync, args, options).items():
            us = eager_time_us(step_sync or (lambda: None), call, iterations=2000, repeats=5)
            print(f"{step:<40} {us:7.2f}")
    return 0


def _host_steps(x, sync, args, options) -> dict:
    """The steps of an eager call on ``x``, each as (callable, sync or None)."""

    from ._arrays import device_signature

    prepared = api.prepare(x, args.group_size, **options)
    plan, launch = prepared._plan, prepared._plan.launch
    ptr, stream = device_signature(x)[-1], plan.stream(plan.device)
    launch._config.stream = stream
    return {
        "plain call": (lambda: api.quantize(x, args.group_size, **options), sync),
        "prepared call": (lambda: prepared(x), sync),
        "  read the input (device_signature)": (lambda: device_signature(x), None),
        "  device current and bound (ready)": (plan.ready, None),
        "  read the stream": (lambda: plan.stream(plan.device), None),
        "  allocate q and scales (plain only)": (plan.alloc_both, None),
        "  launch (Launch.launch)": (
            lambda: launch.launch(ptr, prepared._q_ptr, prepared._scale_ptr, stream),
            sync,
        ),
        "    of which cuLaunchKernelEx (ctypes)": (
            lambda: launch._launch_ex(
                launch._config_address, launch.handle, launch._pointers_address, None
            ),
            sync,
        ),
        # NOTES: the floor under any launch from Python: the same ctypes call launching a
        # kernel that does nothing (the roofline kernel with no chunks, one warp), and a ctypes
        # call into the driver that launches nothing
        "  floor: empty kernel, cuLaunchKernelEx": (_empty_launch(plan.device or 0, stream), sync),
        "  floor: ctypes driver call, no launch": (_ctypes_driver_call(), None),
    }


def _empty_launch(device: int, stream: int):
    """A launch of a kernel that returns at once, through the library's ctypes launch path."""
    import ctypes

    function = _jit.get_function("roofline.cu", "fgq::roofline_copy", device)
    args = [ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_int64(0)]
    with _jit.current_device(device):
        launch = _launch.KernelLaunch(function.kernel.ptr, (1, 1, 1), (32, 1, 1), args)
    return lambda: launch(stream)


def _ctypes_driver_call():
    """cuCtxGetCurrent through ctypes: the cost of crossing into the driver and back."""
    import ctypes

    context = ctypes.c_void_p()
    address = ctypes.addressof(context)
    get_current = _jit.driver_entry_point("cuCtxGetCurrent", 1)
    return lambda: get_current(address)


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
