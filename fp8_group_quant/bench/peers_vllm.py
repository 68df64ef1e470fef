"""``bench --fused --peers vllm=PTX``: vLLM's fused RMSNorm and SiLU-and-multiply FP8 group
quantizers beside ours.

vLLM's custom ops ``rms_norm_per_block_quant`` and ``silu_and_mul_per_block_quant``
(``csrc/quantization/fused_kernels/``) are the fused quantizers with groups that its engines call
before a block-scaled FP8 GEMM; both write float32 scales, optionally transposed (MN-major, as
DeepGEMM on Hopper reads them). The RMSNorm kernel runs a block a token and reads the row three
times (sum of squares, group maxima, codes); the SiLU kernel takes a block a (token, group) below
3072 groups, else a 16-byte-lane kernel of 256-thread blocks. Their source is not in this
package. Two steps:

1. On a machine with nvcc and torch's headers (the kernels use torch's header-only BFloat16 and
   Float8_e4m3fn types and CUB), build PTX from the ``vllm`` sdist on PyPI (0.34.0 here;
   ``tar xzf vllm-0.34.0.tar.gz vllm-0.34.0/csrc``)::

       python -m fp8_group_quant.bench.peers_vllm VLLM_CSRC OUT.ptx

   which takes the kernel templates from fused_layernorm_dynamic_per_token_quant.cu and
   fused_silu_mul_block_quant.cu as they are (their host code left out), and instantiates them
   for bfloat16 -> e4m3, groups of 128, transposed scales (the RMSNorm with and without the
   residual), compiled as vLLM's build compiles them (nvcc -O3, relaxed constexpr; no fast math).

2. On the GPU: ``python -m fp8_group_quant bench --fused --peers vllm=OUT.ptx [--m M ...]
   [--k K]`` times, by CUDA-graph replay over rotating buffers as ``bench --fused`` does (K = N =
   7168 by default; every launch without PDL): the same-traffic roofs of ``bench --fused``; this
   library's fused paths with packed UE8M0 scales (the README's figures) and with float32 scales
   in the ``col`` layout (vLLM's output form); vLLM's kernels launched as its host launches
   them. Their arithmetic is not the spec's: the RMSNorm rounds x * r to bfloat16 before the
   weight multiply and takes rsqrtf; the SiLU is g / (1 + expf(-g)) times up with no rounding
   between (docs/spec.md, sections 2a and 2b). So the table counts, on fresh data before
   timing, the codes and scales of vLLM's that differ from this library's float-scale output
   (and the residual words written back). ``--paths`` picks the SiLU and the norm rows.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np

from .. import api
from . import _hooks
from .fused import FUSED_PATHS, OPTIONS
from .peers_fused import PEER_FUSED_M
from .shapes import own_k, own_m
from .timing import CALLS, ROOFLINE_THREADS, ROTATE_BYTES, cupy_stream, torch_graph_time_us

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
FLOAT_COL: dict = dict(scale="float32", layout="col")  # vLLM's output form


# step 1: the PTX, from vLLM's source ------------------------------------------------------------


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


# step 2: the tables -----------------------------------------------------------------------------


def run(args, ptx: str) -> list[dict]:
    """vLLM's SiLU rows, then its RMSNorm rows (without and with the residual), per M."""
    import cupy
    import torch

    k = own_k(args, 7168)[0]
    paths = set(getattr(args, "paths", None) or FUSED_PATHS)
    module = cupy.RawModule(path=ptx)
    names = entries(ptx)
    # the RMSNorm's has_residual is its third template argument
    norm = {("Lb1ELb1E" in n): module.get_function(n) for n in names if "rms_norm" in n}
    silu = {("vec" in n): module.get_function(n) for n in names if "silu" in n}
    device = cupy.cuda.runtime.getDevice()
    roofs = {
        name: _hooks.get_function("roofline.cu", f"fgq::roofline_{name}", device)
        for name in ("residual", "copy", "gated")
    }
    head = (f"{'roof':>7} {'ours packed':>14} {'ours col':>14} {'vLLM':>14} {'vLLM/ours':>9} "
            f"{'codes that differ':>20} {'scales':>14}")  # fmt: skip
    m_values = own_m(args, PEER_FUSED_M)
    rows = []
    if "silu_mul" in paths:
        print(f"# fused SiLU-and-multiply, N = {k}, bf16 -> e4m3, groups of 128; us (x roof), "
              "no PDL")  # fmt: skip
        print(f"{'M':>6} {head}")
        rows += [_silu_row(torch, silu, roofs["gated"], m, k) for m in m_values]
    residuals = [r for r, path in ((False, "rms_norm"), (True, "add_rms_norm")) if path in paths]
    if residuals:
        print(f"# fused RMSNorm, K = {k}, bf16 -> e4m3, groups of 128; us (x roof), no PDL")
        print(f"{'M':>6} {'residual':>8} {head} {'residual words':>16}")
        for m in m_values:
            rows += [_norm_row(torch, norm[r], roofs, m, k, r) for r in residuals]
    return rows


