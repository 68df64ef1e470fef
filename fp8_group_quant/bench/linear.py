"""``bench --linear``: where quantization stands in an FP8 linear layer's budget.

Per M (tokens), with K = --k[0] (hidden) and N = --n: the quantizer's time for one forward
step's operands (x row-wise, 1x128, layout "col"), for one backward step's (x and dy in both
orientations, the weight in 128x128 blocks), the FP8 GEMM's (torch._scaled_mm, forward) and
bf16's (torch.mm). GPU time by CUDA events around back-to-back eager calls (the quantizer's
launch cost included, as a trainer pays it), median of several repeats. Every quantizer output
is checked against the NumPy backend first, on the first M.
"""

from __future__ import annotations

import statistics

import numpy as np

import fp8_group_quant as fgq
from fp8_group_quant import ScaleName
from fp8_group_quant._arrays import torch_bytes

REPEATS, CALLS = 7, 20  # repeats of CALLS back-to-back calls; the median repeat is reported


def _time_us(torch, step) -> float:
    for _ in range(3):  # compile, allocate, warm
        step()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(CALLS):
            step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times)


def _check(torch, x, w) -> None:
    """The GPU's outputs equal the NumPy backend's, byte for byte (a provider that fails is an
    error, not a row)."""
    host = lambda t: t.float().cpu().numpy()  # noqa: E731 - bf16 is exact in float32
    both = fgq.quantize(x, 128, layout="col", orientation="both")
    expected = fgq.quantize(host(x), 128, layout="col", orientation="both")
    for got, want in zip(both, expected):
        got_bytes = torch_bytes(got).cpu().numpy()  # [K, 1] scale views at M <= 128
        if not np.array_equal(got_bytes, np.ascontiguousarray(want).view(np.uint8).reshape(-1)):
            raise AssertionError("quantize(orientation='both') differs from the NumPy backend")
    qw, sw = fgq.quantize_weight(w)
    qw_host, sw_host = fgq.quantize_weight(host(w))
    if not (np.array_equal(qw.view(torch.uint8).cpu().numpy(), qw_host.view(np.uint8))
            and np.array_equal(sw.cpu().numpy(), sw_host)):  # fmt: skip
        raise AssertionError("quantize_weight differs from the NumPy backend")


