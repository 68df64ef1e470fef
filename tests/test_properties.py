"""Property tests on drawn shapes, views, options and values.

- CPU: the NumPy backend, through ``quantize`` on numpy input, against the scalar model of the
  spec (fp8_group_quant/spec_model.py): every byte of the storage it owns, padding included,
  with outputs poisoned with 0x7F beforehand; and rejected calls raise cleanly and write nothing.
- GPU (``gpu`` marker): the CUDA kernel on cupy input against the NumPy backend, every byte of
  the full padded storage, both outputs poisoned; and the fused kernels (SiLU-and-multiply,
  RMSNorm and add, the masked layout) on drawn calls, views and kernel paths, the same way.
- Both: the tile kernels (weight blocks of 128 and 256, columns of 128 and 256 tokens, both
  orientations) on drawn calls, against the scalar model into poisoned outputs.

Hypothesis profiles are set in conftest.py: "ci" by default, "gpu" (many more examples) with
``HYPOTHESIS_PROFILE=gpu``.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from functools import cached_property

import ml_dtypes
import numpy as np
import pytest
from backends import (
    NUMPY_AND_GPU,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    poisoned_outputs,
    to_host_bytes,
)
from helpers import (
    NP_INPUT,
    PLAIN_PATHS,
    Q_POISON,
    SCALE_POISON,
    activations,
    assert_same_bytes,
    force_path,
    host_poisoned,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st

import fp8_group_quant as fgq
from fp8_group_quant import spec_model
from fp8_group_quant._layout import SCALE_LAYOUTS, Geometry, supported_combinations
from fp8_group_quant._spec import GROUP_SIZES, INPUT_TYPES, OUTPUT_FORMATS, SCALE_FORMATS
from fp8_group_quant.spec_model import FORMATS, Storage, f32, scalar_group

POISON = 0x7F
FLT_MIN = 2.0**-126
FLT_MAX = float(np.finfo(np.float32).max)
UE8M0_FLOOR = f32(1e-10)


# the input types and their special values ---------------------------------------------------------


@dataclass(frozen=True)
class Domain:
    """One input dtype: its bits, its range and its special values."""

    name: str

    @property
    def dtype(self) -> np.dtype:
        return NP_INPUT[self.name]

    @property
    def uint(self):
        return {2: np.uint16, 4: np.uint32}[self.dtype.itemsize]

    @property
    def finfo(self):
        return ml_dtypes.finfo(self.dtype)

    @property
    def max(self) -> float:
        return float(self.finfo.max)

    @property
    def exponents(self) -> tuple[int, int]:
        """Powers of two from the smallest subnormal to well inside the largest finite value."""
        finfo = self.finfo
        return finfo.minexp - finfo.nmant, finfo.maxexp - 4

    def bits(self, patterns) -> np.ndarray:
        return np.asarray(patterns, dtype=self.uint).view(self.dtype)

    def cast(self, values) -> np.ndarray:
        """Float values rounded to this dtype (RNE; beyond the range: +-Inf)."""
        with np.errstate(over="ignore"):
            return np.asarray(values, np.float64).astype(np.float32).astype(self.dtype)

    def neighbours(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(next smaller, next larger) magnitude of each value, keeping its sign; zero and the
        largest finite value stay where they are on the side that has no neighbour."""
        bits = np.asarray(values, self.dtype).view(self.uint)
        magnitude = bits & self.uint((1 << (8 * self.dtype.itemsize - 1)) - 1)
        largest = np.array([self.max], self.dtype).view(self.uint)[0]
        down = np.where(magnitude > 0, bits - self.uint(1), bits)
        up = np.where(magnitude < largest, bits + self.uint(1), bits)
        return down.view(self.dtype), up.view(self.dtype)

    @cached_property
    def nonfinite(self) -> np.ndarray:
        """+NaN, -NaN, +Inf, -Inf, and signalling NaNs with a payload, of both signs."""
        width = 8 * self.dtype.itemsize
        sign = 1 << (width - 1)
        inf = int(np.array([np.inf], self.dtype).view(self.uint)[0])
        quiet = int(np.array([np.nan], self.dtype).view(self.uint)[0]) & ~sign
        return self.bits([quiet, quiet | sign, inf, inf | sign, inf + 1, (inf + 1) | sign])

    @cached_property
    def specials(self) -> np.ndarray:
        """Finite edge values of both signs, then the non-finite ones."""
        finfo = self.finfo
        tiny, smallest = float(finfo.smallest_normal), float(finfo.smallest_subnormal)
        magnitudes = [
            0.0, smallest, 3 * smallest, tiny - smallest, tiny, 1.0, 0.5, 672.0, 448.0, 224.0,
            240.0, 127.0, 127.5, 57344.0, self.max, self.max / 2, 2.0**-10, 2.0**20,
        ]  # fmt: skip
        finite = self.cast([m for m in magnitudes if m <= self.max])
        down, up = self.neighbours(finite)
        finite = np.concatenate([finite, down, up])
        return np.concatenate([finite, -finite, self.nonfinite])


DOMAINS = {name: Domain(name) for name in NP_INPUT}


