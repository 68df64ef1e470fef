"""The sizes where the visible GPU's plans change, each quantized and checked.

A plan's route (one pass or row loop, persistent fused grid, the SiLU table's copy, block slots,
tile rows) and its grid change with M at thresholds set by the device's SMs and occupancy, which
the CPU tests only fake. Here the plans of the real device are scanned over M; each change of
route is found exactly by bisection, and so is the size from which a run's grid stops growing
(a walking grid). The sizes beside each edge, the edges of a walking grid's turns and random
sizes inside each run are quantized with the outputs given as views at the start of regions
inside larger buffers, poisoned before and after, twice with two poisons: no byte outside the
layout's storage changes, every byte inside it is written (the two runs agree), and sampled
rows equal the NumPy backend's bit for bit (every op here is per row).
"""

from __future__ import annotations

import numpy as np
import pytest
from backends import (
    compiled_kernels,  # noqa: F401 - GPU tests find the kernels compiled
    poisoned_bytes,
    strided_view,
    to_host,
    to_host_bytes,
)
from helpers import assert_same_bytes

import fp8_group_quant as fgq
from fp8_group_quant import _run, api
from fp8_group_quant._arrays import strided_extent
from fp8_group_quant._layout import Geometry

BEFORE, AFTER = 64, 1024  # poisoned bytes around each region
LANES = 8  # threads a group of 128 (the grids' slots)

# (input dtype, K of the output, options, the largest M scanned): each kernel family's plain
# and fused routes at K with 12 to 56 groups a row, row-wise, column-wise and packed scales; M
# past the H100's last change at that K (row loop, persistent grid), as scanned there; the
# H200 has the same 132 SMs and occupancy, so the same plans
VARIANTS = {
    "plain bf16 2048 row": ("bfloat16", 2048, {}, 24576),
    "plain f16 4096 col": ("float16", 4096, dict(layout="col"), 12288),
    "plain bf16 5120 col_tma": ("bfloat16", 5120, dict(scale="ue8m0", layout="col_tma"), 10240),
    "plain f32 1536 packed g64": (
        "float32", 1536, dict(group_size=64, scale="ue8m0", layout="packed"), 8192),
    "silu bf16 7168 packed": (
        "bfloat16", 7168, dict(activation="silu_mul", scale="ue8m0", layout="packed"), 4096),
    "silu bf16 1536 packed": (
        "bfloat16", 1536, dict(activation="silu_mul", scale="ue8m0", layout="packed"), 16384),
    "gelu f16 2048 col e5m2": (
        "float16", 2048, dict(activation="gelu_tanh_mul", dtype="e5m2", layout="col"), 12288),
    "norm bf16 4096 row": ("bfloat16", 4096, dict(norm=1e-6), 4096),
}  # fmt: skip


def _torch_input(torch, rows, cols, dtype, seed):
    """Heavy-tailed rows with outliers, drawn on the device (the host draw of 10^8 values would
    dominate the test)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    v = torch.randn(rows, cols, generator=gen, device="cuda")
    v *= torch.exp(torch.randn(rows, 1, generator=gen, device="cuda") * 1.5)
    outliers = torch.rand(rows, cols, generator=gen, device="cuda") < 0.002
    v = torch.where(outliers, v * 300.0, v)
    return v.clamp(-60000, 60000).to(getattr(torch, dtype))


def _route(x, options: dict) -> tuple[tuple, tuple]:
    """(route, grids) of the plan for ``x``: each launch's kernel, block, table copy, block
    slots and tile rows; and each launch's grid."""
    o = dict(options)
    call = api._call(o.pop("group_size", 128), o.pop("dtype", "e4m3"), o.pop("scale", "float32"),
                     o.pop("layout", "row"), api.DEFAULT_EPS, False, o.pop("activation", None),
                     "rceil", None, None, o.pop("norm", None), None, None)  # fmt: skip
    assert not o, f"options the scan does not pass: {o}"
    launches = _run.device_plan(x, call, None, None)[0].launches
    route = tuple((ln.handle, ln.block, ln.params.table_by_threads, ln.params.block_slots,
                   ln.params.tile_rows_log2) for ln in launches)  # fmt: skip
    return route, tuple(ln.grid for ln in launches)


