"""Experiment (issue 10): SGLang's v2 per-token-group kernel timed in the same run as ours.

Issue 10's SGLang ratios were measured on another machine against another roofline kernel;
a ratio at M <= 16 moves by 0.1 between machines (docs/perf.md step 18). This script times
SGLang's own kernel beside ours and the roofline kernel, graph against graph, in one process.

The SGLang source is not part of this repository. Pass the path of
`sglang/kernels/jit/csrc/gemm/per_token_group_quant_8bit_v2.cuh` from the `sglang` wheel on
PyPI (the JIT port of sgl-kernel's `per_token_group_quant_8bit_v2.cu`; its header says the
kernel's arithmetic is the AOT kernel's). The script drops its `#include` lines and its
launcher (everything from the "Launcher (JIT)" comment on) and puts before it a few lines of
its own: the type alias, the PDL helpers and the warp maximum the kernel names, the latter with
the whole-warp mask of the AOT kernel. It is launched as its host launches it (NaiveScheduler:
8 lanes a group, 16 groups a block where they divide the groups, else 8, 4, 2, 1; packed
column-major UE8M0 scales) and without the PDL attribute, as `bench` launches ours.

Columns, us per call by CUDA-graph replay over rotating buffers (graphs replayed in turn):
- roof: the roofline kernel; ours: the library's launch (PDL off), checked bit for bit
  against the NumPy backend;
- sgl: SGLang's kernel as shipped (its loads compile to the read-only path, LDG.CONSTANT, as
  the AOT kernel's `ld.global.nc`); the codes and scales of its real rows are compared with
  ours and the differing bytes counted;
- with --variants=NAME[,NAME...] (and --m=M,M,... for the rows), text edits of ours (session 24,
  of the kernel of commit 4c0153f, before step 25 made "flat" an instantiation): flat (the
  load's address linear in the group slot, as SGLang's, valid for one batch of contiguous
  rows), finite_now (no Inf/NaN vote), nopad_now (no padding rows, not the contract),
  lean_nopad (the three), t64 (ours in blocks of 64 threads); and older ones: scale1st,
  finite, nopad (of the kernel of
  commit 9017005, which run 1 of session 9 measured): the scale stored before the codes are
  computed, no Inf/NaN paths (valid on this finite data), no padding rows (not the contract);
  regs32 (run 13, after step 22): the lean one-pass kernel at eight resident blocks;
  signal_end, signal_first (runs 15-16): griddepcontrol.launch_dependents at the kernel's end
  (as SGLang's) or before its loads, instead of right after them; same (run 16): ours with a
  comment changed, compiled and loaded as the variants are; nogdc (session 10): no
  griddepcontrol instructions, as SGLang's host builds its kernel where PDL is off.
- with --modes (session 10), each kernel as its host launches it with PDL on and off:
  ours_pdl, the library's default launch on SM90 (the PDL attribute on, so one call's
  prologue may overlap the previous call's end); sgl_pdl, SGLang's kUsePDL kernel with the
  attribute, as its host launches it on SM90 (is_arch_support_pdl); sgl_nopdl, its kernel
  built with kUsePDL = false, without the attribute, as its host launches it elsewhere. "sgl"
  stays the kUsePDL kernel without the attribute, as runs 1-20 of session 9 timed it.
Run from the repository root: PYTHONPATH=$PWD python3 docs/experiments/sglang_same_run.py PATH
[--variants=NAMES] [--m=M,...] [--modes] [--json=PATH] [K ...]
(--json writes every row, us per call of each column and SGLang's differing bytes, as it goes)
"""

import ctypes
import json
import sys

import cupy
import flat_one_pass
import harness
import ml_dtypes
import numpy as np

from fp8_group_quant import _jit, _launch, bench
from fp8_group_quant.__main__ import activation
from fp8_group_quant._arrays import describe
from fp8_group_quant._request import make_request

