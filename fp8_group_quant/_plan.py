"""The plan of a call: kernel instantiation, grid, block and Params, from a Request.

Pure decisions: each function here reads a validated request, the device's occupancy and the
tuning table (``_tuning``), and returns numbers; ``_launch`` carries them out. The numbers the
choices rest on are in docs/perf.md ("Lessons").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from . import _abi, _jit, activation
from ._abi import (
    LANE_BYTES,
    MASKED_THREADS,
    MAX_EXPERTS,
    MAX_NORM_LANES,
    MAX_THREADS,
    NORM_ROUNDINGS,
    TILE,
    TILE_THREADS,
    WARP,
    params_type,
)
from ._launch import STATIC_SHARED_LIMIT, Launch, allow_shared, pdl_supported, resident_blocks
from ._layout import SCALE_LAYOUTS, WEIGHT_BLOCKS, Geometry, supported_combinations
from ._spec import (
    FP4_FORMATS,
    GROUP_SIZES,
    INPUT_MODES,
    INPUT_TYPES,
    OUTPUT_FORMATS,
    SCALE_FORMATS,
    UE8M0_FLOOR,
)
from ._tuning import Tuning

SOURCE = "quantize.cu"
_jit.register_header("abi.cuh", _abi.header())  # the constants and Params the kernels include
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535
MAX_GRID_Z = 65535
MAX_TILE_ROWS = 8  # eight float scales fill a 32-byte sector
SILU_SIX_BLOCKS = 6  # the SiLU-mul kernel's second instantiation: six 256-thread blocks an SM
NORM_LANE_CHOICES = (1, 2)  # the RMSNorm kernel's instantiations: 32-byte lanes a thread


def lane_bytes() -> int:
    """Input bytes one lane holds."""
    return LANE_BYTES


def max_threads_per_block() -> int:
    return MAX_THREADS


def max_experts() -> int:
    """The most batches (experts) the masked layout takes: its kernel's shared scan."""
    return MAX_EXPERTS


# the kernel key ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelKey:
    """Everything that changes the binary. Shapes are launch arguments, not part of the key."""

    input_dtype: str  # a key of _spec.INPUT_TYPES
    group_size: int
    output: str  # a key of _spec.OUTPUT_FORMATS naming the binary: the format's kernel_format
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
    fp4: str | None = None  # a key of _spec.FP4_FORMATS (only input_dtype and layout_trait matter)
    # an upstream's arithmetic compiled in (instantiations of their own, so that the others'
    # code stays as it was): "unfloored" or "multiplier" (plain quantize_groups), "reciprocal"
    # (quantize_fp4)
    arithmetic: str | None = None

    @property
    def lanes_per_group(self) -> int:
        return self.group_size * INPUT_TYPES[self.input_dtype].itemsize // lane_bytes()

    @property
    def name_expression(self) -> str:
        """The template instantiation in kernels/quantize.cu, as NVRTC names it."""
        source = INPUT_TYPES[self.input_dtype].kernel_trait
        if self.fp4 is not None:
            reciprocal = (True,) if self.arithmetic == RECIPROCAL else ()
            return _template("quantize_fp4", source, FP4_FORMATS[self.fp4].kernel_trait,
                             self.layout_trait, *reciprocal)  # fmt: skip
        common = (source, self.group_size, OUTPUT_FORMATS[self.output].kernel_trait,
                  SCALE_FORMATS[self.scale].kernel_trait, self.layout_trait)  # fmt: skip
        mode = INPUT_MODES[self.activation].kernel_trait
        if self.norm:
            return _template("quantize_norm", *common, self.norm_lanes, self.norm_stash)
        if self.masked:
            return _template("quantize_masked", *common, mode)
        # the defaulted trailing arguments kBlocks, kFlat, kArith, up to the last one set
        arithmetic = 0 if self.arithmetic is None else ARITHMETIC_TRAITS[self.arithmetic]
        extra = (self.blocks_per_sm, self.flat, arithmetic)
        used = max((i + 1 for i, value in enumerate(extra) if value), default=0)
        return _template("quantize_groups", *common, self.vec16, self.one_pass, mode, *extra[:used])


def _template(kernel: str, *arguments) -> str:
    spelled = [str(a).lower() if isinstance(a, bool) else str(a) for a in arguments]
    return f"fgq::{kernel}<{', '.join(spelled)}>"


