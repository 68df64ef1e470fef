"""The fused SiLU-and-multiply input, defined op by op in float32 (docs/spec.md, section 2a).

``silu_mul(gate, up)`` is what the kernel computes before it quantizes:
``y = round_to_dtype(round_to_dtype(silu(gate)) * up)``. Every step below is one IEEE float32
operation rounded to nearest even (add, multiply, divide), an exact power-of-two scaling, or an
integer operation, so NumPy and the CUDA kernel (kernels/activation.cuh, the same steps in the
same order) agree bit for bit. No fused multiply-add: NumPy has none in float32.

``exp_parts(x)`` returns ``(m, n)`` with ``exp(x) ~ m * 2**n``: ``k = rint(x * 64 / ln 2)``,
``r = x - k * ln2_hi / 64 - k * ln2_lo / 64`` (Cody and Waite), ``e^r - 1 ~ r + r^2 (1/2 + r/6)``
on ``|r| <= ln 2 / 128``, and ``m = T_hi[j] + (T_lo[j] + T_hi[j] * (e^r - 1))`` with
``2**(j / 64) = T_hi[j] + T_lo[j]``, ``j = k mod 64``, ``n = (k - j) / 64``. Measured error of
``m * 2**n`` against exp: under 0.52 ulp (tests/test_activation.py).

``silu(g)``, with ``e = m * 2**n`` (the scaling done in two exact steps when ``n < -126``):

- ``g >= -64``, ``g`` not NaN: ``e = exp(-min(|g|, 110))`` for ``g >= 0``, ``exp(-g)``
  otherwise, and ``silu = g / (1 + e)``;
- ``-110 <= g < -64``: ``silu = (g * m) * 2**n`` with ``e = exp(g) = m * 2**n`` (``1 + e`` is
  exactly 1 in float32 there, and ``exp(-g)`` would overflow);
- ``g < -110`` (and -Inf): ``-0``, which is ``g * e^g`` rounded;
- NaN: NaN.

Measured error against the exact SiLU: at most 2 ulp over every bfloat16 and float16 input and
sampled float32 inputs. Any NaN that the steps produce (a NaN gate or up, Inf * 0) is the
canonical positive NaN, as GPUs produce it: the quantizer then writes the code of +NaN.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass

import numpy as np

from ._abi import LANE_BYTES
from ._spec import INPUT_TYPES

__all__ = [
    "exp_parts",
    "silu",
    "silu_mul",
    "clamp_gate_up",
    "round_to",
    "EXP_TABLE",
    "BandTable",
    "SILU_BAND",
    "GELU_BAND",
]

F32 = np.float32
TABLE_BITS = 6  # 64 entries
INV_LN2_64 = F32(64 / np.log(2))  # RN(64 / ln 2)
# ln 2 / 64 split: LN2_64_HI has 9 significant bits, so k * LN2_64_HI is exact for |k| < 2**14
LN2_64_HI = F32(np.ldexp(np.round(np.ldexp(np.log(2) / 64, 16)), -16))
LN2_64_LO = F32(np.log(2) / 64 - float(LN2_64_HI))
C2, C3 = F32(0.5), F32(1 / 6)
NEG_LIMIT = F32(-110.0)  # below: silu rounds to -0 (|g| e^g < 2^-150)
SPLIT = F32(-64.0)  # below: silu = g * exp(g), as exp(-g) would pass 2^92
CANONICAL_NAN = np.uint32(0x7FC00000)


def _table() -> np.ndarray:
    """[64, 2] float32: T_hi[j] = RN(2^(j/64)), T_lo[j] = RN(2^(j/64) - T_hi[j]), from 2^(j/64)
    to 50 digits (a float64 exp2 is off by an ulp for j = 29 and 43, which moves T_lo)."""
    context = decimal.Context(prec=50)
    ln2 = context.ln(decimal.Decimal(2))
    rows = []
    for j in range(64):
        exact = context.exp(context.multiply(decimal.Decimal(j) / 64, ln2))
        hi = np.float32(float(exact))
        lo = np.float32(float(context.subtract(exact, decimal.Decimal(float(hi)))))
        rows.append((hi, lo))
    return np.array(rows, np.float32)


EXP_TABLE = _table()


def _power_of_two(e: np.ndarray) -> np.ndarray:
    """2**e as float32 for integer e in [-126, 127], built from its bits."""
    return ((e.astype(np.int64) + 127).astype(np.uint32) << 23).view(F32)


def scale_by_power_of_two(v: np.ndarray, n: np.ndarray) -> np.ndarray:
    """RN(v * 2**n) for n in [-190, 127]: one multiply when n >= -126, else two (v * 2**-64
    exact for the normal v it is given, then the rounding multiply)."""
    n = np.asarray(n, np.int64)
    low = n < -126
    first = np.where(low, _power_of_two(np.full_like(n, -64)), _power_of_two(np.maximum(n, -126)))
    second = _power_of_two(np.where(low, n + 64, 0))
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        return (v * first).astype(F32) * second


def exp_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m, n) with exp(x) ~ m * 2**n, for float32 x in [-110, 110] (see the module)."""
    x = np.asarray(x, F32)
    k = np.rint(x * INV_LN2_64).astype(np.int64)  # ties to even, as cvt.rni
    kf = k.astype(F32)
    r = (x - kf * LN2_64_HI) - kf * LN2_64_LO
    p = r + (r * r) * ((r * C3) + C2)
    j = k & 63
    hi, lo = EXP_TABLE[j, 0], EXP_TABLE[j, 1]
    m = hi + (lo + hi * p)
    return m.astype(F32), (k - j) >> TABLE_BITS


