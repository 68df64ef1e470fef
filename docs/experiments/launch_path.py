"""Experiment (issue 10): does the driver call that records a launch change its time in a graph?

Session 9 left 0.03-0.15 us between ours and SGLang's v2 kernel at M <= 512 without PDL, and
its per-warp clock stamps put most of it between launches (a launch's last warp end to the
next launch's first warp start), not in the warps' instructions. One difference between the
two was never varied: `bench` and `sglang_same_run.py` record ours with the driver's
`cuLaunchKernelEx` (through ctypes, no attributes without PDL) and the roofline kernel and
SGLang's with CuPy's `cuLaunchKernel`. This script times each kernel recorded both ways,
graph against graph in one process (graphs replayed in turn):

- roof / roof_ex: the roofline kernel through CuPy / through `_launch.KernelLaunch`;
- ours_ex / ours_cl: the library's prepared launch (`cuLaunchKernelEx`) / the same kernel and
  Params through CuPy's `driver.launchKernel` (`cuLaunchKernel`);
- sgl / sgl_ex: SGLang's kernel (as `sglang_same_run.py` builds and launches it) through CuPy /
  through `_launch.KernelLaunch`.

Every launch of ours is checked to write the library's bytes; SGLang's real rows against ours.
Run from the repository root: PYTHONPATH=$PWD python3 docs/experiments/launch_path.py PATH [K ...]
(PATH: SGLang's per_token_group_quant_8bit_v2.cuh, see sglang_same_run.py)
"""

import ctypes
import sys

import cupy
import harness
import ml_dtypes
import numpy as np
import sglang_same_run

from fp8_group_quant import _jit, _launch, bench
from fp8_group_quant.__main__ import activation
from fp8_group_quant._arrays import describe
from fp8_group_quant._request import make_request

SIZES = (1, 4, 16, 64, 256, 512, 1024, 4096)


def through_cupy(launch: _launch.Launch) -> _launch.Launch:
    """The same prepared launch recorded with CuPy's cuLaunchKernel instead of cuLaunchKernelEx."""
    from cupy_backends.cuda.api import driver

    params = type(launch.params).from_buffer_copy(launch.params)
    with _jit.current_device(cupy.cuda.runtime.getDevice()):
        copy = _launch.Launch(launch.handle, launch.grid, launch.block, params)
    copy._launch_ex = None
    copy._launch_kernel = driver.launchKernel
    copy._launch_args = (launch.handle, *launch.grid, *launch.block, 0)
    return copy


