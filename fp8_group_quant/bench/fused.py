"""``bench --fused``: the fused inputs against a same-traffic roof and against unfused steps.

For each M (1, 64, 512, 4096, or ``--m``; N = K = 7168, or the first ``--k`` given; bf16 -> e4m3,
packed UE8M0 scales), CUDA-graph replay in torch graphs over rotating buffers, median us per call:
the fused SiLU-and-multiply quantizer; the roofline kernel with its traffic (kernels/roofline.cu,
``roofline_gated``: 32 gate and 32 up bytes read and 16 written per thread); the plain quantizer on
[M, N]; torch's SiLU-and-multiply alone; the unfused pair; the floor. Then the fused add-RMSNorm
the same way (roof ``roofline_residual``: x and the residual read, the residual and the codes
written; unfused: torch's add and ``rms_norm``, then the plain quantizer), and RMSNorm without the
residual (roof: the plain quantizer's ``roofline_copy``). Then the masked layout (E = 32, T = 1024,
K = 7168, 5% of the rows real) against the plain quantizer on as many rows, launched without PDL
and, both being ours, with it. ``--paths`` times some of them (``FUSED_PATHS``), in that
order. Every fused result is checked against the NumPy backend first. Needs torch. The
library's launches are prepared without PDL (``cli`` says why) but where stated.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import api
from .._spec import ActivationName
from . import _hooks
from .shapes import own_k, own_m
from .timing import (
    CALLS,
    ROOFLINE_THREADS,
    ROTATE_BYTES,
    copy_bandwidth,
    cupy_stream,
    torch_graph_time_us,
)

# the paths ``--fused`` times, in its order (``--paths`` picks some)
FUSED_PATHS = ("silu_mul", "gelu_tanh_mul", "add_rms_norm", "rms_norm", "masked")
GATED: dict[ActivationName, str] = {
    "silu_mul": "SiLU-and-multiply",
    "gelu_tanh_mul": "GeGLU (tanh GELU-and-multiply)",
}
FUSED_M = (1, 64, 512, 4096)
OPTIONS: dict[str, Any] = dict(scale="ue8m0", layout="packed")


def run_fused(args) -> list[dict]:
    import cupy
    import torch

    bandwidth = copy_bandwidth(cupy)
    n = own_k(args, 7168)[0]
    m_values = own_m(args, FUSED_M)
    paths = set(getattr(args, "paths", None) or FUSED_PATHS)
    device = cupy.cuda.runtime.getDevice()
    rows = []
    for activation, title in GATED.items():
        if activation not in paths:
            continue
        roof = _hooks.get_function("roofline.cu", "fgq::roofline_gated", device)
        print(f"# fused {title}, N = {n}, bf16 -> e4m3, packed scales; copy "
              f"{bandwidth / 1e12:.2f} TB/s")  # fmt: skip
        print(f"{'M':>6} {'floor':>7} {'roof':>7} {'fused':>7} {'x roof':>7} {'plain':>7} "
              f"{'torch act':>9} {'unfused':>8} {'unfused/fused':>13}")  # fmt: skip
        rows += [_gated_row(torch, roof, bandwidth, m, n, activation) for m in m_values]
    residuals = [r for r, path in ((True, "add_rms_norm"), (False, "rms_norm")) if path in paths]
    if residuals:
        roofs = {name: _hooks.get_function("roofline.cu", f"fgq::roofline_{name}", device)
                 for name in ("residual", "copy")}  # fmt: skip
        print(f"# fused RMSNorm, K = {n}, with and without the residual add; copy "
              f"{bandwidth / 1e12:.2f} TB/s")  # fmt: skip
        print(f"{'M':>6} {'residual':>8} {'floor':>7} {'roof':>7} {'fused':>7} {'x roof':>7} "
              f"{'plain':>7} {'torch norm':>10} {'unfused':>8} {'unfused/fused':>13}")  # fmt: skip
        for m in m_values:
            for residual in residuals:
                rows.append(_norm_row(torch, roofs, bandwidth, m, n, residual))
    if "masked" in paths:
        rows.append(_masked_row(torch))
    return rows


def _gated_row(
    torch, roof, bandwidth: float, m: int, n: int, activation: ActivationName = "silu_mul"
) -> dict:
    buffers = max(2, min(32, math.ceil(ROTATE_BYTES / (m * 2 * n * 2))))
    xs = [torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(buffers)]
    ys = [torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(buffers)]
    outs = [api.quantize(x, 128, **OPTIONS, activation=activation) for x in xs]
    check_gated(torch, xs[0], outs[0], activation)
    calls = max(buffers, CALLS)
    chunks = m * n * 2 // 32  # 16 output bytes per thread
    grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)

    def fused(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        return lambda: api.quantize(x, 128, **OPTIONS, activation=activation, out=q, scale_out=s)

    def roofline(i):
        x, (q, _) = xs[i % buffers], outs[i % buffers]
        args = (np.uint64(x.data_ptr()), np.uint64(q.data_ptr()), np.int64(chunks),
                np.int64(n * 2 // 32))  # fmt: skip

        def launch():
            with cupy_stream(torch):  # the capture stream
                roof(grid, (ROOFLINE_THREADS, 1, 1), args)

        return launch

    def plain(i):
        y, (q, s) = ys[i % buffers], outs[i % buffers]
        return lambda: api.quantize(y, 128, **OPTIONS, out=q, scale_out=s)

    def act(i):  # the engines' silu_and_mul (gelu_tanh_and_mul): rounded to bf16, then the product
        x, y = xs[i % buffers], ys[i % buffers]
        if activation == "gelu_tanh_mul":
            gelu = torch.nn.functional.gelu
            return lambda: torch.mul(gelu(x[:, :n], approximate="tanh"), x[:, n:], out=y)
        return lambda: torch.mul(torch.nn.functional.silu(x[:, :n]), x[:, n:], out=y)

    times = _time_paths(torch, calls, fused, roofline, plain, act)
    moved = m * 2 * n * 2 + m * n + m * math.ceil(n / 512) * 4
    floor = moved / bandwidth * 1e6
    print(f"{m:>6} {floor:>7.2f} {times['roof']:>7.2f} {times['fused']:>7.2f} "
          f"{times['fused'] / times['roof']:>7.2f} {times['plain']:>7.2f} {times['act']:>9.2f} "
          f"{times['unfused']:>8.2f} {times['unfused'] / times['fused']:>13.2f}",
          flush=True)  # fmt: skip
    return {"path": activation, "M": m, "N": n, "floor_us": floor, **{f"{k}_us": v for k, v in
            times.items()}}  # fmt: skip


def _time_paths(torch, calls: int, fused, roofline, plain, act) -> dict[str, float]:
    """GPU us a call of each path, from graphs of ``calls`` calls each: the fused call, its
    roof, the plain quantizer, the torch step before it, and those two unfused."""

    def unfused(i):
        a, p = act(i), plain(i)
        return lambda: (a(), p())

    makers = {"fused": fused, "roof": roofline, "plain": plain, "act": act, "unfused": unfused}
    return {
        name: torch_graph_time_us(torch, [make(i) for i in range(calls)])
        for name, make in makers.items()
    }


def _norm_row(torch, roofs, bandwidth: float, m: int, k: int, residual: bool) -> dict:
    buffers = max(2, min(32, math.ceil(ROTATE_BYTES / (m * k * 2 * (2 if residual else 1)))))
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(buffers)]
    rs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(buffers)]
    # NOTES: the roof writes x ^ residual into its residual, bit patterns that hold Inf and NaN
    # in most groups (a bfloat16 of magnitude 1-2 XOR one of 2-4 has exponent 0xFF): it gets
    # buffers of its own, so every path timed here reads real data (sharing the residuals, the
    # unfused steps timed after it ran on its NaNs). The norm's output
    # that the plain quantizer reads is computed before any timing, for the same reason.
    roof_rs = [r.clone() for r in rs]
    weight = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    eps = 1e-6
    ys = [
        torch.nn.functional.rms_norm(x + r if residual else x, (k,), weight, eps)
        for x, r in zip(xs, rs)
    ]

    def norm_args(i):
        return dict(norm=(weight, eps), residual=rs[i % buffers] if residual else None)

    outs = [api.quantize(x, 128, **OPTIONS) for x in xs]
    _check_norm(torch, xs[0], rs[0], weight, eps, residual)
    calls = max(buffers, CALLS)
    roofline = _norm_roofline(torch, roofs, xs, roof_rs, outs, m * k // 16, residual)

    def fused(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        args = norm_args(i)
        return lambda: api.quantize(x, 128, **OPTIONS, **args, out=q, scale_out=s)

    def plain(i):
        y, (q, s) = ys[i % buffers], outs[i % buffers]
        return lambda: api.quantize(y, 128, **OPTIONS, out=q, scale_out=s)

    def act(i):  # the engines' steps: the add in place, then RMSNorm
        x, r, y = xs[i % buffers], rs[i % buffers], ys[i % buffers]

        def steps():
            source = r.add_(x) if residual else x
            y.copy_(torch.nn.functional.rms_norm(source, (k,), weight, eps))

        return steps

    times = _time_paths(torch, calls, fused, roofline, plain, act)
    # the residuals grow by x at each call (r = x + r, in place), but stay finite
    assert all(bool(torch.isfinite(t).all()) for t in (*rs, *ys)), "timed on non-finite data"
    return _norm_result(bandwidth, m, k, residual, times)


def _norm_roofline(torch, roofs, xs, roof_rs, outs, chunks: int, residual: bool):
    """The same-traffic roof's launch on buffer ``i``: x (and a residual of its own) read, the
    residual and the codes written (``chunks`` of 16 values)."""
    buffers = len(xs)
    grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)

    def roofline(i):
        x, r, (q, _) = xs[i % buffers], roof_rs[i % buffers], outs[i % buffers]
        if residual:
            name, args = "residual", (np.uint64(x.data_ptr()), np.uint64(r.data_ptr()),
                                      np.uint64(q.data_ptr()), np.int64(chunks))  # fmt: skip
        else:
            name, args = "copy", (np.uint64(x.data_ptr()), np.uint64(q.data_ptr()),
                                  np.int64(chunks))  # fmt: skip

        def launch():
            with cupy_stream(torch):
                roofs[name](grid, (ROOFLINE_THREADS, 1, 1), args)

        return launch

    return roofline


def _norm_result(bandwidth: float, m: int, k: int, residual: bool, times: dict) -> dict:
    """Print and return a row of the RMSNorm table."""
    moved = m * k * 2 * (3 if residual else 1) + m * k + m * math.ceil(k / 512) * 4
    floor = moved / bandwidth * 1e6
    print(f"{m:>6} {'yes' if residual else 'no':>8} {floor:>7.2f} {times['roof']:>7.2f} "
          f"{times['fused']:>7.2f} {times['fused'] / times['roof']:>7.2f} {times['plain']:>7.2f} "
          f"{times['act']:>10.2f} {times['unfused']:>8.2f} "
          f"{times['unfused'] / times['fused']:>13.2f}", flush=True)  # fmt: skip
    return {"path": "rms_norm", "residual": residual, "M": m, "K": k, "floor_us": floor,
            **{f"{k}_us": v for k, v in times.items()}}  # fmt: skip


def _check_norm(torch, x, r, weight, eps: float, residual: bool) -> None:
    """The fused RMSNorm (and the residual written back) is the NumPy backend's, bit for bit."""
    import ml_dtypes

    def host(t):
        return t.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)

    r_host = host(r).copy()
    r_before = r.clone()
    q, s = api.quantize(x, 128, **OPTIONS, norm=(weight, eps), residual=r if residual else None)
    q_ref, s_ref = api.quantize(host(x), 128, **OPTIONS, norm=(host(weight), eps),
                                residual=r_host if residual else None)  # fmt: skip
    assert np.array_equal(q.view(torch.uint8).cpu().numpy(), q_ref.view(np.uint8)), "norm q"
    assert np.array_equal(s.cpu().numpy(), s_ref), "norm scales"
    if residual:
        assert np.array_equal(host(r), r_host), "norm residual"
        r.copy_(r_before)


