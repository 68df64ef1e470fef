"""``bench --linear``'s check: every output of ``orientation="both"`` and ``quantize_weight``
byte for byte against the NumPy backend before anything is timed, on torch tensors of the CPU
(through the NumPy backend: the comparison's own code) and of the GPU.

At M <= 128 the column-wise scales are a ``[K, 1]`` view with strides ``(1, K)``: torch counts
it contiguous, so ``contiguous()`` keeps the stride ``K`` that a dtype view refuses; the check
crashed there before it flattened first.
"""

import numpy as np
import pytest
from backends import backends
from helpers import activations

import fp8_group_quant as fgq
from fp8_group_quant.bench import linear


@pytest.mark.parametrize("device", backends("torch_cpu", "torch"))
# one token, inside one token group, exactly one, one past it, several
@pytest.mark.parametrize("m", [1, 100, 128, 129, 300])
def test_check_passes_at_every_token_count(device, m):
    torch = pytest.importorskip("torch")
    where = "cpu" if device == "torch_cpu" else "cuda"
    rng = np.random.default_rng(m)
    x = torch.from_numpy(activations(rng, (m, 256), "float32")).to(where).bfloat16()
    w = torch.from_numpy(rng.standard_normal((384, 256)).astype(np.float32) * 0.02)
    linear._check(torch, x, w.to(where).bfloat16())


def test_check_fails_on_a_wrong_byte(monkeypatch):
    """A single code byte off in one output is an error, not a timed row."""
    torch = pytest.importorskip("torch")
    quantize = fgq.quantize

    def off_by_one(x, *args, **kwargs):
        result = quantize(x, *args, **kwargs)
        if isinstance(x, torch.Tensor):  # the call under test, not the NumPy reference
            result.qt.view(torch.uint8)[0, 0] ^= 1
        return result

    monkeypatch.setattr(fgq, "quantize", off_by_one)
    x = torch.from_numpy(activations(np.random.default_rng(130), (130, 256), "float32"))
    with pytest.raises(AssertionError, match="differs from the NumPy backend"):
        linear._check(torch, x.bfloat16(), torch.randn(256, 256).bfloat16())


@pytest.mark.gpu
def test_the_table_runs_where_cublas_refuses_an_m(capsys):
    """M = 1 and 6 (which cuBLAS's blockwise GEMM refused on SM90 with torch 2.11) print a row
    with the GEMM as n/a; M = 4 times it; bench --linear's default M list starts at 1."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("blockwise-scaled FP8 GEMMs need SM90 or newer")
    rows = linear.run_linear(SimpleNamespace(k=[256], n=256, m=[1, 4, 6]))
    assert [row["m"] for row in rows] == [1, 4, 6]
    for row in rows:
        assert row["quant_forward_us"] > 0 and row["bf16_gemm_us"] > 0
        assert row["fp8_gemm_us"] is None or row["fp8_gemm_us"] > 0
    assert rows[1]["fp8_gemm_us"] is not None  # a multiple of 4: cuBLAS takes it
    printed = capsys.readouterr().out
    assert ("n/a" in printed) == any(row["fp8_gemm_us"] is None for row in rows)