def format_points(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, midpoints) of the format's non-negative grid up to fmax: the exact codes and
    the rounding ties between neighbours."""
    values = np.array(FORMATS[fmt].grid[0])
    return values, (values[:-1] + values[1:]) / 2


# drawing inputs -----------------------------------------------------------------------------------

GROUP_KINDS = (
    "normal",  # standard normal data times a power of two, huge to subnormal
    "specials",  # normal data with edge values mixed in (signed NaN, Inf, subnormals, maxima)
    "ties",  # amax = fmax * 2^p, so the scale is 2^p exactly, and values on rounding ties
    "boundary",  # amax = fmax * s rounded to the input dtype, and its neighbours
    "zeros",  # signed zeros only
    "nonfinite",  # NaN and Inf only, of either sign
    "constant",  # one special value (672.0, NaN, ...) in every position
    "subnormal",  # subnormals of the input type, and zeros
)


def scale_exponents(domain: Domain, fmt: str) -> tuple[int, int]:
    """Powers p for which fmax * 2^p is finite in the input type (down to tiny scales)."""
    top = math.floor(math.log2(domain.max / FORMATS[fmt].fmax))
    return max(domain.exponents[0] + 10, -45), top


def draw_group(draw, rng, domain: Domain, fmt: str, size: int) -> np.ndarray:
    """One group of ``size`` values in the input dtype."""
    kind = draw(st.sampled_from(GROUP_KINDS))
    low, high = domain.exponents
    signs = rng.choice([-1.0, 1.0], size)
    if kind in ("normal", "specials"):
        power = draw(st.integers(low, high))
        values = domain.cast(rng.standard_normal(size) * 2.0**power)
        if kind == "specials":
            pool = domain.specials
            picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=8))
            values[rng.choice(size, len(picks), replace=False)] = pool[picks]
        return values
    if kind == "ties":
        power = draw(st.integers(*scale_exponents(domain, fmt)))
        exact, ties = format_points(fmt)
        values = domain.cast(signs * rng.choice(np.concatenate([exact, ties]), size) * 2.0**power)
        down, up = domain.neighbours(values)
        nudge = rng.integers(0, 4, size)  # a quarter each one step down or up: next to the tie
        values = np.where(nudge == 0, down, np.where(nudge == 1, up, values))
        values[rng.integers(size)] = domain.cast(signs[0] * FORMATS[fmt].fmax * 2.0**power)
        return values
    if kind == "boundary":
        target = draw(st.sampled_from(["power of two", "any", "ue8m0 floor"]))
        power = draw(st.integers(*scale_exponents(domain, fmt)))
        scale = {
            "power of two": 2.0**power,
            "any": f32(2.0**power * (1 + draw(st.integers(1, 2**23 - 1)) / 2**23)),
            "ue8m0 floor": UE8M0_FLOOR,
        }[target]
        amax = domain.cast([min(FORMATS[fmt].fmax * scale, domain.max)])
        down, up = domain.neighbours(amax)
        values = domain.cast(rng.uniform(-1, 1, size) * float(down[0]))
        where = rng.choice(size, 3, replace=False)
        values[where[0]], values[where[1]] = amax[0], -down[0]
        if draw(st.booleans()):  # the next value up becomes the maximum
            values[where[2]] = up[0]
        return values
    if kind == "zeros":
        return domain.cast(signs * 0.0)
    if kind == "nonfinite":
        pool = domain.nonfinite
        picks = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=4, unique=True))
        return pool[rng.choice(picks, size)]
    if kind == "constant":
        pool = domain.specials
        return np.full(size, pool[draw(st.integers(0, len(pool) - 1))], domain.dtype)
    # subnormal
    mantissa = domain.finfo.nmant
    bits = rng.integers(0, 2**mantissa, size) | (
        rng.integers(0, 2, size) << (8 * domain.dtype.itemsize - 1)
    )
    return domain.bits(bits)


@dataclass(frozen=True)
class View:
    """How the input sits in its buffer: row and batch steps (negative: reversed), and extra
    columns with the view starting ``offset`` elements into each row."""

    extra: int = 0
    offset: int = 0
    row_step: int = 1
    batch_step: int = 1

    def carve(self, backing, shape: tuple[int, ...]):
        """The view of logical ``shape`` into ``backing`` (numpy or cupy, same code)."""
        columns = slice(self.offset, self.offset + shape[-1])
        if len(shape) == 1:
            return backing[columns]
        rows = slice(None, None, self.row_step)
        if len(shape) == 2:
            return backing[rows, columns]
        view = backing[slice(None, None, self.batch_step), rows, columns]
        return view.reshape(shape)  # splits the row axis: always a view

    def backing_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        width = shape[-1] + self.extra
        if len(shape) == 1:
            return (width,)
        rows = math.prod(shape[1:-1]) if len(shape) >= 3 else shape[0]
        rows *= abs(self.row_step)
        if len(shape) == 2:
            return (rows, width)
        return (shape[0] * abs(self.batch_step), rows, width)


@dataclass(frozen=True)
class Case:
    values: np.ndarray  # the input's logical values, in its dtype
    group_size: int = 128
    fmt: str = "e4m3"
    scale: str = "float32"
    layout: str = "row"
    pad_rows: bool = False
    eps: float = 1e-10
    view: View = View()
    q_as_uint8: bool = False  # host out= as the uint8 container of a float8 format
    known: tuple[tuple[str, int, int], ...] = field(default=())  # (storage, byte, value)

    def _repr_pretty_(self, printer, cycle) -> None:  # what hypothesis prints: no value dump
        printer.text(repr(self))

    def __repr__(self) -> str:
        return (
            f"Case({self.values.dtype} {self.values.shape}, G={self.group_size}, {self.fmt}, "
            f"{self.scale}, {self.layout}, pad_rows={self.pad_rows}, eps={self.eps!r}, "
            f"{self.view}, q_as_uint8={self.q_as_uint8})"
        )

    @property
    def options(self) -> dict:
        return dict(
            dtype=self.fmt, scale=self.scale, layout=self.layout, eps=self.eps,
            pad_rows=self.pad_rows,
        )  # fmt: skip

    @property
    def storage(self) -> Storage:
        return Storage(self.values.shape, self.group_size, self.layout, self.pad_rows)

    def backing(self) -> tuple[np.ndarray, np.ndarray]:
        """(backing buffer, x): x the view holding ``values``; every other element of the
        buffer is a large canary that would change the result if it were read."""
        domain = DOMAINS[self.values.dtype.name]
        backing = np.full(self.view.backing_shape(self.values.shape), domain.max / 2, domain.dtype)
        x = self.view.carve(backing, self.values.shape)
        assert x.size == 0 or np.shares_memory(x, backing)
        x[...] = self.values
        return backing, x


@dataclass(frozen=True)
class Sizes:
    """Bounds of the drawn shapes."""

    rows: int  # rows of a 2-D input; 3-D and 4-D ones get fewer per dimension
    groups_per_row: int
    groups: int  # in all
    drawn_groups: int  # groups drawn one by one; the rest repeat them in random places


CPU_SIZES = Sizes(rows=17, groups_per_row=8, groups=64, drawn_groups=64)  # the model: ~20 ms
GPU_SIZES = Sizes(rows=70, groups_per_row=40, groups=4096, drawn_groups=32)


@st.composite
def shapes(draw, group_size: int, sizes: Sizes) -> tuple[int, ...]:
    """1-D to 4-D, rows not a multiple of four, at most ``sizes.groups`` groups; about one in
    eight empty (a zero batch, row or K dimension)."""
    ndim = draw(st.integers(1, 4))
    bounds = {1: (), 2: (sizes.rows,), 3: (3, sizes.rows // 2), 4: (2, 3, sizes.rows // 3)}
    lead = [draw(st.integers(1, bound)) for bound in bounds[ndim]]
    most = min(sizes.groups_per_row, sizes.groups // math.prod(lead))
    groups = draw(st.integers(1, max(most, 1)))
    if draw(st.integers(0, 7)) == 0:
        which = draw(st.integers(0, len(lead)))
        if which == len(lead):
            groups = 0
        else:
            lead[which] = 0
    return tuple(lead) + (groups * group_size,)


EPS_EDGES = (
    1e-10,  # the default
    FLT_MIN,  # the smallest accepted: float scales of all-zero groups are subnormal
    FLT_MIN * (1 - 2**-30),  # below FLT_MIN in double, rounds up to it in float32
    float(np.nextafter(np.float32(FLT_MIN), np.float32(1))),
    1e-30,
    2.0**-100,
    1.0,
    448.0,  # float scale 1 in e4m3 for small groups
    1e30,
    FLT_MAX,
)


@st.composite
def valid_eps(draw) -> float:
    kind = draw(st.sampled_from(["edge", "float32", "power of two"]))
    if kind == "edge":
        return draw(st.sampled_from(EPS_EDGES))
    if kind == "float32":
        return draw(st.floats(min_value=FLT_MIN, max_value=FLT_MAX, width=32))
    power = np.float32(2.0 ** draw(st.integers(-126, 127)))  # and its float32 neighbours
    step = draw(st.sampled_from([-np.inf, 0, np.inf]))
    eps = float(np.nextafter(power, np.float32(step)) if step else power)
    return max(eps, FLT_MIN)  # the one below FLT_MIN is subnormal: a rejected eps


@st.composite
def cases(draw, sizes: Sizes = CPU_SIZES) -> Case:
    domain = DOMAINS[draw(st.sampled_from(tuple(NP_INPUT)))]
    group_size = draw(st.sampled_from(GROUP_SIZES))
    fmt = draw(st.sampled_from(tuple(OUTPUT_FORMATS)))
    # the word layouts of section 6's table (the blocked layout has tests/test_blocked.py)
    layout = draw(st.sampled_from(tuple(n for n, v in SCALE_LAYOUTS.items() if not v.swizzled)))
    packs = SCALE_LAYOUTS[layout].needs_ue8m0  # packed layouts hold UE8M0 bytes only
    allowed = [name for name, kind in SCALE_FORMATS.items() if kind.power_of_two or not packs]
    scale = draw(st.sampled_from(allowed))
    shape = draw(shapes(group_size, sizes))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    count = math.prod(shape) // group_size if shape[-1] else 0
    drawn = min(count, sizes.drawn_groups)
    groups = [draw_group(draw, rng, domain, fmt, group_size) for _ in range(drawn)]
    groups += [groups[i] for i in rng.integers(0, drawn, count - drawn)]
    values = np.concatenate(groups) if groups else np.zeros(0, domain.dtype)
    extra = draw(st.sampled_from([0, 0, 1, 3, 8, 64]))
    view = View(
        extra=extra,
        offset=draw(st.integers(0, extra)),
        row_step=draw(st.sampled_from([1, 2, -1, -2])),
        batch_step=draw(st.sampled_from([1, 2, -1])),
    )
    return Case(
        values.reshape(shape), group_size, fmt, scale, layout, draw(st.booleans()),
        draw(valid_eps()), view, draw(st.booleans()),
    )  # fmt: skip


# outputs over poisoned storage --------------------------------------------------------------------


def data_pointer(array) -> int:
    if isinstance(array, np.ndarray):
        return array.__array_interface__["data"][0]
    return array.data.ptr  # cupy


def q_layout_view(storage: Storage, q_flat, q_dtype):
    b, m, k = storage.batches, storage.rows, storage.k
    return q_flat.view(q_dtype).reshape(b, storage.q_rows, k)[:, :m].reshape(storage.shape)


def layout_views(storage: Storage, q_flat, s_flat, q_dtype):
    """Views in section 6's layouts over flat storages, numpy or cupy: slicing and reshapes only
    (no ``as_strided``), so the API finds the whole allocation at the root of the view."""
    b, m, words = storage.batches, storage.rows, storage.words
    q = q_layout_view(storage, q_flat, q_dtype)
    s_flat = s_flat.view(storage.scale_dtype)
    if storage.layout in ("row", "packed_row"):
        s = s_flat.reshape(b, m, words)
    else:
        s = s_flat.reshape(b, words, storage.scale_rows).transpose(0, 2, 1)[:, :m]
    s = s.reshape(storage.scale_shape)
    # views, not copies, from the first byte, with section 6's strides
    for view, flat, strides in ((q, q_flat, storage.q_strides), (s, s_flat, storage.scale_strides)):
        if view.size:
            assert data_pointer(view) == data_pointer(flat) and same_strides(view, strides)
    return q, s


def host_call(case: Case, x):
    """Run the NumPy backend through ``quantize`` into poisoned outputs; returns (q, s, q storage
    bytes, scale storage bytes)."""
    storage = case.storage
    q_flat = np.full(storage.q_bytes, POISON, np.uint8)
    s_flat = np.full(storage.scale_words * 4, POISON, np.uint8)
    fmt = OUTPUT_FORMATS[case.fmt]
    q_dtype = np.uint8 if case.q_as_uint8 and fmt.is_float8 else fmt.numpy_dtype
    q_view, s_view = layout_views(storage, q_flat, s_flat, q_dtype)
    q, s = fgq.quantize(x, case.group_size, **case.options, out=q_view, scale_out=s_view)
    assert q is q_view and s is s_view
    return q, s, q_flat, s_flat


def same_strides(array, expected: tuple[int, ...]) -> bool:
    """Strides in elements equal ``expected`` wherever the extent is above one."""
    got = tuple(st // array.itemsize for st in array.strides)
    return all(n <= 1 or g == e for n, g, e in zip(array.shape, got, expected, strict=True))


def describe_mismatch(case: Case, what: str, got: np.ndarray, expected: np.ndarray) -> str:
    """The first differing byte, where it lies, and the group it belongs to, as float32 bits."""
    got, expected = got.view(np.uint8).ravel(), expected.view(np.uint8).ravel()
    diff = np.flatnonzero(got != expected)
    i = int(diff[0])
    storage = case.storage
    where, group = "padding", None
    if what == "q":
        b, rest = divmod(i, storage.q_rows * storage.k)
        m, column = divmod(rest, storage.k)
        if m < storage.rows:
            g = column // case.group_size
            where = f"batch {b}, row {m}, column {column} (group {g})"
            group = (b, m, g)
    else:
        for b, m, g in np.ndindex(storage.batches, storage.rows, storage.groups):
            offset = storage.scale_offset(b, m, g)
            if offset <= i < offset + (1 if storage.packed else 4):
                where, group = f"scale of batch {b}, row {m}, group {g}", (b, m, g)
    text = (
        f"{what}: {diff.size} bytes differ; first at byte {i} ({where}): got {got[i]:#04x}, "
        f"expected {expected[i]:#04x}; {case!r}"
    )
    if group is not None:
        b, m, g = group
        values = np.asarray(case.values).astype(np.float32)
        values = values.reshape(storage.batches, storage.rows, storage.k)[b, m]
        values = values[g * case.group_size : (g + 1) * case.group_size]
        text += f"\n  group as float32 bits: {[f'{v:#010x}' for v in values.view(np.uint32)]}"
    return text


def assert_storage(case: Case, what: str, got: np.ndarray, expected: np.ndarray) -> None:
    got, expected = np.asarray(got).view(np.uint8), np.asarray(expected).view(np.uint8)
    assert got.shape == expected.shape, f"{what}: {got.shape} bytes, expected {expected.shape}"
    if not np.array_equal(got, expected):
        raise AssertionError(describe_mismatch(case, what, got, expected))


def dequantized(case: Case, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 values of the model's codes times their group's scale."""
    element = FORMATS[case.fmt].element or np.int8
    decoded = codes.view(element).astype(np.float32)
    return decoded * np.repeat(scales.astype(np.float32), case.group_size, axis=-1)


