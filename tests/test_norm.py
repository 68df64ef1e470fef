"""Fused RMSNorm (and add): the defined float32 steps and their accuracy, the entry point and its
checks on the NumPy backend and the GPU, the launch policy, and the kernel's instantiations and
grids on the GPU against the NumPy backend bit for bit."""

import ml_dtypes
import numpy as np
import pytest
from backends import (
    COMBINATIONS,
    NUMPY_AND_GPU,
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    e4m3_dtype,
    poisoned_outputs,
    to_device,
    to_host,
    to_host_bytes,
    wider_rows,
)
from helpers import (
    NP_INPUT,
    activations,
    assert_same_bytes,
    force_path,
    host_poisoned,
    sums_at_rounding_hazards,
)

import fp8_group_quant as fgq
from fp8_group_quant import _abi, _jit, _plan, activation
from fp8_group_quant._layout import Geometry
from fp8_group_quant._tuning import Tuning


def scalar_sum_of_squares(row: np.ndarray, itemsize: int) -> np.float32:
    """The defined order, one value at a time: lanes of 32 bytes folded in half, 32 lanes a
    warp folded in half, the warp totals folded in half over 32 slots."""

    def fold(values):
        values = list(values)
        while len(values) > 1:
            half = len(values) // 2
            values = [np.float32(values[i] + values[i + half]) for i in range(half)]
        return values[0]

    per_lane = 32 // itemsize
    squares = [np.float32(v * v) for v in row.astype(np.float32)]
    lanes = [fold(squares[i : i + per_lane]) for i in range(0, len(squares), per_lane)]
    lanes += [np.float32(0)] * (-len(lanes) % 32)
    warps = [fold(lanes[i : i + 32]) for i in range(0, len(lanes), 32)]
    return fold(warps + [np.float32(0)] * (32 - len(warps)))


# 16-bit rows of 16, 448 and 1024 lanes, float32 ones of 16 and 1024: partial and whole warps
@pytest.mark.parametrize("k, itemsize", [(256, 2), (7168, 2), (16384, 2), (128, 4), (8192, 4)])
def test_the_sum_of_squares_follows_the_defined_order(k, itemsize):
    rng = np.random.default_rng(k)
    rows = (rng.standard_normal((3, k)) * np.exp(rng.standard_normal((3, 1)) * 3)).astype(
        np.float32
    )
    got = activation.sum_of_squares(rows, itemsize)
    for r in range(3):
        assert got[r] == scalar_sum_of_squares(rows[r], itemsize)


def test_rsqrt_is_within_1_ulp():
    rng = np.random.default_rng(0)
    d = np.concatenate([
        np.exp(rng.uniform(-80, 80, 2_000_000)).astype(np.float32),
        np.arange(np.float32(1).view(np.uint32), np.float32(4).view(np.uint32), 7,
                  dtype=np.uint32).view(np.float32),  # every 7th float32 in [1, 4)
    ])  # fmt: skip
    got = activation.rsqrt(d).astype(np.float64)
    exact = 1 / np.sqrt(d.astype(np.float64))
    ordinal = lambda v: v.astype(np.float32).view(np.int32).astype(np.int64)  # noqa: E731
    assert np.abs(ordinal(got) - ordinal(exact)).max() <= 1


# every input type
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
def test_rms_norm_is_accurate_and_rounds_once(input_dtype):
    rng = np.random.default_rng(1)
    x = activations(rng, (16, 2048), input_dtype)
    w = activations(rng, (2048,), input_dtype)
    y, _ = activation.rms_norm(x, w, 1e-6, input_dtype)
    x64 = x.astype(np.float64)
    exact = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * w.astype(np.float64)
    # one rounding to the input dtype: within one step of the dtype (plus float32 noise)
    step = np.spacing(np.abs(exact).astype(x.dtype)).astype(np.float64)
    assert (np.abs(y - exact) <= step * 0.5 + np.abs(exact) * 2e-6).mean() > 0.999
    assert np.array_equal(y, y.astype(x.dtype).astype(np.float32))  # values of the dtype


def round_once(exact: np.ndarray, dtype: str) -> np.ndarray:
    """float64 ``exact`` (exact sums) rounded once, to nearest even, to a 16-bit ``dtype``,
    by hand (no conversion that might pass through float32)."""
    bits = {"bfloat16": 8, "float16": 11}[dtype]
    info = ml_dtypes.finfo(dtype)
    _, exponent = np.frexp(exact)  # exact = m * 2^exponent, 1/2 <= |m| < 1
    unit = np.maximum(np.ldexp(1.0, exponent - bits), float(info.smallest_subnormal))
    rounded = np.rint(exact / unit) * unit  # both steps exact in float64; rint ties to even
    return np.where(np.abs(rounded) > float(info.max), np.copysign(np.inf, rounded), rounded)