def measure(m: int, k: int, roofline, sglang) -> tuple[dict, int]:
    x_host = activation(m, k, seed=m + k).astype(ml_dtypes.bfloat16)
    buffers = max(2, min(64, -(-harness.ROTATE_BYTES // x_host.nbytes)))
    count = max(buffers, harness.CALLS)
    inputs = [cupy.asarray(x_host) for _ in range(buffers)]
    geometry = _launch.Geometry((m, k), 128, "packed", False)

    def outputs():
        return [
            (
                cupy.empty(geometry.q_storage, cupy.uint8),
                cupy.empty(geometry.scale_storage, cupy.int32),
            )
            for _ in range(buffers)
        ]

    request = make_request(describe(inputs[0], "x"), 128, "e4m3", "ue8m0", "packed", 1e-10, False)
    device = cupy.cuda.runtime.getDevice()
    ours = _launch.prepare(request, device)
    launches = {"ours_ex": ours, "ours_cl": through_cupy(ours)}
    outs = {name: outputs() for name in ("roof", "roof_ex", *launches, "sgl", "sgl_ex")}

    # each way of recording ours writes the same bytes, poison included
    written = {}
    for name, launch in launches.items():
        q, s = outs[name][0]
        q.fill(0x7F)
        s.fill(0x7F7F7F7F)
        harness.run_launch(launch, inputs[0], (q, s))
        written[name] = (q.get(), s.get())
    assert all(np.array_equal(a, b) for a, b in zip(written["ours_ex"], written["ours_cl"]))
    q_ref, s_ref = written["ours_ex"]

    chunks = inputs[0].size * 2 // 32
    roof_grid = (-(-chunks // 256), 1, 1)

    def roof_cupy(i):
        x, (q, _) = inputs[i % buffers], outs["roof"][i % buffers]
        return lambda: roofline(roof_grid, (256, 1, 1), (x, q, np.int64(chunks)))

    def roof_ex(i):
        x, (q, _) = inputs[i % buffers], outs["roof_ex"][i % buffers]
        args = [ctypes.c_void_p(x.data.ptr), ctypes.c_void_p(q.data.ptr), ctypes.c_int64(chunks)]
        with _jit.current_device(device):
            launch = _launch.KernelLaunch(roofline.kernel.ptr, roof_grid, (256, 1, 1), args)
        return lambda: launch(cupy.cuda.get_current_stream().ptr)

    blocks, threads = sglang_same_run.sglang_config(m, k)
    tma = geometry.scale_storage // -(-k // 512)

    def sgl_args(name, i):
        x, (q, s) = inputs[i % buffers], outs[name][i % buffers]
        return x, q, s

    def sgl_cupy(i):
        x, q, s = sgl_args("sgl", i)
        args = (x, q, s, np.uint64(0), np.int32(threads // 8), np.int32(k // 128), np.int32(0),
                np.int32(tma), np.int32(m))  # fmt: skip
        return lambda: sglang((blocks, 1, 1), (threads, 1, 1), args)

    def sgl_ex(i):
        x, q, s = sgl_args("sgl_ex", i)
        pointers = [ctypes.c_void_p(a) for a in (x.data.ptr, q.data.ptr, s.data.ptr, 0)]
        sizes = [ctypes.c_int(a) for a in (threads // 8, k // 128, 0, tma, m)]
        with _jit.current_device(device):
            launch = _launch.KernelLaunch(
                sglang.kernel.ptr, (blocks, 1, 1), (threads, 1, 1), pointers + sizes
            )
        return lambda: launch(cupy.cuda.get_current_stream().ptr)

    differ = 0
    for name, make in (("sgl", sgl_cupy), ("sgl_ex", sgl_ex)):
        q, s = outs[name][0]
        q.fill(0x7F)
        s.fill(0)
        make(0)()
        q_bytes = q.get().reshape(-1)[: m * k] != q_ref.reshape(-1)[: m * k]
        words = s.get().reshape(-1, tma)[:, :m] != s_ref.reshape(-1, tma)[:, :m]
        differ += int(q_bytes.sum()) + int(words.sum())

    calls = {
        "roof": [roof_cupy(i) for i in range(count)],
        "roof_ex": [roof_ex(i) for i in range(count)],
        **{
            name: harness.launch_calls(launch, inputs, outs[name])
            for name, launch in launches.items()
        },
        "sgl": [sgl_cupy(i) for i in range(count)],
        "sgl_ex": [sgl_ex(i) for i in range(count)],
    }
    times = bench.interleaved_graph_times_us(cupy, list(calls.values()), 11)
    return dict(zip(calls, times)), differ


def main() -> None:
    _launch.PDL = False
    path = sys.argv[1]
    ks = [int(a) for a in sys.argv[2:]] or [7168, 2048]
    roofline = harness.roofline_function()
    sglang = sglang_same_run.sglang_function(path)
    header = None
    for k in ks:
        for m in SIZES:
            times, differ = measure(m, k, roofline, sglang)
            if header is None:
                header = list(times)
                names = " ".join(f"{c:>8}" for c in header)
                print(f"{'M':>6} {'K':>5} {names}   ex-sgl   cl-sgl    ex-cl  sgl differing")
            row = " ".join(f"{times[c]:>8.2f}" for c in header)
            ex, cl, sgl = times["ours_ex"], times["ours_cl"], times["sgl"]
            print(
                f"{m:>6} {k:>5} {row}   {ex - sgl:>+6.2f}   {cl - sgl:>+6.2f}   {ex - cl:>+6.2f}"
                f"  {differ}",
                flush=True,
            )


if __name__ == "__main__":
    main()
