"""Kernel key, grid and block arithmetic, argument packing for kernels/quantize.cu."""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass

from . import _jit
from ._layout import COLUMN_LAYOUTS, PACKED_LAYOUTS, TMA_LAYOUTS, Geometry

SOURCE = "quantize.cu"
LANE_BYTES = 32  # input bytes held by one lane: two 16-byte loads
MAX_THREADS_PER_BLOCK = 256  # kMaxThreads in kernels/quantize.cu
WARP = 32
MAX_GRID_X = 2**31 - 1
MAX_GRID_Y = 65535
MAX_TILE_ROWS = 8  # eight float scales fill a 32-byte sector
# Resident waves of blocks the grid holds; each block walks rows with a stride of the grid.
# Unset: waves_for() picks by occupancy. 0 launches one block column per row tile. A tuning knob,
# measured in docs/perf.md.
_WAVES_ENV = os.environ.get("FP8_GROUP_QUANT_WAVES")
WAVES = float(_WAVES_ENV) if _WAVES_ENV else None

# template codes, as enums in kernels/common.cuh
_INPUT_CODE = {"bfloat16": "fgq::kBF16", "float16": "fgq::kF16", "float32": "fgq::kF32"}
_INPUT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_OUTPUT_CODE = {"e4m3": "fgq::kE4M3", "e5m2": "fgq::kE5M2", "int8": "fgq::kInt8"}
_SCALE_CODE = {
    "float32": "fgq::kFloatScale",
    "ue8m0": "fgq::kPow2Scale",
    "packed": "fgq::kPackedUE8M0",
}


@dataclass(frozen=True)
class KernelKey:
    """Everything that changes the binary. Shapes are launch arguments, not part of the key."""

    input_dtype: str  # bfloat16 | float16 | float32
    group_size: int
    output: str  # e4m3 | e5m2 | int8
    scale_kind: str  # float32 | ue8m0 (power-of-two floats) | packed (UE8M0 bytes in int32)
    vec16: bool  # input base and strides 16-byte aligned: vector loads

    @property
    def lanes_per_group(self) -> int:
        return self.group_size * _INPUT_BYTES[self.input_dtype] // LANE_BYTES

    @property
    def values_per_lane(self) -> int:
        return LANE_BYTES // _INPUT_BYTES[self.input_dtype]

    @property
    def name_expression(self) -> str:
        return (
            f"fgq::quantize_groups<{_INPUT_CODE[self.input_dtype]}, {self.group_size}, "
            f"{_OUTPUT_CODE[self.output]}, {_SCALE_CODE[self.scale_kind]}, "
            f"{'true' if self.vec16 else 'false'}>"
        )


def scale_kind(scale: str, layout: str) -> str:
    return "packed" if layout in PACKED_LAYOUTS else scale


def all_kernel_keys() -> list[KernelKey]:
    """Every instantiation the library can launch."""
    return [
        KernelKey(i, g, o, s, v)
        for i in _INPUT_CODE
        for g in (32, 64, 128, 256)
        for o in _OUTPUT_CODE
        for s in _SCALE_CODE
        for v in (True, False)
    ]