# the 16-bit types, whose float32 sums may be inexact
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16"])
def test_16_bit_sums_rounded_from_float32_equal_the_exact_sums_rounded_once(input_dtype):
    # the kernel adds x and the residual of 16-bit types with one packed add, which rounds the
    # exact sum once; the definition rounds the float32 sum (kernels/activation.cuh,
    # add_residual, says why these agree). Pairs at the rounding cases, and the sums of these
    # pairs are exact in float64 (exponents at most 40 apart, 8 or 11 significant bits)
    rng = np.random.default_rng(23)
    x, residual = sums_at_rounding_hazards(rng, (256, 4096), input_dtype)
    with np.errstate(over="ignore"):
        sums = x.astype(np.float32) + residual.astype(np.float32)
    defined = activation.round_to(sums, input_dtype)
    exact = x.astype(np.float64) + residual.astype(np.float64)
    assert np.array_equal(defined.astype(np.float64), round_once(exact, input_dtype))
    # the hazards are there: float32 sums that are inexact, sums that tie in the type, that
    # are subnormal, that overflow
    assert (sums.astype(np.float64) != exact).mean() > 0.01
    ties = round_once(exact, input_dtype) != round_once(exact * (1 + 2.0**-30), input_dtype)
    assert ties.mean() > 0.01
    assert (np.abs(exact) < float(ml_dtypes.finfo(input_dtype).smallest_normal)).mean() > 0.1
    assert np.isinf(defined).mean() > 0.05


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(s, e): s = fl64(a + b) and the exact remainder e = a + b - s (Knuth's TwoSum)."""
    s = a + b
    v = s - a
    e = (a - (s - v)) + (b - v)
    return s, np.where(np.isfinite(s), e, 0.0)


# the 16-bit types, whose float32 sums may be inexact
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16"])
def test_16_bit_sums_of_every_value_rounded_from_float32_equal_rounded_once(input_dtype):
    # the same agreement, over every value of the type as b against 640 values a spread over
    # every exponent and sign (and the extremes): 42 million pairs a type. The exact sum is
    # s + e in float64 (TwoSum); rounded once by hand, a tie of s broken by the sign of e
    numpy_dtype = ml_dtypes.finfo(input_dtype).dtype
    every = np.arange(65536, dtype=np.uint16).view(numpy_dtype)
    with np.errstate(invalid="ignore"):
        b64, b32 = every.astype(np.float64), every.astype(np.float32)
    codes = np.concatenate([np.arange(0, 65536, 103), [0x0000, 0x8000, 0x0001, 0x8001]])
    info = ml_dtypes.finfo(input_dtype)
    top = np.array([float(info.max), -float(info.max)]).astype(numpy_dtype).view(np.uint16)
    inexact = ties = 0
    for code in np.concatenate([codes, top]).astype(np.uint16):
        a = code.view(numpy_dtype)
        if np.isnan(np.float32(a)):
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            defined = activation.round_to(np.float32(a) + b32, input_dtype).astype(np.float64)
            s, e = _two_sum(np.float64(a), b64)
            above, below = (round_once(s * (1 + d), input_dtype) for d in (2.0**-40, -(2.0**-40)))
            tie = above != below  # s is a midpoint of the type's grid
            toward_e = np.where(np.sign(s) * np.sign(e) > 0, above, below)
            once = np.where(tie & (e != 0), toward_e, round_once(s, input_dtype))
            rounded32 = (np.float32(a) + b32).astype(np.float64) != s
            inexact += int((np.isfinite(s) & (rounded32 | (e != 0))).sum())
        ties += int((tie & np.isfinite(s)).sum())
        same = defined.view(np.uint64) == once.view(np.uint64)
        same |= np.isnan(defined) & np.isnan(once)
        assert same.all(), (hex(int(code)), b64[~same][:4], defined[~same][:4], once[~same][:4])
    assert inexact > 1_000_000 and ties > 100_000  # float32 sums that round, exact ties


def test_quantize_with_norm_and_residual():
    rng = np.random.default_rng(2)
    x = activations(rng, (2, 3, 1024), "bfloat16", specials=True)
    w = activations(rng, (1024,), "bfloat16")
    residual = activations(rng, (2, 3, 1024), "bfloat16")
    before = residual.copy()
    q, s = fgq.quantize(x, 128, scale="ue8m0", layout="packed", norm=(w, 1e-5),
                        residual=residual)  # fmt: skip
    added = (x.astype(np.float32) + before.astype(np.float32)).astype(ml_dtypes.bfloat16)
    added[np.isnan(added)] = np.float32("nan")  # any NaN is written as the positive quiet NaN
    assert np.isnan(added).any() and added.view(np.uint16)[np.isnan(added)].tolist()[0] == 0x7FC0
    np.testing.assert_array_equal(residual.view(np.uint16), added.view(np.uint16))
    values, _ = activation.rms_norm(added, w, 1e-5, "bfloat16")
    q_ref, s_ref = fgq.quantize(values.astype(ml_dtypes.bfloat16), 128, scale="ue8m0",
                                layout="packed")  # fmt: skip
    np.testing.assert_array_equal(q.view(np.uint8), q_ref.view(np.uint8))
    np.testing.assert_array_equal(s, s_ref)
    # without a residual, x itself is normalised and nothing else changes
    q2, _ = fgq.quantize(added, 128, scale="ue8m0", layout="packed", norm=(w, 1e-5))
    np.testing.assert_array_equal(q2.view(np.uint8), q.view(np.uint8))


def test_torch_cpu_norm_writes_the_residual_in_place():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = activations(rng, (4, 512), "bfloat16")
    w = activations(rng, (512,), "bfloat16")
    r = activations(rng, (4, 512), "bfloat16")

    def tensor(a):
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)

    rt = tensor(r)
    q, s = fgq.quantize(tensor(x), 128, norm=(tensor(w), 1e-6), residual=rt)
    r_np = r.copy()
    q_ref, s_ref = fgq.quantize(x, 128, norm=(w, 1e-6), residual=r_np)
    assert np.array_equal(rt.view(torch.int16).numpy(), r_np.view(np.int16))
    assert np.array_equal(q.view(torch.uint8).numpy(), q_ref.view(np.uint8))
    assert np.array_equal(s.numpy(), s_ref)


def test_vllm_style_rounding_differs_in_few_codes():
    # vLLM's RMSNorm rounds x * rsqrt to the dtype before the weight multiply (two roundings);
    # this library rounds once. Measured on random data: the share of codes that differ.
    rng = np.random.default_rng(4)
    x = activations(rng, (64, 4096), "bfloat16")
    w = activations(rng, (4096,), "bfloat16")
    ours, _ = activation.rms_norm(x, w, 1e-6, "bfloat16")
    xf = x.astype(np.float32)
    r = activation.rsqrt(activation.sum_of_squares(xf, 2) / np.float32(4096) + np.float32(1e-6))
    twice = activation.round_to(activation.round_to(xf * r[:, None], "bfloat16") * w, "bfloat16")
    q1, _ = fgq.quantize(ours.astype(ml_dtypes.bfloat16), 128)
    q2, _ = fgq.quantize(twice.astype(ml_dtypes.bfloat16), 128)
    differ = (q1.view(np.uint8) != q2.view(np.uint8)).mean()
    assert 0 < differ < 0.05, differ  # docs/spec.md quotes this share