# what the SGLang kernel names from its own headers, written here
PRELUDE = r"""
#include <cuda_bf16.h>
#include <cuda_fp8.h>
typedef unsigned int uint32_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef signed char int8_t;
namespace std {
template <bool B, class T, class F> struct conditional { typedef T type; };
template <class T, class F> struct conditional<false, T, F> { typedef F type; };
template <bool B, class T, class F> using conditional_t = typename conditional<B, T, F>::type;
template <class A, class B> constexpr bool is_same_v = false;
template <class A> constexpr bool is_same_v<A, A> = true;
}  // namespace std
#define SGL_DEVICE __forceinline__ __device__
typedef __nv_fp8_e4m3 fp8_e4m3_t;
namespace host {
inline void RuntimeCheck(bool, const char*) {}
}  // namespace host
namespace device {
template <bool kUse> SGL_DEVICE void PDLWaitPrimary() {
  if constexpr (kUse) asm volatile("griddepcontrol.wait;" ::: "memory");
}
template <bool kUse> SGL_DEVICE void PDLTriggerSecondary() {
  if constexpr (kUse) asm volatile("griddepcontrol.launch_dependents;" :::);
}
namespace warp {
typedef unsigned mask_t;
template <int kLanes, typename T> SGL_DEVICE T reduce_max(T value, mask_t) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}
}  // namespace warp
}  // namespace device
"""
NAME = (
    "sglang::per_token_group_quant_8bit_v2_kernel<sglang::NaiveScheduler, 128, 8, "
    "__nv_bfloat16, fp8_e4m3_t, true, true, false, true>"
)
# kUsePDL = false: no griddepcontrol instructions, as its host builds it where PDL is off
NAME_NO_PDL = NAME.replace("false, true>", "false, false>")


def sglang_text(path: str) -> str:
    text = open(path).read()
    text = text[: text.index("// Launcher (JIT)")]
    text = text[: text.rindex("// ----")]
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#include"))
    return PRELUDE + body + "\n}  // namespace sglang\n"


def sglang_function(path: str, name: str = NAME, edits=()):
    """SGLang's kernel compiled by NVRTC with the CUDA headers (cuda_fp8.h, cuda_bf16.h), with
    ``edits`` ((old, new) text pairs) applied."""
    cuda_path = cupy.cuda.get_cuda_path()
    options = (*_jit.nvrtc_options(), *([f"-I{cuda_path}/include"] if cuda_path else []))
    text = sglang_text(path)
    for old, new in edits:
        if old not in text:
            raise LookupError(f"edit target not in SGLang's source: {old}")
        text = text.replace(old, new)
    module = cupy.RawModule(code=text, options=options, name_expressions=(name,))
    return module.get_function(name)


SCALE_FIRST = [
    (
        "    encode_lane<kIn, kOut, kMultiply, kValues>(words, scale, inverse, codes);",
        "    if (store_scale) ScaleLayout<kLayout>::store_at(scale_at, p, group, scale, exponent,"
        " real_row);\n    store_scale = false;\n"
        "    encode_lane<kIn, kOut, kMultiply, kValues>(words, scale, inverse, codes);",
    )
]
# the lean instantiations at eight resident blocks of 256 threads (31 registers, no spill since
# step 22) instead of six (40)
REGISTERS_32 = [
    (
        "return kVec16 && kAct == kIdentity && (lean || one_pass_six) ? 6 : 5;",
        "return kVec16 && kAct == kIdentity && (lean || one_pass_six) ? 8 : 5;",
    )
]
# griddepcontrol.launch_dependents at the one-pass kernel's end, as SGLang's kernel has it, or
# before its loads, instead of right after them
SIGNAL_AT_END = [
    ("    signal_dependents();\n    table.wait();", "    table.wait();"),
    ("stores & 2u, group);\n    return;",
     "stores & 2u, group);\n    signal_dependents();\n    return;"),
]  # fmt: skip
SIGNAL_FIRST = [
    ("    signal_dependents();\n    table.wait();", "    table.wait();"),
    ("    wait_for_producer();\n    u32 up[kLaneWords];", "    wait_for_producer();\n"
     "    signal_dependents();\n    u32 up[kLaneWords];"),
]  # fmt: skip
# ours unchanged but for a comment, compiled and loaded as the variants are (RawModule): what
# that path itself costs, if anything
SAME = [
    (
        "// Per-token group quantization: one kernel family",
        "// Per-token group quantization, one kernel family",
    )
]
# no griddepcontrol instructions at all (the empty asm statements keep the compiler barriers),
# as SGLang's host builds its kernel where PDL is off
NO_GRIDDEPCONTROL = [
    ('asm volatile("griddepcontrol.wait;" ::: "memory");', 'asm volatile("" ::: "memory");'),
    ('asm volatile("griddepcontrol.launch_dependents;" :::);', 'asm volatile("" :::);'),
]
# session 24, on commit 4c0153f's kernel (step 22's tail, fused step 30): the load's address
# linear in the group slot, as SGLang's (valid for one batch of contiguous rows and one-row
# tiles, as measured here), the divisions then needed by the stores only; no Inf/NaN vote (valid on
# this finite data); no padding rows (not the contract: the rows below M keep their poison);
# and the three together
FLAT = [
    (
        "        p, static_cast<const Storage*>(p.x) + static_cast<i64>(batch) *"
        " p.x_batch_stride32 +\n"
        "               static_cast<i64>(static_cast<int>(read_row)) * p.x_row_stride32 + value0,"
        " words,\n        up);",
        "        p, static_cast<const Storage*>(p.x) + static_cast<i64>(slot) * kGroup +"
        " lane * kValues, words, up);",
    )
]
FINITE_NOW = [
    (
        "const bool nonfinite = magnitude >= L::kInf;  // uniform",
        "const bool nonfinite = false;  //",
    )
]
NO_PAD_NOW = [("if (active && row == p.rows - 1u) {", "if (false) {")]
# session 25, on the kernel of commit 713cc82 (steps 25-26): the scale stored before the codes
# are computed, as SGLang's kernel orders its stores
SCALE_FIRST_NOW = [
    (
        "    encode_lane<kIn, kOut, kMultiply, kValues>(values, scale, inverse, codes);",
        "    ScaleLayout<kLayout>::template store_at<kStraightTail>(scale_at, p, group, scale,"
        " exponent, real_row, store_scale);\n    store_scale = false;\n"
        "    encode_lane<kIn, kOut, kMultiply, kValues>(values, scale, inverse, codes);",
    )
]
VARIANTS = {
    "flat": FLAT,
    "finite_now": FINITE_NOW,
    "nopad_now": NO_PAD_NOW,
    "scale1st_now": SCALE_FIRST_NOW,
    "lean_nopad": FLAT + FINITE_NOW + NO_PAD_NOW,
    "t64": SAME,  # ours in blocks of 64 threads (VARIANT_THREADS), as SGLang's at M = 1
    "same": SAME,
    "nogdc": NO_GRIDDEPCONTROL,
    "signal_end": SIGNAL_AT_END,
    "signal_first": SIGNAL_FIRST,
    "scale1st": SCALE_FIRST,
    "finite": flat_one_pass.FINITE,
    "nopad": flat_one_pass.NO_PAD,
    "regs32": REGISTERS_32,
}


