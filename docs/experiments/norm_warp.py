"""Experiment (issue 13, session 19): the fused RMSNorm a warp a row (quantize_norm_warp).

Times the RMSNorm path without a residual (bf16 -> e4m3, packed UE8M0, K = 7168 unless --k)
with the library's register kernels ("auto") and with the warp-a-row kernel forced at several
fills (the fraction of its resident warps the grid holds), beside the same-traffic roofline
kernel; CUDA-graph replays over rotating buffers, medians (bench_fused's timing), each with
the launches prepared without PDL (as `bench --fused` times them) and with it. Every forced
configuration is first checked against the NumPy backend on the timed data (bit for bit).
The kernel is not in the library: apply docs/experiments/norm_warp.patch first (on a tree
without it the "warp" columns time the register kernels again). Run from the repository root:

    git apply docs/experiments/norm_warp.patch
    PYTHONPATH=$PWD python3 docs/experiments/norm_warp.py [M ...] [--fill F ...] [--k K]

Session 19's run: logs/norm-warp-session19-h200.log.
"""

import sys

import numpy as np
from norm_configs import rows  # this directory's

from fp8_group_quant import _launch, api
from fp8_group_quant.bench import pdl_launches
from fp8_group_quant.bench_fused import OPTIONS, torch_graph_time_us


def time_configs(torch, roofs, m: int, k: int, configs, force) -> dict:
    """The roof and each (name, on, fill) of ``configs`` at m x k, without and with PDL;
    force(on, fill) makes the next plans take that kernel (on False: the register kernels).
    Each configuration's outputs are first compared with the first one's, bit for bit.
    norm_rowwarp.py uses it too."""
    xs, _, weight, outs, calls, roofline = rows(torch, m, k, False, roofs)
    buffers = len(xs)
    for x in xs:  # outlier channels
        x[:, ::97] *= 40

    def fused(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        return lambda: api.quantize(x, 128, **OPTIONS, norm=(weight, 1e-6), out=q, scale_out=s)

    times = {"roof": torch_graph_time_us(torch, [roofline(i) for i in range(calls)])}
    expected = None
    for name, on, fill in configs:
        force(on, fill)
        for pdl in (False, True):
            with pdl_launches(pdl):  # plans hold the launch: it makes them again
                q, s = api.quantize(xs[0], 128, **OPTIONS, norm=(weight, 1e-6))
                got = (q.cpu().view(torch.uint8).numpy().copy(), s.cpu().numpy().copy())
                if expected is None:
                    expected = got
                elif not all(np.array_equal(a, b) for a, b in zip(got, expected)):
                    raise AssertionError(f"{name}: outputs differ from the register kernels'")
                times[name, pdl] = torch_graph_time_us(torch, [fused(i) for i in range(calls)])
    force(False, 1.0)
    return times


def print_rows(m_values, k: int, configs, force) -> None:
    """time_configs at each M, one line each."""
    import cupy
    import torch

    from fp8_group_quant import _jit

    device = cupy.cuda.runtime.getDevice()
    roofs = {"copy": _jit.get_function("roofline.cu", "fgq::roofline_copy", device)}
    print(f"# RMSNorm, K = {k}, bf16 -> e4m3, packed UE8M0; us per call (x roof), no PDL / PDL")
    for m in m_values:
        t = time_configs(torch, roofs, m, k, configs, force)
        roof_us = t["roof"]
        cells = "  ".join(
            f"{n}: {t[n, False]:.2f} ({t[n, False] / roof_us:.3f}) / {t[n, True]:.2f}"
            for n, _, _ in configs
        )
        print(f"M {m:>6} roof {roof_us:.2f}  {cells}", flush=True)


def force_warp(on: bool, fill: float) -> None:
    """The warp-a-row kernel of norm_warp.patch (its knobs), or the library's choice."""
    _launch.NORM_WARP, _launch.NORM_WARP_FILL = (True if on else None), fill


def main(argv) -> None:
    m_values, fills, k = [], [], 7168
    args = iter(argv)
    for arg in args:
        if arg == "--fill":
            fills.append(float(next(args)))
        elif arg == "--k":
            k = int(next(args))
        else:
            m_values.append(int(arg))
    configs = [("auto", False, 1.0)] + [(f"warp {f:g}", True, f) for f in fills or [1.0, 0.5]]
    print_rows(m_values or [512, 1024, 2048, 4096, 8192], k, configs, force_warp)


if __name__ == "__main__":
    main(sys.argv[1:])
