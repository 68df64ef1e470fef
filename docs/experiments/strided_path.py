"""Experiment (issue 10, session 24): the one-pass kernel's two load addresses, timed per tree.

Step 25 (docs/perf.md) gives the one-pass kernel a second load address: linear in the group
slot where x's rows are K apart and its batches rows * K apart (Params.flat_slots), taken
before the divisions that place the slot, and the old address through the strides otherwise,
now after the first's predicated load. This times, graph against graph in one process
(graphs replayed in turn, PDL off as `bench`), the roofline kernel, the library's launch on a
contiguous x ("contiguous") and on the same values in rows 256 elements wider than K
("wide rows", the strided address), each checked against the NumPy backend first. Run it in
each tree to compare (tools/ab_bench.sh's alternation, by hand), from the repository root:

    PYTHONPATH=$PWD python3 docs/experiments/strided_path.py [M ...]
"""

import sys

import cupy
import harness
import ml_dtypes
import numpy as np

from fp8_group_quant import _launch, api, bench
from fp8_group_quant.__main__ import activation
from fp8_group_quant._arrays import describe
from fp8_group_quant._request import make_request

K = 7168
WIDER = 256  # elements each row of the strided input is wider than K


def inputs(m: int) -> tuple[np.ndarray, list, list]:
    """The host values, contiguous device copies, and views into wider device rows."""
    host = activation(m, K, seed=m).astype(ml_dtypes.bfloat16)
    buffers = max(2, min(64, -(-harness.ROTATE_BYTES // host.nbytes)))
    wide = np.zeros((m, K + WIDER), host.dtype)
    wide[:, :K] = host
    contiguous = [cupy.asarray(host) for _ in range(buffers)]
    views = [cupy.asarray(wide)[:, :K] for _ in range(buffers)]
    return host, contiguous, views


def launch_calls(xs: list) -> tuple[list, list]:
    """The library's prepared launch over the inputs (PDL off), and its outputs."""
    request = make_request(describe(xs[0], "x"), 128, "e4m3", "ue8m0", "packed", 1e-10, False)
    launch = _launch.prepare(request, cupy.cuda.runtime.getDevice())
    outputs = [api.quantize_packed(x) for x in xs]
    return harness.launch_calls(launch, xs, outputs), outputs


def main() -> None:
    _launch.PDL = False
    roofline = harness.roofline_function()
    print(f"{'M':>6} {'roof':>7} {'contiguous':>11} {'wide rows':>10}   x roof", flush=True)
    for m in [int(a) for a in sys.argv[1:]] or [1, 4, 16, 64, 256, 512, 1024]:
        host, contiguous, views = inputs(m)
        lists = []
        for xs in (contiguous, views):
            calls, outputs = launch_calls(xs)
            q, s = outputs[0]
            q.view(cupy.uint8).fill(0x7F)
            s.fill(-1)
            calls[0]()
            want_q, want_s = api.quantize_packed(host)
            same_q = np.array_equal(q.view(cupy.uint8).get(), want_q.view(np.uint8))
            assert same_q and np.array_equal(s.get(), want_s), m
            lists.append(calls)
        roof = harness.roofline_calls(roofline, contiguous, [api.quantize_packed(contiguous[0])])
        times = bench.interleaved_graph_times_us(cupy, [roof, *lists], 11)
        ratios = " ".join(f"{t / times[0]:.3f}" for t in times[1:])
        print(f"{m:>6} {times[0]:>7.2f} {times[1]:>11.2f} {times[2]:>10.2f}   {ratios}", flush=True)


if __name__ == "__main__":
    main()
