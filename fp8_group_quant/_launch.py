"""Kernel key, grid and block arithmetic, and the Params struct of kernels/quantize.cu."""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import re
import threading
from dataclasses import dataclass
from functools import cache

from . import _jit
from ._layout import SCALE_LAYOUTS, Geometry, supported_combinations
from ._spec import (
    GROUP_SIZES,
    INPUT_MODES,
    INPUT_TYPES,
    OUTPUT_FORMATS,
    SCALE_FORMATS,
    UE8M0_FLOOR,
)

SOURCE = "quantize.cu"
WARP = 32
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535
MAX_GRID_Z = 65535
MAX_TILE_ROWS = 8  # eight float scales fill a 32-byte sector
# Grids of at most this many resident waves take the one-pass path; unset, one_pass_wave_limit()
# picks by occupancy (docs/perf.md steps 14 and 17). A tuning knob; the tests force each path.
_MAX_WAVES_ENV = os.environ.get("FP8_GROUP_QUANT_ONE_PASS_MAX_WAVES")
ONE_PASS_MAX_WAVES = float(_MAX_WAVES_ENV) if _MAX_WAVES_ENV else None
# Threads per block of the one-pass grid; unset, one_pass_threads() picks. A tuning knob.
ONE_PASS_THREADS = int(os.environ.get("FP8_GROUP_QUANT_ONE_PASS_THREADS", "0"))
# Resident waves of blocks the row loop's grid holds; each block walks rows with a stride of the
# grid. Unset: waves_for() picks by occupancy. 0 launches one block column per row tile. A tuning
# knob, measured in docs/perf.md.
_WAVES_ENV = os.environ.get("FP8_GROUP_QUANT_WAVES")
WAVES = float(_WAVES_ENV) if _WAVES_ENV else None
# Resident waves of blocks the fused RMSNorm's grid holds (each block walks rows with a stride of
# the grid, loading the next row while it works on one); 0 launches a block per row. Unset:
# norm_blocks() picks. A tuning knob, measured in docs/perf.md (fused step 7).
_NORM_WAVES_ENV = os.environ.get("FP8_GROUP_QUANT_NORM_WAVES")
NORM_WAVES = float(_NORM_WAVES_ENV) if _NORM_WAVES_ENV else None
# 32-byte lanes a thread of the fused RMSNorm kernel (1 or 2); unset: norm_lanes() picks. A
# tuning knob, measured in docs/perf.md (fused step 13).
_NORM_LANES_ENV = os.environ.get("FP8_GROUP_QUANT_NORM_LANES")
NORM_LANES = int(_NORM_LANES_ENV) if _NORM_LANES_ENV in ("1", "2") else None
# Whether a walking RMSNorm grid may take the weight-stashing kernel (norm_stashes): "0" never;
# unset or "1": where norm_stashes() allows it. A tuning knob, measured in docs/perf.md.
NORM_STASH = os.environ.get("FP8_GROUP_QUANT_NORM_STASH", "1") != "0"
# Programmatic Dependent Launch on devices that have it (SM90 and newer); FP8_GROUP_QUANT_PDL=0
# turns it off. Read when a plan is made.
PDL = os.environ.get("FP8_GROUP_QUANT_PDL", "1") != "0"


# facts the kernel sources define, read from them -----------------------------------------------


@cache
def cpp_constant(name: str) -> int:
    """The value of ``constexpr int name = value;`` in the kernel sources."""
    pattern = re.compile(rf"^\s*constexpr int {name} = (\d+);", re.MULTILINE)
    for path in sorted(_jit.kernel_dir().glob("*.cu*")):
        match = pattern.search(path.read_text())
        if match:
            return int(match.group(1))
    raise LookupError(f"constexpr int {name} is not defined in {_jit.kernel_dir()}")


def lane_bytes() -> int:
    """Input bytes one lane holds (kLaneWords 32-bit words)."""
    return 4 * cpp_constant("kLaneWords")


def max_threads_per_block() -> int:
    return cpp_constant("kMaxThreads")


def max_experts() -> int:
    """The most batches (experts) the masked layout takes: its kernel's shared scan."""
    return cpp_constant("kMaxExperts")


_CTYPES = {
    "const void*": ctypes.c_uint64,
    "u8*": ctypes.c_uint64,
    "i64": ctypes.c_int64,
    "u32": ctypes.c_uint32,
    "u8": ctypes.c_uint8,
    "int": ctypes.c_int32,
    "float": ctypes.c_float,
}
_FIELD = re.compile(r"^\s*(const void\*|u8\*|u8|i64|u32|int|float)\s+(\w+);", re.MULTILINE)


@cache
def params_type() -> type[ctypes.Structure]:
    """The ctypes mirror of ``struct Params`` in kernels/params.cuh, read from that file."""
    text = (_jit.kernel_dir() / "params.cuh").read_text()
    body = re.search(r"struct Params \{(.*?)\n\};", text, re.DOTALL)
    if body is None:
        raise LookupError("struct Params not found in params.cuh")
    fields = [(name, _CTYPES[kind]) for kind, name in _FIELD.findall(body.group(1))]
    return type("Params", (ctypes.Structure,), {"_fields_": fields})


