"""``bench --peers``: SGLang's and vLLM's kernels timed beside ours, in the same run.

A ratio measured on another machine against another roofline kernel moves by 0.1 at M <= 16
(docs/perf.md), so the peers' kernels are timed here beside ours and the roofline
kernel, graph against graph, in one process. Their sources are not part of this package; each
is given as ``NAME=PATH``:

- ``sglang=PATH``: ``sglang/kernels/jit/csrc/gemm/per_token_group_quant_8bit_v2.cuh`` from the
  ``sglang`` wheel on PyPI (the JIT port of sgl-kernel's ``per_token_group_quant_8bit_v2.cu``;
  its header says the kernel's arithmetic is the AOT kernel's). Its ``#include`` lines and its
  launcher (everything from the "Launcher (JIT)" comment on) are dropped, and a few lines of
  ours put before it: the type alias, the PDL helpers and the warp maximum the kernel names,
  the latter with the whole-warp mask of the AOT kernel. NVRTC compiles it with the CUDA
  headers. It is launched as its host launches it (NaiveScheduler: 8 lanes a group, 16 groups
  a block where they divide the groups, else 8, 4, 2, 1; packed column-major UE8M0 scales).
- ``vllm=PATH``: the PTX of vLLM's fused quantizers, built from the ``vllm`` sdist
  (``peers_vllm``); with ``--fused`` only.

This module times the plain quantizer (``bench --peers sglang=PATH``): columns in us per call
by CUDA-graph replay over rotating buffers (graphs replayed in turn): roof, the roofline
kernel; ours, the library's launch with PDL off, checked bit for bit against the NumPy
backend; ours_pdl, the library's default launch on SM90 (the PDL attribute on, so one call's
prologue may overlap the previous call's end); sgl, SGLang's kUsePDL kernel without the PDL
attribute (its loads compile to the read-only path, LDG.CONSTANT, as the AOT kernel's
``ld.global.nc``); sgl_nopdl, its kernel built with kUsePDL = false, without the attribute, as
its host launches it where PDL is off; sgl_pdl, the kUsePDL kernel with the attribute, as its
host launches it on SM90 (is_arch_support_pdl). The codes and scales of SGLang's real rows are
compared with ours and the differing bytes counted. ``chain`` and ``peers_fused`` time the
chain and the fused paths.
"""

from __future__ import annotations

import argparse
import ctypes
import os

import numpy as np

from .._layout import SCALE_LAYOUTS, Geometry
from .._sample import activation
from ..reference import quantize_into
from . import _hooks
from .timing import CALLS, ROOFLINE_THREADS, ROTATE_BYTES, interleaved_graph_times_us

# where each peer's source comes from, for the messages of a missing one
SOURCES = {
    "sglang": "SGLang's kernel is not shipped with this package: pass the path of "
    "sglang/kernels/jit/csrc/gemm/per_token_group_quant_8bit_v2.cuh from the sglang wheel on PyPI "
    "(`pip download sglang --no-deps`, then unzip the wheel)",
    "vllm": "vLLM's kernels are not shipped with this package: build their PTX from the vllm "
    "sdist on PyPI on a machine with nvcc and torch (`python -m fp8_group_quant.bench.peers_vllm "
    "VLLM_CSRC OUT.ptx`) and pass OUT.ptx",
}
LAUNCHER_MARK = "// Launcher (JIT)"  # where SGLang's host code starts in its .cuh
# the paths of --fused each peer has (bench --fused --paths picks among them)
PEER_PATHS = {"sglang": ("silu_mul",), "vllm": ("silu_mul", "add_rms_norm", "rms_norm")}


def peer_source(text: str) -> tuple[str, str]:
    """``--peers``' NAME=PATH, as (name, path)."""
    name, sep, path = text.partition("=")
    if name not in SOURCES or not sep or not path:
        raise argparse.ArgumentTypeError(
            f"expected NAME=PATH with NAME one of {', '.join(SOURCES)}, got {text!r}"
        )
    return name, path


def source_error(args) -> str | None:
    """Why ``--peers`` cannot run with the other options of ``args`` or its files, or None."""
    given = dict(args.peers)
    if args.matrix or args.nvfp4 or args.profile_host:
        return "--peers: with the plain table, --sweep, --fused or --chain only"
    if args.plot:
        return "--peers: --plot draws the plain table only"
    if "vllm" in given and not args.fused:
        return "--peers vllm=PATH: vLLM's kernels are fused quantizers; add --fused"
    timed = {path for name in given for path in PEER_PATHS[name]}
    if args.fused and args.paths and not timed & set(args.paths):
        has = "; ".join(f"{name}: {', '.join(paths)}" for name, paths in PEER_PATHS.items())
        return f"--peers: no peer given has --paths {' '.join(args.paths)} ({has})"
    if "sglang" not in given and not args.fused:
        mode = "--chain" if args.chain else "--sweep" if args.sweep else "the plain table"
        return f"--peers: {mode} times SGLang's kernel: give sglang=PATH. {SOURCES['sglang']}"
    for name, path in given.items():
        if not os.path.isfile(path):
            return f"--peers {name}={path}: no such file. {SOURCES[name]}"
    if "sglang" in given:
        with open(given["sglang"]) as handle:
            if LAUNCHER_MARK not in handle.read():
                return (f"--peers sglang={given['sglang']}: not SGLang's v2 kernel (no "
                        f"'{LAUNCHER_MARK}' line). {SOURCES['sglang']}")  # fmt: skip
    return None


