"""Experiment (issue 10): where one warp of ours and of SGLang's v2 kernel spends its cycles.

small_m_params.py found SGLang's kernel 0.15-0.25 us faster than ours at M = 64-512 with the
same grid, and none of our kernel's differences it tried (its parameters' constant lines, the
load's index arithmetic, the Inf/NaN paths, the code's layout) worth more than 0.05-0.09 us.
This reads clock64 at eight points of both kernels; lane 0 of each warp stores them in a
__device__ array:
  0 entry, 1 the loaded words arrive, 2 the group maximum is reduced, 3 amax is final (ours:
  after the Inf/NaN vote), 4 the scale is known, 5 the codes are packed, 6 the codes' store
  is issued, 7 the scale's store is issued (SGLang stores its scale before it encodes: 7 is 6).
Each stamp reads the clock under a predicate computed from the value it follows, so the warp
waits for that value there (an asm merely taking it as an input does not wait, and ptxas
schedules an unpredicated clock read above the instruction that would). The stamps' own
instructions lengthen each phase a little, alike in both kernels. Each kernel runs three
times, on buffers of its own that the setup's copies have left out of L2 where they can; the
last launch is summarised: the median over warps of each phase, in cycles.
The stamps are text edits of the kernel (run 9 of session 9 measured commit 9017005's, run 11
the kernel after step 22). Run from the repository root:
PYTHONPATH=$PWD python3 docs/experiments/warp_timeline.py SGLANG_V2_CUH
"""

import ctypes
import sys

import cupy
import flat_one_pass
import harness
import numpy as np
import sglang_same_run
import small_m_params

from fp8_group_quant import _jit, _launch

WARPS = 16384
PHASES = ("load", "max", "vote", "scale", "encode", "store q", "store s")
STAMPS = (
    f'extern "C" __device__ unsigned long long fgq_phase[{8 * WARPS}];\n'
    '#define FGQ_AT(i, v) { long long t; asm volatile("{ .reg .pred p; setp.ne.u32 p, %1, '
    '0x9e3779b9; @p mov.u64 %0, %%clock64; @!p mov.u64 %0, 0; }" : "=l"(t) : '
    '"r"((unsigned)(v)) : "memory"); const unsigned fgq_w = (blockIdx.x * blockDim.x + '
    f"threadIdx.x) >> 5; if ((threadIdx.x & 31) == 0 && fgq_w < {WARPS}) "
    "fgq_phase[8 * fgq_w + (i)] = t; }\n"
)
OURS = [
    ("  if constexpr (kOnePass) {", "  if constexpr (kOnePass) {\n    FGQ_AT(0, 1u)"),
    (
        "    apply_activation<kIn, kAct>(words, up, table);\n    u8* q_batch",
        "    apply_activation<kIn, kAct>(words, up, table);\n    FGQ_AT(1, words[0] + words[4])\n"
        "    u8* q_batch",
    ),
    (
        "  u32 magnitude = group_max<kLanes>(In::max_magnitude(words), mask);",
        "  u32 magnitude = group_max<kLanes>(In::max_magnitude(words), mask);\n"
        "  FGQ_AT(2, magnitude)",
    ),
    (
        "  const float amax = fmaxf(In::magnitude_to_f32(magnitude), p.eps);",
        "  const float amax = fmaxf(In::magnitude_to_f32(magnitude), p.eps);\n"
        "  FGQ_AT(3, __float_as_uint(amax))",
    ),
    (
        "    scale = __uint_as_float(exponent << 23);",
        "    scale = __uint_as_float(exponent << 23);\n    FGQ_AT(4, exponent)",
    ),
    (
        "  // the codes, then the scale (one lane per group)\n  if (store_q) store_codes",
        "  FGQ_AT(5, codes[0] ^ codes[kValues / 4 - 1])\n  if (store_q) store_codes",
    ),
    (
        "  ScaleLayout<kLayout>::template store_at<kStraightTail>(",
        "  FGQ_AT(6, codes[0])\n  ScaleLayout<kLayout>::template store_at<kStraightTail>(",
    ),
    (
        "                                                        real_row, store_scale);\n}",
        "                                                        real_row, store_scale);\n"
        "  FGQ_AT(7, exponent)\n}",
    ),
]
SGL = [
    (
        "  device::PDLWaitPrimary<kUsePDL>();",
        "  device::PDLWaitPrimary<kUsePDL>();\n  FGQ_AT(0, 1u)",
    ),
    (
        "        constexpr int num_elems_per_pack =",
        "        FGQ_AT(1, input_primary_int4[0].x + input_primary_int4[1].x)\n"
        "        constexpr int num_elems_per_pack =",
    ),
    (
        "        local_absmax = GroupReduceMax<THREADS_PER_SUBWARP>(local_absmax);",
        "        local_absmax = GroupReduceMax<THREADS_PER_SUBWARP>(local_absmax);\n"
        "        FGQ_AT(2, __float_as_uint(local_absmax)) FGQ_AT(3, __float_as_uint(local_absmax))",
    ),
    (
        "        calculate_fp8_scales<SCALE_UE8M0, dst_dtype_info>(local_absmax, y_scale,"
        " y_scale_inv);",
        "        calculate_fp8_scales<SCALE_UE8M0, dst_dtype_info>(local_absmax, y_scale,"
        " y_scale_inv);\n        FGQ_AT(4, __float_as_uint(y_scale))",
    ),
    (
        "        // Ordinary 128-bit vectorized store (STG.128); no inline asm.",
        "        FGQ_AT(5, output_buf.x ^ output_buf.w)",
    ),
    ("            output_buf;\n", "            output_buf;\n        FGQ_AT(6, output_buf.x)\n"),
    ("  device::PDLTriggerSecondary<kUsePDL>();", "  device::PDLTriggerSecondary<kUsePDL>();"),
]


