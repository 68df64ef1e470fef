"""The torch custom op: schema, fake tensors and torch.compile(fullgraph=True) against eager."""

import numpy as np
import pytest
from helpers import activations

import fp8_group_quant as fgq

torch = pytest.importorskip("torch")
torch_ops = pytest.importorskip("fp8_group_quant.torch_ops")

CASES = [  # (shape, group size, dtype, scale, layout, pad_rows, activation)
    ((6, 512), 128, "e4m3", "ue8m0", "packed", False, None),
    ((2, 5, 256), 64, "e5m2", "float32", "col_tma", True, None),
    ((7, 1024), 128, "int8", "float32", "row", False, None),
    ((3, 2, 3, 256), 32, "e4m3fnuz", "ue8m0", "packed_row", False, None),
    ((1, 256), 256, "e4m3", "float32", "col", False, None),
    ((3, 4, 512), 64, "e4m3", "ue8m0", "packed", True, "silu_mul"),  # q is [3, 4, 256]
]


def tensor(shape, seed=0, specials=True):
    x = activations(np.random.default_rng(seed), shape, "bfloat16", specials=specials)
    return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16)


@pytest.mark.parametrize("shape, group, dtype, scale, layout, pad_rows, activation", CASES)
def test_the_op_passes_torchs_own_checks(shape, group, dtype, scale, layout, pad_rows, activation):
    # schema, autograd registration, fake tensors (shapes, dtypes, strides) and AOT dispatch;
    # finite data, as opcheck compares outputs with assert_close, which holds NaN unequal
    args = (tensor(shape, specials=False), group, dtype, scale, layout, 1e-10, pad_rows, activation)
    results = torch.library.opcheck(torch.ops.fp8_group_quant.quantize.default, args)
    assert all(v == "SUCCESS" for v in results.values()), results


