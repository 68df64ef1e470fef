"""The covering set of calls that tools/sanitize.sh runs under compute-sanitizer.

Every input type, output format, scale format and layout, both kernel paths, the fused, masked,
RMSNorm and NVFP4 kernels, and the tile kernels (weight blocks of 128 and 256, column-wise
token groups of 128 and 256, "both"), each at shapes that reach the edges: one token, rows
that leave padding (M = 5), padded q rows, batches, K of 21 groups (odd), an input whose rows
are not 16-byte aligned (the element-wise load), and Inf/NaN groups. CuPy's memory pool is
off, so every buffer is its own cudaMalloc of the exact size and a byte read or written past a
buffer is an error the sanitizer sees. Each output is copied back whole and compared with the
NumPy backend, so initcheck also sees any byte the kernel left unwritten. Prints one line per
call and a summary; exits non-zero on a mismatch.
"""

import sys

import cupy
import numpy as np

import fp8_group_quant as fgq
from fp8_group_quant import _tuning
from fp8_group_quant._arrays import describe
from fp8_group_quant._layout import Geometry, supported_combinations
from fp8_group_quant._outputs import specs, transposed_specs, weight_specs
from fp8_group_quant._request import (
    check_options,
    check_weight_options,
    make_request,
    make_weight_request,
)
from fp8_group_quant._spec import GROUP_SIZES, INPUT_TYPES, OUTPUT_FORMATS

# every shape for every combination with --full; else one shape each, in turn (a quarter of the
# calls: every shape still meets every format, layout and path across the set)
FULL = "--full" in sys.argv
SHAPES = [  # (shape, pad_rows, unaligned rows)
    ((1, 2688), False, False),
    ((5, 1024), True, False),
    ((2, 3, 512), False, False),
    ((7, 256), False, True),
]


def values(rng, shape, input_dtype):
    x = rng.standard_normal(shape, dtype=np.float32) * np.float32(rng.uniform(0.01, 100))
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 3)] = [np.inf, -np.nan, -np.inf]
    return x.astype(INPUT_TYPES[input_dtype].numpy_dtype)


def device_input(x_host, unaligned):
    if not unaligned:
        return cupy.asarray(x_host)
    wide = np.zeros(x_host.shape[:-1] + (x_host.shape[-1] + 1,), x_host.dtype)
    wide[..., 1:] = x_host
    return cupy.asarray(wide)[..., 1:]  # rows 2 bytes off a 16-byte boundary


def main() -> int:
    cupy.cuda.set_allocator(None)  # exact-size allocations: no pool to hide an overrun
    cupy.cuda.set_pinned_memory_allocator(None)
    fgq.warmup(variants="all")  # one module (from the disk cache after the test suite)
    rng = np.random.default_rng(11)
    combos = [(i, *c) for i in INPUT_TYPES for c in supported_combinations()]
    calls = failures = 0
    for path, limit in (("one pass", 2**62), ("row loop", 0)):
        with _tuning.override(one_pass_max_waves=limit):
            for index, (input_dtype, fmt, scale, layout) in enumerate(combos):
                group = GROUP_SIZES[index % len(GROUP_SIZES)]
                shapes = SHAPES if FULL else [SHAPES[index % len(SHAPES)]]
                for shape, pad_rows, unaligned in shapes:
                    if shape[-1] % group:  # K = 2688 holds no whole group of 256
                        continue
                    x_host = values(rng, shape, input_dtype)
                    options = dict(dtype=fmt, scale=scale, layout=layout, pad_rows=pad_rows)
                    q, s = fgq.quantize(device_input(x_host, unaligned), group, **options)
                    q_ref, s_ref = fgq.quantize(x_host, group, **options)
                    geometry = Geometry(shape, group, layout, pad_rows)
                    # the whole padded storage of both outputs, copied back byte for byte (initcheck
                    # sees every byte) and compared with the NumPy backend's, padding included
                    same = True
                    for got, ref, size in ((q, q_ref, geometry.q_storage),
                                           (s, s_ref, geometry.scale_storage)):  # fmt: skip
                        storage = cupy.ndarray((size,), got.dtype, got.data).get().view(np.uint8)
                        ref = np.asarray(ref)
                        if ref.itemsize == 1:  # float8 codes: as_strided cannot carry ml_dtypes
                            ref = ref.view(np.uint8)
                        expected = np.lib.stride_tricks.as_strided(ref, (size,), (ref.itemsize,))
                        same = same and np.array_equal(storage, expected.view(np.uint8))
                    calls += 1
                    failures += not same
                    print(f"{path:8} {input_dtype:8} G={group:<3} {fmt:8} {scale:7} {layout:10} "
                          f"{shape} pad_rows={pad_rows} unaligned={unaligned} "
                          f"{'ok' if same else 'MISMATCH'}")  # fmt: skip
    fused_calls, fused_failures = fused_cases(combos, rng)
    calls, failures = calls + fused_calls, failures + fused_failures
    nvfp4_calls, nvfp4_failures = nvfp4_cases(rng)
    calls, failures = calls + nvfp4_calls, failures + nvfp4_failures
    tile_calls, tile_failures = tile_cases(rng)
    calls, failures = calls + tile_calls, failures + tile_failures
    cupy.cuda.runtime.deviceSynchronize()
    print(f"# {calls} calls, {failures} mismatches")
    return 1 if failures else 0