UNCHECKED: set[str] = set()  # kernels of other experiments that are not the contract
VARIANT_THREADS = {"t64": 64}  # threads a block of a variant's one-pass grid, else 128
ALL_M = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def sglang_config(m: int, k: int) -> tuple[int, int]:
    """(blocks, threads) of SGLang's NaiveScheduler at (m, k), group size 128."""
    groups = m * k // 128
    per_block = next(s for s in (16, 8, 4, 2, 1) if groups % s == 0)
    return groups // per_block, per_block * 8


def measure(m: int, k: int, roofline, sglang: dict, binaries: dict, modes: bool):
    x_host = activation(m, k, seed=m + k).astype(ml_dtypes.bfloat16)
    buffers = max(2, min(64, -(-harness.ROTATE_BYTES // x_host.nbytes)))
    inputs = [cupy.asarray(x_host) for _ in range(buffers)]
    geometry = _launch.Geometry((m, k), 128, "packed", False)
    outputs = [
        (cupy.empty(geometry.q_storage, cupy.uint8), cupy.empty(geometry.scale_storage, cupy.int32))
        for _ in range(buffers)
    ]
    request = make_request(describe(inputs[0], "x"), 128, "e4m3", "ue8m0", "packed", 1e-10, False)
    device = cupy.cuda.runtime.getDevice()
    launches = {"ours": _launch.prepare(request, device)}
    if modes:  # the library's default launch on SM90: the PDL attribute on
        _launch.PDL = True
        launches["ours_pdl"] = _launch.prepare(request, device)
        _launch.PDL = False
    for name, function in binaries.items():
        threads = VARIANT_THREADS.get(name, 128)
        launches[name] = flat_one_pass.ours(m, k, inputs[0], threads, True, function)
    expected = flat_one_pass.reference(m, k, x_host)
    for name, launch in launches.items():
        if "nopad" not in name and name not in UNCHECKED:
            flat_one_pass.check_ours(launch, expected, inputs[0])

    blocks, threads = sglang_config(m, k)
    tma = geometry.scale_storage // -(-k // 512)  # rows of the packed layout, a multiple of 4

    def sglang_call(function, i):
        x, (q, s) = inputs[i % buffers], outputs[i % buffers]
        args = (x, q, s, np.uint64(0), np.int32(threads // 8), np.int32(k // 128), np.int32(0),
                np.int32(tma), np.int32(m))  # fmt: skip
        return lambda: function((blocks, 1, 1), (threads, 1, 1), args)

    def sglang_pdl_call(function, i):
        """As its host launches it on SM90: the kUsePDL kernel with the PDL attribute."""
        x, (q, s) = inputs[i % buffers], outputs[i % buffers]
        pointers = [ctypes.c_void_p(a) for a in (x.data.ptr, q.data.ptr, s.data.ptr, 0)]
        sizes = [ctypes.c_int(a) for a in (threads // 8, k // 128, 0, tma, m)]
        args = pointers + sizes
        with _jit.current_device(device):
            launch = _launch.KernelLaunch(
                function.kernel.ptr, (blocks, 1, 1), (threads, 1, 1), args, pdl=True
            )
        return lambda: launch(cupy.cuda.get_current_stream().ptr)

    # their codes and scales of the real rows against the reference (bytes that differ)
    q_ref, s_ref = expected
    differ = {}
    for name, function in sglang.items():
        q, s = outputs[0]
        q.fill(0x7F)
        s.fill(0)
        sglang_call(function, 0)()
        q_bytes = q.get().reshape(-1)[: m * k] != q_ref.reshape(-1)[: m * k]
        words = s.get().reshape(-1, tma)[:, :m] != s_ref.reshape(-1, tma)[:, :m]
        differ[name] = int(q_bytes.sum()) + int(words.sum())

    calls = [harness.roofline_calls(roofline, inputs, outputs)]
    calls += [harness.launch_calls(launch, inputs, outputs) for launch in launches.values()]
    calls += [
        [sglang_call(function, i) for i in range(max(buffers, harness.CALLS))]
        for function in sglang.values()
    ]
    names = ["roof", *launches, *sglang]
    if modes:
        count = max(buffers, harness.CALLS)
        calls.append([sglang_pdl_call(sglang["sgl"], i) for i in range(count)])
        names.append("sgl_pdl")
    times = bench.interleaved_graph_times_us(cupy, calls, 11)
    return dict(zip(names, times)), differ


def main(extra: dict | None = None, sglang_edits: dict | None = None) -> None:
    """``extra``: name -> kernels taking ours' Params, launched as the variants are;
    ``sglang_edits``: name -> text edits of SGLang's kernel, launched as it is."""
    _launch.PDL = False  # as the roofline kernel and SGLang's: no overlap of back-to-back calls
    path = sys.argv[1]
    chosen = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--variants=")]
    variants = {n: VARIANTS[n] for n in chosen[0].split(",")} if chosen else {}
    ks = [int(a) for a in sys.argv[2:] if not a.startswith("--")] or [7168, 2048, 2688]
    chosen_m = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--m=")]
    m_values = [int(v) for v in chosen_m[0].split(",")] if chosen_m else ALL_M
    roofline = harness.roofline_function()
    modes = "--modes" in sys.argv
    sglang = {"sgl": sglang_function(path)}
    if modes:
        sglang["sgl_nopdl"] = sglang_function(path, NAME_NO_PDL)
    for name, edits in (sglang_edits or {}).items():
        sglang[name] = sglang_function(path, NAME, edits)
    binaries = {name: flat_one_pass.variant(*edits) for name, edits in variants.items()}
    binaries.update(extra or {})
    registers = {n: f.num_regs for n, f in {**sglang, **binaries}.items()}
    print("registers:", registers, flush=True)
    chosen_json = [a.split("=", 1)[1] for a in sys.argv[2:] if a.startswith("--json=")]
    rows = []
    header = None
    for k in ks:
        for m in m_values:
            times, differ = measure(m, k, roofline, sglang, binaries, modes)
            rows.append({"m": m, "k": k, "us": times, "bytes_differing": differ})
            if chosen_json:
                with open(chosen_json[0], "w") as handle:
                    json.dump({"registers": registers, "rows": rows}, handle, indent=1)
            if header is None:
                header = list(times)
                print(f"{'M':>6} {'K':>5} " + " ".join(f"{c:>9}" for c in header) + "   x roof: "
                      + " ".join(f"{c:>9}" for c in header[1:]) + "  bytes differing")  # fmt: skip
            roof = times["roof"]
            print(f"{m:>6} {k:>5} " + " ".join(f"{times[c]:>9.2f}" for c in header) + "           "
                  + " ".join(f"{times[c] / roof:>9.3f}" for c in header[1:])
                  + "  " + " ".join(str(d) for d in differ.values()), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