def silu(g: np.ndarray) -> np.ndarray:
    """SiLU of float32 ``g`` as defined in the module docstring (float32 result)."""
    g = np.asarray(g, F32)
    with np.errstate(invalid="ignore"):
        large_negative = g < SPLIT
        x = np.where(g >= 0, -np.minimum(g, F32(110.0)), -g)
        x = np.where(large_negative, np.maximum(g, NEG_LIMIT), x)
        x = np.where(np.isnan(g), F32(0.0), x).astype(F32)
    m, n = exp_parts(x)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        e = scale_by_power_of_two(m, n)
        near = g / (F32(1.0) + e)
        far = scale_by_power_of_two(g * m, n)
        result = np.where(large_negative, far, near)
        result = np.where(g < NEG_LIMIT, F32(-0.0), result)
    return _canonical_nan(result.astype(F32))


# GELU, tanh approximation (docs/spec.md, section 2c) --------------------------------------------
# gelu(g) = 0.5 g (1 + tanh(v)), v = sqrt(2/pi) (g + 0.044715 g^3), is g / (1 + exp(-2v)):
# SiLU's shape, evaluated as g / (1 + e) for g >= 0 and (g * e) / (1 + e) for g < 0 with
# e = exp(-|2v|) <= 1, so 1 + e stays in [1, 2] and nothing cancels. e comes from section 2a's
# table in base 2: w = 2v * 64 / ln 2 is one polynomial in g, e = 2^(x / 64) with
# x = max(-|w|, GELU_W_MIN), k = rint(x), f = x - k (exact), 2^(f/64) - 1 ~ f (P1 + f P2).


def _nearest_float32(exact: decimal.Decimal) -> np.float32:
    """``exact`` rounded to float32 once (nearest, ties to even)."""
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, F32(-np.inf)), guess, np.nextafter(guess, F32(np.inf))]
    return min(candidates, key=lambda c: (abs(decimal.Decimal(float(c)) - exact),
                                          int(c.view(np.uint32)) & 1))  # fmt: skip