W = np.ones(256, ml_dtypes.bfloat16)  # a valid weight for x of 256 columns


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)  # the NumPy backend, and the GPU from both
# each argument the norm adds, wrong in each way that every backend checks alike
@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"norm": ("w", 1e-6)}, TypeError, "norm"),
        ({"norm": (np.ones(512, ml_dtypes.bfloat16), 1e-6)}, ValueError, r"norm: the weight"),
        ({"norm": (W[:128], 1e-6)}, ValueError, "norm: the weight must be a bfloat16 array"),
        ({"norm": (np.ones(256, np.float32), 1e-6)}, ValueError,
         "norm: the weight must be a bfloat16 array"),
        ({"norm": (W, 0.0)}, ValueError, "norm: eps_norm must be a positive finite float"),
        ({"norm": (W, float("nan"))}, ValueError, "norm: eps_norm"),
        ({"norm": [W, 1e-6]}, TypeError, "norm: expected a"),
        ({"residual": np.ones((4, 256), ml_dtypes.bfloat16)}, ValueError,
         "residual: the fused add needs norm"),
        ({"norm": (W, 1e-6), "residual": np.ones((4, 128), ml_dtypes.bfloat16)}, ValueError,
         "residual: expected"),
        ({"norm": (W, 1e-6), "residual": np.ones((2, 256), ml_dtypes.bfloat16)}, ValueError,
         "residual: expected a bfloat16"),
        ({"norm": (W, 1e-6), "residual": np.ones((4, 256), np.float32)}, ValueError,
         "residual: expected"),
        ({"norm": (W, 1e-6), "activation": "silu_mul"}, ValueError,
         "norm: cannot be combined with activation"),
    ],
)  # fmt: skip
def test_bad_norm_arguments_are_named_and_nothing_is_written(kwargs, error, message, backend):
    x_host = activations(np.random.default_rng(5), (4, 256), "bfloat16")
    x = to_device(x_host, backend)
    given = {name: on_backend(value, backend) for name, value in kwargs.items()}
    out = to_device(np.full((4, 256), 0x55, np.uint8), backend).view(e4m3_dtype(backend))
    with pytest.raises(error, match=message):
        fgq.quantize(x, 128, out=out, **given)
    assert (to_host_bytes(out) == 0x55).all()
    assert_same_bytes(to_host_bytes(x), x_host, "x")  # read only
    if "residual" in kwargs:  # nothing written back either
        assert_same_bytes(to_host_bytes(given["residual"]), kwargs["residual"], "residual")


def on_backend(value, backend: str):
    """``value`` with its numpy arrays (those in tuples too) moved to ``backend``."""
    if isinstance(value, np.ndarray):
        return to_device(value, backend)
    if isinstance(value, tuple):
        return tuple(on_backend(v, backend) for v in value)
    return value


def test_a_residual_that_cannot_be_written_is_refused_untouched():
    rng = np.random.default_rng(6)
    x = activations(rng, (4, 256), "bfloat16")
    w = activations(rng, (256,), "bfloat16")
    frozen = activations(rng, (4, 256), "bfloat16")
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="residual: the array is read-only"):
        fgq.quantize(x, 128, norm=(w, 1e-6), residual=frozen)
    with pytest.raises(ValueError, match="residual: its memory overlaps x"):
        fgq.quantize(x, 128, norm=(w, 1e-6), residual=x)
    residual = activations(rng, (4, 256), "bfloat16")
    before = residual.copy()
    bad_out = np.empty((4, 128), ml_dtypes.float8_e4m3fn)  # wrong shape: refused
    with pytest.raises(ValueError, match="out"):
        fgq.quantize(x, 128, norm=(w, 1e-6), residual=residual, out=bad_out)
    assert np.array_equal(residual.view(np.uint16), before.view(np.uint16))
    wide = activations(rng, (2, 16384 + 256), "bfloat16")
    with pytest.raises(ValueError, match="x: norm takes rows of at most 16384"):
        fgq.quantize(wide, 128, norm=(np.ones(16640, ml_dtypes.bfloat16), 1e-6))


@pytest.mark.parametrize(
    "shape, kwargs, layout, scale_shape",
    [
        ((2, 3, 512), {}, "row", (6, 4)),  # vLLM flattens the leading dimensions
        ((2, 3, 512), {"is_scale_transposed": True}, "col", (6, 4)),
        ((2, 3, 512), {"is_scale_transposed": True, "tma_alignment": 4}, "col_tma", (2, 3, 4)),
    ],
)
def test_vllm_rms_norm_per_block_quant(shape, kwargs, layout, scale_shape):
    from fp8_group_quant.compat import rms_norm_per_block_quant

    rng = np.random.default_rng(7)
    x = activations(rng, shape, "bfloat16")
    w = activations(rng, shape[-1:], "bfloat16")
    residual = activations(rng, shape, "bfloat16")
    expected_residual = residual.copy()
    q, s = rms_norm_per_block_quant(x, w, 1e-6, "e4m3", [1, 128], residual=residual, **kwargs)
    assert q.shape == shape and s.shape == scale_shape
    q_ref, s_ref = fgq.quantize(x.reshape(scale_shape[:-1] + (512,)), 128, layout=layout,
                                norm=(w, 1e-6), norm_rounding="twice_unrounded_sum",  # vLLM's
                                residual=expected_residual.reshape(
                                    scale_shape[:-1] + (512,)))  # fmt: skip
    np.testing.assert_array_equal(q.view(np.uint8).reshape(-1), q_ref.view(np.uint8).reshape(-1))
    np.testing.assert_array_equal(s, s_ref)
    np.testing.assert_array_equal(residual.view(np.uint16), expected_residual.view(np.uint16))
    with pytest.raises(NotImplementedError, match="scale_ub"):
        rms_norm_per_block_quant(x, w, 1e-6, "e4m3", [1, 128], scale_ub=np.ones(1, np.float32))


def test_the_kernel_block_holds_a_row_of_the_defined_lanes():
    # one thread block a row: the kernel's lane limit is the definition's, and its blocks hold
    # whole warps of lanes, one or two a thread, at most 32 warps of lanes
    from fp8_group_quant import _plan

    assert _abi.MAX_NORM_LANES == 1024 and _plan.lane_bytes() == _abi.LANE_BYTES == 32
    lanes = (1, 32, 33, 64, 65, 448, 960, 1000, 1024)
    assert [_plan.norm_threads(n, 1) for n in lanes] == [32, 32, 64, 64, 96, 448, 960, 1024, 1024]
    assert [_plan.norm_threads(n, 2) for n in lanes] == [32, 32, 32, 32, 64, 224, 480, 512, 512]
    for bad in ((1025, 1), (0, 2), (64, 3)):
        with pytest.raises(AssertionError):
            _plan.norm_threads(*bad)


# each side of a one-lane wave (264 rows) and of the residual's window; the knob both ways
@pytest.mark.parametrize("rows, knob, lanes", [
    (1, None, 1), (264, None, 1), (265, None, 2), (1000, None, 2), (16384, None, 2),
    (16384, 1, 1), (1, 2, 2),
])  # fmt: skip
def test_the_norm_takes_two_lanes_a_thread_on_many_rows(rows, knob, lanes):
    # two 448-thread blocks an SM of one lane, 132 SMs: 264 a wave; with the residual, one
    # lane again between 1.5 and 6.5 waves (397-1716 rows), where its blocks walk
    from fp8_group_quant import _plan

    tuning = Tuning(norm_lanes=knob)
    assert _plan.norm_lanes(rows, 2, 132, False, tuning) == lanes
    window = knob is None and 396 < rows <= 1716
    assert _plan.norm_lanes(rows, 2, 132, True, tuning) == (1 if window else lanes)
    if knob is None:
        assert [_plan.norm_lanes(n, 2, 132, True, tuning) for n in (396, 397, 1716, 1717)] == [
            2,
            1,
            1,
            2,
        ]


