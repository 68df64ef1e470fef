"""Every compat drop-in and the public entry points inside ``torch.compile(fullgraph=True)``:
given torch tensors under dynamo, they take the custom ops (torch_ops.quantize_traced), so the
graph has no break and its outputs equal eager's. On the CPU (the NumPy backend) through
dynamo and AOT functionalisation; on the GPU through inductor and a CUDA graph replayed on new
input."""

import numpy as np
import pytest

import fp8_group_quant as fgq
from fp8_group_quant import compat

torch = pytest.importorskip("torch")
pytest.importorskip("fp8_group_quant.torch_ops")


def _inputs(device: str) -> dict:
    g = torch.Generator().manual_seed(5)
    bf16 = lambda *shape: (torch.randn(*shape, generator=g) * 4).to(torch.bfloat16)  # noqa: E731
    return dict(x=bf16(8, 512).to(device), y=bf16(3, 8, 512).to(device),
                counts=torch.tensor([8, 0, 5], dtype=torch.int32, device=device),
                w=bf16(512).to(device))  # fmt: skip


# each drop-in once, with the options that reach a different part of the traced path: outputs
# given or allocated, masked rows, a mutated residual, the blocked layout, the modes
CALLS = {
    "quantize": lambda a: fgq.quantize(a["x"], 128, scale="ue8m0", layout="col_tma"),
    "quantize_out": lambda a: fgq.quantize(
        a["x"], 128, out=torch.empty(8, 512, dtype=torch.float8_e4m3fn, device=a["x"].device)
    ),
    "quantize_packed": lambda a: fgq.quantize_packed(a["x"], 128),
    "per_token_group_quant_fp8": lambda a: compat.per_token_group_quant_fp8(
        a["x"], 128, column_major_scales=True, tma_aligned_scales=True, use_ue8m0=True
    ),
    "packed_for_deepgemm": lambda a: compat.per_token_group_quant_fp8_packed_for_deepgemm(
        a["x"], 128
    ),
    "sglang": lambda a: compat.sglang_per_token_group_quant_fp8(
        a["y"],
        128,
        column_major_scales=True,
        scale_tma_aligned=True,
        scale_ue8m0=True,
        fuse_silu_and_mul=True,
        masked_m=a["counts"],
    ),  # fmt: skip
    "silu_mul_colmajor": lambda a: compat.silu_mul_per_token_group_quant_fp8_colmajor(
        a["x"], clamp_limit=7.0
    ),
    "persistent_masked": lambda a: compat.persistent_masked_m_silu_mul_quant(
        a["y"], a["counts"], quant_scale_fmt="UE8M0"
    ),
    "rms_norm": lambda a: compat.rms_norm_per_block_quant(
        a["x"], a["w"], 1e-6, torch.float8_e4m3fn, [1, 128], residual=a["y"][0]
    ),
    "mxfp8": lambda a: compat.mxfp8_quantize(a["x"]),
    "mxfp8_linear": lambda a: compat.mxfp8_quantize(a["x"], is_sf_swizzled_layout=False),
}
# rows the masked calls write: y's rows below the counts (the others are unspecified)
MASKED = {"sglang", "persistent_masked"}


def _bytes(t) -> np.ndarray:
    """The bytes of ``t`` in its logical order, [*shape, itemsize]."""
    flat = t.detach().cpu().clone(memory_format=torch.contiguous_format).reshape(-1)
    return flat.view(torch.uint8).numpy().reshape(*t.shape, -1)


def _assert_equal(name: str, got, expected, counts) -> None:
    for g, e in zip(got, expected):
        g, e = _bytes(g), _bytes(e)
        if name in MASKED:  # [E, T, ...]: compare the written rows
            for expert, n in enumerate(counts.tolist()):
                np.testing.assert_array_equal(g[expert, :n], e[expert, :n])
        else:
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("name", list(CALLS))
def test_a_fullgraph_compile_equals_eager_on_the_cpu(name):
    torch._dynamo.reset()
    eager_inputs, compiled_inputs = _inputs("cpu"), _inputs("cpu")
    expected = CALLS[name](eager_inputs)
    compiled = torch.compile(CALLS[name], fullgraph=True, backend="aot_eager")
    got = compiled(compiled_inputs)
    _assert_equal(name, got, expected, eager_inputs["counts"])
    # the mutated residual too
    torch.testing.assert_close(compiled_inputs["y"], eager_inputs["y"], rtol=0, atol=0)


def test_the_traced_path_names_what_it_refuses():
    x = torch.randn(4, 64).to(torch.bfloat16)
    compiled = torch.compile(
        lambda x: compat.scaled_fp4_quant(x, torch.tensor([1.0])), fullgraph=True,
        backend="aot_eager",
    )  # fmt: skip
    with pytest.raises(Exception, match="NVFP4 and MXFP4"):
        compiled(x)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CALLS))
def test_a_fullgraph_compile_replays_in_a_cuda_graph(name):
    torch._dynamo.reset()
    inputs = _inputs("cuda")
    compiled = torch.compile(CALLS[name], fullgraph=True)
    for _ in range(2):  # compile and warm up outside the capture
        compiled(inputs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = compiled(inputs)
    fresh = _inputs("cuda")
    for key in ("x", "y", "w"):  # new values in the captured input buffers, then a replay
        inputs[key].copy_(fresh[key] * 3)
    graph.replay()
    torch.cuda.synchronize()
    eager_inputs = _inputs("cuda")
    for key in ("x", "y", "w"):
        eager_inputs[key] = fresh[key] * 3
    if name == "rms_norm":  # the captured call added the residual in place at capture too
        pytest.skip("the residual the replay reads was updated at capture; checked on the CPU")
    _assert_equal(name, got, CALLS[name](eager_inputs), inputs["counts"])