# SGLang's kernel from its source -----------------------------------------------------------------

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
    """SGLang's kernel text from its .cuh: no includes, no launcher, our prelude before it."""
    with open(path) as handle:
        text = handle.read()
    text = text[: text.index(LAUNCHER_MARK)]
    text = text[: text.rindex("// ----")]
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#include"))
    return PRELUDE + body + "\n}  // namespace sglang\n"


def sglang_function(path: str, name: str = NAME):
    """SGLang's kernel compiled by NVRTC with the CUDA headers (cuda_fp8.h, cuda_bf16.h)."""
    import cupy

    cuda_path = cupy.cuda.get_cuda_path()
    include = (f"-I{cuda_path}/include",) if cuda_path else ()
    return _hooks.compile_text(sglang_text(path), name, include)


def sglang_config(m: int, k: int) -> tuple[int, int]:
    """(blocks, threads) of SGLang's NaiveScheduler at (m, k), group size 128."""
    groups = m * k // 128
    per_block = next(s for s in (16, 8, 4, 2, 1) if groups % s == 0)
    return groups // per_block, per_block * 8


# the plain quantizer beside SGLang's -------------------------------------------------------------


def run(args, sglang_path: str) -> tuple[list[dict], dict]:
    """The table for each K of ``--k`` and M of ``--m``; the rows, and {"registers": ...}."""
    roofline = _hooks.compile_text(_hooks.kernel_source("roofline.cu"), "fgq::roofline_copy")
    sglang = {
        "sgl": sglang_function(sglang_path),
        "sgl_nopdl": sglang_function(sglang_path, NAME_NO_PDL),
    }
    registers = {n: f.num_regs for n, f in sglang.items()}
    print("registers:", registers, flush=True)
    rows = []
    header: list[str] = []
    for k in args.k:
        for m in args.m:
            times, differ = measure(m, k, roofline, sglang)
            rows.append({"m": m, "k": k, "us": times, "bytes_differing": differ})
            if not header:
                header = list(times)
                print(f"{'M':>6} {'K':>5} " + " ".join(f"{c:>9}" for c in header) + "   x roof: "
                      + " ".join(f"{c:>9}" for c in header[1:]) + "  bytes differing")  # fmt: skip
            roof = times["roof"]
            print(f"{m:>6} {k:>5} " + " ".join(f"{times[c]:>9.2f}" for c in header) + "           "
                  + " ".join(f"{times[c] / roof:>9.3f}" for c in header[1:])
                  + "  " + " ".join(str(d) for d in differ.values()), flush=True)  # fmt: skip
    return rows, {"registers": registers}