@pytest.mark.parametrize("rows, residual, lanes, grid, stash", [
    (200, False, 1, 200, False),  # within a wave of one-lane blocks (264): one lane, a row each
    (300, True, 2, 300, False),  # past it: two lanes; the residual: a block a row
    (528, False, 2, 528, False),  # a row for each block of the two-lane wave (528)
    (529, False, 2, 528, True),  # past it: a wave of walking blocks, the weight stashed
    (396, True, 2, 396, False),  # the residual up to 1.5 one-lane waves: two lanes, a row each
    (397, True, 1, 264, False),  # past it: one lane, a wave of walking blocks (no stash)
    (528, True, 1, 264, False),
    (1716, True, 1, 264, False),  # up to 6.5 one-lane waves
    (1717, True, 2, 1717, False),  # past them: two lanes, a row each again
    (4096, True, 2, 4096, False),
])  # fmt: skip
def test_the_norm_launch_picks_lanes_then_grid(monkeypatch, rows, residual, lanes, grid, stash):
    # 132 SMs fitting two one-lane blocks (448 threads at K = 7168) or four two-lane ones
    # (224): the lanes from the one-lane kernel's wave, the grid from the chosen kernel's
    name, got_grid, block, params, pdl, shared = planned_norm(monkeypatch, rows, residual)
    assert name.endswith(f"fgq::kPackedExponents, {lanes}, {str(stash).lower()}>")
    assert got_grid == (grid, 1, 1) and block == ({1: 448, 2: 224}[lanes], 1, 1)
    assert shared == (224 * 2 * 16 * 4 if stash else 0)  # two lanes of 16 float32 a thread
    assert params.rows == rows and params.eps_norm == np.float32(1e-6) and not pdl
    assert params.norm_rounding == 0