def _gelu_constants() -> tuple[np.float32, np.float32]:
    """RN(2 sqrt(2/pi) 64 / ln 2) and RN(2 sqrt(2/pi) 0.044715 * 64 / ln 2), from 50 digits."""
    context = decimal.Context(prec=50)
    pi = decimal.Decimal("3.14159265358979323846264338327950288419716939937510582")
    two = decimal.Decimal(2)
    a = context.multiply(context.multiply(two, context.sqrt(context.divide(two, pi))),
                         context.divide(decimal.Decimal(64), context.ln(two)))  # fmt: skip
    return _nearest_float32(a), _nearest_float32(context.multiply(a, decimal.Decimal("0.044715")))


GELU_A, GELU_B = _gelu_constants()
GELU_GATE_MIN = F32(-16.0)  # below: gelu rounds to -0 (and -Inf * e would be NaN)
GELU_W_MIN = F32(-10240.0)  # 2^(GELU_W_MIN / 64) = 2^-160: e is 0 from well above it
# fitted (least maximum error of m * 2**n against 2**(x / 64), evaluated in float32 with the
# table: under 0.63 ulp, tests/test_activation.py; 0.628 over every j and every f a multiple of
# 2^-24)
GELU_P1 = F32(float.fromhex("0x1.62e484p-7"))
GELU_P2 = F32(float.fromhex("0x1.ebfd44p-15"))


def exp2_64_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m, n) with 2**(x / 64) ~ m * 2**n, for float32 x in [GELU_W_MIN, 0]: ``k = rint(x)``,
    ``f = x - k``, ``p = f * (P1 + f * P2)``, ``m = T_hi[j] + (T_lo[j] + T_hi[j] * p)`` with
    section 2a's table at ``j = k mod 64``, and ``n = (k - j) / 64``."""
    x = np.asarray(x, F32)
    k = np.rint(x).astype(np.int64)  # ties to even
    f = x - k.astype(F32)  # exact
    p = f * (GELU_P1 + f * GELU_P2)
    j = k & 63
    hi, lo = EXP_TABLE[j, 0], EXP_TABLE[j, 1]
    m = hi + (lo + hi * p)
    return m.astype(F32), (k - j) >> TABLE_BITS


def gelu_tanh(g: np.ndarray) -> np.ndarray:
    """``0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3)))`` in float32 steps, as
    ``g / (1 + e)`` for ``g >= 0`` and ``(g * e) / (1 + e)`` for ``g < 0``,
    ``e = exp(-|2v|)`` (the section above)."""
    g = np.asarray(g, F32)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        c = np.maximum(g, GELU_GATE_MIN)  # NaN stays NaN
        w = c * (GELU_A + GELU_B * (c * c))
        x = np.fmax(-np.abs(w), GELU_W_MIN)  # a NaN w gives GELU_W_MIN
        m, n = exp2_64_parts(x)
        e = scale_by_power_of_two(m, n)
        s = np.where(g < 0, c * e, c)
        y = s / (F32(1.0) + e)
    return _canonical_nan(y.astype(F32))


def round_to(values: np.ndarray, input_dtype: str) -> np.ndarray:
    """float32 ``values`` rounded to nearest even in ``input_dtype`` and back (exact)."""
    numpy_dtype = INPUT_TYPES[input_dtype].numpy_dtype
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values, F32).astype(numpy_dtype).astype(F32)


GATES = {"silu_mul": silu, "gelu_tanh_mul": gelu_tanh}  # activation= -> the gate's function


def gated_mul(
    name: str, gate: np.ndarray, up: np.ndarray, input_dtype: str, clamp_limit=None
) -> np.ndarray:
    """``round(round(f(gate)) * up)`` in ``input_dtype`` for the activation ``name``, as float32
    values: the activation rounded to the input dtype, then the product rounded again; with
    ``clamp_limit``, gate and up clamped first (``clamp_gate_up``)."""
    gate, up = np.asarray(gate).astype(F32), np.asarray(up).astype(F32)
    if clamp_limit is not None:
        gate, up = clamp_gate_up(gate, up, clamp_limit, input_dtype)
    s = round_to(GATES[name](gate), input_dtype)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = _canonical_nan(s * np.asarray(up).astype(F32))
    return _canonical_nan(round_to(y, input_dtype))


