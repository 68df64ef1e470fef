"""Experiment (issue 13, session 20): the fused RMSNorm with several rows a block in registers.

Copies kernels/ to a temporary directory, appends norm_rows.cuh (this directory) to its
quantize.cu and points FP8_GROUP_QUANT_KERNEL_DIR at it; then times the RMSNorm path without a
residual (bf16 -> e4m3, packed UE8M0, K = 7168) with the library's register kernels ("auto")
and with quantize_norm_rows at several (lanes a thread, row slots a block, registers) (the
library's plan for the call, its kernel, grid and shared memory replaced: at most one resident
wave of blocks, fewer where the rows need fewer), beside the same-traffic roofline kernel;
CUDA-graph replays over rotating buffers, medians, without PDL / with it. Each configuration's
outputs are first compared with the register kernels' on the timed data, bit for bit. From the
repository root:

    PYTHONPATH=$PWD python3 docs/experiments/norm_rows.py [M ...] [--config PER:ROWS:REGS ...]

Session 20's run: logs/norm-rows-session20-h200.log.
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
    f.write((HERE / "norm_rows.cuh").read_text())
os.environ["FP8_GROUP_QUANT_KERNEL_DIR"] = str(KERNELS)

from norm_warp import print_rows  # noqa: E402

from fp8_group_quant import _jit, _launch  # noqa: E402

K = 7168
FORCE: dict = {"config": None}
_original_prepare_norm = _launch._prepare_norm


def name_of(key, per: int, rows: int, registers: int) -> str:
    return (
        f"fgq::quantize_norm_rows<{_launch.INPUT_TYPES[key.input_dtype].kernel_trait}, "
        f"{key.group_size}, {_launch.OUTPUT_FORMATS[key.output].kernel_trait}, "
        f"{_launch.SCALE_FORMATS[key.scale].kernel_trait}, {key.layout_trait}, {per}, {rows}, "
        f"{registers}>"
    )


def _prepare_rows(request, key, device):
    launch = _original_prepare_norm(request, key, device)
    if FORCE["config"] is None:
        return launch
    per, slots, registers, per_sm_cap = FORCE["config"]
    lanes = request.output.groups * key.lanes_per_group
    name = name_of(key, per, slots, registers)
    function = _jit.get_function(_launch.SOURCE, name, device)
    threads = _launch.norm_threads(lanes, per)
    shared = _launch.norm_stash_bytes(threads, per)
    with _jit.current_device(device):
        handle = function.kernel.ptr
        if shared > _launch.STATIC_SHARED_LIMIT:
            _launch.allow_shared(handle, shared)
    per_sm, sms = _launch.resident_blocks(handle, name, threads, device, shared)
    if per_sm_cap:
        per_sm = min(per_sm, per_sm_cap)
    rows_total = request.output.batches * request.output.rows
    blocks = max(1, min(-(-rows_total // slots), per_sm * sms))
    return _launch.Launch(
        handle, (blocks, 1, 1), (threads, 1, 1), launch.params, launch.pdl, shared
    )


_launch._prepare_norm = _prepare_rows


def force_rows(on, fill) -> None:
    FORCE["config"] = on or None


def main(argv) -> None:
    m_values, configs = [], [("auto", False, 1.0)]
    args = iter(argv)
    for arg in args:
        if arg == "--config":
            spec = next(args)
            parts = [int(v) for v in spec.split(":")]
            parts += [0] * (4 - len(parts))
            configs.append((f"rows {spec}", tuple(parts), 1.0))
        else:
            m_values.append(int(arg))
    if len(configs) == 1:
        configs += [(f"rows {c}", tuple(int(v) for v in c.split(":")) + (0,), 1.0)
                    for c in ("1:2:80", "1:4:96", "2:2:96", "2:1:72")]  # fmt: skip
    print_rows(m_values or [256, 512, 1024, 4096], K, configs, force_rows)


if __name__ == "__main__":
    main(sys.argv[1:])