def planned_norm(monkeypatch, rows, residual, norm_rounding="once", tuning=None):
    """(kernel name, grid, block, Params, pdl, shared bytes) the planner gives bfloat16 rows
    of K = 7168 on 132 SMs that fit two one-lane blocks or four two-lane ones; the Launch
    records its arguments instead of launching."""
    import contextlib
    import types

    from helpers import make_request

    from fp8_group_quant import _jit, _plan
    from fp8_group_quant._arrays import describe

    names = []

    def get_function(source, expression, device):
        names.append(expression)
        return types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=len(names)))

    def resident_blocks(handle, name, threads, device, shared=0):
        # the stashing kernel's 28 KB a block would not lower these (224 KB an SM)
        return (2 if name.endswith(", 1, false>") else 4), 132

    monkeypatch.setattr(_jit, "get_function", get_function)
    monkeypatch.setattr(_jit, "current_device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(_plan, "resident_blocks", resident_blocks)
    monkeypatch.setattr(_plan, "pdl_supported", lambda device, enabled=True: False)
    monkeypatch.setattr(_plan, "Launch", lambda *args: args)
    monkeypatch.setattr(_plan, "allow_shared", lambda *args: pytest.fail("28 KB needs no opt-in"))
    x = np.empty((rows, 7168), ml_dtypes.bfloat16)
    weight = np.empty(7168, ml_dtypes.bfloat16)
    r = describe(np.empty_like(x), "residual") if residual else None
    request = make_request(describe(x, "x"), 128, "e4m3", "ue8m0", "packed", 1e-10, False,
                           norm=(describe(weight, "weight"), 1e-6, r),
                           norm_rounding=norm_rounding)  # fmt: skip
    handle, grid, block, params, pdl, shared = _plan.prepare(request, 0, tuning or Tuning())[-1]
    return names[handle - 1], grid, block, params, pdl, shared


# where the residual takes two lanes: a row a block up to 1.5 one-lane waves and past 6.5,
# and the knob forcing two lanes (a walking grid)
@pytest.mark.parametrize("rows, knob, grid", [(300, None, 264), (4096, None, 264),
                                              (100, 2, 100), (4096, 2, 264)])  # fmt: skip
def test_the_unrounded_sum_takes_one_lane_a_thread(monkeypatch, rows, knob, grid):
    # only the one-lane kernel has the unrounded sum's path (kernels/norm.cuh, norm_rows), so
    # the planner gives it one lane whatever rows or tuning say; without a residual the mode
    # is "twice" and takes the lanes "once" would
    tuning = Tuning(norm_lanes=knob)
    assert _plan.norm_lanes(rows, 2, 132, True, tuning) == 2
    assert _plan.norm_lanes(rows, 2, 132, True, tuning, unrounded_sum=True) == 1
    assert _plan.norm_lanes(rows, 2, 132, False, tuning, unrounded_sum=True) == 2
    name, got_grid, block, params, _, shared = planned_norm(
        monkeypatch, rows, True, "twice_unrounded_sum", tuning
    )
    assert name.endswith("fgq::kPackedExponents, 1, false>") and block == (448, 1, 1)
    assert got_grid == (grid, 1, 1) and shared == 0
    assert params.norm_rounding == _abi.NORM_ROUNDINGS.index("twice_unrounded_sum") == 2


def test_only_walking_grids_of_16_bit_input_without_a_residual_stash_the_weight():
    from fp8_group_quant import _plan

    assert _plan.norm_stashes("bfloat16", 2, residual=False)
    assert _plan.norm_stashes("float16", 2, residual=False)
    assert not _plan.norm_stashes("float32", 2, residual=False)  # nothing to unpack
    assert not _plan.norm_stashes("bfloat16", 2, residual=True)
    assert not _plan.norm_stashes("bfloat16", 1, residual=False)
    # 1024 lanes (K = 16384), two a thread: 64 KB, past the 48 KB a block takes unasked
    assert _plan.norm_stash_bytes(512, 2) == 65536 > _plan.STATIC_SHARED_LIMIT
    keys = [k for k in _plan.all_kernel_keys() if k.norm_stash]
    assert len(keys) == 2 * 40 and all(k.norm_lanes == 2 for k in keys)
    assert {k.input_dtype for k in keys} == {"bfloat16", "float16"}


# every input type
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("rounding", _abi.NORM_ROUNDINGS)  # each norm_rounding
def test_numpy_backend_matches_the_spec_text_transcribed(input_dtype, rounding):
    # spec_model.rms_norm_row follows section 2b's words one float32 step at a time; the NumPy
    # backend (which the kernel is checked against) must give the same bits, residual included
    from fp8_group_quant import spec_model

    rng = np.random.default_rng(31)
    widest = 16384 if input_dtype != "float32" else 8192  # 1024 lanes: 32 full warps
    for k in (32, 96, 2688, 7168, widest):
        x = activations(rng, (2, k), input_dtype, specials=k == 2688)
        w = activations(rng, (k,), input_dtype)
        r = activations(rng, (2, k), input_dtype)
        for residual in (None, r):
            y, new_residual = activation.rms_norm(x, w, 1e-5, input_dtype, residual, rounding)
            for row in range(2):
                want, want_residual = spec_model.rms_norm_row(
                    x[row].astype(np.float32).tolist(), w.astype(np.float32).tolist(), 1e-5,
                    input_dtype, None if residual is None else r[row].astype(np.float32).tolist(),
                    rounding,
                )  # fmt: skip
                got = np.asarray(y[row], np.float32)
                want = np.asarray(want, np.float32)
                same = (got.view(np.uint32) == want.view(np.uint32)) | (
                    np.isnan(got) & np.isnan(want)
                )
                assert same.all(), (k, row, residual is not None, np.flatnonzero(~same)[:5])
                if residual is not None:
                    got_r = np.asarray(new_residual[row], np.float32)
                    want_r = np.asarray(want_residual, np.float32)
                    assert np.array_equal(got_r, want_r, equal_nan=True), (k, row)


# every input type
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
def test_twice_unrounded_sum_normalises_the_float32_sum(input_dtype):
    # norm_rounding="twice_unrounded_sum", its steps written out: s = RN(x + residual) kept in
    # float32 for the sum of squares and for RN(s * r), rounded before the weight, round(s)
    # written back (NaN as +NaN) through the entry point; rows with outliers, NaN and Inf
    f32 = np.float32
    rng = np.random.default_rng(53)
    k = 2688
    x = activations(rng, (6, k), input_dtype, specials=True)
    w = activations(rng, (k,), input_dtype)
    residual = activations(rng, (6, k), input_dtype)
    written = residual.copy()
    q, s = fgq.quantize(x, 128, norm=(w, 1e-6), residual=written,
                        norm_rounding="twice_unrounded_sum")  # fmt: skip
    with np.errstate(invalid="ignore", over="ignore"):
        total = (x.astype(f32) + residual.astype(f32)).astype(f32)
        squares = activation.sum_of_squares(total, x.itemsize)
        r = activation.rsqrt((squares / f32(k) + f32(1e-6)).astype(f32))
        y = activation.round_to((total * r[:, None]).astype(f32), input_dtype)
        y = activation.round_to((y * w.astype(f32)).astype(f32), input_dtype)
    y[np.isnan(y)] = f32("nan")  # the positive quiet NaN
    assert np.isnan(y).any() and np.isinf(total).any()
    q_ref, s_ref = fgq.quantize(y.astype(NP_INPUT[input_dtype]), 128)
    assert_same_bytes(q.view(np.uint8), q_ref.view(np.uint8), "q")
    assert_same_bytes(s.view(np.uint8), s_ref.view(np.uint8), "scales")
    rounded = total.astype(NP_INPUT[input_dtype])
    rounded[np.isnan(rounded)] = f32("nan")
    assert_same_bytes(written, rounded, "residual written back")
    # the rounded sum normalised ("twice") gives other codes where 16-bit sums round, and the
    # same for float32 input, whose sums are float32's; without a residual it is "twice"
    again = residual.copy()
    q_twice, _ = fgq.quantize(x, 128, norm=(w, 1e-6), residual=again, norm_rounding="twice")
    assert_same_bytes(again, written, "residual written back by 'twice'")
    differ = (q_twice.view(np.uint8) != q.view(np.uint8)).mean()
    assert differ > 0.001 if input_dtype != "float32" else differ == 0, differ
    alone = [fgq.quantize(x, 128, norm=(w, 1e-6), norm_rounding=m)[0] for m in ("twice",
             "twice_unrounded_sum")]  # fmt: skip
    assert_same_bytes(alone[0].view(np.uint8), alone[1].view(np.uint8), "q without residual")


# each wrong value, and the mode without norm
@pytest.mark.parametrize("kwargs, message", [
    ({"norm_rounding": "unrounded"}, "norm_rounding: expected one of 'once', 'twice', "
                                     "'twice_unrounded_sum', got 'unrounded'"),
    ({"norm_rounding": None}, "norm_rounding: expected one of"),
    ({"norm_rounding": "twice_unrounded_sum", "norm": None}, "norm_rounding: applies to the "
                                                             "fused RMSNorm"),
    ({"norm_rounding": "twice_unrounded_sum", "norm": None, "dtype": "e2m1"}, "norm_rounding"),
])  # fmt: skip
def test_norm_rounding_values_are_checked(kwargs, message):
    rng = np.random.default_rng(57)
    x = activations(rng, (4, 256), "bfloat16")
    given = {"norm": (activations(rng, (256,), "bfloat16"), 1e-6), **kwargs}
    residual = activations(rng, (4, 256), "bfloat16")
    before = residual.copy()
    if given["norm"] is not None:
        given["residual"] = residual
    with pytest.raises(ValueError, match=message):
        fgq.quantize(x, 32, **given)
    assert_same_bytes(residual, before, "residual")  # nothing written back


def test_norm_arguments_the_review_found_unchecked():
    from helpers import make_request

    from fp8_group_quant import api
    from fp8_group_quant._arrays import ArrayInfo

    rng = np.random.default_rng(41)
    x = activations(rng, (4, 256), "bfloat16")
    w = activations(rng, (256,), "bfloat16")
    with pytest.raises(ValueError, match="expected_m: a hint for the masked layout"):
        fgq.quantize(x, 128, norm=(w, 1e-6), expected_m=2)
    buffer = activations(rng, (4 * 256 + 256,), "bfloat16")
    residual, weight = buffer[:1024].reshape(4, 256), buffer[768:1024]  # weight = last row
    with pytest.raises(ValueError, match="residual: its memory overlaps norm's"):
        fgq.quantize(x, 128, norm=(weight, 1e-6), residual=residual)

    # on a GPU the kernel writes each row of the residual back: rows sharing bytes are refused
    # (checked here on descriptions of device arrays, before anything would be launched)
    def device(shape, strides, ptr):
        return ArrayInfo("cupy", None, ptr, shape, strides, "bfloat16", 2, 0)

    w_info = device((4096,), (1,), 1 << 24)
    options = (128, "e4m3", "float32", "row", 1e-10, False)
    x_info = device((64, 4096), (4096, 1), 1 << 20)
    for strides in ((0, 1), (8, 1)):  # a broadcast row, rows overlapping by most of their bytes
        residual_info = device((64, 4096), strides, 1 << 28)
        with pytest.raises(ValueError, match="residual: its rows overlap"):
            make_request(x_info, *options, norm=(w_info, 1e-6, residual_info))
    x_info = device((2, 3, 4096), (3 * 4096, 4096, 1), 1 << 20)
    batched = device((2, 3, 4096), (4096, 4096, 1), 1 << 28)  # batch 1 starts inside batch 0
    with pytest.raises(ValueError, match="residual: its rows overlap"):
        make_request(x_info, *options, norm=(w_info, 1e-6, batched))
    # rows and batches in reverse order own their bytes: accepted, with their negative strides;
    # reversed rows a few elements apart still overlap
    reversed_rows = device((2, 3, 4096), (3 * 4096, -4096, 1), 1 << 28)
    request = make_request(x_info, *options, norm=(w_info, 1e-6, reversed_rows))
    assert (request.r_batch_stride, request.r_row_stride) == (3 * 4096, -4096)
    reversed_batches = device((2, 3, 4096), (-3 * 4096, 4096, 1), 1 << 28)
    request = make_request(x_info, *options, norm=(w_info, 1e-6, reversed_batches))
    assert (request.r_batch_stride, request.r_row_stride) == (-3 * 4096, 4096)
    x_info = device((64, 4096), (4096, 1), 1 << 20)
    with pytest.raises(ValueError, match="residual: its rows overlap"):
        make_request(x_info, *options, norm=(w_info, 1e-6, device((64, 4096), (-8, 1), 1 << 28)))
    # warmup names what it cannot compile
    with pytest.raises(ValueError, match="scale_rule: expected one of"):
        api._warmup_options({"scale": "ue8m0", "scale_rule": "bogus"})


# the fused RMSNorm kernel on the GPU against the NumPy backend ------------------------------------


def check_norm(x_host, weight, eps_norm, residual, lib, group_size, dtype, scale, layout,
               pad_rows=False, x_device=None, norm_rounding="once"):  # fmt: skip
    """The RMSNorm kernel into poisoned device storage against the NumPy backend into poisoned
    host storage, every byte, and the residual written back against the NumPy one."""
    geometry = Geometry(x_host.shape, group_size, layout, pad_rows)
    options = dict(dtype=dtype, scale=scale, layout=layout, pad_rows=pad_rows,
                   norm_rounding=norm_rounding)  # fmt: skip
    q, s, q_buf, s_buf = poisoned_outputs(geometry, lib, dtype)
    r_device = None if residual is None else to_device(residual, lib)
    x_device = to_device(x_host, lib) if x_device is None else x_device
    fgq.quantize(x_device, group_size, **options, norm=(to_device(weight, lib), eps_norm),
                 residual=r_device, out=q, scale_out=s)  # fmt: skip
    hq, hs, hq_buf, hs_buf = host_poisoned(geometry, dtype)
    r_host = None if residual is None else residual.copy()
    fgq.quantize(x_host, group_size, **options, norm=(weight, eps_norm), residual=r_host,
                 out=hq, scale_out=hs)  # fmt: skip
    what = f"norm {lib} {x_host.dtype} G={group_size} {dtype} {scale} {layout} {x_host.shape}"
    what += f" {norm_rounding}" + (" with residual" if residual is not None else "")
    assert_same_bytes(to_host_bytes(q_buf), hq_buf, f"q ({what})")
    assert_same_bytes(to_host_bytes(s_buf), hs_buf, f"scales ({what})")
    if residual is not None:
        assert_same_bytes(to_host_bytes(r_device), r_host, f"residual ({what})")


# the kernel's two instantiations a combination has: one lane a thread, and two
@pytest.fixture(params=["one lane, a block a row", "two lanes, one walking block"])
def norm_kernel(request):
    """The RMSNorm kernel's two instantiations a combination has (one or two lanes a thread),
    the second as a single block that walks every row, whatever the rows."""
    walking = request.param.startswith("two")
    lanes, waves = (2, 1e-9) if walking else (1, 0.0)  # one block, or a row each
    with force_path(norm_lanes=lanes, norm_waves=waves):
        yield walking


@pytest.mark.gpu
# every input type, group size and registered (format, scale, layout)
@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS)
# the default, and vLLM's add-RMSNorm: with a residual a path of the one-lane kernel, which
# its launch takes whatever norm_kernel asks; without one "twice", in both kernels
@pytest.mark.parametrize("rounding", ["once", "twice_unrounded_sum"])
def test_norm_every_combination(norm_kernel, input_dtype, group_size, dtype, scale, layout,
                                rounding):  # fmt: skip
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("cupy", "torch")[(index + norm_kernel) % 2]
    rng = np.random.default_rng(3000 + index + 500 * norm_kernel)
    k = 3 * group_size  # three groups: a partly used packed word
    x = activations(rng, (5, k), input_dtype, specials=index % 3 == 0)
    weight = activations(rng, (k,), input_dtype)
    with_residual = (index + norm_kernel) % 2 or rounding != "once"
    residual = activations(rng, (5, k), input_dtype) if with_residual else None
    args = (lib, group_size, dtype, scale, layout)
    check_norm(x, weight, 1e-6, residual, *args, norm_rounding=rounding)
    big = 16384 if input_dtype != "float32" else 8192  # the longest row: 1024 lanes
    for shape in ((2, 3, 7168), (3 if norm_kernel else 1, big)):
        x = activations(rng, shape, input_dtype, specials=True)
        weight = activations(rng, shape[-1:], input_dtype)
        residual = activations(rng, shape, input_dtype)
        check_norm(x, weight, 1e-5, residual, *args, pad_rows=True, norm_rounding=rounding)
        check_norm(x, weight, 1e-5, None, *args, norm_rounding=rounding)