def clamp_limit_value(clamp_limit: float, input_dtype: str) -> np.float32:
    """The limit as the kernel holds it: float32(clamp_limit) rounded to the input dtype."""
    return round_to(np.array([clamp_limit], F32), input_dtype)[0]


def clamp_gate_up(gate: np.ndarray, up: np.ndarray, clamp_limit: float, input_dtype: str):
    """(min(gate, L), min(max(up, -L), L)) for float32 values of ``input_dtype``, with ``L`` the
    limit rounded to that dtype (docs/spec.md, section 2a, clamp_limit); NaN stays NaN."""
    limit = clamp_limit_value(clamp_limit, input_dtype)
    with np.errstate(invalid="ignore"):
        gate = np.where(gate > limit, limit, gate).astype(F32)
        up = np.where(up > limit, limit, np.where(up < -limit, -limit, up)).astype(F32)
    return gate, up


def silu_mul(gate: np.ndarray, up: np.ndarray, input_dtype: str) -> np.ndarray:
    """``round(round(silu(gate)) * up)`` in ``input_dtype``, returned as float32 values."""
    return gated_mul("silu_mul", gate, up, input_dtype)


def _canonical_nan(values: np.ndarray) -> np.ndarray:
    bits = values.view(np.uint32)
    return np.where(np.isnan(values), CANONICAL_NAN, bits).view(F32)


# bfloat16 gates through a table of results --------------------------------------------------------
# For a bfloat16 gate, round_to(f(g), "bfloat16") is one of 65,536 values, and for SiLU and GELU
# two rules give it outside a band of gates first <= |g| < end, checked for every gate by the
# tests: RN(g / 2) below the band (f(g) ~ g / 2 + g^2 / 4 for SiLU, g / 2 + 0.4 g^2 for GELU),
# max(g, -0) with NaN propagated above it (g for large positive gates, Inf included; -0 for large
# negative ones, -Inf included; NaN for NaN). Inside the band the kernel reads the definition's
# result from a table (for the positive gates past the rule's threshold the entry is g itself,
# which lets both signs share one range check), generated into kernels/band_tables_bf16.cuh by
# tools/gen_band_tables.py and held in shared memory as 4,096 entries (8 KB,
# BandTable.entries): the positive gates' from entry 0, the negative gates' from entry 2048, so
# a gate's entry is its sign bit and 11 bits of |g|'s. BandTable.lookup is that lookup in
# NumPy. The bands, the narrowest outside which the two rules hold for every gate:
# - SiLU: 2^-8 <= |g| < 128, 3,840 entries;
# - GELU: 2^-9 <= |g| < 16, 3,328 entries. RN(g / 2) holds for |g| < 0x1.96p-9 (0.4 g^2 moves
#   the rounding from there), g from 2.75 up; gelu(g) < 0 rounds to bfloat16 values as small
#   as 2^-133 down to g = -10.3 (exp(-|2v|) underflows later than SiLU's e^g), -0 below.

NEGATIVE_ENTRY = 2048  # where the negative gates' entries start (the sign is index bit 11)
BAND_ENTRIES = 4096  # the kernel's copy: any 12-bit index reads inside it


