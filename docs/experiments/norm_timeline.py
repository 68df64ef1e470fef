"""Experiment (issue 13, session 15): when each RMSNorm block's row arrives, and what the
blocks of a one-wave grid do with their time (logs/norm-timeline-session15-h200.log).

At M = 512 (K = 7168, bf16, no residual) the RMSNorm kernel runs a block a row, one resident
wave of 512 blocks, four an SM. The guess first tested (run 1): every block asks for its row at
once, the memory system serves the requests interleaved, so each block's row arrives near the
end of the whole transfer and the SM's issue of the blocks' work follows the loads instead of
overlapping them; blocks that ask in turn would overlap them.

Variants of the kernel source, each a copy of a kernels/ with text edits, run in a process of
its own (FP8_GROUP_QUANT_KERNEL_DIR):
- stamps (every variant, at the first M): thread 0 of each block reads clock64 at its entry,
  after the row's first barrier (its sums are complete, so its row has arrived), once r is
  known and after its last store is issued, and %globaltimer and %smid; per SM, the blocks in
  order of entry, the median (p10-p90) over SMs of each time from the SM's first entry, in
  cycles;
- "base" (BASE_KERNELS, the kernels/ of another tree), "this tree", and "r in every warp"
  (this tree with every warp computing r, as before fused step 21) by default;
- with --variant=NAME and BASE_KERNELS at commit 3c94dd2's kernels (run 2): "stagger 1000"
  (a block of a one-wave grid sleeps 1000 cycles times blockIdx.x / SMs before its loads:
  blocks go to the SMs in turn, so that is about its place on its SM), "weight after sums"
  (no weight read before the row; one L1 prefetch a lane once its x has arrived) and "no
  weight (wrong)" (a diagnostic that reads no weight: w = 1, wrong values).
- with --variant=NAME on this tree (session 16, run 6,
  logs/norm-diagnostics-session16-h200.log), diagnostics with wrong values:
  "no normalisation (wrong)" (y = x), "no r chain (wrong)" (r = 1 after the first barrier),
  "no reduction (wrong)" (no barrier either) and "bare (wrong)" (all of those and no weight
  prefetch); and "r by broadcast" (right values: every warp folds the 32 warp slots read by
  broadcast and computes r, no second barrier);
- with --variant=NAME (session 17, runs 1-2, logs/norm-diagnostics-session17-h200.log): the
  weight's L1 prefetch "as before" (this tree has none since fused step 25; runs 1-2 ran on
  the tree before it, where "this tree" had it and "no prefetch" did not), "prefetch after
  barrier" (issued after the first barrier, while warp 0 computes r), "weight after barrier"
  (the words read into registers there) and, wrong values, "no reduction, no normalisation,
  prefetch as before (wrong)".
Timing: the library's RMSNorm without and with the residual against the roof of the same
traffic, CUDA-graph replays over rotating buffers, without PDL as `bench --fused`, each
variant's process in turn, two rounds (--rounds=N). Run from the repository root:

    BASE_KERNELS=OTHER/kernels PYTHONPATH=$PWD python3 docs/experiments/norm_timeline.py \
        [M ...] [--variant=NAME ...] [--no-stamps] [--rounds=N]
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
K = 7168

HEADER = """
#ifdef FGQ_STAMPS
extern "C" __device__ unsigned long long fgq_stamps[8 * 16384];
#define FGQ_STAMP(i, v) if (threadIdx.x == 0 && flat == blockIdx.x && blockIdx.x < 16384u) { \\
  unsigned long long c_; asm volatile("{ .reg .pred p; setp.ne.u32 p, %1, 0x9e3779b9; " \\
  "@p mov.u64 %0, %%clock64; @!p mov.u64 %0, 0; }" : "=l"(c_) : "r"((unsigned)(v)) : "memory"); \\
  fgq_stamps[8 * blockIdx.x + (i)] = c_; }
#define FGQ_GLOBAL(i) if (threadIdx.x == 0 && flat == blockIdx.x && blockIdx.x < 16384u) { \\
  unsigned long long g_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g_) :: "memory"); \\
  unsigned s_; asm volatile("mov.u32 %0, %%smid;" : "=r"(s_)); \\
  fgq_stamps[8 * blockIdx.x + (i)] = g_; fgq_stamps[8 * blockIdx.x + 6] = s_; }
