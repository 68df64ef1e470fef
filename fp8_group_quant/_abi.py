"""What Python and the kernels must agree on, defined once, here: the constants and the
``Params`` struct every kernel takes by value.

The kernels include ``abi.cuh``; there is no such file in ``kernels/``: ``header()`` writes its
text, and ``_jit`` compiles it in wherever the sources include it. ``params_type()`` is the
ctypes mirror of the same field list, so the two cannot drift apart.
"""

from __future__ import annotations

import ctypes
from functools import cache

WARP = 32
LANE_WORDS = 8  # 32-bit words of input a lane holds: 32 bytes
LANE_BYTES = 4 * LANE_WORDS
MAX_THREADS = 256  # threads of a quantize_groups block (its __launch_bounds__)
MAX_EXPERTS = 1024  # batches of the masked layout: its kernel scans the counts in shared memory
MASKED_THREADS = 128  # threads of a persistent (masked) block
MASKED_UNROLL = 3  # persistent kernel: slots a thread loads together, plain input
MASKED_UNROLL_SILU = 2  # the same with SiLU-mul (gate and up: 64 bytes a slot)
MAX_NORM_LANES = 1024  # an RMSNorm row: at most 32 warps of 32 lanes (K <= 16384 for 16-bit input)
TILE = 128  # rows and columns of a tile: a weight block, a token group (kernels/tile.cuh)
TILE_THREADS = 256  # threads of a tile block
# norm_rounding's values (docs/spec.md, section 2b); Params.norm_rounding is the index
NORM_ROUNDINGS = ("once", "twice", "twice_unrounded_sum")

CONSTANTS = {
    "kLaneWords": LANE_WORDS,
    "kMaxThreads": MAX_THREADS,
    "kMaxExperts": MAX_EXPERTS,
    "kMaskedThreads": MASKED_THREADS,
    "kMaskedUnroll": MASKED_UNROLL,
    "kMaskedUnrollSilu": MASKED_UNROLL_SILU,
    "kMaxNormLanes": MAX_NORM_LANES,
    "kNormTwiceUnroundedSum": NORM_ROUNDINGS.index("twice_unrounded_sum"),
}

# NOTES: written as enumerators, not constexpr ints: an int the code takes by reference (max,
# min) becomes a global in every module's PTX
ENUMERATORS = {"kTile": TILE, "kTileThreads": TILE_THREADS}

_C_TYPES = {  # the C spelling of each field type, and its ctypes mirror
    "ptr": ("const void*", ctypes.c_uint64),
    "i64": ("long long", ctypes.c_int64),
    "u32": ("unsigned int", ctypes.c_uint32),
    "u8": ("unsigned char", ctypes.c_uint8),
    "int": ("int", ctypes.c_int32),
    "float": ("float", ctypes.c_float),
}