@dataclass(frozen=True)
class BandTable:
    """A gated activation's bfloat16 results over the band ``first <= |g| < end`` (bits of
    |g|), and the lookup with its two rules outside it."""

    activation: str  # its activation= name (GATES)
    first: int  # bits of the smallest |g| in the band
    end: int  # bits of the smallest |g| past it

    @property
    def size(self) -> int:
        """Entries per sign."""
        return self.end - self.first

    def results(self) -> np.ndarray:
        """uint16 [2 * size]: the bfloat16 bits of round(f(g)) for the band's positive gates in
        order of their bits, then its negative gates in order of |g|'s bits."""
        magnitudes = np.arange(self.first, self.end, dtype=np.uint32)
        gates = np.concatenate([magnitudes, magnitudes | 0x8000]).astype(np.uint16)
        bf16 = INPUT_TYPES["bfloat16"].numpy_dtype
        y = round_to(GATES[self.activation](gates.view(bf16).astype(F32)), "bfloat16")
        return y.astype(bf16).view(np.uint16)

    def entries(self, results: np.ndarray | None = None) -> np.ndarray:
        """uint16 [BAND_ENTRIES]: ``results`` (the layout of results()) as the kernel holds
        them, the positive half from entry 0, the negative half from NEGATIVE_ENTRY, zeros
        elsewhere."""
        results = self.results() if results is None else results
        entries = np.zeros(BAND_ENTRIES, np.uint16)
        entries[: self.size] = results[: self.size]
        entries[NEGATIVE_ENTRY : NEGATIVE_ENTRY + self.size] = results[self.size : 2 * self.size]
        return entries

    def lookup(self, gate_bits: np.ndarray, results: np.ndarray | None = None) -> np.ndarray:
        """uint16 bits of round(f(g)) for bfloat16 gates given as uint16 bits, by the kernel's
        lookup (kernels/activation.cuh, BandTable): two gates a 32-bit word in its integer
        steps, the table inside the band, the two rules outside it (a NaN stays NaN)."""
        entries = self.entries(results)
        bf16 = INPUT_TYPES["bfloat16"].numpy_dtype
        flat = np.asarray(gate_bits, np.uint16).reshape(-1)
        h = np.zeros(flat.size + flat.size % 2, np.uint32)
        h[: flat.size] = flat
        word = h[0::2] | (h[1::2] << 16)  # the lower index in the low half, as the kernel loads
        pair = np.uint32(0x10001)
        # t: 0x8000 + |h| - first per half, no carry between them (|h| <= 0x7fff); bit 15 set
        # from the band up, and below 0x8000 + size (the low 11 bits the offset) inside it
        t = (word & np.uint32(0x7FFF7FFF)) + pair * np.uint32(0x8000 - self.first)
        u = t - pair * np.uint32(self.size)  # bit 15: |h| past the band (t >= size: no borrow)
        not_below, in_band = _halves_signs(t), _halves_signs(t & ~u)
        index = t | ((word >> 4) & np.uint32(0x08000800))  # the sign bits to bit 11 of each half
        looked_up = entries[index & 0xFFF].astype(np.uint32)
        looked_up |= entries[(index >> 16) & 0xFFF].astype(np.uint32) << 16
        g = (h << 16).view(F32)
        with np.errstate(invalid="ignore"):
            half = (g * F32(0.5)).astype(bf16).view(np.uint16).astype(np.uint32)
            above = np.maximum(g, F32(-0.0)).astype(bf16).view(np.uint16).astype(np.uint32)
        half_word = half[0::2] | (half[1::2] << 16)
        above_word = above[0::2] | (above[1::2] << 16)
        outside = (not_below & above_word) | (~not_below & half_word)
        result = (in_band & looked_up) | (~in_band & outside)
        halves = np.stack([result & 0xFFFF, result >> 16], axis=-1).reshape(-1)
        return halves[: flat.size].astype(np.uint16).reshape(np.shape(gate_bits))


SILU_BAND = BandTable("silu_mul", 0x3B80, 0x4300)  # 2^-8 <= |g| < 128
GELU_BAND = BandTable("gelu_tanh_mul", 0x3B00, 0x4180)  # 2^-9 <= |g| < 16
BAND_TABLES = (SILU_BAND, GELU_BAND)  # the order of kernels/band_tables_bf16.cuh


def _halves_signs(words: np.ndarray) -> np.ndarray:
    """0xffff in each 16-bit half of ``words`` whose bit 15 is set, else 0 (prmt 0xbb99)."""
    return ((words >> 15) & 1) * np.uint32(0xFFFF) | ((words >> 31) & 1) * np.uint32(0xFFFF0000)