# known answers: a rounding tie with padding, NaN of both signs, an all-Inf group ------------------


def tie_case() -> Case:
    # 672 / 2 = 336 lies halfway between e4m3 320 (0x7A) and 352 (0x7B): the even one wins.
    # Packed, three rows: row 3 and bytes 2, 3 of every word are padding; row 2 is all zero
    # (0x5E). Rows reversed in a wider buffer, starting one element in.
    values = np.array([[672.0] * 256, [672.0] * 128 + [-672.0] * 128, [0.0] * 256])
    return Case(
        values.astype(ml_dtypes.bfloat16), 128, "e4m3", "ue8m0", "packed", True, 1e-10,
        View(extra=8, offset=1, row_step=-1),
        known=(
            ("q", 0, 0x7A), ("q", 256 + 128, 0xFA), ("q", 512, 0x00), ("q", 3 * 256, 0x00),
            ("s", 0, 0x80), ("s", 1, 0x80), ("s", 2, 0x00), ("s", 3, 0x00), ("s", 8, 0x5E),
            ("s", 12, 0x00),
        ),
    )  # fmt: skip


def signed_nan_case() -> Case:
    # +NaN, -NaN, 2, -1, 0.5, -0.0, +sNaN, -sNaN: the scale is 2 / 448 (bits 0x3B924925);
    # NaN keeps its sign, 2 -> 448 (0x7E), -1 -> -224 (0xF6), 0.5 -> 112 (0x6E), -0.0 -> 0x80
    bits = [0x7FC00000, 0xFFC00000, 0x40000000, 0xBF800000, 0x3F000000, 0x80000000,
            0x7F800001, 0xFF800001]  # fmt: skip
    values = np.array([bits + [0] * 24], np.uint32).view(np.float32)
    return Case(
        values, 32, "e4m3", "float32", "row", False, 1e-10,
        known=(
            ("q", 0, 0x7F), ("q", 1, 0xFF), ("q", 2, 0x7E), ("q", 3, 0xF6), ("q", 4, 0x6E),
            ("q", 5, 0x80), ("q", 6, 0x7F), ("q", 7, 0xFF),
            ("s", 0, 0x25), ("s", 1, 0x49), ("s", 2, 0x92), ("s", 3, 0x3B),
        ),
    )  # fmt: skip


