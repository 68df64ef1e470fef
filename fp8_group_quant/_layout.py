"""Shapes, strides and padding of ``q`` and of every scale layout (SPEC section 4).

Shared by the NumPy backend and the CUDA launch layer, so both write the same storage. All
strides are in elements of the array they describe.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ROW = "row"
COL = "col"
COL_TMA = "col_tma"
PACKED = "packed"
PACKED_ROW = "packed_row"
LAYOUTS = (ROW, COL, COL_TMA, PACKED, PACKED_ROW)
PACKED_LAYOUTS = (PACKED, PACKED_ROW)  # int32 words holding four UE8M0 bytes
TMA_LAYOUTS = (COL_TMA, PACKED)  # rows padded to a multiple of TMA_ROW_ALIGN per batch
COLUMN_LAYOUTS = (COL, COL_TMA)  # float scales, MN-major: consecutive rows are adjacent

TMA_ROW_ALIGN = 4  # a TMA box reads 16 bytes: four float32 or int32 scales
GROUPS_PER_WORD = 4  # UE8M0 bytes in one packed int32 word


def align(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class Geometry:
    """Where every output element of one call lives.

    ``x`` of shape ``[..., K]``: two or fewer dimensions are one batch of ``rows`` tokens; three or
    more are ``[B, ...]`` with ``B = shape[0]`` batches of ``rows = prod(shape[1:-1])`` tokens
    each, every batch with its own TMA padding.
    """

    shape: tuple[int, ...]
    group_size: int
    layout: str
    pad_rows: bool

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
    def packed_words(self) -> int:
        return -(-self.groups // GROUPS_PER_WORD)

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
        return self.packed_words if self.layout in PACKED_LAYOUTS else self.groups

    @property
    def scale_shape(self) -> tuple[int, ...]:
        return self.lead_shape + (self.scale_columns,)

    @property
    def scale_rows(self) -> int:
        """Rows of scale storage per batch."""
        return self.tma_rows if self.layout in TMA_LAYOUTS else self.rows

    @property
    def scale_storage(self) -> int:
        return self.batches * self.scale_rows * self.scale_columns

    @property
    def scale_kernel_strides(self) -> tuple[int, int, int]:
        """(batch, row, column) strides of the scale storage."""
        per_batch = self.scale_rows * self.scale_columns
        if self.layout in (ROW, PACKED_ROW):
            return per_batch, self.scale_columns, 1
        return per_batch, 1, self.scale_rows  # col, col_tma, packed: MN-major

    @property
    def scale_strides(self) -> tuple[int, ...]:
        batch, row, column = self.scale_kernel_strides
        return self._lead_strides(row, batch) + (column,)

    # the kernel grid ------------------------------------------------------------------------------

    @property
    def grid_rows(self) -> int:
        """Rows per batch the kernel visits: real rows plus any padding rows it must zero."""
        if self.pad_rows or self.layout in TMA_LAYOUTS:
            return self.tma_rows
        return self.rows

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
