"""Scale layouts as descriptors, and the shapes, strides and padding of one call's outputs.

A layout is one ``ScaleLayout`` row: its storage dtype, how many scales share a word, its row
alignment, its order, and its address map ``(batch, row, group) -> byte offset``. The NumPy
backend writes through ``scale_byte_offsets``, the kernel through the C++ address function the
row names (kernels/layouts.cuh) with the byte strides of ``Geometry.scale_byte_strides``, and a
caller's ``scale_out`` is checked against the same strides. All strides of arrays are in elements
of the array they describe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ._abi import TILE
from ._spec import OUTPUT_FORMATS, SCALE_FORMATS, OutputFormat, ScaleFormat


def align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class ScaleLayout:
    name: str
    dtype: str  # the storage word: "float32", "int32" holding UE8M0 bytes, or "uint8" bytes
    scales_per_word: int  # 1, or 4 UE8M0 bytes per int32 word (group g is byte g % 4)
    row_align: int  # storage rows per batch are padded to a multiple of this (a TMA box: 4)
    mn_major: bool  # consecutive rows of one word column are adjacent in storage
    kernel_trait: str  # the address function in kernels/layouts.cuh
    # NOTES: packed, packed_row and blocked share one address function (Geometry.scale_address)
    read_by: str
    swizzled: bool = False  # Blackwell's 128x4 blocked tiles (blocked_offsets), not strides
    mx_only: bool = False  # holds the scales of OCP MX element formats only (emax_elem set)
    col_align: int = 1  # storage columns per row are padded to a multiple of this

    @property
    def word_bytes(self) -> int:
        return 1 if self.dtype == "uint8" else 4

    @property
    def scale_bytes(self) -> int:
        """Bytes one scale occupies in its word."""
        return self.word_bytes // self.scales_per_word

    @property
    def needs_ue8m0(self) -> bool:
        """A word packing several scales, or a byte, holds exponent bytes only."""
        return self.scales_per_word > 1 or self.word_bytes == 1

    def words(self, groups: int) -> int:
        return align(-(-groups // self.scales_per_word), self.col_align)

    def storage_rows(self, rows: int) -> int:
        return align(rows, self.row_align)

    def word_strides(self, rows: int, groups: int) -> tuple[int, int, int]:
        """(batch, row, word) strides in words of a batch of ``rows`` rows of ``groups`` groups
        (for the blocked layout, the strides of its storage seen as a row-major matrix)."""
        storage_rows, words = self.storage_rows(rows), self.words(groups)
        if self.mn_major:
            return storage_rows * words, 1, storage_rows
        return storage_rows * words, words, 1


TMA_ROW_ALIGN = 4  # a TMA box reads 16 bytes: four float32 or int32 scales
BLOCK_ROWS, BLOCK_COLUMNS = 128, 4  # the blocked layout's tile: 128 rows by 4 groups, 512 bytes
# a test keeps LayoutName equal to LAYOUTS
LayoutName = Literal["row", "col", "col_tma", "packed", "packed_row", "packed_col", "blocked"]
ROW: LayoutName = "row"
COL: LayoutName = "col"
COL_TMA: LayoutName = "col_tma"
PACKED: LayoutName = "packed"
PACKED_ROW: LayoutName = "packed_row"
PACKED_COL: LayoutName = "packed_col"
BLOCKED: LayoutName = "blocked"
SCALE_LAYOUTS = {
    layout.name: layout
    for layout in (
        ScaleLayout(ROW, "float32", 1, 1, False, "fgq::kFloatWords",
                    "Triton/CUTLASS paths, dequantization"),
        ScaleLayout(COL, "float32", 1, 1, True, "fgq::kFloatWords", "MN-major consumers"),
        ScaleLayout(COL_TMA, "float32", 1, TMA_ROW_ALIGN, True, "fgq::kFloatWords",
                    "DeepGEMM on Hopper (SM90)"),
        ScaleLayout(PACKED, "int32", 4, TMA_ROW_ALIGN, True, "fgq::kPackedExponents",
                    "DeepGEMM on Blackwell (SM100)"),
        ScaleLayout(PACKED_ROW, "int32", 4, 1, False, "fgq::kPackedExponents",
                    "row-major packed consumers"),
        ScaleLayout(PACKED_COL, "int32", 4, 1, True, "fgq::kPackedExponents",
                    "vLLM's masked MoE scales for any T (packed, MN-major, no TMA alignment)"),
        ScaleLayout(BLOCKED, "uint8", 1, BLOCK_ROWS, False, "fgq::kBlockedExponents",
                    "Blackwell block-scaled MMA (cuBLAS, CUTLASS, FlashInfer, torch._scaled_mm)",
                    swizzled=True, col_align=BLOCK_COLUMNS, mx_only=True),
    )
}  # fmt: skip
LAYOUTS = tuple(SCALE_LAYOUTS)


def combination_error(fmt: OutputFormat, scale: ScaleFormat, layout: ScaleLayout) -> str | None:
    """Why ``layout`` cannot hold the scales of ``fmt`` with ``scale`` scales, or None: the one
    rule of which (format, scale format, layout) the backends, the kernels and tests cover."""
    if layout.needs_ue8m0 and not scale.power_of_two:
        holds = (
            "holds one UE8M0 exponent byte per scale"
            if layout.word_bytes == 1
            else "packs UE8M0 exponent bytes into int32 words"
        )
        return f"layout={layout.name!r} {holds}; it needs scale='ue8m0', got scale={scale.name!r}"
    if layout.mx_only and fmt.emax_elem is None:
        mx = ", ".join(repr(f.name) for f in OUTPUT_FORMATS.values() if f.emax_elem)
        return (
            f"layout={layout.name!r} is the scale layout of Blackwell's MX formats; it takes "
            f"dtype {mx}, got dtype={fmt.name!r}"
        )
    return None


def supported_combinations() -> list[tuple[str, str, str]]:
    """Every supported (output format, scale format, layout), by name, in registry order."""
    return [
        (fmt.name, scale.name, layout.name)
        for fmt in OUTPUT_FORMATS.values()
        for scale in SCALE_FORMATS.values()
        for layout in SCALE_LAYOUTS.values()
        if combination_error(fmt, scale, layout) is None
    ]


def blocked_offsets(rows: np.ndarray, groups: np.ndarray, columns: int) -> np.ndarray:
    """Byte offset of scale (row, group) in one batch of the blocked layout, ``columns`` groups
    a row: 128-row by 4-group tiles of 512 bytes, tile rows first; inside a tile, row r at
    (r % 32) * 16 + ((r % 128) // 32) * 4 and group g at g % 4 (docs/spec.md, section 6)."""
    tiles_across = -(-columns // BLOCK_COLUMNS)
    tile = (rows // BLOCK_ROWS) * tiles_across + groups // BLOCK_COLUMNS
    return tile * 512 + (rows % 32) * 16 + ((rows % BLOCK_ROWS) // 32) * 4 + groups % 4


def scale_layout(layout) -> ScaleLayout:
    if isinstance(layout, ScaleLayout):
        return layout
    if not isinstance(layout, str) or layout not in SCALE_LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    return SCALE_LAYOUTS[layout]


@dataclass(frozen=True)
class Geometry:
    """Where every output element of one call lives.

    ``shape`` is the shape of ``q``, ``[..., K]``: two or fewer dimensions are one batch of
    ``rows`` tokens; three or more are ``[B, ...]`` with ``B = shape[0]`` batches of
    ``rows = prod(shape[1:-1])`` tokens each, every batch with its own padding. ``layout`` is a
    ``ScaleLayout`` or its name.
    """

    shape: tuple[int, ...]
    group_size: int
    layout: ScaleLayout
    pad_rows: bool

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "layout", scale_layout(self.layout))

    @property
    def lead_shape(self) -> tuple[int, ...]:
        return self.shape[:-1]

    @property
    def batched(self) -> bool:
        return len(self.shape) >= 3

    @property
    def batches(self) -> int:
        return self.shape[0] if self.batched else 1

    @property
    def rows(self) -> int:
        """Tokens per batch (M)."""
        inner = self.lead_shape[1:] if self.batched else self.lead_shape
        return math.prod(inner)

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def groups(self) -> int:
        return self.k // self.group_size

    @property
    def tma_rows(self) -> int:
        return align(self.rows, TMA_ROW_ALIGN)

    @property
    def empty(self) -> bool:
        return self.batches * self.rows == 0 or self.k == 0

    # q -----------------------------------------------------------------------------------------

    @property
    def q_rows(self) -> int:
        """Rows of q storage per batch: padded to the TMA alignment when ``pad_rows``."""
        return self.tma_rows if self.pad_rows else self.rows

    @property
    def q_storage(self) -> int:
        return self.batches * self.q_rows * self.k

    @property
    def q_strides(self) -> tuple[int, ...]:
        return self._lead_strides(self.k, self.q_rows * self.k) + (1,)

    # scales --------------------------------------------------------------------------------------

    @property
    def scale_columns(self) -> int:
        """Words per row: groups, or packed words."""
        return self.layout.words(self.groups)

    @property
    def scale_shape(self) -> tuple[int, ...]:
        if self.layout.swizzled:  # the padded storage as a matrix, one per batch
            return (self.batches,) * self.batched + (self.scale_rows, self.scale_columns)
        return self.lead_shape + (self.scale_columns,)

    @property
    def scale_rows(self) -> int:
        """Rows of scale storage per batch."""
        return self.layout.storage_rows(self.rows)

    @property
    def scale_storage(self) -> int:
        return self.batches * self.scale_rows * self.scale_columns

    @property
    def scale_storage_bytes(self) -> int:
        return self.scale_storage * self.layout.word_bytes

    @property
    def scale_word_strides(self) -> tuple[int, int, int]:
        """(batch, row, word) strides of the scale storage, in words."""
        return self.layout.word_strides(self.rows, self.groups)

    @property
    def scale_byte_strides(self) -> tuple[int, int, int]:
        """(batch, row, word) strides in bytes: the kernel's address function reads these (for
        the blocked layout: a batch, a row of 128x4 tiles, one tile)."""
        batch, row, word = self.scale_word_strides
        if self.layout.swizzled:  # a row of 128x4 tiles, and one tile
            return batch, self.scale_columns // BLOCK_COLUMNS * 512, 512
        size = self.layout.word_bytes
        return batch * size, row * size, word * size

    @property
    def scale_strides(self) -> tuple[int, ...]:
        batch, row, word = self.scale_word_strides
        if self.layout.swizzled:
            return (batch,) * self.batched + (row, word)
        return self._lead_strides(row, batch) + (word,)

    @property
    def scale_address(self) -> tuple[int, int, int, int, int, int, int]:
        """The address function's byte strides: ``(batch, row % 32, (row // 32) % 4,
        row // 128, group // n, group % n, n)`` with ``n`` scales a word.

        A row's offset is taken in three parts so that one function serves the strided layouts
        (row strides 1, 32 and 128 times the row stride) and the blocked layout's 128x4 tiles
        (16 bytes, 4 bytes, and ``Cb / 4`` tiles of 512 bytes), as the kernels' address
        functions do (kernels/layouts.cuh); the NumPy backend writes through
        ``scale_byte_offsets``.
        """
        batch, row, word = self.scale_byte_strides
        if self.layout.swizzled:
            return batch, 16, 4, row, word, 1, BLOCK_COLUMNS
        per_word = self.layout.scales_per_word
        return batch, row, 32 * row, 128 * row, word, self.layout.scale_bytes, per_word

    def scale_byte_offsets(self) -> np.ndarray:
        """Byte offset of the first byte of every scale, ``[batches, rows, groups]``: the
        layout's address map, as the kernel's address function computes it."""
        batch, row, row32, row128, word, byte, per_word = self.scale_address
        rows, groups = np.arange(self.rows), np.arange(self.groups)
        row_offset = (rows % 32) * row + (rows // 32 % 4) * row32 + (rows // 128) * row128
        column = (groups // per_word) * word + (groups % per_word) * byte
        return (
            np.arange(self.batches)[:, None, None] * batch
            + row_offset[None, :, None]
            + column[None, None, :]
        )

    # the kernel grid ------------------------------------------------------------------------------

    @property
    def grid_rows(self) -> int:
        """Rows per batch the kernel visits: real rows plus any padding rows it must zero."""
        return max(self.q_rows, self.scale_rows)

    @property
    def pads_scales(self) -> bool:
        return self.scale_rows > self.rows

    def _lead_strides(self, row_stride: int, batch_stride: int) -> tuple[int, ...]:
        inner = self.lead_shape[1:] if self.batched else self.lead_shape
        strides = []
        stride = row_stride
        for extent in reversed(inner):
            strides.append(stride)
            stride *= extent
        strides.reverse()
        return ((batch_stride,) if self.batched else ()) + tuple(strides)


def row_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(batch stride, row stride) of an input laid out as ``Geometry`` reads it, or None.

    The dimensions between the batch and K must collapse into one row stride (a view of a
    wider buffer is fine; a transposed one is not). Dimensions of extent 1 have no stride.
    """
    geometry_batched = len(shape) >= 3
    inner = range(1 if geometry_batched else 0, len(shape) - 1)
    row_stride = None
    expected = None
    for dim in reversed(inner):
        if shape[dim] == 1:
            continue
        if expected is not None and strides[dim] != expected:
            return None
        if row_stride is None:
            row_stride = strides[dim]
        expected = strides[dim] * shape[dim]
    if row_stride is None:
        row_stride = shape[-1]
    batch_stride = strides[0] if geometry_batched else 0
    if geometry_batched and shape[0] == 1:
        batch_stride = 0
    return batch_stride, row_stride


# weight blocks and the column-wise orientation (docs/spec.md, sections 4c and 4d) ------------

WEIGHT_BLOCK = TILE  # rows and columns of a weight block by default: the tile kernels' tile
WEIGHT_BLOCKS = (TILE, 2 * TILE)  # the blocks quantize_weight takes (square), 256 torchao's
# a test keeps WeightLayoutName equal to WEIGHT_LAYOUTS
WeightLayoutName = Literal["row", "col", "bytes", "packed"]
WEIGHT_LAYOUTS: tuple[str, ...] = ("row", "col", "bytes", "packed")
WEIGHT_BYTES = "bytes"  # one UE8M0 exponent byte a block, row-major
WEIGHT_NEEDS_UE8M0 = ("bytes", "packed")


@dataclass(frozen=True)
class WeightGeometry:
    """Where the outputs of ``quantize_weight`` live: ``shape`` is w's (and q's), ``[N, K]`` or
    ``[E, N, K]``, in blocks of ``block`` x ``block``. The float and packed layouts store the
    bytes of an activation ``Geometry`` (``scales``): float ones over ``nb`` rows of ``kb``
    groups, ``packed`` (128x128 blocks) over ``N`` rows, row ``n`` holding block row
    ``n // 128`` (DeepGEMM's SM100 weight layout); ``bytes`` is a row-major uint8 matrix per
    batch."""

    shape: tuple[int, ...]
    layout: str
    block: int = WEIGHT_BLOCK

    @property
    def batched(self) -> bool:
        return len(self.shape) == 3

    @property
    def batches(self) -> int:
        return self.shape[0] if self.batched else 1

    @property
    def n(self) -> int:
        return self.shape[-2]

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def blocks(self) -> tuple[int, int]:
        """(nb, kb): block rows and block columns."""
        return -(-self.n // self.block), -(-self.k // self.block)

    @property
    def empty(self) -> bool:
        return self.batches * self.n * self.k == 0

    @property
    def q_strides(self) -> tuple[int, ...]:
        return ((self.n * self.k,) if self.batched else ()) + (self.k, 1)

    @property
    def scales(self) -> Geometry:
        """The activation geometry whose scale storage this layout shares."""
        nb, kb = self.blocks
        rows = self.n if self.layout == PACKED else nb
        base = ROW if self.layout == WEIGHT_BYTES else self.layout
        lead = (self.batches,) if self.batched else ()
        return Geometry((*lead, rows, kb * self.block), self.block, SCALE_LAYOUTS[base], False)

    @property
    def scale_dtype(self) -> str:
        return "uint8" if self.layout == WEIGHT_BYTES else self.scales.layout.dtype

    @property
    def scale_shape(self) -> tuple[int, ...]:
        return self.scales.scale_shape

    @property
    def scale_strides(self) -> tuple[int, ...]:
        return self.scales.scale_strides

    @property
    def scale_storage(self) -> int:
        """Elements of the scale storage (words, or bytes for ``bytes``)."""
        return self.scales.scale_storage


def transposed_geometry(m: int, k: int, group_size: int, layout) -> Geometry:
    """The scales of the column-wise result of ``x [M, K]``: section 6's layout over ``K`` rows
    of ``ceil(M / G)`` token groups (the last one partial where ``G`` does not divide ``M``)."""
    groups = -(-m // group_size)
    return Geometry((k, groups * group_size), group_size, scale_layout(layout), False)
