"""The fused SiLU-and-multiply input: its definition's accuracy, the kernel's copy of its
constants and tables, the NumPy path, the kernel's paths on the GPU against the NumPy backend
bit for bit, and the argument checks on both."""

import math
import re
from pathlib import Path

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
    to_host_bytes,
    wider_rows,
)
from helpers import (
    NP_INPUT,
    activations,
    assert_same_bytes,
    force_path,
    launch_choice,
    reference_storage,
)

import fp8_group_quant as fgq
from fp8_group_quant import _abi, _jit, _launch, _plan, _tuning, activation
from fp8_group_quant._layout import Geometry
from fp8_group_quant._spec import INPUT_TYPES

KERNELS = Path(__file__).resolve().parents[1] / "kernels"


def exact_silu(g: np.ndarray) -> np.ndarray:
    """SiLU in float64: relative error near 2^-52, far below a float32 step."""
    g = g.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-g))


def float32_steps(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """How many float32 values lie between ``got`` and the float32 nearest to ``exact``."""

    def ordinal(v):
        bits = v.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    return np.abs(ordinal(got) - ordinal(exact))


def test_the_kernel_holds_the_same_constants_and_table():
    text = (KERNELS / "activation.cuh").read_text()

    def literal(name):
        return float.fromhex(re.search(rf"{name} = ([-0-9a-fx.p+]+)f;", text).group(1))

    assert literal("kInvLn2x64") == activation.INV_LN2_64
    assert literal("kLn2Over64Hi") == activation.LN2_64_HI
    assert literal("kLn2Over64Lo") == activation.LN2_64_LO
    assert literal("kOneSixth") == activation.C3
    # GeGLU's (section 2c)
    assert literal("kA") == activation.GELU_A and literal("kB") == activation.GELU_B
    assert literal("kGateMin") == activation.GELU_GATE_MIN
    assert literal("kWMin") == activation.GELU_W_MIN and literal("kTwoToMinus64") == 2.0**-64
    assert literal("kP1") == activation.GELU_P1 and literal("kP2") == activation.GELU_P2
    # A and B are what their definitions say, RN of 2 sqrt(2/pi) 64 / ln 2 (and times 0.044715)
    a = 2 * math.sqrt(2 / math.pi) * 64 / math.log(2)
    assert activation.GELU_A == np.float32(a) and activation.GELU_B == np.float32(a * 0.044715)
    body = re.search(r"kExpTable\[128\] = \{(.*?)\};", text, re.S).group(1)
    table = [float.fromhex(v.strip().rstrip("f")) for v in body.split(",") if v.strip()]
    assert np.array_equal(np.array(table, np.float32), activation.EXP_TABLE.reshape(-1))
    # the table is what its definition says: hi + lo = 2^(j/64) to float64 precision
    hi, lo = activation.EXP_TABLE[:, 0].astype(float), activation.EXP_TABLE[:, 1].astype(float)
    assert np.allclose(hi + lo, np.exp2(np.arange(64) / 64), rtol=2e-15, atol=0)


def test_the_kernel_holds_the_band_tables():
    # kernels/band_tables_bf16.cuh is what tools/gen_band_tables.py writes from the definitions
    import importlib.util

    tool = Path(__file__).resolve().parents[1] / "tools" / "gen_band_tables.py"
    spec = importlib.util.spec_from_file_location("gen_band_tables", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (KERNELS / "band_tables_bf16.cuh").read_text()
    assert text == module.render(), "regenerate: PYTHONPATH=. python3 tools/gen_band_tables.py"
    replicas = int(re.search(r"kSiluBandReplicas = (\d+);", text).group(1))
    bodies = re.findall(r"#define FGQ_BAND_WORDS(.*?)\n\n", text, re.S)
    arrays = re.findall(r"unsigned int (k\w+)\[kSiluBandReplicas\]\[kSiluBandWords\] = \{(.*?)\};",
                        text, re.S)  # fmt: skip
    bands = re.findall(r"kFirst = 0x([0-9a-f]{4})u, kSize = (\d+)u", text)
    assert len(bodies) == len(arrays) == len(bands) == len(activation.BAND_TABLES) == 2
    for band, body, (name, array), (first, size) in zip(activation.BAND_TABLES, bodies, arrays,
                                                        bands):  # fmt: skip
        words = np.array([int(v, 16) for v in re.findall(r"0x([0-9a-f]{8})u", body)], np.uint32)
        # every replica a block may copy is that table
        assert replicas >= 2 and array.split() == ["{FGQ_BAND_WORDS},"] * replicas, name
        assert (int(first, 16), int(size)) == (band.first, band.size), name
        halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(-1).astype(np.uint16)
        assert halves.size == 4096 and band.size <= 2048
        assert np.array_equal(halves, band.entries()), name
        results, n = band.results(), band.size
        assert np.array_equal(halves[:n], results[:n])  # positive gates from entry 0
        assert np.array_equal(halves[2048 : 2048 + n], results[n:])  # negative from entry 2048
        assert not halves[n:2048].any() and not halves[2048 + n :].any()  # stray indices read


@pytest.mark.parametrize("band", activation.BAND_TABLES, ids=lambda b: b.activation)
def test_the_band_lookup_gives_the_defined_result_for_every_bfloat16_gate(band):
    # table inside the band + the two rules outside it == the definition rounded to bfloat16,
    # bit for bit, for all 65,536 gates: +-0, subnormals, NaN of both signs, +-Inf included
    bits = np.arange(65536, dtype=np.uint16)
    g = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    defined = activation.round_to(activation.GATES[band.activation](g), "bfloat16")
    looked_up = band.lookup(bits).view(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(g)
    assert np.array_equal(looked_up[~nan].view(np.uint32), defined[~nan].view(np.uint32))
    assert np.isnan(looked_up[nan]).all()  # a NaN gate stays NaN; the multiply canonicalises it
    # the rules alone give every gate outside the band (the lookup with a table of zeros), and
    # the table every gate inside it
    magnitude = bits & 0x7FFF
    inside = (magnitude >= band.first) & (magnitude < band.end)
    rules = band.lookup(bits, np.zeros(2 * band.size, np.uint16))
    defined_bits = defined.astype(ml_dtypes.bfloat16).view(np.uint16)
    assert np.array_equal(rules[~inside & ~nan], defined_bits[~inside & ~nan])
    assert inside.sum() == 2 * band.size and (rules[inside] == 0).all()


def test_the_gelu_band_is_where_the_rules_fail():
    # GELU's rules and why its band is 2^-9 <= |g| < 16: RN(g / 2) first fails at |g| =
    # 0x1.96p-9 (0.4 g^2 moves the rounding), max(g, -0) last fails at g = 2.734375 and
    # g = -10.3125, whose gelu is a bfloat16 subnormal (2^-133), not -0
    bits = np.arange(65536, dtype=np.uint16)
    g = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    defined = activation.round_to(activation.gelu_tanh(g), "bfloat16")
    with np.errstate(invalid="ignore"):
        half = activation.round_to(g * np.float32(0.5), "bfloat16")
        above = activation.round_to(np.maximum(g, np.float32(-0.0)), "bfloat16")
    finite = np.isfinite(g)
    magnitude = bits & 0x7FFF
    half_fails = finite & (half.view(np.uint32) != defined.view(np.uint32))
    above_fails = finite & (above.view(np.uint32) != defined.view(np.uint32))
    assert magnitude[half_fails].min() == 0x3B4B and 0x3B4B >= activation.GELU_BAND.first
    assert g[above_fails].max() == 2.734375 and g[above_fails].min() == -10.3125
    assert activation.GELU_BAND.end > 0x4125  # bits of 10.3125
    assert defined[g == -10.3125][0] == -(2.0**-133)
    # the special gates: signed zeros, a subnormal tie of g / 2 (odd last bit: rounds to even),
    # +-Inf, huge negatives
    special = np.array([0x0000, 0x8000, 0x0003, 0x8003, 0x7F80, 0xFF80, 0xC680, 0xFF7F], np.uint16)
    got = activation.GELU_BAND.lookup(special)
    assert got.tolist() == [0x0000, 0x8000, 0x0002, 0x8002, 0x7F80, 0x8000, 0x8000, 0x8000]


def test_the_band_lookup_pairs_gates_as_the_kernel_does_for_any_count_and_shape():
    # two gates a 32-bit word, the halves independent: an odd count, a shape, any neighbour
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 65536, 999, dtype=np.uint16)
    for band in activation.BAND_TABLES:
        alone = np.array([band.lookup(bits[i : i + 1])[0] for i in range(999)])
        assert np.array_equal(band.lookup(bits), alone)
        grid = band.lookup(bits[:998].reshape(2, 499))
        assert grid.shape == (2, 499) and np.array_equal(grid.reshape(-1), alone[:998])


@pytest.mark.parametrize("band", activation.BAND_TABLES, ids=lambda b: b.activation)
def test_a_wrong_band_table_is_caught(band):
    # the lookup really reads the table: one changed entry changes one gate's result
    table = band.results().copy()
    table[band.size + 100] ^= 1
    bits = np.arange(65536, dtype=np.uint16)
    changed = band.lookup(bits, table) != band.lookup(bits)
    assert np.flatnonzero(changed).tolist() == [0x8000 | (band.first + 100)]


def test_bf16_multiply_rounds_once_where_the_definition_rounds_twice():
    # the kernel's SiLU-and-multiply for bfloat16 multiplies round(silu(g)) by up in bfloat16x2
    # arithmetic: one rounding of the exact product, where the definition rounds it to float32
    # first. The same bits, since two bfloat16 significands make at most 16 bits (exact in
    # float32 but for products below 2^-126, whose bits are too few to round to a tie). Every
    # bfloat16 as s against ups of every exponent, subnormals included.
    bf16 = ml_dtypes.bfloat16
    rng = np.random.default_rng(3)
    s = np.arange(65536, dtype=np.uint16).view(bf16).astype(np.float64)
    s = s[np.isfinite(s)]
    exponents = np.concatenate([np.arange(-133, 128), rng.integers(-133, 128, 39)])
    mantissas = rng.integers(0, 128, exponents.size) / 128.0
    ups = np.where(exponents < -126, mantissas * 2.0**-126, (1 + mantissas) * 2.0**exponents)
    ups = np.concatenate([ups, -ups[::3]]).astype(bf16).astype(np.float64)
    exact = s[:, None] * ups[None, :]  # exact in float64: 16 significant bits
    _, e = np.frexp(exact)
    ulp = np.ldexp(1.0, np.maximum(e - 1, -126) - 7)
    with np.errstate(over="ignore"):
        twice = exact.astype(np.float32).astype(bf16).astype(np.float64)
        once = (np.rint(exact / ulp) * ulp).astype(np.float32).astype(bf16).astype(np.float64)
    assert (twice != 0).mean() > 0.5 and np.isinf(twice).any() and (np.abs(twice) < 2.0**-126).any()
    np.testing.assert_array_equal(once.view(np.uint64), twice.view(np.uint64))


def test_exp_is_within_0_53_ulp():
    x = np.linspace(-110, 64, 3_000_001).astype(np.float32)
    m, n = activation.exp_parts(x)
    got = np.ldexp(m.astype(np.float64), n)
    exact = np.exp(x.astype(np.float64))
    ulp = np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert (np.abs(got - exact) / ulp).max() < 0.53


# both 16-bit types: every one of their values is a gate
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_silu_is_within_2_ulp_for_every_16_bit_input(dtype):
    g = np.arange(65536, dtype=np.uint16).view(dtype).astype(np.float32)
    g = g[np.isfinite(g)]
    steps = float32_steps(activation.silu(g), exact_silu(g))
    assert steps.max() <= 2
    assert (steps == 0).mean() > 0.75  # mostly correctly rounded (bf16 96%, f16 79%)


def test_silu_is_within_2_ulp_on_float32_inputs():
    rng = np.random.default_rng(0)
    samples = [rng.uniform(lo, hi, 1_000_000).astype(np.float32)
               for lo, hi in ((-120, -60), (-25, 0), (0, 30), (-1, 1), (-1e-3, 1e-3))]  # fmt: skip
    bits = rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    samples.append(bits[np.isfinite(bits)])
    # every float32 in [-17, -16], where 1 + exp(-g) passes 2^24 (the worst stretch measured)
    start, stop = np.float32(16).view(np.uint32), np.float32(17).view(np.uint32)
    samples.append(-np.arange(start, stop + 1, dtype=np.uint32).view(np.float32))
    for g in samples:
        assert float32_steps(activation.silu(g), exact_silu(g)).max() <= 2


def test_silu_special_values():
    g = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -110.5, 200.0], np.float32)
    bits = activation.silu(g).view(np.uint32)
    # NaN of either sign -> the canonical +NaN; silu(+Inf) = +Inf; silu(-Inf) = -0; signed zeros
    assert list(bits[:6]) == [0x7FC00000, 0x7FC00000, 0x7F800000, 0x80000000, 0, 0x80000000]
    assert bits[6] == 0x80000000 and activation.silu(g)[7] == np.float32(200.0)


