"""``bench --chain``: the quantizer between a producer and a consumer, with PDL and without.

An engine quantizes between two kernels: the one that writes the activation and the GEMM that
reads the codes. This times CUDA graphs of ``CHAIN_STEPS`` [producer writes x -> quantize ->
consumer reads q and the scales] steps (kernels/chain.cu), every kernel launched with the
programmatic stream serialization attribute or every one without, GPU us per step. The producer
and consumer take part in PDL as the quantizer does, so the difference is what PDL saves at the
two edges of each quantize call. With ``--peers sglang=PATH`` the quantizer is ours or SGLang's
v2 kernel (``peers``; built with its PDL calls, kUsePDL, as its host builds it), the graphs of
both quantizers replayed in turn.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import api
from .._layout import SCALE_LAYOUTS, Geometry
from . import _hooks, peers
from .shapes import own_k, own_m
from .timing import graph_time_us, interleaved_graph_times_us

CHAIN_M = (1, 4, 16, 64, 128, 256, 512)
CHAIN_STEPS = 32  # [producer, quantize, consumer] steps per graph
CHAIN_THREADS = 256
CHAIN_SOURCE = "chain.cu"
CHAIN_KERNELS = ("fgq::produce_bf16", "fgq::consume")  # the producer, the consumer


def chain_kernels(device: int) -> tuple[int, int]:
    """The driver handles of the producer and the consumer on ``device``."""
    produce, consume = (_hooks.get_function(CHAIN_SOURCE, name, device) for name in CHAIN_KERNELS)
    return _hooks.handle(produce, device), _hooks.handle(consume, device)


def producer(produce: int, sms: int, x, step: int, pdl: bool):
    """The producer's launch writing ``x`` (its values depend on ``step``)."""
    n = x.size
    return _hooks.kernel_launch(
        produce, (min(sms * 4, -(-n // CHAIN_THREADS)), 1, 1), (CHAIN_THREADS, 1, 1),
        [ctypes.c_uint64(x.data.ptr), ctypes.c_int64(n), ctypes.c_uint32(step)],
        pdl,
    )  # fmt: skip


def consumer(consume: int, sms: int, q, scale_ptr: int, scale_words: int, sink, pdl: bool):
    """The consumer's launch reading every word of q and of the scales into ``sink``."""
    return _hooks.kernel_launch(
        consume, (sms * 4, 1, 1), (CHAIN_THREADS, 1, 1),
        [ctypes.c_uint64(q.data.ptr), ctypes.c_int64(q.nbytes // 4),
         ctypes.c_uint64(scale_ptr), ctypes.c_int64(scale_words),
         ctypes.c_uint64(sink.data.ptr)],
        pdl,
    )  # fmt: skip


def step(cupy, produce_launch, quantize, consume_launch):
    """One step of a chain: ``quantize(stream)`` between the producer and the consumer."""

    def call():
        stream = cupy.cuda.get_current_stream().ptr
        produce_launch(stream)
        quantize(stream)
        consume_launch(stream)

    return call


# ours --------------------------------------------------------------------------------------------


def run_chain(args) -> list[dict]:
    """GPU time per step of a chain with Programmatic Dependent Launch on every kernel and
    without. Default M = 1..512 (``--m`` overrides), K = ``--k[0]``, the default kernel's
    format and layout.
    """
    import cupy
    import ml_dtypes

    device = cupy.cuda.runtime.getDevice()
    if not _hooks.pdl_supported(device):
        raise SystemExit("--chain: PDL needs an SM90+ device and NVIDIA's cuda-bindings")
    kernels = chain_kernels(device)
    k = args.k[0]
    m_values = own_m(args, CHAIN_M)
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    print(f"# chain of {CHAIN_STEPS} [producer -> quantize -> consumer] steps per CUDA graph, "
          f"K={k}; GPU us per step (median of replays)")  # fmt: skip
    print(f"{'M':>6} {'no PDL':>8} {'PDL':>8} {'saved':>8}")
    rows = []
    for m in m_values:
        x = cupy.empty((CHAIN_STEPS, m, k), dtype=np.uint16).view(ml_dtypes.bfloat16)
        scale_words = Geometry((m, k), 128, SCALE_LAYOUTS["packed"], False).scale_storage
        sink = cupy.zeros(sms * 4, dtype=np.uint32)
        times = {
            pdl: _chain_us(cupy, kernels, sms, x, scale_words, sink, pdl) for pdl in (False, True)
        }
        row = {"M": m, "K": k, "no_pdl_us": times[False], "pdl_us": times[True]}
        rows.append(row)
        print(f"{m:>6} {times[False]:>8.2f} {times[True]:>8.2f} "
              f"{times[False] - times[True]:>8.2f}", flush=True)  # fmt: skip
    return rows


def _chain_us(cupy, kernels, sms: int, x, scale_words: int, sink, pdl: bool) -> float:
    """GPU us per step of the chain of our quantizer over ``x``'s steps, checked after."""
    produce, consume = kernels
    with _hooks.pdl_launches(pdl):
        outputs = [api.quantize_packed(x[i]) for i in range(CHAIN_STEPS)]
        calls = []
        for i, (q, s) in enumerate(outputs):
            first = producer(produce, sms, x[i], i, pdl)
            last = consumer(consume, sms, q, s.data.ptr, max(0, scale_words), sink, pdl)

            def quantize(stream, xi=x[i], q=q, s=s):
                api.quantize_packed(xi, out=q, scale_out=s)

            calls.append(step(cupy, first, quantize, last))
        us = graph_time_us(cupy, calls, replays=15)
        # the chain computes what the quantizer alone computes on the produced x
        q_ref, s_ref = api.quantize_packed(x[-1].copy())
        if not (cupy.array_equal(outputs[-1][0], q_ref)
                and cupy.array_equal(outputs[-1][1], s_ref)):  # fmt: skip
            m = x.shape[1]
            raise AssertionError(f"--chain: the chained quantizer's output differs, M={m}")
    return us


# ours and SGLang's (--peers sglang=PATH) ---------------------------------------------------------


def run_peers(args, sglang_path: str) -> list[dict]:
    """The chain with our quantizer (the library's prepared launch) and SGLang's, for each K
    (``--k``, else 7168) and M (``--m``, else 1..512)."""
    import cupy

    device = cupy.cuda.runtime.getDevice()
    sgl = _hooks.handle(peers.sglang_function(sglang_path), device)
    kernels = chain_kernels(device)
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    rows = []
    for k in own_k(args, 7168):
        print(f"# {CHAIN_STEPS} [producer -> quantize -> consumer] steps a graph, K = {k}; "
              "us per step")  # fmt: skip
        print(f"{'M':>6} {'ours':>8} {'SGLang':>8} {'ours PDL':>9} {'SGLang PDL':>11}", flush=True)
        for m in own_m(args, CHAIN_M):
            times = _peer_chain_times(cupy, device, sms, kernels, sgl, m, k)
            rows.append({"M": m, "K": k, "ours_us": times[False]["ours"],
                         "sgl_us": times[False]["sgl"], "ours_pdl_us": times[True]["ours"],
                         "sgl_pdl_us": times[True]["sgl"]})  # fmt: skip
            print(f"{m:>6} {times[False]['ours']:>8.2f} {times[False]['sgl']:>8.2f} "
                  f"{times[True]['ours']:>9.2f} {times[True]['sgl']:>11.2f}",
                  flush=True)  # fmt: skip
    return rows


def _peer_chain_times(cupy, device: int, sms: int, kernels, sgl: int, m: int, k: int) -> dict:
    """{pdl: {"ours": us, "sgl": us}}: GPU us per step, the two chains' graphs in turn."""
    import ml_dtypes

    x = cupy.empty((CHAIN_STEPS, m, k), dtype=np.uint16).view(ml_dtypes.bfloat16)
    geometry = Geometry((m, k), 128, SCALE_LAYOUTS["packed"], False)
    q = cupy.empty((CHAIN_STEPS, geometry.q_storage), cupy.uint8)
    s = cupy.zeros((CHAIN_STEPS, geometry.scale_storage), cupy.int32)
    sink = cupy.zeros(sms * 4, dtype=np.uint32)
    blocks, threads = peers.sglang_config(m, k)
    tma = geometry.scale_storage // -(-k // 512)
    times = {}
    for pdl in (False, True):
        ours = _hooks.default_launch(x[0], device, pdl)
        lists: dict[str, list] = {"ours": [], "sgl": []}
        for i in range(CHAIN_STEPS):
            first = producer(kernels[0], sms, x[i], i, pdl)
            last = consumer(kernels[1], sms, q[i], s[i].data.ptr, s[i].size, sink, pdl)
            theirs = _hooks.kernel_launch(
                sgl, (blocks, 1, 1), (threads, 1, 1),
                [ctypes.c_uint64(x[i].data.ptr), ctypes.c_uint64(q[i].data.ptr),
                 ctypes.c_uint64(s[i].data.ptr), ctypes.c_uint64(0), ctypes.c_int(threads // 8),
                 ctypes.c_int(k // 128), ctypes.c_int(0), ctypes.c_int(tma), ctypes.c_int(m)],
                pdl,
            )  # fmt: skip

            def quantize(stream, xi=x[i], qi=q[i], si=s[i], launch=ours):
                _hooks.run_prepared(launch, xi.data.ptr, qi.data.ptr, si.data.ptr, stream)

            lists["ours"].append(step(cupy, first, quantize, last))
            lists["sgl"].append(step(cupy, first, theirs, last))
        result = interleaved_graph_times_us(cupy, list(lists.values()), 15)
        times[pdl] = dict(zip(lists, result))
    return times