def zeroed_outputs(geometry, fmt, module):
    """(q, scales, q storage, scale storage) over zeroed storage of ``module`` (numpy or
    cupy): the masked layout leaves rows unwritten, and initcheck must not see them read."""
    q_buf = module.zeros(geometry.q_storage, module.uint8)
    s_buf = module.zeros(geometry.scale_storage, geometry.layout.dtype)
    strided = module.lib.stride_tricks.as_strided
    q = strided(q_buf, geometry.shape, geometry.q_strides)
    size = s_buf.itemsize
    s = strided(s_buf, geometry.scale_shape, tuple(size * v for v in geometry.scale_strides))
    if fmt == "int8":
        q = q.view(module.int8)
    elif module is np:  # numpy has the float8 types (ml_dtypes); cupy takes their uint8 bytes
        q = q.view(OUTPUT_FORMATS[fmt].numpy_dtype)
    return q, s, q_buf, s_buf


def fused_cases(combos, rng) -> tuple[int, int]:
    """SiLU-and-multiply (on both of its grids), the masked layout (with and without it) and
    the add-RMSNorm, one shape per combination, against the NumPy backend over the whole
    zeroed storage (and the residual written back)."""
    calls = failures = 0
    counts = np.array([0, 5, 2], np.int32)
    for index, (input_dtype, fmt, scale, layout) in enumerate(combos):
        group = GROUP_SIZES[index % len(GROUP_SIZES)]
        # plain SiLU on the masked kernel's persistent grid (every row real), which the launch
        # layer takes for large inputs without padding rows: forced here, 8 rows; the last:
        # masked rows of 64 groups, whose expert lookup stays in the warps' lanes
        modes = (("silu_mul", False, False, 3), (None, True, False, 3),
                 ("silu_mul", True, False, 3), ("silu_mul", False, True, 3),
                 (None, True, False, 64), ("gelu_tanh_mul", False, False, 3),
                 ("gelu_tanh_mul", True, False, 3), ("gelu_tanh_mul", False, True, 3))  # fmt: skip
        for activation, masked, persistent, groups in modes:
            rows = 8 if persistent else 5
            shape = (3, rows, groups * group * (2 if activation else 1))
            x_host = values(rng, shape, input_dtype)
            geometry = Geometry((3, rows, groups * group), group, layout, False)
            options = dict(dtype=fmt, scale=scale, layout=layout, activation=activation)
            extra = {"masked_m": counts} if masked else {}
            q, s, q_buf, s_buf = zeroed_outputs(geometry, fmt, cupy)
            device_extra = {"masked_m": cupy.asarray(counts)} if masked else {}
            waves = 0.0 if persistent else _tuning.active()[1].persistent_fused_waves
            with _tuning.override(persistent_fused_waves=waves):
                fgq.quantize(cupy.asarray(x_host), group, **options, out=q, scale_out=s,
                             **device_extra)  # fmt: skip
            hq, hs, hq_buf, hs_buf = zeroed_outputs(geometry, fmt, np)
            fgq.quantize(x_host, group, **options, out=hq, scale_out=hs, **extra)
            same = np.array_equal(q_buf.get(), hq_buf) and np.array_equal(
                s_buf.get().view(np.uint8), hs_buf.view(np.uint8)
            )
            calls += 1
            failures += not same
            verdict = "ok" if same else "MISMATCH"
            print(f"fused    {input_dtype:8} G={group:<3} {fmt:8} {scale:7} {layout:10} "
                  f"activation={activation} masked={masked} persistent={persistent} "
                  f"groups={groups} {verdict}")  # fmt: skip
        # the RMSNorm kernel, with the residual written back (a row of 3 groups, 5 rows), then
        # without it, each with one and with two lanes a thread (forced); with two, one block
        # walks the 5 rows
        shape = (5, 3 * group)
        x_host, r_host = values(rng, shape, input_dtype), values(rng, shape, input_dtype)
        weight = values(rng, (3 * group,), input_dtype)
        geometry = Geometry(shape, group, layout, False)
        options = dict(dtype=fmt, scale=scale, layout=layout)
        for lanes, residual in ((1, True), (2, True), (1, False), (2, False)):
            q, s, q_buf, s_buf = zeroed_outputs(geometry, fmt, cupy)
            r_device = cupy.asarray(r_host) if residual else None
            waves = 1e-9 if lanes == 2 else None  # one block, or the default
            with _tuning.override(norm_lanes=lanes, norm_waves=waves):
                fgq.quantize(cupy.asarray(x_host), group, **options,
                             norm=(cupy.asarray(weight), 1e-6), residual=r_device, out=q,
                             scale_out=s)  # fmt: skip
            hq, hs, hq_buf, hs_buf = zeroed_outputs(geometry, fmt, np)
            r_expected = r_host.copy() if residual else None
            fgq.quantize(x_host, group, **options, norm=(weight, 1e-6), residual=r_expected,
                         out=hq, scale_out=hs)  # fmt: skip
            same = np.array_equal(q_buf.get(), hq_buf) and np.array_equal(
                s_buf.get().view(np.uint8), hs_buf.view(np.uint8)
            )
            if residual:
                same = same and np.array_equal(
                    r_device.get().view(np.uint8), r_expected.view(np.uint8)
                )
            calls += 1
            failures += not same
            print(f"norm     {input_dtype:8} G={group:<3} {fmt:8} {scale:7} {layout:10} "
                  f"lanes={lanes} residual={residual} {'ok' if same else 'MISMATCH'}")  # fmt: skip
    return calls, failures