@pytest.mark.gpu
# every input type
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
def test_norm_nan_and_inf_in_any_lane_of_x_and_the_weight(input_dtype):
    # the quantizer's float maximum keeps NaN, and the residual written back is tested for NaN
    # only in lanes whose sum of squares is not finite (kernels/quantize.cu, norm_rows): rows of
    # one NaN, one Inf, squares that overflow to Inf (r = 0), a zero weight under an Inf,
    # weights holding Inf and NaN, and residuals that make NaN in the sum or bring it
    rng = np.random.default_rng(77)
    k = 2688  # 168 lanes of 16-bit input: the second lane of a thread partly past the row
    big = {"bfloat16": 1e30, "float16": 60000.0, "float32": 1e30}[input_dtype]
    x = activations(rng, (12, k), input_dtype).astype(np.float32)
    x[1, 5] = np.nan
    x[2, k - 1] = np.inf
    x[3, 1700] = -np.inf
    x[4, 100:140] = big  # squares overflow: S = Inf, r = 0
    x[5, 2000] = big
    x[6, 7] = np.inf  # under a zero weight below
    x[7] = 0.0
    weight = activations(rng, (k,), input_dtype).astype(np.float32)
    weight[7] = 0.0
    x = x.astype(NP_INPUT[input_dtype])
    check_norm(x, weight.astype(NP_INPUT[input_dtype]), 1e-6, None, "cupy", 128, "e4m3", "ue8m0",
               "packed")  # fmt: skip
    weight[[3, 1500, k - 2]] = [np.inf, np.nan, -np.inf]  # now a weight with Inf and NaN
    weight = weight.astype(NP_INPUT[input_dtype])
    check_norm(x, weight, 1e-6, None, "cupy", 128, "e4m3", "ue8m0", "packed")
    residual = activations(rng, (12, k), input_dtype).astype(np.float32)
    residual[2, k - 1] = -np.inf  # Inf + -Inf: a NaN made by the sum, written back
    residual[8, 9] = np.nan  # a NaN from the residual alone, in a row of finite x
    residual[9, 2600] = np.inf  # an Inf from the residual alone
    residual = residual.astype(NP_INPUT[input_dtype])
    check_norm(x, weight, 1e-6, residual, "torch", 64, "e5m2", "float32", "row")
    check_norm(x, weight, 1e-6, residual, "cupy", 128, "e4m3", "ue8m0", "packed")
    # the float32 sums normalised: NaN and Inf from them, the rounded sums written back
    check_norm(x, weight, 1e-6, residual, "cupy", 128, "e4m3", "ue8m0", "packed",
               norm_rounding="twice_unrounded_sum")  # fmt: skip


