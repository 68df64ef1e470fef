"""One linear layer, forward and backward, in FP8 (DeepSeek-V3's recipe) against bf16.

python examples/fp8_linear.py            (a GPU with torch._scaled_mm's blockwise FP8: SM90+)

Per step: x and dy are quantized once each in both orientations (quantize(...,
orientation="both"): 1x128 groups along the channels for the forward and input-gradient GEMMs,
128x1 groups along the tokens for the weight-gradient GEMM), the weight in 128x128 blocks
(quantize_weight, and its transpose for dx). The three GEMMs run in torch._scaled_mm with our
scales as they are (MN-major float32, layout="col"). Printed: each GEMM's relative error
against bf16 and the time per step at DeepSeek-V3 shapes (K = 7168 hidden, N = 2048).

Without a GPU it runs the same quantization on the NumPy backend at a small shape and the
GEMMs on the dequantized operands (what an exact FP8 GEMM computes), and says so.
"""

import sys

import numpy as np

import fp8_group_quant as fgq

K, N = 7168, 2048  # DeepSeek-V3's hidden size, an MoE expert's intermediate size
M_VALUES = (1024, 4096, 8192)


def fp8_step(x, w, dy, mm):
    """(y, dx, dw) of y = x w^T with FP8 operands; ``mm(a, b, scale_a, scale_b)`` is the GEMM
    (torch._scaled_mm, or a product of dequantized operands on the host)."""
    xs = fgq.quantize(x, 128, layout="col", orientation="both")
    dys = fgq.quantize(dy, 128, layout="col", orientation="both")
    qw, sw = fgq.quantize_weight(w)
    qwt, swt = fgq.quantize_weight(w.T.copy() if isinstance(w, np.ndarray) else w.t().contiguous())
    y = mm(xs.q, qw.T, xs.scales, sw.T)  # [M, K] x [K, N]
    dx = mm(dys.q, qwt.T, dys.scales, swt.T)  # [M, N] x [N, K]
    dw = mm(dys.qt, xs.qt.T, dys.scales_t, xs.scales_t.T)  # [N, M] x [M, K]
    return y, dx, dw


def relative(got, exact) -> float:
    got, exact = np.asarray(got, np.float64), np.asarray(exact, np.float64)
    return float(np.linalg.norm(got - exact) / np.linalg.norm(exact))


def on_host() -> None:
    """The NumPy backend at a small shape; the GEMMs on dequantized operands."""
    m, k, n = 256, 512, 256
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.02).astype(np.float32)
    dy = rng.standard_normal((m, n)).astype(np.float32)

    def mm(a, b, scale_a, scale_b):
        # a [rows, red] with 1x128 scales; b [red, cols] and its scales, each given as the
        # transpose of codes and scales of b^T, as torch._scaled_mm takes them
        a_deq = fgq.dequantize(a, scale_a, 128)
        b_t, s_t = np.ascontiguousarray(b.T), np.ascontiguousarray(scale_b.T)
        if s_t.shape[0] == b_t.shape[0]:  # 1x128 groups along the reduction (wgrad)
            b_deq = fgq.dequantize(b_t, s_t, 128)
        else:  # 128x128 blocks
            b_deq = fgq.dequantize_weight(b_t, s_t)
        return a_deq.astype(np.float64) @ b_deq.T.astype(np.float64)

    y, dx, dw = fp8_step(x, w, dy, mm)
    exact = (x @ w.T, dy @ w, dy.T @ x)
    print(f"NumPy backend, M={m} K={k} N={n} (no GPU: no timing, GEMMs on dequantized operands)")
    for name, got, ref in zip(("y = x w^T", "dx = dy w", "dw = dy^T x"), (y, dx, dw), exact):
        print(f"  {name:12s} relative error against float32: {relative(got, ref):.4f}")


def on_gpu(torch) -> None:
    def mm(a, b, scale_a, scale_b):
        return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)

    def timed(step, repeats=20) -> float:
        for _ in range(3):
            step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / repeats

    print(f"{'M':>6} | {'y err':>7} {'dx err':>7} {'dw err':>7} | {'fp8 us':>8} {'bf16 us':>8}")
    for m in M_VALUES:
        print(gpu_row(torch, m, mm, timed))


def gpu_row(torch, m: int, mm, timed) -> str:
    """One M: the three GEMMs' errors against bf16 and the time of a step, FP8 and bf16."""
    x = torch.randn(m, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * 0.02
    dy = torch.randn(m, N, device="cuda", dtype=torch.bfloat16)
    y, dx, dw = fp8_step(x, w, dy, mm)
    exact = (x @ w.t(), dy @ w, dy.t() @ x)
    errors = [relative(g.float().cpu(), e.float().cpu()) for g, e in zip((y, dx, dw), exact)]
    fp8_us = timed(lambda: fp8_step(x, w, dy, mm))
    bf16_us = timed(lambda: (x @ w.t(), dy @ w, dy.t() @ x))
    return (f"{m:>6} | {errors[0]:7.4f} {errors[1]:7.4f} {errors[2]:7.4f} | "
            f"{fp8_us:8.1f} {bf16_us:8.1f}")  # fmt: skip


def main() -> int:
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        on_host()
        return 0
    if torch.cuda.get_device_capability() < (9, 0):
        print("torch._scaled_mm's blockwise FP8 GEMM needs SM90 or newer", file=sys.stderr)
        return 1
    on_gpu(torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