def all_inf_case() -> Case:
    # group 1 of row 2 holds only +-Inf: e5m2 keeps Inf (0x7C / 0xFC) and the scale comes from
    # eps alone, float32(1e-10) / 57344 (bits 0x26FB5123), at word 1 * tma + 2 = 10 of col_tma;
    # rows 5 to 7 of both scale columns and of q are padding
    values = np.concatenate([np.zeros((5, 32)), np.ones((5, 32))], axis=1).astype(np.float16)
    values[2, 32:] = [np.inf, -np.inf] * 16
    return Case(
        values, 32, "e5m2", "float32", "col_tma", True, 1e-10, View(extra=32, offset=3),
        known=(
            ("q", 2 * 64 + 32, 0x7C), ("q", 2 * 64 + 33, 0xFC), ("q", 5 * 64, 0x00),
            ("s", 40, 0x23), ("s", 41, 0x51), ("s", 42, 0xFB), ("s", 43, 0x26),
            ("s", 20, 0x00), ("s", 60, 0x00),
        ),
    )  # fmt: skip


def test_model_gives_the_specs_worked_answers():
    """The model itself against docs/spec.md sections 3 and 4, before it judges anything."""
    zeros = [0.0] * 32
    for fmt in FORMATS:  # all-zero group, UE8M0: scale 2^-33, codes 0
        assert scalar_group(zeros, fmt, True, 1e-10) == ([0] * 32, 2.0**-33)
    _, scale = scalar_group(zeros, "e4m3", False, 1e-10)
    assert struct.pack("<f", scale) == struct.pack("<I", 0x2A7B5123)
    assert scalar_group([672.0] * 32, "e4m3", True, 1e-10) == ([0x7A] * 32, 2.0)
    assert scalar_group([672.0] * 32, "e4m3", False, 1e-10) == ([0x7E] * 32, 1.5)
    codes, scale = scalar_group([672.0] * 32, "e4m3fnuz", True, 1e-10)
    assert scale == 4.0 and set(codes) == {
        int(np.float32(160).astype(ml_dtypes.float8_e4m3fnuz).view(np.uint8))
    }
    # section 4's table: +NaN, -NaN, +Inf, -Inf, and the amax 2 of the finite neighbours
    table = {
        "e4m3": [0x7F, 0xFF, 0x7E, 0xFE], "e5m2": [0x7E, 0xFE, 0x7C, 0xFC],
        "int8": [0x00, 0x00, 0x7F, 0x81], "e4m3fnuz": [0x80, 0x80, 0x7E, 0xFE],
    }  # fmt: skip
    for fmt, expected in table.items():
        codes, scale = scalar_group(
            [math.nan, -math.nan, math.inf, -math.inf, 2.0], fmt, False, 1e-10
        )
        assert codes[:4] == expected and scale == f32(2.0 / FORMATS[fmt].fmax)
    # int8 rounds half to even; e4m3fnuz and int8 have no -0
    codes, _ = scalar_group([127.0, 0.5, 1.5, 2.5, -0.5, -2.5, -0.0], "int8", False, 1e-10)
    assert codes == [0x7F, 0x00, 0x02, 0x02, 0x00, 0xFE, 0x00]
    codes, _ = scalar_group([224.0, -1e-30, -0.0], "e4m3fnuz", False, 1e-10)
    assert codes == [0x7E, 0x00, 0x00]


