"""A real FP8 GEMM reads our outputs (issue 44, item 3): ``torch._scaled_mm`` (cuBLAS's
blockwise-scaled FP8 GEMM on SM90) fed with 1x128 activations from ``quantize`` and 128x128
weights from ``quantize_weight``, for the three GEMMs of a linear layer: forward ``y = x w^T``,
the input gradient ``dx = dy w`` and the weight gradient ``dw = dy^T x`` (both operands
column-wise, ``orientation="col"``). Each result is compared with the product of the
dequantized operands in float64, and its error against bf16 is reported.

Tolerance: the dequantized operands are exact, so the only differences are the GEMM's own
roundings. cuBLAS accumulates each 128-wide block of K on the tensor cores in four k=32 steps
and scales and adds the block in float32 (2^-24), then rounds the output to bfloat16 (half a
step: up to 2^-8 relative). The tensor cores' FP8 sums keep about 13 bits below the leading
one on Hopper (DeepSeek-V3's report: about 14), aligned to the largest of the step's products
and the running sum before they are cut, so a step can lose more than one rounding of its own
sum; no tight bound follows from sum_k |a_k b_k|. Measured on the H200 (torch 2.11, these
shapes): the largest error was 2.3 times 2^-8 |ref| + 2^-12 (|A| |B|) (the input gradient,
whose w has small values) and at most 0.83 of 2^-8 |ref| + 2^-9 (|A| |B|). The test allows
2^-7 |ref| + 2^-9 (|A| |B|): twice the bfloat16 rounding and 16 times one rounding of 2^-13 a
step. A wrong scale layout is far outside it: test_forward checks that scales rolled by one
group land more than ten times past the bound.
"""

import numpy as np
import pytest
from helpers import activations

import fp8_group_quant as fgq

pytestmark = pytest.mark.gpu

# DeepSeek-V3-like shapes cut to keep the test quick: M tokens, K hidden, N outputs
M, K, N = 256, 1024, 512


def _torch():
    return pytest.importorskip("torch")