def edited(text: str, edits) -> str:
    for old, new in edits:
        if text.count(old) != 1:
            raise LookupError(f"edit target not found once: {old[:60]}")
        text = text.replace(old, new)
    return STAMPS + text


def phases(stamps: np.ndarray, warps: int, sgl: bool) -> str:
    s = stamps[: 8 * warps].reshape(-1, 8).astype(np.int64)
    if sgl:
        s[:, 7] = s[:, 6]
    steps = np.median(np.diff(s, axis=1), axis=0)
    total = np.median(s[:, 7] - s[:, 0])
    return " ".join(f"{v:>8.0f}" for v in steps) + f" {total:>8.0f}"


def main() -> None:
    _launch.PDL = False
    name = _launch.DEFAULT_KEY.name_expression
    ours_module = cupy.RawModule(
        code=edited(_jit.source_text("quantize.cu"), OURS),
        options=_jit.nvrtc_options(),
        name_expressions=(name,),
    )
    ours_function = ours_module.get_function(name)
    cuda_path = cupy.cuda.get_cuda_path()
    options = (*_jit.nvrtc_options(), *([f"-I{cuda_path}/include"] if cuda_path else []))
    sgl_module = cupy.RawModule(
        code=edited(sglang_same_run.sglang_text(sys.argv[1]), SGL),
        options=options,
        name_expressions=(sglang_same_run.NAME,),
    )
    sgl_function = sgl_module.get_function(sglang_same_run.NAME)
    print("median cycles over warps, from the previous point to:", flush=True)
    print(f"{'':>22}" + " ".join(f"{p:>8}" for p in PHASES) + f" {'total':>8}", flush=True)
    for k in (7168, 2048):
        for m in (1, 64, 512):
            inputs, outputs, _ = small_m_params.setup(m, k)
            ours = flat_one_pass.ours(m, k, inputs[0], 128, True, ours_function)
            blocks, threads = sglang_same_run.sglang_config(m, k)
            tma = outputs[0][1].size // -(-k // 512)
            for label, module in (("sgl", sgl_module), ("ours", ours_module)):
                first = 0 if label == "ours" else 3
                for i in range(first, first + 3):
                    x, (q, s) = inputs[i % len(inputs)], outputs[i % len(outputs)]
                    if label == "ours":
                        harness.run_launch(ours, x, (q, s))
                    else:
                        args = [ctypes.c_void_p(x.data.ptr), ctypes.c_void_p(q.data.ptr),
                                ctypes.c_void_p(s.data.ptr), ctypes.c_void_p(0),
                                ctypes.c_int(threads // 8), ctypes.c_int(k // 128),
                                ctypes.c_int(0), ctypes.c_int(tma), ctypes.c_int(m)]  # fmt: skip
                        small_m_params.launcher(
                            sgl_function, (blocks, 1, 1), (threads, 1, 1), args
                        )(cupy.cuda.get_current_stream().ptr)
                cupy.cuda.runtime.deviceSynchronize()
                array = cupy.ndarray((8 * WARPS,), cupy.uint64, module.get_global("fgq_phase"))
                if label == "ours":
                    warps = ours.grid[0] * ours.block[0] // 32
                else:
                    warps = blocks * threads // 32
                row = phases(array.get(), warps, label == "sgl")
                print(f"{label:>5} M = {m:>5} K = {k}: {row}", flush=True)


if __name__ == "__main__":
    main()
