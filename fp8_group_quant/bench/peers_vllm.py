"""Experiment (issue 13, session 22): vLLM's fused RMSNorm and SiLU-and-multiply FP8 group
quantizers beside ours.

vLLM's custom ops `rms_norm_per_block_quant` and `silu_and_mul_per_block_quant`
(`csrc/quantization/fused_kernels/`) are the fused quantizers with groups that its engines call
before a block-scaled FP8 GEMM; both write float32 scales, optionally transposed (MN-major, as
DeepGEMM on Hopper reads them). The RMSNorm kernel runs a block a token and reads the row three
times (sum of squares, group maxima, codes); the SiLU kernel takes a block a (token, group) below
3072 groups, else a 16-byte-lane kernel of 256-thread blocks. Their source is not in this
repository. Two steps:

1. On a machine with nvcc and torch's headers (the kernels use torch's header-only BFloat16 and
   Float8_e4m3fn types and CUB), build PTX from the `vllm` sdist on PyPI (0.34.0 here;
   `tar xzf vllm-0.34.0.tar.gz vllm-0.34.0/csrc`):

       python3 docs/experiments/vllm_fused.py build VLLM_CSRC OUT.ptx

   which takes the kernel templates from fused_layernorm_dynamic_per_token_quant.cu and
   fused_silu_mul_block_quant.cu as they are (their host code left out), and instantiates them
   for bfloat16 -> e4m3, groups of 128, transposed scales (the RMSNorm with and without the
   residual), compiled as vLLM's build compiles them (nvcc -O3, relaxed constexpr; no fast math).

2. On the GPU, from the repository root:

       PYTHONPATH=$PWD python3 docs/experiments/vllm_fused.py time OUT.ptx [M ...] [--k K]
           [--no-outliers]

   times, by CUDA-graph replay over rotating buffers as `bench --fused` does (K = N = 7168 by
   default; every launch without PDL): the same-traffic roofs of `bench --fused`; this library's
   fused paths with packed UE8M0 scales (the README's figures) and with float32 scales in the
   `col` layout (vLLM's output form); vLLM's kernels launched as its host launches them. Their
   arithmetic is not the spec's: the RMSNorm rounds x * r to bfloat16 before the weight
   multiply and takes rsqrtf; the SiLU is g / (1 + expf(-g)) times up with no rounding between
   (docs/spec.md, sections 2a and 2b). So the script counts, on fresh data before timing, the
   codes and scales of vLLM's that differ from this library's float-scale output (and the
   residual words written back).
"""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np

NORM_FILE = "fused_layernorm_dynamic_per_token_quant.cu"
SILU_FILE = "fused_silu_mul_block_quant.cu"
NORM_START = "// RMS norm + quant kernel"
END = "}  // namespace vllm"
BF16, E4M3 = "c10::BFloat16", "c10::Float8_e4m3fn"
OUT_ARGS = f"{E4M3}* __restrict__, float* __restrict__, {BF16} const* __restrict__"
INSTANCES = [
    f"rms_norm_per_block_quant_kernel<{BF16}, {E4M3}, {r}, true, 128>({OUT_ARGS}, "
    f"{BF16} const* __restrict__, float const*, float const, int32_t const, int32_t const, "
    f"{BF16}* __restrict__, int64_t)"
    for r in ("false", "true")
] + [
    f"silu_and_mul_per_block_quant_kernel<{BF16}, {E4M3}, true, 128>({OUT_ARGS}, "
    "float const*, int32_t const)",
    f"silu_and_mul_per_block_quant_vec_kernel<{BF16}, {E4M3}, true, 128>({OUT_ARGS}, "
    "float const*, int32_t const, int32_t const, int64_t const)",
]