def tile_rows(layout: str, lanes: int) -> int:
    """Consecutive rows a block covers: one, or for the column-major float layouts enough that
    a warp stores a contiguous run of scales (eight: one 32-byte sector) rather than one
    scattered word per group. A power of two; a warp never spans more than one group column.

    NOTES: run 6 had G = 32 col / col_tma at 1.24-1.46x the baseline's time per byte against
    1.01-1.03x for the row layouts: four times the groups, each a separate 4-byte store.
    """
    if layout not in COLUMN_LAYOUTS:
        return 1
    return max(1, min(MAX_TILE_ROWS, WARP // lanes))


def block_shape(groups: int, lanes: int, rows: int = 1) -> tuple[int, int]:
    """(threads per block, blocks per row tile) for tiles of ``rows`` rows of ``groups`` groups.

    NOTES: a row tile is split into the fewest blocks of at most MAX_THREADS_PER_BLOCK threads,
    groups spread evenly (ceil division) and rounded up to whole warps; the kernel drops the
    surplus groups of the last block by a bounds check.
    """
    blocks = -(-groups * lanes * rows // MAX_THREADS_PER_BLOCK)
    groups_per_block = -(-groups // blocks)
    groups_per_warp = max(1, WARP // (lanes * rows))
    groups_per_block = -(-groups_per_block // groups_per_warp) * groups_per_warp
    return groups_per_block * lanes * rows, -(-groups // groups_per_block)


def grid_limits_error(geometry: Geometry, itemsize: int) -> str | None:
    """Why ``geometry`` cannot be launched with ``itemsize``-byte input, or None."""
    total_rows = geometry.batches * geometry.grid_rows
    if total_rows >= 2**31:
        return f"x: {total_rows} rows (batches included) exceed the 2**31 - 1 the kernel indexes"
    lanes = geometry.group_size * itemsize // LANE_BYTES
    rows = tile_rows(geometry.layout, lanes)
    threads, blocks_per_row = block_shape(geometry.groups, lanes, rows)
    if blocks_per_row > MAX_GRID_Y:
        return f"x: K={geometry.k} needs {blocks_per_row} blocks per row, over {MAX_GRID_Y}"
    return None


_resident: dict[tuple[int, str, int], tuple[int, int]] = {}


def resident_blocks(handle: int, name: str, threads: int, device: int) -> tuple[int, int]:
    """(blocks per SM, SMs): how many blocks of ``threads`` threads of the kernel ``handle`` fit.

    NOTES: the driver's occupancy calculator, which knows that a block's warps are spread over
    the SM's four sub-partitions (a 7-warp block fits 5 times, not the 6 a plain register count
    suggests); a one-wave grid sized from the plain count ran 1.2 waves and 25% slower.
    """
    key = (device, name, threads)
    fit = _resident.get(key)
    if fit is None:
        import cupy
        from cupy_backends.cuda.api import driver

        sms = cupy.cuda.runtime.getDeviceProperties(device)["multiProcessorCount"]
        per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(handle, threads, 0)
        fit = _resident[key] = (max(1, per_sm), sms)
    return fit


def waves_for(blocks_per_sm: int) -> float:
    """Resident waves of blocks a launch's grid holds (FP8_GROUP_QUANT_WAVES overrides).

    NOTES: measured on the H200 (docs/perf.md, runs 5-9), K = 7168: kernels that fit six blocks
    per SM run best with eight waves of short-lived blocks (M = 16384: 85.7 us against 94.0 with
    one wave, whose fixed share of 41 rows per block ended unevenly); kernels that fit five (the
    48-register instantiations) run best with one (M = 8192: 45.0 us against 46.9 with eight).
    """
    if WAVES is not None:
        return WAVES
    return 8.0 if blocks_per_sm >= 6 else 1.0


class Launch:
    """One instantiation with its grid and packed arguments, for a fixed geometry.

    Only the three pointers change between calls; ``launch`` writes them into the prepacked
    argument block and calls cuLaunchKernel directly, skipping CuPy's per-call argument packing.
    """

    # argument types, in the order of quantize_groups' parameters
    _ARG_TYPES = (
        ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,  # x, q, scales
        ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_int32,  # rows .. groups
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,  # x batch, x row, q batch strides
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,  # scale strides
        ctypes.c_int32, ctypes.c_int32, ctypes.c_float,  # pad_q, pad_scales, eps
        ctypes.c_int32,  # tile_rows_log2
    )  # fmt: skip

    def __init__(self, handle: int, grid, block, values):
        from cupy_backends.cuda.api import driver

        self.handle = handle
        self.grid = grid
        self.block = block
        # the three pointers share one array, written per call; the rest are fixed
        self._pointer_block = (ctypes.c_uint64 * 3)()
        self._args = [
            kind(value) for kind, value in zip(self._ARG_TYPES[3:], values[3:], strict=True)
        ]
        base = ctypes.addressof(self._pointer_block)
        addresses = [base, base + 8, base + 16] + [ctypes.addressof(a) for a in self._args]
        self._pointers = (ctypes.c_void_p * len(addresses))(*addresses)
        self._launch_args = (handle, *grid, *block, 0)
        self._pointers_address = ctypes.addressof(self._pointers)
        self._launch_kernel = driver.launchKernel
        self._lock = threading.Lock()

    def launch(self, x_ptr: int, q_ptr: int, scale_ptr: int, stream: int) -> None:
        block = self._pointer_block
        with self._lock:  # the argument block is shared: fill and launch atomically
            block[0], block[1], block[2] = x_ptr, q_ptr, scale_ptr
            self._launch_kernel(*self._launch_args, stream, self._pointers_address, 0)


def prepare(
    key: KernelKey,
    geometry: Geometry,
    device: int,
    x_batch_stride: int,
    x_row_stride: int,
    eps: float,
) -> Launch:
    """The launch of ``key`` over ``geometry`` on ``device``; pointers are given per call."""
    rows = tile_rows(geometry.layout, key.lanes_per_group)
    threads, blocks_per_row = block_shape(geometry.groups, key.lanes_per_group, rows)
    function = _jit.get_function(SOURCE, key.name_expression, device)
    tiles = -(-geometry.batches * geometry.grid_rows // rows)
    # NOTES: a few waves of resident blocks (waves_for); each walks tiles, prefetching the next
    row_blocks = min(tiles, MAX_GRID_X)
    with _jit.current_device(device):  # RawKernel.kernel is the function of the current device
        handle = function.kernel.ptr
        per_sm, sms = resident_blocks(handle, key.name_expression, threads, device)
        waves = waves_for(per_sm)
        if waves > 0:
            capacity = int(waves * per_sm * sms)
            row_blocks = min(tiles, max(1, capacity // blocks_per_row))
    s_batch, s_row, s_column = geometry.scale_kernel_strides
    values = (
        0, 0, 0,
        geometry.rows, geometry.grid_rows, geometry.batches, geometry.groups,
        x_batch_stride, x_row_stride, geometry.q_rows * geometry.k,
        s_batch, s_row, s_column,
        int(geometry.pad_rows), int(geometry.layout in TMA_LAYOUTS), eps, rows.bit_length() - 1,
    )  # fmt: skip
    return Launch(handle, (row_blocks, blocks_per_row, 1), (threads, 1, 1), values)


DEFAULT_KEY = KernelKey("bfloat16", 128, "e4m3", "packed", True)