def _row(torch, m: int, k: int, n: int, w, check: bool) -> dict:
    """The times of one M."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    if check:
        _check(torch, x, w)
    qx, sx = fgq.quantize(x, 128, layout="col")
    qw, sw = fgq.quantize_weight(w)

    def backward_operands():
        fgq.quantize(x, 128, layout="col", orientation="both")
        fgq.quantize(dy, 128, layout="col", orientation="both")
        fgq.quantize_weight(w)

    def fp8_gemm():
        torch._scaled_mm(qx, qw.t(), sx, sw.t(), out_dtype=torch.bfloat16)

    try:
        fp8_gemm_us = _time_us(torch, fp8_gemm)
    except RuntimeError as error:  # cuBLAS refuses M not a multiple of 4 (SM90, torch 2.11)
        if m % 4 == 0 or "NOT_SUPPORTED" not in str(error):
            raise  # at any other M a refusal could be our layout's fault: an error, not n/a
        fp8_gemm_us = None
    return dict(
        m=m, k=k, n=n,
        quant_forward_us=_time_us(torch, lambda: fgq.quantize(x, 128, layout="col")),
        quant_backward_us=_time_us(torch, backward_operands),
        fp8_gemm_us=fp8_gemm_us,
        bf16_gemm_us=_time_us(torch, lambda: x @ w.t()),
    )  # fmt: skip


def run_linear(args) -> list[dict]:
    import torch

    k, n = args.k[0], args.n
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    print(f"K={k} N={n}; GPU us per call, eager (launch included)")
    print(f"{'M':>6} {'quant fwd':>10} {'quant bwd':>10} {'fp8 gemm':>9} {'bf16 gemm':>10} "
          f"{'quant/gemm':>10}")  # fmt: skip
    rows = []
    for i, m in enumerate(args.m):
        row = _row(torch, m, k, n, w, check=i == 0)
        rows.append(row)
        gemm, forward = row["fp8_gemm_us"], row["quant_forward_us"]
        print(f"{m:>6} {forward:10.2f} {row['quant_backward_us']:10.2f} "
              + (f"{gemm:9.2f}" if gemm is not None else f"{'n/a':>9}")
              + f" {row['bf16_gemm_us']:10.2f} "
              + (f"{forward / gemm:10.2f}" if gemm is not None else f"{'n/a':>10}"))  # fmt: skip
    if any(row["fp8_gemm_us"] is None for row in rows):
        print("n/a: cuBLAS's blockwise-scaled GEMM refused this M (with torch's own scales too)")
    return rows


# the speed targets: the quantizers against a roofline kernel of the same traffic ------

# (experts, N, K) of the weight targets (issue 44: within 1.10x of the roof) and (M, K) of both
# orientations' (within 1.15x)
WEIGHT_SHAPES = ((1, 7168, 2048), (1, 2048, 7168), (1, 4096, 7168), (256, 2048, 7168))
BOTH_SHAPES = ((4096, 7168), (16384, 7168), (8192, 2048))


def _graph_pair(cupy, quantizer, roof, inputs: int) -> tuple[float, float]:
    """GPU us per call of the quantizer and of its roof, interleaved CUDA-graph replays."""
    from .timing import CALLS, interleaved_graph_times_us

    calls = max(inputs, CALLS)
    lists = [
        [quantizer(i % inputs) for i in range(calls)],
        [roof(i % inputs) for i in range(calls)],
    ]
    ours, roof_us = interleaved_graph_times_us(cupy, lists, replays=11)
    return ours, roof_us


def _buffers(cupy, shape, nbytes_each: int) -> int:
    """Inputs to rotate over: at least ROTATE_BYTES, two at least, 16 at most."""
    from .timing import ROTATE_BYTES

    return max(2, min(16, -(-ROTATE_BYTES // nbytes_each)))


def weight_target(cupy, roofline, shape, scale: ScaleName) -> dict:
    """quantize_weight (float16 in: bfloat16's traffic, ``scale``, layout row) against
    roofline_copy on the same 3NK bytes."""
    from .timing import ROOFLINE_THREADS

    e, n, k = shape
    full = (e, n, k) if e > 1 else (n, k)
    count = _buffers(cupy, full, 2 * e * n * k)
    inputs = [_random(cupy, full, 0.02, seed=i) for i in range(count)]
    outputs = [fgq.quantize_weight(w, scale=scale) for w in inputs]
    # one expert against the NumPy backend (experts are independent; the host is slow at 256)
    first = (inputs[0][0], *(a[0] for a in outputs[0])) if e > 1 else (inputs[0], *outputs[0])
    _check_weight(cupy, first[0], first[1:], scale)
    chunks = e * n * k * 2 // 32
    grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)

    def quantizer(i):
        q, s = outputs[i]
        return lambda: fgq.quantize_weight(inputs[i], scale=scale, out=q, scale_out=s)

    def roof(i):
        return lambda: roofline(grid, (ROOFLINE_THREADS, 1, 1),
                                (inputs[i], outputs[i][0], np.int64(chunks)))  # fmt: skip

    ours, roof_us = _graph_pair(cupy, quantizer, roof, count)
    return dict(kind="weight", shape=list(shape), scale=scale, ours_us=ours, roofline_us=roof_us,
                ours_over_roofline=ours / roof_us, target=1.10)  # fmt: skip


def _random(cupy, shape, scale: float, seed: int):
    """float16 values drawn on the device (never constants), bfloat16's traffic."""
    rng = cupy.random.default_rng(seed)
    return (rng.standard_normal(shape, dtype=cupy.float32) * scale).astype(cupy.float16)


def _check_weight(cupy, w, outputs, scale: ScaleName) -> None:
    q, s = outputs
    q_host, s_host = fgq.quantize_weight(cupy.asnumpy(w), scale=scale)  # q: uint8 on cupy
    if not (np.array_equal(cupy.asnumpy(q), q_host.view(np.uint8))
            and np.array_equal(cupy.asnumpy(s), s_host)):  # fmt: skip
        raise AssertionError(f"quantize_weight {w.shape} differs from the NumPy backend")


def both_target(cupy, roofline_split, shape, scale: ScaleName) -> dict:
    """quantize(orientation="both") (float16 in, ``scale``, layout col) against roofline_split:
    one read of 2MK bytes, two writes of MK."""
    from .timing import ROOFLINE_THREADS

    m, k = shape
    count = _buffers(cupy, shape, 2 * m * k)
    inputs = [_random(cupy, shape, 1.0, seed=i) for i in range(count)]
    outputs = [fgq.quantize(x, 128, scale=scale, layout="col", orientation="both") for x in inputs]
    expected = fgq.quantize(cupy.asnumpy(inputs[0]), 128, scale=scale, layout="col",
                            orientation="both")  # fmt: skip

    def raw(array):  # bytes in logical order: qt and the col scales are transposed views
        return np.ascontiguousarray(array).view(np.uint8)

    for got, want in zip(outputs[0], expected):
        if not np.array_equal(raw(cupy.asnumpy(got)), raw(want)):
            raise AssertionError(f"quantize(orientation='both') {shape} differs from NumPy")
    chunks = m * k * 2 // 32
    grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)

    def quantizer(i):
        q, s, qt, st = outputs[i]
        return lambda: fgq.quantize(
            inputs[i],
            128,
            scale=scale,
            layout="col",
            orientation="both",
            out=(q, qt),
            scale_out=(s, st),
        )

    def roof(i):
        q, _, qt, _ = outputs[i]
        return lambda: roofline_split(grid, (ROOFLINE_THREADS, 1, 1),
                                      (inputs[i], q, qt, np.int64(chunks)))  # fmt: skip

    ours, roof_us = _graph_pair(cupy, quantizer, roof, count)
    return dict(kind="both", shape=list(shape), scale=scale, ours_us=ours, roofline_us=roof_us,
                ours_over_roofline=ours / roof_us, target=1.15)  # fmt: skip