def check_gated(torch, x, outputs, activation: ActivationName = "silu_mul") -> None:
    """The fused result is the NumPy backend's, bit for bit."""
    import ml_dtypes

    host = x.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    q, s = outputs
    q_ref, s_ref = api.quantize(host, 128, **OPTIONS, activation=activation)
    assert np.array_equal(q.view(torch.uint8).cpu().numpy(), q_ref.view(np.uint8))
    assert np.array_equal(s.cpu().numpy(), s_ref)


def _check_masked(torch, x, counts, q) -> None:
    """The real rows of each expert are the NumPy backend's, bit for bit."""
    import ml_dtypes

    for e in np.flatnonzero(counts)[:4]:  # a few experts: NumPy takes a second per thousand rows
        rows = x[e, : counts[e]]
        host = rows.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
        q_ref, _ = api.quantize(host, 128, **OPTIONS)
        got = q[e, : counts[e]].view(torch.uint8).cpu().numpy()
        assert np.array_equal(got, q_ref.view(np.uint8)), f"masked expert {e}"


def _masked_row(torch, experts: int = 32, tokens: int = 1024, k: int = 7168) -> dict:
    share = 0.05
    x = torch.randn(experts, tokens, k, device="cuda", dtype=torch.bfloat16)
    rng = np.random.default_rng(0)
    counts = rng.multinomial(int(share * experts * tokens), [1 / experts] * experts)
    counts_t = torch.from_numpy(counts.astype(np.int32)).cuda()
    full_t = torch.full((experts,), tokens, dtype=torch.int32, device="cuda")
    rows = int(counts.sum())
    plain_x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    q, s = api.quantize(x, 128, **OPTIONS, masked_m=counts_t)
    _check_masked(torch, x, counts, q)
    pq, ps = api.quantize(plain_x, 128, **OPTIONS)

    def masked(c):
        return lambda: api.quantize(x, 128, **OPTIONS, masked_m=c, out=q, scale_out=s)

    def plain():
        return api.quantize(plain_x, 128, **OPTIONS, out=pq, scale_out=ps)

    # NOTES: both paths are ours, so they compare like with like with PDL on too (the library's
    # default launch, each call overlapping the previous one's end), reported beside the table's
    # launches without it
    times = {}
    for pdl in (False, True):
        with _hooks.pdl_launches(pdl):
            times[pdl] = (torch_graph_time_us(torch, [masked(counts_t)] * 32),
                          torch_graph_time_us(torch, [plain] * 32))  # fmt: skip
    (t_masked, t_plain), (pdl_masked, pdl_plain) = times[False], times[True]
    with _hooks.pdl_launches(False):
        t_full = torch_graph_time_us(torch, [masked(full_t)] * 4)
    print(f"# masked, E = {experts}, T = {tokens}, K = {k}, {rows} real rows ({share:.0%}): "
          f"{t_masked:.2f} us; plain on {rows} rows {t_plain:.2f} us (x {t_masked / t_plain:.2f});"
          f" every row counted {t_full:.2f} us; with PDL {pdl_masked:.2f} against "
          f"{pdl_plain:.2f} us (x {pdl_masked / pdl_plain:.2f})")  # fmt: skip
    return {"path": "masked", "E": experts, "T": tokens, "K": k, "rows": rows,
            "masked_us": t_masked, "plain_us": t_plain, "full_us": t_full,
            "pdl_masked_us": pdl_masked, "pdl_plain_us": pdl_plain}  # fmt: skip
