"""An independent model of docs/spec.md sections 1 to 6, one group and one value at a time.

It shares nothing with the NumPy backend (``fp8_group_quant.reference``) or the registries it
reads: the table of section 4 and the layout table of section 6 are written out again here, each
float32 step is a Python float rounded to float32, and ``convert`` rounds by searching the
format's grid of values for the nearest one (ties to the even code) instead of casting. The only
things borrowed are ml_dtypes' decoding of the 256 codes of each float8 format into values and
numpy's float32 rounding of a Python float.
"""

from __future__ import annotations

import bisect
import decimal
import math
import struct
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import ml_dtypes
import numpy as np

UE8M0_FLOOR_BITS = 0x2EDBE6FF  # F = float32(1e-10), section 3
MIN_NORMAL = 2.0**-126


def f32(value: float) -> float:
    """``value`` rounded to float32 (RNE, subnormals kept, overflow to +-Inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


# section 4: the output formats -------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    name: str
    fmax: float  # the clamp
    nan_codes: tuple[int, int]  # +NaN, -NaN
    inf_codes: tuple[int, int]  # +Inf, -Inf
    negative_zero: int  # the code of a result that would be -0
    element: Any  # ml_dtypes type decoding the codes, or None for int8
    sign_bit: int = 0x80  # the code's sign bit (e2m1's is bit 3)

    @cached_property
    def grid(self) -> tuple[list[float], list[int]]:
        """(values, codes) of the non-negative finite values up to fmax, ascending."""
        if self.element is None:
            return [float(i) for i in range(128)], list(range(128))
        decoded = np.arange(self.sign_bit, dtype=np.uint8).view(self.element).astype(np.float64)
        pairs = sorted(
            (float(v), code) for code, v in enumerate(decoded) if np.isfinite(v) and v <= self.fmax
        )
        return [v for v, _ in pairs], [c for _, c in pairs]

    def convert(self, t: float) -> int:
        """The code of float32 ``t`` (already clamped to +-fmax): nearest value, ties to the even
        code (the even mantissa; for int8 the even integer)."""
        values, codes = self.grid
        magnitude = abs(t)
        i = bisect.bisect_left(values, magnitude)
        if values[i] == magnitude:
            code = codes[i]
        else:
            low, high = i - 1, i
            middle = (values[low] + values[high]) / 2  # exact: few significant bits
            if magnitude != middle:
                code = codes[low] if magnitude < middle else codes[high]
            else:
                code = codes[low] if codes[low] % 2 == 0 else codes[high]
        if math.copysign(1.0, t) > 0:
            return code
        if code == 0:
            return self.negative_zero
        return (-code) & 0xFF if self.element is None else code | self.sign_bit


FORMATS = {
    f.name: f
    for f in (
        Format("e4m3", 448.0, (0x7F, 0xFF), (0x7E, 0xFE), 0x80, ml_dtypes.float8_e4m3fn),
        Format("e5m2", 57344.0, (0x7E, 0xFE), (0x7C, 0xFC), 0x80, ml_dtypes.float8_e5m2),
        Format("int8", 127.0, (0x00, 0x00), (0x7F, 0x81), 0x00, None),
        Format("e4m3fnuz", 224.0, (0x80, 0x80), (0x7E, 0xFE), 0x00, ml_dtypes.float8_e4m3fnuz),
        # section 4b's element format: codes 0-15, NaN +0, +-Inf +-6
        Format("e2m1", 6.0, (0x0, 0x0), (0x7, 0xF), 0x8, ml_dtypes.float4_e2m1fn, sign_bit=0x8),
    )
}


# section 3: one group ---------------------------------------------------------------------------


def ue8m0_exponent(scale: float) -> int:
    """The byte ``e`` of a power-of-two scale ``2^(e-127)``."""
    mantissa, exponent = math.frexp(scale)
    assert mantissa == 0.5, scale
    return exponent - 1 + 127


# the OCP MX emax_elem of the formats scale_rule="floor" takes (section 3, item 6)
EMAX_ELEM = {"e4m3": 8, "e5m2": 15, "e2m1": 2}


def scalar_group(values, fmt, ue8m0, eps, rule="rceil", arithmetic="float32"):
    """Codes (ints) and scale (a float) of one group of float32 ``values`` (Python floats);
    ``arithmetic`` "reciprocal" or "multiplier" takes section 3c's steps for float scales."""
    spec = FORMATS[fmt]
    amax = max([f32(eps)] + [abs(v) for v in values if math.isfinite(v)])
    y = f32(amax / spec.fmax)  # double rounding is innocuous for one division
    if ue8m0 and rule == "floor":
        _, exponent = math.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1)
        power = max(exponent - 1 - EMAX_ELEM[fmt], -126)  # floor(log2 amax) - emax_elem
        scale = 2.0**power
        scaled = [f32(v * 2.0**-power) for v in values]
    elif ue8m0:
        y = max(y, struct.unpack("<f", struct.pack("<I", UE8M0_FLOOR_BITS))[0])
        mantissa, exponent = math.frexp(y)  # y = mantissa * 2**exponent, mantissa in [0.5, 1)
        power = exponent - 1 if mantissa == 0.5 else exponent  # the exact ceiling
        scale = 2.0**power
        scaled = [f32(v * 2.0**-power) for v in values]  # exact in double, then rounded
    elif arithmetic == "reciprocal":  # section 3c: s = RN(amax * RN(1 / fmax)), times RN(1 / s)
        scale = f32(amax * f32(1.0 / spec.fmax))
        factor = f32(1.0 / scale)
        scaled = [f32(v * factor) for v in values]
    elif arithmetic == "multiplier":  # section 3c: times r = RN(fmax / amax), s = RN(1 / r)
        factor = f32(spec.fmax / amax)
        scale = f32(1.0 / factor)
        scaled = [f32(v * factor) for v in values]
    else:
        scale = y
        scaled = [f32(v / scale) for v in values]
    codes = []
    for v, t in zip(values, scaled):
        negative = math.copysign(1.0, v) < 0
        if math.isnan(v):
            codes.append(spec.nan_codes[negative])
        elif math.isinf(v):
            codes.append(spec.inf_codes[negative])
        else:
            codes.append(spec.convert(min(max(t, -spec.fmax), spec.fmax)))
    return codes, scale