# the kernel key ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelKey:
    """Everything that changes the binary. Shapes are launch arguments, not part of the key."""

    input_dtype: str  # a key of _spec.INPUT_TYPES
    group_size: int
    output: str  # a key of _spec.OUTPUT_FORMATS
    scale: str  # a key of _spec.SCALE_FORMATS
    layout_trait: str  # a ScaleLayout.kernel_trait: the address function
    vec16: bool  # input base and strides 16-byte aligned: vector loads
    one_pass: bool = False  # one tile per block, no loop (small grids)
    activation: str | None = None  # a key of _spec.INPUT_MODES: how x becomes the values
    masked: bool = False  # the masked MoE layout's persistent kernel (aligned, one pass)
    norm: bool = False  # the fused (add-)RMSNorm kernel: one block a row (aligned)
    norm_lanes: int = 1  # the RMSNorm kernel's 32-byte lanes a thread (1 or 2; norm_lanes())
    norm_stash: bool = False  # the walking RMSNorm kernel with the weight in shared memory
    blocks_per_sm: int = 0  # quantize_groups' kBlocks: 256-thread blocks it fits an SM, 0: its rule
    flat: bool = False  # one pass, plain input, contiguous rows: slot s at x + s * G (flat_slots)

    @property
    def lanes_per_group(self) -> int:
        return self.group_size * INPUT_TYPES[self.input_dtype].itemsize // lane_bytes()

    @property
    def name_expression(self) -> str:
        if self.norm:
            return (
                f"fgq::quantize_norm<{INPUT_TYPES[self.input_dtype].kernel_trait}, "
                f"{self.group_size}, {OUTPUT_FORMATS[self.output].kernel_trait}, "
                f"{SCALE_FORMATS[self.scale].kernel_trait}, {self.layout_trait}, "
                f"{self.norm_lanes}, {'true' if self.norm_stash else 'false'}>"
            )
        if self.masked:
            return (
                f"fgq::quantize_masked<{INPUT_TYPES[self.input_dtype].kernel_trait}, "
                f"{self.group_size}, {OUTPUT_FORMATS[self.output].kernel_trait}, "
                f"{SCALE_FORMATS[self.scale].kernel_trait}, {self.layout_trait}, "
                f"{INPUT_MODES[self.activation].kernel_trait}>"
            )
        return (
            f"fgq::quantize_groups<{INPUT_TYPES[self.input_dtype].kernel_trait}, "
            f"{self.group_size}, {OUTPUT_FORMATS[self.output].kernel_trait}, "
            f"{SCALE_FORMATS[self.scale].kernel_trait}, {self.layout_trait}, "
            f"{'true' if self.vec16 else 'false'}, {'true' if self.one_pass else 'false'}, "
            f"{INPUT_MODES[self.activation].kernel_trait}"
            f"{f', {self.blocks_per_sm}' if self.blocks_per_sm or self.flat else ''}"
            f"{', true' if self.flat else ''}>"
        )


def all_kernel_keys() -> list[KernelKey]:
    """Every instantiation the library can launch."""
    # NOTES: the fused modes need aligned input (make_request refuses the rest) and run one
    # pass at every size (prepare), so they add one instantiation per combination, not four;
    # the RMSNorm kernel takes the residual as a runtime pointer, so one instantiation serves
    # the norm with and without it (two: one and two lanes a thread), and 16-bit input has a
    # third, the walking kernel with the weight in shared memory (norm_stashes). The one-pass
    # bfloat16 SiLU kernels of UE8M0 scales have a second, at six blocks an SM (has_six_blocks).
    # Layouts that share an address function share a binary.
    combinations = list(
        dict.fromkeys(
            (i, g, o, s, SCALE_LAYOUTS[layout].kernel_trait)
            for i in INPUT_TYPES
            for g in GROUP_SIZES
            for o, s, layout in supported_combinations()
        )
    )
    keys = [
        KernelKey(*combination, v, one_pass, activation, masked)
        for combination in combinations
        for activation in INPUT_MODES
        for masked in (False, True)
        for v in ((True, False) if activation is None and not masked else (True,))
        for one_pass in ((True, False) if activation is None and not masked else (True,))
    ]
    six = [dataclasses.replace(k, blocks_per_sm=SILU_SIX_BLOCKS) for k in keys if has_six_blocks(k)]
    flat = [dataclasses.replace(k, flat=True) for k in keys if has_flat(k)]
    return (
        keys
        + six
        + flat
        + [
            KernelKey(*combination, True, True, norm=True, norm_lanes=lanes, norm_stash=stash)
            for combination in combinations
            for lanes in NORM_LANE_CHOICES
            for stash in (False, True)
            if not stash or norm_stashes(combination[0], lanes, residual=False)
        ]
    )


# The one-pass bfloat16 SiLU-and-multiply kernels' second instantiation: fitted to six resident
# 256-thread blocks an SM (40 registers) instead of five (48), taken by one-pass grids of more
# than SILU_SIX_BLOCKS_WAVES resident waves of the first (counted at its residency). At N =
# 7168 it measured 0.45-0.75 us faster at M = 1024 (3584 blocks, 2.7 waves of 10 an SM) and
# 0.6-0.7 at 2048, 0.2 at 896 (2.4 waves), but 0.4-0.55 slower at 512 (1.36 waves) and 0.4 at
# 768 (2.04) (docs/perf.md, fused step 29). FP8_GROUP_QUANT_SILU_SIX_BLOCKS_WAVES overrides: a
# tuning knob (0: every grid takes it; inf: none).
SILU_SIX_BLOCKS = 6
_SIX_BLOCKS_ENV = os.environ.get("FP8_GROUP_QUANT_SILU_SIX_BLOCKS_WAVES")
SILU_SIX_BLOCKS_WAVES = float(_SIX_BLOCKS_ENV) if _SIX_BLOCKS_ENV else 2.2