def run_targets(get_function) -> list[dict]:
    """Both targets, each quantizer checked against the NumPy backend and then timed beside its
    roof; ``get_function(file, name)`` loads a benchmark kernel on the current device."""
    import cupy

    roofline = get_function("roofline.cu", "fgq::roofline_copy")
    split = get_function("roofline.cu", "fgq::roofline_split")
    print(f"{'kind':>6} {'shape':>18} {'scale':>7} {'ours us':>9} {'roof us':>9} {'ours/roof':>9} "
          f"{'target':>6}")  # fmt: skip
    rows = []
    scales: tuple[ScaleName, ...] = ("ue8m0", "float32")
    for scale in scales:
        for weight in WEIGHT_SHAPES:
            rows.append(weight_target(cupy, roofline, weight, scale))
            _print_target(rows[-1])
            cupy.get_default_memory_pool().free_all_blocks()
        for activation in BOTH_SHAPES:
            rows.append(both_target(cupy, split, activation, scale))
            _print_target(rows[-1])
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _print_target(row: dict) -> None:
    shape = "x".join(map(str, row["shape"]))
    print(f"{row['kind']:>6} {shape:>18} {row['scale']:>7} {row['ours_us']:9.2f} "
          f"{row['roofline_us']:9.2f} {row['ours_over_roofline']:9.3f} {row['target']:6.2f}",
          flush=True)  # fmt: skip