# sections 1 and 6: shapes, layouts and storage ---------------------------------------------------


def align4(value: int) -> int:
    return -(-value // 4) * 4


@dataclass(frozen=True)
class Storage:
    """What one call owns, from section 6's table."""

    shape: tuple[int, ...]
    group_size: int
    layout: str
    pad_rows: bool

    @property
    def batches(self) -> int:
        return self.shape[0] if len(self.shape) >= 3 else 1

    @property
    def inner(self) -> tuple[int, ...]:
        return self.shape[1:-1] if len(self.shape) >= 3 else self.shape[:-1]

    @property
    def rows(self) -> int:
        return math.prod(self.inner)

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def groups(self) -> int:
        return self.k // self.group_size

    @property
    def tma(self) -> int:
        return align4(self.rows)

    @property
    def packed(self) -> bool:
        return self.layout in ("packed", "packed_row", "packed_col")

    @property
    def words(self) -> int:
        """Words per row: ng, or kp = ceil(ng / 4) in the packed layouts."""
        return -(-self.groups // 4) if self.packed else self.groups

    @property
    def q_rows(self) -> int:
        return self.tma if self.pad_rows else self.rows

    @property
    def q_bytes(self) -> int:
        return self.batches * self.q_rows * self.k

    @property
    def scale_rows(self) -> int:
        return self.tma if self.layout in ("col_tma", "packed") else self.rows

    @property
    def scale_words(self) -> int:
        return self.batches * self.scale_rows * self.words

    @property
    def scale_dtype(self) -> str:
        return "int32" if self.packed else "float32"

    def word_strides(self) -> tuple[int, int, int]:
        """(batch, row, word) strides in words."""
        per_batch = self.scale_rows * self.words
        if self.layout in ("row", "packed_row"):
            return per_batch, self.words, 1
        return per_batch, 1, self.scale_rows  # col: M; col_tma and packed: tma

    def _nested(self, row: int, batch: int) -> tuple[int, ...]:
        strides, stride = [], row
        for extent in reversed(self.inner):
            strides.append(stride)
            stride *= extent
        return ((batch,) if len(self.shape) >= 3 else ()) + tuple(reversed(strides))

    @property
    def q_strides(self) -> tuple[int, ...]:
        return self._nested(self.k, self.q_rows * self.k) + (1,)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        return self.shape[:-1] + (self.words,)

    @property
    def scale_strides(self) -> tuple[int, ...]:
        batch, row, word = self.word_strides()
        return self._nested(row, batch) + (word,)

    def scale_offset(self, b: int, m: int, g: int) -> int:
        """Byte offset of the scale of group ``g`` of row ``m`` of batch ``b``."""
        batch, row, word = self.word_strides()
        if self.packed:
            return 4 * (b * batch + m * row + (g // 4) * word) + g % 4
        return 4 * (b * batch + m * row + g * word)


def quantize(x, group_size, fmt, scale, eps, rule="rceil", arithmetic="float32"):
    """(codes, scales) of ``x`` [..., K]: uint8 codes of ``x``'s shape and the float scales
    [..., K / group_size], group by group (``arithmetic``: scalar_group's)."""
    values = np.asarray(x).astype(np.float32)
    k = values.shape[-1]
    groups = values.reshape(-1, group_size).tolist() if k else []
    codes = np.zeros(values.size, np.uint8).reshape(-1, group_size)
    scales = np.zeros(len(groups), np.float64)
    for i, group in enumerate(groups):
        codes[i], scales[i] = scalar_group(group, fmt, scale == "ue8m0", eps, rule, arithmetic)
    return codes.reshape(values.shape), scales.reshape(values.shape[:-1] + (k // group_size,))


def expected_storage(codes, scales, storage: Storage):
    """(q bytes, scale bytes): every byte of the storage a call owns, padding zero, with the
    model's ``codes`` and ``scales`` at the places section 6 gives them."""
    b, m = storage.batches, storage.rows
    q = np.zeros((b, storage.q_rows, storage.k), np.uint8)
    q[:, :m] = codes.reshape(b, m, storage.k)
    return q.reshape(-1), expected_scale_bytes(scales, storage)


def expected_scale_bytes(scales, storage: Storage) -> np.ndarray:
    """Every byte of the scale storage of ``storage``, padding zero, ``scales`` (floats, one per
    group) at the places section 6 gives them."""
    b, m, ng = storage.batches, storage.rows, storage.groups
    scale_bytes = np.zeros(storage.scale_words * 4, np.uint8)
    scales = np.asarray(scales).reshape(b, m, ng)
    for bi, mi, gi in np.ndindex(b, m, ng):
        offset = storage.scale_offset(bi, mi, gi)
        s = float(scales[bi, mi, gi])
        if storage.packed:
            scale_bytes[offset] = ue8m0_exponent(s)
        else:
            scale_bytes[offset : offset + 4] = list(struct.pack("<f", s))
    return scale_bytes


# sections 4c and 4d: weight blocks and token groups -----------------------------------------

WEIGHT_BLOCK = 128


def quantize_weight(w, fmt, scale, eps, rule="rceil", arithmetic="float32", block=WEIGHT_BLOCK):
    """(codes uint8 [E, N, K], block scales float64 [E, nb, kb]) of ``w`` ``[N, K]`` or
    ``[E, N, K]``: each block of ``block`` x ``block`` values that exist is one group of
    section 3 (or of section 3c's ``arithmetic``)."""
    values = np.asarray(w).astype(np.float32)
    values = values.reshape((values.shape[0] if values.ndim == 3 else 1, *values.shape[-2:]))
    e, n, k = values.shape
    nb, kb = -(-n // block), -(-k // block)
    codes = np.zeros((e, n, k), np.uint8)
    scales = np.zeros((e, nb, kb))
    for b, i, j in np.ndindex(e, nb, kb):
        rows = slice(i * block, (i + 1) * block)
        columns = slice(j * block, (j + 1) * block)
        values_ij = values[b, rows, columns]
        group, scales[b, i, j] = scalar_group(values_ij.reshape(-1).tolist(), fmt,
                                              scale == "ue8m0", eps, rule, arithmetic)  # fmt: skip
        codes[b, rows, columns] = np.array(group, np.uint8).reshape(values_ij.shape)
    return codes, scales


def weight_scale_bytes(scales, n: int, layout: str) -> np.ndarray:
    """Every byte of a weight's scale storage in ``layout`` (section 4c's table), from the
    block scales ``[E, nb, kb]`` of a weight of ``n`` rows; padding zero."""
    e, nb, kb = scales.shape
    if layout == "packed":  # row r holds block row r // 128, then section 6's packed layout
        rows = np.repeat(scales, WEIGHT_BLOCK, axis=1)[:, :n]
        storage = Storage((e, n, kb * WEIGHT_BLOCK), WEIGHT_BLOCK, "packed", False)
        return expected_scale_bytes(rows, storage)
    out = np.zeros(e * nb * kb * (1 if layout == "bytes" else 4), np.uint8)
    for b, i, j in np.ndindex(e, nb, kb):
        s = float(scales[b, i, j])
        if layout == "bytes":
            out[b * nb * kb + i * kb + j] = ue8m0_exponent(s)
            continue
        index = b * nb * kb + (j * nb + i if layout == "col" else i * kb + j)
        out[4 * index : 4 * index + 4] = list(struct.pack("<f", s))
    return out


def quantize_columns(x, group_size, fmt, scale, eps, rule="rceil", arithmetic="float32"):
    """(codes uint8 [K, M], scales float64 [K, cg]) of ``x [M, K]`` column-wise: channel ``k``'s
    tokens ``j*G .. j*G + G - 1`` that exist are one group of section 3 (or of section 3c's
    ``arithmetic``)."""
    values = np.asarray(x).astype(np.float32)
    m, k = values.shape
    groups = -(-m // group_size)
    codes = np.zeros((k, m), np.uint8)
    scales = np.zeros((k, groups))
    for c, j in np.ndindex(k, groups):
        tokens = slice(j * group_size, (j + 1) * group_size)
        group = values[tokens, c].tolist()
        codes[c, tokens], scales[c, j] = scalar_group(group, fmt, scale == "ue8m0", eps, rule,
                                                      arithmetic)  # fmt: skip
    return codes, scales


# section 2a: the fused SiLU, one value at a time ---------------------------------------------
# Written from the spec's text, not from activation.py: Python floats (binary64) rounded to
# float32 after every operation, which for +, -, *, / and sqrt equals the float32 operation
# (binary64 carries more than twice float32's precision, so the double rounding is innocuous).

_SILU_C = f32(64 / math.log(2))
_SILU_L1 = float.fromhex("0x1.63p-7")
_SILU_L2 = f32(math.log(2) / 64 - _SILU_L1)


def _round_half_even(v: float) -> int:
    return int(round(v))  # Python's round() ties to even


def silu_exp_parts(x: float) -> tuple[float, int]:
    """Step 1 of section 2a: (m, n) with exp(x) ~ m * 2**n."""
    k = _round_half_even(f32(x * _SILU_C))
    r = f32(f32(x - f32(k * _SILU_L1)) - f32(k * _SILU_L2))
    p = f32(r + f32(f32(r * r) * f32(f32(r * f32(1 / 6)) + 0.5)))
    j = k % 64
    return _table_mantissa(j, p), (k - j) // 64


def _table_mantissa(j: int, p: float) -> float:
    """T_hi[j] + (T_lo[j] + T_hi[j] * p), the table of section 2a written from its text."""
    context = decimal.Context(prec=50)  # 2^(j/64) to 50 digits, then the two roundings
    exact = context.exp(context.multiply(decimal.Decimal(j) / 64, context.ln(decimal.Decimal(2))))
    hi = f32(float(exact))
    lo = f32(float(context.subtract(exact, decimal.Decimal(hi))))
    return f32(hi + f32(lo + f32(hi * p)))


def _times_power_of_two(v: float, n: int) -> float:
    if n >= -126:
        return f32(v * 2.0**n)
    return f32(f32(v * 2.0**-64) * 2.0 ** (n + 64))


def silu(g: float) -> float:
    """Steps 2 to 4 of section 2a for the float32 value ``g``."""
    if math.isnan(g):
        return math.nan
    if g >= 0:
        x = -min(g, 110.0)
    elif g >= -64:
        x = -g
    elif g >= -110:
        x = g
    else:
        return -0.0
    m, n = silu_exp_parts(f32(x))
    if g >= -64:
        return f32(g / f32(1.0 + _times_power_of_two(m, n)))
    return _times_power_of_two(f32(g * m), n)


# section 2c: the fused GeGLU's GELU, one value at a time -----------------------------------------

_GELU_A = float.fromhex("0x1.26aec2p+7")
_GELU_B = float.fromhex("0x1.a5a7dp+2")
_GELU_P1 = float.fromhex("0x1.62e484p-7")
_GELU_P2 = float.fromhex("0x1.ebfd44p-15")


def gelu_tanh(g: float) -> float:
    """Steps 1 to 5 of section 2c for the float32 value ``g``."""
    if math.isnan(g):
        return math.nan
    c = max(g, -16.0)
    w = f32(c * f32(_GELU_A + f32(_GELU_B * f32(c * c))))
    x = max(-abs(w), -10240.0)
    k = _round_half_even(x)
    f = f32(x - k)
    p = f32(f * f32(_GELU_P1 + f32(f * _GELU_P2)))
    m, n = _table_mantissa(k % 64, p), (k - k % 64) // 64
    e = _times_power_of_two(m, n)
    s = c if g >= 0 else f32(c * e)
    return f32(s / f32(1.0 + e))


# section 2b: the fused RMSNorm, one row at a time ------------------------------------------------

_INPUT_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
_INPUT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def round_to_input(value: float, input_dtype: str) -> float:
    """A float32 value rounded (RNE) to the input dtype and back; NaN stays NaN."""
    if math.isnan(value):
        return math.nan
    with np.errstate(over="ignore"):
        return float(np.float32(value).astype(_INPUT_DTYPES[input_dtype]))


def _fold_in_half(values: list[float], width: int) -> float:
    """Section 2b, step 2: pad with +0 to ``width`` slots, then value i plus value i + n/2,
    again and again, each sum rounded to float32."""
    values = list(values) + [0.0] * (width - len(values))
    while width > 1:
        width //= 2
        values = [f32(values[i] + values[i + width]) for i in range(width)]
    return values[0]


def rms_norm_row(x, weight, eps_norm: float, input_dtype: str, residual=None, rounding="once"):
    """Section 2b for one row of Python floats (values of ``input_dtype``): the values that are
    quantized, and with ``residual`` the sum written back (else None). ``rounding`` is a
    ``norm_rounding`` value: "twice" rounds RN(x * r) to the input dtype before the weight;
    "twice_unrounded_sum" does too, and normalises the float32 sums unrounded."""
    written = None
    if residual is not None:
        sums = [f32(a + b) for a, b in zip(x, residual)]
        written = [round_to_input(v, input_dtype) for v in sums]
        x = sums if rounding == "twice_unrounded_sum" else written
    per_lane = 32 // _INPUT_BYTES[input_dtype]
    lanes = [
        _fold_in_half([f32(v * v) for v in x[i : i + per_lane]], per_lane)
        for i in range(0, len(x), per_lane)
    ]
    warps = [_fold_in_half(lanes[i : i + 32], 32) for i in range(0, len(lanes), 32)]
    mean = f32(_fold_in_half(warps, 32) / len(x))
    d = f32(mean + f32(eps_norm))
    r = f32(1.0 / f32(math.sqrt(d))) if not math.isnan(d) else math.nan
    y = []
    for v, w in zip(x, weight):
        normalized = f32(v * r)
        if rounding != "once":
            normalized = round_to_input(normalized, input_dtype)
        y.append(round_to_input(f32(normalized * w), input_dtype))
    return y, written


# section 6: the blocked layout, one scale at a time ----------------------------------------------


def blocked_offset(r: int, c: int, columns: int) -> int:
    """Byte of scale (row r, group c) in one batch of the blocked layout, ``columns`` groups a
    row, as section 6 writes it."""
    return (
        ((r // 128) * -(-columns // 4) + c // 4) * 512
        + (r % 32) * 16
        + ((r % 128) // 32) * 4
        + c % 4
    )


# section 4a: NVFP4, one group of 16 at a time ----------------------------------------------------

_E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # codes 0 to 7; bit 3 is the sign


def e2m1_code(t: float) -> int:
    """The e2m1 code of float32 ``t``: nearest value, ties to the even code, saturated at 6."""
    magnitude = min(abs(t), 6.0)
    best = min(range(8), key=lambda c: (abs(_E2M1_VALUES[c] - magnitude), c % 2))
    return best | (8 if math.copysign(1.0, t) < 0 else 0)


def nvfp4_group(values, global_scale: float) -> tuple[list[int], int]:
    """Section 4a for 16 float32 values (Python floats): (e2m1 codes, the e4m3 scale's byte)."""
    g = f32(global_scale)
    amax = max([0.0] + [abs(v) for v in values if math.isfinite(v)])
    u = f32(f32(g * amax) / 6.0)
    scale_code = FORMATS["e4m3"].convert(min(u, 448.0))
    scale = float(np.uint8(scale_code).view(ml_dtypes.float8_e4m3fn))
    d = f32(scale / g)
    codes = []
    for v in values:
        if math.isnan(v):
            codes.append(0)
        elif math.isinf(v):
            codes.append(7 if v > 0 else 15)
        else:
            codes.append(e2m1_code(f32(v / d) if d > 0 else v * 0.0))
    return codes, scale_code


# section 4b: MXFP4, section 3 with the e2m1 row ----------------------------------------------


def mxfp4_group(values, eps: float, rule: str = "rceil") -> tuple[list[int], int]:
    """Section 4b for 32 float32 values (Python floats): (e2m1 codes, the UE8M0 byte)."""
    codes, scale = scalar_group(values, "e2m1", True, eps, rule)
    return codes, ue8m0_exponent(scale)
