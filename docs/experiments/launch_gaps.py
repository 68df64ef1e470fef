"""Experiment (issue 10): is ours slower than SGLang's v2 kernel inside its launches or between?

warp_timeline.py (run 11 of session 9, after step 22) measured a warp of ours taking as many
cycles as one of SGLang's kernel from entry to its last store, yet graph replay puts ours
0.03-0.15 us behind at M <= 512. This stamps %globaltimer (ns) in lane 0 of every warp, at
entry and after its last store is issued, appending (start, end) to a __device__ array; a CUDA
graph of 32 launches of one kernel over rotating buffers is replayed once, and the stamps are
split into launches (kernels of one stream do not overlap without PDL). For each kernel it
prints the median over launches of: the span from a launch's first warp start to its last
warp end, the spread of the warps' starts, and the gap from a launch's last warp end to the
next launch's first warp start; and the graph's time per launch.
Run from the repository root:
PYTHONPATH=$PWD python3 docs/experiments/launch_gaps.py SGLANG_V2_CUH
"""

import ctypes
import sys

import cupy
import flat_one_pass
import harness
import numpy as np
import sglang_same_run
import small_m_params

from fp8_group_quant import _jit, _launch, bench

EVENTS = 1 << 20
STAMPS = (
    f'extern "C" __device__ unsigned long long fgq_events[{2 * EVENTS}];\n'
    'extern "C" __device__ unsigned int fgq_count;\n'
    "__device__ __forceinline__ unsigned long long fgq_now() { unsigned long long t; "
    'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory"); return t; }\n'
    "#define FGQ_END(t0) { const unsigned long long fgq_t1 = fgq_now(); "
    "if ((threadIdx.x & 31) == 0) { const unsigned i = atomicAdd(&fgq_count, 1u); "
    f"if (i < {EVENTS}) {{ fgq_events[2 * i] = t0; fgq_events[2 * i + 1] = fgq_t1; }} }} }}\n"
)
OURS = [
    (
        "  if constexpr (kOnePass) {",
        "  if constexpr (kOnePass) {\n    const unsigned long long fgq_t0 = fgq_now();",
    ),
    ("stores & 2u, group);\n    return;", "stores & 2u, group);\n    FGQ_END(fgq_t0)\n    return;"),
]
SGL = [
    (
        "  device::PDLWaitPrimary<kUsePDL>();",
        "  device::PDLWaitPrimary<kUsePDL>(); const unsigned long long fgq_t0 = fgq_now();",
    ),
    ("            output_buf;\n", "            output_buf;\n        FGQ_END(fgq_t0)\n"),
]


def edited(text: str, edits) -> str:
    for old, new in edits:
        if text.count(old) != 1:
            raise LookupError(f"edit target not found once: {old[:60]}")
        text = text.replace(old, new)
    return STAMPS + text


def launches_of(events: np.ndarray, launches: int) -> list[np.ndarray]:
    """The warps' (start, end) split at the launches-1 widest gaps between sorted starts."""
    events = events[np.argsort(events[:, 0])]
    gaps = np.diff(events[:, 0])
    cuts = np.sort(np.argsort(gaps)[-(launches - 1) :]) + 1
    return np.split(events, cuts)


def summary(groups: list[np.ndarray]) -> str:
    spans = [g[:, 1].max() - g[:, 0].min() for g in groups]
    spreads = [g[:, 0].max() - g[:, 0].min() for g in groups]
    gaps = [b[:, 0].min() - a[:, 1].max() for a, b in zip(groups, groups[1:])]
    return (
        f"span {np.median(spans):7.0f}  start spread {np.median(spreads):6.0f}  "
        f"gap {np.median(gaps):7.0f} ns"
    )


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
    k = 7168
    for m in (1, 64, 512):
        inputs, outputs, _ = small_m_params.setup(m, k)
        ours = flat_one_pass.ours(m, k, inputs[0], 128, True, ours_function)
        blocks, threads = sglang_same_run.sglang_config(m, k)
        tma = outputs[0][1].size // -(-k // 512)
        calls = {"ours": harness.launch_calls(ours, inputs, outputs)}
        sgl_launches = [
            small_m_params.launcher(
                sgl_function,
                (blocks, 1, 1),
                (threads, 1, 1),
                [
                    ctypes.c_void_p(x.data.ptr),
                    ctypes.c_void_p(q.data.ptr),
                    ctypes.c_void_p(s.data.ptr),
                    ctypes.c_void_p(0),
                    ctypes.c_int(threads // 8),
                    ctypes.c_int(k // 128),
                    ctypes.c_int(0),
                    ctypes.c_int(tma),
                    ctypes.c_int(m),
                ],
            )  # fmt: skip
            for x, (q, s) in zip(inputs, outputs)
        ]
        calls["sgl"] = small_m_params.call_list(sgl_launches)
        for label, module in (("ours", ours_module), ("sgl", sgl_module)):
            count = cupy.ndarray((1,), cupy.uint32, module.get_global("fgq_count"))
            events = cupy.ndarray((2 * EVENTS,), cupy.uint64, module.get_global("fgq_events"))
            # the graph is captured with its warm-up calls first: count only its replays
            per_call = bench.interleaved_graph_times_us(cupy, [calls[label]], 3)[0]
            count.fill(0)
            cupy.cuda.runtime.deviceSynchronize()
            stream = cupy.cuda.Stream(non_blocking=True)
            with stream:
                stream.begin_capture()
                for call in calls[label]:
                    call()
                graph = stream.end_capture()
                graph.launch(stream)
                stream.synchronize()
            n = int(count.get()[0])
            stamps = events[: 2 * min(n, EVENTS)].get().reshape(-1, 2).astype(np.int64)
            groups = launches_of(stamps, len(calls[label]))
            print(f"{label:>5} M = {m:>4}: {per_call:5.2f} us a call in graph replay; "
                  f"{len(groups)} launches, {n} warps; {summary(groups)}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
