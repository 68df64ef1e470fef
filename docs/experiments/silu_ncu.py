"""Experiment (issue 13, session 21): the one-pass fused SiLU kernel and SGLang's, one launch
each, for Nsight Compute.

At M (default 1024), N = 7168, bf16 -> e4m3, packed UE8M0 scales: this library's fused
SiLU-and-multiply and SGLang's v2 per-token-group kernel with FUSE_SILU_AND_MUL (PATH: its
source, as for sglang_fused.py), each launched twice (a warm-up, then the one to profile),
ours first. From the repository root, on the GPU machine:

    ncu --clock-control none -k regex:"quantize_groups|per_token_group" --launch-skip 2 \
        --launch-count 2 --section SpeedOfLight --section WarpStateStats ... \
        python3 docs/experiments/silu_ncu.py PATH [M]
"""

import ctypes
import sys

import sglang_fused  # this directory's
import sglang_same_run

from fp8_group_quant import _jit, _launch, api
from fp8_group_quant.bench_fused import OPTIONS


def main(argv) -> None:
    import cupy
    import torch

    path, m, n = argv[0], int(argv[1]) if len(argv) > 1 else 1024, 7168
    x = torch.randn(m, 2 * n, device="cuda", dtype=torch.bfloat16) * 3
    x[:, ::97] *= 8  # outlier channels
    device = cupy.cuda.runtime.getDevice()
    sglang = sglang_same_run.sglang_function(path, sglang_fused.NAME)
    tma, words = -(-m // 4) * 4, -(-n // 512)
    q = torch.empty(m, n, device="cuda", dtype=torch.uint8)
    s = torch.empty(words, tma, device="cuda", dtype=torch.int32)
    groups = m * n // 128
    per_block = next(b for b in (16, 8, 4, 2, 1) if groups % b == 0)
    pointers = [ctypes.c_void_p(t.data_ptr()) for t in (x, q, s)] + [ctypes.c_void_p(0)]
    sizes = [ctypes.c_int(v) for v in (per_block, n // 128, 0, tma, m)]
    with _jit.current_device(device):
        launch = _launch.KernelLaunch(
            sglang.kernel.ptr, (groups // per_block, 1, 1), (per_block * 8, 1, 1),
            pointers + sizes, pdl=False,
        )  # fmt: skip
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(2):  # a warm-up each, then the launches to profile
        api.quantize(x, 128, **OPTIONS, activation="silu_mul")
        launch(stream)
    torch.cuda.synchronize()
    print(f"profiled: ours then SGLang's, M = {m}, N = {n}")


if __name__ == "__main__":
    main(sys.argv[1:])