def _inputs(torch, m: int, width: int, buffers: int) -> list:
    xs = [torch.randn(m, width, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(buffers)]
    for x in xs:  # outlier channels
        x[:, ::97] *= 8
    return xs


def _times(torch, makers: dict, calls: int) -> dict:
    with _hooks.pdl_launches(False):
        return {
            n: torch_graph_time_us(torch, [make(i) for i in range(calls)])
            for n, make in makers.items()
        }


def _cells(times: dict, codes: int, values: int, scales: int, groups: int) -> str:
    roof = times["roof"]
    cells = " ".join(f"{times[n]:>7.2f} ({times[n] / roof:.2f})" for n in ("packed", "col", "vllm"))
    return (f"{roof:>7.2f} {cells} {times['vllm'] / times['packed']:>9.2f} "
            f"{codes:>9} / {values:<10} {scales:>5} / {groups:<6}")  # fmt: skip


def _on_torch_stream(torch, kernel, grid, block, args):
    """A launch of a CuPy function on torch's current stream (the capture stream)."""

    def launch():
        with cupy_stream(torch):
            kernel(grid, block, args)

    return launch


def _ours(xs, outs, opts, **extra):
    buffers = len(xs)

    def make(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        more = {key: (v(i) if callable(v) else v) for key, v in extra.items()}
        return lambda: api.quantize(x, 128, **opts, **more, out=q, scale_out=s)

    return make


def _row(path: str, m: int, k: int, residual, times: dict, differ: dict) -> dict:
    return {"peer": "vllm", "path": path, "M": m, "K": k, "residual": residual,
            **{f"{name}_us": v for name, v in times.items()}, **differ}  # fmt: skip


def _silu_row(torch, kernels, roof, m: int, n: int) -> dict:
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
            return _on_torch_stream(torch, kernels[True], (blocks, 1, 1), (256, 1, 1),
                                    (*head, np.int32(groups), np.int64(m)))  # fmt: skip
        return _on_torch_stream(torch, kernels[False], (m, groups, 1), (128, 1, 1), head)

    q_ours, s_ours = api.quantize(xs[0], 128, **FLOAT_COL, activation="silu_mul")
    vllm_call(0)()
    torch.cuda.synchronize()
    codes = int((q_ours.view(torch.uint8) != vq[0]).sum())
    scales = int((s_ours.T != vs[0]).sum())
    outs = {
        name: [api.quantize(x, 128, **opts, activation="silu_mul") for x in xs]
        for name, opts in (("packed", OPTIONS), ("col", FLOAT_COL))
    }
    chunks = m * n * 2 // 32  # as bench --fused's gated roof: 16 output bytes a thread

    def roofline(i):
        x, q = xs[i % buffers], vq[i % buffers]
        args = (np.uint64(x.data_ptr()), np.uint64(q.data_ptr()), np.int64(chunks),
                np.int64(n * 2 // 32))  # fmt: skip
        grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)
        return _on_torch_stream(torch, roof, grid, (ROOFLINE_THREADS, 1, 1), args)

    makers = {
        "roof": roofline,
        "packed": _ours(xs, outs["packed"], OPTIONS, activation="silu_mul"),
        "col": _ours(xs, outs["col"], FLOAT_COL, activation="silu_mul"),
        "vllm": vllm_call,
    }
    times = _times(torch, makers, max(buffers, CALLS))
    print(f"{m:>6} {_cells(times, codes, m * n, scales, m * groups)}", flush=True)
    return _row("silu_mul", m, n, None, times, {"codes_differing": codes,
                                                "scales_differing": scales})  # fmt: skip


def _norm_row(torch, kernel, roofs, m: int, k: int, residual: bool) -> dict:
    eps = 1e-6
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
        return _on_torch_stream(torch, kernel, (m, 1, 1), (threads, 1, 1), args)

    differ = _norm_differ(torch, vllm_call, xs[0], rs[0], weight, eps, residual, vq[0], vs[0])
    outs = {
        name: [api.quantize(x, 128, **opts) for x in xs]
        for name, opts in (("packed", OPTIONS), ("col", FLOAT_COL))
    }
    # the roof writes x ^ residual (Inf and NaN in most groups) into a residual of its own
    # (shared, the paths timed after it ran on NaNs)
    roof_rs = [r.clone() for r in rs]
    roofline = _norm_roofline(torch, roofs, xs, roof_rs, vq, m * k // 16, residual)

    def residual_of(i):
        return rs[i % buffers] if residual else None

    norm = dict(norm=(weight, eps), residual=residual_of)
    makers = {
        "roof": roofline,
        "packed": _ours(xs, outs["packed"], OPTIONS, **norm),
        "col": _ours(xs, outs["col"], FLOAT_COL, **norm),
        "vllm": lambda i: vllm_call(i % buffers, xs[i % buffers], rs[i % buffers]),
    }
    times = _times(torch, makers, max(buffers, CALLS))
    codes, scales, words = differ.values()
    cells = _cells(times, codes, m * k, scales, m * groups)
    print(f"{m:>6} {'yes' if residual else 'no':>8} {cells} {words:>7} / {m * k:<8}", flush=True)
    return _row("add_rms_norm" if residual else "rms_norm", m, k, residual, times, differ)


def _norm_differ(torch, vllm_call, x, r, weight, eps, residual, vq, vs) -> dict:
    """vLLM's codes, scales and residual against ours (float scales, col) on the same input."""
    x0, r_ours, r_vllm = x.clone(), r.clone(), r.clone()
    q_ours, s_ours = api.quantize(
        x0, 128, **FLOAT_COL, norm=(weight, eps), residual=r_ours if residual else None
    )
    vllm_call(0, x0, r_vllm)()
    torch.cuda.synchronize()
    codes = int((q_ours.view(torch.uint8) != vq).sum())
    scales = int((s_ours.T != vs).sum())
    words = int((r_ours.view(torch.int16) != r_vllm.view(torch.int16)).sum()) if residual else 0
    return {"codes_differing": codes, "scales_differing": scales,
            "residual_words_differing": words}  # fmt: skip


def _norm_roofline(torch, roofs, xs, roof_rs, vq, chunks: int, residual: bool):
    """``bench --fused``'s norm roof, writing vLLM's code buffers."""
    buffers = len(xs)

    def roofline(i):
        x, r, q = xs[i % buffers], roof_rs[i % buffers], vq[i % buffers]
        pointers = (x, r, q) if residual else (x, q)
        args = (*(np.uint64(t.data_ptr()) for t in pointers), np.int64(chunks))
        grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)
        name = "residual" if residual else "copy"
        return _on_torch_stream(torch, roofs[name], grid, (ROOFLINE_THREADS, 1, 1), args)

    return roofline


def main(argv: list[str]) -> None:
    """``python -m fp8_group_quant.bench.peers_vllm VLLM_CSRC OUT.ptx``: step 1."""
    if len(argv) != 2:
        raise SystemExit(__doc__)
    build(argv[0], argv[1])


if __name__ == "__main__":
    main(sys.argv[1:])