def has_six_blocks(key: KernelKey) -> bool:
    """Whether ``key`` has the six-block instantiation: the one-pass bfloat16 SiLU-and-multiply
    kernels with UE8M0 scales, whose 40 registers spill nothing (sm_90, NVRTC 13), but of the
    blocked layout (8 bytes spilled); float32 scales need 47 registers."""
    return (
        key.input_dtype == "bfloat16"
        and key.activation == "silu_mul"
        and key.vec16
        and key.one_pass
        and not key.masked
        and not key.norm
        and key.scale == "ue8m0"
        and key.layout_trait != "fgq::kBlockedExponents"
        and key.blocks_per_sm == 0
    )


def has_flat(key: KernelKey) -> bool:
    """Whether ``key`` has the instantiation whose load is linear in the group slot (flat_slots):
    the one-pass kernels of plain, 16-byte aligned input."""
    return (
        key.one_pass
        and key.vec16
        and key.activation is None
        and not key.masked
        and not key.norm
        and key.blocks_per_sm == 0
        and not key.flat
    )


def nvfp4_names(input_dtype: str) -> tuple[str, str]:
    """The NVFP4 kernels of one input type: (quantize_nvfp4, nvfp4_amax) (fp8_group_quant.nvfp4)."""
    trait = INPUT_TYPES[input_dtype].kernel_trait
    return f"fgq::quantize_nvfp4<{trait}>", f"fgq::nvfp4_amax<{trait}>"


def all_name_expressions() -> list[str]:
    """Every instantiation of quantize.cu: the kernel keys', then NVFP4's."""
    names = [key.name_expression for key in all_kernel_keys()]
    return names + [name for input_dtype in INPUT_TYPES for name in nvfp4_names(input_dtype)]


# the default kernel as a contiguous input takes it (flat), and its other two paths: one pass
# through x's strides, the row loop
DEFAULT_KEY = KernelKey(
    "bfloat16", 128, "e4m3", "ue8m0", "fgq::kPackedExponents", True, True, flat=True
)
DEFAULT_KEYS = (
    DEFAULT_KEY,
    dataclasses.replace(DEFAULT_KEY, flat=False),
    dataclasses.replace(DEFAULT_KEY, flat=False, one_pass=False),
)


# grid and block ---------------------------------------------------------------------------------