def nvfp4_cases(rng) -> tuple[int, int]:
    """NVFP4 in every input type, with a given, a device and a computed global scale, at a
    partial row tile (5 rows: 123 padding rows), batches and an odd count of 16-groups. The
    outputs are library-allocated, so initcheck sees any byte left unwritten as they are
    copied back."""
    calls = failures = 0
    for input_dtype in INPUT_TYPES:
        for shape in ((5, 48), (2, 3, 80), (1, 7168)):
            x_host = values(rng, shape, input_dtype)
            for given, host_given in ((None, None), (2.5, 2.5), ("device", 0.5)):
                device_given = cupy.asarray([0.5], cupy.float32) if given == "device" else given
                got = fgq.quantize(cupy.asarray(x_host), 16, dtype="e2m1", scale="e4m3",
                                   layout="blocked", global_scale=device_given)  # fmt: skip
                want = fgq.quantize(x_host, 16, dtype="e2m1", scale="e4m3", layout="blocked",
                                    global_scale=host_given)  # fmt: skip
                same = len(got) == len(want) and all(
                    np.array_equal(a.get().view(np.uint8), np.asarray(b).view(np.uint8))
                    for a, b in zip(got, want)
                )
                calls += 1
                failures += not same
                print(f"nvfp4    {input_dtype:8} {str(shape):14} global={given} "
                      f"{'ok' if same else 'MISMATCH'}")  # fmt: skip
    return calls, failures


