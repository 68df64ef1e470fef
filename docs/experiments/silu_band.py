"""Which gates need SiLU's arithmetic: a CPU study for a table-driven fused SiLU (session 7).

For every finite bfloat16 and float16 gate g, round_to_input(silu(g)) by the defined float32
arithmetic (fp8_group_quant.activation, docs/spec.md section 2a) is compared with three rules
that need no exp: g itself, RN(g / 2) and -0. The gates that no rule gives form, per sign, a band
of exponents; a table of those bands in shared memory plus the rules outside them would give
SiLU in about ten instructions a value instead of about forty (docs/perf.md, fused paths).

Run from the repository root: PYTHONPATH=. python3 docs/experiments/silu_band.py
"""

import ml_dtypes
import numpy as np

from fp8_group_quant import activation


def study(name: str, dtype, mantissa_bits: int) -> None:
    bits = np.arange(65536, dtype=np.uint16)
    g = bits.view(dtype).astype(np.float32)
    finite = np.isfinite(g)
    y = activation.round_to(activation.silu(g), name).astype(dtype).view(np.uint16)
    with np.errstate(invalid="ignore"):
        rules = {
            "g": g.astype(dtype).view(np.uint16),
            "RN(g/2)": (g * np.float32(0.5)).astype(dtype).view(np.uint16),
            "-0": np.full_like(bits, np.float32(-0.0).astype(dtype).view(np.uint16)),
        }
    given = np.zeros(bits.shape, bool)
    for rule in rules.values():
        given |= y == rule
    need = finite & ~given
    exponent = (bits >> mantissa_bits) & ((1 << (15 - mantissa_bits)) - 1)
    sign = bits >> 15
    print(f"{name}: {finite.sum()} finite gates, {need.sum()} need the arithmetic")
    entries = 0
    for s, label in ((0, "g > 0"), (1, "g < 0")):
        e = exponent[need & (sign == s)]
        lo, hi = int(e.min()), int(e.max())
        band = (hi - lo + 1) << mantissa_bits
        entries += band
        low, high = (
            2.0 ** (lo - (127 if mantissa_bits == 7 else 15)),
            2.0 ** (hi + 1 - (127 if mantissa_bits == 7 else 15)),
        )
        print(f"  {label}: biased exponents {lo}-{hi}, |g| in [{low:g}, {high:g}), {band} entries")
        for rule_name, rule in rules.items():
            outside = finite & (sign == s) & ((exponent < lo) | (exponent > hi))
            below, above = outside & (exponent < lo), outside & (exponent > hi)
            for part, where in (("below", below), ("above", above)):
                if where.any() and (y[where] == rule[where]).all():
                    print(f"    every gate {part} the band: {rule_name}")
    print(f"  table: {entries} entries, {2 * entries} bytes")


if __name__ == "__main__":
    study("bfloat16", ml_dtypes.bfloat16, 7)
    study("float16", np.float16, 10)