# the arithmetics with instantiations of their own, and kernels/group.cuh's ArithmeticMode of
# each (quantize_fp4 takes "reciprocal" as a flag of its own)
RECIPROCAL, UNFLOORED, MULTIPLIER = "reciprocal", "unfloored", "multiplier"
ARITHMETIC_TRAITS = {UNFLOORED: "fgq::kUnflooredArith", RECIPROCAL: "fgq::kReciprocalArith",
                     MULTIPLIER: "fgq::kMultiplierArith"}  # fmt: skip
MULTIPLIER_GROUPS = (128, 256)  # arithmetic="multiplier"'s row-wise groups: torchao's blocks


def nvfp4_amax_name(input_dtype: str) -> str:
    """NVFP4's global-amax kernel of one input type (a computed global scale runs it first)."""
    return _template("nvfp4_amax", INPUT_TYPES[input_dtype].kernel_trait)


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
            (i, g, OUTPUT_FORMATS[o].kernel_format, s, SCALE_LAYOUTS[layout].kernel_trait)
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
    keys += [dataclasses.replace(k, arithmetic=UNFLOORED) for k in keys if takes_unfloored(k)]
    keys += [dataclasses.replace(k, arithmetic=MULTIPLIER) for k in keys if takes_multiplier(k)]
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


def takes_unfloored(key: KernelKey) -> bool:
    """Whether ``key`` has an instantiation of arithmetic="unfloored": plain input in MXFP8's
    groups (32 values, e4m3, UE8M0) in the layouts the MXFP8 drop-in writes (blocked, and
    float words for its row-major bytes)."""
    return (
        key.group_size == 32
        and key.output == "e4m3"
        and key.scale == "ue8m0"
        and key.layout_trait in ("fgq::kBlockedExponents", "fgq::kFloatWords")
        and key.activation is None
        and not key.masked
        and not key.norm
        and key.blocks_per_sm == 0
        and key.arithmetic is None
    )


