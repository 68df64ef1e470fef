"""Where the fused kernels' time goes: one launch of each to profile with Nsight Compute.

    ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
        -k regex:quantize python3 docs/experiments/fused_anatomy.py

The kernels: the plain default (bf16, G = 128, e4m3, packed UE8M0, one pass), the same with
fused SiLU-and-multiply, RMSNorm without and with the residual, and the masked kernel with and
without SiLU, each launched once at the bench sizes (M = 4096, N = K = 7168 for the first four;
E = 32, T = 1024, 5% of the rows for the masked ones). With `--metrics smsp__inst_executed.sum`
the instructions per value are that sum times 32 over M * K (docs/perf.md, fused step 5).
Run from the repository root with PYTHONPATH=. (logs/ncu-fused-h200.log)
"""


def profile() -> None:
    import cupy
    import ml_dtypes
    import numpy as np

    from fp8_group_quant import api

    rng = np.random.default_rng(0)
    x = cupy.asarray((rng.standard_normal((4096, 2 * 7168)) * 3).astype(ml_dtypes.bfloat16))
    api.quantize(x[:, :7168], 128, scale="ue8m0", layout="packed")
    api.quantize(x, 128, scale="ue8m0", layout="packed", activation="silu_mul")
    weight = cupy.asarray((rng.standard_normal(7168)).astype(ml_dtypes.bfloat16))
    residual = cupy.ascontiguousarray(x[:, 7168:])
    api.quantize(x[:, :7168], 128, scale="ue8m0", layout="packed", norm=(weight, 1e-6))
    api.quantize(x[:, :7168], 128, scale="ue8m0", layout="packed", norm=(weight, 1e-6),
                 residual=residual)  # fmt: skip
    experts = cupy.asarray((rng.standard_normal((32, 1024, 2 * 7168))).astype(ml_dtypes.bfloat16))
    counts = cupy.asarray(rng.multinomial(1638, [1 / 32] * 32).astype(np.int32))
    api.quantize(experts[..., :7168], 128, scale="ue8m0", layout="packed", masked_m=counts)
    api.quantize(experts, 128, scale="ue8m0", layout="packed", masked_m=counts,
                 activation="silu_mul")  # fmt: skip
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    profile()
