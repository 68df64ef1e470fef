"""Experiment (issue 13, session 20): the walking RMSNorm with three or four lanes a thread.

The library's weight-stashing RMSNorm kernel holds two 32-byte lanes a thread; its per-row
work (the loop, r, the barriers, addresses) is shared by a thread's lanes, so more lanes a
thread issue fewer instructions a value, with fewer warps an SM. norm_wide.patch lets
quantize_norm take three or four lanes (a warp whose lanes all lie past the row's end skips
them, a uniform branch) with NORM_WIDE_REGS registers. This times the RMSNorm path without a
residual (bf16 -> e4m3, packed UE8M0, K = 7168) with the library's choice ("auto") and with
the weight-stashing kernel forced at each --per (one resident wave of walking blocks, or a
block a row where the rows are fewer), beside the same-traffic roofline kernel; CUDA-graph
replays over rotating buffers, medians, without PDL / with it; outputs first compared bit for
bit. Point FP8_GROUP_QUANT_KERNEL_DIR at a copy of kernels/ with the patch applied (and the
register cap edited), from the repository root:

    cp -r kernels /tmp/k && patch -d /tmp/k -p2 < docs/experiments/norm_wide.patch
    FP8_GROUP_QUANT_KERNEL_DIR=/tmp/k PYTHONPATH=$PWD python3 docs/experiments/norm_wide.py \
        [M ...] [--per 3 --per 4]

Session 20's run (the cap at 128, 96 and 80): logs/norm-wide-session20-h200.log.
"""

import dataclasses
import sys

from norm_warp import print_rows  # this directory's

from fp8_group_quant import _jit, _launch

K = 7168
FORCE: dict = {"per": None}
_original_prepare_norm = _launch._prepare_norm


def _prepare_wide(request, key, device):
    launch = _original_prepare_norm(request, key, device)
    per = FORCE["per"]
    if per is None:
        return launch
    lanes = request.output.groups * key.lanes_per_group
    name = dataclasses.replace(key, norm_lanes=per, norm_stash=True).name_expression
    function = _jit.get_function(_launch.SOURCE, name, device)
    threads = -(-lanes // (_launch.WARP * per)) * _launch.WARP
    shared = _launch.norm_stash_bytes(threads, per)
    with _jit.current_device(device):
        handle = function.kernel.ptr
        if shared > _launch.STATIC_SHARED_LIMIT:
            _launch.allow_shared(handle, shared)
    per_sm, sms = _launch.resident_blocks(handle, name, threads, device, shared)
    rows_total = request.output.batches * request.output.rows
    blocks = max(1, min(rows_total, per_sm * sms))
    return _launch.Launch(
        handle, (blocks, 1, 1), (threads, 1, 1), launch.params, launch.pdl, shared
    )


_launch._prepare_norm = _prepare_wide


def force_per(on, fill) -> None:
    FORCE["per"] = on or None


def main(argv) -> None:
    m_values, pers = [], []
    args = iter(argv)
    for arg in args:
        if arg == "--per":
            pers.append(int(next(args)))
        else:
            m_values.append(int(arg))
    configs = [("auto", None, 1.0)] + [(f"{p} lanes", p, 1.0) for p in pers or [2, 3, 4]]
    print_rows(m_values or [1024, 2048, 4096, 8192], K, configs, force_per)


if __name__ == "__main__":
    main(sys.argv[1:])
