"""Experiment (issue 13, session 21): does the one-pass SiLU table copy suffer from every block
reading the same 8 KB of L2?

With the kernel tree of `silu_replicas.patch` (it applies to 198fd1e; FP8_GROUP_QUANT_KERNEL_DIR
at its kernels/), a block of the one-pass bfloat16 SiLU kernel reads its table from replica
(blockIdx.x % R) of R copies at Params.weight (R in Params.global_mode) when weight is set. This
script fills 132 copies of the table in one device buffer, sets those fields in every plan it
prepares and times the library's fused SiLU-and-multiply (N = 7168, bf16 -> e4m3, packed UE8M0
scales, graph replay over rotating buffers, as `bench --fused`) without PDL and with it, for
R = none (the module's own table), 4, 8, 16 and 32, in one process, each result first checked
against the NumPy backend. With the library's tree (which ignores the fields) every column
times the same kernel: the control. From the repository root:

    PYTHONPATH=$PWD python3 docs/experiments/silu_replicas.py [M ...]
"""

import math
import sys

import numpy as np

from fp8_group_quant import _launch, activation, api
from fp8_group_quant.bench import pdl_launches
from fp8_group_quant.bench_fused import OPTIONS, ROTATE_BYTES, _check, torch_graph_time_us

CONFIGS = [("module", 0), ("4/block", 4), ("8/block", 8), ("16/block", 16), ("32/block", 32),
           ("module", 0)]  # fmt: skip
STATE = {"ptr": 0, "replicas": 0}
_make_params = _launch.make_params


def make_params(request, **pointers):
    """The library's Params, with the replicas' address and count where set."""
    params = _make_params(request, **pointers)
    if STATE["ptr"]:
        params.weight = STATE["ptr"]
        params.global_mode = STATE["replicas"]
    return params


def call(x, q, s):
    """One fused call into the given outputs."""
    return lambda: api.quantize(x, 128, **OPTIONS, activation="silu_mul", out=q, scale_out=s)


def main(argv) -> None:
    import cupy
    import torch

    _launch.make_params = make_params
    ms = [int(a) for a in argv] or [256, 512, 1024, 2048]
    n = 7168
    words = activation.silu_band_entries().view(np.uint32)  # the kernel's 2,048 words
    replicas = cupy.asarray(np.tile(words, 132))
    print("# the library's fused SiLU, us without PDL / with it; N = 7168, bf16 -> e4m3, packed")
    print(f"{'M':>6} " + " ".join(f"{name:>15}" for name, _ in CONFIGS))
    for m in ms:
        buffers = max(2, min(32, math.ceil(ROTATE_BYTES / (m * 2 * n * 2))))
        xs = [torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16) for _ in range(buffers)]
        for x in xs:  # randn x 3, outlier channels x 8 more
            x *= 3
            x[:, ::97] *= 8
        calls = max(buffers, 32)
        cells = []
        for _, r in CONFIGS:
            STATE["ptr"], STATE["replicas"] = (replicas.data.ptr if r else 0), r
            with pdl_launches(False):
                outs = [api.quantize(x, 128, **OPTIONS, activation="silu_mul") for x in xs]
            _check(torch, xs[1], outs[1])
            times = []
            for pdl in (False, True):
                with pdl_launches(pdl):  # a plan cache of its own: plans made with STATE as now
                    launches = [call(xs[i % buffers], *outs[i % buffers]) for i in range(calls)]
                    times.append(torch_graph_time_us(torch, launches))
            cells.append(f"{times[0]:>7.2f}/{times[1]:<7.2f}")
        print(f"{m:>6} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