def test_silu_mul_rounds_twice_in_the_input_dtype():
    rng = np.random.default_rng(1)
    gate = activations(rng, (64, 256), "bfloat16", specials=True)
    up = activations(rng, (64, 256), "bfloat16", specials=True)
    got = activation.silu_mul(gate, up, "bfloat16")
    s = activation.silu(gate.astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = (s * up.astype(np.float32)).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got, expected)  # NaN where expected has NaN
    assert not np.signbit(got[np.isnan(got)]).any()  # canonical +NaN
    # against SiLU computed exactly: a bfloat16 result differs only at rounding boundaries
    exact_s = exact_silu(gate.astype(np.float32)).astype(np.float32).astype(ml_dtypes.bfloat16)
    with np.errstate(invalid="ignore", over="ignore"):
        exact = (exact_s.astype(np.float32) * up.astype(np.float32)).astype(ml_dtypes.bfloat16)
    finite = np.isfinite(exact.astype(np.float32))
    assert (got[finite] != exact.astype(np.float32)[finite]).mean() < 0.002


# every input type
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
def test_the_numpy_path_quantizes_the_fused_values(input_dtype):
    rng = np.random.default_rng(2)
    x = activations(rng, (2, 3, 1024), input_dtype, specials=True)
    for scale, layout in (("float32", "col_tma"), ("ue8m0", "packed")):
        q, s = fgq.quantize(x, 128, scale=scale, layout=layout, activation="silu_mul")
        y = activation.silu_mul(x[..., :512], x[..., 512:], input_dtype).astype(x.dtype)
        q_ref, s_ref = fgq.quantize(y, 128, scale=scale, layout=layout)
        assert q.shape == (2, 3, 512) and s.shape == s_ref.shape
        np.testing.assert_array_equal(q.view(np.uint8), q_ref.view(np.uint8))
        np.testing.assert_array_equal(s, s_ref)


