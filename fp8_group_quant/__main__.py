"""``python -m fp8_group_quant``: quantize a realistic activation, check it, report.

``python -m fp8_group_quant bench --help`` runs the benchmark instead.
"""

from __future__ import annotations

import argparse
import sys
import time

import ml_dtypes
import numpy as np

from . import api, reference
from ._layout import Geometry


def activation(tokens: int, hidden: int, seed: int = 0) -> np.ndarray:
    """bf16 activations with per-token magnitudes and a few outlier channels, like an LLM's."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32)
    x *= np.exp(rng.standard_normal((tokens, 1), dtype=np.float32))
    outlier_channels = rng.choice(hidden, size=max(1, hidden // 512), replace=False)
    x[:, outlier_channels] *= 40.0
    return x.astype(ml_dtypes.bfloat16)


def _gpu():
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:
        pass
    return None


def main_job(tokens: int, hidden: int) -> int:
    x = activation(tokens, hidden)
    geometry = Geometry(x.shape, 128, "packed", False)
    print(f"input      x: {x.shape} bfloat16, {x.nbytes / 1e6:.1f} MB, outliers in "
          f"{max(1, hidden // 512)} channels")  # fmt: skip

    # the reference, on the host
    q_ref = np.empty(geometry.q_storage, np.uint8)
    s_ref = np.empty(geometry.scale_storage, np.int32)
    start = time.perf_counter()
    reference.quantize_into(x, geometry, "e4m3", "ue8m0", 1e-10, q_ref, s_ref)
    host_seconds = time.perf_counter() - start

    cupy = _gpu()
    if cupy is None:
        backend = "NumPy reference (no CUDA device visible)"
        q, s = api.quantize_packed(x)
        q_bytes, s_words = np.asarray(q).view(np.uint8), np.asarray(s)
        seconds = host_seconds
    else:
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
        backend = f"CUDA kernel on {props['name'].decode()}"
        xd = cupy.asarray(x)
        q, s = api.quantize_packed(xd)  # compiles, or loads from the cache
        start_event, end_event = cupy.cuda.Event(), cupy.cuda.Event()
        times = []
        for _ in range(5):  # back-to-back calls, so the GPU never waits for the host
            start_event.record()
            for _ in range(50):
                api.quantize_packed(xd, out=q, scale_out=s)
            end_event.record()
            end_event.synchronize()
            times.append(cupy.cuda.get_elapsed_time(start_event, end_event) / 1e3 / 50)
        seconds = float(np.median(times))
        q_bytes, s_words = q.get(), cupy.asnumpy(s)

    exact = np.array_equal(q_bytes.reshape(-1), q_ref) and np.array_equal(
        s_words, s_ref.reshape(geometry.scale_columns, geometry.scale_rows).T[: geometry.rows]
    )
    x32 = x.astype(np.float32)
    x_back = api.dequantize(q_bytes.view(ml_dtypes.float8_e4m3fn), s_words)
    error = np.linalg.norm(x_back - x32) / np.linalg.norm(x32)
    moved = x.nbytes + q_bytes.nbytes + geometry.scale_storage * 4

    print(f"backend    {backend}")
    print(f"output     q: {q_bytes.shape} float8_e4m3fn; scales: int32 {geometry.scale_shape}, "
          f"strides {geometry.scale_strides}")  # fmt: skip
    print("           (UE8M0 exponents packed 4 per int32, MN-major, TMA-aligned: DeepGEMM SM100)")
    print(f"check      {'bit-exact' if exact else 'MISMATCH'} against the NumPy reference")
    print(f"error      ||dequant(q) - x|| / ||x|| = {error:.3e}")
    if cupy is None:
        print(f"time       {seconds * 1e3:.0f} ms (NumPy)")
    else:
        print(f"time       {seconds * 1e6:.1f} us per call on the GPU ({moved / seconds / 1e9:.0f} "
              f"GB/s); NumPy reference {host_seconds * 1e3:.0f} ms")  # fmt: skip
    return 0 if exact else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        from . import bench

        return bench.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m fp8_group_quant", description=__doc__)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=7168)
    args = parser.parse_args(argv)
    return main_job(args.tokens, args.hidden)


if __name__ == "__main__":
    sys.exit(main())