@pytest.mark.gpu
# the 16-bit types, whose x + residual is one packed add
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16"])
# the rounded sum normalised, and the float32 sum (written back rounded all the same)
@pytest.mark.parametrize("rounding", ["once", "twice_unrounded_sum"])
def test_norm_residual_sums_at_the_rounding_cases(norm_kernel, input_dtype, rounding):
    # 16-bit x + residual is one packed add (the exact sum rounded once; kernels/activation.cuh,
    # add_residual), the definition the float32 sum rounded: sums whose float32 value is
    # inexact, ties and near-ties, cancelling, subnormal and overflowing, written back and
    # normalised, in both kernels (one lane a thread, and two); "twice_unrounded_sum"
    # normalises the float32 sums themselves
    rng = np.random.default_rng(41 + norm_kernel)
    for rows, k in ((6, 4096), (40, 2688)):
        x, residual = sums_at_rounding_hazards(rng, (rows, k), input_dtype)
        weight = activations(rng, (k,), input_dtype)
        mode = dict(norm_rounding=rounding)
        check_norm(x, weight, 1e-6, residual, "cupy", 128, "e4m3", "ue8m0", "packed", **mode)
        check_norm(x, weight, 1e-6, residual, "torch", 64, "e5m2", "float32", "row", **mode)


@pytest.mark.gpu
# the weight-stashing kernel, and (NORM_STASH off) the general one
@pytest.mark.parametrize("stash", [True, False])
# one and two 32-byte lanes a thread
@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("waves", [0.0, 0.005, 1.0, 3.0])  # a block a row, a few, the default
def test_norm_blocks_walk_every_row_of_every_batch(waves, lanes, stash):
    # the row loop: a grid of a few blocks walks 150 rows over three batches, alternating warp
    # slot sets; with the residual written back and padded rows zeroed at each batch's end.
    # Without the residual, two lanes walking take the weight-stashing kernel, or with
    # NORM_STASH off the general kernel
    rng = np.random.default_rng(13)
    x = activations(rng, (3, 50, 2688), "bfloat16", specials=True)
    weight = activations(rng, (2688,), "bfloat16")
    residual = activations(rng, (3, 50, 2688), "bfloat16")
    with force_path(norm_waves=waves, norm_lanes=lanes, norm_stash=stash):
        args = ("torch", 128, "e4m3", "ue8m0", "packed")
        check_norm(x, weight, 1e-6, residual, *args, pad_rows=True)
        # the float32 sums, in one-lane blocks (the launch's choice for them) walking alike
        check_norm(x, weight, 1e-6, residual, *args, pad_rows=True,
                   norm_rounding="twice_unrounded_sum")  # fmt: skip
        check_norm(x, weight, 1e-6, None, "cupy", 64, "e5m2", "float32", "col_tma", pad_rows=True)


@pytest.mark.gpu
@pytest.mark.parametrize("input_dtype, shape, group_size, dtype, scale, layout", [
    ("bfloat16", (3, 700, 7168), 128, "e4m3", "ue8m0", "packed"),
    ("float16", (40, 16384), 128, "e5m2", "float32", "row"),  # 64 KB of shared memory a block
    ("bfloat16", (333, 2688), 64, "int8", "float32", "col_tma"),  # a thread's second lane short
    ("float16", (257, 96), 32, "e4m3", "ue8m0", "blocked"),
])  # fmt: skip
def test_norm_walking_blocks_keep_the_weight_in_shared_memory(
    monkeypatch, input_dtype, shape, group_size, dtype, scale, layout
):
    # the weight-stashing kernel (16-bit input, no residual, a grid that walks): each thread's
    # weight values as float32 in shared memory, r from one warp behind a second barrier, the
    # next row prefetched into L2 while a block has two more; grids of a few blocks walk many
    # rows (and batches), and the kernel the launch took is checked
    names, opt_ins = [], []
    get_function = _jit.get_function

    def spy(source, expression, device):
        names.append(expression)
        return get_function(source, expression, device)

    allow_shared = _plan.allow_shared

    def opt_in(handle, shared):
        opt_ins.append(shared)
        allow_shared(handle, shared)

    monkeypatch.setattr(_jit, "get_function", spy)
    monkeypatch.setattr(_plan, "allow_shared", opt_in)
    rng = np.random.default_rng(sum(shape) + group_size)
    x = activations(rng, shape, input_dtype, specials=True)
    weight = activations(rng, shape[-1:], input_dtype)
    args = (group_size, dtype, scale, layout)
    with force_path(norm_waves=0.02, norm_lanes=2):  # 10 blocks (4 a 132-SM wave x 0.02)
        check_norm(x, weight, 1e-6, None, "torch", *args, pad_rows=True)
        assert any(name.endswith(", 2, true>") for name in names), names
        assert opt_ins == ([65536] if shape[-1] == 16384 else [])
        check_norm(x, weight, 1e-6, None, "cupy", *args)


