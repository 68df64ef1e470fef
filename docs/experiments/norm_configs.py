"""Experiment (issue 13): the fused RMSNorm kernel's time per launch configuration.

For each M, the RMSNorm path (without and with the residual) is timed with each of the
kernel's lane counts (one or two 32-byte lanes a thread) and grid shapes (a block a row, or one
resident wave of walking blocks), set through the launch layer's knobs (NORM_LANES,
NORM_WAVES) in this process, beside the library's own choice ("auto") and the same-traffic
roofline kernel; CUDA-graph replays over rotating buffers, medians (bench_fused's timing).
Each configuration is timed with the launches prepared without PDL, as `bench --fused` times
them (its "x roof" figures), and with it, as the library launches by default on SM90: there a
call may start while the previous one ends, so back-to-back calls overlap and take less time
per call than the roofline kernel's figure suggests. Run from the repository root, once per
tree to compare:

    PYTHONPATH=$PWD python3 docs/experiments/norm_configs.py [M ...] [--config NAME=LANES:WAVES ...]
        [--residual]

Each --config replaces the columns after "auto" with a configuration of its own (LANES 1 or 2,
WAVES the resident waves of walking blocks, 0 a block a row; LANES:WAVES:0 keeps a walking grid
from the weight-stashing kernel, NORM_STASH), e.g. session 14's run 7
(logs/norm-grids-session14-h200.log): --config "1 lane, block a row=1:0"
--config "2 lanes, a wave walking=2:1" --config "1 lane, a wave walking=1:1" 480 512 576 640
768 1024. (logs/norm-configs-*-h200.log)
"""

import math
import sys

import numpy as np

from fp8_group_quant import _launch, api
from fp8_group_quant.bench import ROOFLINE_THREADS, pdl_launches
from fp8_group_quant.bench_fused import OPTIONS, ROTATE_BYTES, _cupy_stream, torch_graph_time_us

K = 7168
CONFIGS = {  # name: (NORM_LANES, NORM_WAVES, NORM_STASH)
    "auto": (None, None, True),
    "1 lane, block a row": (1, 0.0, True),
    "2 lanes, block a row": (2, 0.0, True),
    "2 lanes, walking": (2, 1.0, True),
}


def rows(torch, m: int, k: int, residual: bool, roofs):
    """Rotating buffers of m x k rows (x, the residual, outputs), a weight, the calls a graph
    replays, and the roofline kernel's launch on buffer i (its traffic with or without the
    residual): (xs, rs, weight, outs, calls, roofline). norm_warp.py uses it too."""
    buffers = max(2, min(32, math.ceil(ROTATE_BYTES / (m * k * 2 * (2 if residual else 1)))))
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(buffers)]
    rs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(buffers)]
    weight = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    outs = [api.quantize(x, 128, **OPTIONS) for x in xs]
    chunks = m * k // 16
    grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)

    # the roof writes x ^ residual (Inf and NaN in most groups) into a residual of its own;
    # until session 23 it wrote into rs, so the residual paths timed after it read NaNs
    roof_rs = [r.clone() for r in rs]

    def roofline(i):
        x, r, (q, _) = xs[i % buffers], roof_rs[i % buffers], outs[i % buffers]
        if residual:
            name = "residual"
            args = (np.uint64(x.data_ptr()), np.uint64(r.data_ptr()), np.uint64(q.data_ptr()),
                    np.int64(chunks))  # fmt: skip
        else:
            name = "copy"
            args = (np.uint64(x.data_ptr()), np.uint64(q.data_ptr()), np.int64(chunks))

        def launch():
            with _cupy_stream(torch):
                roofs[name](grid, (ROOFLINE_THREADS, 1, 1), args)

        return launch

    return xs, rs, weight, outs, max(buffers, 32), roofline


def time_configs(torch, m: int, residual: bool, roofs) -> dict:
    xs, rs, weight, outs, calls, roofline = rows(torch, m, K, residual, roofs)
    buffers = len(xs)

    def fused(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        r = rs[i % buffers] if residual else None
        return lambda: api.quantize(x, 128, **OPTIONS, norm=(weight, 1e-6), residual=r,
                                    out=q, scale_out=s)  # fmt: skip

    times = {"roof": torch_graph_time_us(torch, [roofline(i) for i in range(calls)])}
    for name, (lanes, waves, stash) in CONFIGS.items():
        for pdl in (False, True):
            _launch.NORM_LANES, _launch.NORM_WAVES, _launch.NORM_STASH = lanes, waves, stash
            with pdl_launches(pdl):  # plans hold the launch: it makes them again
                times[name, pdl] = torch_graph_time_us(torch, [fused(i) for i in range(calls)])
    _launch.NORM_LANES = _launch.NORM_WAVES = None
    _launch.NORM_STASH = True
    return times


def main(m_values, residuals=(False, True)) -> None:
    import cupy
    import torch

    from fp8_group_quant import _jit

    device = cupy.cuda.runtime.getDevice()
    roofs = {name: _jit.get_function("roofline.cu", f"fgq::roofline_{name}", device)
             for name in ("residual", "copy")}  # fmt: skip
    print(f"# RMSNorm, K = {K}, bf16 -> e4m3, packed UE8M0; us per call (x roof), without PDL "
          "/ with PDL")  # fmt: skip
    print(f"{'M':>6} {'residual':>8} {'roof':>7} " + " ".join(f"{n:>24}" for n in CONFIGS))
    for m in m_values:
        for residual in residuals:
            t = time_configs(torch, m, residual, roofs)
            cells = " ".join(
                f"{t[n, False]:>8.2f} ({t[n, False] / t['roof']:.2f}) / {t[n, True]:>6.2f}"
                for n in CONFIGS
            )
            print(f"{m:>6} {'yes' if residual else 'no':>8} {t['roof']:>7.2f} {cells}", flush=True)


def parse(argv: list[str]) -> tuple[list[int], tuple[bool, ...]]:
    """The M values of ``argv`` and the residual cases (--residual: only with it); its --config
    options replace CONFIGS' columns after "auto"."""
    m_values, configs, residuals = [], {}, (False, True)
    args = iter(argv)
    for arg in args:
        if arg == "--residual":
            residuals = (True,)
        elif arg == "--config":
            name, _, setting = next(args).rpartition("=")
            lanes, waves, *stash = setting.split(":")
            configs[name] = (int(lanes), float(waves), stash != ["0"])
        else:
            m_values.append(int(arg))
    if configs:
        CONFIGS.clear()
        CONFIGS.update({"auto": (None, None, True), **configs})
    return m_values or [512, 1024, 2048, 4096], residuals


if __name__ == "__main__":
    main(*parse(sys.argv[1:]))