def _same_storage(got, want, spec) -> bool:
    """Every byte of the storage ``spec`` describes, the device output's against the host's."""
    size = spec.storage
    if isinstance(got, np.ndarray):
        storage = np.lib.stride_tricks.as_strided(got.view(np.uint8) if got.itemsize == 1 else got,
                                                  (size,), (got.itemsize,))  # fmt: skip
    else:
        storage = cupy.ndarray((size,), got.dtype, got.data).get()
    want = np.asarray(want)
    if want.itemsize == 1:  # float8 codes: as_strided cannot carry ml_dtypes
        want = want.view(np.uint8)
    expected = np.lib.stride_tricks.as_strided(want, (size,), (want.itemsize,))
    return np.array_equal(storage.view(np.uint8), expected.view(np.uint8))


# (block, layout, scale) of quantize_weight: every layout at 128, every one but packed at 256
WEIGHT_CASES = [(128, "row", "float32"), (128, "col", "ue8m0"), (128, "bytes", "ue8m0"),
                (128, "packed", "ue8m0"), (256, "row", "ue8m0"), (256, "col", "float32"),
                (256, "bytes", "ue8m0")]  # fmt: skip
# (token group, orientation, layout, scale) of the column kernel
COLUMN_CASES = [(128, "col", "packed", "ue8m0"), (128, "both", "col", "float32"),
                (128, "both", "packed_row", "ue8m0"), (256, "col", "col_tma", "ue8m0"),
                (256, "col", "row", "float32"), (256, "col", "packed", "ue8m0")]  # fmt: skip


def tile_cases(rng) -> tuple[int, int]:
    """The tile kernels in every input type: weights with partial blocks both ways, experts,
    whole blocks, and rows not 16-byte aligned; columns with a partial last token group, whole
    groups and unaligned rows. Outputs library-allocated; every byte of their storage compared
    with the NumPy backend's."""
    calls = failures = 0
    for input_dtype in INPUT_TYPES:
        for block, layout, scale in WEIGHT_CASES:
            for shape, unaligned in (((300, 520), False), ((2, 130, 2 * block), False),
                                     ((2 * block, 2 * block), True)):  # fmt: skip
                w = values(rng, shape, input_dtype)
                got = fgq.quantize_weight(device_input(w, unaligned), (block, block), scale=scale,
                                          layout=layout)  # fmt: skip
                want = fgq.quantize_weight(w, (block, block), scale=scale, layout=layout)
                request = make_weight_request(describe(w, "w"), check_weight_options(
                    (block, block), "e4m3", scale, layout, 1e-10, "rceil"))  # fmt: skip
                same = all(_same_storage(g, r, spec)
                           for g, r, spec in zip(got, want, weight_specs(request)))  # fmt: skip
                calls += 1
                failures += not same
                print(
                    f"weight   {input_dtype:8} {block}x{block} {layout:7} {scale:7} "
                    f"{str(shape):14} unaligned={unaligned} {'ok' if same else 'MISMATCH'}"
                )
        for group, orientation, layout, scale in COLUMN_CASES:
            for shape, unaligned in (((300, 512), False), ((2 * group, 256), False),
                                     ((group + 5, 256), True)):  # fmt: skip
                x = values(rng, shape, input_dtype)
                options = dict(scale=scale, layout=layout, orientation=orientation)
                got = fgq.quantize(device_input(x, unaligned), group, **options)
                want = fgq.quantize(x, group, **options)
                request = make_request(describe(x, "x"),
                                       check_options(group, "e4m3", **options))  # fmt: skip
                wanted = transposed_specs(request)
                if orientation == "both":
                    wanted = (*specs(request), *wanted)
                same = all(_same_storage(g, r, spec) for g, r, spec in zip(got, want, wanted))
                calls += 1
                failures += not same
                print(f"columns  {input_dtype:8} G={group:<3} {orientation:4} {layout:10} "
                      f"{scale:7} {str(shape):11} unaligned={unaligned} "
                      f"{'ok' if same else 'MISMATCH'}")  # fmt: skip
    return calls, failures


if __name__ == "__main__":
    sys.exit(main())