def _first(lo: int, hi: int, moved) -> int:
    """The first M in (lo, hi] with ``moved(M)``, given not ``moved(lo)`` and ``moved(hi)``."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if moved(mid) else (mid, hi)
    return hi


def edge_sizes(x_big, options: dict, m_max: int, gpr: int, rng) -> tuple[list, list[int]]:
    """(runs of one route as (first M, end, first M of a fixed grid or None), the sizes to
    check): every route change and the sizes beside it; the size from which a run's grid is
    fixed and beside it; the edges of that grid's first turns (the row loop walks rows
    gridDim.x << tile rows apart, a persistent grid its group slots a grid's threads / 8
    apart) and of its last; M = 1 to 9, 31 to 33, 63 to 65; two random sizes in each run and
    twelve in each walk."""
    plans: dict[int, tuple] = {}

    def plan(m):
        if m not in plans:
            plans[m] = _route(x_big[:m], options)
        return plans[m]

    def route(m):
        return plan(m)[0]

    def grid(m):
        return plan(m)[1]

    changes, scan = [], [*range(1, 65), *range(128, m_max, 64), m_max]
    for lo, hi in zip(scan, scan[1:]):
        before = route(lo)
        if before != route(hi):
            changes.append(_first(lo, hi, lambda m, before=before: route(m) != before))
    sizes = {*range(1, 10), 31, 32, 33, 63, 64, 65, m_max}
    runs = []
    edges = [1, *changes, m_max + 1]
    for start, end in zip(edges, edges[1:]):
        sizes |= {start - 1, start, start + 1}
        sizes |= {int(m) for m in rng.integers(start, end, size=2)}
        last = grid(end - 1)
        fixed = start
        if grid(start) != last:
            fixed = _first(start, end - 1, lambda m, last=last: grid(m) == last)
        if fixed == end - 1 and grid(start) != last:
            runs.append((start, end, None))  # the grid grows to the run's end: no walk
            continue
        runs.append((start, end, fixed))
        sizes |= {fixed - 1, fixed, fixed + 1}
        sizes |= {int(m) for m in rng.integers(fixed, end, size=12)}
        for (_, block, _, _, tile_rows_log2), g in zip(*plan(fixed)):
            turn_slots = g[0] * block[0] // LANES
            for step in {g[0] << tile_rows_log2, max(1, turn_slots // gpr)}:
                for n in (1, 2, 3, (end - 1) // step):
                    sizes |= {n * step + d for d in (-1, 0, 1) if fixed <= n * step + d < end}
    return runs, sorted(m for m in sizes if 1 <= m <= m_max)


def _region(geometry: Geometry, which: str) -> tuple[int, int]:
    """(bytes the layout owns, bytes a view of it spans) of q or the scales."""
    if which == "q":
        return geometry.q_storage, strided_extent(geometry.shape, geometry.q_strides)
    span = strided_extent(geometry.scale_shape, geometry.scale_strides)
    return geometry.scale_storage_bytes, span * geometry.layout.word_bytes


def check_size(torch, x, options: dict, call_options: dict, host_options: dict, k: int, seed: int,
               rng):  # fmt: skip
    m = x.shape[0]
    gs = options.get("group_size", 128)
    what = f"M = {m} (seed {seed})"
    q_plain, s_plain = fgq.quantize(x, gs, **call_options)
    geometry = Geometry((m, k), gs, options.get("layout", "row"), False)
    q_dtype = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[options.get("dtype", "e4m3")]
    s_dtype = np.dtype(geometry.layout.dtype).name
    (q_need, q_span), (s_need, s_span) = _region(geometry, "q"), _region(geometry, "scales")
    # a view spans the layout's storage, or (the scales' padding rows past a view of M rows)
    # the call is refused with the views inside larger buffers and, as the caller must then,
    # given views over buffers of exactly the storage, whose padding it writes
    guarded = q_span == q_need and s_span == s_need
    before, after = (BEFORE, AFTER) if guarded else (0, 0)

    def views(poison, before, after):
        q_buf = poisoned_bytes(before + q_need + after, poison, "torch")
        s_buf = poisoned_bytes(before + s_need + after, poison, "torch")
        q_view = strided_view(q_buf[before:], q_dtype, geometry.shape, geometry.q_strides, "torch")
        s_view = strided_view(s_buf[before:], s_dtype, geometry.scale_shape,
                              geometry.scale_strides, "torch")  # fmt: skip
        return q_buf, s_buf, q_view, s_view

    if not guarded:
        q_buf, s_buf, q_view, s_view = views(0x7F, BEFORE, AFTER)
        with pytest.raises(ValueError, match="the layout owns"):
            fgq.quantize(x, gs, **call_options, out=q_view, scale_out=s_view)
        assert (to_host_bytes(q_buf) == 0x7F).all() and (to_host_bytes(s_buf) == 0x7F).all()
    stored = []
    for poison in (0x7F, 0x00):
        q_buf, s_buf, q_view, s_view = views(poison, before, after)
        q, s = fgq.quantize(x, gs, **call_options, out=q_view, scale_out=s_view)
        assert q is q_view and s is s_view
        regions = []
        for name, buf, need in (("q", q_buf, q_need), ("scales", s_buf, s_need)):
            got = to_host_bytes(buf)
            outside = np.concatenate([got[:before], got[before + need :]])
            assert (outside == poison).all(), (
                f"{what}: {name} wrote {(outside != poison).sum()} bytes outside its storage"
            )
            regions.append(got[before : before + need])
        stored.append(regions)
        assert_same_bytes(to_host_bytes(q_view), to_host_bytes(q_plain), f"{what}: q view")
        assert_same_bytes(to_host_bytes(s_view), to_host_bytes(s_plain), f"{what}: scale view")
    for name, first, second in zip(("q", "scales"), *stored):
        assert (first == second).all(), (
            f"{what}: {(first != second).sum()} {name} storage bytes not written"
        )

    # sampled rows against the NumPy backend: the first, the last three, random ones
    rows = sorted({0, m - 1, max(0, m - 2), max(0, m - 3),
                   *(int(r) for r in rng.integers(0, m, size=min(m, 16)))})  # fmt: skip
    index = torch.tensor(rows, device="cuda")
    q_ref, s_ref = fgq.quantize(to_host(x.index_select(0, index)), gs, **host_options)
    assert_same_bytes(to_host_bytes(q_plain.view(torch.uint8).index_select(0, index)),
                      np.ascontiguousarray(q_ref), f"{what}: q rows {rows}")  # fmt: skip
    assert_same_bytes(to_host_bytes(s_plain[rows]), np.ascontiguousarray(s_ref),
                      f"{what}: scale rows {rows}")  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_route_edge_of_the_device(variant):
    torch = pytest.importorskip("torch")
    dtype, k, options, m_max = VARIANTS[variant]
    seed = int(np.random.default_rng().integers(2**31))  # fresh sizes and data, named on failure
    rng = np.random.default_rng(seed)
    x_big = _torch_input(torch, m_max, 2 * k if "activation" in options else k, dtype, seed)
    call_options = {key: v for key, v in options.items() if key != "group_size"}
    host_options = dict(call_options)
    if "norm" in options:
        gen = torch.Generator(device="cuda").manual_seed(seed + 1)
        weight = (torch.rand(k, generator=gen, device="cuda") + 0.5).to(getattr(torch, dtype))
        call_options["norm"] = (weight, options["norm"])
        host_options["norm"] = (to_host(weight), options["norm"])
    scan_options = dict(options, norm=call_options["norm"]) if "norm" in options else options
    gpr = k // options.get("group_size", 128)
    runs, sizes = edge_sizes(x_big, scan_options, m_max, gpr, rng)
    assert len(runs) >= 2, f"{variant}: one route from 1 to {m_max}, no edge to check: {runs}"
    for m in sizes:
        check_size(torch, x_big[:m], options, call_options, host_options, k, seed, rng)