def build(csrc: str, out: str) -> None:
    import torch.utils.cpp_extension as ext

    csrc_path = Path(csrc)
    kernels = csrc_path / "quantization/fused_kernels"
    norm = (kernels / NORM_FILE).read_text()
    start = norm.index(NORM_START)
    silu = (kernels / SILU_FILE).read_text()
    silu_start = silu.index("namespace vllm {")
    lines = [
        "#include <torch/headeronly/util/BFloat16.h>",
        '#include "quantization/fused_kernels/layernorm_utils.cuh"',
        '#include "core/cuda_compat.h"',
        "namespace vllm {",
        norm[start : norm.index(END, start)],
        END,
        silu[silu_start : silu.index(END, silu_start) + len(END)],
        "namespace vllm {",
        *(f"template __global__ void {instance};" for instance in INSTANCES),
        END,
    ]
    wrapper = Path(out).with_suffix(".cu")
    wrapper.write_text("\n".join(lines) + "\n")
    includes = [f"-I{csrc_path}"] + [f"-I{p}" for p in ext.include_paths()]
    command = ["nvcc", "-std=c++17", "-O3", "--expt-relaxed-constexpr", "-ptx", "-arch=sm_90",
               *includes, "-o", out, str(wrapper)]  # fmt: skip
    subprocess.run(command, check=True)
    for name in entries(out):
        print(name)


def entries(ptx: str) -> list[str]:
    lines = Path(ptx).read_text().splitlines()
    return [line.split()[2].split("(")[0] for line in lines if ".entry" in line and "vllm" in line]


def time_rows(ptx: str, m_values: list[int], k: int) -> None:
    import cupy
    import torch

    from fp8_group_quant import _jit

    module = cupy.RawModule(path=ptx)
    names = entries(ptx)
    # the RMSNorm's has_residual is its third template argument
    norm = {("Lb1ELb1E" in n): module.get_function(n) for n in names if "rms_norm" in n}
    silu = {("vec" in n): module.get_function(n) for n in names if "silu" in n}
    device = cupy.cuda.runtime.getDevice()
    roofs = {
        name: _jit.get_function("roofline.cu", f"fgq::roofline_{name}", device)
        for name in ("residual", "copy", "gated")
    }
    head = (f"{'roof':>7} {'ours packed':>14} {'ours col':>14} {'vLLM':>14} {'vLLM/ours':>9} "
            f"{'codes that differ':>20} {'scales':>14}")  # fmt: skip
    print(f"# fused SiLU-and-multiply, N = {k}, bf16 -> e4m3, groups of 128; us (x roof), no PDL")
    print(f"{'M':>6} {head}")
    for m in m_values:
        _silu_row(torch, silu, roofs["gated"], m, k)
    print(f"# fused RMSNorm, K = {k}, bf16 -> e4m3, groups of 128; us (x roof), no PDL")
    print(f"{'M':>6} {'residual':>8} {head} {'residual words':>16}")
    for m in m_values:
        for residual in (False, True):
            _norm_row(torch, norm[residual], roofs, m, k, residual)


OUTLIERS = True  # --no-outliers: plain randn * 3, as bench --fused draws its rows


