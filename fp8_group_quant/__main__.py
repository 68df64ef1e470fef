"""``python -m fp8_group_quant``: quantize a realistic activation, check it, report.

Subcommands: ``run`` (the default), ``bench`` (the benchmark, on a GPU) and ``info`` (versions,
devices, the kernel cache); ``python -m fp8_group_quant <command> --help`` lists each one's
options.
"""

from __future__ import annotations

import argparse
import sys
import time

import ml_dtypes
import numpy as np

from . import __version__, _jit, _settings, api, spec_model
from ._layout import SCALE_LAYOUTS, Geometry
from ._sample import activation


def _gpu():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:
        pass
    return None


SAMPLED_GROUPS = 64  # groups the spec's scalar model recomputes in the main job


def spec_check(x: np.ndarray, q_bytes: np.ndarray, s_words: np.ndarray, rng) -> tuple[bool, int]:
    """Recompute a sample of groups (the first, the last and random ones) with the spec's scalar
    model (``spec_model``, which shares no code with the NumPy backend) and compare their codes
    and packed exponents. Returns (all equal, groups checked)."""
    tokens, hidden = x.shape
    groups = hidden // 128
    total = tokens * groups
    if total == 0:
        return True, 0
    picks = {0, total - 1, *rng.integers(0, total, SAMPLED_GROUPS).tolist()}
    x32 = x.astype(np.float32)
    for index in sorted(picks):
        row, group = divmod(index, groups)
        values = [float(v) for v in x32[row, group * 128 : (group + 1) * 128]]
        codes, scale = spec_model.scalar_group(values, "e4m3", True, 1e-10)
        got = q_bytes.reshape(tokens, hidden)[row, group * 128 : (group + 1) * 128]
        exponent = (int(s_words[row, group // 4]) >> (8 * (group % 4))) & 0xFF
        if list(got) != codes or exponent != spec_model.ue8m0_exponent(scale):
            return False, len(picks)
    return True, len(picks)


def main_job(tokens: int, hidden: int) -> int:
    x = activation(tokens, hidden)
    geometry = Geometry(x.shape, 128, SCALE_LAYOUTS["packed"], False)
    print(f"input      x: {x.shape} bfloat16, {x.nbytes / 1e6:.1f} MB, outliers in "
          f"{_count(max(1, hidden // 512), 'channel')}")  # fmt: skip
    cupy = _gpu()
    start = time.perf_counter()
    q_host, s_host = api.quantize_packed(x)  # the NumPy backend
    host_seconds = time.perf_counter() - start
    q_bytes, s_words = np.asarray(q_host).view(np.uint8), np.asarray(s_host)
    checks, exact, timings = [], True, dict[str, float]()
    if cupy is None:
        backend = "NumPy backend (no CUDA device visible)"
    else:
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        backend = f"CUDA kernel on {props['name'].decode()}"
        q_device, s_device, timings = _on_gpu(cupy, x)
        same = np.array_equal(q_device, q_bytes) and np.array_equal(s_device, s_words)
        exact &= same
        checks.append(f"{'bit-exact' if same else 'MISMATCH'} against the NumPy backend "
                      f"(all {x.size} codes and {geometry.scale_storage} scale words)")  # fmt: skip
        q_bytes, s_words = q_device, s_device
    same, sampled = spec_check(x, q_bytes, s_words, np.random.default_rng(tokens + hidden))
    exact &= same
    verdict = "equal" if same else "MISMATCH"
    checks.append(f"{verdict}: {_count(sampled, 'group')} recomputed with the spec's scalar model "
                  "(fp8_group_quant.spec_model)")  # fmt: skip
    print(f"backend    {backend}")
    print(f"output     q: {q_bytes.shape} float8_e4m3fn; scales: int32 {geometry.scale_shape}, "
          f"strides {geometry.scale_strides}")  # fmt: skip
    print("           (UE8M0 exponents packed 4 per int32, MN-major, TMA-aligned: DeepGEMM SM100)")
    for number, check in enumerate(checks):
        print(f"{'check' if number == 0 else '':10} {check}")
    x32 = x.astype(np.float32)
    norm = np.linalg.norm(x32)
    if norm:
        x_back = api.dequantize(q_bytes.view(ml_dtypes.float8_e4m3fn), s_words, 128)
        print(f"error      ||dequant(q) - x|| / ||x|| = {np.linalg.norm(x_back - x32) / norm:.3e}")
    moved = x.nbytes + q_bytes.nbytes + geometry.scale_storage_bytes
    _print_times(host_seconds, timings, moved)
    return 0 if exact else 1


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _on_gpu(cupy, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    """(codes, scale words, timings) of the kernel on ``x``. The kernel's own time comes from
    replaying a CUDA graph of calls (the host cannot starve it); the eager call's time, host
    included, from back-to-back calls: they are different things and are reported apart."""
    xd = cupy.asarray(x)
    q, s = api.quantize_packed(xd)  # compiles, or loads from the cache
    result = (q.get(), cupy.asnumpy(s))
    stream, calls = cupy.cuda.Stream(non_blocking=True), 20
    with stream:
        stream.begin_capture()
        for _ in range(calls):
            api.quantize_packed(xd, out=q, scale_out=s)
        graph = stream.end_capture()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        kernel = []
        for _ in range(7):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            kernel.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / calls)
        eager = []
        for _ in range(7):
            began = time.perf_counter()
            for _ in range(calls):
                api.quantize_packed(xd, out=q, scale_out=s)
            stream.synchronize()
            eager.append((time.perf_counter() - began) / calls)
    return (*result, {"kernel": float(np.median(kernel)), "eager": float(np.median(eager))})


def _print_times(host_seconds: float, timings: dict, moved: int) -> None:
    if not timings:
        print(f"time       {host_seconds * 1e3:.0f} ms (NumPy)")
        return
    kernel, eager = timings["kernel"], timings["eager"]
    print(f"time       kernel {kernel * 1e6:.1f} us a call ({moved / kernel / 1e9:.0f} GB/s), "
          f"from CUDA-graph replay")  # fmt: skip
    print(f"           eager call {eager * 1e6:.1f} us, host included (back-to-back calls); "
          f"NumPy backend {host_seconds * 1e3:.0f} ms")  # fmt: skip


def info() -> int:
    """Versions and devices: what a bug report needs."""
    import platform

    print(f"fp8_group_quant {__version__} (python {platform.python_version()}, "
          f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__})")  # fmt: skip
    print(f"kernels    {_describe(_jit.kernel_dir)}")
    print(f"cache      {_jit.cache_dir()} ({_jit.CACHE_DIR_ENV} overrides)")
    try:
        cupy = _jit.cupy_module()
        print(f"cupy       {cupy.__version__}")
    except Exception as error:
        print(f"cupy       not usable: {error}")
        cupy = None
    print(f"nvrtc      {_describe(lambda: '.'.join(map(str, _jit.nvrtc_version())))}")
    print(f"bindings   {_bindings()}")
    count = _describe(_jit.device_count)
    print(f"devices    {count}")
    if cupy is not None and isinstance(count, int) and count > 0:
        print(f"driver     {_describe(cupy.cuda.runtime.driverGetVersion)}")
        for device in range(count):
            capability = _jit.compute_capability(device)
            name = cupy.cuda.runtime.getDeviceProperties(device)["name"].decode()
            target = _describe(lambda: _jit.target_for(capability))  # noqa: B023
            print(f"  {device}: {name}, compute capability {capability}, kernels for {target}")
    return 0


def _bindings() -> str:
    """NVIDIA's driver bindings: their version and whether launches go through them."""
    import importlib.metadata

    try:
        version = f"cuda-bindings {importlib.metadata.version('cuda-bindings')}"
    except importlib.metadata.PackageNotFoundError:
        return "cuda-bindings not installed: CuPy launches the kernels, without PDL"
    if _jit.driver() is None:
        return f"{version} (no usable CUDA driver)"
    return f"{version}: cuLaunchKernelEx, with PDL on SM90 and newer unless {_settings.PDL}=0"


def _describe(read):
    """``read()``, or why it failed."""
    try:
        return read()
    except Exception as error:
        return f"unavailable ({type(error).__name__}: {error})"


def _run_arguments(parser: argparse.ArgumentParser, defaults: bool = True):
    """The main job's options; without ``defaults`` (the run subcommand) an option not given
    there keeps the value given before the word run."""
    tokens, hidden = (4096, 7168) if defaults else (argparse.SUPPRESS, argparse.SUPPRESS)
    parser.add_argument("--tokens", type=int, default=tokens, help="rows M (default 4096)")
    parser.add_argument("--hidden", type=int, default=hidden,
                        help="channels K, a multiple of 128 (default 7168)")  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m fp8_group_quant", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fp8_group_quant {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{run,bench,info}")
    _run_arguments(commands.add_parser("run", help="the main job (the default)"), False)
    # NOTES: the benchmark parses its own options (fp8_group_quant.bench.cli), imported only when
    # the bench command runs, so the main job and `info` never load the benchmark
    commands.add_parser("bench", help="the benchmark (needs a GPU)", add_help=False)
    commands.add_parser("info", help="versions, devices and the kernel cache")
    _run_arguments(parser)  # the main job's options also work without the word run
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        from .bench import cli as bench_cli

        return bench_cli.main(argv[argv.index("bench") + 1 :], namespace=args)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "info":
        return info()
    if args.tokens < 0:
        parser.error(f"--tokens: expected a count of rows >= 0, got {args.tokens}")
    if args.hidden < 1 or args.hidden % 128:
        parser.error(f"--hidden: expected a positive multiple of 128 (the group size), "
                     f"got {args.hidden}")  # fmt: skip
    return main_job(args.tokens, args.hidden)


if __name__ == "__main__":
    sys.exit(main())
