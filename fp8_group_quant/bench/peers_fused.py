"""Experiment (issue 13, session 20): SGLang's fused SiLU-and-multiply quantizer beside ours.

SGLang's v2 per-token-group kernel (`sglang/kernels/jit/csrc/gemm/per_token_group_quant_8bit_v2.cuh`
in the `sglang` wheel on PyPI; pass its path) fuses SiLU-and-multiply with FUSE_SILU_AND_MUL:
x [M, 2N] holds gate then up, one group of 128 per 8 lanes, its NaiveScheduler's grid. It is
compiled with NVRTC as sglang_same_run.py compiles its plain build. This times, for each M
(N = 7168 unless --n; bf16 -> e4m3, packed column-major UE8M0 scales, TMA-aligned), by torch
CUDA-graph replay over rotating buffers (bench --fused's timing, each configuration its own
graph): the same-traffic roof (`roofline_gated`, as `bench --fused`); this library's fused path
prepared without PDL and with it; SGLang's kernel (its kUsePDL build) launched without the PDL
attribute and with it, as its JIT host launches it on SM90. SGLang's SiLU is
`g / (1 + __expf(-g))` (a fast exponential) where this library's is the spec's exactly rounded
definition, so their codes may differ: the script counts the code bytes and scale words of
SGLang's that differ from this library's on the timed data (every one of ours is first
checked against the NumPy backend by `bench_fused._check`). From the repository root:

    PYTHONPATH=$PWD python3 docs/experiments/sglang_fused.py PATH [M ...] [--n N] [--no-check]
        [--persistent-waves W]

--no-check skips the check of ours against the NumPy backend, for a diagnostic kernel tree
(FP8_GROUP_QUANT_KERNEL_DIR) whose values are wrong; the differing-codes columns then compare
SGLang's with that tree's. --persistent-waves sets the one-pass grid's resident waves past which
the SiLU path takes the persistent kernel (a large value keeps the one-pass grid).
"""

import ctypes
import math
import sys

import numpy as np
import sglang_same_run  # this directory's

from fp8_group_quant import _jit, _launch, api
from fp8_group_quant.bench import ROOFLINE_THREADS, pdl_launches
from fp8_group_quant.bench_fused import (
    OPTIONS,
    ROTATE_BYTES,
    _check,
    _cupy_stream,
    torch_graph_time_us,
)

NAME = sglang_same_run.NAME.replace("true, true, false, true>", "true, true, true, true>")


def row(torch, cupy, sglang, roof, m: int, n: int, check: bool = True) -> dict:
    buffers = max(2, min(32, math.ceil(ROTATE_BYTES / (m * 2 * n * 2))))
    xs = [torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(buffers)]
    for x in xs:  # outlier channels
        x[:, ::97] *= 8
    with pdl_launches(False):
        outs = [api.quantize(x, 128, **OPTIONS, activation="silu_mul") for x in xs]
    if check:
        _check(torch, xs[0], outs[0])
    tma = -(-m // 4) * 4
    words = -(-n // 512)
    sgl_outs = [
        (torch.empty(m, n, device="cuda", dtype=torch.uint8),
         torch.empty(words, tma, device="cuda", dtype=torch.int32))
        for _ in range(buffers)
    ]  # fmt: skip
    calls = max(buffers, 32)
    groups = m * n // 128
    per_block = next(s for s in (16, 8, 4, 2, 1) if groups % s == 0)
    blocks, threads = groups // per_block, per_block * 8
    device = cupy.cuda.runtime.getDevice()

    def ours(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        return lambda: api.quantize(x, 128, **OPTIONS, activation="silu_mul", out=q, scale_out=s)

    chunks = m * n * 2 // 32  # 16 output bytes per thread

    def roofline(i):
        x, (q, _) = xs[i % buffers], outs[i % buffers]
        args = (np.uint64(x.data_ptr()), np.uint64(q.data_ptr()), np.int64(chunks),
                np.int64(n * 2 // 32))  # fmt: skip
        grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)

        def launch():
            with _cupy_stream(torch):
                roof(grid, (ROOFLINE_THREADS, 1, 1), args)

        return launch

    def sgl(pdl: bool):
        def make(i):
            x, (q, s) = xs[i % buffers], sgl_outs[i % buffers]
            pointers = [ctypes.c_void_p(t.data_ptr()) for t in (x, q, s)] + [ctypes.c_void_p(0)]
            sizes = [ctypes.c_int(v) for v in (per_block, n // 128, 0, tma, m)]
            with _jit.current_device(device):
                launch = _launch.KernelLaunch(
                    sglang.kernel.ptr, (blocks, 1, 1), (threads, 1, 1), pointers + sizes, pdl=pdl
                )
            return lambda: launch(torch.cuda.current_stream().cuda_stream)

        return make

    # SGLang's codes and scale words against ours (ours: the NumPy backend's, checked above)
    sgl(False)(0)()
    torch.cuda.synchronize()
    q_ours, s_ours = outs[0]
    q_sgl, s_sgl = sgl_outs[0]
    code_bytes = int((q_sgl.cpu() != q_ours.view(torch.uint8).cpu()).sum())
    s_ours_words = torch.as_strided(s_ours, (words, tma), (tma, 1))  # the packed storage
    scale_words = int((s_sgl[:, :m].cpu() != s_ours_words[:, :m].cpu()).sum())

    times = {"roof": torch_graph_time_us(torch, [roofline(i) for i in range(calls)])}
    for pdl in (False, True):
        with pdl_launches(pdl):
            times[f"ours{'_pdl' if pdl else ''}"] = torch_graph_time_us(
                torch, [ours(i) for i in range(calls)]
            )
        times[f"sgl{'_pdl' if pdl else ''}"] = torch_graph_time_us(
            torch, [sgl(pdl)(i) for i in range(calls)]
        )
    r = times["roof"]
    print(
        f"{m:>6} {r:>7.2f} {times['ours']:>7.2f} ({times['ours'] / r:.2f}) {times['sgl']:>7.2f} "
        f"({times['sgl'] / r:.2f}) {times['ours_pdl']:>8.2f} {times['sgl_pdl']:>8.2f} "
        f"{code_bytes:>9} / {m * n} {scale_words:>6} / {m * words}",
        flush=True,
    )
    return times


def main(argv) -> None:
    import cupy
    import torch

    path = argv[0]
    m_values, n, check = [], 7168, True
    args = iter(argv[1:])
    for arg in args:
        if arg == "--no-check":  # a diagnostic kernel tree whose values are wrong
            check = False
        elif arg == "--persistent-waves":  # the SiLU path's switch to the persistent grid
            _launch.PERSISTENT_FUSED_WAVES = float(next(args))
        elif arg == "--n":
            n = int(next(args))
        else:
            m_values.append(int(arg))
    device = cupy.cuda.runtime.getDevice()
    roof = _jit.get_function("roofline.cu", "fgq::roofline_gated", device)
    sglang = sglang_same_run.sglang_function(path, NAME)
    print(f"# fused SiLU-and-multiply, N = {n}, bf16 -> e4m3, packed UE8M0; us per call (x roof)")
    print(f"{'M':>6} {'roof':>7} {'ours':>14} {'SGLang':>14} {'ours PDL':>8} {'SGL PDL':>8} "
          f"{'SGLang codes that differ':>24} {'scale words':>12}")  # fmt: skip
    for m in m_values or [1, 64, 512, 1024, 4096]:
        row(torch, cupy, sglang, roof, m, n, check)


if __name__ == "__main__":
    main(sys.argv[1:])