def _inputs(torch, m: int, width: int, buffers: int) -> list:
    xs = [torch.randn(m, width, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(buffers)]
    for x in xs:  # outlier channels
        if OUTLIERS:
            x[:, ::97] *= 8
    return xs


def _times(torch, makers: dict, calls: int) -> dict:
    from fp8_group_quant.bench import pdl_launches
    from fp8_group_quant.bench_fused import torch_graph_time_us

    with pdl_launches(False):
        return {
            n: torch_graph_time_us(torch, [make(i) for i in range(calls)])
            for n, make in makers.items()
        }


def _cells(times: dict, codes: int, values: int, scales: int, groups: int) -> str:
    roof = times["roof"]
    cells = " ".join(f"{times[n]:>7.2f} ({times[n] / roof:.2f})" for n in ("packed", "col", "vllm"))
    return (f"{roof:>7.2f} {cells} {times['vllm'] / times['packed']:>9.2f} "
            f"{codes:>9} / {values:<10} {scales:>5} / {groups:<6}")  # fmt: skip


def _launch(torch, kernel, grid, block, args):
    from fp8_group_quant.bench_fused import _cupy_stream

    def launch():
        with _cupy_stream(torch):
            kernel(grid, block, args)

    return launch


def _ours(torch, xs, outs, opts, **extra):
    from fp8_group_quant import api

    buffers = len(xs)

    def make(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        more = {key: (v(i) if callable(v) else v) for key, v in extra.items()}
        return lambda: api.quantize(x, 128, **opts, **more, out=q, scale_out=s)

    return make


def _silu_row(torch, kernels, roof, m: int, n: int) -> None:
    from fp8_group_quant import api
    from fp8_group_quant.bench import ROOFLINE_THREADS
    from fp8_group_quant.bench_fused import OPTIONS, ROTATE_BYTES

    float_col = dict(scale="float32", layout="col")
    buffers = max(2, min(32, math.ceil(ROTATE_BYTES / (m * 2 * n * 2))))
    xs = _inputs(torch, m, 2 * n, buffers)
    groups = n // 128
    vq = [torch.empty(m, n, device="cuda", dtype=torch.uint8) for _ in range(buffers)]
    vs = [torch.empty(groups, m, device="cuda", dtype=torch.float32) for _ in range(buffers)]
    vec = m * groups >= 3072  # vLLM's host: the lane kernel from 3072 groups

    def vllm_call(i):
        x = xs[i % buffers]
        head = (np.uint64(vq[i % buffers].data_ptr()), np.uint64(vs[i % buffers].data_ptr()),
                np.uint64(x.data_ptr()), np.uint64(0), np.int32(n))  # fmt: skip
        if vec:
            blocks = -(-m * groups * 16 // 256)
            return _launch(torch, kernels[True], (blocks, 1, 1), (256, 1, 1),
                           (*head, np.int32(groups), np.int64(m)))  # fmt: skip
        return _launch(torch, kernels[False], (m, groups, 1), (128, 1, 1), head)

    q_ours, s_ours = api.quantize(xs[0], 128, **float_col, activation="silu_mul")
    vllm_call(0)()
    torch.cuda.synchronize()
    codes = int((q_ours.view(torch.uint8) != vq[0]).sum())
    scales = int((s_ours.T != vs[0]).sum())
    outs = {
        name: [api.quantize(x, 128, **opts, activation="silu_mul") for x in xs]
        for name, opts in (("packed", OPTIONS), ("col", float_col))
    }
    chunks = m * n * 2 // 32  # as bench --fused's gated roof: 16 output bytes a thread

    def roofline(i):
        x, q = xs[i % buffers], vq[i % buffers]
        args = (np.uint64(x.data_ptr()), np.uint64(q.data_ptr()), np.int64(chunks),
                np.int64(n * 2 // 32))  # fmt: skip
        grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)
        return _launch(torch, roof, grid, (ROOFLINE_THREADS, 1, 1), args)

    makers = {
        "roof": roofline,
        "packed": _ours(torch, xs, outs["packed"], OPTIONS, activation="silu_mul"),
        "col": _ours(torch, xs, outs["col"], float_col, activation="silu_mul"),
        "vllm": vllm_call,
    }
    times = _times(torch, makers, max(buffers, 32))
    print(f"{m:>6} {_cells(times, codes, m * n, scales, m * groups)}", flush=True)


def _norm_row(torch, kernel, roofs, m: int, k: int, residual: bool) -> None:
    from fp8_group_quant import api
    from fp8_group_quant.bench import ROOFLINE_THREADS
    from fp8_group_quant.bench_fused import OPTIONS, ROTATE_BYTES

    eps = 1e-6
    float_col = dict(scale="float32", layout="col")
    buffers = max(2, min(32, math.ceil(ROTATE_BYTES / (m * k * 2 * (2 if residual else 1)))))
    xs = _inputs(torch, m, k, buffers)
    rs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _ in range(buffers)]
    weight = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
    threads = min(k, 512 if m <= 256 else 256)  # vLLM's host
    groups = k // 128
    vq = [torch.empty(m, k, device="cuda", dtype=torch.uint8) for _ in range(buffers)]
    vs = [torch.empty(groups, m, device="cuda", dtype=torch.float32) for _ in range(buffers)]

    def vllm_call(i, x, r):
        args = (np.uint64(vq[i].data_ptr()), np.uint64(vs[i].data_ptr()),
                np.uint64(x.data_ptr()), np.uint64(weight.data_ptr()), np.uint64(0),
                np.float32(eps), np.int32(k), np.int32(k),
                np.uint64(r.data_ptr() if residual else 0), np.int64(m))  # fmt: skip
        return _launch(torch, kernel, (m, 1, 1), (threads, 1, 1), args)

    # vLLM's codes, scales and residual against ours (float scales, col) on the same input
    x0, r_ours, r_vllm = xs[0].clone(), rs[0].clone(), rs[0].clone()
    q_ours, s_ours = api.quantize(
        x0, 128, **float_col, norm=(weight, eps), residual=r_ours if residual else None
    )
    vllm_call(0, x0, r_vllm)()
    torch.cuda.synchronize()
    codes = int((q_ours.view(torch.uint8) != vq[0]).sum())
    scales = int((s_ours.T != vs[0]).sum())
    words = int((r_ours.view(torch.int16) != r_vllm.view(torch.int16)).sum()) if residual else 0

    outs = {
        name: [api.quantize(x, 128, **opts) for x in xs]
        for name, opts in (("packed", OPTIONS), ("col", float_col))
    }
    chunks = m * k // 16

    # the roof writes x ^ residual (Inf and NaN in most groups) into a residual of its own
    # (session 23: sharing them, as run 3-4 of session 22 did, timed the paths after it on NaNs)
    roof_rs = [r.clone() for r in rs]

    def roofline(i):
        x, r, q = xs[i % buffers], roof_rs[i % buffers], vq[i % buffers]
        pointers = (x, r, q) if residual else (x, q)
        args = (*(np.uint64(t.data_ptr()) for t in pointers), np.int64(chunks))
        grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)
        name = "residual" if residual else "copy"
        return _launch(torch, roofs[name], grid, (ROOFLINE_THREADS, 1, 1), args)

    def residual_of(i):
        return rs[i % buffers] if residual else None

    norm = dict(norm=(weight, eps), residual=residual_of)
    makers = {
        "roof": roofline,
        "packed": _ours(torch, xs, outs["packed"], OPTIONS, **norm),
        "col": _ours(torch, xs, outs["col"], float_col, **norm),
        "vllm": lambda i: vllm_call(i % buffers, xs[i % buffers], rs[i % buffers]),
    }
    times = _times(torch, makers, max(buffers, 32))
    cells = _cells(times, codes, m * k, scales, m * groups)
    print(f"{m:>6} {'yes' if residual else 'no':>8} {cells} {words:>7} / {m * k:<8}", flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["build"]:
        build(argv[1], argv[2])
        return
    if argv[:1] != ["time"]:
        raise SystemExit(__doc__)
    global OUTLIERS
    ptx, rest = argv[1], argv[2:]
    if "--no-outliers" in rest:
        OUTLIERS = False
        rest.remove("--no-outliers")
    k = 7168
    if "--k" in rest:
        at = rest.index("--k")
        k = int(rest[at + 1])
        rest = rest[:at] + rest[at + 2 :]
    time_rows(ptx, [int(v) for v in rest] or [1, 64, 512, 1024, 4096], k)


if __name__ == "__main__":
    main(sys.argv[1:])