def takes_multiplier(key: KernelKey) -> bool:
    """Whether ``key`` has an instantiation of arithmetic="multiplier" (torchao's
    act_quant_lhs): plain input in groups of 128 or 256, e4m3 with float scales (in float
    words: the row, col and col_tma layouts)."""
    return (
        key.group_size in MULTIPLIER_GROUPS
        and key.output == "e4m3"
        and key.scale == "float32"
        and key.layout_trait == "fgq::kFloatWords"
        and key.activation is None
        and not key.masked
        and not key.norm
        and key.blocks_per_sm == 0
        and key.arithmetic is None
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


def all_name_expressions() -> list[str]:
    """Every instantiation of quantize.cu: the kernel keys', then the FP4 formats' (one per
    input type and layout) and NVFP4's amax kernel."""
    names = [key.name_expression for key in all_kernel_keys()]
    for input_dtype in INPUT_TYPES:
        names += [fp4_key(input_dtype, fp4, SCALE_LAYOUTS[layout], arithmetic).name_expression
                  for arithmetic in (None, RECIPROCAL)
                  for fp4 in FP4_FORMATS.values() for layout in fp4.layouts]  # fmt: skip
        names.append(nvfp4_amax_name(input_dtype))
    return names + tile_name_expressions()


def fp4_key(input_dtype: str, fp4, layout, arithmetic: str | None = None) -> KernelKey:
    """The quantize_fp4 instantiation of an FP4 format (a _spec.Fp4Format) and a ScaleLayout;
    ``arithmetic`` "reciprocal" or None."""
    return KernelKey(input_dtype, fp4.group_size, "e4m3", "ue8m0", layout.kernel_trait, True,
                     fp4=fp4.name.lower(), arithmetic=arithmetic)  # fmt: skip


def compiled_arithmetic(arithmetic: str) -> str | None:
    """The KernelKey.arithmetic of a call's ``arithmetic``: the ones with instantiations of
    their own; None for the others (float32, and bfloat16's runtime mode)."""
    return arithmetic if arithmetic in ARITHMETIC_TRAITS else None


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
    scattered word per group (G = 32 col scales ran 1.24-1.46x slower per byte without)."""
    layout = SCALE_LAYOUTS[layout] if isinstance(layout, str) else layout
    if not layout.mn_major or layout.scales_per_word > 1:
        return 1
    return max(1, min(MAX_TILE_ROWS, WARP // lanes))


def block_shape(groups: int, lanes: int, rows: int = 1) -> tuple[int, int]:
    """(threads per block, blocks per row tile) for tiles of ``rows`` rows of ``groups`` groups:
    the fewest blocks of at most MAX_THREADS threads, groups spread evenly and rounded up to
    whole warps (the kernel drops the last block's surplus groups by a bounds check)."""
    blocks = -(-groups * lanes * rows // MAX_THREADS)
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


def one_pass_threads(tuning: Tuning) -> int:
    """Threads per block of the one-pass grid."""
    return tuning.one_pass_threads


def one_pass_wave_limit(blocks_per_sm: int, threads: int, tuning: Tuning) -> float:
    """The most resident waves a one-pass grid may have before the row loop takes over:
    unlimited for kernels that fit six 256-thread blocks an SM (one pass won at every size up
    to 36 waves), 16 for the others (they hide latency worse without the loop's prefetch)."""
    if tuning.one_pass_max_waves is not None:
        return tuning.one_pass_max_waves
    return math.inf if blocks_per_sm * threads >= 6 * MAX_THREADS else 16.0


def row_loop_waves(blocks_per_sm: int, tuning: Tuning) -> float:
    """Resident waves of blocks the row loop's grid holds: eight of short-lived blocks for
    kernels of six blocks an SM, one for those of five."""
    if tuning.row_loop_waves is not None:
        return tuning.row_loop_waves
    return 8.0 if blocks_per_sm >= 6 else 1.0


def grid_limits_error(geometry: Geometry, itemsize: int, one_pass_only=None) -> str | None:
    """Why ``geometry`` cannot be launched with ``itemsize``-byte input, or None.
    ``one_pass_only`` names the option (an activation, masked_m) that has one-pass kernels
    only, which number every group slot in 31 bits."""
    lanes = geometry.group_size * itemsize // LANE_BYTES
    rows = tile_rows(geometry.layout, lanes)
    total_rows = geometry.batches * geometry.grid_rows
    if one_pass_only is not None:
        slots = one_pass_slots(geometry, rows)
        if slots >= 2**31:
            return f"x: {one_pass_only} takes at most 2**31 - 1 group slots, got {slots}"
    if total_rows >= 2**31:
        return f"x: {total_rows} rows (batches included) exceed the 2**31 - 1 the kernel indexes"
    if geometry.batches > MAX_GRID_Z and total_rows > MAX_GRID_X:
        return f"x: {geometry.batches} batches of {geometry.grid_rows} rows exceed the grid"
    _, blocks_per_row = block_shape(geometry.groups, lanes, rows)
    if blocks_per_row > MAX_GRID_Y:
        return f"x: K={geometry.k} needs {blocks_per_row} blocks per row, over {MAX_GRID_Y}"
    return None


def strides_fit_i32(request) -> bool:
    """Whether x's row and batch strides (elements) fit the one-pass kernel's 32-bit copies."""
    return all(abs(stride) < 2**31 for stride in (request.x_row_stride, request.x_batch_stride))


def flat_slots(request, tile: int) -> bool:
    """Whether the one-pass kernel may load group slot s at x + s * G (its kFlat
    instantiation): plain 16-byte aligned input, one-row tiles, rows K elements apart and
    batches rows * K apart. Its load's address then waits for no division."""
    geometry = request.output
    k = geometry.k
    return (
        request.mode.width_factor == 1
        and request.x_aligned
        and tile == 1
        and (geometry.rows == 1 or request.x_row_stride == k)
        and (geometry.batches == 1 or request.x_batch_stride == geometry.rows * k)
    )


# the fused RMSNorm's grid ---------------------------------------------------------------------


def norm_blocks(
    rows: int, residual: bool, per_sm: int, sms: int, lanes: int, tuning: Tuning
) -> int:
    """Blocks of the RMSNorm grid for ``rows`` rows (all batches): a block a row, or one
    resident wave of blocks that walk the rows. Without a residual the walk wins past one wave;
    with it, only where norm_lanes gives one lane a thread."""
    resident = per_sm * sms
    if tuning.norm_waves is not None:
        waves = tuning.norm_waves
    elif residual:
        waves = 1.0 if lanes == 1 and rows > resident else 0.0
    else:
        waves = 0.0 if rows < tuning.norm_walk_rows * resident else 1.0
    return max(1, rows if waves <= 0 else min(rows, int(waves * resident)))


def norm_lanes(
    rows: int, per_sm: int, sms: int, residual: bool, tuning: Tuning, unrounded_sum: bool = False
) -> int:
    """32-byte lanes a thread of the RMSNorm kernel: two past one wave of the one-lane grid
    (fewer instructions a value, four 224-thread blocks an SM), one below (twice the warps on
    each row's chain), and one with a residual in the window where its walking grid wins.
    Always one for a residual's unrounded float32 sum (norm_rounding="twice_unrounded_sum"),
    whatever the tuning: only the one-lane kernel has that path (kernels/norm.cuh)."""
    if residual and unrounded_sum:
        return 1
    if tuning.norm_lanes is not None:
        return tuning.norm_lanes
    wave = per_sm * sms
    low, high = tuning.norm_residual_one_lane
    if residual and low * wave < rows <= high * wave:
        return 1
    return 2 if rows > tuning.norm_two_lane_waves * wave else 1


def norm_stashes(input_dtype: str, per_thread: int, residual: bool) -> bool:
    """Whether a walking RMSNorm grid may take the kernel that keeps each thread's weight
    values as float32 in shared memory: 16-bit input, two lanes a thread, no residual."""
    return INPUT_TYPES[input_dtype].itemsize == 2 and per_thread == 2 and not residual


def norm_stash_bytes(threads: int, per_thread: int) -> int:
    """Dynamic shared memory of the weight-stashing kernel: each thread's lanes as float32."""
    return threads * per_thread * (LANE_BYTES // 2) * 4


def norm_threads(lanes: int, per_thread: int) -> int:
    """Threads of an RMSNorm block for rows of ``lanes`` 32-byte lanes, ``per_thread`` lanes a
    thread: the row's warps of lanes divided among whole warps of threads."""
    assert 0 < lanes <= MAX_NORM_LANES and per_thread in NORM_LANE_CHOICES
    return -(-lanes // (WARP * per_thread)) * WARP


def _loaded(expression: str, device: int, threads: int, shared: int = 0) -> tuple[int, int, int]:
    """(function handle, resident blocks per SM, SMs) of an instantiation on ``device``."""
    function = _jit.get_function(SOURCE, expression, device)
    with _jit.current_device(device):  # RawKernel.kernel is the current device's function
        handle = function.kernel.ptr
        if shared > STATIC_SHARED_LIMIT:
            allow_shared(handle, shared)
        return (handle, *resident_blocks(handle, expression, threads, device, shared))


def _prepare_norm(request, key: KernelKey, device: int, tuning: Tuning) -> Launch:
    """The RMSNorm grid: norm_blocks() blocks of norm_threads(), walking the rows (all
    batches) with a stride of the grid, one or two lanes a thread."""
    geometry = request.output
    lanes = geometry.groups * key.lanes_per_group
    rows = geometry.batches * geometry.rows

    def loaded(per_thread: int, shared: int = 0) -> tuple[int, int, int, int]:
        expression = dataclasses.replace(
            key, norm_lanes=per_thread, norm_stash=shared > 0
        ).name_expression
        threads = norm_threads(lanes, per_thread)
        return (threads, *_loaded(expression, device, threads, shared))

    one_lane = loaded(1)
    unrounded_sum = request.norm_rounding == "twice_unrounded_sum"
    per_thread = norm_lanes(rows, *one_lane[2:], request.residual, tuning, unrounded_sum)
    threads, handle, per_sm, sms = one_lane if per_thread == 1 else loaded(per_thread)
    blocks = norm_blocks(rows, request.residual, per_sm, sms, per_thread, tuning)
    shared = 0
    stash = tuning.norm_stash and norm_stashes(key.input_dtype, per_thread, request.residual)
    if blocks < rows and stash:
        shared = norm_stash_bytes(threads, per_thread)
        threads, handle, per_sm, sms = loaded(per_thread, shared)
        blocks = norm_blocks(rows, request.residual, per_sm, sms, per_thread, tuning)
    params = make_params(request, tuning)
    return Launch(
        handle, (blocks, 1, 1), (threads, 1, 1), params, pdl_supported(device, tuning.pdl), shared
    )


# the persistent (masked) grid -------------------------------------------------------------------


def fused_takes_persistent(
    request, one_pass_blocks: int, per_sm: int, sms: int, tuning: Tuning
) -> bool:
    """Whether a plain fused launch takes the persistent kernel (every row real) instead of
    its one-pass grid: past a few waves, one copy of bfloat16's 8 KB band table per resident
    block beats one per 16 groups. Only for bfloat16 gates (the float16 and float32 gates'
    one-pass grid was 3-19% faster at every size measured), without padding rows (that kernel
    writes none) and within its scan's limit."""
    geometry = request.output
    if (request.input_dtype != "bfloat16" or geometry.grid_rows != geometry.rows
            or geometry.batches > MAX_EXPERTS):  # fmt: skip
        return False
    return one_pass_blocks > tuning.persistent_fused_waves * per_sm * sms


def _masked_grid(key: KernelKey, device: int) -> tuple[int, int, int]:
    """(function handle, resident blocks per SM, SMs) of the persistent kernel ``key``."""
    return _loaded(key.name_expression, device, MASKED_THREADS)


def _prepare_masked(request, key: KernelKey, device: int, tuning: Tuning) -> Launch:
    """The persistent grid: as many blocks as the worst case (every row of every expert)
    needs, at most one resident wave, or fewer for an ``expected_m`` hint. The grid is fixed
    when the plan is made, so a CUDA graph replays it with any counts."""
    geometry = request.output
    handle, per_sm, sms = _masked_grid(key, device)
    rows = tile_rows(geometry.layout, key.lanes_per_group)
    expected = geometry.rows if request.expected_m is None else request.expected_m
    slots = geometry.batches * -(-max(1, expected) // rows) * rows * geometry.groups
    blocks = max(1, min(-(-slots * key.lanes_per_group // MASKED_THREADS), per_sm * sms))
    params = make_params(request, tuning)
    return Launch(
        handle, (blocks, 1, 1), (MASKED_THREADS, 1, 1), params, pdl_supported(device, tuning.pdl)
    )


# Params and the plan ----------------------------------------------------------------------------


def make_params(request, tuning: Tuning, **pointers):
    """The Params of ``request`` (a ``_request.Request``); pointers default to zero."""
    geometry = request.output
    fmt = request.fmt
    s_batch, s_row, s_word = geometry.scale_byte_strides
    lanes = request.kernel_key().lanes_per_group
    rows = tile_rows(geometry.layout, lanes)
    batch_tiles = -(-geometry.rows // rows)
    tile_magic, tile_shift = divisor(geometry.groups * rows)
    batch_magic, batch_shift = divisor(max(1, batch_tiles))
    slots = one_pass_slots(geometry, rows)
    block_slots = one_pass_threads(tuning) // lanes
    assert 0 < block_slots < 256, "Params.block_slots is one byte"
    narrow = strides_fit_i32(request)
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
        x_batch_stride32=request.x_batch_stride if narrow else 0,
        x_row_stride32=request.x_row_stride if narrow else 0,
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
        eps=_scale_eps(request),
        fmax=fmt.fmax,
        inverse_fmax=fmt.inverse_fmax,
        bf16_arithmetic=1 if request.arithmetic == "bfloat16" else 0,
        norm_rounding=NORM_ROUNDINGS.index(request.norm_rounding),
        clamp_limit=_clamp_limit(request),
        ue8m0_floor=UE8M0_FLOOR,
        nonfinite_codes=fmt.nonfinite_word,
        output=fmt.kernel_code,
        x_up_offset=request.x_up_offset,
        masked_i64=1 if request.masked == "int64" else 0,
        r_batch_stride=request.r_batch_stride,
        r_row_stride=request.r_row_stride,
        eps_norm=request.eps_norm,
        floor_emax=request.fmt.emax_elem if request.scale_rule == "floor" else 0,
        **pointers,
    )


def _scale_eps(request) -> float:
    """eps as the kernel applies it: arithmetic='bfloat16' floors amax in bfloat16,
    'unfloored' not at all."""
    if request.arithmetic == "bfloat16":
        return float(np.float32(request.eps).astype(INPUT_TYPES["bfloat16"].numpy_dtype))
    return 0.0 if request.arithmetic == "unfloored" else request.eps


def _clamp_limit(request) -> float:
    """The gated input's clamp in x's dtype (activation.clamp_limit_value); +Inf without one."""
    if request.clamp_limit is None:
        return math.inf
    return float(activation.clamp_limit_value(request.clamp_limit, request.input_dtype))


def prepare(request, device: int, tuning: Tuning) -> list[Launch]:
    """The launches of ``request`` on ``device``, in order; pointers are given per call."""
    if request.fp4 is not None:
        return _prepare_fp4(request, device, tuning)
    key = request.kernel_key()
    if key.masked:
        return [_prepare_masked(request, key, device, tuning)]
    if key.norm:
        return [_prepare_norm(request, key, device, tuning)]
    return [_prepare_groups(request, key, device, tuning)]


def _prepare_groups(request, key: KernelKey, device: int, tuning: Tuning) -> Launch:
    """The launch of plain or SiLU-mul input.

    Two paths for plain and SiLU-mul input. The one-pass kernel numbers the group slots of
    every real row over a 1-D grid of ``one_pass_threads`` blocks; it takes every grid of the
    instantiations that fit six blocks an SM and grids up to ``one_pass_wave_limit`` waves of
    the others. Larger grids take the row loop, a few resident waves of blocks of whole row
    tiles whose prefetch hides latency better. Large bfloat16 fused grids take the persistent
    kernel.
    """
    geometry = request.output
    lanes = key.lanes_per_group
    rows = tile_rows(geometry.layout, lanes)
    slots = one_pass_slots(geometry, rows)
    pdl = pdl_supported(device, tuning.pdl)
    if slots < 2**31 and strides_fit_i32(request):
        threads = one_pass_threads(tuning)
        flat = flat_slots(request, rows)
        one_pass = dataclasses.replace(key, one_pass=True, flat=flat)
        handle, per_sm, sms = _loaded(one_pass.name_expression, device, threads)
        blocks = -(-slots * lanes // threads)
        fused = key.activation is not None
        if fused and fused_takes_persistent(request, blocks, per_sm, sms, tuning):
            persistent = dataclasses.replace(key, masked=True, one_pass=True)
            return _prepare_masked(request, persistent, device, tuning)
        limit = math.inf if fused else one_pass_wave_limit(per_sm, threads, tuning)
        if blocks <= limit * per_sm * sms:
            params = make_params(request, tuning)
            params.table_by_threads = blocks > tuning.silu_table_waves * per_sm * sms
            six = dataclasses.replace(one_pass, blocks_per_sm=SILU_SIX_BLOCKS)
            if has_six_blocks(one_pass) and blocks > tuning.silu_six_blocks_waves * per_sm * sms:
                handle = _loaded(six.name_expression, device, threads)[0]
            return Launch(handle, (blocks, 1, 1), (threads, 1, 1), params, pdl)
    assert key.activation is None, "make_request refuses fused grids past 31 bits"
    threads, blocks_per_row = block_shape(geometry.groups, lanes, rows)
    loop = dataclasses.replace(key, one_pass=False)
    handle, per_sm, sms = _loaded(loop.name_expression, device, threads)
    tiles = -(-geometry.batches * geometry.grid_rows // rows)  # row tiles over all batches
    row_blocks = min(tiles, MAX_GRID_X)
    waves = row_loop_waves(per_sm, tuning)
    if waves > 0:
        row_blocks = min(tiles, max(1, int(waves * per_sm * sms) // blocks_per_row))
    grid = (row_blocks, blocks_per_row, 1)
    return Launch(handle, grid, (threads, 1, 1), make_params(request, tuning), pdl)


# FP4 (NVFP4, MXFP4) ------------------------------------------------------------------------------

FP4_THREADS = 128  # quantize_fp4's block, as the one-pass grid's
NVFP4_AMAX_THREADS, NVFP4_AMAX_MAX_BLOCKS = 256, 2048


def _fp4_params(request, for_amax: bool, **fields):
    """Params of the FP4 kernels: one slot a group (quantize) or a lane (NVFP4's amax)."""
    geometry = request.output
    fp4 = request.fp4
    lanes = request.kernel_key().lanes_per_group
    per_row = geometry.groups * (lanes if for_amax else 1)
    magic, shift = divisor(per_row)
    rows_magic, rows_shift = divisor(max(1, geometry.rows))
    s_batch, s_row, s_word = geometry.scale_byte_strides
    return params_type()(
        x_batch_stride=request.x_batch_stride, x_row_stride=request.x_row_stride,
        q_batch_stride=geometry.rows * geometry.k // 2, rows=geometry.rows,
        grid_rows=geometry.scale_rows, batches=geometry.batches, groups_per_row=geometry.groups,
        slots=geometry.batches * geometry.rows * per_row, tile_slots=per_row,
        tile_slots_magic=magic, batch_tiles=geometry.rows, batch_tiles_magic=rows_magic,
        tile_slots_shift=shift, batch_tiles_shift=rows_shift, s_batch_stride=s_batch,
        s_row_stride=s_row, s_word_stride=s_word, q_rows=geometry.rows,
        scale_rows=geometry.scale_rows, eps=request.eps, fmax=fp4.fmax,
        ue8m0_floor=UE8M0_FLOOR, floor_emax=fp4.emax_elem if request.scale_rule == "floor" else 0,
        **fields,
    )  # fmt: skip


def _prepare_fp4(request, device: int, tuning: Tuning) -> list[Launch]:
    """quantize_fp4 over one slot a group, after nvfp4_amax where NVFP4's global scale is
    computed (into a zeroed scratch word the call provides as global_ptr)."""
    pdl = pdl_supported(device, tuning.pdl)
    lanes = request.kernel_key().lanes_per_group
    launches = []
    if request.nvfp4 and request.global_mode == 2:  # computed: the amax pass first
        params = _fp4_params(request, True)
        blocks = max(1, min(-(-params.slots // NVFP4_AMAX_THREADS), NVFP4_AMAX_MAX_BLOCKS))
        handle = _loaded(nvfp4_amax_name(request.input_dtype), device, NVFP4_AMAX_THREADS)[0]
        launches.append(Launch(handle, (blocks, 1, 1), (NVFP4_AMAX_THREADS, 1, 1), params, pdl))
    params = _fp4_params(request, False, global_mode=request.global_mode,
                         global_scale=request.global_value)  # fmt: skip
    blocks = -(-params.slots * lanes // FP4_THREADS)
    handle = _loaded(request.kernel_key().name_expression, device, FP4_THREADS)[0]
    launches.append(Launch(handle, (blocks, 1, 1), (FP4_THREADS, 1, 1), params, pdl))
    return launches


def warmup_keys(input_dtype: str, options) -> list[KernelKey]:
    """The instantiations a call of ``options`` on aligned ``input_dtype`` input may take."""
    arithmetic = compiled_arithmetic(options.arithmetic)
    if options.fp4 is not None:
        return [fp4_key(input_dtype, options.fp4, options.layout, arithmetic)]
    fmt, scale, layout = options.fmt, options.scale, options.layout
    key = KernelKey(input_dtype, options.group_size, fmt.kernel_format, scale.name,
                    layout.kernel_trait, vec16=True, activation=options.mode.name,
                    arithmetic=arithmetic)  # fmt: skip
    if options.mode.name is not None:  # the fused modes have the one-pass kernel only
        return [dataclasses.replace(key, one_pass=True)]
    # every path: one pass for contiguous rows (the load linear in the slot, where the layout
    # has one-row tiles) and through x's strides, and the row loop
    keys = [dataclasses.replace(key, one_pass=one_pass) for one_pass in (True, False)]
    if tile_rows(options.layout, key.lanes_per_group) == 1:
        keys.insert(0, dataclasses.replace(key, one_pass=True, flat=True))
    return keys


# tiles: weight blocks, the column-wise orientation and "both" (kernels/tile.cuh) --------------

TILE_FORMAT = "e4m3"  # the one format the tile kernels are instantiated for
# its own encoding trait, not the float8 binary's: the tiles have no branch on Params.output
TILE_OUTPUT_TRAIT = "fgq::kE4M3"
# how quantize_weight_blocks stores a block's scale (WeightLayoutKind)
WEIGHT_LAYOUT_CODES = {"row": 0, "col": 0, "bytes": 1, "packed": 2}
# the column kernel's (scale, address function) pairs: float words, UE8M0 in them, packed
COLUMN_LAYOUTS = (("float32", "fgq::kFloatWords"), ("ue8m0", "fgq::kFloatWords"),
                  ("ue8m0", "fgq::kPackedExponents"))  # fmt: skip


def _tile_arguments(arithmetic: str | None, size: int) -> tuple[str, ...]:
    """A tile kernel's trailing kArith and tile size, left out where they are the defaults."""
    if size != TILE:
        return (ARITHMETIC_TRAITS[arithmetic] if arithmetic else "fgq::kDefaultArith", str(size))
    return () if arithmetic is None else (ARITHMETIC_TRAITS[arithmetic],)


def weight_name(input_dtype: str, scale: str, arithmetic: str | None = None,
                block: int = TILE) -> str:  # fmt: skip
    """The quantize_weight_blocks instantiation of an input type and scale kind, a compiled
    arithmetic (compiled_arithmetic) or None, and the block's side (128 or 256)."""
    return _template("quantize_weight_blocks", INPUT_TYPES[input_dtype].kernel_trait,
                     TILE_OUTPUT_TRAIT, SCALE_FORMATS[scale].kernel_trait,
                     *_tile_arguments(arithmetic, block))  # fmt: skip


def columns_name(input_dtype: str, scale: str, layout_trait: str,
                 arithmetic: str | None = None, tokens: int = TILE) -> str:  # fmt: skip
    """The quantize_columns instantiation of an input type, scale kind and address function,
    a compiled arithmetic (compiled_arithmetic) or None, and the token group (128 or 256)."""
    return _template("quantize_columns", INPUT_TYPES[input_dtype].kernel_trait,
                     TILE_OUTPUT_TRAIT, SCALE_FORMATS[scale].kernel_trait,
                     layout_trait, *_tile_arguments(arithmetic, tokens))  # fmt: skip


# section 3c's arithmetics of the tiles: DeepGEMM's ("reciprocal") and torchao's ("multiplier")
# weight blocks, and torchao's columns ("multiplier"), float scales in float words
WEIGHT_ARITHMETICS = (RECIPROCAL, MULTIPLIER)
COLUMN_ARITHMETICS = (MULTIPLIER,)


def tile_name_expressions() -> list[str]:
    """Every tile instantiation, for each tile size: input types x scale kinds for weights (the
    layout is a run-time store), and x the three (scale, address function) pairs for columns;
    then section 3c's arithmetics (float scales)."""
    names = []
    for n in WEIGHT_BLOCKS:  # a weight block's side, a column tile's tokens
        names += [weight_name(i, s, None, n) for i in INPUT_TYPES for s in ("float32", "ue8m0")]
        names += [columns_name(i, s, t, None, n) for i in INPUT_TYPES for s, t in COLUMN_LAYOUTS]
        names += [weight_name(i, "float32", a, n) for i in INPUT_TYPES for a in WEIGHT_ARITHMETICS]
        names += [columns_name(i, "float32", "fgq::kFloatWords", a, n)
                  for i in INPUT_TYPES for a in COLUMN_ARITHMETICS]  # fmt: skip
    return names


def _common_tile_params(options, x_aligned: bool) -> dict:
    """The Params fields of a tile launch that come from the format and the options."""
    fmt = options.fmt
    return dict(eps=options.eps, fmax=fmt.fmax, inverse_fmax=fmt.inverse_fmax,
                ue8m0_floor=UE8M0_FLOOR, nonfinite_codes=fmt.nonfinite_word,
                floor_emax=fmt.emax_elem if options.scale_rule == "floor" else 0,
                x_aligned=int(x_aligned))  # fmt: skip


def weight_params(request, x_aligned: bool):
    """The Params of quantize_weight_blocks for a ``_request.WeightRequest``."""
    g, options = request.output, request.options
    scales = g.scales
    batch, row, word = scales.scale_byte_strides
    if g.layout == "bytes":  # one byte a block, row-major: the float layout's strides in bytes
        batch, row, word = (v // 4 for v in (batch, row, word))
    return params_type()(
        rows=g.n, cols=g.k, groups_per_row=g.blocks[1], batches=g.batches,
        x_batch_stride=request.batch_stride, x_row_stride=request.row_stride,
        q_batch_stride=g.n * g.k, s_batch_stride=batch, s_row_stride=row, s_word_stride=word,
        scale_rows=scales.scale_rows, weight_layout=WEIGHT_LAYOUT_CODES[g.layout],
        **_common_tile_params(options, x_aligned),
    )  # fmt: skip


def prepare_weight(request, x_aligned: bool, device: int, tuning: Tuning) -> Launch:
    """quantize_weight_blocks over a (kb, nb, E) grid; a ``_request.WeightRequest``."""
    g, options = request.output, request.options
    nb, kb = g.blocks
    params = weight_params(request, x_aligned)
    name = weight_name(request.input_dtype, options.scale.name,
                       compiled_arithmetic(options.arithmetic), g.block)  # fmt: skip
    handle = _loaded(name, device, TILE_THREADS)[0]
    pdl = pdl_supported(device, tuning.pdl)
    return Launch(handle, (kb, nb, g.batches), (TILE_THREADS, 1, 1), params, pdl)


def columns_params(request, tuning: Tuning):
    """The Params of quantize_columns: the row-wise result's (make_params) and the t_* fields
    of the column-wise one's scales."""
    params = make_params(request, tuning)
    t = request.transposed
    _, t_row, t_word = t.scale_byte_strides
    params.cols, params.x_aligned = request.input_shape[1], int(request.x_aligned)
    params.t_row_stride, params.t_word_stride = t_row, t_word
    params.t_groups, params.t_scale_rows = t.groups, t.scale_rows
    return params


def prepare_columns(request, device: int, tuning: Tuning) -> Launch:
    """quantize_columns over a (K / 128, ceil(M / G)) grid, G = 128 or 256 tokens: the row-wise
    Params of the request (used where q is given: "both") and the column-wise result's t_*
    fields."""
    m, k = request.input_shape
    tokens = request.group_size
    params = columns_params(request, tuning)
    name = columns_name(request.input_dtype, request.scale.name, request.layout.kernel_trait,
                        compiled_arithmetic(request.arithmetic), tokens)  # fmt: skip
    handle = _loaded(name, device, TILE_THREADS)[0]
    grid = (k // TILE, -(-m // tokens), 1)
    return Launch(handle, grid, (TILE_THREADS, 1, 1), params, pdl_supported(device, tuning.pdl))