def _scaled_mm_blockwise_or_skip(m: int = 128, k: int = 128, n: int = 128, b_blocks=True):
    """Skip unless this torch and device run _scaled_mm with 1x128 scales on a [m, k] and
    128x128 (b_blocks) or 128x1 scales on b [k, n]: probed with operands and scales torch
    makes itself, so our own layouts cannot cause the skip. (cuBLAS on SM90, torch 2.11:
    refuses m not a multiple of 4, with its own scales too.)"""
    torch = _torch()
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("blockwise-scaled FP8 GEMMs need SM90 or newer")
    a = torch.zeros((m, k), device="cuda").to(torch.float8_e4m3fn)
    b = torch.zeros((n, k), device="cuda").to(torch.float8_e4m3fn).t()
    scale_a = torch.ones((-(-k // 128), m), device="cuda").t()  # [m, k / 128], MN-major
    if b_blocks:  # [k / 128, n / 128], from [n / 128, k / 128] as quantize_weight writes them
        scale_b = torch.ones((-(-n // 128), -(-k // 128)), device="cuda").t()
    else:  # [k / 128, n]: b's 128 values along k a scale
        scale_b = torch.ones((-(-k // 128), n), device="cuda")
    try:
        torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError, TypeError) as error:
        pytest.skip(f"torch._scaled_mm takes no blockwise scaling at {m}x{k}x{n} here: {error}")


def _worst(got, a_deq, b_deq) -> float:
    """The largest error of ``got`` (the GEMM's bf16 output) against the float64 product of
    the dequantized operands ``a_deq [m, k]`` and ``b_deq [k, n]``, in units of the module
    docstring's bound (above 1: outside it)."""
    ref = a_deq.double() @ b_deq.double()
    magnitude = a_deq.abs().double() @ b_deq.abs().double()
    bound = 2.0**-7 * ref.abs() + 2.0**-9 * magnitude
    return float(((got.double() - ref).abs() / bound.clamp_min(1e-300)).max())


def _tolerance_check(got, a_deq, b_deq, what: str) -> None:
    worst = _worst(got, a_deq, b_deq)
    print(f"{what}: worst error {worst:.3f} of the accumulation bound")
    assert worst <= 1.0, f"{what}: {worst:.2f} times the accumulation bound"


def _report(torch, got, exact, what: str, record):
    """Relative Frobenius error of the FP8 GEMM against the bf16 one, for the log."""
    relative = float((got.double() - exact).norm() / exact.norm())
    record(what, relative)
    print(f"{what}: FP8 GEMM vs bf16 GEMM, relative Frobenius error {relative:.4f}")
    assert relative < 0.1  # FP8 e4m3 with 1x128 / 128x128 scales: a few percent at most


def _operands(torch, seed: int):
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(activations(rng, (M, K), "float32")).cuda().bfloat16()
    w = (torch.from_numpy(rng.standard_normal((N, K)).astype(np.float32)) * 0.02).cuda().bfloat16()
    dy = torch.from_numpy(activations(rng, (M, N), "float32")).cuda().bfloat16()
    return x, w, dy


@pytest.mark.parametrize("layout", ["col", "col_tma"])
@pytest.mark.parametrize("scale", ["float32", "ue8m0"])
def test_forward(layout, scale, record_property):
    """y = x w^T: x 1x128 (MN-major scales), w 128x128 (scales [N/128, K/128] given as .t())."""
    torch = _torch()
    _scaled_mm_blockwise_or_skip()
    x, w, _ = _operands(torch, 1)
    qx, sx = fgq.quantize(x, 128, scale=scale, layout=layout)
    qw, sw = fgq.quantize_weight(w, scale=scale)
    y = torch._scaled_mm(qx, qw.t(), sx, sw.t(), out_dtype=torch.bfloat16)
    x_deq = fgq.dequantize(qx, sx, 128)
    w_deq = fgq.dequantize_weight(qw, sw)
    _tolerance_check(y, x_deq, w_deq.t(), f"forward {scale} {layout}")
    rolled = sx.clone()  # the same strides, each row's scales moved by one group
    rolled.copy_(sx.roll(1, dims=1))
    y_rolled = torch._scaled_mm(qx, qw.t(), rolled, sw.t(), out_dtype=torch.bfloat16)
    assert _worst(y_rolled, x_deq, w_deq.t()) > 10, "the bound cannot see a layout error"
    exact = x.double() @ w.double().t()
    _report(torch, y, exact, f"forward {scale} {layout}", record_property)


@pytest.mark.parametrize("scale", ["float32", "ue8m0"])
def test_input_gradient(scale, record_property):
    """dx = dy w: dy 1x128 along N; w's 128x128 blocks as the [N, K] column-major operand,
    quantized from w^T (the same blocks, transposed: checked against w's own)."""
    torch = _torch()
    _scaled_mm_blockwise_or_skip()
    _, w, dy = _operands(torch, 2)
    qdy, sdy = fgq.quantize(dy, 128, scale=scale, layout="col")
    qwt, swt = fgq.quantize_weight(w.t().contiguous(), scale=scale)
    qw, sw = fgq.quantize_weight(w, scale=scale)
    assert torch.equal(qwt.view(torch.uint8), qw.t().contiguous().view(torch.uint8))
    assert torch.equal(swt, sw.t().contiguous())
    dx = torch._scaled_mm(qdy, qwt.t(), sdy, swt.t(), out_dtype=torch.bfloat16)
    dy_deq = fgq.dequantize(qdy, sdy, 128)
    w_deq = fgq.dequantize_weight(qw, sw)
    _tolerance_check(dx, dy_deq, w_deq, f"dgrad {scale}")
    _report(torch, dx, dy.double() @ w.double(), f"dgrad {scale}", record_property)


@pytest.mark.parametrize("scale", ["float32", "ue8m0"])
def test_weight_gradient(scale, record_property):
    """dw = dy^T x: both operands column-wise (groups of 128 tokens), from one "both" call each
    as a trainer makes them (the row-wise halves feed the forward and dgrad GEMMs)."""
    torch = _torch()
    _scaled_mm_blockwise_or_skip()
    x, _, dy = _operands(torch, 3)
    dy_both = fgq.quantize(dy, 128, scale=scale, layout="col", orientation="both")
    x_both = fgq.quantize(x, 128, scale=scale, layout="col", orientation="both")
    # a: dy^T [N, M] row-major, scales [N, M/128] MN-major; b: x as [M, K] column-major, its
    # scales [M/128, K] (x^T's [K, M/128] MN-major scales, transposed)
    dw = torch._scaled_mm(dy_both.qt, x_both.qt.t(), dy_both.scales_t, x_both.scales_t.t(),
                          out_dtype=torch.bfloat16)  # fmt: skip
    a_deq = fgq.dequantize(dy_both.qt, dy_both.scales_t, 128)
    b_deq = fgq.dequantize(x_both.qt, x_both.scales_t, 128).t()
    _tolerance_check(dw, a_deq, b_deq, f"wgrad {scale}")
    _report(torch, dw, dy.double().t() @ x.double(), f"wgrad {scale}", record_property)


# M across the sizes a server sees (decode batches, a prefill chunk, past a token group)
@pytest.mark.parametrize("m", [1, 4, 17, 100, 129, 384, 1000])
def test_forward_at_any_m(m, record_property):
    """y = x w^T at M not 256: where cuBLAS takes the size with its own scales, it takes ours,
    and the product is within the bound."""
    torch = _torch()
    _scaled_mm_blockwise_or_skip(m, K, N)
    rng = np.random.default_rng(m)
    x = torch.from_numpy(activations(rng, (m, K), "float32")).cuda().bfloat16()
    w = (torch.from_numpy(rng.standard_normal((N, K)).astype(np.float32)) * 0.02).cuda().bfloat16()
    qx, sx = fgq.quantize(x, 128, layout="col")
    qw, sw = fgq.quantize_weight(w)
    y = torch._scaled_mm(qx, qw.t(), sx, sw.t(), out_dtype=torch.bfloat16)
    _tolerance_check(y, fgq.dequantize(qx, sx, 128), fgq.dequantize_weight(qw, sw).t(), f"M={m}")
    _report(torch, y, x.double() @ w.double().t(), f"forward M={m}", record_property)


# M a multiple of 16 (torch wants the rows of dy^T 16-byte aligned) and not of 128
@pytest.mark.parametrize("m", [208, 400])
def test_weight_gradient_of_a_partial_token_group(m, record_property):
    """dw = dy^T x over M tokens, M not a multiple of 128: the GEMM's K ends in a partial
    token group (its scale over the tokens that exist), where cuBLAS takes such a K with
    torch's own operands."""
    torch = _torch()
    _scaled_mm_blockwise_or_skip(N, m, K, b_blocks=False)
    rng = np.random.default_rng(m)
    x = torch.from_numpy(activations(rng, (m, K), "float32")).cuda().bfloat16()
    dy = torch.from_numpy(activations(rng, (m, N), "float32")).cuda().bfloat16()
    dyt, sdyt = fgq.quantize(dy, 128, layout="col", orientation="col")
    xt, sxt = fgq.quantize(x, 128, layout="col", orientation="col")
    dw = torch._scaled_mm(dyt, xt.t(), sdyt, sxt.t(), out_dtype=torch.bfloat16)
    a_deq = fgq.dequantize(dyt, sdyt, 128)
    b_deq = fgq.dequantize(xt, sxt, 128).t()
    _tolerance_check(dw, a_deq, b_deq, f"wgrad M={m}")
    _report(torch, dw, dy.double().t() @ x.double(), f"wgrad M={m}", record_property)
