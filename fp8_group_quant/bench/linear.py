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
        got_bytes = got.contiguous().view(torch.uint8).cpu().numpy().reshape(-1)
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

    return dict(
        m=m, k=k, n=n,
        quant_forward_us=_time_us(torch, lambda: fgq.quantize(x, 128, layout="col")),
        quant_backward_us=_time_us(torch, backward_operands),
        fp8_gemm_us=_time_us(torch, lambda: torch._scaled_mm(qx, qw.t(), sx, sw.t(),
                                                              out_dtype=torch.bfloat16)),
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
        print(f"{m:>6} {row['quant_forward_us']:10.2f} {row['quant_backward_us']:10.2f} "
              f"{row['fp8_gemm_us']:9.2f} {row['bf16_gemm_us']:10.2f} "
              f"{row['quant_forward_us'] / row['fp8_gemm_us']:10.2f}")  # fmt: skip
    return rows