# the NumPy backend against the model --------------------------------------------------------------


@given(case=cases())
@example(case=tie_case())
@example(case=signed_nan_case())
@example(case=all_inf_case())
def test_numpy_backend_matches_the_model(case):
    _, x = case.backing()
    storage = case.storage
    q, s, q_flat, s_flat = host_call(case, x)
    codes, scales = spec_model.quantize(
        case.values, case.group_size, case.fmt, case.scale, case.eps
    )
    q_expected, s_expected = spec_model.expected_storage(codes, scales, storage)
    for what, index, byte in case.known:  # the worked answers, for the model first
        assert (q_expected if what == "q" else s_expected)[index] == byte, (what, index)
    assert_storage(case, "q", q_flat, q_expected)
    assert_storage(case, "scales", s_flat, s_expected)

    # library-allocated outputs: section 6's shapes, dtypes and strides, the same bytes
    q2, s2 = fgq.quantize(x, case.group_size, **case.options)
    assert q2.dtype == OUTPUT_FORMATS[case.fmt].numpy_dtype and q2.shape == storage.shape
    assert s2.dtype == storage.scale_dtype and s2.shape == storage.scale_shape
    assert same_strides(q2, storage.q_strides) and same_strides(s2, storage.scale_strides)
    assert np.array_equal(q2.view(np.uint8), q.view(np.uint8))
    assert np.array_equal(s2.view(np.uint32), s.view(np.uint32))

    # read back through the public layouts (empty ones too: SPEC 6 makes them valid)
    if storage.packed:
        assert np.array_equal(fgq.unpack_scales(s, storage.groups), scales.astype(np.float32))
    else:
        assert np.array_equal(s, scales.astype(np.float32))
    with np.errstate(over="ignore"):  # e5m2 codes times huge scales overflow to Inf
        got = fgq.dequantize(q, s, case.group_size, dtype=case.fmt)
        np.testing.assert_array_equal(got, dequantized(case, codes, scales))


# rejected calls -----------------------------------------------------------------------------------