@pytest.mark.parametrize("shape, group, dtype, scale, layout, pad_rows, activation", CASES)
def test_the_fake_outputs_match_the_real_ones(
    shape, group, dtype, scale, layout, pad_rows, activation
):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = tensor(shape)
    options = dict(
        dtype=dtype, scale=scale, layout=layout, pad_rows=pad_rows, activation=activation
    )
    real = torch_ops.quantize(x, group, **options)
    with FakeTensorMode() as mode:
        fake = torch_ops.quantize(mode.from_tensor(x), group, **options)
    for r, f in zip(real, fake):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)
        assert r.untyped_storage().nbytes() == f.untyped_storage().nbytes()
    q_ref, s_ref = fgq.quantize(x, group, **options)
    assert torch.equal(real[0].view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(real[1], s_ref)


@pytest.mark.parametrize(
    "layout, scale_rule", [("packed", "floor"), ("blocked", "rceil"), ("blocked", "floor")]
)
def test_the_op_takes_the_scale_rule_and_the_blocked_layout(layout, scale_rule):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = tensor((5, 256), seed=3, specials=False)
    options = dict(scale="ue8m0", layout=layout, scale_rule=scale_rule)
    args = (x, 32, "e4m3", "ue8m0", layout, 1e-10, False, None, scale_rule)
    results = torch.library.opcheck(torch.ops.fp8_group_quant.quantize.default, args)
    assert all(v == "SUCCESS" for v in results.values()), results
    real = torch_ops.quantize(x, 32, **options)
    with FakeTensorMode() as mode:
        fake = torch_ops.quantize(mode.from_tensor(x), 32, **options)
    for r, f in zip(real, fake):
        assert (r.shape, r.stride(), r.dtype) == (f.shape, f.stride(), f.dtype)
    q_ref, s_ref = fgq.quantize(x, 32, **options)
    assert torch.equal(real[0].view(torch.uint8), q_ref.view(torch.uint8))
    assert torch.equal(real[1], s_ref)
    with pytest.raises(ValueError, match="scale_rule"):
        torch_ops.quantize(x, 32, dtype="int8", scale="ue8m0", scale_rule="floor")


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_model_step_compiles_with_fullgraph_and_matches_eager(backend):
    weight = torch.randn(64, 512, dtype=torch.float32)

    def step(x):  # a linear layer with the quantizer in front (dequantized stand-in matmul)
        q, s = torch_ops.quantize(x, 128, scale="ue8m0", layout="col_tma")
        values = q.to(torch.float32).reshape(x.shape[0], 4, 128) * s.unsqueeze(-1)
        return values.reshape(x.shape[0], 512) @ weight.T, s

    compiled = torch.compile(step, fullgraph=True, backend=backend)
    for rows in (5, 8, 13):  # new shapes recompile or go dynamic; each must match eager
        x = tensor((rows, 512), seed=rows)
        got, expected = compiled(x), step(x)
        # bitwise, NaN included (the data holds NaN and Inf)
        torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0, equal_nan=True)
        assert torch.equal(got[1], expected[1])
        assert got[1].stride() == expected[1].stride() == (1, -(-rows // 4) * 4)


@pytest.mark.gpu
def test_the_op_on_cuda_compiles_and_replays_in_a_cuda_graph():
    weight = torch.randn(64, 512, device="cuda")

    def step(x):
        q, s = torch_ops.quantize_packed(x)
        return q.to(torch.float32) @ weight.T, s

    compiled = torch.compile(step, fullgraph=True)
    x = tensor((16, 512), specials=False).cuda()
    expected = step(x)
    got = compiled(x)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    compiled(static_x)  # warm up outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        static_out = compiled(static_x)
    static_x.copy_(tensor((16, 512), seed=9, specials=False).cuda())
    graph.replay()
    torch.cuda.synchronize()
    replayed = step(static_x)
    assert torch.equal(static_out[0], replayed[0]) and torch.equal(static_out[1], replayed[1])


def test_nvfp4_is_refused_by_name_not_by_a_tuple_error():
    import torch

    from fp8_group_quant import torch_ops

    with pytest.raises(NotImplementedError, match="dtype='e2m1': NVFP4"):
        torch_ops.quantize(torch.ones(4, 32), 16, dtype="e2m1", scale="e4m3", layout="blocked")


@pytest.mark.parametrize("shape, group, dtype, scale, layout, pad_rows, activation", CASES)
def test_the_op_looks_up_the_plan_api_quantize_makes(
    shape, group, dtype, scale, layout, pad_rows, activation, monkeypatch
):
    """The op's shortcut to the plan cache builds the key api.quantize builds for the same
    call, so each finds the other's plan (and a change to one key cannot go unseen)."""
    from fp8_group_quant import _device, api
    from fp8_group_quant._spec import DEFAULT_EPS

    keys = []
    monkeypatch.setattr(api, "device_signature", lambda x: ("torch", "layout", 0))
    monkeypatch.setattr(_device, "cached", keys.append)  # every lookup a miss, recorded
    x = tensor(shape)
    options = dict(dtype=dtype, scale=scale, layout=layout, pad_rows=pad_rows,
                   activation=activation)  # fmt: skip
    torch_ops.quantize(x, group, **options)  # a CPU tensor: the NumPy backend after the misses
    op_keys = list(keys)
    keys.clear()
    fgq.quantize(x, group, **options)
    assert keys[0][:2] == ("torch", "layout")
    assert op_keys == [keys[0], keys[0]]  # the op's own lookup, then api.quantize's
    # and the key a GPU call stores its new plan under (_run._plan_key: the options as given)
    stored = api._call(group, dtype, scale, layout, DEFAULT_EPS, pad_rows, activation, "rceil",
                       None, None, None, None, None).raw  # fmt: skip
    assert keys[0][2] == stored


@pytest.mark.gpu
@pytest.mark.parametrize("shape, group, dtype, scale, layout, pad_rows, activation", CASES)
def test_the_ops_repeated_call_takes_the_cached_plan(
    shape, group, dtype, scale, layout, pad_rows, activation, monkeypatch
):
    """On CUDA the op's second call goes straight to the plan its first one made (never to
    api.quantize) and writes what the NumPy backend writes, on fresh data each time."""
    from backends import to_host_bytes

    from fp8_group_quant import api

    options = dict(dtype=dtype, scale=scale, layout=layout, pad_rows=pad_rows,
                   activation=activation)  # fmt: skip
    for seed in (1, 2):
        x = tensor(shape, seed=seed)
        expected = fgq.quantize(x, group, **options)  # torch CPU: the NumPy backend on bf16
        if seed == 2:  # the shortcut alone: a fall back to api.quantize fails the test
            monkeypatch.setattr(api, "quantize", _no_fallback)
        q, s = torch_ops.quantize(x.cuda(), group, **options)
        assert np.array_equal(to_host_bytes(q), to_host_bytes(expected[0]))
        assert np.array_equal(to_host_bytes(s), to_host_bytes(expected[1]))


def _no_fallback(*args, **kwargs):
    raise AssertionError("the op's repeated call fell back to api.quantize")