# fused RMSNorm ------------------------------------------------------------------------------------
# y = round(x * rsqrt(mean(x^2) + eps_norm) * weight) over a whole row, x optionally replaced by
# round(x + residual) (written back to residual). The row's sum of squares has one fixed order,
# the one a kernel holding 32 input bytes per lane and 32 lanes per warp reduces in: each lane
# folds its squares in half (value i plus value i + V/2, and so on), each warp folds its 32 lane
# partials in half (what xor shuffles with offsets 16, 8, 4, 2, 1 leave in lane 0), and the warp
# totals are folded in half over 32 slots; missing lanes and warps count as +0, which changes no
# sum of squares. Then mean = total / K, d = mean + eps_norm, r = 1 / sqrt(d) (sqrt and divide
# each correctly rounded: r is within 1 ulp of the exact reciprocal square root), and
# y = round(RN(x * r) * weight). NaN results are the canonical +NaN. The other norm_roundings
# are vLLM's arithmetic: "twice" rounds RN(x * r) to the input dtype before the weight, and
# "twice_unrounded_sum" also normalises the float32 sum x + residual unrounded (the sum written
# back is still rounded).


def _fold_in_half(a: np.ndarray, width: int) -> np.ndarray:
    """Fold the last axis (``width``, a power of two; zero-padded up to it) in half until one
    value is left: a[i] + a[i + width/2], and so on."""
    if a.shape[-1] < width:
        pad = np.zeros((*a.shape[:-1], width - a.shape[-1]), F32)
        a = np.concatenate([a, pad], axis=-1)
    while width > 1:
        width //= 2
        a = (a[..., :width] + a[..., width:]).astype(F32)
    return a[..., 0]


def sum_of_squares(rows: np.ndarray, itemsize: int) -> np.ndarray:
    """The sum of squares of each row of float32 ``rows`` [R, K], in the defined order."""
    r, k = rows.shape
    per_lane = LANE_BYTES // itemsize
    lanes = k // per_lane
    with np.errstate(over="ignore", invalid="ignore"):
        squares = (rows * rows).astype(F32).reshape(r, lanes, per_lane)
        lane_sums = _fold_in_half(squares, per_lane)  # [R, lanes]
        warps = -(-lanes // 32)
        padded = np.zeros((r, warps * 32), F32)
        padded[:, :lanes] = lane_sums
        warp_sums = _fold_in_half(padded.reshape(r, warps, 32), 32)  # [R, warps <= 32]
        return _fold_in_half(warp_sums, 32)


def rsqrt(d: np.ndarray) -> np.ndarray:
    """RN(1 / RN(sqrt(d))) in float32."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (F32(1.0) / np.sqrt(np.asarray(d, F32))).astype(F32)


def rms_norm(
    x: np.ndarray,
    weight: np.ndarray,
    eps_norm: float,
    input_dtype: str,
    residual: np.ndarray | None = None,
    rounding: str = "once",
) -> tuple[np.ndarray, np.ndarray | None]:
    """(y as float32 values of ``input_dtype``, the new residual or None) for ``x`` [..., K];
    ``rounding``: a ``norm_rounding`` value (docs/spec.md, section 2b)."""
    k = x.shape[-1]
    values = np.asarray(x).astype(F32).reshape(-1, k)
    new_residual = None
    if residual is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            added = (values + np.asarray(residual).astype(F32).reshape(-1, k)).astype(F32)
        rounded = _canonical_nan(round_to(added, input_dtype))
        new_residual = rounded.reshape(x.shape)
        values = added if rounding == "twice_unrounded_sum" else rounded
    itemsize = INPUT_TYPES[input_dtype].itemsize
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mean = (sum_of_squares(values, itemsize) / F32(k)).astype(F32)
        r = rsqrt((mean + F32(eps_norm)).astype(F32))
        normalized = (values * r[:, None]).astype(F32)
        if rounding != "once":
            normalized = round_to(normalized, input_dtype)
        y = (normalized * np.asarray(weight).astype(F32)).astype(F32)
    y = _canonical_nan(round_to(_canonical_nan(y), input_dtype))
    return y.reshape(x.shape), new_residual
