"""The fused SiLU-and-multiply input on the CPU: its definition's accuracy, the kernel's copy of
its constants, the NumPy path and its argument checks."""

import math
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from helpers import activations

import fp8_group_quant as fgq
from fp8_group_quant import activation

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
    body = re.search(r"kExpTable\[128\] = \{(.*?)\};", text, re.S).group(1)
    table = [float.fromhex(v.strip().rstrip("f")) for v in body.split(",") if v.strip()]
    assert np.array_equal(np.array(table, np.float32), activation.EXP_TABLE.reshape(-1))
    # the table is what its definition says: hi + lo = 2^(j/64) to float64 precision
    hi, lo = activation.EXP_TABLE[:, 0].astype(float), activation.EXP_TABLE[:, 1].astype(float)
    assert np.allclose(hi + lo, np.exp2(np.arange(64) / 64), rtol=2e-15, atol=0)


def test_the_kernel_holds_the_silu_band_table():
    # kernels/silu_band_bf16.cuh is what tools/gen_silu_band.py writes from the definition
    import importlib.util

    tool = Path(__file__).resolve().parents[1] / "tools" / "gen_silu_band.py"
    spec = importlib.util.spec_from_file_location("gen_silu_band", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (KERNELS / "silu_band_bf16.cuh").read_text()
    assert text == module.render(), "regenerate: PYTHONPATH=. python3 tools/gen_silu_band.py"
    body = re.search(r"#define FGQ_SILU_BAND_WORDS(.*?)\n\n", text, re.S).group(1)
    words = np.array([int(v, 16) for v in re.findall(r"0x([0-9a-f]{8})u", body)], np.uint32)
    # every replica a block may copy is that table
    replicas = int(re.search(r"kSiluBandReplicas = (\d+);", text).group(1))
    array = re.search(
        r"kSiluBandBF16\[kSiluBandReplicas\]\[kSiluBandWords\] = \{(.*?)\};", text, re.S
    )
    assert replicas >= 2 and array.group(1).split() == ["{FGQ_SILU_BAND_WORDS},"] * replicas
    halves = np.stack([words & 0xFFFF, words >> 16], axis=-1).reshape(-1).astype(np.uint16)
    assert halves.size == 4096 and activation.BAND == 1920
    assert np.array_equal(halves, activation.silu_band_entries())
    table = activation.silu_band_table()
    assert np.array_equal(halves[:1920], table[:1920])  # positive gates from entry 0
    assert np.array_equal(halves[2048:3968], table[1920:])  # negative ones from entry 2048
    assert not halves[1920:2048].any() and not halves[3968:].any()  # what stray indices read


def test_the_band_lookup_gives_the_defined_silu_for_every_bfloat16_gate():
    bits = np.arange(65536, dtype=np.uint16)
    g = bits.view(ml_dtypes.bfloat16).astype(np.float32)
    defined = activation.round_to(activation.silu(g), "bfloat16")
    looked_up = activation.silu_bf16_by_table(bits).view(ml_dtypes.bfloat16).astype(np.float32)
    nan = np.isnan(g)
    assert np.array_equal(looked_up[~nan].view(np.uint32), defined[~nan].view(np.uint32))
    assert np.isnan(looked_up[nan]).all()  # a NaN gate stays NaN; the multiply canonicalises it
    # the rules do work outside the band, and the table inside it
    outside = activation.silu_bf16_by_table(bits, np.zeros(3840, np.uint16))
    in_band = outside != activation.silu_bf16_by_table(bits)
    assert in_band.sum() > 3000 and (~in_band).sum() > 60000


def test_the_band_lookup_pairs_gates_as_the_kernel_does_for_any_count_and_shape():
    # two gates a 32-bit word, the halves independent: an odd count, a shape, any neighbour
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 65536, 999, dtype=np.uint16)
    alone = np.array([activation.silu_bf16_by_table(bits[i : i + 1])[0] for i in range(999)])
    assert np.array_equal(activation.silu_bf16_by_table(bits), alone)
    grid = activation.silu_bf16_by_table(bits[:998].reshape(2, 499))
    assert grid.shape == (2, 499) and np.array_equal(grid.reshape(-1), alone[:998])


def test_a_wrong_band_table_is_caught():
    # the lookup really reads the table: one changed entry changes one gate's result
    table = activation.silu_band_table().copy()
    table[activation.BAND + 100] ^= 1
    bits = np.arange(65536, dtype=np.uint16)
    changed = activation.silu_bf16_by_table(bits, table) != activation.silu_bf16_by_table(bits)
    assert np.flatnonzero(changed).tolist() == [0x8000 | (activation.BAND_FIRST + 100)]


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


@pytest.mark.parametrize(
    "shape, kwargs, message",
    [
        ((4, 384), {}, r"x: activation='silu_mul' reads gate and up halves .* 256"),
        ((4, 255), {}, "x: activation='silu_mul' reads gate and up halves"),
        ((4, 512), {"activation": "gelu"}, "activation: expected None or one of 'silu_mul'"),
        ((4, 512), {"activation": 1}, "activation: expected None or one of 'silu_mul'"),
    ],
)
def test_bad_fused_input_is_named(shape, kwargs, message):
    x = activations(np.random.default_rng(4), shape, "bfloat16")
    out = np.full((shape[0], shape[1] // 2), 0x55, np.uint8).view(ml_dtypes.float8_e4m3fn)
    before = out.view(np.uint8).copy()
    with pytest.raises(ValueError, match=message):
        fgq.quantize(x, 128, out=out, **{"activation": "silu_mul", **kwargs})
    assert np.array_equal(out.view(np.uint8), before)  # nothing written


def test_an_output_of_the_full_width_is_refused():
    x = activations(np.random.default_rng(5), (4, 512), "bfloat16")
    out = np.empty((4, 512), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="out"):
        fgq.quantize(x, 128, out=out, activation="silu_mul")
    q, s = fgq.quantize(np.empty((0, 512), ml_dtypes.bfloat16), 128, activation="silu_mul")
    assert q.shape == (0, 256) and s.shape == (0, 2)


def test_the_vectorised_silu_follows_the_spec_text():
    # fp8_group_quant.spec_model transcribes section 2a one value at a time, from the text
    from fp8_group_quant import spec_model

    rng = np.random.default_rng(11)
    gates = np.concatenate([
        np.arange(0, 65536, 7, dtype=np.uint16).view(ml_dtypes.bfloat16).astype(np.float32),
        rng.uniform(-130, 130, 3000).astype(np.float32),
        np.array([0.0, -0.0, 110.0, -110.0, -64.0, 64.0, np.inf, -np.inf, 1e-45], np.float32),
    ])  # fmt: skip
    got = activation.silu(gates)
    for g, value in zip(gates.tolist(), got.tolist()):
        expected = spec_model.silu(g)
        if math.isnan(expected):
            assert math.isnan(value), g
        else:
            assert np.float32(value).view(np.uint32) == np.float32(expected).view(np.uint32), g
