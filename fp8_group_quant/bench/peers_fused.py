"""``bench --fused --peers sglang=PATH``: SGLang's fused SiLU-and-multiply quantizer beside ours.

SGLang's v2 per-token-group kernel (``peers``) fuses SiLU-and-multiply with FUSE_SILU_AND_MUL:
x [M, 2N] holds gate then up, one group of 128 per 8 lanes, its NaiveScheduler's grid. It is
compiled with NVRTC as ``peers`` compiles its plain build. For each M (``--m``, else 1, 64,
512, 1024, 4096; N = 7168 unless ``--k``; bf16 -> e4m3, packed column-major UE8M0 scales,
TMA-aligned), by torch CUDA-graph replay over rotating buffers (``bench --fused``'s timing,
each configuration its own graph): the same-traffic roof (``roofline_gated``, as ``bench
--fused``); this library's fused path prepared without PDL and with it; SGLang's kernel (its
kUsePDL build) launched without the PDL attribute and with it, as its JIT host launches it on
SM90. SGLang's SiLU is ``g / (1 + __expf(-g))`` (a fast exponential) where this library's is
the spec's exactly rounded definition, so their codes may differ: the table counts the code
bytes and scale words of SGLang's that differ from this library's on the timed data (ours
being first checked against the NumPy backend, as ``bench --fused`` checks it).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from .. import api
from . import _hooks, peers
from .fused import FUSED_PATHS, OPTIONS, check_gated
from .shapes import own_k, own_m
from .timing import CALLS, ROOFLINE_THREADS, ROTATE_BYTES, cupy_stream, torch_graph_time_us

PEER_FUSED_M = (1, 64, 512, 1024, 4096)
NAME = peers.NAME.replace("true, true, false, true>", "true, true, true, true>")


def run(args, sglang_path: str) -> list[dict]:
    """The SiLU-and-multiply table of ours and SGLang's, one row per M (none where ``--paths``
    leaves out silu_mul)."""
    import cupy
    import torch

    if "silu_mul" not in set(getattr(args, "paths", None) or FUSED_PATHS):
        return []
    n = own_k(args, 7168)[0]
    device = cupy.cuda.runtime.getDevice()
    roof = _hooks.get_function("roofline.cu", "fgq::roofline_gated", device)
    sglang = peers.sglang_function(sglang_path, NAME)
    print(f"# fused SiLU-and-multiply, N = {n}, bf16 -> e4m3, packed UE8M0; us per call (x roof)")
    print(f"{'M':>6} {'roof':>7} {'ours':>14} {'SGLang':>14} {'ours PDL':>8} {'SGL PDL':>8} "
          f"{'SGLang codes that differ':>24} {'scale words':>12}")  # fmt: skip
    return [row(torch, cupy, sglang, roof, m, n) for m in own_m(args, PEER_FUSED_M)]


def row(torch, cupy, sglang, roof, m: int, n: int) -> dict:
    buffers = max(2, min(32, math.ceil(ROTATE_BYTES / (m * 2 * n * 2))))
    xs = [torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(buffers)]
    for x in xs:  # outlier channels
        x[:, ::97] *= 8
    with _hooks.pdl_launches(False):
        outs = [api.quantize(x, 128, **OPTIONS, activation="silu_mul") for x in xs]
    check_gated(torch, xs[0], outs[0])
    sgl = _SglangFused(torch, sglang, xs, m, n, cupy.cuda.runtime.getDevice())
    code_bytes, scale_words = sgl.differing(outs[0])
    calls = max(buffers, CALLS)

    def ours(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        return lambda: api.quantize(x, 128, **OPTIONS, activation="silu_mul", out=q, scale_out=s)

    times = {"roof": torch_graph_time_us(torch, [_roofline(torch, roof, xs, outs, n, m, i)
                                                 for i in range(calls)])}  # fmt: skip
    for pdl in (False, True):
        with _hooks.pdl_launches(pdl):
            times[f"ours{'_pdl' if pdl else ''}"] = torch_graph_time_us(
                torch, [ours(i) for i in range(calls)]
            )
        times[f"sgl{'_pdl' if pdl else ''}"] = torch_graph_time_us(
            torch, [sgl.call(i, pdl) for i in range(calls)]
        )
    r, words = times["roof"], sgl.words
    print(
        f"{m:>6} {r:>7.2f} {times['ours']:>7.2f} ({times['ours'] / r:.2f}) {times['sgl']:>7.2f} "
        f"({times['sgl'] / r:.2f}) {times['ours_pdl']:>8.2f} {times['sgl_pdl']:>8.2f} "
        f"{code_bytes:>9} / {m * n} {scale_words:>6} / {m * words}",
        flush=True,
    )
    return {"peer": "sglang", "path": "silu_mul", "M": m, "N": n, "code_bytes_differing":
            code_bytes, "scale_words_differing": scale_words,
            **{f"{k}_us": v for k, v in times.items()}}  # fmt: skip


def _roofline(torch, roof, xs, outs, n: int, m: int, i: int):
    """The same-traffic roof's launch on buffer ``i`` (as ``bench --fused``'s)."""
    chunks = m * n * 2 // 32  # 16 output bytes per thread
    x, (q, _) = xs[i % len(xs)], outs[i % len(outs)]
    args = (np.uint64(x.data_ptr()), np.uint64(q.data_ptr()), np.int64(chunks),
            np.int64(n * 2 // 32))  # fmt: skip
    grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)

    def launch():
        with cupy_stream(torch):
            roof(grid, (ROOFLINE_THREADS, 1, 1), args)

    return launch


class _SglangFused:
    """SGLang's fused kernel over the rotating inputs, writing outputs of its own."""

    def __init__(self, torch, sglang, xs, m: int, n: int, device: int):
        self.torch, self.sglang, self.xs, self.m, self.n, self.device = (
            torch,
            sglang,
            xs,
            m,
            n,
            device,
        )
        self.tma = -(-m // 4) * 4
        self.words = -(-n // 512)
        self.outs = [
            (torch.empty(m, n, device="cuda", dtype=torch.uint8),
             torch.empty(self.words, self.tma, device="cuda", dtype=torch.int32))
            for _ in range(len(xs))
        ]  # fmt: skip
        groups = m * n // 128
        self.per_block = next(s for s in (16, 8, 4, 2, 1) if groups % s == 0)
        self.blocks, self.threads = groups // self.per_block, self.per_block * 8

    def call(self, i: int, pdl: bool):
        torch = self.torch
        x, (q, s) = self.xs[i % len(self.xs)], self.outs[i % len(self.outs)]
        pointers = [ctypes.c_void_p(t.data_ptr()) for t in (x, q, s)] + [ctypes.c_void_p(0)]
        sizes = [ctypes.c_int(v) for v in (self.per_block, self.n // 128, 0, self.tma, self.m)]
        launch = _hooks.function_launch(
            self.sglang, self.device, (self.blocks, 1, 1), (self.threads, 1, 1), pointers + sizes,
            pdl=pdl,
        )  # fmt: skip
        return lambda: launch(torch.cuda.current_stream().cuda_stream)

    def differing(self, ours) -> tuple[int, int]:
        """SGLang's code bytes and scale words that differ from ours (the NumPy backend's,
        checked before) on the first buffer."""
        torch, m = self.torch, self.m
        self.call(0, False)()
        torch.cuda.synchronize()
        q_ours, s_ours = ours
        q_sgl, s_sgl = self.outs[0]
        code_bytes = int((q_sgl.cpu() != q_ours.view(torch.uint8).cpu()).sum())
        s_ours_words = torch.as_strided(s_ours, (self.words, self.tma), (self.tma, 1))  # storage
        scale_words = int((s_sgl[:, :m].cpu() != s_ours_words[:, :m].cpu()).sum())
        return code_bytes, scale_words
