"""Experiment (issue 13, session 27, CPU): how near each bfloat16 gate's exact SiLU lies to a
bfloat16 rounding boundary, in float32 steps of its binade. An approximate SiLU whose error is
below a gate's margin rounds to the same bfloat16 value as the exact one there; the counts say
how many of the band's 3,840 gates (2^-8 <= |g| < 128, where kernels/silu_band_bf16.cuh holds
the result) a SiLU accurate to a few float32 steps would still get wrong. The exact SiLU in
float64 (relative error about 2^-52, far below a float32 step). Run from the repository root:

    python3 docs/experiments/silu_band_margins.py
"""

import ml_dtypes
import numpy as np

gates = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
with np.errstate(invalid="ignore"):  # the NaN gates
    g = gates.astype(np.float64)
band = np.isfinite(g) & (np.abs(g) >= 2.0**-8) & (np.abs(g) < 128)
g = g[band]
silu = np.abs(g / (1.0 + np.exp(-g)))
exponent = np.maximum(np.floor(np.log2(silu)), -126)  # float32's binade (subnormals: -126)
step = 2.0 ** (exponent - 23)  # a float32 step there
spacing = 2.0 ** (exponent - 7)  # bfloat16's spacing: boundaries halfway between its values
fraction = silu / spacing - np.floor(silu / spacing)
margin = np.abs(fraction - 0.5) * spacing / step  # float32 steps to the nearest boundary
print(f"{band.sum()} band gates; nearest boundary {margin.min():.3f} float32 steps away")
for steps in (1, 2, 4, 8, 16, 32, 64, 128):
    print(f"within {steps:>3} steps: {int((margin < steps).sum()):>3} gates")
for i in np.argsort(margin)[:6]:
    print(f"  g = {float(g[i]):>12}: silu {g[i] / (1 + np.exp(-g[i])):.9g}, {margin[i]:.3f} steps")