def test_torch_cpu_tensors_take_the_fused_path():
    torch = pytest.importorskip("torch")
    x = activations(np.random.default_rng(3), (5, 512), "bfloat16", specials=True)
    xt = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)
    q, s = fgq.quantize(xt, 64, dtype="e5m2", activation="silu_mul")
    q_ref, s_ref = fgq.quantize(x, 64, dtype="e5m2", activation="silu_mul")
    assert q.dtype == torch.float8_e5m2 and tuple(q.shape) == (5, 256)
    assert np.array_equal(q.view(torch.uint8).numpy(), q_ref.view(np.uint8))
    assert np.array_equal(s.numpy(), s_ref)


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)  # the NumPy backend, and the GPU from both
@pytest.mark.parametrize(
    "shape, kwargs, message",
    [
        ((4, 384), {}, r"x: activation='silu_mul' reads gate and up halves .* 256"),
        ((4, 255), {}, "x: activation='silu_mul' reads gate and up halves"),
        ((4, 512), {"view": 384}, "x: activation='silu_mul' reads gate and up halves"),
        ((4, 512), {"activation": "gelu"}, "activation: expected None or one of 'silu_mul'"),
        ((4, 512), {"activation": 1}, "activation: expected None or one of 'silu_mul'"),
    ],
)  # halves that are no whole groups (contiguous, odd, a view of wider rows); unknown names
def test_bad_fused_input_is_named(shape, kwargs, message, backend):
    x = to_device(activations(np.random.default_rng(4), shape, "bfloat16"), backend)
    kwargs = dict(kwargs)
    if "view" in kwargs:  # the first columns of wider rows: 384 = 2 * 192
        x = x[:, : kwargs.pop("view")]
    out = to_device(np.full((x.shape[0], x.shape[1] // 2), 0x55, np.uint8), backend)
    out = out.view(e4m3_dtype(backend))
    before = to_host_bytes(out).copy()
    with pytest.raises(ValueError, match=message):
        fgq.quantize(x, 128, out=out, **{"activation": "silu_mul", **kwargs})
    assert np.array_equal(to_host_bytes(out), before)  # nothing written


@pytest.mark.parametrize("backend", NUMPY_AND_GPU)  # the NumPy backend, and the GPU from both
def test_an_output_of_the_full_width_is_refused(backend):
    x = to_device(activations(np.random.default_rng(5), (4, 512), "bfloat16"), backend)
    out = to_device(np.zeros((4, 512), np.uint8), backend).view(e4m3_dtype(backend))
    with pytest.raises(ValueError, match="out"):
        fgq.quantize(x, 128, out=out, activation="silu_mul")
    empty = to_device(np.empty((0, 512), ml_dtypes.bfloat16), backend)
    q, s = fgq.quantize(empty, 128, activation="silu_mul")
    assert tuple(q.shape) == (0, 256) and tuple(s.shape) == (0, 2)


def test_the_vectorised_silu_follows_the_spec_text():
    # fp8_group_quant.spec_model transcribes section 2a one value at a time, from the text
    from fp8_group_quant import spec_model

    rng = np.random.default_rng(11)
    gates = np.concatenate([
        np.arange(0, 65536, 7, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32),
        rng.uniform(-130, 130, 3000).astype(np.float32),
        np.array([0.0, -0.0, 110.0, -110.0, -64.0, 64.0, np.inf, -np.inf, 1e-45], np.float32),
    ])  # fmt: skip
    _assert_bits_as_the_model(activation.silu(gates), gates, spec_model.silu)


# the fused kernel on the GPU against the NumPy backend --------------------------------------------


def check_gated(x_host, x_device, lib, group_size, dtype, scale, layout, pad_rows=False,
                activation="silu_mul"):  # fmt: skip
    """The fused kernel into poisoned outputs against the NumPy backend's fused path, every
    storage byte; and against quantizing the NumPy gated values (SiLU-mul, or the
    ``activation`` given) on their own."""
    from fp8_group_quant.activation import gated_mul

    n = x_host.shape[-1] // 2
    geometry = Geometry((*x_host.shape[:-1], n), group_size, layout, pad_rows)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, lib, dtype)
    options = dict(dtype=dtype, scale=scale, layout=layout, pad_rows=pad_rows)
    q_got, s_got = fgq.quantize(
        x_device, group_size, **options, out=q, scale_out=s, activation=activation
    )
    assert q_got is q and s_got is s
    values = gated_mul(activation, x_host[..., :n], x_host[..., n:], x_host.dtype.name)
    q_ref, s_ref = reference_storage(values, geometry, dtype, scale, 1e-10)
    what = f"{activation} {lib} {x_host.dtype} G={group_size} {dtype} {scale} {layout}"
    what += f" {x_host.shape}"
    assert_same_bytes(to_host_bytes(q_buf), q_ref, f"q ({what})", inputs=values)
    assert_same_bytes(to_host_bytes(s_buf), s_ref, f"scales ({what})")
    q_host, s_host = fgq.quantize(x_host, group_size, **options, activation=activation)
    q2, s2 = fgq.quantize(x_device, group_size, **options, activation=activation)
    assert tuple(q2.shape) == geometry.shape == q_host.shape
    assert_same_bytes(to_host_bytes(q2), np.ascontiguousarray(q_host).view(np.uint8).ravel(),
                      f"q, allocated ({what})")  # fmt: skip
    assert_same_bytes(to_host_bytes(s2), to_host_bytes(s), f"scales, allocated ({what})")


def gates_and_ups(rng, shape, input_dtype):
    """[..., 2N] input whose gates cover every regime of the defined SiLU and GELU and of their
    bfloat16 band tables (|g| up to 120; every exponent from 2^-16 to 2^8, inside both bands,
    below and above them; subnormals, NaN, +-Inf, +-0, huge negatives; for 16-bit types any
    bit pattern) and whose ups carry outliers, NaN and Inf."""
    gate = activations(rng, shape, input_dtype, specials=True).astype(np.float32)
    flat = gate.reshape(-1)
    draw = rng.random(flat.size)
    picks = draw < 0.3
    flat[picks] = rng.uniform(-120.0, 120.0, int(picks.sum())).astype(np.float32)
    picks = (draw >= 0.3) & (draw < 0.6)  # log-uniform magnitudes, either sign
    magnitudes = np.exp2(rng.uniform(-16.0, 8.0, int(picks.sum())))
    flat[picks] = (magnitudes * rng.choice([-1.0, 1.0], magnitudes.size)).astype(np.float32)
    picks = (draw >= 0.6) & (draw < 0.7)
    if input_dtype != "float32":  # any 16-bit pattern: subnormals and NaN payloads too
        patterns = rng.integers(0, 65536, int(picks.sum()), dtype=np.uint16)
        flat[picks] = patterns.view(NP_INPUT[input_dtype]).astype(np.float32)
    fixed = [np.nan, np.inf, -np.inf, 0.0, -0.0, -64.0, -1e4, -10.3125, -3e38]
    flat[: min(flat.size, len(fixed))] = fixed[: min(flat.size, len(fixed))]
    up = activations(rng, shape, input_dtype, specials=True)
    return np.concatenate([gate.astype(up.dtype), up], axis=-1)


@pytest.mark.gpu
# every input type, group size and registered (format, scale, layout)
@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS)
def test_silu_mul_every_combination(input_dtype, group_size, dtype, scale, layout):
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("torch", "cupy")[index % 2]
    rng = np.random.default_rng(1000 + index)
    check_gated_shapes(rng, input_dtype, lib, group_size, dtype, scale, layout)


def check_gated_shapes(rng, input_dtype, lib, group_size, dtype, scale, layout,
                       activation="silu_mul"):  # fmt: skip
    """check_gated on a few rows of an odd group count, batched rows with padded q rows,
    and one token of N = 7168 inside a wider buffer."""
    args = (lib, group_size, dtype, scale, layout)
    x = gates_and_ups(rng, (5, 3 * group_size), input_dtype)  # odd group count, 5 rows
    check_gated(x, to_device(x, lib), *args, activation=activation)
    x = gates_and_ups(rng, (2, 3, 7168 // 2), input_dtype)  # batched, padded q rows
    check_gated(x, to_device(x, lib), *args, pad_rows=True, activation=activation)
    x = gates_and_ups(rng, (1, 7168), input_dtype)  # one token, N = 7168
    check_gated(x, wider_rows(x, 128, lib, 64), *args, activation=activation)


SIX_BLOCK_COMBINATIONS = [c for c in COMBINATIONS if c[0] == "bfloat16" and c[3] == "ue8m0"]


@pytest.mark.gpu
# bfloat16 with UE8M0 scales: the combinations with a six-block kernel, and blocked (none)
@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", SIX_BLOCK_COMBINATIONS)
def test_silu_mul_on_six_blocks(input_dtype, group_size, dtype, scale, layout):
    # the one-pass bfloat16 kernels' six-block instantiation (40 registers), which large grids
    # take (the tuning table's silu_six_blocks_waves): forced here at every size; the blocked
    # layout has none (it spills at 40 registers) and keeps the five-block kernel
    index = SIX_BLOCK_COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("torch", "cupy")[index % 2]
    rng = np.random.default_rng(5000 + index)
    with force_path(silu_six_blocks_waves=0.0):
        check_gated_shapes(rng, input_dtype, lib, group_size, dtype, scale, layout)
        x = gates_and_ups(rng, (300, 2 * 1024), input_dtype)  # many blocks
        check_gated(x, to_device(x, lib), lib, group_size, dtype, scale, layout)
        launch = silu_mul_launch(to_device(x, "cupy"), group_size, dtype, scale, layout)
    six = layout != "blocked"
    assert launch.handle == silu_kernel(group_size, dtype, scale, layout, six)


def silu_kernel(group_size, dtype, scale, layout, six: bool) -> int:
    """The handle of the one-pass bfloat16 SiLU instantiation with six blocks an SM or five."""
    from fp8_group_quant._layout import SCALE_LAYOUTS

    key = _plan.KernelKey("bfloat16", group_size, dtype, scale,
                            SCALE_LAYOUTS[layout].kernel_trait, True, True, "silu_mul",
                            blocks_per_sm=_plan.SILU_SIX_BLOCKS if six else 0)  # fmt: skip
    function = _jit.get_function(_plan.SOURCE, key.name_expression, cupy_device())
    return function.kernel.ptr


def cupy_device() -> int:
    import cupy

    return cupy.cuda.Device().id


@pytest.mark.gpu
# every third combination: each (format, scale, layout) still meets some type and group size
@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS[::3])
def test_silu_mul_on_the_persistent_grid(
    monkeypatch, input_dtype, group_size, dtype, scale, layout
):
    # large plain SiLU-and-multiply inputs of bfloat16 without padding rows take the masked
    # layout's persistent kernel with every row real (fused_takes_persistent): forced here at
    # any size, batched, inside wider rows, and a padded input that must keep the one-pass
    # grid; float16 and float32 gates keep the one-pass grid however large
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("torch", "cupy")[index % 2]
    rng = np.random.default_rng(3000 + index)
    persistent = []
    prepare_masked = _plan._prepare_masked

    def recorded(request, key, device, tuning):  # which launches took the persistent grid
        persistent.append(request.masked is None and key.masked)
        return prepare_masked(request, key, device, tuning)

    monkeypatch.setattr(_plan, "_prepare_masked", recorded)
    args = (lib, group_size, dtype, scale, layout)
    with force_path(persistent_fused_waves=0.0):
        x = gates_and_ups(rng, (3, 128, 5 * group_size), input_dtype)  # no padding rows
        check_gated(x, to_device(x, lib), *args)
        x = gates_and_ups(rng, (256, 2 * group_size), input_dtype)
        check_gated(x, wider_rows(x, 128, lib, 64), *args)  # rows inside a wider buffer
        routed = input_dtype == "bfloat16"
        assert (bool(persistent) and all(persistent)) == routed  # none at all when not routed
        persistent.clear()
        x = gates_and_ups(rng, (129, 2 * group_size), input_dtype)
        check_gated(x, to_device(x, lib), *args)
    padded = Geometry((129, 2 * group_size), group_size, layout, False).grid_rows > 129
    assert (bool(persistent) and all(persistent)) == (routed and not padded)  # padding: one pass


@pytest.mark.parametrize("activation", ["silu_mul", "gelu_tanh_mul"])
@pytest.mark.parametrize("input_dtype", list(INPUT_TYPES))
def test_only_bfloat16_gates_take_the_persistent_grid(input_dtype, activation):
    # the route's rule (docs/perf.md, "The persistent grid for large inputs"): past the tuning
    # table's waves for bfloat16 gates only, never with padding rows or for a small grid
    from helpers import make_request

    from fp8_group_quant._arrays import describe

    tuning, per_sm, sms = _tuning.Tuning(), 6, 132
    threshold = int(tuning.persistent_fused_waves * per_sm * sms)
    dtype = ml_dtypes.bfloat16 if input_dtype == "bfloat16" else np.dtype(input_dtype)
    seen = set()
    for rows, pad_rows in ((64, False), (5, False), (5, True)):
        x = np.zeros((rows, 512), dtype)
        request = make_request(describe(x, "x"), 128, "e4m3", "ue8m0", "packed", 1e-10,
                               pad_rows, activation=activation)  # fmt: skip
        padded = request.output.grid_rows != rows
        seen.add(padded)
        for blocks in (threshold, threshold + 1):
            expected = input_dtype == "bfloat16" and not padded and blocks > threshold
            got = _plan.fused_takes_persistent(request, blocks, per_sm, sms, tuning)
            assert got == expected, (rows, pad_rows, blocks)
    assert seen == {False, True}  # grids with padding rows and without


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [152, 292, 420, 556])  # whole TMA boxes: no padding rows
def test_silu_mul_persistent_grid_walks_several_steps(monkeypatch, rows):
    # one block an SM: the persistent grid's blocks walk the slots of one batch (the kernel's
    # single-expert path) in 2-5 steps, the last one partly past the end
    import cupy

    masked_grid, walked = _plan._masked_grid, []

    def recorded(key, device):  # which grids the launches sized
        walked.append(key.masked)
        return masked_grid(key, device)

    monkeypatch.setattr(_plan, "_masked_grid", recorded)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    slots_a_step = sms * _abi.MASKED_THREADS // 8  # 8 lanes a group
    assert 2 <= -(-rows * 16 // slots_a_step) <= 6  # 16 groups a row
    x = gates_and_ups(np.random.default_rng(rows), (rows, 2 * 2048), "bfloat16")
    with force_path(persistent_fused_waves=0.0, masked_blocks_per_sm=1):
        for lib, scale, layout in (("cupy", "ue8m0", "packed"), ("torch", "float32", "row")):
            check_gated(x, to_device(x, lib), lib, 128, "e4m3", scale, layout)
    assert walked and all(walked)


@pytest.mark.gpu
# both 16-bit types; bfloat16's band table copied both ways, at five and six blocks an SM
@pytest.mark.parametrize(
    "input_dtype, table_copy, blocks",
    [("bfloat16", "bulk", 5), ("bfloat16", "threads", 5), ("bfloat16", "bulk", 6),
     ("bfloat16", "threads", 6), ("float16", "bulk", 5), ("float16", "threads", 5)],
)  # fmt: skip
def test_silu_mul_every_16_bit_gate(input_dtype, table_copy, blocks):
    # every 16-bit pattern as a gate (both signs of NaN, Inf, subnormals), against random ups;
    # the bfloat16 one-pass blocks' band table copied both ways (Params.table_by_threads), by
    # the kernel at five blocks an SM and at six (the tuning table's silu_six_blocks_waves)
    rng = np.random.default_rng(5)
    gate = np.arange(65536, dtype=np.uint16).view(NP_INPUT[input_dtype]).reshape(256, 256)
    up = activations(rng, (256, 256), input_dtype)
    x = np.concatenate([gate, up], axis=-1)
    table_waves = 0.0 if table_copy == "threads" else math.inf
    six_waves = 0.0 if blocks == 6 else math.inf
    with force_path(table_by_threads_waves=table_waves, silu_six_blocks_waves=six_waves):
        for scale, layout in (("float32", "row"), ("ue8m0", "packed")):
            check_gated(x, to_device(x, "cupy"), "cupy", 128, "e4m3", scale, layout)
        launch = silu_mul_launch(to_device(x, "cupy"))
    assert launch.params.table_by_threads == (table_copy == "threads")
    if input_dtype == "bfloat16":
        six = blocks == 6
        assert launch.handle == silu_kernel(128, "e4m3", "ue8m0", "packed", six)


POISON_SHARED = r"""
extern "C" __global__ void poison_shared(unsigned int word) {
  extern __shared__ unsigned int shared[];
  for (int i = threadIdx.x; i < 12288; i += blockDim.x) shared[i] = word;
}
"""


def poison_shared_memory(word: int = 0x7FC00001) -> None:
    """Fill 48 KB of shared memory on every SM with ``word`` (a NaN), so a kernel that reads
    shared memory it never wrote reads that instead of a previous block's values."""
    import cupy

    kernel = cupy.RawKernel(POISON_SHARED, "poison_shared")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    kernel((sms * 8,), (256,), (np.uint32(word),), shared_mem=48 * 1024)
    cupy.cuda.runtime.deviceSynchronize()


@pytest.mark.gpu
# blocks of one, two and three warps: fewer threads than a table has entries
@pytest.mark.parametrize("threads", [32, 64, 96])
# every input type: the exponential table (float16, float32) and the band tables (bfloat16)
@pytest.mark.parametrize("input_dtype", ["float16", "float32", "bfloat16"])
@pytest.mark.parametrize("activation", ["silu_mul", "gelu_tanh_mul"])
def test_gated_activations_in_blocks_of_few_threads(input_dtype, threads, activation):
    # the tuning table may give the one-pass grid blocks of 32 threads: the float16 and float32
    # exponential table (64 entries in shared memory) and bfloat16's band table must still be
    # filled whole; shared memory is poisoned first, so an entry left unwritten reads a NaN
    # rather than a previous block's copy
    rng = np.random.default_rng(threads + (100 if activation == "gelu_tanh_mul" else 0))
    x = gates_and_ups(rng, (96, 2 * 1024), input_dtype)
    # bfloat16's band table both ways: this small grid takes the bulk copy, and with
    # table_by_threads_waves at 0 every thread's cp.async (as test_shared_tables_are_filled_...);
    # the float16 and float32 exponential table is filled one way
    for by_threads in (False, True) if input_dtype == "bfloat16" else (False,):
        table_waves = 0.0 if by_threads else 1e9
        with force_path(one_pass_threads=threads, table_by_threads_waves=table_waves):
            for scale, layout in (("ue8m0", "packed"), ("float32", "row")):
                poison_shared_memory()
                check_gated(x, to_device(x, "cupy"), "cupy", 128, "e4m3", scale, layout,
                               activation=activation)  # fmt: skip
            launch = silu_mul_launch(to_device(x, "cupy"), activation=activation)
        assert launch.block == (threads, 1, 1)
        assert launch.params.table_by_threads == by_threads


TABLE_PROBE = r"""
// each block poisons its table, fills it as the kernels do, and writes it out
extern "C" __global__ void exp_table_probe(unsigned int* out, unsigned int poison) {
  __shared__ fgq::ExpTable table;
  unsigned int* words = reinterpret_cast<unsigned int*>(table.entries);
  for (int i = threadIdx.x; i < 128; i += blockDim.x) words[i] = poison;
  __syncthreads();
  table.fill();
  for (int i = threadIdx.x; i < 128; i += blockDim.x) out[blockIdx.x * 128 + i] = words[i];
}
template <typename Band>
__device__ void band_table_probe(unsigned int* out, unsigned int poison, int how) {
  __shared__ fgq::BandTable<Band> table;
  unsigned int* words = reinterpret_cast<unsigned int*>(table.vectors);
  for (int i = threadIdx.x; i < fgq::kSiluBandWords; i += blockDim.x) words[i] = poison;
  __syncthreads();
  if (how == 2) {
    table.fill();  // the walking grids' copy
  } else {
    table.start(how == 1);  // each thread's cp.async, else one bulk copy
    table.wait(how == 1);
  }
  for (int i = threadIdx.x; i < fgq::kSiluBandWords; i += blockDim.x) {
    out[blockIdx.x * fgq::kSiluBandWords + i] = words[i];
  }
}
extern "C" __global__ void silu_mul_table_probe(unsigned int* out, unsigned int poison, int how) {
  band_table_probe<fgq::SiluBand>(out, poison, how);
}
extern "C" __global__ void gelu_tanh_mul_table_probe(unsigned int* out, unsigned int poison,
                                                     int how) {
  band_table_probe<fgq::GeluBand>(out, poison, how);
}
"""


@pytest.mark.gpu
# blocks of one to eight warps, odd counts of warps included
@pytest.mark.parametrize("threads", [32, 64, 96, 128, 256])
def test_shared_tables_are_filled_by_blocks_of_any_size(threads):
    # the gated activations' shared-memory tables as a block of `threads` threads fills them:
    # the float16 / float32 exponential table (ExpTable::fill) and each bfloat16 band table
    # (SiLU's, GELU's) by its bulk copy and by every thread's cp.async (BandTable::start /
    # wait, every replica) and by the walking grids' fill(), over poisoned words;
    # deterministic, unlike a quantize call on stale shared memory
    import cupy

    from fp8_group_quant import activation

    module = cupy.RawModule(code=_jit.source_text("activation.cuh") + TABLE_PROBE,
                            options=_jit.nvrtc_options())  # fmt: skip
    poison = np.uint32(0x7FC00001)
    blocks = 2 * 8  # every replica of the band table twice
    out = cupy.zeros(blocks * 128, cupy.uint32)
    module.get_function("exp_table_probe")((blocks,), (threads,), (out, poison))
    expected = np.frombuffer(activation.EXP_TABLE.astype(np.float32).tobytes(), np.uint32)
    np.testing.assert_array_equal(out.get().reshape(blocks, 128), np.tile(expected, (blocks, 1)))
    for table in activation.BAND_TABLES:
        band = np.frombuffer(table.entries().tobytes(), np.uint32)
        probe = module.get_function(f"{table.activation}_table_probe")
        for how, name in enumerate(("one bulk copy", "every thread's cp.async", "fill()")):
            out = cupy.zeros(blocks * band.size, cupy.uint32)
            probe((blocks,), (threads,), (out, poison, np.int32(how)))
            np.testing.assert_array_equal(out.get().reshape(blocks, -1),
                                          np.tile(band, (blocks, 1)),
                                          err_msg=f"{table.activation}: {name}")  # fmt: skip


def silu_mul_launch(x, group_size=128, dtype="e4m3", scale="ue8m0", layout="packed",
                    activation="silu_mul"):  # fmt: skip
    """The launch layer's plan for a plain SiLU-and-multiply call on ``x`` (or ``activation``)."""
    from helpers import make_request

    from fp8_group_quant._arrays import describe

    request = make_request(describe(x, "x"), group_size, dtype, scale, layout, 1e-10, False,
                           activation=activation)  # fmt: skip
    (launch,) = _plan.prepare(request, x.device.id, _tuning.active()[1])
    return launch


@pytest.mark.gpu
# four blocks to five waves: both table copies, five and six blocks an SM
@pytest.mark.parametrize("rows", [1, 64, 256, 1024, 2048])
def test_silu_mul_table_copy_follows_the_grid(rows):
    # the launch layer's choice: one bulk copy a block in one-pass grids of at most half a
    # resident wave, every thread's cp.async past it (the tuning table's silu_table_waves)
    import cupy

    launch = silu_mul_launch(cupy.zeros((rows, 2 * 7168), cupy.dtype("bfloat16")))
    device = cupy.cuda.Device().id
    per_sm, sms = _launch.resident_blocks(launch.handle, "silu", launch.block[0], device)
    wave, blocks = per_sm * sms, launch.grid[0]
    assert blocks == -(-rows * 7168 // 128 // 16)  # the one-pass grid: 16 groups a block
    table_waves = launch_choice("table_by_threads_waves")
    assert launch.params.table_by_threads == (blocks > table_waves * wave)
    if rows in (1, 2048):  # a block or two an SM; several waves
        assert launch.params.table_by_threads == (rows == 2048)
    # and past SILU_SIX_BLOCKS_WAVES resident waves of the five-block kernel, the six-block one
    six = blocks > launch_choice("silu_six_blocks_waves") * wave
    assert launch.handle == silu_kernel(128, "e4m3", "ue8m0", "packed", six)
    if rows in (256, 2048):  # a fifth of a wave; five waves (ten blocks an SM, 132 SMs)
        assert six == (rows == 2048)


@pytest.mark.gpu
def test_silu_mul_float32_bit_patterns():
    rng = np.random.default_rng(6)
    bits = rng.integers(0, 2**32, (512, 1024), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    check_gated(x, to_device(x, "torch"), "torch", 64, "e5m2", "float32", "col_tma")


@pytest.mark.gpu
def test_silu_mul_refuses_what_it_cannot_read():
    # the fused kernel's 16-byte loads; the rest of what it refuses is named on every backend
    # (test_bad_fused_input_is_named, test_an_output_of_the_full_width_is_refused)
    import cupy

    wide = cupy.zeros((4, 520), INPUT_TYPES["bfloat16"].numpy_dtype)
    with pytest.raises(ValueError, match="x: activation='silu_mul' needs a 16-byte aligned"):
        fgq.quantize(wide[:, 4:516], 128, activation="silu_mul")


# GeGLU: the tanh-approximate GELU (docs/spec.md, section 2c) ------------------------------------


def exact_gelu(g: np.ndarray) -> np.ndarray:
    """The formula in float64 as g / (1 + exp(-2v)), which does not cancel for negative g as
    0.5 g (1 + tanh(v)) does: relative error near |2v| 2^-52."""
    g = g.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-2.0 * np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))


def gelu_steps_bound(g: np.ndarray) -> np.ndarray:
    """Section 2c's bound in float32 steps: 3 + 2.5 |2v| (the float32 rounding of v, moved into
    exp(-|2v|)), which for g >= 0 the tests hold to 1 or 2."""
    g = g.astype(np.float64)
    return 3 + 2.5 * np.abs(2 * np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))


def test_exp2_64_is_within_0_63_ulp():
    # section 2c, step 4: m * 2^n against 2^(x/64) over the whole range of x and densely near 0
    x = np.concatenate([np.linspace(-10240, 0, 3_000_001), np.linspace(-64, 0, 2_000_001)])
    x = x.astype(np.float32)
    m, n = activation.exp2_64_parts(x)
    got = np.ldexp(m.astype(np.float64), n)
    exact = np.exp2(x.astype(np.float64) / 64)
    ulp = np.ldexp(1.0, np.floor(np.log2(exact)).astype(int) - 23)  # float32's at exact
    assert (np.abs(got - exact) / ulp).max() < 0.63


def test_gelu_tanh_known_values():
    g = np.array([0.0, -0.0, 1.0, -1.0, 3.0, -3.0, 20.0, -20.0, np.inf, -np.inf, np.nan, 1e-40,
                  -1e-40, 1e13, -1e13, -10.0, -np.nan], np.float32)  # fmt: skip
    y = activation.gelu_tanh(g)
    bits = y.view(np.uint32)
    assert bits[0] == 0 and bits[1] == 0x80000000  # gelu(+-0) = +-0
    assert np.isclose(y[2], 0.841192, rtol=1e-6) and np.isclose(y[3], -0.158808, rtol=1e-5)
    assert np.isclose(y[4], 2.996363, rtol=1e-6) and np.isclose(y[5], -0.00363739, rtol=1e-5)
    assert y[6] == 20.0 and bits[7] == 0x80000000  # saturated: g, and -0 below
    assert y[8] == np.inf and bits[9] == 0x80000000  # +Inf, and -Inf's limit -0
    assert bits[10] == bits[16] == 0x7FC00000  # the positive NaN
    assert y[11] == np.float32(0.5) * np.float32(1e-40) and y[12] == -y[11]  # subnormals: g / 2
    assert y[13] == np.float32(1e13) and bits[14] == 0x80000000  # g^3 overflows to +-Inf
    # far out on the negative side the value is tiny, not 0 (1 + tanh(v) would cancel to 0)
    assert np.isclose(y[15], exact_gelu(g[15:16])[0], rtol=1e-4) and -1e-36 < y[15] < -1e-38


def test_gelu_tanh_is_close_to_the_formula_on_every_16_bit_gate():
    # not correctly rounded, but close (section 2c): every bfloat16 gate rounds to the formula's
    # bfloat16, float16 all but 3 gates; within 1 float32 step for g >= 0 and within the bound
    # for g < 0, where exp(-|2v|) carries |2v| times v's rounding
    for dtype, differ in ((ml_dtypes.bfloat16, 0), (np.float16, 3)):
        g = np.arange(65536, dtype=np.uint16).view(dtype).astype(np.float32)
        g = g[np.isfinite(g)]
        got, exact = activation.gelu_tanh(g), exact_gelu(g)
        rounded_once = exact.astype(np.float32).astype(dtype).view(np.uint16)
        assert (got.astype(dtype).view(np.uint16) != rounded_once).sum() <= differ
        steps = float32_steps(got, exact)
        assert steps[g >= 0].max() <= 1
        assert (steps <= gelu_steps_bound(g)).all()
        assert steps.max() <= 93


def test_gelu_tanh_is_close_to_the_formula_on_float32_gates():
    rng = np.random.default_rng(12)
    samples = [rng.uniform(lo, hi, 1_000_000).astype(np.float32)
               for lo, hi in ((-12, 12), (-11, -9), (-1, 1), (0, 1e4), (-1e-3, 1e-3))]  # fmt: skip
    bits = rng.integers(0, 2**32, 2_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    samples.append(bits[np.isfinite(bits)])
    # every float32 in [-4, -2], where the result is large and |2v| grows from 3.6 to 9.7
    start, stop = np.float32(2).view(np.uint32), np.float32(4).view(np.uint32)
    samples.append(-np.arange(start, stop + 1, dtype=np.uint32).view(np.float32))
    for g in samples:
        steps = float32_steps(activation.gelu_tanh(g), exact_gelu(g))
        assert steps[g >= 0].max(initial=0) <= 2
        assert (steps <= gelu_steps_bound(g)).all()


def test_the_vectorised_gelu_follows_the_spec_text():
    # fp8_group_quant.spec_model transcribes section 2c one value at a time, from the text
    from fp8_group_quant import spec_model

    rng = np.random.default_rng(13)
    gates = np.concatenate([
        np.arange(0, 65536, 23, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32),
        rng.uniform(-12, 12, 2000).astype(np.float32),
        np.array([0.0, -0.0, -16.0, -16.5, -10.9, -11.0, 1e-45, -1e-45, 3e38, -3e38, np.inf,
                  -np.inf], np.float32),
    ])  # fmt: skip
    _assert_bits_as_the_model(activation.gelu_tanh(gates), gates, spec_model.gelu_tanh)


@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
def test_gelu_tanh_mul_on_the_numpy_backend_quantizes_the_gated_values(input_dtype):
    # the fused NumPy path quantizes round(round(gelu(g)) * u), as SiLU-mul does with SiLU
    rng = np.random.default_rng(21)
    x = gates_and_ups(rng, (6, 256), input_dtype)
    q, s = fgq.quantize(x, 128, scale="ue8m0", layout="packed", activation="gelu_tanh_mul")
    values = activation.gated_mul("gelu_tanh_mul", x[..., :256], x[..., 256:], input_dtype)
    q_ref, s_ref = fgq.quantize(values.astype(np.float32), 128, scale="ue8m0", layout="packed")
    assert np.array_equal(np.asarray(q).view(np.uint8), np.asarray(q_ref).view(np.uint8))
    assert np.array_equal(s, s_ref)
    silu = fgq.quantize(x, 128, scale="ue8m0", layout="packed", activation="silu_mul")[0]
    assert not np.array_equal(np.asarray(q).view(np.uint8), np.asarray(silu).view(np.uint8))


@pytest.mark.gpu
# every input type, group size and registered (format, scale, layout), a third of them
@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS[1::3])
def test_gelu_tanh_mul_every_combination(input_dtype, group_size, dtype, scale, layout):
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("cupy", "torch")[index % 2]
    rng = np.random.default_rng(5000 + index)
    args = (lib, group_size, dtype, scale, layout)
    check_gated_shapes(rng, input_dtype, *args, activation="gelu_tanh_mul")
    with force_path(persistent_fused_waves=0.0):  # bfloat16: the persistent grid, every row real
        x = gates_and_ups(rng, (3, 64, 2 * group_size), input_dtype)
        check_gated(x, to_device(x, lib), *args, activation="gelu_tanh_mul")


@pytest.mark.gpu
# both 16-bit types; bfloat16's band table copied both ways
@pytest.mark.parametrize(
    "input_dtype, table_copy",
    [("bfloat16", "bulk"), ("bfloat16", "threads"), ("float16", "bulk")],
)
def test_gelu_tanh_mul_every_16_bit_gate(input_dtype, table_copy):
    # every 16-bit pattern as a gate: for bfloat16 every entry of the band table, both rules
    # outside it (+-0, subnormals and their ties of g / 2, NaN of both signs, +-Inf, the huge
    # negatives), the bfloat16 one-pass blocks' table copied both ways (Params.table_by_threads)
    rng = np.random.default_rng(6)
    gate = np.arange(65536, dtype=np.uint16).view(NP_INPUT[input_dtype]).reshape(256, 256)
    up = activations(rng, (256, 256), input_dtype)
    x = np.concatenate([gate, up], axis=-1)
    table_waves = 0.0 if table_copy == "threads" else math.inf
    with force_path(table_by_threads_waves=table_waves):
        for lib, scale, layout in (("cupy", "float32", "row"), ("torch", "ue8m0", "packed")):
            check_gated(x, to_device(x, lib), lib, 128, "e4m3", scale, layout,
                           activation="gelu_tanh_mul")  # fmt: skip
        launch = silu_mul_launch(to_device(x, "cupy"), activation="gelu_tanh_mul")
    assert launch.params.table_by_threads == (table_copy == "threads")


@pytest.mark.gpu
def test_gelu_tanh_mul_in_the_masked_layout():
    import cupy

    rng = np.random.default_rng(8)
    x = gates_and_ups(rng, (4, 32, 256), "bfloat16")
    counts = np.array([0, 5, 32, 17], np.int32)
    options = dict(scale="ue8m0", layout="packed", activation="gelu_tanh_mul")
    q_ref, s_ref = fgq.quantize(x, 128, **options, masked_m=counts)
    q, s = fgq.quantize(cupy.asarray(x), 128, **options, masked_m=cupy.asarray(counts))
    for e, rows in enumerate(counts):
        assert np.array_equal(q.get()[e, :rows], np.asarray(q_ref).view(np.uint8)[e, :rows])
        assert np.array_equal(unpack(s)[e, :rows], unpack(s_ref)[e, :rows])


def unpack(scales):
    return np.asarray(fgq.unpack_scales(scales.get() if hasattr(scales, "get") else scales, 2))


def _assert_bits_as_the_model(got, gates, model) -> None:
    """Each of ``got`` has the float32 bits of ``model`` at its gate (any NaN for a NaN)."""
    for g, value in zip(gates.tolist(), got.tolist()):
        expected = model(g)
        if math.isnan(expected):
            assert math.isnan(value), g
        else:
            assert np.float32(value).view(np.uint32) == np.float32(expected).view(np.uint32), g
