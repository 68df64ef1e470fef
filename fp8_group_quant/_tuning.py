"""Tuning choices of the launch planner, as one table in code.

Every number here was measured on the H200; docs/perf.md ("Lessons") gives the figures behind
each. The planner (``_plan``) takes a ``Tuning`` by argument. The benchmark and the tests
override fields for a block of code with ``override(...)``, which also gives the block its own
plans: a plan made under one table is never served under another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
from contextvars import ContextVar
from dataclasses import dataclass, field

from . import _settings
from ._abi import MAX_THREADS, WARP


@dataclass(frozen=True)
class Tuning:
    # Threads per block of the one-pass grid: 128 was best or within 1% of best at K = 2048,
    # 2688 and 7168, M = 1-16384 (64 lost up to 1.7x at large M, 256 up to 2%).
    one_pass_threads: int = 128
    # Resident waves a one-pass grid may reach before the row loop takes over; None: unlimited
    # for kernels that fit six 256-thread blocks an SM, 16 for the others (one_pass_wave_limit).
    one_pass_max_waves: float | None = None
    # Resident waves the row loop's grid holds; None: 8 for kernels of six blocks an SM, 1 for
    # the others (row_loop_waves). 0: one block column per row tile.
    row_loop_waves: float | None = None
    # The bfloat16 SiLU-mul kernel at six blocks an SM (40 registers) takes one-pass grids of
    # more than this many waves of the five-block kernel: it won 0.45-0.75 us at M = 1024 and
    # lost 0.4-0.55 at 512 (N = 7168).
    silu_six_blocks_waves: float = 2.2
    # One-pass SiLU-mul grids of more than this many waves copy their blocks' table with every
    # thread rather than one bulk copy.
    silu_table_waves: float = 0.5
    # Plain fused grids of bfloat16 gates (SiLU-mul, GeGLU) of more than this many one-pass
    # waves take the persistent kernel; other gates keep one pass (_plan.fused_takes_persistent).
    persistent_fused_waves: float = 8.0
    # RMSNorm: resident waves of the grid (None: a block a row below norm_walk_rows waves, else
    # one walking wave), 32-byte lanes a thread (None: norm_lanes), the weight-stashing kernel.
    norm_waves: float | None = None
    norm_lanes: int | None = None
    norm_stash: bool = True
    norm_walk_rows: float = 1.0
    norm_two_lane_waves: float = 1.0
    norm_residual_one_lane: tuple[float, float] = (1.5, 6.5)
    # Programmatic Dependent Launch: the user setting FP8_GROUP_QUANT_PDL by default.
    pdl: bool = field(default_factory=_settings.pdl)

    def __post_init__(self) -> None:
        threads = self.one_pass_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads % WARP:
            raise ValueError(f"one_pass_threads: expected a multiple of {WARP}, got {threads!r}")
        if not WARP <= threads <= MAX_THREADS:
            raise ValueError(
                f"one_pass_threads: expected {WARP} to {MAX_THREADS} threads, got {threads}"
            )
        if self.norm_lanes not in (None, 1, 2):
            raise ValueError(f"norm_lanes: expected None, 1 or 2, got {self.norm_lanes!r}")


_tokens = itertools.count(1)
_lock = threading.Lock()
DEFAULT = Tuning()
_ACTIVE: ContextVar[tuple[int, Tuning]] = ContextVar("fp8_group_quant_tuning", default=(0, DEFAULT))


def active() -> tuple[int, Tuning]:
    """(token, table) in force: the token tells plans made under different tables apart."""
    return _ACTIVE.get()


@contextlib.contextmanager
def override(**changes):
    """Use the active table with ``changes`` for the block (this thread or task only)."""
    table = dataclasses.replace(_ACTIVE.get()[1], **changes)
    with _lock:
        token = next(_tokens)
    reset = _ACTIVE.set((token, table))
    try:
        yield table
    finally:
        _ACTIVE.reset(reset)