# NOTES: the order is measured, not cosmetic. The first 48 bytes (one 64-byte line of the
# constant cache on sm_90) hold all that the one-pass kernel reads before its load; every further
# line read before it cost 0.03-0.07 us at small M. Hence the 32-bit copies of x's strides and the
# one-byte shifts. Fields the plain kernel reads after its load come before x_up_offset, in lines
# the prologue already touched (docs/perf.md, "Kernel arguments").
PARAMS = (
    ("ptr", "x", "input values"),
    ("int", "x_row_stride32", "one pass: x_row_stride when it fits 32 bits"),
    ("int", "x_batch_stride32", "one pass: x_batch_stride when it fits 32 bits"),
    ("u32", "slots", "one pass: group slots, batches * batch_tiles * tile_slots"),
    ("u32", "tile_slots", "group slots of a row tile, groups_per_row << tile_rows_log2"),
    ("u32", "tile_slots_magic", "n / tile_slots by divide_u31"),
    ("u32", "batch_tiles", "row tiles a batch, ceil(rows / tile rows)"),
    ("u32", "batch_tiles_magic", "n / batch_tiles by divide_u31"),
    ("u32", "rows", "real rows a batch (M)"),
    ("u8", "tile_slots_shift", "tile_slots_magic's shift"),
    ("u8", "batch_tiles_shift", "batch_tiles_magic's shift"),
    ("u8", "tile_rows_log2", "a row tile holds 2^tile_rows_log2 consecutive rows"),
    ("u8", "block_slots", "one pass: group slots a block (its threads / lanes a group)"),
    ("int", "groups_per_row", "K / G"),
    ("i64", "x_batch_stride", "input elements between batches"),
    ("i64", "x_row_stride", "input elements between rows"),
    ("ptr", "q", "codes"),
    ("i64", "q_batch_stride", "bytes of q between batches (rows are K bytes apart)"),
    ("u32", "grid_rows", "rows a batch the kernel visits; [rows, grid_rows) are padding"),
    ("u32", "batches", "batches (B)"),
    ("float", "eps", "floor of the group maximum"),
    ("ptr", "scales", "scale storage, placed by the layout's address function"),
    ("i64", "s_batch_stride", "bytes of scale storage between batches"),
    ("i64", "s_row_stride", "bytes of scale storage between rows (blocked: row tiles)"),
    ("i64", "s_word_stride", "bytes between a row's scale words (blocked: group tiles)"),
    ("u32", "q_rows", "rows of q storage a batch: padding rows below it are zeroed"),
    ("u32", "scale_rows", "rows of scale storage a batch: padding rows below it are zeroed"),
    ("float", "fmax", "the output format's clamp"),
    ("float", "inverse_fmax", "RN(1 / fmax)"),
    ("float", "ue8m0_floor", "floor of amax / fmax before the power-of-two ceiling"),
    ("u32", "nonfinite_codes", "codes of +NaN, -NaN, +Inf, -Inf, a byte each from the lowest"),
    ("u32", "floor_emax", "scale_rule='floor': the format's emax_elem; 0 for 'rceil'"),
    ("u32", "bf16_arithmetic", "arithmetic='bfloat16': scale steps rounded to bfloat16"),
    ("u32", "output", "the format's OutputType code: the kFloat8 binary branches on it"),
    ("u32", "masked_i64", "masked layout: 1 when masked_m holds int64 counts"),
    ("i64", "x_up_offset", "SiLU-mul: elements from a gate value to its up value"),
    ("u32", "table_by_threads", "SiLU-mul, one pass: every thread copies part of the table"),
    ("float", "clamp_limit", "gated input: gate <= it, |up| <= it (x's dtype); +Inf without"),
    ("ptr", "masked_m", "masked layout: rows of each batch to quantize, or 0"),
    ("ptr", "weight", "RMSNorm: the weight [K], x's type"),
    ("ptr", "residual", "add-RMSNorm: x + residual is written back here; 0 without"),
    ("i64", "r_batch_stride", "add-RMSNorm: residual elements between batches"),
    ("i64", "r_row_stride", "add-RMSNorm: residual elements between rows"),
    ("float", "eps_norm", "RMSNorm: added to the mean square"),
    ("u32", "norm_rounding", "RMSNorm: NORM_ROUNDINGS' index; > 0: x * r rounded to x's type"),
    ("u32", "global_mode", "NVFP4: global_scale (0), *global_ptr (1), from amax (2)"),
    ("float", "global_scale", "NVFP4: the global scale, in mode 0"),
    ("ptr", "global_ptr", "NVFP4: see global_mode (nvfp4_amax writes amax there)"),
    ("ptr", "global_out", "NVFP4, mode 2: the computed global scale is written here"),
    ("i64", "cols", "tiles: the input's columns (a weight's K, any size; x's K for columns)"),
    ("u32", "x_aligned", "tiles: x's base and strides 16-byte aligned (vector loads)"),
    ("u32", "weight_layout", "quantize_weight: 0 float words, 1 exponent bytes, 2 packed"),
    ("ptr", "qt", "orientation col/both: the column-wise codes [K, M]"),
    ("ptr", "scales_t", "orientation col/both: the column-wise scale storage"),
    ("i64", "t_row_stride", "column-wise scales: bytes between rows (channels)"),
    ("i64", "t_word_stride", "column-wise scales: bytes between a row's scale words"),
    ("int", "t_groups", "column-wise scales: token groups a channel, ceil(M / G)"),
    ("u32", "t_scale_rows", "column-wise scales: storage rows; [K, t_scale_rows) are zeroed"),
)
# pointers the kernels write through, typed as such in C++ (the others are const void*)
_WRITTEN = {"q": "unsigned char*", "scales": "unsigned char*", "residual": "unsigned char*",
            "global_out": "unsigned char*", "qt": "unsigned char*",
            "scales_t": "unsigned char*"}  # fmt: skip


def _c_type(kind: str, name: str) -> str:
    return _WRITTEN.get(name, _C_TYPES[kind][0])


@cache
def header() -> str:
    """The text of ``abi.cuh``: the constants and ``struct Params``, in namespace fgq."""
    lines = ["// written by fp8_group_quant/_abi.py: edit it there", "#pragma once", "",
             "namespace fgq {", ""]  # fmt: skip
    lines += [f"constexpr int {name} = {value};" for name, value in CONSTANTS.items()]
    enumerators = [f"  {name} = {value}," for name, value in ENUMERATORS.items()]
    lines += ["enum : int {", *enumerators, "};"]
    lines += ["", "struct Params {"]
    lines += [f"  {_c_type(kind, name)} {name};  // {note}" for kind, name, note in PARAMS]
    lines += ["};", "", "}  // namespace fgq", ""]
    return "\n".join(lines)


@cache
def params_type() -> type[ctypes.Structure]:
    """The ctypes mirror of ``struct Params``."""
    fields = [(name, _C_TYPES[kind][1]) for kind, name, _ in PARAMS]
    return type("Params", (ctypes.Structure,), {"_fields_": fields})
