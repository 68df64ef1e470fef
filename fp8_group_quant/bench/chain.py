"""Experiment (issue 10): ours and SGLang's v2 kernel between a producer and a consumer.

An engine quantizes between two kernels: the one that writes the activation and the GEMM that
reads the codes. This times CUDA graphs of 32 [producer writes x -> quantize -> consumer reads
q and the scales] steps (the producer and consumer of `bench --chain`, kernels/chain.cu), the
quantizer being ours or SGLang's v2 kernel (see sglang_same_run.py; built with its PDL calls,
kUsePDL, as its host builds it), every kernel launched with the programmatic stream
serialization attribute or every one without; the graphs of both quantizers replayed in turn.
Prints GPU us per step.
Run from the repository root:
PYTHONPATH=$PWD python3 docs/experiments/sglang_chain.py SGLANG_V2_CUH [K ...]
"""

import ctypes
import sys

import cupy
import ml_dtypes
import numpy as np
import sglang_same_run

from fp8_group_quant import _jit, _launch, bench
from fp8_group_quant._arrays import describe
from fp8_group_quant._layout import Geometry
from fp8_group_quant._request import make_request

STEPS = 32
THREADS = 256


def main() -> None:
    device = cupy.cuda.runtime.getDevice()
    sgl = sglang_same_run.sglang_function(sys.argv[1])
    produce = _jit.get_function("chain.cu", "fgq::produce_bf16", device)
    consume = _jit.get_function("chain.cu", "fgq::consume", device)
    with _jit.current_device(device):
        produce, consume, sgl_handle = produce.kernel.ptr, consume.kernel.ptr, sgl.kernel.ptr
    sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
    for k in [int(a) for a in sys.argv[2:]] or [7168]:
        chain(k, device, sms, produce, consume, sgl_handle)


def chain(k: int, device: int, sms: int, produce, consume, sgl_handle) -> None:
    print(f"# {STEPS} [producer -> quantize -> consumer] steps a graph, K = {k}; us per step")
    print(f"{'M':>6} {'ours':>8} {'SGLang':>8} {'ours PDL':>9} {'SGLang PDL':>11}", flush=True)
    for m in (1, 4, 16, 64, 128, 256, 512):
        x = cupy.empty((STEPS, m, k), dtype=np.uint16).view(ml_dtypes.bfloat16)
        geometry = Geometry((m, k), 128, "packed", False)
        q = cupy.empty((STEPS, geometry.q_storage), cupy.uint8)
        s = cupy.zeros((STEPS, geometry.scale_storage), cupy.int32)
        sink = cupy.zeros(sms * 4, dtype=np.uint32)
        blocks, threads = sglang_same_run.sglang_config(m, k)
        tma = geometry.scale_storage // -(-k // 512)
        times = {}
        for pdl in (False, True):
            saved = _launch.PDL
            _launch.PDL = pdl
            try:
                request = make_request(
                    describe(x[0], "x"), 128, "e4m3", "ue8m0", "packed", 1e-10, False
                )
                ours = _launch.prepare(request, device)
            finally:
                _launch.PDL = saved
            lists = {"ours": [], "sgl": []}
            for i in range(STEPS):
                n = m * k
                producer = _launch.KernelLaunch(
                    produce, (min(sms * 4, -(-n // THREADS)), 1, 1), (THREADS, 1, 1),
                    [ctypes.c_uint64(x[i].data.ptr), ctypes.c_int64(n), ctypes.c_uint32(i)], pdl,
                )  # fmt: skip
                consumer = _launch.KernelLaunch(
                    consume, (sms * 4, 1, 1), (THREADS, 1, 1),
                    [ctypes.c_uint64(q[i].data.ptr), ctypes.c_int64(q[i].nbytes // 4),
                     ctypes.c_uint64(s[i].data.ptr), ctypes.c_int64(s[i].size),
                     ctypes.c_uint64(sink.data.ptr)], pdl,
                )  # fmt: skip
                theirs = _launch.KernelLaunch(
                    sgl_handle, (blocks, 1, 1), (threads, 1, 1),
                    [ctypes.c_uint64(x[i].data.ptr), ctypes.c_uint64(q[i].data.ptr),
                     ctypes.c_uint64(s[i].data.ptr), ctypes.c_uint64(0), ctypes.c_int(threads // 8),
                     ctypes.c_int(k // 128), ctypes.c_int(0), ctypes.c_int(tma), ctypes.c_int(m)],
                    pdl,
                )  # fmt: skip

                def step(producer, quantize, consumer):
                    def call():
                        stream = cupy.cuda.get_current_stream().ptr
                        producer(stream)
                        quantize(stream)
                        consumer(stream)

                    return call

                xi, qi, si = x[i], q[i], s[i]
                lists["ours"].append(step(
                    producer,
                    lambda stream, xi=xi, qi=qi, si=si, ours=ours: ours.launch(
                        xi.data.ptr, qi.data.ptr, si.data.ptr, stream),
                    consumer,
                ))  # fmt: skip
                lists["sgl"].append(step(producer, theirs, consumer))
            result = bench.interleaved_graph_times_us(cupy, list(lists.values()), 15)
            times[pdl] = dict(zip(lists, result))
        print(f"{m:>6} {times[False]['ours']:>8.2f} {times[False]['sgl']:>8.2f} "
              f"{times[True]['ours']:>9.2f} {times[True]['sgl']:>11.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