#else
#define FGQ_STAMP(i, v)
#define FGQ_GLOBAL(i)
#endif
#ifdef FGQ_STAGGER
#define FGQ_WAIT() if (gridDim.x == total_rows) { const unsigned w_ = blockIdx.x / FGQ_SMS; \\
  if (w_ != 0u) { const long long t_ = clock64(); \\
  while (clock64() - t_ < static_cast<long long>(w_) * FGQ_STAGGER) __nanosleep(32); } }
#else
#define FGQ_WAIT()
#endif
"""

EDITS = [
    (
        "namespace fgq {\n\nconstexpr int kMaxThreads",
        HEADER + "namespace fgq {\n\nconstexpr int kMaxThreads",
    ),
    (
        "  wait_for_producer();  // PDL, as in quantize_groups\n  load_row(",
        "  wait_for_producer();  // PDL, as in quantize_groups\n  FGQ_STAMP(0, 1u) FGQ_GLOBAL(4)"
        " FGQ_WAIT()\n  load_row(",
    ),
    (
        "    __syncthreads();\n    if constexpr (kStash) {\n      // NOTES: the next row's x",
        "    __syncthreads();\n    FGQ_STAMP(1, __float_as_uint(lane_sums[0]))\n"
        "    if constexpr (kStash) {\n      // NOTES: the next row's x",
    ),
    (
        "    u8* q_batch = p.q + batch * p.q_batch_stride;\n",
        "    FGQ_STAMP(2, __float_as_uint(r))\n    u8* q_batch = p.q + batch * p.q_batch_stride;\n",
    ),
    (
        "    if (!more) break;\n    flat += gridDim.x;",
        "    FGQ_STAMP(3, 1u) FGQ_GLOBAL(5)\n    if (!more) break;\n    flat += gridDim.x;",
    ),
]


# the general kernel's weight: not read before the loop (the x loads alone in flight); one
# prefetch into L1 a lane once the lane's x has arrived (after its squares), so the read after r
# hits L1; the weight's Inf/NaN test on the words read there
_PROLOGUE = (
    "    u32 weight[kLaneWords];\n    load_lane<kIn, true>(weight_lane + j * second, weight);\n"
    "    weight_nonfinite[j] = In::max_magnitude(weight) >= In::kInf;\n"
    "    if constexpr (kStash) {\n"
)
_PROLOGUE_STASH_ONLY = (
    "    u32 weight[kLaneWords] = {};\n"
    "    if constexpr (kStash) load_lane<kIn, true>(weight_lane + j * second, weight);\n"
    "    weight_nonfinite[j] = kStash && In::max_magnitude(weight) >= In::kInf;\n"
    "    if constexpr (kStash) {\n"
)
_SUMS = "warp_sums[set][(t >> 5) + j * static_cast<int>(blockDim.x >> 5)] = warp_total;\n    }\n"
_LOOP_WEIGHT = "        load_lane<kIn, true>(weight_lane + j * second, weight);\n        normalize("
WEIGHT_AFTER_SUMS = [
    (_PROLOGUE, _PROLOGUE_STASH_ONLY),
    (
        _SUMS,
        _SUMS
        + "    if constexpr (!kStash) {\n#pragma unroll\n      for (int j = 0; j < kPer; ++j)\n"
        '        asm volatile("{ .reg .pred p; setp.ne.u32 p, %1, 0x9e3779b9; '
        '@p prefetch.global.L1 [%0]; }" :: "l"(weight_lane + j * second), '
        '"r"(__float_as_uint(lane_sums[0])) : "memory");\n'
        "    }\n",
    ),
    ("      const bool maybe_nan =", "      bool maybe_nan ="),
    (
        _LOOP_WEIGHT,
        "        load_lane<kIn, true>(weight_lane + j * second, weight);\n"
        "        maybe_nan = maybe_nan || In::max_magnitude(weight) >= In::kInf;\n"
        "        normalize(",
    ),
]
# a diagnostic, wrong values: the general kernel reads no weight (w = 1)
NO_WEIGHT = [
    (_PROLOGUE, _PROLOGUE_STASH_ONLY),
    (
        _LOOP_WEIGHT + "[&](int i) { return value_of<kIn>(weight, i); });",
        "        normalize([&](int i) { return 1.0f; });",
    ),
]


# diagnostics of session 16, wrong values: the general kernel's normalisation skipped (y = x,
# no weight read); r = 1 with no reduction after the first barrier (warp 0's fold, division,
# square root and reciprocal and the second barrier gone); and no reduction at all (r = 1, no
# barrier: each warp quantizes its lanes as they arrive)
_NORMALIZE = "          normalize_lane<kIn>(words[j], weight_of, r, y);\n"
NO_NORMALIZE = [
    (
        _NORMALIZE,
        "          for (int i = 0; i < kValues; ++i) y.v[i] = value_of<kIn>(words[j], i);\n",
    ),
    (
        _LOOP_WEIGHT + "[&](int i) { return value_of<kIn>(weight, i); });",
        "        normalize([&](int i) { return 1.0f; });",
    ),
]
_R_WARP = "    float r = 0.0f;\n    if (t < 32) {"
_R_READ = "    __syncthreads();\n    r = row_r[set];\n"
NO_R_CHAIN = [(_R_WARP, "    float r = 1.0f;\n    if (false) {"), (_R_READ, "")]
NO_REDUCTION = [
    *NO_R_CHAIN,
    ("    __syncthreads();\n    FGQ_STAMP(1, __float_as_uint(lane_sums[0]))\n", ""),
]

# and all three: no reduction, no normalisation, no weight prefetch (a quantizer of x's rows
# in this kernel's grid; since fused step 25 this tree has no prefetch)
BARE = [*NO_REDUCTION, *NO_NORMALIZE]

# a shorter chain to r (session 16, not yet run): every warp reads the 32 warp slots with eight
# broadcast 16-byte shared loads, folds them with adds in the defined order (fold_in_half, as
# warp_fold's shuffles would) and computes r itself: no shuffles, no second barrier, no round
# trip through row_r; the slots no warp writes are zeroed once, before the first row
R_BY_BROADCAST = [
    ("  __shared__ float warp_sums[2][32];", "  __shared__ __align__(16) float warp_sums[2][32];"),
    (
        "  const bool warp_slot = (t & 31) < kPer * static_cast<int>(blockDim.x >> 5);\n",
        "  const bool warp_slot = (t & 31) < kPer * static_cast<int>(blockDim.x >> 5);\n"
        "  if (t < 32 && !warp_slot) warp_sums[0][t] = warp_sums[1][t] = 0.0f;\n",
    ),
    (
        _R_WARP + "\n"
        "      const float total = warp_fold(warp_slot ? warp_sums[set][t & 31] : 0.0f);\n"
        "      const float mean = div_rn(total, static_cast<float>(lanes * kValues));\n"
        "      r = div_rn(1.0f, sqrt_rn(add_rn(mean, p.eps_norm)));\n"
        "      if (t == 0) row_r[set] = r;\n"
        "    }\n" + _R_READ,
        "    float r;\n    {\n      float slots[32];\n"
        "      const float4* v = reinterpret_cast<const float4*>(warp_sums[set]);\n"
        "#pragma unroll\n      for (int c = 0; c < 8; ++c) {\n"
        "        const float4 f = v[c];\n"
        "        slots[4 * c] = f.x, slots[4 * c + 1] = f.y, slots[4 * c + 2] = f.z,"
        " slots[4 * c + 3] = f.w;\n      }\n"
        "      fold_in_half<16>(slots);\n"
        "      const float mean = div_rn(slots[0], static_cast<float>(lanes * kValues));\n"
        "      r = div_rn(1.0f, sqrt_rn(add_rn(mean, p.eps_norm)));\n    }\n",
    ),
]


# session 17, where the weight's cost lies (bare above ran 5.03 us against 5.75 with no
# reduction, run 1): the weight's L1 prefetch a lane as fused steps 21-24 issued it (this tree
# issues none since step 25), or issued after the first barrier (while warp 0 computes r), or
# its words read into registers there
_PREFETCH = 'asm volatile("prefetch.global.L1 [%0];" :: "l"(weight_lane + j * second));'
_NO_WEIGHT_HERE = "    if constexpr (!kStash && kFloat) continue;\n"
PREFETCH_AS_BEFORE = [
    (
        _NO_WEIGHT_HERE,
        f"    if constexpr (!kStash && kFloat) {{\n      {_PREFETCH}\n      continue;\n    }}\n",
    )
]
_BARRIER = "    __syncthreads();\n    FGQ_STAMP(1, __float_as_uint(lane_sums[0]))\n"
PREFETCH_AFTER_BARRIER = [
    (
        _BARRIER,
        _BARRIER + "    if constexpr (!kStash && kFloat) {\n#pragma unroll\n"
        f"      for (int j = 0; j < kPer; ++j) {_PREFETCH}\n    }}\n",
    ),
]
WEIGHT_AFTER_BARRIER = [
    (
        _BARRIER,
        _BARRIER + "    u32 weights[kPer][kLaneWords];\n"
        "    if constexpr (!kStash) {\n#pragma unroll\n"
        "      for (int j = 0; j < kPer; ++j) load_lane<kIn, true>(weight_lane + j * second,"
        " weights[j]);\n    }\n",
    ),
    (
        "        u32 weight[kLaneWords];\n"
        "        load_lane<kIn, true>(weight_lane + j * second, weight);\n        normalize(",
        "        u32 (&weight)[kLaneWords] = weights[j];\n        normalize(",
    ),
]

# the kernel before fused step 21: every warp computes r (the edit leaves every thread on the
# path warp 0 takes, and drops the second barrier)
R_PER_WARP = [
    ("    float r = 0.0f;\n    if (t < 32) {", "    float r = 0.0f;\n    if (true) {"),
    ("    __syncthreads();\n    r = row_r[set];\n", ""),
]


def variants(sms: int) -> dict:
    """name: (kernels directory, defines, edits) of the kernel variants compared; BASE_KERNELS
    (if set) names the kernels/ of a tree to compare against"""
    base = os.environ.get("BASE_KERNELS")
    return {
        **({"base": (Path(base), {}, [])} if base else {}),
        "this tree": (ROOT / "kernels", {}, []),
        "r in every warp": (ROOT / "kernels", {}, R_PER_WARP),
        # session 16, chosen with --variant=NAME: where this tree's time goes
        "no normalisation (wrong)": (ROOT / "kernels", {}, NO_NORMALIZE),
        "no r chain (wrong)": (ROOT / "kernels", {}, NO_R_CHAIN),
        "no reduction (wrong)": (ROOT / "kernels", {}, NO_REDUCTION),
        "bare (wrong)": (ROOT / "kernels", {}, BARE),
        "r by broadcast": (ROOT / "kernels", {}, R_BY_BROADCAST),
        # session 17
        "prefetch as before": (ROOT / "kernels", {}, PREFETCH_AS_BEFORE),
        "prefetch after barrier": (ROOT / "kernels", {}, PREFETCH_AFTER_BARRIER),
        "weight after barrier": (ROOT / "kernels", {}, WEIGHT_AFTER_BARRIER),
        "no reduction, no normalisation, prefetch as before (wrong)": (
            ROOT / "kernels",
            {},
            [*NO_REDUCTION, *NO_NORMALIZE, *PREFETCH_AS_BEFORE],
        ),
        # run 2 (the kernel of commit 3c94dd2 as BASE_KERNELS), chosen with --variant=NAME
        **(
            {
                "stagger 1000": (Path(base), {"FGQ_STAGGER": 1000, "FGQ_SMS": sms}, []),
                "weight after sums": (Path(base), {}, WEIGHT_AFTER_SUMS),
                "no weight (wrong)": (Path(base), {}, NO_WEIGHT),
            }
            if base
            else {}
        ),
    }


DEFAULT_VARIANTS = ("base", "this tree", "r in every warp")


def make_variant(directory: Path, source: Path, defines: dict, edits=()) -> Path:
    """A copy of ``source`` (a kernels/) in ``directory`` with the edits and ``defines``."""
    shutil.copytree(source, directory)
    path = directory / "quantize.cu"
    text = path.read_text()
    for old, new in [*EDITS, *edits]:
        if text.count(old) != 1:
            raise AssertionError(f"the kernel source changed: {old[:40]!r}")
        text = text.replace(old, new)
    lines = "".join(f"#define {name} {value}\n" for name, value in defines.items())
    path.write_text(lines + text)
    return directory


def _inputs(m: int, residual: bool = False):
    import cupy
    import ml_dtypes
    import numpy as np

    from fp8_group_quant import api, bench

    rng = np.random.default_rng(m)
    host = (rng.standard_normal((m, K), dtype=np.float32) * 3).astype(ml_dtypes.bfloat16)
    buffers = max(2, min(32, -(-bench.ROTATE_BYTES // (host.nbytes * (2 if residual else 1)))))
    xs = [cupy.asarray(host) for _ in range(buffers)]
    rs = [cupy.asarray(host) for _ in range(buffers)] if residual else [None] * buffers
    weight = cupy.asarray((rng.random(K, dtype=np.float32) + 0.5).astype(ml_dtypes.bfloat16))
    options = dict(scale="ue8m0", layout="packed", norm=(weight, 1e-6))
    outs = [api.quantize(x, 128, **options) for x in xs]
    return xs, rs, outs, options


def child_times(m_values) -> dict:
    """us per call of the library's RMSNorm (without and with the residual) and of the roof
    of the same traffic at each M, without PDL."""
    import cupy
    import numpy as np

    from fp8_group_quant import _jit, _launch, api, bench

    _launch.PDL = False
    device = cupy.cuda.runtime.getDevice()
    roofs = {r: _jit.get_function("roofline.cu", f"fgq::roofline_{'residual' if r else 'copy'}",
                                  device) for r in (False, True)}  # fmt: skip
    times = {}
    for m in m_values:
        for residual in (False, True):
            xs, rs, outs, options = _inputs(m, residual)
            chunks = m * K // 16
            grid = (-(-chunks // bench.ROOFLINE_THREADS), 1, 1)
            calls = max(len(xs), 32)
            # the roof writes x ^ residual (Inf and NaN in most groups) into residuals of its
            # own; until session 23 it shared rs, and the fused calls replayed in turn read NaNs
            roof_rs = [r.copy() for r in rs] if residual else rs

            def roofline(i, xs=xs, rs=roof_rs, outs=outs, residual=residual, grid=grid,
                         chunks=chunks):  # fmt: skip
                x, r, q = xs[i % len(xs)], rs[i % len(xs)], outs[i % len(xs)][0]
                args = (x, r, q, np.int64(chunks)) if residual else (x, q, np.int64(chunks))
                return lambda: roofs[residual](grid, (bench.ROOFLINE_THREADS, 1, 1), args)

            def fused(i, xs=xs, rs=rs, outs=outs, options=options):
                x, r, (q, s) = xs[i % len(xs)], rs[i % len(xs)], outs[i % len(xs)]
                return lambda: api.quantize(x, 128, **options, residual=r, out=q, scale_out=s)

            lists = [[make(i) for i in range(calls)] for make in (roofline, fused)]
            times[f"{m}{' +res' if residual else ''}"] = bench.interleaved_graph_times_us(
                cupy, lists, 11
            )
    return times


def child_stamps(m: int) -> dict:
    """Per SM, each block's stamps (cycles from the SM's first entry), in order of entry."""
    import cupy
    import numpy as np

    from fp8_group_quant import _jit, _launch, api

    _launch.PDL = False
    xs, _, outs, options = _inputs(m)

    def launch(i):
        q, s = outs[i % len(xs)]
        api.quantize(xs[i % len(xs)], 128, **options, out=q, scale_out=s)

    launch(0)  # loads the module
    stamps = None
    for module in _jit._modules:
        try:
            pointer = module.get_global("fgq_stamps")
        except Exception:  # noqa: BLE001 - modules without the symbol
            continue
        stamps = cupy.ndarray((16384, 8), dtype=np.uint64, memptr=pointer)
    assert stamps is not None, "no module holds fgq_stamps"
    for i in (1, 2):  # the last launch's stamps stay; blocks that did not stamp hold zeros
        stamps.fill(0)
        launch(i)
    cupy.cuda.runtime.deviceSynchronize()
    rows = stamps.get().astype(np.int64)
    blocks = int(np.count_nonzero(rows[:, 4]))
    assert np.all(rows[:blocks, 4] != 0), "the stamped blocks are not the first ones"
    per_sm: dict[int, list] = {}
    for b in range(blocks):
        per_sm.setdefault(int(rows[b, 6]), []).append(b)
    places: dict[int, list] = {}
    mapping = {}
    for sm, members in per_sm.items():
        members.sort(key=lambda b: rows[b, 0])
        first = rows[members[0], 0]
        if sm < 4:
            mapping[sm] = members
        for place, b in enumerate(members):
            places.setdefault(place, []).append([int(rows[b, c] - first) for c in range(4)])
    summary = {}
    for place, values in sorted(places.items()):
        cols = list(zip(*values))
        summary[place] = [
            (int(statistics.median(c)), int(np.percentile(c, 10)), int(np.percentile(c, 90)))
            for c in cols
        ] + [len(values)]
    span = int(rows[:blocks, 5].max() - rows[:blocks, 4].min())
    return {"places": summary, "mapping": mapping, "span_ns": span}


def run_child(kernels: Path, *args: str) -> dict:
    env = dict(os.environ, FP8_GROUP_QUANT_KERNEL_DIR=str(kernels))
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-4000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_once(m: int) -> dict:
    """One launch of the library's RMSNorm and one of the roof, for a profiler."""
    import cupy
    import numpy as np

    from fp8_group_quant import _jit, _launch, api, bench

    _launch.PDL = False
    xs, _, outs, options = _inputs(m)
    roof = _jit.get_function("roofline.cu", "fgq::roofline_copy", cupy.cuda.runtime.getDevice())
    chunks = m * K // 16
    q, s = outs[1]
    api.quantize(xs[1], 128, **options, out=q, scale_out=s)
    roof((-(-chunks // bench.ROOFLINE_THREADS), 1, 1), (bench.ROOFLINE_THREADS, 1, 1),
         (xs[0], outs[0][0], np.int64(chunks)))  # fmt: skip
    cupy.cuda.runtime.deviceSynchronize()
    return {}


def main(m_values, names, stamps: bool = True, rounds: int = 2) -> None:
    import cupy

    properties = cupy.cuda.runtime.getDeviceProperties(0)
    sms, clock_ghz = properties["multiProcessorCount"], properties["clockRate"] / 1e6
    chosen = {n: v for n, v in variants(sms).items() if n in (names or DEFAULT_VARIANTS)}
    with tempfile.TemporaryDirectory() as tmp:
        made = {}
        for i, (name, (source, defines, edits)) in enumerate(chosen.items()):
            made[name] = make_variant(Path(tmp) / f"v{i}", source, defines, edits)
            if not stamps:
                continue
            stamped = make_variant(Path(tmp) / f"s{i}", source, {**defines, "FGQ_STAMPS": 1}, edits)
            m = m_values[0]
            got = run_child(stamped, "stamps", str(m))
            print(f"# {name}, M = {m}: stamps (cycles from the SM's first entry; median p10-p90 "
                  f"over SMs; nominal clock {clock_ghz:.2f} GHz); first entry to last store "
                  f"{got['span_ns']} ns by %globaltimer")  # fmt: skip
            print(f"{'place':>5} {'SMs':>4} {'entry':>18} {'row arrived':>18} {'r known':>18} "
                  f"{'last store':>18}")  # fmt: skip
            for place, cells in got["places"].items():
                text = " ".join(f"{c[0]:>6} {c[1]:>5}-{c[2]:<5}" for c in cells[:4])
                print(f"{place:>5} {cells[4]:>4} {text}")
            print("# blocks of SMs 0-3 in order of entry:", got["mapping"], flush=True)
        heading = "# us per call without PDL (x roof); the variants' processes in turn, rounds:"
        print(heading, rounds)
        print(f"{'M':>9} {'roof':>7} " + " ".join(f"{n:>20}" for n in made))
        results = {n: [] for n in made}
        for _ in range(rounds):
            for name, kernels in made.items():
                results[name].append(run_child(kernels, "times", *map(str, m_values)))
        for key in results[next(iter(made))][0]:
            for r in range(rounds):
                roof = results[next(iter(made))][r][key][0]
                cells = " ".join(
                    f"{results[n][r][key][1]:>12.2f} ({results[n][r][key][1] / roof:.2f})"
                    for n in made
                )
                print(f"{key:>9} {roof:>7.2f} {cells}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        kind, values = sys.argv[2], [int(a) for a in sys.argv[3:]]
        children = {"stamps": lambda: child_stamps(values[0]), "times": lambda: child_times(values),
                    "once": lambda: child_once(values[0])}  # fmt: skip
        print(json.dumps(children[kind]()))
    else:
        args = sys.argv[1:]
        names = [a.split("=", 1)[1] for a in args if a.startswith("--variant=")]
        m_values = [int(a) for a in args if not a.startswith("--")] or [512, 384]
        rounds = [int(a.split("=", 1)[1]) for a in args if a.startswith("--rounds=")] or [2]
        main(m_values, names, "--no-stamps" not in args, rounds[0])
