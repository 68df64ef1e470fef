"""Where and when a GPU call runs: on the caller's current stream (torch's or CuPy's), inside CUDA
graphs, with Programmatic Dependent Launch on and off, and after the work before it on the
stream."""

import os

import numpy as np
import pytest
from backends import (
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    to_device,
    to_host_bytes,
)
from helpers import activations, assert_same_bytes, force_path

import fp8_group_quant as fgq

pytestmark = pytest.mark.gpu

# streams and graphs -------------------------------------------------------------------------------


def test_cuda_graph_capture_and_replay():
    import torch

    rng = np.random.default_rng(3)
    shape = (37, 2048)
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(shape, dtype=torch.float8_e4m3fn, device="cuda")
    s = torch.empty(40 * 4, dtype=torch.int32, device="cuda").as_strided((37, 4), (1, 40))
    fgq.quantize_packed(x, out=q, scale_out=s)  # warm up outside the capture
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fgq.quantize_packed(x, out=q, scale_out=s)
    for _ in range(3):
        data = activations(rng, shape, "bfloat16", specials=True)
        x.copy_(to_device(data, "torch"))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = fgq.quantize_packed(data)
        assert_same_bytes(q.view(torch.uint8).cpu().numpy(), np.asarray(q_ref).view(np.uint8), "q")
        assert np.array_equal(s.cpu().numpy(), s_ref)


def test_runs_on_torchs_current_stream():
    import torch

    rng = np.random.default_rng(4)
    data = activations(rng, (4096, 7168), "bfloat16")
    source = to_device(data, "torch")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # delay the side stream; a launch elsewhere would race
        x = source * 1  # produced on the side stream
        q, s = fgq.quantize_packed(x)
        done = torch.cuda.Event()
        done.record()
    done.synchronize()
    q_ref, s_ref = fgq.quantize_packed(data)
    assert_same_bytes(q.view(torch.uint8).cpu().numpy(), np.asarray(q_ref).view(np.uint8), "q")
    assert np.array_equal(s.cpu().numpy(), s_ref)


def test_runs_on_cupys_current_stream():
    import cupy

    rng = np.random.default_rng(5)
    data = activations(rng, (2048, 7168), "bfloat16")
    with cupy.cuda.Stream(non_blocking=True) as stream:
        x = cupy.asarray(data) * 1
        q, s = fgq.quantize_packed(x)
        stream.synchronize()
    q_ref, s_ref = fgq.quantize_packed(data)
    assert_same_bytes(q.get(), np.asarray(q_ref).view(np.uint8), "q")
    assert np.array_equal(s.get(), s_ref)


# Programmatic Dependent Launch --------------------------------------------------------------------


def test_pdl_is_on_for_sm90_and_off_by_switch():
    import cupy
    import torch

    device = cupy.cuda.runtime.getDevice()
    x = to_device(activations(np.random.default_rng(14), (8, 1024), "bfloat16"), "torch")
    sm90 = torch.cuda.get_device_capability(device)[0] >= 9
    configured = os.environ.get("FP8_GROUP_QUANT_PDL", "1") != "0"
    with force_path(fresh_plans=True):  # as configured (the default: on)
        assert [launch.pdl for launch in fgq.prepare(x)._plan.launches] == [sm90 and configured]
    with force_path(pdl=False):  # FP8_GROUP_QUANT_PDL=0
        assert [launch.pdl for launch in fgq.prepare(x)._plan.launches] == [False]


@pytest.mark.parametrize("pdl", [True, False])  # the quantizer launched with PDL and without
def test_pdl_chain_in_a_torch_graph(pdl):
    # producer (a torch op) -> quantize -> consumer (a torch op reading q), captured and replayed:
    # with PDL the quantizer may start early, so it must wait for x and not overwrite q early
    import torch

    with force_path(pdl=pdl):
        rng = np.random.default_rng(15)
        # no subnormals: halving them in bf16 step by step would round differently from once
        source = to_device(activations(rng, (33, 2048), "bfloat16"), "torch")
        x = torch.empty_like(source)
        q, s = fgq.quantize_packed(x)
        total = torch.zeros((), dtype=torch.float32, device="cuda")
        stream = torch.cuda.Stream()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(4):
                x.copy_(source * 2)  # producer
                fgq.quantize_packed(x, out=q, scale_out=s)
                total.add_(q.view(torch.uint8).sum(dtype=torch.float32))  # consumer
                source.mul_(0.5)
        graph.replay()
        torch.cuda.synchronize()
    # the last step quantized source * 2 after three halvings
    data = activations(np.random.default_rng(15), (33, 2048), "bfloat16")
    expected = (data.astype(np.float32) * 2 * 0.5**3).astype(data.dtype)
    q_ref, s_ref = fgq.quantize_packed(expected)
    assert_same_bytes(to_host_bytes(q), np.asarray(q_ref).view(np.uint8), "q")
    assert np.array_equal(s.cpu().numpy(), s_ref)


# ordering with the work before the call on the same stream ----------------------------------------


@pytest.mark.parametrize("lib", ["cupy", "torch"])  # both GPU libraries
def test_a_call_right_after_a_device_copy_reads_the_copy(lib):
    # the previous operation on the stream is a device-to-device copy into x (no kernel): the
    # launch must not start reading x before the copy is done, PDL or not
    rng = np.random.default_rng(24)
    fresh = [activations(rng, (64, 1024), "bfloat16") for _ in range(2)]
    w_host = activations(rng, (1024,), "bfloat16")
    sources = [to_device(f, lib) for f in fresh]
    x = to_device(fresh[0], lib)
    weight = to_device(w_host, lib)
    options = dict(scale="ue8m0", layout="packed")
    expected = [fgq.quantize(f, 128, **options)[0] for f in fresh]
    expected_norm = [fgq.quantize(f, 128, **options, norm=(w_host, 1e-6))[0] for f in fresh]
    step = fgq.prepare(x, 128, **options)
    calls = {
        "quantize": (lambda: fgq.quantize(x, 128, **options), expected),
        "prepared": (lambda: step(x), expected),
        "norm": (lambda: fgq.quantize(x, 128, **options, norm=(weight, 1e-6)), expected_norm),
    }

    def copy_into_x(source):
        if lib == "torch":
            x.copy_(source)
        else:
            x[...] = source

    for i in range(60):
        for name, (call, wanted) in calls.items():
            copy_into_x(sources[i % 2])
            q = call()[0]
            assert_same_bytes(to_host_bytes(q), np.ascontiguousarray(wanted[i % 2]),
                              f"{name} right after a copy, call {i}")  # fmt: skip
