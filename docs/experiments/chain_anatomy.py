"""Where the time over the roofline goes at mid M and in the fused RMSNorm: one launch of each
to profile with Nsight Compute's warp-state and scheduler sections (session 7).

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section LaunchStats -k regex:"quantize|roofline" \
        python3 docs/experiments/chain_anatomy.py

The launches: the roofline kernel and the default quantizer (bf16, G = 128, e4m3, packed UE8M0,
one pass) at M = 512, K = 7168, where ours runs about 0.47 us over the roofline as from M = 64 to
1024 (docs/perf.md, open gaps); then the fused RMSNorm without the residual at M = 4096, which
measured no faster with three resident rows per SM than with two (step 20). Run from the
repository root with PYTHONPATH=. (logs/ncu-chain-anatomy-h200.log)
"""


def profile() -> None:
    import cupy
    import ml_dtypes
    import numpy as np

    from fp8_group_quant import _jit, api

    rng = np.random.default_rng(0)
    x = cupy.asarray((rng.standard_normal((512, 7168)) * 3).astype(ml_dtypes.bfloat16))
    q, _ = api.quantize(x, 128, scale="ue8m0", layout="packed")
    roofline = _jit.get_function("roofline.cu", "fgq::roofline_copy", cupy.cuda.runtime.getDevice())
    chunks = x.size * 2 // 32
    roofline((-(-chunks // 256), 1, 1), (256, 1, 1), (x, q, np.int64(chunks)))
    rows = cupy.asarray((rng.standard_normal((4096, 7168)) * 3).astype(ml_dtypes.bfloat16))
    weight = cupy.asarray(rng.standard_normal(7168).astype(ml_dtypes.bfloat16))
    api.quantize(rows, 128, scale="ue8m0", layout="packed", norm=(weight, 1e-6))
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    profile()