def poisoned(shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    return np.full(math.prod(shape) * dtype.itemsize, POISON, np.uint8).view(dtype).reshape(shape)


# each option's rejected values: near misses of the accepted ones, and wrong types
BAD_OPTIONS = {
    "group_size": [0, 1, 16, 48, 96, 100, 192, 512, -128, True, 128.0, "128", None],
    "dtype": ["e4m3fnx", "E4M3", "float8_e8m0fnu", "fp4", "int4", None, np.float16],
    "scale": ["ue8m1", "UE8M0", "float16", None, 32],
    "layout": ["tma", "ROW", "col_major", "swizzled", None, 0],
    "pad_rows": [1, 0, None, "yes", np.int8(1)],
    "eps": [
        0.0, -0.0, -1e-10, math.nan, math.inf, -math.inf, "1e-10", None, True,
        FLT_MIN * (1 - 2**-23), 1e-39, 2.0**-149,  # subnormal in float32
        1e-46,  # rounds to zero in float32
        3.5e38, 1e39,  # round to infinity in float32
    ],
}  # fmt: skip


def reject_option(case, args, draw):
    name = draw(st.sampled_from(tuple(BAD_OPTIONS)))
    if name == "eps" and draw(st.booleans()):  # any value whose float32 is subnormal
        args["eps"] = draw(st.floats(min_value=2.0**-149, max_value=FLT_MIN * (1 - 2**-23)))
    else:
        args[name] = draw(st.sampled_from(BAD_OPTIONS[name]))
    return name


def reject_float_scales_in_packed_layouts(case, args, draw):
    args["layout"] = draw(st.sampled_from(["packed", "packed_row"]))
    args["scale"] = "float32"
    return "layout"


def reject_input_dtype(case, args, draw):
    dtype = draw(st.sampled_from([np.float64, np.int32, np.int8, np.uint16, np.bool_]))
    args["x"] = np.zeros(case.values.shape, dtype)
    return "x"


def reject_scalar_or_list(case, args, draw):
    args["x"] = draw(st.sampled_from([np.array(1.0, case.values.dtype), case.values.tolist()]))
    return "x"


def reject_k(case, args, draw):
    extra = draw(st.integers(1, case.group_size - 1))
    args["x"] = np.zeros(
        case.values.shape[:-1] + (case.values.shape[-1] + extra,), case.values.dtype
    )
    return "x"


def reject_strided_k(case, args, draw):
    shape = tuple(max(n, 1) for n in case.values.shape[:-1]) + (case.group_size,)
    args["x"] = np.zeros(shape[:-1] + (2 * shape[-1],), case.values.dtype)[..., ::2]
    return "x"


def reject_rows_that_do_not_collapse(case, args, draw):
    d1, d2 = draw(st.integers(2, 3)), draw(st.integers(2, 3))
    rows = np.zeros((draw(st.integers(1, 2)), d2, d1, case.group_size), case.values.dtype)
    args["x"] = rows.swapaxes(1, 2) if draw(st.booleans()) else rows[:, ::-1]
    return "x"


def reject_out(case, args, draw):
    storage, fmt = case.storage, OUTPUT_FORMATS[case.fmt]
    shape = storage.shape
    wrong = {
        "shape": lambda: poisoned(shape[:-1] + (shape[-1] + case.group_size,), np.uint8),
        "dtype": lambda: poisoned(shape, np.float16 if fmt.is_float8 else np.uint8),
        "library": lambda: [0] * max(storage.q_bytes, 1),
    }
    if storage.q_bytes:
        shifted = poisoned((storage.q_bytes + 1,), np.uint8)[1:]
        wrong["misaligned"] = lambda: q_layout_view(storage, shifted, np.uint8)
    if storage.q_bytes and any(n > 1 for n in shape[:-1]):  # rows of a wider buffer
        wider = poisoned(shape[:-1] + (shape[-1] + 16,), np.uint8)
        wrong["strides"] = lambda: wider[..., : shape[-1]]
    args["out"] = wrong[draw(st.sampled_from(sorted(wrong)))]()
    return "out"


def reject_scale_out(case, args, draw):
    storage = case.storage
    shape = storage.scale_shape
    other = "float32" if storage.packed else "int32"
    wrong = {
        "shape": lambda: poisoned(shape[:-1] + (shape[-1] + 1,), storage.scale_dtype),
        "dtype": lambda: poisoned(shape, other),
        "library": lambda: [0] * max(storage.scale_words, 1),
    }
    if len(shape) == 2 and min(shape) > 1:  # row-major where column-major is owed, and back
        rows, words = shape
        if storage.layout in ("row", "packed_row"):
            wrong["strides"] = lambda: poisoned((words, rows), storage.scale_dtype).T
        else:
            wrong["strides"] = lambda: poisoned((rows, words), storage.scale_dtype)
    if storage.scale_words and storage.scale_rows > storage.rows:  # without its padding rows
        short = poisoned((storage.scale_words - 1,), storage.scale_dtype)
        wrong["unpadded"] = lambda: np.lib.stride_tricks.as_strided(
            short, shape, tuple(4 * st for st in storage.scale_strides)
        )
    args["scale_out"] = wrong[draw(st.sampled_from(sorted(wrong)))]()
    return "scale_out"


REJECTIONS = (
    reject_option, reject_float_scales_in_packed_layouts, reject_input_dtype,
    reject_scalar_or_list, reject_k, reject_strided_k, reject_rows_that_do_not_collapse,
    reject_out, reject_scale_out,
)  # fmt: skip


@given(case=cases(), data=st.data())
def test_rejected_calls_raise_cleanly_and_write_nothing(case, data):
    _, x = case.backing()
    storage = case.storage
    q_flat = np.full(storage.q_bytes, POISON, np.uint8)
    s_flat = np.full(storage.scale_words * 4, POISON, np.uint8)
    q_view, s_view = layout_views(storage, q_flat, s_flat, OUTPUT_FORMATS[case.fmt].numpy_dtype)
    args = dict(x=x, group_size=case.group_size, **case.options, out=q_view, scale_out=s_view)
    reject = data.draw(st.sampled_from(REJECTIONS))
    name = reject(case, args, data.draw)
    with pytest.raises((ValueError, TypeError)) as error:
        fgq.quantize(args.pop("x"), **args)
    message = str(error.value)
    assert name in message, message
    for buffer in (q_flat, s_flat, args["out"], args["scale_out"]):
        if isinstance(buffer, np.ndarray):  # any strides: compared in words of its own size
            words = buffer.view(f"u{buffer.itemsize}")
            poison = int.from_bytes(bytes([POISON]) * buffer.itemsize, "little")
            assert (words == poison).all(), f"written before the rejection: {message}"


# the CUDA kernel against the NumPy backend --------------------------------------------------------


KERNEL_PATHS = ("as planned", *PLAIN_PATHS)


def kernel_path(path: str):
    """Force a kernel path (helpers.PLAIN_PATHS), with a fresh plan cache; "as planned" keeps
    the library's choice and its plan cache, so repeated layouts reuse plans with new
    pointers."""
    return force_path(**PLAIN_PATHS.get(path, {}))


def device_outputs(storage: Storage, fmt: str):
    """(q view, scale view, q storage, scale storage) on the device, the whole padded storage
    poisoned; cupy's q is uint8 for float8 formats, int8 for int8."""
    import cupy

    q_buf = cupy.full(storage.q_bytes, POISON, cupy.uint8)
    s_buf = cupy.full(storage.scale_words * 4, POISON, cupy.uint8)
    q, s = layout_views(storage, q_buf, s_buf, OUTPUT_FORMATS[fmt].container)
    return q, s, q_buf, s_buf


@pytest.mark.gpu
@given(case=cases(GPU_SIZES), path=st.sampled_from(KERNEL_PATHS))
@example(case=tie_case(), path="one pass")
@example(case=signed_nan_case(), path="row loop")
@example(case=all_inf_case(), path="as planned")
def test_kernel_matches_the_numpy_backend(case, path):
    import cupy

    backing, x = case.backing()
    device_backing = cupy.asarray(backing)
    x_device = case.view.carve(device_backing, case.values.shape)
    if x.size:  # the same view: strides and offset (so the same alignment) in the same buffer
        assert all(n <= 1 or a == b for n, a, b in zip(x.shape, x_device.strides, x.strides))
        offset = x.__array_interface__["data"][0] - backing.__array_interface__["data"][0]
        assert x_device.data.ptr - device_backing.data.ptr == offset
    storage = case.storage
    q, s, q_buf, s_buf = device_outputs(storage, case.fmt)
    with kernel_path(path):
        q_got, s_got = fgq.quantize(x_device, case.group_size, **case.options, out=q, scale_out=s)
        q_plain, s_plain = fgq.quantize(x_device, case.group_size, **case.options)
    assert q_got is q and s_got is s
    _, _, q_expected, s_expected = host_call(case, x)
    assert_storage(case, "q", cupy.asnumpy(q_buf), q_expected)
    assert_storage(case, "scales", cupy.asnumpy(s_buf), s_expected)

    # library-allocated outputs: section 4's cupy dtypes, section 6's strides, the same values
    assert q_plain.dtype == OUTPUT_FORMATS[case.fmt].container and q_plain.shape == storage.shape
    assert s_plain.dtype == storage.scale_dtype and s_plain.shape == storage.scale_shape
    assert same_strides(q_plain, storage.q_strides)
    assert same_strides(s_plain, storage.scale_strides)
    assert np.array_equal(cupy.asnumpy(q_plain).view(np.uint8), cupy.asnumpy(q).view(np.uint8))
    assert np.array_equal(cupy.asnumpy(s_plain).view(np.uint32), cupy.asnumpy(s).view(np.uint32))


# the fused inputs on drawn shapes, views and options ----------------------------------------------

# each fused path's kernels and grids, forced (helpers.force_path)
SILU_PATHS = {
    "as planned": {},
    "one pass, the table copied by every thread": {"table_by_threads_waves": 0.0},
    "one pass, six blocks an SM": {"silu_six_blocks_waves": 0.0},
    "persistent": {"persistent_fused_waves": 0.0},
}
NORM_PATHS = {
    "as planned": {},
    "one lane, a block a row": {"norm_lanes": 1, "norm_waves": 0.0},
    "two lanes, a block a row": {"norm_lanes": 2, "norm_waves": 0.0},
    "one lane, walking blocks": {"norm_lanes": 1, "norm_waves": 0.004},  # one or two blocks
    "two lanes, walking blocks": {"norm_lanes": 2, "norm_waves": 0.004},
}
# (q, scale) poisons: a store the kernel misses shows unless its right value is the poison
POISONS = [(Q_POISON, SCALE_POISON), (0x00, 0xAB), (0x5A, 0x00)]


def wide_view(lib_array, shape, extra: int, offset: int, reverse: bool):
    """A view of ``shape`` into ``lib_array`` (rows ``extra`` elements wider), ``offset``
    elements in, its rows in reverse order if ``reverse``."""
    view = lib_array[..., offset : offset + shape[-1]]
    return view[..., ::-1, :] if reverse else view


def widened(x: np.ndarray, extra: int, offset: int, reverse: bool, fill: float = 0.0):
    """Host buffer whose view ``wide_view(buffer, x.shape, extra, offset, reverse)`` reads x;
    the columns outside it hold ``fill``."""
    wide = np.full(x.shape[:-1] + (x.shape[-1] + extra,), fill, x.dtype)
    wide_view(wide, x.shape, extra, offset, reverse)[...] = x
    return wide


@st.composite
def fused_cases(draw):
    """A fused call: its mode, input type, format, scale, layout, group size, shape, the views x
    (and the residual) are read through, the kernel path forced or planned, and its options.
    Sizes stay small for the NumPy reference; the forced paths reach the grids large inputs
    take."""
    mode = draw(st.sampled_from(["silu_mul", "gelu_tanh_mul", "norm", "add_norm", "masked",
                                 "masked_silu_mul", "masked_gelu_tanh_mul"]))  # fmt: skip
    input_dtype = draw(st.sampled_from(sorted(INPUT_TYPES)))
    fmt, scale, layout = draw(st.sampled_from(supported_combinations()))
    group = draw(st.sampled_from(GROUP_SIZES))
    itemsize = NP_INPUT[input_dtype].itemsize
    gated = mode.endswith("_mul")  # a gated activation reads gate and up: twice the columns
    norm = mode in ("norm", "add_norm")
    longest = 32768 // itemsize if norm else 16384  # a norm row: at most 1024 lanes of 32 bytes
    groups = draw(st.one_of(st.integers(1, 12), st.sampled_from([56, longest // group])))
    groups = max(1, min(groups, longest // group))
    k = group * groups * (2 if gated else 1)
    most = 1_000_000 // k  # rows, for the NumPy reference's time
    if mode.startswith("masked"):
        experts = draw(st.integers(1, 40))
        lead = (experts, max(1, min(draw(st.integers(1, 48)), most // experts)))
    else:
        rows = draw(st.one_of(st.integers(1, 20), st.sampled_from([129, 264, 265, 529, 1100])))
        rows = max(1, min(rows, most))
        lead = draw(st.sampled_from([(rows,), (1, rows), (2, -(-rows // 2))]))
    floors = scale == "ue8m0" and OUTPUT_FORMATS[fmt].emax_elem is not None  # scale_rule="floor"
    vector = 16 // itemsize  # the fused kernels read 16-byte aligned rows

    def view():  # rows `extra` elements wider than K, `offset` in, maybe reversed
        extra = vector * draw(st.sampled_from([0, 0, 1, 3]))
        offset = vector * draw(st.integers(0, extra // vector))
        return dict(extra=extra, offset=offset, reverse=draw(st.booleans()))

    paths = NORM_PATHS if norm else SILU_PATHS if mode == "silu_mul" else {"as planned": {}}
    return dict(
        mode=mode, input_dtype=input_dtype, fmt=fmt, scale=scale, layout=layout, group=group,
        shape=(*lead, k), x_view=view(), r_view=view(), pad_rows=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-10, 1e-4])),
        scale_rule=draw(st.sampled_from(["rceil", "floor"])) if floors else "rceil",
        specials=draw(st.booleans()), eps_norm=draw(st.sampled_from([1e-6, 1e-5, 0.5])),
        path=draw(st.sampled_from(sorted(paths))), poisons=draw(st.sampled_from(POISONS)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )  # fmt: skip


@pytest.mark.gpu
@pytest.mark.gpu
@settings(max_examples=200, deadline=None)
@given(case=fused_cases())
def test_fused_kernels_match_the_numpy_backend_on_drawn_calls(case):
    # any fused mode, input type, format, layout, group size, rule, view and kernel path: every
    # byte of the poisoned device storage, and of the residual's whole buffer, as the NumPy
    # backend writes them
    import cupy

    rng = np.random.default_rng(case["seed"])
    shape, dtype, mode = case["shape"], case["input_dtype"], case["mode"]
    x = activations(rng, shape, dtype, specials=case["specials"])
    options = {name: case[name] for name in ("eps", "pad_rows", "scale_rule", "scale", "layout")}
    options["dtype"] = case["fmt"]
    host, device = {}, {}
    if mode.endswith("_mul"):  # SiLU-mul or GeGLU, plain or masked
        host["activation"] = device["activation"] = mode.removeprefix("masked_")
    if mode.startswith("masked"):
        counts = rng.integers(-2, shape[1] + 3, shape[0]).astype(rng.choice([np.int32, np.int64]))
        host["masked_m"], device["masked_m"] = counts, cupy.asarray(counts)
    r_host = r_wide = None
    if mode in ("norm", "add_norm"):
        weight = activations(rng, shape[-1:], dtype)
        host["norm"] = (weight, case["eps_norm"])
        device["norm"] = (cupy.asarray(weight), case["eps_norm"])
        if mode == "add_norm":  # in a buffer of its own view, its other columns NaN
            r_host = activations(rng, shape, dtype)
            r_wide = cupy.asarray(widened(r_host, **case["r_view"], fill=np.nan))
            device["residual"] = wide_view(r_wide, shape, **case["r_view"])
            host["residual"] = r_host
    n = shape[-1] // (2 if "activation" in host else 1)
    geometry = Geometry((*shape[:-1], n), case["group"], case["layout"], case["pad_rows"])
    poisons = case["poisons"]
    q, s, q_buf, s_buf = poisoned_outputs(geometry, "cupy", case["fmt"], *poisons)
    x_device = wide_view(cupy.asarray(widened(x, **case["x_view"])), shape, **case["x_view"])
    paths = NORM_PATHS if "norm" in host else SILU_PATHS if mode == "silu_mul" else {}
    with force_path(**paths.get(case["path"], {})):
        q_got, s_got = fgq.quantize(x_device, case["group"], **options, **device, out=q,
                                    scale_out=s)  # fmt: skip
    assert q_got is q and s_got is s
    hq, hs, hq_buf, hs_buf = host_poisoned(geometry, case["fmt"], *poisons)
    fgq.quantize(x, case["group"], **options, **host, out=hq, scale_out=hs)
    what = " ".join(f"{k}={v}" for k, v in case.items() if k != "seed")
    assert_same_bytes(to_host_bytes(q_buf), hq_buf, f"q ({what})")
    assert_same_bytes(to_host_bytes(s_buf), hs_buf, f"scales ({what})")
    if r_host is not None:
        expected = widened(host["residual"], **case["r_view"], fill=np.nan)
        assert_same_bytes(to_host_bytes(r_wide), expected.view(np.uint8).ravel(),
                          f"residual's buffer ({what})")  # fmt: skip


# the tile kernels on drawn calls ----------------------------------------------------------------


@st.composite
def tile_calls(draw):
    """A drawn tile call: a weight in blocks of 128 or 256 (a batch of experts at times), or x
    column-wise in token groups of 128 or 256, or both orientations (128); any layout the call
    takes, every input type, shapes cut anywhere (partial blocks and token groups)."""
    kind = draw(st.sampled_from(["weight", "col", "both"]))
    size = 128 if kind == "both" else draw(st.sampled_from([128, 256]))
    input_dtype = draw(st.sampled_from(["bfloat16", "float16", "float32"]))
    if kind == "weight":
        layouts = [ls for ls in WEIGHT_LAYOUT_SCALES if size == 128 or ls[0] != "packed"]
        layout, scale = draw(st.sampled_from(layouts))
        lead = draw(st.sampled_from([(), (2,)]))
        shape = (*lead, draw(st.integers(1, 2 * size + 3)), draw(st.integers(1, 2 * size + 3)))
    else:
        layout, scale = draw(st.sampled_from(COLUMN_LAYOUT_SCALES))
        shape = (draw(st.integers(0, 2 * size + 3)), size * draw(st.integers(1, 2)))
    return kind, size, input_dtype, layout, scale, shape, draw(st.integers(0, 2**32 - 1))


WEIGHT_LAYOUT_SCALES = [("row", "float32"), ("col", "ue8m0"), ("bytes", "ue8m0"),
                        ("packed", "ue8m0")]  # fmt: skip
COLUMN_LAYOUT_SCALES = [("row", "float32"), ("col", "float32"), ("col_tma", "ue8m0"),
                        ("packed", "ue8m0"), ("packed_row", "ue8m0")]  # fmt: skip


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)
@settings(max_examples=25)
@given(call=tile_calls())
def test_tiles_match_the_model_on_drawn_calls(backend, call):
    """Each drawn tile call into poisoned outputs, every byte against the scalar model, then
    the allocating call (test_weight's and test_orientation's checks)."""
    from test_orientation import check_both, check_col
    from test_weight import check_weight, weights

    kind, size, input_dtype, layout, scale, shape, seed = call
    rng = np.random.default_rng(seed)
    if kind == "weight":
        w = weights(rng, shape, input_dtype, block=size)
        check_weight(w, backend, scale=scale, layout=layout, block=size)
        return
    x = activations(rng, shape, input_dtype, specials=True) if 0 not in shape else (
        np.zeros(shape, NP_INPUT[input_dtype]))  # fmt: skip
    if kind == "both":
        check_both(x, backend, layout, scale)
    else:
        check_col(x, backend, group_size=size, scale=scale, layout=layout)
