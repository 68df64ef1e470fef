"""Data and comparison helpers shared by the tests, and ``force_path``: the one place tests force
the launch layer's choices."""

from __future__ import annotations

import contextlib

import ml_dtypes
import numpy as np

from fp8_group_quant import reference
from fp8_group_quant._layout import Geometry
from fp8_group_quant._spec import output_format

# the issue's shapes: one row, odd rows, K that is and is not a multiple of 4 groups, TMA padding
ISSUE_SHAPES = [
    (1, 7168), (3, 7168), (4, 640), (4, 768), (4, 384), (1, 384), (3, 640), (64, 7168),
    (127, 7168), (253, 640),
]  # fmt: skip

NP_INPUT = {
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
}


def activations(rng, shape, dtype: str, specials: bool = False) -> np.ndarray:
    """Random activations with heavy-tailed magnitudes and outlier channels, never constants.

    With ``specials``: NaN, +Inf, -Inf, an all-zero run, a constant-672 run and a run of
    subnormals (each whole groups for every supported group size) at random places.
    """
    values = rng.standard_normal(shape).astype(np.float32)
    values *= np.exp(rng.standard_normal(shape[:-1] + (1,)) * 1.5).astype(np.float32)
    outliers = rng.random(shape) < 0.002
    values[outliers] *= rng.choice([50.0, -300.0, 1000.0], size=int(outliers.sum()))
    limit = 60000.0 if dtype == "float16" else 1e30
    values = np.clip(values, -limit, limit)
    flat = values.reshape(-1, shape[-1])
    if specials and flat.size:
        rows, k = flat.shape
        for code in (np.nan, np.inf, -np.inf, -np.nan):
            idx = rng.integers(0, rows), rng.integers(0, k)
            flat[idx] = code
        # runs of `chunk` values starting at multiples of `chunk` are whole groups for every G
        chunk = 256 if k >= 256 else k
        starts = [(rng.integers(0, rows), chunk * rng.integers(0, k // chunk)) for _ in range(3)]
        (r0, c0), (r1, c1), (r2, c2) = starts
        flat[r0, c0 : c0 + chunk] = 0.0
        flat[r1, c1 : c1 + chunk] = 672.0
        tiny = {"bfloat16": 1e-39, "float16": 3e-6, "float32": 1e-40}[dtype]
        flat[r2, c2 : c2 + chunk] = rng.standard_normal(chunk).astype(np.float32) * tiny
    return flat.reshape(shape).astype(NP_INPUT[dtype])


def sums_at_rounding_hazards(rng, shape, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(x, residual) of a 16-bit ``dtype`` whose sums sit where rounding is delicate, a fifth
    each: exponents 0 to 40 apart (float32's sum inexact for some past 13 for float16, 16 for
    bfloat16), ties of x's grid and sums a little either side of them (exact in float32),
    cancellations, pairs of subnormals, and sums past the largest finite value."""
    bits = {"bfloat16": 8, "float16": 11}[dtype]  # significant bits
    info = ml_dtypes.finfo(NP_INPUT[dtype])
    x = activations(rng, shape, dtype).astype(np.float64)
    x[x == 0] = 1.0
    e = np.floor(np.log2(np.abs(x)))
    sign = rng.choice([-1.0, 1.0], shape)
    nudge = rng.choice([-1.0, 0.0, 1.0], shape) * 2.0 ** -rng.integers(1, bits + 1, shape)
    subnormal = float(info.smallest_subnormal)
    big = float(info.max)
    kinds = [
        sign * np.abs(x) * rng.uniform(1, 2, shape) * 2.0 ** -rng.integers(0, 41, shape),
        sign * 2.0 ** (e - bits) * (1 + nudge),
        -x + sign * 2.0 ** (e - bits + 1) * rng.integers(0, 4, shape),
        rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), shape) * subnormal,
        np.sign(x) * big * rng.uniform(0.3, 1.0, shape),
    ]
    kind = rng.integers(0, len(kinds), shape)
    residual = np.choose(kind, kinds)
    x = np.where(kind == 3, rng.integers(-(2 ** (bits - 1)), 2 ** (bits - 1), shape) * subnormal, x)
    x = np.where(kind == 4, np.sign(x) * big * rng.uniform(0.5, 1.0, shape), x)
    with np.errstate(over="ignore"):
        return x.astype(NP_INPUT[dtype]), residual.astype(NP_INPUT[dtype])


def reference_storage(
    x: np.ndarray, geometry: Geometry, dtype: str, scale: str, eps: float, rule: str = "rceil"
):
    """(q bytes, scale bytes) of the whole storage the NumPy backend writes, padding included."""
    fmt = output_format(dtype)
    q = np.full(geometry.q_storage, 0xAB, np.uint8)
    scales = np.full(geometry.scale_storage_bytes, 0xFF, np.uint8).view(geometry.layout.dtype)
    reference.quantize_into(np.asarray(x), geometry, fmt, scale, eps, q, scales, rule=rule)
    return q, scales.view(np.uint8)


def assert_same_bytes(got: np.ndarray, expected: np.ndarray, what: str, inputs=None) -> None:
    """Bit-for-bit comparison; the failure names the first differing byte."""
    got = np.asarray(got).view(np.uint8).reshape(-1)
    expected = np.asarray(expected).view(np.uint8).reshape(-1)
    assert got.shape == expected.shape, f"{what}: {got.shape} bytes, expected {expected.shape}"
    diff = np.flatnonzero(got != expected)
    if diff.size:
        i = int(diff[0])
        context = ""
        if inputs is not None and i < np.asarray(inputs).size:
            context = f", input value {np.asarray(inputs).reshape(-1)[i]!r}"
        raise AssertionError(
            f"{what}: {diff.size} bytes differ; first at byte {i}: got {got[i]:#04x}, "
            f"expected {expected[i]:#04x}{context}"
        )


Q_POISON, SCALE_POISON = 0xFF, 0x7F


def host_poisoned(
    geometry: Geometry, fmt: str, q_poison: int = Q_POISON, s_poison: int = SCALE_POISON
):
    """(q view, scale view, q storage bytes, scale storage bytes): numpy views in the layout
    over poisoned storage, as backends.poisoned_outputs poisons the device's."""
    q_buf = np.full(geometry.q_storage, q_poison, np.uint8)
    s_buf = np.full(geometry.scale_storage_bytes, s_poison, np.uint8)
    q = np.lib.stride_tricks.as_strided(q_buf, geometry.shape, geometry.q_strides)
    words = s_buf.view(geometry.layout.dtype)
    s = np.lib.stride_tricks.as_strided(
        words, geometry.scale_shape, tuple(words.itemsize * v for v in geometry.scale_strides)
    )
    return q.view(output_format(fmt).numpy_dtype), s, q_buf, s_buf


# forcing a kernel path --------------------------------------------------------------------------

# What a test may force, by the name tests use, and the field of the tuning table
# (fp8_group_quant._tuning.Tuning) that holds it
LAUNCH_CHOICES = {
    "one_pass_max_waves": "one_pass_max_waves",  # plain input: the row loop past these waves
    "one_pass_threads": "one_pass_threads",  # the one-pass kernel's block size (0: its default)
    "waves": "row_loop_waves",  # the row loop's grid, in resident waves (None: by occupancy)
    "norm_waves": "norm_waves",  # RMSNorm: walking blocks past these waves (None: the policy)
    "norm_lanes": "norm_lanes",  # RMSNorm: 32-byte lanes a thread, 1 or 2 (None: the policy)
    "norm_stash": "norm_stash",  # RMSNorm: walking 16-bit grids may keep the weight in shared
    "silu_six_blocks_waves": "silu_six_blocks_waves",  # bf16 SiLU: six blocks an SM past these
    "table_by_threads_waves": "silu_table_waves",  # SiLU table: every thread copies past these
    "persistent_fused_waves": "persistent_fused_waves",  # plain bf16 fused: persistent grid past
    "pdl": "pdl",  # Programmatic Dependent Launch (FP8_GROUP_QUANT_PDL by default)
}


def launch_choice(name: str):
    """The tuning table's value of a choice (a key of LAUNCH_CHOICES) in force: for tests that
    predict what the policy picks."""
    from fp8_group_quant import _tuning

    return getattr(_tuning.active()[1], LAUNCH_CHOICES[name])


# the plain path's two kernels, forced: an unbounded wave limit sends every call through the
# one-pass kernel, a zero one through the row loop
PLAIN_PATHS = {"one pass": {"one_pass_max_waves": 2**62}, "row loop": {"one_pass_max_waves": 0}}


@contextlib.contextmanager
def force_path(*, fresh_plans: bool | None = None, masked_blocks_per_sm: int | None = None,
               **choices):  # fmt: skip
    """Inside the block the planner makes the ``choices`` given (keys of LAUNCH_CHOICES; None,
    for the choices that take it, is the library's own policy), and with
    ``masked_blocks_per_sm`` the masked layout's persistent grid holds that many blocks an SM.
    A block that forces anything, or asks for ``fresh_plans``, gets plans of its own (the
    tuning table's override keys them); everything is restored on exit."""
    from fp8_group_quant import _plan, _tuning

    unknown = sorted(set(choices) - set(LAUNCH_CHOICES))
    if unknown:
        raise TypeError(f"force_path: unknown choices {unknown}; known: {sorted(LAUNCH_CHOICES)}")
    changes = {LAUNCH_CHOICES[name]: value for name, value in choices.items()}
    if changes.get("one_pass_threads", 128) in (0, None):  # 0: the table's default
        changes.pop("one_pass_threads")
    if fresh_plans is None:
        fresh_plans = bool(choices) or masked_blocks_per_sm is not None
    saved_grid = _plan._masked_grid
    with contextlib.ExitStack() as stack:
        if fresh_plans or changes:
            stack.enter_context(_tuning.override(**changes))
        if masked_blocks_per_sm is not None:

            def masked_grid(key, device):
                handle, _, sms = saved_grid(key, device)
                return handle, masked_blocks_per_sm, sms

            _plan._masked_grid = masked_grid
        try:
            yield
        finally:
            _plan._masked_grid = saved_grid


def make_request(info, group_size, dtype, scale, layout, eps, pad_rows, activation=None,
                 scale_rule="rceil", masked_info=None, expected_m=None, norm=None,
                 norm_rounding="once"):  # fmt: skip
    """A Request built from positional options, as tests that plan by hand write them;
    ``norm`` is (weight info, eps_norm, residual info or None)."""
    from fp8_group_quant import _request

    eps_norm = None if norm is None else norm[1]
    options = _request.check_options(group_size, dtype, scale, layout, eps, pad_rows, activation,
                                     scale_rule, expected_m, eps_norm,
                                     norm_rounding=norm_rounding)  # fmt: skip
    operands = _request.Operands(masked_m=masked_info, weight=None if norm is None else norm[0],
                                 residual=None if norm is None else norm[2])  # fmt: skip
    return _request.make_request(info, options, operands)