def tile_rows(layout, lanes: int) -> int:
    """Consecutive rows a block covers: one, or for the MN-major float layouts enough that a
    warp stores a contiguous run of scales (eight: one 32-byte sector) rather than one
    scattered word per group. A power of two; a warp never spans more than one group column.

    NOTES: run 6 had G = 32 col / col_tma at 1.24-1.46x the baseline's time per byte against
    1.01-1.03x for the row layouts: four times the groups, each a separate 4-byte store.
    """
    layout = SCALE_LAYOUTS[layout] if isinstance(layout, str) else layout
    if not layout.mn_major or layout.scales_per_word > 1:
        return 1
    return max(1, min(MAX_TILE_ROWS, WARP // lanes))


def block_shape(groups: int, lanes: int, rows: int = 1) -> tuple[int, int]:
    """(threads per block, blocks per row tile) for tiles of ``rows`` rows of ``groups`` groups.

    NOTES: a row tile is split into the fewest blocks of at most kMaxThreads threads, groups
    spread evenly (ceil division) and rounded up to whole warps; the kernel drops the surplus
    groups of the last block by a bounds check.
    """
    blocks = -(-groups * lanes * rows // max_threads_per_block())
    groups_per_block = -(-groups // blocks)
    groups_per_warp = max(1, WARP // (lanes * rows))
    groups_per_block = -(-groups_per_block // groups_per_warp) * groups_per_warp
    return groups_per_block * lanes * rows, -(-groups // groups_per_block)


def divisor(d: int) -> tuple[int, int]:
    """(magic, shift) with which the kernel's divide_u31 computes n // d for every n < 2**31.

    NOTES: magic = ceil(2**shift / d), shift = 31 + ceil(log2 d) (Granlund and Montgomery,
    theorem 4.2 with N = 31): magic * d - 2**shift < d <= 2**ceil(log2 d), so the product's top
    bits are the exact quotient; magic < 2**32 for every d >= 1.
    """
    if not 1 <= d < 2**31:
        raise ValueError(f"divisor {d} outside [1, 2**31)")
    shift = 31 + (d - 1).bit_length()
    return -(-(1 << shift) // d), shift


def one_pass_slots(geometry: Geometry, tile: int) -> int:
    """Group slots of the one-pass grid: every group of every row tile of every batch."""
    return geometry.batches * -(-geometry.rows // tile) * tile * geometry.groups


def one_pass_threads(slots: int, lanes: int) -> int:
    """Threads per block of the one-pass grid (whole warps, at most kMaxThreads).

    NOTES: 128 measured best or within 1% of best at K = 2048, 2688 and 7168 and M = 1-16384
    (docs/perf.md step 17); 64 lost up to 1.7x at large M, 256 up to 2% there. The fused
    SiLU-and-multiply, whose blocks each copy a table into shared memory, measured the same
    with 256 (within 1% at M >= 64, 0.15 us slower at M = 1: fused step 5). Any whole number
    of warps works: the float16 and float32 SiLU's blocks fill their 64-entry exponential table
    in a loop over the block's threads (ExpTable::fill in kernels/activation.cuh; a GPU test runs
    blocks of 32, 64 and 96 threads on poisoned shared memory)."""
    if ONE_PASS_THREADS:
        if ONE_PASS_THREADS % WARP or not WARP <= ONE_PASS_THREADS <= max_threads_per_block():
            raise ValueError(
                f"FP8_GROUP_QUANT_ONE_PASS_THREADS={ONE_PASS_THREADS}: expected a multiple of "
                f"{WARP} from {WARP} up to {max_threads_per_block()}"
            )
        return ONE_PASS_THREADS
    return 128


def one_pass_wave_limit(blocks_per_sm: int, threads: int) -> float:
    """The most resident waves a one-pass grid may have before the row loop takes over.

    NOTES: the instantiations whose one-pass kernel fits 40 registers (six blocks of 256
    threads per SM: every vector-load one since session 7, but exact float32 scales of 16-bit
    input, see min_blocks_per_sm in quantize.cu) ran faster in one pass at every size measured,
    up to 36 waves (M = 16384, K = 7168: 82.8 us against 85.7 for the loop, docs/perf.md steps
    17 and 19). The others hid latency worse without the loop's prefetch (step 14: up to 1.23x
    at 25 waves; step 19: float32 scales 1.09-1.15x against the loop's 1.07), so they keep 16.
    """
    if ONE_PASS_MAX_WAVES is not None:
        return ONE_PASS_MAX_WAVES
    return math.inf if blocks_per_sm * threads >= 6 * max_threads_per_block() else 16.0


def grid_limits_error(geometry: Geometry, itemsize: int, one_pass_only=None) -> str | None:
    """Why ``geometry`` cannot be launched with ``itemsize``-byte input, or None.
    ``one_pass_only`` names the option (an activation, masked_m) that has one-pass kernels
    only, which number every group slot in 31 bits."""
    total_rows = geometry.batches * geometry.grid_rows
    if one_pass_only is not None:
        lanes = geometry.group_size * itemsize // lane_bytes()
        slots = one_pass_slots(geometry, tile_rows(geometry.layout, lanes))
        if slots >= 2**31:
            return f"x: {one_pass_only} takes at most 2**31 - 1 group slots, got {slots}"
    if total_rows >= 2**31:
        return f"x: {total_rows} rows (batches included) exceed the 2**31 - 1 the kernel indexes"
    if geometry.batches > MAX_GRID_Z and total_rows > MAX_GRID_X:
        return f"x: {geometry.batches} batches of {geometry.grid_rows} rows exceed the grid"
    lanes = geometry.group_size * itemsize // lane_bytes()
    rows = tile_rows(geometry.layout, lanes)
    threads, blocks_per_row = block_shape(geometry.groups, lanes, rows)
    if blocks_per_row > MAX_GRID_Y:
        return f"x: K={geometry.k} needs {blocks_per_row} blocks per row, over {MAX_GRID_Y}"
    return None


_resident: dict[tuple[int, str, int, int], tuple[int, int]] = {}


def resident_blocks(
    handle: int, name: str, threads: int, device: int, shared: int = 0
) -> tuple[int, int]:
    """(blocks per SM, SMs): how many blocks of ``threads`` threads of the kernel ``handle`` fit,
    with ``shared`` bytes of dynamic shared memory each.

    NOTES: the driver's occupancy calculator, which knows that a block's warps are spread over
    the SM's four sub-partitions (a 7-warp block fits 5 times, not the 6 a plain register count
    suggests); a one-wave grid sized from the plain count ran 1.2 waves and 25% slower.
    """
    key = (device, name, threads, shared)
    fit = _resident.get(key)
    if fit is None:
        import cupy
        from cupy_backends.cuda.api import driver

        sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(handle, threads, shared)
        fit = _resident[key] = (max(1, per_sm), sms)
    return fit


def waves_for(blocks_per_sm: int) -> float:
    """Resident waves of blocks the row loop's grid holds (FP8_GROUP_QUANT_WAVES overrides).

    NOTES: measured on the H200 (docs/perf.md, runs 5-9), K = 7168: kernels that fit six blocks
    per SM run best with eight waves of short-lived blocks (M = 16384: 85.7 us against 94.0 with
    one wave, whose fixed share of 41 rows per block ended unevenly); kernels that fit five (the
    48-register instantiations) run best with one (M = 8192: 45.0 us against 46.9 with eight).
    """
    if WAVES is not None:
        return WAVES
    return 8.0 if blocks_per_sm >= 6 else 1.0


def norm_blocks(rows: int, residual: bool, per_sm: int, sms: int, lanes: int = 2) -> int:
    """Blocks of the fused RMSNorm's grid for ``rows`` rows (all batches), ``lanes`` lanes a
    thread: a block a row, or one resident wave of blocks that walk the rows
    (FP8_GROUP_QUANT_NORM_WAVES overrides).

    NOTES: measured on the H200 (docs/perf.md, fused steps 18 and 19), K = 7168, two lanes a
    thread, four blocks an SM (528 a wave), launched without PDL: without the residual the
    walking wave (the weight-stashing kernel, norm_stashes) ran 7.87 us at M = 640 (1.2 rows a
    block) against 8.55 with a block a row, 8.65 against 9.57 at 768, 10.20 against 11.01 at
    1024 (with PDL the same order); before step 19 it lost at 768 with PDL and won by 3-5%
    from 1024. With the residual (the general kernel; session 23, on real residuals) two lanes
    walking were 1-6% slower than a block a row from 640 rows (8192: 108.0 against 102.1 us),
    but one lane a thread walking (264 blocks) 0-9% faster than two lanes a block a row
    between 1.7 and 6.8 one-lane waves (640: 12.02 against 12.68 us, 1024: 16.42 against
    17.13) and slower from 9.7 (2560: 36.16 against 35.83); norm_lanes' window. So the walking
    blocks take rows without a residual past one resident wave, and rows with it where
    norm_lanes gives them one lane a thread past one wave of its grid."""
    resident = per_sm * sms
    if NORM_WAVES is not None:
        waves = NORM_WAVES
    elif residual:
        waves = 1.0 if lanes == 1 and rows > resident else 0.0
    else:
        waves = 0.0 if rows < NORM_WALK_ROWS * resident else 1.0
    return max(1, rows if waves <= 0 else min(rows, int(waves * resident)))


# rows a block (a resident wave's worth) from which the RMSNorm grid walks (norm_blocks)
NORM_WALK_ROWS = 1.0

NORM_LANE_CHOICES = (1, 2)  # the RMSNorm kernel's instantiations: 32-byte lanes a thread


def norm_lanes(rows: int, per_sm: int, sms: int, residual: bool = False) -> int:
    """The RMSNorm kernel's lanes a thread for ``rows`` rows (all batches), given the one-lane
    instantiation's resident blocks an SM: one, or two where the rows are more than one wave of
    the one-lane grid, but one again with the residual between NORM_RESIDUAL_ONE_LANE waves of
    it, where its blocks walk (norm_blocks; FP8_GROUP_QUANT_NORM_LANES overrides).

    NOTES: two lanes a thread issue fewer instructions a value (each thread's per-row work, the
    second fold, division, square root, addresses and loop, serves two lanes) and, at 72
    registers, fit four 224-thread blocks an SM at K = 7168 against two of one lane's 448; one
    lane keeps twice the warps on each row, which pays where the rows fit one wave and each
    row's chain is the time. Measured on the H200 (docs/perf.md, fused step 18, K = 7168, the
    one-lane grid holds 264 blocks a wave, without PDL; with it the same order), two lanes
    against one: 0.4-0.7 us slower at M = 1-256 (RMSNorm and add-RMSNorm), faster from 384
    (RMSNorm 6.44 against 7.14 us, 512 7.12 against 7.71, 1024 11.04 against 13.00;
    add-RMSNorm 9.54 / 9.62 at 384, 11.39 / 11.29 at 512, 64.2 against 74.0 at 4096; those
    add-RMSNorm figures were taken on residuals holding the roof's NaNs, see norm_blocks)."""
    if NORM_LANES is not None:
        return NORM_LANES
    wave = per_sm * sms
    low, high = NORM_RESIDUAL_ONE_LANE
    if residual and low * wave < rows <= high * wave:
        return 1
    return 2 if rows > NORM_TWO_LANE_WAVES * wave else 1


# resident waves of one-lane blocks beyond which the RMSNorm kernel takes two lanes a thread
# (norm_lanes): 256 rows (0.97 waves at K = 7168) ran faster with one, 384 (1.45) with two
NORM_TWO_LANE_WAVES = 1.0
# waves of one-lane blocks between which the add-RMSNorm takes one lane a thread, walking.
# Measured on the H200 at K = 7168 (264 blocks a wave; docs/perf.md, session 23, on real
# residuals): against two lanes a block a row, 384 rows (1.45 waves) 0.2 us slower, 448-1792
# (1.7-6.8) 0-9% faster without PDL (640: 12.02 against 12.68 us, 1024 16.42 against 17.13,
# 1536 23.27 against 23.58), 2048 (7.8) level, 2560-8192 1-4% slower. (Session 14 had put the
# upper end at two waves from measurements whose residuals held the roof's NaNs.)
NORM_RESIDUAL_ONE_LANE = (1.5, 6.5)


def norm_stashes(input_dtype: str, per_thread: int, residual: bool) -> bool:
    """Whether a walking RMSNorm grid takes the kernel that keeps each thread's weight values as
    float32 in shared memory (kStash in kernels/quantize.cu): 16-bit input, two lanes a thread
    (the lanes every walking grid without a residual takes but through
    FP8_GROUP_QUANT_NORM_LANES), no residual (norm_rows' kStash path has none)."""
    return INPUT_TYPES[input_dtype].itemsize == 2 and per_thread == 2 and not residual


def norm_stash_bytes(threads: int, per_thread: int) -> int:
    """Dynamic shared memory of the weight-stashing RMSNorm kernel: each thread's lanes' values
    as float32 (at most 64 KB: 1024 lanes)."""
    return threads * per_thread * (lane_bytes() // 2) * 4


def norm_threads(lanes: int, per_thread: int) -> int:
    """Threads of the fused RMSNorm's blocks for rows of ``lanes`` 32-byte lanes, ``per_thread``
    lanes a thread: the row's warps of lanes (missing lanes included) divided among whole warps
    of threads, each thread's lanes a block apart (kernels/quantize.cu). make_request keeps rows
    within kMaxNormLanes lanes."""
    assert 0 < lanes <= cpp_constant("kMaxNormLanes") and per_thread in NORM_LANE_CHOICES
    return -(-lanes // (WARP * per_thread)) * WARP


def _prepare_norm(request, key: KernelKey, device: int) -> Launch:
    """The fused RMSNorm's grid: norm_blocks() blocks of norm_threads(), each walking the rows
    (all batches) with a stride of the grid, one or two lanes a thread (norm_lanes()); a grid
    that walks takes the weight-stashing kernel where norm_stashes() says so."""
    geometry = request.output
    lanes = geometry.groups * key.lanes_per_group
    rows = geometry.batches * geometry.rows

    def loaded(per_thread: int, shared: int = 0) -> tuple[int, int, int, int]:
        """(function handle, threads, resident blocks per SM, SMs) of that instantiation, the
        weight-stashing one with ``shared`` bytes of dynamic shared memory."""
        stash_key = dataclasses.replace(key, norm_lanes=per_thread, norm_stash=shared > 0)
        expression = stash_key.name_expression
        function = _jit.get_function(SOURCE, expression, device)
        with _jit.current_device(device):
            handle = function.kernel.ptr
            if shared > STATIC_SHARED_LIMIT:
                allow_shared(handle, shared)
        threads = norm_threads(lanes, per_thread)
        return (handle, threads, *resident_blocks(handle, expression, threads, device, shared))

    launch = loaded(1)
    per_thread = norm_lanes(rows, launch[2], launch[3], request.residual)
    handle, threads, per_sm, sms = launch if per_thread == 1 else loaded(per_thread)
    blocks = norm_blocks(rows, request.residual, per_sm, sms, per_thread)
    shared = 0
    if blocks < rows and NORM_STASH and norm_stashes(key.input_dtype, per_thread, request.residual):
        shared = norm_stash_bytes(threads, per_thread)
        handle, threads, per_sm, sms = loaded(per_thread, shared)
        blocks = norm_blocks(rows, request.residual, per_sm, sms, per_thread)
    params = make_params(request)
    return Launch(handle, (blocks, 1, 1), (threads, 1, 1), params, pdl_supported(device), shared)


STATIC_SHARED_LIMIT = 48 * 1024  # bytes of shared memory a block may take without opting in


def allow_shared(handle: int, shared: int) -> None:
    """Let the kernel ``handle`` take ``shared`` bytes of dynamic shared memory (more than
    STATIC_SHARED_LIMIT needs the function attribute)."""
    from cupy_backends.cuda.api import driver

    max_dynamic_shared = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (cuda.h)
    driver.funcSetAttribute(handle, max_dynamic_shared, shared)


# The plain fused SiLU-and-multiply path takes the masked layout's persistent kernel (every
# row real) for one-pass grids of more than PERSISTENT_FUSED_WAVES resident waves
# (fused_takes_persistent)
PERSISTENT_FUSED_WAVES = 8.0


def fused_takes_persistent(geometry: Geometry, one_pass_blocks: int, per_sm: int, sms: int) -> bool:
    """Whether a plain SiLU-and-multiply launch takes the masked layout's persistent kernel
    with every row real instead of its one-pass grid of ``one_pass_blocks`` blocks (``per_sm``
    of them resident on each of ``sms`` SMs).

    NOTES: each one-pass block copies the 8 KB SiLU table into shared memory and waits for it
    before its first value, for 16 groups; a persistent block copies it once and keeps two
    slots' loads in flight. Measured on the H200 (docs/perf.md, fused steps 12, 13 and 27,
    N = 7168; the one-pass grid holds ten 128-thread blocks an SM, 1320 a wave): the
    persistent grid 3.7% faster at M = 4096 (11 waves of the one-pass grid) and 8.5% at 16384
    (43). Since the one-pass blocks copy their table before their loads, with every thread in
    grids past half a wave (table_by_threads, fused step 27), the one-pass grid is as fast or
    faster below: M = 2048 (5.4 waves) 22.59 against 22.95 us, 1024 13.13 / 13.09, 512
    7.76 / 7.89 (before, the persistent grid also took grids of 1.25 waves or more whose slots
    filled at most 1.1 of its walks, then 4-10% faster there). Far slower at M <= 64 (1.80
    against 1.22x the roof).
    Only where the input has no padding rows (that kernel writes none) and at most
    kMaxExperts batches (its scan's limit).
    """
    if geometry.grid_rows != geometry.rows or geometry.batches > max_experts():
        return False
    return one_pass_blocks > PERSISTENT_FUSED_WAVES * per_sm * sms


# One-pass SiLU-and-multiply grids of more than TABLE_BY_THREADS_WAVES resident waves copy
# their blocks' tables with every thread (Params.table_by_threads; kernels/activation.cuh):
# with bulk copies, one-pass SiLU at N = 7168 took 5.55 us at M = 256 (0.68 waves) against
# 5.36 with cp.async and 13.82 at 1024 against 12.69, but 4.01 at 128 (0.34 waves) against
# 4.20 and 3.15 at 64 against 3.39 (docs/perf.md, fused step 27, run 14, the bulk copy then
# issued after the loads). FP8_GROUP_QUANT_SILU_TABLE_WAVES overrides: a tuning knob (0:
# every thread copies in every grid).
_TABLE_WAVES_ENV = os.environ.get("FP8_GROUP_QUANT_SILU_TABLE_WAVES")
TABLE_BY_THREADS_WAVES = float(_TABLE_WAVES_ENV) if _TABLE_WAVES_ENV else 0.5


def _masked_grid(key: KernelKey, device: int) -> tuple[int, int, int]:
    """(function handle, resident blocks per SM, SMs) of the persistent kernel ``key``."""
    function = _jit.get_function(SOURCE, key.name_expression, device)
    with _jit.current_device(device):
        handle = function.kernel.ptr
        per_sm, sms = resident_blocks(
            handle, key.name_expression, cpp_constant("kMaskedThreads"), device
        )
    return handle, per_sm, sms


def _prepare_masked(request, key: KernelKey, device: int) -> Launch:
    """The masked layout's persistent grid: as many blocks as the worst case (every row of
    every expert) needs, at most one resident wave, or fewer for an ``expected_m`` hint. The
    plain SiLU-and-multiply path's large grids take it too, with no masked_m (every row real).

    NOTES: the grid is fixed when the plan is made, so a CUDA graph replays it with any counts;
    the blocks walk the real slots with a stride of the grid (kernels/quantize.cu).
    """
    geometry = request.output
    threads = cpp_constant("kMaskedThreads")
    handle, per_sm, sms = _masked_grid(key, device)
    rows = tile_rows(geometry.layout, key.lanes_per_group)
    expected = geometry.rows if request.expected_m is None else request.expected_m
    slots = geometry.batches * -(-max(1, expected) // rows) * rows * geometry.groups
    blocks = max(1, min(-(-slots * key.lanes_per_group // threads), per_sm * sms))
    params = make_params(request)
    return Launch(handle, (blocks, 1, 1), (threads, 1, 1), params, pdl_supported(device))


# the launch -------------------------------------------------------------------------------------


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig of cuLaunchKernelEx."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_bytes", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attributes", ctypes.POINTER(_LaunchAttribute)),
        ("attribute_count", ctypes.c_uint),
    ]


_PROGRAMMATIC_STREAM_SERIALIZATION = (
    6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (cuda.h)
)


def pdl_supported(device: int) -> bool:
    """PDL is on for this device: SM90 or newer, the driver's cuLaunchKernelEx is reachable, and
    FP8_GROUP_QUANT_PDL is not 0."""
    if not PDL or _jit.driver_entry_point("cuLaunchKernelEx", 4) is None:
        return False
    return _jit.compute_capability(device)[0] >= 9


class KernelLaunch:
    """A kernel, its grid and its arguments (ctypes values), launched on a given stream.

    NOTES: the launch calls the driver's cuLaunchKernelEx through ctypes with a prepared
    CUlaunchConfig; with ``pdl`` it carries the programmatic stream serialization attribute, so
    the kernel may start while the previous kernel on the stream finishes (its
    griddepcontrol.wait orders the memory). The attribute is recorded in CUDA-graph captures.
    Without cuLaunchKernelEx (no ctypes driver), CuPy's cuLaunchKernel, without PDL. ``shared``:
    bytes of dynamic shared memory a block.
    """

    def __init__(self, handle: int, grid, block, args, pdl: bool = False, shared: int = 0):
        self.handle = handle
        self.grid = tuple(grid)
        self.block = tuple(block)
        self.args = list(args)  # kept alive: the driver reads them at each launch
        self.pdl = pdl
        self._pointers = (ctypes.c_void_p * len(self.args))(
            *[ctypes.addressof(a) for a in self.args]
        )
        self._pointers_address = ctypes.addressof(self._pointers)
        self._attribute = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attribute.value[0] = 1
        self._config = _LaunchConfig(
            (ctypes.c_uint * 3)(*self.grid),
            (ctypes.c_uint * 3)(*self.block),
            shared,
            None,
            ctypes.pointer(self._attribute),
            1 if pdl else 0,
        )
        self._config_address = ctypes.addressof(self._config)
        self._launch_ex = _jit.driver_entry_point("cuLaunchKernelEx", 4)
        if self._launch_ex is None:
            from cupy_backends.cuda.api import driver

            self.pdl = False
            self._launch_kernel = driver.launchKernel
            self._launch_args = (handle, *self.grid, *self.block, shared)
        self._lock = threading.Lock()

    def __call__(self, stream: int) -> None:
        with self._lock:  # the configuration and arguments are shared: fill and launch at once
            self._launch_locked(stream)

    def _launch_locked(self, stream: int) -> None:
        if self._launch_ex is None:
            self._launch_kernel(*self._launch_args, stream, self._pointers_address, 0)
            return
        self._config.stream = stream
        status = self._launch_ex(self._config_address, self.handle, self._pointers_address, None)
        if status:
            raise RuntimeError(f"cuLaunchKernelEx failed: {_jit.driver_error(status)}")


class Launch(KernelLaunch):
    """The quantizer's launch for a fixed geometry: one Params argument, whose three pointers
    are the only thing that changes between calls."""

    def __init__(
        self, handle: int, grid, block, params: ctypes.Structure, pdl: bool = False, shared: int = 0
    ):
        super().__init__(handle, grid, block, [params], pdl, shared)
        self.params = params

    def launch(self, x_ptr: int, q_ptr: int, scale_ptr: int, stream: int) -> None:
        params = self.params
        with self._lock:  # the Params are shared: fill and launch atomically
            params.x, params.q, params.scales = x_ptr, q_ptr, scale_ptr
            self._launch_locked(stream)

    def launch_masked(self, x_ptr, q_ptr, scale_ptr, masked_ptr, stream: int) -> None:
        """The masked layout's launch: the counts' address changes per call too."""
        params = self.params
        with self._lock:
            params.x, params.q, params.scales, params.masked_m = x_ptr, q_ptr, scale_ptr, masked_ptr
            self._launch_locked(stream)

    def launch_norm(self, x_ptr, q_ptr, scale_ptr, weight_ptr, residual_ptr, stream: int) -> None:
        """The fused RMSNorm's launch: the weight's and the residual's (or 0) addresses too."""
        params = self.params
        with self._lock:
            params.x, params.q, params.scales = x_ptr, q_ptr, scale_ptr
            params.weight, params.residual = weight_ptr, residual_ptr
            self._launch_locked(stream)


def strides_fit_i32(request) -> bool:
    """Whether x's row and batch strides (elements) fit the one-pass kernel's 32-bit copies."""
    return all(abs(stride) < 2**31 for stride in (request.x_row_stride, request.x_batch_stride))


def flat_slots(request, tile: int) -> bool:
    """Whether the one-pass kernel may load group slot s at x + s * G (its kFlat
    instantiation, has_flat): plain input (no activation), 16-byte aligned, one-row tiles, x's
    rows K elements apart and its batches rows * K apart (a contiguous 2-D or 3-D input, or one
    row of a wider buffer).

    NOTES: its load's address then waits for no division; measured on the H200 (docs/perf.md
    step 25)."""
    geometry = request.output
    k = geometry.k
    return (
        request.mode.width_factor == 1
        and request.x_aligned
        and tile == 1
        and (geometry.rows == 1 or request.x_row_stride == k)
        and (geometry.batches == 1 or request.x_batch_stride == geometry.rows * k)
    )


def make_params(request, **pointers) -> ctypes.Structure:
    """The Params of ``request`` (a ``_request.Request``); pointers default to zero."""
    geometry = request.output
    fmt = request.fmt
    s_batch, s_row, s_word = geometry.scale_byte_strides
    rows = tile_rows(geometry.layout, request.kernel_key().lanes_per_group)
    batch_tiles = -(-geometry.rows // rows)
    tile_magic, tile_shift = divisor(geometry.groups * rows)
    batch_magic, batch_shift = divisor(max(1, batch_tiles))
    lanes = request.kernel_key().lanes_per_group
    slots = one_pass_slots(geometry, rows)
    block_slots = one_pass_threads(slots, lanes) // lanes
    assert 0 < block_slots < 256, "Params.block_slots is one byte"
    return params_type()(
        slots=min(slots, 2**32 - 1),
        block_slots=block_slots,
        tile_slots=geometry.groups * rows,
        tile_slots_magic=tile_magic,
        batch_tiles=batch_tiles,
        batch_tiles_magic=batch_magic,
        tile_slots_shift=tile_shift,
        batch_tiles_shift=batch_shift,
        tile_rows_log2=rows.bit_length() - 1,
        x_batch_stride=request.x_batch_stride,
        x_row_stride=request.x_row_stride,
        x_batch_stride32=request.x_batch_stride if strides_fit_i32(request) else 0,
        x_row_stride32=request.x_row_stride if strides_fit_i32(request) else 0,
        q_batch_stride=geometry.q_rows * geometry.k,
        s_batch_stride=s_batch,
        s_row_stride=s_row,
        s_word_stride=s_word,
        rows=geometry.rows,
        grid_rows=geometry.grid_rows,
        q_rows=geometry.q_rows,
        scale_rows=geometry.scale_rows,
        batches=geometry.batches,
        groups_per_row=geometry.groups,
        eps=request.eps,
        fmax=fmt.fmax,
        inverse_fmax=fmt.inverse_fmax,
        ue8m0_floor=UE8M0_FLOOR,
        nonfinite_codes=fmt.nonfinite_word,
        x_up_offset=request.x_up_offset,
        masked_i64=1 if request.masked == "int64" else 0,
        r_batch_stride=request.r_batch_stride,
        r_row_stride=request.r_row_stride,
        eps_norm=request.eps_norm,
        floor_emax=request.fmt.emax_elem if request.scale_rule == "floor" else 0,
        **pointers,
    )


def prepare(request, device: int) -> Launch:
    """The launch of ``request`` on ``device``; pointers are given per call.

    NOTES: two paths. The one-pass kernel (docs/perf.md step 17) numbers the group slots of
    every real row flat over a 1-D grid of one_pass_threads() blocks; it takes every grid of
    the instantiations whose one-pass kernel fits six blocks per SM and grids of up to 16
    resident waves of the others (one_pass_wave_limit). Larger grids of those take the row
    loop with a few resident waves of blocks of whole row tiles (step 14), whose prefetch
    hides their latency better.
    """
    geometry = request.output
    key = request.kernel_key()
    lanes = key.lanes_per_group
    rows = tile_rows(geometry.layout, lanes)
    if key.masked:
        return _prepare_masked(request, key, device)
    if key.norm:
        return _prepare_norm(request, key, device)
    threads, blocks_per_row = block_shape(geometry.groups, lanes, rows)
    tiles = -(-geometry.batches * geometry.grid_rows // rows)  # row tiles over all batches

    flat = flat_slots(request, rows)

    def loaded(one_pass: bool, threads: int, blocks_per_sm: int = 0) -> tuple[int, int, int]:
        """(function handle, resident blocks per SM, SMs) of the path's instantiation."""
        expression = dataclasses.replace(
            key, one_pass=one_pass, blocks_per_sm=blocks_per_sm, flat=one_pass and flat
        ).name_expression
        function = _jit.get_function(SOURCE, expression, device)
        with _jit.current_device(device):  # RawKernel.kernel is the current device's function
            handle = function.kernel.ptr
            return (handle, *resident_blocks(handle, expression, threads, device))

    slots = one_pass_slots(geometry, rows)
    if slots < 2**31 and strides_fit_i32(request):
        flat_threads = one_pass_threads(slots, lanes)
        handle, per_sm, sms = loaded(one_pass=True, threads=flat_threads)
        flat_blocks = -(-slots * lanes // flat_threads)
        fused = key.activation is not None
        if fused and fused_takes_persistent(geometry, flat_blocks, per_sm, sms):
            persistent = dataclasses.replace(key, masked=True, one_pass=True)
            return _prepare_masked(request, persistent, device)
        limit = math.inf if fused else one_pass_wave_limit(per_sm, flat_threads)
        if flat_blocks <= limit * per_sm * sms:
            grid, block = (flat_blocks, 1, 1), (flat_threads, 1, 1)
            params = make_params(request)
            params.table_by_threads = flat_blocks > TABLE_BY_THREADS_WAVES * per_sm * sms
            one_pass_key = dataclasses.replace(key, one_pass=True)
            if has_six_blocks(one_pass_key) and flat_blocks > SILU_SIX_BLOCKS_WAVES * per_sm * sms:
                handle = loaded(True, flat_threads, SILU_SIX_BLOCKS)[0]
            return Launch(handle, grid, block, params, pdl_supported(device))
    assert key.activation is None, "make_request refuses fused grids past 31 bits"
    handle, per_sm, sms = loaded(one_pass=False, threads=threads)
    row_blocks = min(tiles, MAX_GRID_X)
    waves = waves_for(per_sm)
    if waves > 0:
        row_blocks = min(tiles, max(1, int(waves * per_sm * sms) // blocks_per_row))
    grid = (row_blocks, blocks_per_row, 1)
    return Launch(handle, grid, (threads, 1, 1), make_params(request), pdl_supported(device))
