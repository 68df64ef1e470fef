"""Experiment (issue 10): does a kernel's code size cost time at each launch?

Ours is 528 SASS instructions (8.4 KB) on its hot path where SGLang's v2 kernel is 296 (4.7 KB),
and session 9 (step 22) measured 0.02-0.04 us for 2.5 KB of code that the roofline kernel's hot
path jumps over; session 10 (step 24) moved ours' rare paths out of line and measured no change
at M >= 64. Those two do not say whether code that is present but never reached costs anything
(a launch fetching or prefetching the kernel's instructions), or only code jumped over. This
times the roofline kernel's body (small_m_params.py's) with cold code that a branch never taken
reaches, graph against graph in one process, every kernel launched the same way:
- roof: none; jump_2k / jump_10k: 2.5 / 10 KB between the loads and the store, jumped over;
- tail_2k / tail_10k: 2.5 / 10 KB after the store (after the hot path's exit), never jumped over;
and SGLang's kernel and ours beside them as yardsticks (see sglang_same_run.py).
Run from the repository root: PYTHONPATH=$PWD python3 docs/experiments/code_size.py SGLANG_V2_CUH
[M ...]
"""

import sys

import cupy
import small_m_params

from fp8_group_quant import _launch, bench

BODY = r"""
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint4 a = __ldg(x + 2 * i), b = __ldg(x + 2 * i + 1);
  JUMP
  q[i] = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
  TAIL
"""
COLD_2K = "if (n < 0) COLD_BLOCK(__uint_as_float(a.x), (float*)q);"
COLD_10K = "if (n < 0) { " + " ".join(
    f"COLD_BLOCK(__uint_as_float(a.x) + {j}.0f, (float*)q + {j});" for j in range(4)
) + " }"  # fmt: skip
VARIANTS = {  # name: (between the loads and the store, after the store)
    "roof": ("", ""),
    "jump_2k": (COLD_2K, ""),
    "jump_10k": (COLD_10K, ""),
    "tail_2k": ("", COLD_2K),
    "tail_10k": ("", COLD_10K),
}


def source() -> str:
    text = small_m_params.COLD_BLOCK
    for name, (jump, tail) in VARIANTS.items():
        body = BODY.replace("JUMP", jump).replace("TAIL", tail)
        text += (
            f'extern "C" __global__ void {name}(const uint4* __restrict__ x, '
            f"uint4* __restrict__ q, long long n) {{{body}}}\n"
        )
    return text


def main() -> None:
    _launch.PDL = False
    module = cupy.RawModule(code=source(), options=("--std=c++17",))
    roofs = {name: module.get_function(name) for name in VARIANTS}
    sglang = {"sgl": small_m_params.sglang_functions(sys.argv[1])["sgl"]}
    header = None
    for k in (7168, 2048):
        for m in (1, 4, 16, 64, 256, 512) if len(sys.argv) < 3 else map(int, sys.argv[2:]):
            inputs, outputs, expected = small_m_params.setup(m, k)
            launches = small_m_params.kernels(m, k, roofs, sglang, {}, inputs, outputs)
            lists = {name: small_m_params.call_list(c) for name, c in launches.items()}
            for name in ("sgl", "ours"):
                small_m_params.check(name, lists[name], outputs, expected, m, k)
            times = bench.interleaved_graph_times_us(cupy, list(lists.values()), 11)
            if header is None:
                header = list(lists)
                print(f"{'M':>6} {'K':>5} " + " ".join(f"{c:>9}" for c in header), flush=True)
            print(f"{m:>6} {k:>5} " + " ".join(f"{t:>9.2f}" for t in times), flush=True)
            del inputs, outputs


if __name__ == "__main__":
    main()