@pytest.mark.gpu
def test_norm_with_the_residual_walks_one_lane_a_thread_by_default(monkeypatch):
    # the launch policy as shipped (norm_lanes' residual window): 1200 rows of 7168 with the
    # residual are past 1.5 waves of the one-lane kernel on every GPU with at most 400 SMs and
    # within 6.5 on every GPU with at least 70, so one lane a thread and a grid of walking
    # blocks, each taking several rows; the residual written back, every byte checked
    names, grids = [], []
    get_function, launch_type = _jit.get_function, _plan.Launch

    def spy(source, expression, device):
        names.append(expression)
        return get_function(source, expression, device)

    class Recorded(launch_type):
        def __init__(self, handle, grid, block, *args, **kwargs):
            grids.append(grid)
            super().__init__(handle, grid, block, *args, **kwargs)

    monkeypatch.setattr(_jit, "get_function", spy)
    monkeypatch.setattr(_plan, "Launch", Recorded)
    rng = np.random.default_rng(23)
    x = activations(rng, (1200, 7168), "bfloat16", specials=True)
    weight = activations(rng, (7168,), "bfloat16")
    residual = activations(rng, (1200, 7168), "bfloat16")
    with force_path(fresh_plans=True):  # the policy as shipped, planned afresh
        check_norm(x, weight, 1e-6, residual, "torch", 128, "e4m3", "ue8m0", "packed")
    assert names and names[-1].endswith(", 1, false>"), names
    assert grids and grids[-1][0] < 1200, grids  # fewer blocks than rows: they walk


@pytest.mark.gpu
# both GPU libraries
@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_norm_rows_inside_wider_buffers_many_rows_and_odd_widths(lib):
    rng = np.random.default_rng(12)
    x = activations(rng, (1000, 2688), "bfloat16")  # 21 groups: a row of 168 lanes
    weight = activations(rng, (2688,), "bfloat16")
    residual = activations(rng, (1000, 2688), "bfloat16")
    check_norm(x, weight, 1e-6, residual, lib, 128, "e4m3", "ue8m0", "packed",
               x_device=wider_rows(x, 128, lib, 64))  # fmt: skip
    tiny = activations(rng, (3, 32), "float32")  # one lane pair, one warp mostly idle
    check_norm(tiny, activations(rng, (32,), "float32"), 1e-3, None, lib, 32, "int8", "float32",
               "col")  # fmt: skip
    zero_rows = np.zeros((4, 512), NP_INPUT["float16"])  # mean 0: r = 1 / sqrt(eps)
    check_norm(zero_rows, activations(rng, (512,), "float16"), 1e-6, None, lib, 128, "e5m2",
               "ue8m0", "row")  # fmt: skip


@pytest.mark.gpu
def test_norm_refuses_bad_arguments_before_writing_anything():
    import cupy
    import torch

    rng = np.random.default_rng(11)
    x = to_device(activations(rng, (4, 256), "bfloat16"), "torch")
    w = torch.ones(256, dtype=torch.bfloat16, device="cuda")
    residual = torch.zeros_like(x)
    # what only device arrays can get wrong; test_bad_norm_arguments_are_named_and_nothing_is_
    # written names the rest on every backend
    bad = (
        (dict(norm=(w.cpu(), 1e-6)), (ValueError, TypeError), "norm"),
        (dict(norm=(cupy.ones(256, cupy.float32), 1e-6)), TypeError,
         "norm: the weight must be an array of x's library"),
        (dict(norm=(w, 1e-6), residual=residual.t().contiguous().t()), ValueError,
         "residual: the last dimension must be contiguous"),
        (dict(norm=(w, 1e-6), residual=x), ValueError, "residual: its memory overlaps x"),
    )  # fmt: skip
    before = x.clone()
    for kwargs, error, match in bad:
        with pytest.raises(error, match=match):
            fgq.quantize(x, 128, **kwargs)
    assert not residual.any() and torch.equal(x, before)
    wide = torch.zeros((4, 264), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="x: norm needs a 16-byte aligned input"):
        fgq.quantize(wide[:, 4:260], 128, norm=(w, 1e-6))
    with pytest.raises(ValueError, match="norm: the weight must be 16-byte aligned"):
        fgq.quantize(x, 128, norm=(wide[0, 4:260], 1e-6))
    with pytest.raises(ValueError, match="x: norm takes rows of at most 16384"):
        fgq.quantize(
            torch.zeros((1, 16512), dtype=torch.bfloat16, device="cuda"),
            128,
            norm=(torch.ones(16512, dtype=torch.bfloat16, device="cuda"), 1e-6),
        )
    q, s = fgq.quantize(x[:0], 128, norm=(w, 1e-6), residual=residual[:0])
    assert q.shape == (0, 256) and s.shape[0] == 0


@pytest.mark.gpu
def test_norm_captured_in_a_cuda_graph_replays_with_new_inputs():
    import torch

    rng = np.random.default_rng(13)
    x = to_device(activations(rng, (64, 2048), "bfloat16"), "torch")
    w = to_device(activations(rng, (2048,), "bfloat16"), "torch")
    residual = to_device(activations(rng, (64, 2048), "bfloat16"), "torch")
    options = dict(scale="ue8m0", layout="packed")
    q, s = fgq.quantize(x, 128, **options, norm=(w, 1e-6), residual=residual.clone())  # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fgq.quantize(x, 128, **options, norm=(w, 1e-6), residual=residual, out=q, scale_out=s)
    for seed in (14, 15):
        fresh_x = activations(np.random.default_rng(seed), (64, 2048), "bfloat16")
        fresh_r = activations(np.random.default_rng(seed + 10), (64, 2048), "bfloat16")
        x.copy_(to_device(fresh_x, "torch"))
        residual.copy_(to_device(fresh_r, "torch"))
        graph.replay()
        torch.cuda.synchronize()
        r_host = fresh_r.copy()
        hq, hs = fgq.quantize(fresh_x, 128, **options, norm=(to_host(w), 1e-6), residual=r_host)
        assert_same_bytes(to_host_bytes(q), np.ascontiguousarray(hq), "q after replay")
        assert_same_bytes(to_host_bytes(s), np.ascontiguousarray(hs), "scales after replay")
        assert_same_bytes(to_host_bytes(residual), r_host, "residual after replay")