def measure(m: int, k: int, roofline, sglang: dict) -> tuple[dict, dict]:
    """us per call of every column at (m, k), and the bytes of each SGLang build's output that
    differ from the reference's."""
    import cupy
    import ml_dtypes

    x_host = activation(m, k, seed=m + k).astype(ml_dtypes.bfloat16)
    buffers = max(2, min(64, -(-ROTATE_BYTES // x_host.nbytes)))
    inputs = [cupy.asarray(x_host) for _ in range(buffers)]
    geometry = Geometry((m, k), 128, SCALE_LAYOUTS["packed"], False)
    outputs = packed_outputs(cupy, geometry, buffers)
    device = cupy.cuda.runtime.getDevice()
    launches = our_launches(inputs[0], device)
    expected = reference(geometry, x_host)
    for launch in launches.values():
        check_ours(launch, expected, inputs[0])
    sgl = SglangCalls(inputs, outputs, geometry, device)
    differ = {name: sgl.bytes_differing(function, expected) for name, function in sglang.items()}
    count = max(buffers, CALLS)
    calls = [roofline_calls(roofline, inputs, outputs)]
    calls += [launch_calls(launch, inputs, outputs) for launch in launches.values()]
    calls += [[sgl.call(function, i) for i in range(count)] for function in sglang.values()]
    calls.append([sgl.pdl_call(sglang["sgl"], i) for i in range(count)])
    names = ["roof", *launches, *sglang, "sgl_pdl"]
    times = interleaved_graph_times_us(cupy, calls, 11)
    return dict(zip(names, times)), differ


def packed_outputs(cupy, geometry: Geometry, count: int) -> list[tuple]:
    """``count`` pairs of (q storage, scale storage) of the packed layout's ``geometry``."""
    return [
        (cupy.empty(geometry.q_storage, cupy.uint8), cupy.empty(geometry.scale_storage, cupy.int32))
        for _ in range(count)
    ]


def our_launches(x, device: int) -> dict:
    """The library's launches of the default kernel for arrays like ``x``: PDL off, PDL on."""
    return {"ours": _hooks.default_launch(x, device, pdl=False),
            "ours_pdl": _hooks.default_launch(x, device, pdl=True)}  # fmt: skip


class SglangCalls:
    """Launches of SGLang's kernel over the rotating buffers, as its host launches it."""

    def __init__(self, inputs, outputs, geometry: Geometry, device: int):
        m, k = geometry.shape
        self.inputs, self.outputs, self.device, self.m, self.k = inputs, outputs, device, m, k
        self.blocks, self.threads = sglang_config(m, k)
        self.tma = geometry.scale_storage // -(-k // 512)  # rows of the packed layout, 4 | tma

    def call(self, function, i: int):
        """Through CuPy, without the PDL attribute."""
        x, (q, s) = self.inputs[i % len(self.inputs)], self.outputs[i % len(self.outputs)]
        args = (x, q, s, np.uint64(0), np.int32(self.threads // 8), np.int32(self.k // 128),
                np.int32(0), np.int32(self.tma), np.int32(self.m))  # fmt: skip
        return lambda: function((self.blocks, 1, 1), (self.threads, 1, 1), args)

    def pdl_call(self, function, i: int):
        """As its host launches it on SM90: the kUsePDL kernel with the PDL attribute."""
        import cupy

        x, (q, s) = self.inputs[i % len(self.inputs)], self.outputs[i % len(self.outputs)]
        pointers = [ctypes.c_void_p(a) for a in (x.data.ptr, q.data.ptr, s.data.ptr, 0)]
        sizes = [ctypes.c_int(a) for a in (self.threads // 8, self.k // 128, 0, self.tma, self.m)]
        launch = _hooks.function_launch(
            function, self.device, (self.blocks, 1, 1), (self.threads, 1, 1), pointers + sizes,
            pdl=True,
        )  # fmt: skip
        return lambda: launch(cupy.cuda.get_current_stream().ptr)

    def bytes_differing(self, function, expected) -> int:
        """Code bytes and scale words of its real rows that differ from the reference's."""
        m, k, tma = self.m, self.k, self.tma
        q_ref, s_ref = expected
        q, s = self.outputs[0]
        q.fill(0x7F)
        s.fill(0)
        self.call(function, 0)()
        q_bytes = q.get().reshape(-1)[: m * k] != q_ref.reshape(-1)[: m * k]
        words = s.get().reshape(-1, tma)[:, :m] != s_ref.reshape(-1, tma)[:, :m]
        return int(q_bytes.sum()) + int(words.sum())


def reference(geometry: Geometry, x_host) -> tuple:
    """The NumPy backend's q and scale storage of the default kernel's format."""
    q_ref = np.empty(geometry.q_storage, np.uint8)
    s_ref = np.empty(geometry.scale_storage, np.int32)
    quantize_into(x_host, geometry, "e4m3", "ue8m0", 1e-10, q_ref, s_ref)
    return q_ref, s_ref


def check_ours(launch, expected, x_dev) -> None:
    """Run ``launch`` once over poisoned outputs; every byte must equal the reference's."""
    import cupy

    q_ref, s_ref = expected
    q = cupy.full(q_ref.size, 0x7F, cupy.uint8)
    s = cupy.full(s_ref.size, 0x7F7F7F7F, cupy.int32)
    stream = cupy.cuda.get_current_stream().ptr
    _hooks.run_prepared(launch, x_dev.data.ptr, q.data.ptr, s.data.ptr, stream)
    if not (np.array_equal(q.get(), q_ref) and np.array_equal(s.get(), s_ref)):
        raise AssertionError("our launch differs from the reference")


def roofline_calls(roofline, inputs, outputs) -> list:
    """Launches of the roofline kernel over the inputs, one per buffer (at least CALLS)."""
    chunks = inputs[0].size * 2 // 32
    grid = (-(-chunks // ROOFLINE_THREADS), 1, 1)

    def call(i):
        x, (q, _) = inputs[i % len(inputs)], outputs[i % len(outputs)]
        return lambda: roofline(grid, (ROOFLINE_THREADS, 1, 1), (x, q, np.int64(chunks)))

    return [call(i) for i in range(max(len(inputs), CALLS))]


def launch_calls(launch, inputs, outputs) -> list:
    """Calls of a prepared launch of ours over the inputs, one per buffer (at least CALLS)."""
    import cupy

    def call(i):
        x, (q, s) = inputs[i % len(inputs)], outputs[i % len(outputs)]
        return lambda: _hooks.run_prepared(
            launch, x.data.ptr, q.data.ptr, s.data.ptr, cupy.cuda.get_current_stream().ptr
        )

    return [call(i) for i in range(max(len(inputs), CALLS))]
