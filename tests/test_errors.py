"""Every error a user can trigger through the public API is a ValueError or TypeError (no GPU:
GpuUnavailableError) whose message names the argument, what was expected and what was given
(issue 43, item 5). One table of wrong arguments over every public entry point and drop-in.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import activations

import fp8_group_quant as fgq
from fp8_group_quant import compat

torch = pytest.importorskip("torch")

BF16 = activations(np.random.default_rng(0), (4, 256), "bfloat16")
F32 = BF16.astype(np.float32)


def t_bf16(shape=(4, 256)):
    return torch.randn(shape, dtype=torch.bfloat16)


def meta(shape=(4, 256)):
    return torch.empty(shape, dtype=torch.bfloat16, device="meta")


def codes_and_scales(layout="row", scale="float32"):
    return fgq.quantize(F32, 128, scale=scale, layout=layout)


# (entry point called with wrong arguments, exception type, the argument its message must name,
# a word of what was given); one row per kind of mistake: types, devices, shapes, tuple
# arities, meta tensors, float64, lists and wrong companions
CASES = {
    # quantize: the input
    "x a list": (lambda: fgq.quantize(F32.tolist(), 128), TypeError, "x", "list"),
    "x a string": (lambda: fgq.quantize("x", 128), TypeError, "x", "str"),
    "x float64": (lambda: fgq.quantize(F32.astype(np.float64), 128), TypeError, "x", "float64"),
    "torch x float64": (lambda: fgq.quantize(torch.zeros(4, 256, dtype=torch.float64), 128),
                        TypeError, "x", "float64"),
    "x int64": (lambda: fgq.quantize(torch.zeros(4, 256, dtype=torch.int64), 128), TypeError,
                "x", "int64"),
    "x meta": (lambda: fgq.quantize(meta(), 128), TypeError, "x", "meta"),
    "x scalar": (lambda: fgq.quantize(np.array(1.0, np.float32), 128), ValueError, "x",
                 "scalar"),
    "K not a multiple": (lambda: fgq.quantize(F32[:, :200], 128), ValueError, "", "200"),
    # quantize: options
    "group_size str": (lambda: fgq.quantize(F32, "128"), TypeError, "group_size", "str"),
    "group_size 100": (lambda: fgq.quantize(F32, 100), ValueError, "group_size", "100"),
    "dtype unknown": (lambda: fgq.quantize(F32, 128, dtype="e3m4"), ValueError, "dtype", "e3m4"),
    "scale unknown": (lambda: fgq.quantize(F32, 128, scale="e5"), ValueError, "scale", "e5"),
    "layout unknown": (lambda: fgq.quantize(F32, 128, layout="diag"), ValueError, "layout",
                       "diag"),
    "eps negative": (lambda: fgq.quantize(F32, 128, eps=-1.0), ValueError, "eps", "-1"),
    "pad_rows int": (lambda: fgq.quantize(F32, 128, pad_rows=1), TypeError, "pad_rows", "int"),
    # quantize: outputs
    "out a list": (lambda: fgq.quantize(F32, 128, out=[0]), TypeError, "out", "list"),
    "out meta": (lambda: fgq.quantize(t_bf16(), 128, out=meta()), TypeError, "out", "meta"),
    "out numpy with torch x": (lambda: fgq.quantize(t_bf16(), 128, out=np.empty((4, 256))),
                               TypeError, "out", "numpy"),
    "scale_out shape": (lambda: fgq.quantize(F32, 128, scale_out=np.empty((4, 3), np.float32)),
                        ValueError, "scale_out", "(4, 3)"),
    "scale_out dtype": (lambda: fgq.quantize(F32, 128, scale_out=np.empty((4, 2), np.float64)),
                        TypeError, "scale_out", "float64"),
    # quantize: the fused operands
    "norm arity 3": (lambda: fgq.quantize(t_bf16(), 128, norm=(torch.ones(256), 1e-6, 3)),
                     TypeError, "norm", "3 items"),
    "norm a list": (lambda: fgq.quantize(F32, 128, norm=[np.ones(256, np.float32), 1e-6]),
                    TypeError, "norm", "list"),
    "norm numpy weight, torch x": (
        lambda: fgq.quantize(t_bf16(), 128, norm=(np.ones(256, np.float32), 1e-6)),
        TypeError, "norm", "numpy"),
    "norm weight meta": (lambda: fgq.quantize(t_bf16(), 128, norm=(meta((256,)), 1e-6)),
                         TypeError, "norm", "meta"),
    "residual without norm": (lambda: fgq.quantize(F32, 128, residual=F32.copy()), ValueError,
                              "residual", "norm"),
    "masked_m numpy, torch x": (
        lambda: fgq.quantize(t_bf16((2, 4, 256)), 128, masked_m=np.array([1, 2], np.int32)),
        TypeError, "masked_m", "numpy"),
    "activation unknown": (lambda: fgq.quantize(F32, 128, activation="relu"), ValueError,
                           "activation", "relu"),
    "global_scale without NVFP4": (lambda: fgq.quantize(F32, 128, global_scale=1.0), ValueError,
                                   "global_scale", "NVFP4"),
    # quantize_packed, prepare, warmup
    "quantize_packed float64": (lambda: fgq.quantize_packed(F32.astype(np.float64)), TypeError,
                                "x", "float64"),
    "prepare on the host": (lambda: fgq.prepare(F32), TypeError, "x", "numpy"),
    "prepare torch CPU": (lambda: fgq.prepare(t_bf16()), TypeError, "x", "cpu"),
    "warmup variants str": (lambda: fgq.warmup(variants="some"), TypeError, "variants", "some"),
    # dequantize, unpack_scales, as_float8
    "dequantize a list": (lambda: fgq.dequantize([1, 2], [1.0]), TypeError, "q", "list"),
    "dequantize numpy q, torch scales": (
        lambda: fgq.dequantize(codes_and_scales()[0], torch.ones(4, 2)), TypeError, "q", "numpy"),
    "dequantize torch q, numpy scales": (
        lambda: fgq.dequantize(torch.zeros(4, 256, dtype=torch.float8_e4m3fn),
                               codes_and_scales()[1]), TypeError, "scales", "numpy"),
    "dequantize_weight numpy q, torch scales": (
        lambda: fgq.dequantize_weight(np.zeros((128, 128), np.uint8), torch.ones(1, 1)),
        TypeError, "q", "numpy"),
    "dequantize NVFP4 numpy q, torch scales": (
        lambda: fgq.dequantize(np.zeros((128, 8), np.uint8), torch.ones(128, 4, dtype=torch.uint8),
                               16, "e2m1", global_scale=1.0),
        TypeError, "q", "numpy"),
    "dequantize MXFP4 torch q, numpy scales": (
        lambda: fgq.dequantize(torch.zeros(4, 16, dtype=torch.uint8), np.ones((4, 1), np.float32),
                               32, "e2m1"),
        TypeError, "scales", "numpy"),
    "dequantize uint8 without dtype": (
        lambda: fgq.dequantize(np.asarray(codes_and_scales()[0]).view(np.uint8),
                               codes_and_scales()[1]), TypeError, "dtype", "uint8"),
    "dequantize packed without group_size": (
        lambda: fgq.dequantize(*codes_and_scales("packed", "ue8m0")), TypeError, "group_size",
        "packed"),
    "dequantize group_size contradicts": (
        lambda: fgq.dequantize(*codes_and_scales(), 64), ValueError, "group_size", "64"),
    "dequantize scales float64": (
        lambda: fgq.dequantize(codes_and_scales()[0], np.ones((4, 2))), TypeError, "scales",
        "float64"),
    "unpack_scales float32": (lambda: fgq.unpack_scales(np.ones((4, 1), np.float32), 4),
                              TypeError, "packed", "float32"),
    "unpack_scales too many groups": (lambda: fgq.unpack_scales(np.ones((4, 1), np.int32), 5),
                                      ValueError, "groups", "5"),
    "as_float8 of float32": (lambda: fgq.as_float8(F32), TypeError, "q", "float32"),
    "as_float8 int8 format": (lambda: fgq.as_float8(np.zeros(4, np.uint8), "int8"), ValueError,
                              "dtype", "int8"),
    "as_float8 meta": (lambda: fgq.as_float8(torch.empty(4, dtype=torch.uint8, device="meta")),
                       TypeError, "q", "meta"),
    "scale_offsets bad layout": (lambda: fgq.scale_offsets((4, 256), 128, "diag"), ValueError,
                                 "layout", "diag"),
    # the drop-ins
    "rms_norm_per_block_quant group_size int": (
        lambda: compat.rms_norm_per_block_quant(t_bf16(), torch.ones(256, dtype=torch.bfloat16),
                                                1e-6, torch.float8_e4m3fn, 128),
        TypeError, "group_size", "128"),
    "rms_norm_per_block_quant numpy weight": (
        lambda: compat.rms_norm_per_block_quant(t_bf16(), np.ones(256, np.float32), 1e-6,
                                                torch.float8_e4m3fn, [1, 128]),
        TypeError, "norm", "numpy"),
    "per_token_group_quant_fp8 a list": (
        lambda: compat.per_token_group_quant_fp8(F32.tolist(), 128), TypeError, "x", "list"),
    "per_token_group_quant_fp8 meta": (
        lambda: compat.per_token_group_quant_fp8(meta(), 128), TypeError, "x", "meta"),
    "sglang float64": (lambda: compat.sglang_per_token_group_quant_fp8(F32.astype(np.float64), 128),
                       TypeError, "x", "float64"),
    "persistent_masked_m format unknown": (
        lambda: compat.persistent_masked_m_silu_mul_quant(
            t_bf16((2, 4, 512)), torch.tensor([1, 2]), quant_scale_fmt="FP16"),
        ValueError, "quant_scale_fmt", "FP16"),
    "mxfp8_quantize float64": (lambda: compat.mxfp8_quantize(np.zeros((4, 64))), TypeError,
                               "x", "float64"),
    "fp4_quantize a list": (lambda: compat.fp4_quantize([[0.0] * 64], 1.0), TypeError, "input",
                            "list"),
    "scaled_fp4_quant meta": (lambda: compat.scaled_fp4_quant(meta((4, 64)), 1.0), TypeError, "",
                              "meta"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_wrong_arguments_are_named(case):
    call, kind, argument, given = CASES[case]
    with pytest.raises(kind) as error:
        call()
    message = str(error.value)
    assert type(error.value) in (TypeError, ValueError), type(error.value)
    if argument:
        assert message.startswith(f"{argument}:") or f" {argument}" in message, message
    assert given in message, f"{given!r} not in {message!r}"


@pytest.mark.parametrize("entry", ["quantize", "dequantize"])
def test_tensors_that_require_grad_are_read_as_on_the_gpu(entry):
    # no gradient flows through quantization on any backend; the call reads the values
    x = torch.from_numpy(F32.copy()).requires_grad_()
    q, s = fgq.quantize(x, 128)
    q_ref, s_ref = fgq.quantize(F32, 128)
    if entry == "quantize":
        np.testing.assert_array_equal(s.numpy(), s_ref)
        return
    back = fgq.dequantize(q, s.clone().requires_grad_())
    np.testing.assert_array_equal(back.numpy(), fgq.dequantize(q_ref, s_ref))


def test_warmup_without_a_gpu_is_gpu_unavailable(monkeypatch):
    # without a driver, warmup() (no device given) raised CuPy's raw CUDARuntimeError
    from fp8_group_quant import _jit

    monkeypatch.setattr(_jit, "device_count", lambda: 0)
    with pytest.raises(fgq.GpuUnavailableError, match="device: warmup loads kernels"):
        fgq.warmup()


def test_bench_and_the_cupy_example_say_what_is_missing(monkeypatch):
    from fp8_group_quant.bench import _hooks, cli

    monkeypatch.setattr(_hooks, "device_count", lambda: 0)
    assert "needs a CUDA GPU (an NVIDIA GPU and its driver)" in cli.gpu_missing()
    monkeypatch.setattr(fgq, "warmup", _no_gpu)
    import runpy

    with pytest.raises(SystemExit, match="cupy_gpu.py needs a CUDA GPU: no driver"):
        runpy.run_path(str(_examples() / "cupy_gpu.py"))


def _no_gpu(*args, **kwargs):
    raise fgq.GpuUnavailableError("no driver")


def _examples():
    import pathlib

    return pathlib.Path(__file__).parents[1] / "examples"
