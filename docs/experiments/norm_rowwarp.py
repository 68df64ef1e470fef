"""Experiment (issue 13, session 19): the fused RMSNorm with a whole row in one warp's registers.

Copies kernels/ to a temporary directory, appends norm_rowwarp.cuh (this directory) to its
quantize.cu and points FP8_GROUP_QUANT_KERNEL_DIR at it; then times the RMSNorm path without a
residual (bf16 -> e4m3, packed UE8M0, K = 7168: 14 warps of lanes a row) with the library's
register kernels ("auto") and with quantize_norm_rowwarp (the library's plan for the call, its
kernel, grid and shared memory replaced), beside the same-traffic roofline kernel; CUDA-graph
replays over rotating buffers, medians, without PDL / with it. Each configuration's outputs
are first compared with the register kernels' on the timed data, bit for bit. From the
repository root:

    PYTHONPATH=$PWD python3 docs/experiments/norm_rowwarp.py [M ...]
"""

import os
import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
KERNELS = pathlib.Path(tempfile.mkdtemp()) / "kernels"
shutil.copytree(HERE.parents[1] / "kernels", KERNELS)
with open(KERNELS / "quantize.cu", "a") as f:
    f.write((HERE / "norm_rowwarp.cuh").read_text())
os.environ["FP8_GROUP_QUANT_KERNEL_DIR"] = str(KERNELS)

from norm_warp import print_rows  # noqa: E402

from fp8_group_quant import _jit, _launch  # noqa: E402

K = 7168
THREADS = 128
FORCE = {"on": False, "fill": 1.0}
_original_prepare_norm = _launch._prepare_norm


def _prepare_rowwarp(request, key, device):
    launch = _original_prepare_norm(request, key, device)
    if not FORCE["on"]:
        return launch
    lanes = request.output.groups * key.lanes_per_group
    assert lanes % 32 == 0, "the kernel holds whole warps of lanes (K a multiple of 512)"
    spans = lanes // 32
    name = (
        f"fgq::quantize_norm_rowwarp<{_launch.INPUT_TYPES[key.input_dtype].kernel_trait}, "
        f"{key.group_size}, {_launch.OUTPUT_FORMATS[key.output].kernel_trait}, "
        f"{_launch.SCALE_FORMATS[key.scale].kernel_trait}, {key.layout_trait}, {spans}>"
    )
    function = _jit.get_function(_launch.SOURCE, name, device)
    shared = spans * 32 * 64  # each lane's 16 weights as float32
    with _jit.current_device(device):
        handle = function.kernel.ptr
        _launch.allow_shared(handle, shared)
    per_sm, sms = _launch.resident_blocks(handle, name, THREADS, device, shared)
    rows_total = request.output.batches * request.output.rows
    warps = THREADS // 32
    blocks = max(1, min(-(-rows_total // warps), int(FORCE["fill"] * per_sm * sms)))
    return _launch.Launch(
        handle, (blocks, 1, 1), (THREADS, 1, 1), launch.params, launch.pdl, shared
    )


_launch._prepare_norm = _prepare_rowwarp


def force_rowwarp(on: bool, fill: float) -> None:
    FORCE["on"], FORCE["fill"] = on, fill


if __name__ == "__main__":
    configs = [("auto", False, 1.0), ("rowwarp", True, 1.0), ("rowwarp 0.5", True, 0.5)]
    m_values = [int(a) for a in sys.argv[1:]] or [512, 1024, 2048, 4096, 8192]
    print_rows(m_values, K, configs, force_rowwarp)
