"""CUDA kernels against the NumPy backend, bit for bit, with poisoned outputs (cupy and torch)."""

import contextlib
import dataclasses
import itertools
import math
import os

import numpy as np
import pytest
from helpers import (
    NP_INPUT,
    Q_POISON,
    SCALE_POISON,
    activations,
    assert_same_bytes,
    host_poisoned,
    reference_storage,
    sums_at_rounding_hazards,
)
from hypothesis import given as drawn
from hypothesis import settings
from hypothesis import strategies as st

import fp8_group_quant as fgq
from fp8_group_quant import _jit, _launch
from fp8_group_quant._layout import Geometry, supported_combinations
from fp8_group_quant._spec import GROUP_SIZES, INPUT_TYPES, OUTPUT_FORMATS

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """All instantiations in one NVRTC call: much faster than one call per test."""
    import cupy

    keys = _launch.all_name_expressions()
    _jit.preload(_launch.SOURCE, keys, cupy.cuda.runtime.getDevice())


# moving data between the host and each library ---------------------------------------------------


def to_device(x: np.ndarray, lib: str):
    if lib == "cupy":
        import cupy

        return cupy.asarray(x)
    import torch

    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(x.copy()).cuda()


def to_host_bytes(array) -> np.ndarray:
    if type(array).__module__.startswith("torch"):
        import torch

        flat = array.clone(memory_format=torch.contiguous_format).reshape(-1)
        return flat.view(torch.uint8).cpu().numpy()
    return np.ascontiguousarray(array.get()).view(np.uint8)


def wider_rows(x: np.ndarray, extra: int, lib: str, offset: int):
    """``x`` as a view into a device buffer whose rows are ``extra`` elements wider."""
    shape = x.shape[:-1] + (x.shape[-1] + extra,)
    wide = np.zeros(shape, x.dtype)
    wide[..., offset : offset + x.shape[-1]] = x
    return to_device(wide, lib)[..., offset : offset + x.shape[-1]]


def poisoned_outputs(
    geometry: Geometry, lib: str, fmt: str, q_poison=Q_POISON, s_poison=SCALE_POISON
):
    """(q view, scale view, q storage, scale storage): views in the layout over poisoned storage."""
    fmt = OUTPUT_FORMATS[fmt]
    if lib == "cupy":
        import cupy

        q_buf = cupy.full(geometry.q_storage, q_poison, cupy.uint8)
        s_buf = cupy.full(geometry.scale_storage_bytes, s_poison, cupy.uint8)
        s_buf = s_buf.view(geometry.layout.dtype)
        q_view = q_buf.view(fmt.container)

        def strided(buffer, shape, strides):
            return cupy.lib.stride_tricks.as_strided(
                buffer, shape, tuple(s * buffer.itemsize for s in strides)
            )

    else:
        import torch

        q_buf = torch.full((geometry.q_storage,), q_poison, dtype=torch.uint8, device="cuda")
        s_buf = torch.full(
            (geometry.scale_storage_bytes,), s_poison, dtype=torch.uint8, device="cuda"
        )
        s_buf = s_buf.view(getattr(torch, geometry.layout.dtype))
        q_view = q_buf.view(getattr(torch, fmt.dtype_name))

        def strided(buffer, shape, strides):
            return buffer.as_strided(shape, strides)

    q = strided(q_view, geometry.shape, geometry.q_strides)
    s = strided(s_buf, geometry.scale_shape, geometry.scale_strides)
    return q, s, q_buf, s_buf


def check(x_host, x_device, lib, group_size, dtype, scale, layout, pad_rows=False, eps=1e-10,
          scale_rule="rceil"):  # fmt: skip
    """Run the kernel into poisoned outputs; compare every storage byte with the reference."""
    geometry = Geometry(tuple(x_host.shape), group_size, layout, pad_rows)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, lib, dtype)
    q_got, s_got = fgq.quantize(
        x_device, group_size, dtype=dtype, scale=scale, layout=layout, eps=eps,
        out=q, scale_out=s, pad_rows=pad_rows, scale_rule=scale_rule,
    )  # fmt: skip
    assert q_got is q and s_got is s
    q_ref, s_ref = reference_storage(x_host, geometry, dtype, scale, eps, scale_rule)
    what = f"{lib} {x_host.dtype} G={group_size} {dtype} {scale} {layout} shape={x_host.shape}"
    assert_same_bytes(to_host_bytes(q_buf), q_ref, f"q ({what})", inputs=x_host)
    assert_same_bytes(to_host_bytes(s_buf), s_ref, f"scales ({what})")

    # the plain call (library-allocated outputs) returns the same values
    q2, s2 = fgq.quantize(x_device, group_size, dtype=dtype, scale=scale, layout=layout, eps=eps,
                          scale_rule=scale_rule)  # fmt: skip
    assert tuple(q2.shape) == geometry.shape and tuple(s2.shape) == geometry.scale_shape
    rows = q_ref.reshape(geometry.batches, geometry.q_rows, geometry.k)[:, : geometry.rows]
    assert_same_bytes(to_host_bytes(q2), rows, f"q, allocated ({what})")
    assert_same_bytes(to_host_bytes(s2), to_host_bytes(s), f"scales, allocated ({what})")


# every supported combination ----------------------------------------------------------------------

# every row of every registry: a new format or layout is tested here without a new line
COMBINATIONS = [
    (i, g, *combination)
    for i, g in itertools.product(INPUT_TYPES, GROUP_SIZES)
    for combination in supported_combinations()
]


@pytest.fixture(params=["one pass", "row loop"])
def kernel_path(request, monkeypatch):
    """Both kernel paths, forced: an unbounded wave limit sends every call through the one-pass
    kernel, a zero one through the row loop. A fresh plan cache keeps earlier plans out."""
    from fp8_group_quant import api

    limit = 2**62 if request.param == "one pass" else 0
    monkeypatch.setattr(_launch, "ONE_PASS_MAX_WAVES", limit)
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    return request.param


@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS)
def test_every_combination(input_dtype, group_size, dtype, scale, layout, kernel_path):
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("cupy", "torch")[index % 2]  # both libraries see every format and layout
    rng = np.random.default_rng(index)
    args = (lib, group_size, dtype, scale, layout)

    # odd group count (21 groups), NaN/Inf/zero groups, rows not a multiple of 4
    x = activations(rng, (5, 21 * group_size), input_dtype, specials=True)
    check(x, to_device(x, lib), *args)
    # one token; K = 7168
    x = activations(rng, (1, 7168), input_dtype, specials=True)
    check(x, to_device(x, lib), *args)
    # batched, rows strided inside a wider buffer (16-byte aligned), padded q rows
    x = activations(rng, (2, 3, 7168), input_dtype, specials=True)
    check(x, wider_rows(x, 256, lib, 128), *args, pad_rows=True)
    # base and rows not 16-byte aligned: the element-wise load path
    x = activations(rng, (7, 2 * group_size), input_dtype, specials=True)
    check(x, wider_rows(x, 3, lib, 1), *args)
    # many rows
    x = activations(rng, (301, 1024 if group_size < 256 else 2048), input_dtype)
    check(x, to_device(x, lib), *args)


# tiles of 8, 4 and 4 rows (2, 8 and 8 lanes per group), and the row layout's single rows
@pytest.mark.parametrize("layout", ["col", "col_tma", "row"])
@pytest.mark.parametrize(
    "input_dtype, group_size", [("bfloat16", 32), ("float32", 64), ("float16", 128)]
)
def test_row_tiles_over_many_rows_and_batches(input_dtype, group_size, layout, kernel_path):
    # blocks of several rows (column layouts) walking more tiles than the grid holds, with tiles
    # that straddle batch boundaries and a partial last tile
    rng = np.random.default_rng(group_size)
    lanes = group_size * INPUT_TYPES[input_dtype].itemsize // _launch.lane_bytes()
    assert layout == "row" or _launch.tile_rows(layout, lanes) > 1
    for shape in [(4099, 1024), (3, 1501, 512)]:
        x = activations(rng, shape, input_dtype, specials=True)
        check(x, to_device(x, "cupy"), "cupy", group_size, "e4m3", "float32", layout)


@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("scale", ["float32", "ue8m0"])
def test_tiny_eps_and_subnormal_groups(input_dtype, scale):
    # eps = FLT_MIN makes subnormal scales: CuPy compiles with -ftz=true, the kernel must not flush
    tiny = float(np.finfo(np.float32).tiny)
    rng = np.random.default_rng(11)
    x = activations(rng, (4, 512), input_dtype, specials=True)
    small = {"bfloat16": 1e-38, "float16": 1e-7, "float32": 1e-41}[input_dtype]
    x[1] = (rng.standard_normal(512) * small).astype(x.dtype)
    for lib in ("cupy", "torch"):
        check(x, to_device(x, lib), lib, 128, "e4m3", scale, "row", eps=tiny)


# the production path: the shapes, large M, both libraries ---------------------------------

SHAPES = [
    (1, 7168),
    (3, 7168),
    (4, 640),
    (4, 768),
    (4, 384),
    (1, 384),
    (3, 640),
    (64, 7168),
    (127, 7168),
    (253, 640),
    (65537, 2048),
    (4096, 7168),
]  # fmt: skip  the issue's list: single rows, odd rows, K % 512 != 0, M > 65535


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_unpack_scales_on_device_decodes_every_exponent(lib):
    # all 256 exponent bytes in MN-major packed words (the packed layout's strides), on device
    words = np.zeros((3, 64), np.uint32)
    words.view(np.uint8)[...] = np.arange(256 * 3, dtype=np.uint32).reshape(3, 256) % 256
    words = words.view(np.int32)
    device = to_device(np.ascontiguousarray(words.T), lib).T  # strides (1, 3)
    for groups in (256, 253):
        got = fgq.unpack_scales(device, groups)
        host = got.get() if lib == "cupy" else got.cpu().numpy()
        expected = fgq.unpack_scales(words, groups)  # numpy: ml_dtypes' float8_e8m0fnu
        assert host.shape == (3, groups) and host.dtype == np.float32
        np.testing.assert_array_equal(host, expected)
        assert np.isnan(host[:, 255:]).all() and (host[:, :255] > 0).all()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_quantize_packed_shapes(shape, input_dtype, lib):
    rng = np.random.default_rng(list(shape))
    x = activations(rng, shape, input_dtype, specials=True)
    xd = to_device(x, lib)
    for pad_rows in (False, True):
        check(x, xd, lib, 128, "e4m3", "ue8m0", "packed", pad_rows=pad_rows)
    q, s = fgq.quantize_packed(xd)
    geometry = Geometry(shape, 128, "packed", False)
    assert tuple(s.shape) == geometry.scale_shape
    if lib == "torch":
        import torch

        assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.int32
        assert s.stride() == geometry.scale_strides
    else:
        assert q.dtype == np.uint8 and s.dtype == np.int32
        assert tuple(st // 4 for st in s.strides) == geometry.scale_strides


def test_more_than_2_to_the_31_elements():
    import torch

    m, k = 2**31 // 7168 + 3, 7168
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    x[-1, -5] = 3e4  # an outlier in the very last group
    q, s = fgq.quantize_packed(x)
    torch.cuda.synchronize()
    for rows in (slice(0, 8), slice(m - 8, m)):
        part = x[rows].contiguous()
        q_ref, s_ref = fgq.quantize_packed(part)
        assert torch.equal(q[rows].view(torch.uint8), q_ref.view(torch.uint8))
        assert torch.equal(s[rows], s_ref)
    del x, q, s
    torch.cuda.empty_cache()


# interop, caller outputs, graphs, streams ---------------------------------------------------------


def test_cuda_graph_capture_and_replay():
    import torch

    rng = np.random.default_rng(3)
    shape = (37, 2048)
    x = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(shape, dtype=torch.float8_e4m3fn, device="cuda")
    s = torch.empty(40 * 4, dtype=torch.int32, device="cuda").as_strided((37, 4), (1, 40))
    fgq.quantize_packed(x, out=q, scale_out=s)  # warm up outside the capture
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        fgq.quantize_packed(x, out=q, scale_out=s)
    for _ in range(3):
        data = activations(rng, shape, "bfloat16", specials=True)
        x.copy_(to_device(data, "torch"))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = fgq.quantize_packed(data)
        assert_same_bytes(q.view(torch.uint8).cpu().numpy(), np.asarray(q_ref).view(np.uint8), "q")
        assert np.array_equal(s.cpu().numpy(), s_ref)


def test_runs_on_torchs_current_stream():
    import torch

    rng = np.random.default_rng(4)
    data = activations(rng, (4096, 7168), "bfloat16")
    source = to_device(data, "torch")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # delay the side stream; a launch elsewhere would race
        x = source * 1  # produced on the side stream
        q, s = fgq.quantize_packed(x)
        done = torch.cuda.Event()
        done.record()
    done.synchronize()
    q_ref, s_ref = fgq.quantize_packed(data)
    assert_same_bytes(q.view(torch.uint8).cpu().numpy(), np.asarray(q_ref).view(np.uint8), "q")
    assert np.array_equal(s.cpu().numpy(), s_ref)


def test_runs_on_cupys_current_stream():
    import cupy

    rng = np.random.default_rng(5)
    data = activations(rng, (2048, 7168), "bfloat16")
    with cupy.cuda.Stream(non_blocking=True) as stream:
        x = cupy.asarray(data) * 1
        q, s = fgq.quantize_packed(x)
        stream.synchronize()
    q_ref, s_ref = fgq.quantize_packed(data)
    assert_same_bytes(q.get(), np.asarray(q_ref).view(np.uint8), "q")
    assert np.array_equal(s.get(), s_ref)


def test_empty_input_launches_nothing():
    import cupy
    import torch

    q, s = fgq.quantize_packed(torch.empty((0, 7168), dtype=torch.bfloat16, device="cuda"))
    assert tuple(q.shape) == (0, 7168) and tuple(s.shape) == (0, 14)
    q, s = fgq.quantize(cupy.empty((2, 0, 512), dtype=cupy.float16), layout="col_tma")
    assert q.shape == (2, 0, 512) and s.shape == (2, 0, 4)


def test_gpu_argument_checks_write_nothing():
    import torch

    x = torch.randn(8, 512, dtype=torch.bfloat16, device="cuda")
    q = torch.full((8 * 512 + 1,), 0x7F, dtype=torch.uint8, device="cuda")
    s = torch.full((8, 4), 0x7F7F7F7F, dtype=torch.int32, device="cuda").t().contiguous().t()
    with pytest.raises(ValueError, match="out: expected a 16-byte aligned"):
        fgq.quantize_packed(x, out=q[1:].view(8, 512), scale_out=s[:, :1])
    with pytest.raises(TypeError, match="out: expected a torch CPU tensor like x"):
        fgq.quantize_packed(x.cpu(), out=torch.empty(8, 512, dtype=torch.uint8, device="cuda"))
    with pytest.raises(TypeError, match="out: expected a CUDA tensor"):
        fgq.quantize_packed(x, out=torch.empty(8, 512, dtype=torch.float8_e4m3fn))
    with pytest.raises(TypeError, match="out: expected a torch array like x"):
        import cupy

        fgq.quantize_packed(x, out=cupy.empty((8, 512), cupy.uint8))
    torch.cuda.synchronize()
    assert (q == 0x7F).all() and (s == 0x7F7F7F7F).all()


def test_dequantize_and_unpack_on_device_match_host():
    import cupy
    import torch

    data = activations(np.random.default_rng(6), (33, 1024), "bfloat16")
    q_ref, s_ref = fgq.quantize_packed(data)
    x_ref = fgq.dequantize(q_ref, s_ref)
    for lib in ("cupy", "torch"):
        q, s = fgq.quantize_packed(to_device(data, lib))
        x_back = fgq.dequantize(q, s)
        host = cupy.asnumpy(x_back) if lib == "cupy" else x_back.cpu().numpy()
        np.testing.assert_array_equal(host, x_ref)
        floats = fgq.unpack_scales(s, 8)
        host = cupy.asnumpy(floats) if lib == "cupy" else floats.cpu().numpy()
        np.testing.assert_array_equal(host, fgq.unpack_scales(s_ref, 8))
    view = fgq.as_float8(cupy.asarray(np.asarray(q_ref).view(np.uint8)))
    assert view.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_prepared_calls_and_the_plan_cache_follow_the_data(lib):
    rng = np.random.default_rng(8)
    hosts = [activations(rng, (16, 7168), "bfloat16", specials=True) for _ in range(2)]
    devices = [to_device(h, lib) for h in hosts]
    prepared = fgq.prepare(devices[0], scale="ue8m0", layout="packed")
    for host, x in zip(hosts + hosts[:1], devices + devices[:1], strict=True):
        q_ref, s_ref = fgq.quantize_packed(host)
        for q, s in (prepared(x), fgq.quantize_packed(x)):  # prepared, then the cached plan
            assert_same_bytes(to_host_bytes(q), np.asarray(q_ref).view(np.uint8), "q")
            assert_same_bytes(to_host_bytes(s), np.ascontiguousarray(s_ref), "scales")
    assert prepared(devices[1])[0] is prepared.q  # the same buffers every call
    other = to_device(activations(rng, (8, 7168), "bfloat16"), lib)
    with pytest.raises(ValueError, match="x: this call was prepared"):
        prepared(other)
    with pytest.raises(ValueError, match="x: this call was prepared"):
        prepared(wider_rows(hosts[0], 3, lib, 1))  # same shape, another stride and alignment
    with pytest.raises(TypeError, match="prepare needs a cupy array or torch CUDA tensor"):
        fgq.prepare(hosts[0])


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_repeated_calls_take_the_cached_plan(lib, monkeypatch):
    from fp8_group_quant import api

    rng = np.random.default_rng(9)
    hosts = [activations(rng, (5, 2048), "float16") for _ in range(2)]
    first = to_device(hosts[0], lib)
    fgq.quantize(first, 64, dtype="e5m2", layout="col_tma")
    q_ref, s_ref = fgq.quantize(hosts[1], 64, dtype="e5m2", layout="col_tma")  # NumPy: unplanned

    def validate_again(*args, **kwargs):
        raise AssertionError("a repeated call of the same kind was validated and planned again")

    monkeypatch.setattr(api, "_quantize_new", validate_again)
    q, s = fgq.quantize(to_device(hosts[1], lib), 64, dtype="e5m2", layout="col_tma")
    assert_same_bytes(to_host_bytes(q), np.asarray(q_ref).view(np.uint8), "q")
    assert_same_bytes(to_host_bytes(s), np.ascontiguousarray(s_ref), "scales")


def test_prepared_call_from_a_fresh_thread():
    import threading

    import torch

    data = activations(np.random.default_rng(10), (8, 2048), "bfloat16")
    x = to_device(data, "torch")
    prepared = fgq.prepare(x, scale="ue8m0", layout="packed")
    prepared.q.view(torch.uint8).fill_(0x7F)  # only the thread's launch can restore it
    torch.cuda.synchronize()
    errors = []

    def call():  # this thread's first CUDA call is the prepared launch
        try:
            prepared(x)
            torch.cuda.synchronize()
        except Exception as error:
            errors.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert not errors, errors
    q_ref, s_ref = fgq.quantize_packed(data)
    assert_same_bytes(to_host_bytes(prepared.q), np.asarray(q_ref).view(np.uint8), "q")


# import and warm-up: no context until the first call or warmup -----------------------------------

CONTEXT_PROBE = """
import ctypes, sys
import fp8_group_quant
from fp8_group_quant import _jit
cuda = ctypes.CDLL("libcuda.so.1")
count = ctypes.c_int()
assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
active = []
for ordinal in range(count.value):
    device, flags, state = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(device), ordinal)
    cuda.cuDevicePrimaryCtxGetState(device, ctypes.byref(flags), ctypes.byref(state))
    active.append(state.value)
current = ctypes.c_void_p()
cuda.cuCtxGetCurrent(ctypes.byref(current))
print("active", active, "current", current.value, "modules", len(_jit._functions))
assert "cupy" not in sys.modules or not any(active)
"""


def test_import_compiles_but_creates_no_cuda_context(tmp_path):
    import subprocess
    import sys

    env = dict(os.environ, FP8_GROUP_QUANT_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", CONTEXT_PROBE], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "current None" in done.stdout and "modules 0" in done.stdout, done.stdout
    assert "active [0" in done.stdout and " 1" not in done.stdout.split("current")[0]
    # the default kernel was compiled into the disk cache at import, for this device's target
    assert len(list(tmp_path.glob("quantize-*.cubin"))) == 1


def test_warmup_loads_the_variants_asked_for():
    import cupy

    from fp8_group_quant import _jit

    device = cupy.cuda.runtime.getDevice()
    loaded = fgq.warmup(device, [{"input_dtype": "float16", "dtype": "e4m3fnuz", "layout": "col"}])
    expression = (
        "fgq::quantize_groups<fgq::kF16, 128, fgq::kE4M3FNUZ, fgq::kFloat32Scale, "
        "fgq::kFloatWords, true, {}, fgq::kIdentity>"
    )
    # both paths (col's row tiles have no load linear in the slot)
    assert loaded == [expression.format("true"), expression.format("false")]
    loaded = fgq.warmup(device, [{"input_dtype": "float16", "dtype": "e4m3fnuz", "layout": "row"}])
    assert loaded == [  # row's tiles of one row: the one-pass kernel of contiguous rows too
        expression.format("true").replace(">", ", 0, true>"),
        expression.format("true"),
        expression.format("false"),
    ]
    fused = fgq.warmup(device, [{"scale": "ue8m0", "layout": "packed", "activation": "silu_mul"}])
    assert fused == [  # the fused modes have the one-pass kernel only
        "fgq::quantize_groups<fgq::kBF16, 128, fgq::kE4M3, fgq::kUE8M0Scale, "
        "fgq::kPackedExponents, true, true, fgq::kSiluMul>"
    ]
    assert all((device, _launch.SOURCE, e) in _jit._functions for e in loaded)
    assert fgq.warmup(device) == [key.name_expression for key in _launch.DEFAULT_KEYS]
    with pytest.raises(TypeError, match="variants: unknown option"):
        fgq.warmup(device, [{"colour": "red"}])
    with pytest.raises(ValueError, match="layout=.packed. packs UE8M0"):
        fgq.warmup(device, [{"layout": "packed"}])


# grid edges: more batches than grid z holds, offsets that need 64 bits ----------------------------


@pytest.mark.parametrize("layout", ["row", "packed"])
def test_more_batches_than_grid_z_holds(layout, kernel_path):
    # 70000 batches of one row: the launch folds batches into grid x and the kernel divides;
    # packed pads each batch to four rows
    rng = np.random.default_rng(12)
    x = activations(rng, (70000, 1, 256), "bfloat16", specials=True)
    check(x, to_device(x, "cupy"), "cupy", 128, "e4m3", "ue8m0", layout)


@pytest.mark.parametrize("layout", ["packed", "row"])
@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_the_linear_slot_load_only_where_rows_are_contiguous(lib, layout, kernel_path):
    # the one-pass kernel loads slot s at x + s * G where rows are K apart and batches rows * K
    # (its kFlat instantiation, _launch.flat_slots; docs/perf.md step 25); every other
    # arrangement of the same values reads through the strides, and each writes what NumPy does
    import cupy

    from fp8_group_quant._arrays import describe
    from fp8_group_quant._request import make_request

    rng = np.random.default_rng(25)
    args = (lib, 128, "e4m3", "ue8m0", layout)
    x = activations(rng, (3, 5, 2048), "bfloat16", specials=True)
    cases = [
        (x, to_device(x, lib), 1),  # contiguous batches
        (x[:, :4], to_device(x, lib)[:, :4], 0),  # batches 5 rows apart, 4 real
        (x[1], wider_rows(x[1], 256, lib, 128), 0),  # rows inside wider rows
        (x[1, 2:3], wider_rows(x[1], 256, lib, 128)[2:3], 1),  # one row of a wider buffer
        (x[:, 1:2], to_device(x, lib)[:, 1:2], 0),  # batches of one row, 5 rows apart
    ]
    if lib == "cupy":  # rows in reverse (torch has no negative strides)
        cases.append((x[0, ::-1], to_device(x, lib)[0, ::-1], 0))
    ordinal = cupy.cuda.runtime.getDevice()
    for host, device, flat in cases:
        request = make_request(describe(device, "x"), *args[1:], 1e-10, False)
        key = request.kernel_key()
        assert _launch.flat_slots(request, _launch.tile_rows(layout, key.lanes_per_group)) == flat
        if kernel_path == "one pass":  # the launch takes that instantiation
            expression = dataclasses.replace(key, one_pass=True, flat=bool(flat)).name_expression
            function = _jit.get_function(_launch.SOURCE, expression, ordinal)
            assert _launch.prepare(request, ordinal).handle == function.kernel.ptr, host.shape
        check(np.ascontiguousarray(host), device, *args)


def test_negative_row_strides_take_64_bit_offsets():
    import cupy

    from fp8_group_quant._arrays import describe
    from fp8_group_quant._request import make_request

    rng = np.random.default_rng(13)
    x = activations(rng, (37, 1024), "float16", specials=True)
    reversed_rows = cupy.asarray(x)[::-1]
    request = make_request(
        describe(reversed_rows, "x"), 128, "e4m3", "ue8m0", "packed", 1e-10, False
    )
    assert request.x_row_stride < 0
    check(x[::-1].copy(), reversed_rows, "cupy", 128, "e4m3", "ue8m0", "packed")


# Programmatic Dependent Launch -------------------------------------------------------------------


def test_pdl_is_on_for_sm90_and_off_by_switch(monkeypatch):
    import cupy
    import torch

    from fp8_group_quant import api

    device = cupy.cuda.runtime.getDevice()
    x = to_device(activations(np.random.default_rng(14), (8, 1024), "bfloat16"), "torch")
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    assert fgq.prepare(x)._plan.launch.pdl == (torch.cuda.get_device_capability(device)[0] >= 9)
    monkeypatch.setattr(_launch, "PDL", False)  # FP8_GROUP_QUANT_PDL=0
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    assert fgq.prepare(x)._plan.launch.pdl is False


@pytest.mark.parametrize("pdl", [True, False])
def test_pdl_chain_in_a_torch_graph(pdl, monkeypatch):
    # producer (a torch op) -> quantize -> consumer (a torch op reading q), captured and replayed:
    # with PDL the quantizer may start early, so it must wait for x and not overwrite q early
    import torch

    from fp8_group_quant import api

    monkeypatch.setattr(_launch, "PDL", pdl)
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    rng = np.random.default_rng(15)
    # no subnormals: halving them in bf16 step by step would round differently from once
    source = to_device(activations(rng, (33, 2048), "bfloat16"), "torch")
    x = torch.empty_like(source)
    q, s = fgq.quantize_packed(x)
    total = torch.zeros((), dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(4):
            x.copy_(source * 2)  # producer
            fgq.quantize_packed(x, out=q, scale_out=s)
            total.add_(q.view(torch.uint8).sum(dtype=torch.float32))  # consumer
            source.mul_(0.5)
    graph.replay()
    torch.cuda.synchronize()
    # the last step quantized source * 2 after three halvings
    data = activations(np.random.default_rng(15), (33, 2048), "bfloat16")
    expected = (data.astype(np.float32) * 2 * 0.5**3).astype(data.dtype)
    q_ref, s_ref = fgq.quantize_packed(expected)
    assert_same_bytes(to_host_bytes(q), np.asarray(q_ref).view(np.uint8), "q")
    assert np.array_equal(s.cpu().numpy(), s_ref)


def test_bench_chain_runs_and_checks(capsys):
    from fp8_group_quant import bench

    args = bench.main(["--chain", "--m", "1", "64", "--k", "2048"])
    assert args == 0
    out = capsys.readouterr().out
    assert "no PDL" in out and len([line for line in out.splitlines() if line[:6].strip()]) >= 3


# issue 11: regression tests of the host layer, and extreme sizes ----------------------------------


def test_cupy_scale_out_is_held_to_its_memory():  # item 4, as far as CuPy allows
    import cupy

    rng = np.random.default_rng(4)
    x_host = activations(rng, (7, 512), "bfloat16")
    x = cupy.asarray(x_host)
    expected = fgq.quantize(x_host, 128, layout="col_tma")[1]
    # a view made by slicing an allocation of the padded storage: written in full
    room = cupy.full(40, np.nan, cupy.float32)
    view = room[:32].reshape(4, 8).T[:7]  # col_tma: 4 groups x tma = 8 rows, 7 real
    assert fgq.quantize(x, 128, layout="col_tma", scale_out=view)[1] is view
    np.testing.assert_array_equal(view.get(), expected)
    assert (room[:32].reshape(4, 8)[:, 7].get() == 0).all()  # the padding row, zeroed
    assert bool(cupy.isnan(room[32:]).all())  # nothing past the layout's storage
    # a view whose memory block ends before the storage does: refused, nothing written
    block = cupy.cuda.alloc(512)  # one pool block of exactly 512 bytes
    tail = cupy.ndarray((31,), cupy.float32, block + (512 - 31 * 4))
    tail.fill(np.nan)
    short = cupy.lib.stride_tricks.as_strided(tail, (7, 4), (4, 32))
    with pytest.raises(ValueError, match="scale_out: the layout owns 128 bytes .* holds 124"):
        fgq.quantize(x, 128, layout="col_tma", scale_out=short)
    assert bool(cupy.isnan(tail).all())


@pytest.mark.parametrize("lib", ["cupy", "torch"])
@pytest.mark.parametrize("shape", [(4, 0), (0, 256), (2, 0, 128), (0,)])
def test_empty_gpu_inputs_return_empty_outputs(lib, shape):  # item 5: K = 0 on the GPU
    x = to_device(np.empty(shape, INPUT_TYPES["bfloat16"].numpy_dtype), lib)
    for layout in ("packed", "col_tma", "row"):
        q, s = fgq.quantize(x, 128, scale="ue8m0", layout=layout)
        geometry = Geometry(tuple(shape), 128, layout, False)
        assert tuple(q.shape) == tuple(shape) and tuple(s.shape) == geometry.scale_shape


def test_gpu_outputs_overlapping_the_input_are_refused():  # item 6
    import cupy

    memory = cupy.zeros(4 * 512 * 2 + 64, cupy.uint8)
    x = memory[: 4 * 512 * 2].view(INPUT_TYPES["bfloat16"].numpy_dtype).reshape(4, 512)
    x[...] = cupy.asarray(activations(np.random.default_rng(6), (4, 512), "bfloat16"))
    before = memory.copy()
    with pytest.raises(ValueError, match="out: .* overlaps x"):
        fgq.quantize_packed(x, out=memory[1024 : 1024 + 2048].reshape(4, 512))
    scales = memory[4 * 512 * 2 - 8 : 4 * 512 * 2 + 8].view(cupy.int32).reshape(1, 4).T
    with pytest.raises(ValueError, match="scale_out: .* overlaps x"):
        fgq.quantize_packed(x, scale_out=scales)
    fgq.quantize_packed(x)  # the plan these calls made still serves a valid call
    assert bool((memory == before).all())


def test_sixteen_threads_first_use_compiles_each_kernel_once(tmp_path, monkeypatch):  # item 7
    import threading

    import cupy

    monkeypatch.setenv(_jit.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(_jit, "_functions", {})
    monkeypatch.setattr(_jit, "_loading", {})
    from fp8_group_quant import api

    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    compiles, real, lock = [], _jit._nvrtc_compile, threading.Lock()

    def counting(filename, expressions, target, extra=()):
        with lock:
            compiles.append(tuple(expressions))
        return real(filename, expressions, target, extra)

    monkeypatch.setattr(_jit, "_nvrtc_compile", counting)
    layouts = ["row", "col", "col_tma", "packed"]
    x = cupy.asarray(activations(np.random.default_rng(7), (8, 1024), "bfloat16"))
    barrier, errors = threading.Barrier(16), []

    def work(i):
        try:
            barrier.wait()
            fgq.quantize(x, 128, scale="ue8m0", layout=layouts[i % 4])
            cupy.cuda.runtime.deviceSynchronize()
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(compiles) == len(set(compiles)), compiles  # no kernel compiled twice
    assert len(set(compiles)) <= 4  # row, col and col_tma may share one address function


@pytest.mark.parametrize("variable", ["CUPY_CACHE_DIR", _jit.CACHE_DIR_ENV])
def test_a_cache_directory_that_is_a_file_does_not_stop_a_call(tmp_path, variable):  # item 9
    import subprocess
    import sys

    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    script = (  # warnings recorded from the import on: the import compiles the default kernel
        "import warnings\n"
        "caught = warnings.catch_warnings(record=True).__enter__()\n"
        "warnings.simplefilter('always')\n"
        "import numpy as np, torch, ml_dtypes\n"
        "import fp8_group_quant as fgq\n"  # before cupy: CuPy's import needs its cache
        "x = np.random.default_rng(9).standard_normal((5, 256)).astype(ml_dtypes.bfloat16)\n"
        "xt = torch.from_numpy(x.view(np.int16).copy()).view(torch.bfloat16).cuda()\n"
        "q, s = fgq.quantize_packed(xt)\n"
        "q2, s2 = fgq.quantize(xt, 128, layout='col_tma')\n"
        "q_ref, s_ref = fgq.quantize_packed(x)\n"
        "assert (q.view(torch.uint8).cpu().numpy() == q_ref.view(np.uint8)).all()\n"
        "assert (s.cpu().numpy() == s_ref).all()\n"
        "print('warnings:', [str(w.message) for w in caught if w.category is RuntimeWarning])\n"
    )
    env = dict(os.environ, **{variable: str(blocker)})
    if variable != _jit.CACHE_DIR_ENV:
        env[_jit.CACHE_DIR_ENV] = str(tmp_path / "ours")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    warned = done.stdout.split("warnings:", 1)[1]
    assert warned.count(f"{variable}") == 1, done.stdout  # once, naming the variable


@pytest.mark.parametrize(
    "m, k", [(131072, 7168), (64, 16384), (1_048_576, 128), (1, 16384), (3, 128)]
)  # many rows, the widest K, a million one-group rows, one token
def test_extreme_sizes_sampled_rows_and_full_padding(m, k):
    import cupy

    rng = np.random.default_rng(m + k)
    x = cupy.random.default_rng(m).standard_normal((m, k), dtype=cupy.float32)
    x = x.astype(INPUT_TYPES["bfloat16"].numpy_dtype)
    rows = sorted({0, 1, m // 2, m - 2, m - 1, *rng.integers(0, m, 6).tolist()} & set(range(m)))
    x[rows[-1], -1] = 3.0e4  # an outlier in the last group of a sampled row
    geometry = Geometry((m, k), 128, "packed", True)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, "cupy", "e4m3")
    fgq.quantize_packed(x, out=q, scale_out=s, pad_rows=True)
    x_rows = x[rows].get()
    q_ref, s_ref = fgq.quantize_packed(x_rows)
    assert_same_bytes(q[rows].get().view(np.uint8), q_ref.view(np.uint8), f"q rows {rows}")
    assert_same_bytes(s[rows].get(), np.ascontiguousarray(s_ref), f"scales rows {rows}")
    # every padding byte, of q and of the scales, is zero
    tma = geometry.q_rows
    assert bool((q_buf.reshape(tma, k)[m:] == 0).all())
    s_words = s_buf.reshape(geometry.scale_columns, tma)
    assert bool((s_words[:, m:] == 0).all())
    assert not bool((s_words[:, :m] == 0x7F7F7F7F).any())  # every real word written


# the fused SiLU-and-multiply input (issue 13) -----------------------------------------------------


def check_silu_mul(x_host, x_device, lib, group_size, dtype, scale, layout, pad_rows=False):
    """The fused kernel into poisoned outputs against the NumPy backend's fused path, every
    storage byte; and against quantizing the NumPy SiLU-and-multiply values on their own."""
    from fp8_group_quant.activation import silu_mul

    n = x_host.shape[-1] // 2
    geometry = Geometry((*x_host.shape[:-1], n), group_size, layout, pad_rows)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, lib, dtype)
    options = dict(dtype=dtype, scale=scale, layout=layout, pad_rows=pad_rows)
    q_got, s_got = fgq.quantize(
        x_device, group_size, **options, out=q, scale_out=s, activation="silu_mul"
    )
    assert q_got is q and s_got is s
    values = silu_mul(x_host[..., :n], x_host[..., n:], x_host.dtype.name)
    q_ref, s_ref = reference_storage(values, geometry, dtype, scale, 1e-10)
    what = f"silu_mul {lib} {x_host.dtype} G={group_size} {dtype} {scale} {layout} {x_host.shape}"
    assert_same_bytes(to_host_bytes(q_buf), q_ref, f"q ({what})", inputs=values)
    assert_same_bytes(to_host_bytes(s_buf), s_ref, f"scales ({what})")
    q_host, s_host = fgq.quantize(x_host, group_size, **options, activation="silu_mul")
    q2, s2 = fgq.quantize(x_device, group_size, **options, activation="silu_mul")
    assert tuple(q2.shape) == geometry.shape == q_host.shape
    assert_same_bytes(to_host_bytes(q2), np.ascontiguousarray(q_host).view(np.uint8).ravel(),
                      f"q, allocated ({what})")  # fmt: skip
    assert_same_bytes(to_host_bytes(s2), to_host_bytes(s), f"scales, allocated ({what})")


def gates_and_ups(rng, shape, input_dtype):
    """[..., 2N] input whose gates cover every regime of the defined SiLU (|g| up to 120,
    tiny, NaN, +-Inf, +-0) and whose ups carry outliers, NaN and Inf."""
    gate = activations(rng, shape, input_dtype, specials=True).astype(np.float32)
    flat = gate.reshape(-1)
    picks = rng.random(flat.size) < 0.3
    flat[picks] = rng.uniform(-120.0, 120.0, int(picks.sum())).astype(np.float32)
    flat[: min(flat.size, 6)] = [np.nan, np.inf, -np.inf, 0.0, -0.0, -64.0][: min(flat.size, 6)]
    up = activations(rng, shape, input_dtype, specials=True)
    return np.concatenate([gate.astype(up.dtype), up], axis=-1)


@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS)
def test_silu_mul_every_combination(input_dtype, group_size, dtype, scale, layout):
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("torch", "cupy")[index % 2]
    rng = np.random.default_rng(1000 + index)
    check_silu_mul_shapes(rng, input_dtype, lib, group_size, dtype, scale, layout)


def check_silu_mul_shapes(rng, input_dtype, lib, group_size, dtype, scale, layout):
    """check_silu_mul on a few rows of an odd group count, batched rows with padded q rows,
    and one token of N = 7168 inside a wider buffer."""
    args = (lib, group_size, dtype, scale, layout)
    x = gates_and_ups(rng, (5, 3 * group_size), input_dtype)  # odd group count, 5 rows
    check_silu_mul(x, to_device(x, lib), *args)
    x = gates_and_ups(rng, (2, 3, 7168 // 2), input_dtype)  # batched, padded q rows
    check_silu_mul(x, to_device(x, lib), *args, pad_rows=True)
    x = gates_and_ups(rng, (1, 7168), input_dtype)  # one token, N = 7168
    check_silu_mul(x, wider_rows(x, 128, lib, 64), *args)  # rows inside a wider buffer


SIX_BLOCK_COMBINATIONS = [c for c in COMBINATIONS if c[0] == "bfloat16" and c[3] == "ue8m0"]


@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", SIX_BLOCK_COMBINATIONS)
def test_silu_mul_on_six_blocks(monkeypatch, input_dtype, group_size, dtype, scale, layout):
    # the one-pass bfloat16 kernels' six-block instantiation (40 registers), which large grids
    # take (_launch.SILU_SIX_BLOCKS_WAVES): forced here at every size; the blocked layout has
    # none (it spills at 40 registers) and keeps the five-block kernel
    from fp8_group_quant import api

    index = SIX_BLOCK_COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("torch", "cupy")[index % 2]
    rng = np.random.default_rng(5000 + index)
    monkeypatch.setattr(_launch, "SILU_SIX_BLOCKS_WAVES", 0.0)
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    check_silu_mul_shapes(rng, input_dtype, lib, group_size, dtype, scale, layout)
    x = gates_and_ups(rng, (300, 2 * 1024), input_dtype)  # many blocks
    check_silu_mul(x, to_device(x, lib), lib, group_size, dtype, scale, layout)
    launch = silu_mul_launch(to_device(x, "cupy"), group_size, dtype, scale, layout)
    six = layout != "blocked"
    assert launch.handle == silu_kernel(group_size, dtype, scale, layout, six)


def silu_kernel(group_size, dtype, scale, layout, six: bool) -> int:
    """The handle of the one-pass bfloat16 SiLU instantiation with six blocks an SM or five."""
    from fp8_group_quant._layout import SCALE_LAYOUTS

    key = _launch.KernelKey("bfloat16", group_size, dtype, scale,
                            SCALE_LAYOUTS[layout].kernel_trait, True, True, "silu_mul",
                            blocks_per_sm=_launch.SILU_SIX_BLOCKS if six else 0)  # fmt: skip
    function = _jit.get_function(_launch.SOURCE, key.name_expression, cupy_device())
    return function.kernel.ptr


def cupy_device() -> int:
    import cupy

    return cupy.cuda.Device().id


@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS[::3])
def test_silu_mul_on_the_persistent_grid(
    monkeypatch, input_dtype, group_size, dtype, scale, layout
):
    # large plain SiLU-and-multiply inputs without padding rows take the masked layout's
    # persistent kernel with every row real (fused_takes_persistent): forced here at any size,
    # batched, inside wider rows, and a padded input that must keep the one-pass grid
    from fp8_group_quant import api

    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("torch", "cupy")[index % 2]
    rng = np.random.default_rng(3000 + index)
    monkeypatch.setattr(_launch, "PERSISTENT_FUSED_WAVES", 0.0)
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    persistent = []
    prepare_masked = _launch._prepare_masked

    def recorded(request, key, device):
        persistent.append(request.masked is None and key.masked)
        return prepare_masked(request, key, device)

    monkeypatch.setattr(_launch, "_prepare_masked", recorded)
    args = (lib, group_size, dtype, scale, layout)
    x = gates_and_ups(rng, (3, 128, 5 * group_size), input_dtype)  # no padding rows: persistent
    check_silu_mul(x, to_device(x, lib), *args)
    x = gates_and_ups(rng, (256, 2 * group_size), input_dtype)
    check_silu_mul(x, wider_rows(x, 128, lib, 64), *args)  # rows inside a wider buffer
    assert persistent and all(persistent)
    persistent.clear()
    x = gates_and_ups(rng, (129, 2 * group_size), input_dtype)
    check_silu_mul(x, to_device(x, lib), *args)
    padded = Geometry((129, 2 * group_size), group_size, layout, False).grid_rows > 129
    assert (not persistent) if padded else all(persistent) and persistent  # padding: one pass


@pytest.mark.parametrize("rows", [152, 292, 420, 556])  # whole TMA boxes: no padding rows
def test_silu_mul_persistent_grid_walks_several_steps(monkeypatch, rows):
    # one block an SM: the persistent grid's blocks walk the slots of one batch (the kernel's
    # single-expert path) in 2-5 steps, the last one partly past the end
    import cupy

    from fp8_group_quant import api

    monkeypatch.setattr(_launch, "PERSISTENT_FUSED_WAVES", 0.0)
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    masked_grid, walked = _launch._masked_grid, []

    def one_block_an_sm(key, device):
        handle, _, sms = masked_grid(key, device)
        walked.append(key.masked)
        return handle, 1, sms

    monkeypatch.setattr(_launch, "_masked_grid", one_block_an_sm)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    slots_a_step = sms * _launch.cpp_constant("kMaskedThreads") // 8  # 8 lanes a group
    assert 2 <= -(-rows * 16 // slots_a_step) <= 6  # 16 groups a row
    x = gates_and_ups(np.random.default_rng(rows), (rows, 2 * 2048), "bfloat16")
    for lib, scale, layout in (("cupy", "ue8m0", "packed"), ("torch", "float32", "row")):
        check_silu_mul(x, to_device(x, lib), lib, 128, "e4m3", scale, layout)
    assert walked and all(walked)


@pytest.mark.parametrize(
    "input_dtype, table_copy, blocks",
    [("bfloat16", "bulk", 5), ("bfloat16", "threads", 5), ("bfloat16", "bulk", 6),
     ("bfloat16", "threads", 6), ("float16", "bulk", 5), ("float16", "threads", 5)],
)  # fmt: skip
def test_silu_mul_every_16_bit_gate(monkeypatch, input_dtype, table_copy, blocks):
    # every 16-bit pattern as a gate (both signs of NaN, Inf, subnormals), against random ups;
    # the bfloat16 one-pass blocks' band table copied both ways (Params.table_by_threads), by
    # the kernel at five blocks an SM and at six (_launch.SILU_SIX_BLOCKS_WAVES)
    from fp8_group_quant import api

    waves = 0.0 if table_copy == "threads" else math.inf
    monkeypatch.setattr(_launch, "TABLE_BY_THREADS_WAVES", waves)
    monkeypatch.setattr(_launch, "SILU_SIX_BLOCKS_WAVES", 0.0 if blocks == 6 else math.inf)
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    rng = np.random.default_rng(5)
    gate = np.arange(65536, dtype=np.uint16).view(NP_INPUT[input_dtype]).reshape(256, 256)
    up = activations(rng, (256, 256), input_dtype)
    x = np.concatenate([gate, up], axis=-1)
    for scale, layout in (("float32", "row"), ("ue8m0", "packed")):
        check_silu_mul(x, to_device(x, "cupy"), "cupy", 128, "e4m3", scale, layout)
    launch = silu_mul_launch(to_device(x, "cupy"))
    assert launch.params.table_by_threads == (table_copy == "threads")
    if input_dtype == "bfloat16":
        six = blocks == 6
        assert launch.handle == silu_kernel(128, "e4m3", "ue8m0", "packed", six)


POISON_SHARED = r"""
extern "C" __global__ void poison_shared(unsigned int word) {
  extern __shared__ unsigned int shared[];
  for (int i = threadIdx.x; i < 12288; i += blockDim.x) shared[i] = word;
}
"""


def poison_shared_memory(word: int = 0x7FC00001) -> None:
    """Fill 48 KB of shared memory on every SM with ``word`` (a NaN), so a kernel that reads
    shared memory it never wrote reads that instead of a previous block's values."""
    import cupy

    kernel = cupy.RawKernel(POISON_SHARED, "poison_shared")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    kernel((sms * 8,), (256,), (np.uint32(word),), shared_mem=48 * 1024)
    cupy.cuda.runtime.deviceSynchronize()


@pytest.mark.parametrize("threads", [32, 64, 96])
@pytest.mark.parametrize("input_dtype", ["float16", "float32", "bfloat16"])
def test_silu_mul_in_blocks_of_few_threads(monkeypatch, input_dtype, threads):
    # FP8_GROUP_QUANT_ONE_PASS_THREADS may ask for blocks of 32 threads: the float16 and
    # float32 SiLU's exponential table (64 entries in shared memory) and bfloat16's band table
    # must still be filled whole; shared memory is poisoned first, so an entry left unwritten
    # reads a NaN rather than a previous block's copy
    from fp8_group_quant import api

    monkeypatch.setattr(_launch, "ONE_PASS_THREADS", threads)
    rng = np.random.default_rng(threads)
    x = gates_and_ups(rng, (96, 2 * 1024), input_dtype)
    # bfloat16's band table both ways: this small grid takes the bulk copy, and with
    # TABLE_BY_THREADS_WAVES at 0 every thread's cp.async (as test_shared_tables_are_filled_...);
    # the float16 and float32 exponential table is filled one way
    for by_threads in (False, True) if input_dtype == "bfloat16" else (False,):
        monkeypatch.setattr(_launch, "TABLE_BY_THREADS_WAVES", 0.0 if by_threads else 1e9)
        monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
        for scale, layout in (("ue8m0", "packed"), ("float32", "row")):
            poison_shared_memory()
            check_silu_mul(x, to_device(x, "cupy"), "cupy", 128, "e4m3", scale, layout)
        launch = silu_mul_launch(to_device(x, "cupy"))
        assert launch.block == (threads, 1, 1)
        assert launch.params.table_by_threads == by_threads


TABLE_PROBE = r"""
// each block poisons its table, fills it as the kernels do, and writes it out
extern "C" __global__ void exp_table_probe(unsigned int* out, unsigned int poison) {
  __shared__ fgq::ExpTable table;
  unsigned int* words = reinterpret_cast<unsigned int*>(table.entries);
  for (int i = threadIdx.x; i < 128; i += blockDim.x) words[i] = poison;
  __syncthreads();
  table.fill();
  for (int i = threadIdx.x; i < 128; i += blockDim.x) out[blockIdx.x * 128 + i] = words[i];
}
extern "C" __global__ void band_table_probe(unsigned int* out, unsigned int poison, int how) {
  __shared__ fgq::SiluBandTable table;
  unsigned int* words = reinterpret_cast<unsigned int*>(table.vectors);
  for (int i = threadIdx.x; i < fgq::kSiluBandWords; i += blockDim.x) words[i] = poison;
  __syncthreads();
  if (how == 2) {
    table.fill();  // the walking grids' copy
  } else {
    table.start(how == 1);  // each thread's cp.async, else one bulk copy
    table.wait(how == 1);
  }
  for (int i = threadIdx.x; i < fgq::kSiluBandWords; i += blockDim.x) {
    out[blockIdx.x * fgq::kSiluBandWords + i] = words[i];
  }
}
"""


@pytest.mark.parametrize("threads", [32, 64, 96, 128, 256])
def test_shared_tables_are_filled_by_blocks_of_any_size(threads):
    # the SiLU's shared-memory tables as a block of `threads` threads fills them: the float16 /
    # float32 exponential table (ExpTable::fill) and the bfloat16 band table by its bulk copy
    # and by every thread's cp.async (SiluBandTable::start / wait, every replica) and by the
    # walking grids' fill(), over poisoned words; deterministic, unlike a quantize call on
    # stale shared memory
    import cupy

    from fp8_group_quant import activation

    module = cupy.RawModule(code=_jit.source_text("activation.cuh") + TABLE_PROBE,
                            options=_jit.nvrtc_options())  # fmt: skip
    poison = np.uint32(0x7FC00001)
    blocks = 2 * 8  # every replica of the band table twice
    out = cupy.zeros(blocks * 128, cupy.uint32)
    module.get_function("exp_table_probe")((blocks,), (threads,), (out, poison))
    expected = np.frombuffer(activation.EXP_TABLE.astype(np.float32).tobytes(), np.uint32)
    np.testing.assert_array_equal(out.get().reshape(blocks, 128), np.tile(expected, (blocks, 1)))
    band = np.frombuffer(activation.silu_band_entries().tobytes(), np.uint32)
    for how, name in enumerate(("one bulk copy", "every thread's cp.async", "fill()")):
        out = cupy.zeros(blocks * band.size, cupy.uint32)
        probe = module.get_function("band_table_probe")
        probe((blocks,), (threads,), (out, poison, np.int32(how)))
        np.testing.assert_array_equal(out.get().reshape(blocks, -1), np.tile(band, (blocks, 1)),
                                      err_msg=name)  # fmt: skip


def silu_mul_launch(x, group_size=128, dtype="e4m3", scale="ue8m0", layout="packed"):
    """The launch layer's plan for a plain SiLU-and-multiply call on ``x``."""
    from fp8_group_quant._arrays import describe
    from fp8_group_quant._request import make_request

    request = make_request(describe(x, "x"), group_size, dtype, scale, layout, 1e-10, False,
                           activation="silu_mul")  # fmt: skip
    return _launch.prepare(request, x.device.id)


@pytest.mark.parametrize("rows", [1, 64, 256, 1024, 2048])
def test_silu_mul_table_copy_follows_the_grid(rows):
    # the launch layer's choice: one bulk copy a block in one-pass grids of at most half a
    # resident wave, every thread's cp.async past it (_launch.TABLE_BY_THREADS_WAVES)
    import cupy

    launch = silu_mul_launch(cupy.zeros((rows, 2 * 7168), cupy.dtype("bfloat16")))
    device = cupy.cuda.Device().id
    per_sm, sms = _launch.resident_blocks(launch.handle, "silu", launch.block[0], device)
    wave, blocks = per_sm * sms, launch.grid[0]
    assert blocks == -(-rows * 7168 // 128 // 16)  # the one-pass grid: 16 groups a block
    assert launch.params.table_by_threads == (blocks > _launch.TABLE_BY_THREADS_WAVES * wave)
    if rows in (1, 2048):  # a block or two an SM; several waves
        assert launch.params.table_by_threads == (rows == 2048)
    # and past SILU_SIX_BLOCKS_WAVES resident waves of the five-block kernel, the six-block one
    six = blocks > _launch.SILU_SIX_BLOCKS_WAVES * wave
    assert launch.handle == silu_kernel(128, "e4m3", "ue8m0", "packed", six)
    if rows in (256, 2048):  # a fifth of a wave; five waves (ten blocks an SM, 132 SMs)
        assert six == (rows == 2048)


def test_silu_mul_float32_bit_patterns():
    rng = np.random.default_rng(6)
    bits = rng.integers(0, 2**32, (512, 1024), dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    check_silu_mul(x, to_device(x, "torch"), "torch", 64, "e5m2", "float32", "col_tma")


def test_silu_mul_refuses_what_it_cannot_read():
    import cupy

    x = cupy.asarray(activations(np.random.default_rng(7), (4, 512), "bfloat16"))
    with pytest.raises(ValueError, match="x: activation='silu_mul' reads gate and up halves"):
        fgq.quantize(x[:, :384], 128, activation="silu_mul")  # 384 = 2 * 192
    wide = cupy.zeros((4, 520), x.dtype)
    with pytest.raises(ValueError, match="x: activation='silu_mul' needs a 16-byte aligned"):
        fgq.quantize(wide[:, 4:516], 128, activation="silu_mul")
    with pytest.raises(ValueError, match="activation: expected None or one of 'silu_mul'"):
        fgq.quantize(x, 128, activation="gelu")
    q, s = fgq.quantize(cupy.zeros((0, 512), x.dtype), 128, activation="silu_mul")
    assert q.shape == (0, 256) and s.shape == (0, 2)


# the masked MoE layout (issue 13) -----------------------------------------------------------------


def check_masked(x_host, counts, lib, group_size, dtype, scale, layout, activation, **kwargs):
    """The masked kernel into poisoned device storage against the NumPy backend into poisoned
    host storage: every byte, the untouched ones included."""
    n = x_host.shape[-1] // (2 if activation else 1)
    geometry = Geometry((*x_host.shape[:-1], n), group_size, layout, False)
    options = dict(dtype=dtype, scale=scale, layout=layout, activation=activation)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, lib, dtype)
    counts_device = to_device(counts, lib)
    fgq.quantize(to_device(x_host, lib), group_size, **options, masked_m=counts_device, out=q,
                 scale_out=s, **kwargs)  # fmt: skip
    hq, hs, hq_buf, hs_buf = host_poisoned(geometry, dtype)
    fgq.quantize(x_host, group_size, **options, masked_m=counts, out=hq, scale_out=hs)
    what = f"masked {lib} {x_host.dtype} G={group_size} {dtype} {scale} {layout} {activation} "
    what += f"{x_host.shape} counts={list(counts)[:8]}"
    assert_same_bytes(to_host_bytes(q_buf), hq_buf, f"q ({what})")
    assert_same_bytes(to_host_bytes(s_buf), hs_buf, f"scales ({what})")


@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS)
def test_masked_every_combination(input_dtype, group_size, dtype, scale, layout):
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("cupy", "torch")[index % 2]
    activation = ("silu_mul", None)[index // 2 % 2]
    rng = np.random.default_rng(2000 + index)
    width = 3 * group_size * (2 if activation else 1)  # three groups: a partly used word
    x = activations(rng, (5, 7, width), input_dtype, specials=True)
    counts = np.array([0, 7, 3, -1, 12], (np.int32, np.int64)[index % 3 == 0])
    check_masked(x, counts, lib, group_size, dtype, scale, layout, activation)
    # rows of 64 groups: a block's slots of one step lie within two row tiles, so with at most
    # 32 experts the kernel keeps the scan in its lanes (kernels/quantize.cu, quantize_masked)
    x = activations(rng, (5, 7, 64 * group_size * (2 if activation else 1)), input_dtype)
    check_masked(x, counts, lib, group_size, dtype, scale, layout, activation)


@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16"])
def test_masked_silu_mul_every_16_bit_gate(input_dtype):
    # every 16-bit pattern as a gate through the masked kernel (bfloat16: its band table), four
    # experts of 64 rows with one row left out of each
    rng = np.random.default_rng(15)
    gate = np.arange(65536, dtype=np.uint16).view(NP_INPUT[input_dtype]).reshape(4, 64, 256)
    x = np.concatenate([gate, activations(rng, (4, 64, 256), input_dtype)], axis=-1)
    counts = np.array([63, 64, 64, 62], np.int32)
    check_masked(x, counts, "cupy", 128, "e4m3", "ue8m0", "packed", "silu_mul")


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_masked_many_experts_and_unbalanced_counts(lib):
    rng = np.random.default_rng(8)
    x = activations(rng, (32, 64, 2 * 1024), "bfloat16", specials=True)
    for counts in (
        rng.integers(0, 65, 32),  # random, some zero, some full
        np.where(np.arange(32) == 5, 64, 0),  # one expert holds every token
        np.zeros(32, np.int64),  # nothing at all
        np.full(32, 64),  # everything
    ):
        for hint in ({}, {"expected_m": 1}):  # a small hint still covers every row
            check_masked(x, counts.astype(np.int32), lib, 128, "e4m3", "ue8m0", "packed",
                         "silu_mul", **hint)  # fmt: skip
    one = activations(rng, (1, 300, 7168), "bfloat16")  # E = 1, many rows
    check_masked(one, np.array([257], np.int64), lib, 128, "e4m3", "float32", "col_tma", None)
    # 33 and 40 experts: past the 32 that the kernel scans in a warp's lanes (shared memory)
    for experts in (33, 40):
        x = activations(rng, (experts, 16, 1024), "bfloat16", specials=True)
        counts = rng.integers(-2, 19, experts)
        counts[[0, experts - 1]] = [16, 0]
        check_masked(x, counts, lib, 128, "e4m3", "ue8m0", "packed", None)
        check_masked(x, counts, lib, 64, "e5m2", "float32", "row", None, expected_m=3)


def test_masked_replays_in_a_cuda_graph_with_new_counts():
    import torch

    rng = np.random.default_rng(9)
    x_host = activations(rng, (8, 32, 2048), "bfloat16", specials=True)
    x = to_device(x_host, "torch")
    counts = torch.zeros(8, dtype=torch.int32, device="cuda")
    geometry = Geometry((8, 32, 1024), 128, "packed", False)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, "torch", "e4m3")
    options = dict(scale="ue8m0", layout="packed", activation="silu_mul")
    fgq.quantize(x, 128, **options, masked_m=counts, out=q, scale_out=s)  # plan and warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fgq.quantize(x, 128, **options, masked_m=counts, out=q, scale_out=s)
    for step in range(4):
        new = rng.integers(0, 33, 8).astype(np.int32)
        counts.copy_(torch.from_numpy(new))
        q_buf.fill_(Q_POISON)
        s_buf.view(torch.uint8).fill_(SCALE_POISON)  # bytewise: s_buf is the int32 view
        graph.replay()
        torch.cuda.synchronize()
        hq, hs, hq_buf, hs_buf = host_poisoned(geometry, "e4m3")
        fgq.quantize(x_host, 128, **options, masked_m=new, out=hq, scale_out=hs)
        assert_same_bytes(to_host_bytes(q_buf), hq_buf, f"q, replay {step}, counts {new}")
        assert_same_bytes(to_host_bytes(s_buf), hs_buf, f"scales, replay {step}, counts {new}")


def test_masked_m_must_live_with_x():
    import cupy
    import torch

    x = to_device(activations(np.random.default_rng(10), (2, 4, 256), "bfloat16"), "torch")
    with pytest.raises(ValueError, match="masked_m: expected an array of x's library"):
        fgq.quantize(x, 128, masked_m=cupy.asarray(np.array([1, 2], np.int32)))
    with pytest.raises((ValueError, TypeError), match="masked_m"):
        fgq.quantize(x, 128, masked_m=torch.tensor([1, 2], dtype=torch.int32))  # on the CPU
    with pytest.raises(TypeError, match="masked_m: expected int32 or int64"):
        fgq.quantize(x, 128, masked_m=torch.tensor([1, 2], dtype=torch.int16, device="cuda"))


# the fused RMSNorm kernel against the NumPy backend -----------------------------------------------


def check_norm(x_host, weight, eps_norm, residual, lib, group_size, dtype, scale, layout,
               pad_rows=False, x_device=None):  # fmt: skip
    """The RMSNorm kernel into poisoned device storage against the NumPy backend into poisoned
    host storage, every byte, and the residual written back against the NumPy one."""
    geometry = Geometry(x_host.shape, group_size, layout, pad_rows)
    options = dict(dtype=dtype, scale=scale, layout=layout, pad_rows=pad_rows)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, lib, dtype)
    r_device = None if residual is None else to_device(residual, lib)
    x_device = to_device(x_host, lib) if x_device is None else x_device
    fgq.quantize(x_device, group_size, **options, norm=(to_device(weight, lib), eps_norm),
                 residual=r_device, out=q, scale_out=s)  # fmt: skip
    hq, hs, hq_buf, hs_buf = host_poisoned(geometry, dtype)
    r_host = None if residual is None else residual.copy()
    fgq.quantize(x_host, group_size, **options, norm=(weight, eps_norm), residual=r_host,
                 out=hq, scale_out=hs)  # fmt: skip
    what = f"norm {lib} {x_host.dtype} G={group_size} {dtype} {scale} {layout} {x_host.shape}"
    what += " with residual" if residual is not None else ""
    assert_same_bytes(to_host_bytes(q_buf), hq_buf, f"q ({what})")
    assert_same_bytes(to_host_bytes(s_buf), hs_buf, f"scales ({what})")
    if residual is not None:
        assert_same_bytes(to_host_bytes(r_device), r_host, f"residual ({what})")


@pytest.fixture(params=["one lane, a block a row", "two lanes, one walking block"])
def norm_kernel(request, monkeypatch):
    """The RMSNorm kernel's two instantiations a combination has (one or two lanes a thread),
    the second as a single block that walks every row, whatever the rows."""
    from fp8_group_quant import api

    walking = request.param.startswith("two")
    monkeypatch.setattr(_launch, "NORM_LANES", 2 if walking else 1)
    monkeypatch.setattr(_launch, "NORM_WAVES", 1e-9 if walking else 0.0)  # one block, or a row each
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    return walking


@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", COMBINATIONS)
def test_norm_every_combination(norm_kernel, input_dtype, group_size, dtype, scale, layout):
    index = COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("cupy", "torch")[(index + norm_kernel) % 2]
    rng = np.random.default_rng(3000 + index + 500 * norm_kernel)
    k = 3 * group_size  # three groups: a partly used packed word
    x = activations(rng, (5, k), input_dtype, specials=index % 3 == 0)
    weight = activations(rng, (k,), input_dtype)
    residual = activations(rng, (5, k), input_dtype) if (index + norm_kernel) % 2 else None
    args = (lib, group_size, dtype, scale, layout)
    check_norm(x, weight, 1e-6, residual, *args)
    big = 16384 if input_dtype != "float32" else 8192  # the longest row: 1024 lanes
    for shape in ((2, 3, 7168), (3 if norm_kernel else 1, big)):
        x = activations(rng, shape, input_dtype, specials=True)
        weight = activations(rng, shape[-1:], input_dtype)
        residual = activations(rng, shape, input_dtype)
        check_norm(x, weight, 1e-5, residual, *args, pad_rows=True)
        check_norm(x, weight, 1e-5, None, *args)


@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16", "float32"])
def test_norm_nan_and_inf_in_any_lane_of_x_and_the_weight(input_dtype):
    # the quantizer's float maximum keeps NaN, and the residual written back is tested for NaN
    # only in lanes whose sum of squares is not finite (kernels/quantize.cu, norm_rows): rows of
    # one NaN, one Inf, squares that overflow to Inf (r = 0), a zero weight under an Inf,
    # weights holding Inf and NaN, and residuals that make NaN in the sum or bring it
    rng = np.random.default_rng(77)
    k = 2688  # 168 lanes of 16-bit input: the second lane of a thread partly past the row
    big = {"bfloat16": 1e30, "float16": 60000.0, "float32": 1e30}[input_dtype]
    x = activations(rng, (12, k), input_dtype).astype(np.float32)
    x[1, 5] = np.nan
    x[2, k - 1] = np.inf
    x[3, 1700] = -np.inf
    x[4, 100:140] = big  # squares overflow: S = Inf, r = 0
    x[5, 2000] = big
    x[6, 7] = np.inf  # under a zero weight below
    x[7] = 0.0
    weight = activations(rng, (k,), input_dtype).astype(np.float32)
    weight[7] = 0.0
    x = x.astype(NP_INPUT[input_dtype])
    check_norm(x, weight.astype(NP_INPUT[input_dtype]), 1e-6, None, "cupy", 128, "e4m3", "ue8m0",
               "packed")  # fmt: skip
    weight[[3, 1500, k - 2]] = [np.inf, np.nan, -np.inf]  # now a weight with Inf and NaN
    weight = weight.astype(NP_INPUT[input_dtype])
    check_norm(x, weight, 1e-6, None, "cupy", 128, "e4m3", "ue8m0", "packed")
    residual = activations(rng, (12, k), input_dtype).astype(np.float32)
    residual[2, k - 1] = -np.inf  # Inf + -Inf: a NaN made by the sum, written back
    residual[8, 9] = np.nan  # a NaN from the residual alone, in a row of finite x
    residual[9, 2600] = np.inf  # an Inf from the residual alone
    residual = residual.astype(NP_INPUT[input_dtype])
    check_norm(x, weight, 1e-6, residual, "torch", 64, "e5m2", "float32", "row")
    check_norm(x, weight, 1e-6, residual, "cupy", 128, "e4m3", "ue8m0", "packed")


@pytest.mark.parametrize("input_dtype", ["bfloat16", "float16"])
def test_norm_residual_sums_at_the_rounding_cases(norm_kernel, input_dtype):
    # 16-bit x + residual is one packed add (the exact sum rounded once; kernels/activation.cuh,
    # add_residual), the definition the float32 sum rounded: sums whose float32 value is
    # inexact, ties and near-ties, cancelling, subnormal and overflowing, written back and
    # normalised, in both kernels (one lane a thread, and two)
    rng = np.random.default_rng(41 + norm_kernel)
    for rows, k in ((6, 4096), (40, 2688)):
        x, residual = sums_at_rounding_hazards(rng, (rows, k), input_dtype)
        weight = activations(rng, (k,), input_dtype)
        check_norm(x, weight, 1e-6, residual, "cupy", 128, "e4m3", "ue8m0", "packed")
        check_norm(x, weight, 1e-6, residual, "torch", 64, "e5m2", "float32", "row")


@pytest.mark.parametrize("stash", [True, False])
@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize("waves", [0.0, 0.005, 1.0, 3.0])  # a block a row, a few, the default
def test_norm_blocks_walk_every_row_of_every_batch(monkeypatch, waves, lanes, stash):
    # the row loop: a grid of a few blocks walks 150 rows over three batches, alternating warp
    # slot sets; with the residual written back and padded rows zeroed at each batch's end.
    # Without the residual, two lanes walking take the weight-stashing kernel, or with
    # NORM_STASH off the general kernel
    from fp8_group_quant import api

    monkeypatch.setattr(_launch, "NORM_WAVES", waves)
    monkeypatch.setattr(_launch, "NORM_LANES", lanes)
    monkeypatch.setattr(_launch, "NORM_STASH", stash)
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    rng = np.random.default_rng(13)
    x = activations(rng, (3, 50, 2688), "bfloat16", specials=True)
    weight = activations(rng, (2688,), "bfloat16")
    residual = activations(rng, (3, 50, 2688), "bfloat16")
    check_norm(x, weight, 1e-6, residual, "torch", 128, "e4m3", "ue8m0", "packed", pad_rows=True)
    check_norm(x, weight, 1e-6, None, "cupy", 64, "e5m2", "float32", "col_tma", pad_rows=True)


@pytest.mark.parametrize("input_dtype, shape, group_size, dtype, scale, layout", [
    ("bfloat16", (3, 700, 7168), 128, "e4m3", "ue8m0", "packed"),
    ("float16", (40, 16384), 128, "e5m2", "float32", "row"),  # 64 KB of shared memory a block
    ("bfloat16", (333, 2688), 64, "int8", "float32", "col_tma"),  # a thread's second lane short
    ("float16", (257, 96), 32, "e4m3", "ue8m0", "blocked"),
])  # fmt: skip
def test_norm_walking_blocks_keep_the_weight_in_shared_memory(
    monkeypatch, input_dtype, shape, group_size, dtype, scale, layout
):
    # the weight-stashing kernel (16-bit input, no residual, a grid that walks): each thread's
    # weight values as float32 in shared memory, r from one warp behind a second barrier, the
    # next row prefetched into L2 while a block has two more; grids of a few blocks walk many
    # rows (and batches), and the kernel the launch took is checked
    from fp8_group_quant import _jit, api

    names, opt_ins = [], []
    get_function = _jit.get_function

    def spy(source, expression, device):
        names.append(expression)
        return get_function(source, expression, device)

    allow_shared = _launch.allow_shared

    def opt_in(handle, shared):
        opt_ins.append(shared)
        allow_shared(handle, shared)

    monkeypatch.setattr(_jit, "get_function", spy)
    monkeypatch.setattr(_launch, "allow_shared", opt_in)
    monkeypatch.setattr(_launch, "NORM_WAVES", 0.02)  # 10 blocks (4 a 132-SM wave x 0.02)
    monkeypatch.setattr(_launch, "NORM_LANES", 2)
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    rng = np.random.default_rng(sum(shape) + group_size)
    x = activations(rng, shape, input_dtype, specials=True)
    weight = activations(rng, shape[-1:], input_dtype)
    check_norm(x, weight, 1e-6, None, "torch", group_size, dtype, scale, layout, pad_rows=True)
    assert any(name.endswith(", 2, true>") for name in names), names
    assert opt_ins == ([65536] if shape[-1] == 16384 else [])
    check_norm(x, weight, 1e-6, None, "cupy", group_size, dtype, scale, layout)


def test_norm_with_the_residual_walks_one_lane_a_thread_by_default(monkeypatch):
    # the launch policy as shipped (norm_lanes' residual window): 1200 rows of 7168 with the
    # residual are past 1.5 waves of the one-lane kernel on every GPU with at most 400 SMs and
    # within 6.5 on every GPU with at least 70, so one lane a thread and a grid of walking
    # blocks, each taking several rows; the residual written back, every byte checked
    from fp8_group_quant import _jit, api

    names, grids = [], []
    get_function, launch_type = _jit.get_function, _launch.Launch

    def spy(source, expression, device):
        names.append(expression)
        return get_function(source, expression, device)

    class Recorded(launch_type):
        def __init__(self, handle, grid, block, *args, **kwargs):
            grids.append(grid)
            super().__init__(handle, grid, block, *args, **kwargs)

    monkeypatch.setattr(_jit, "get_function", spy)
    monkeypatch.setattr(_launch, "Launch", Recorded)
    monkeypatch.setattr(api, "_PLANS", api.PlanCache(api.MAX_PLANS))
    rng = np.random.default_rng(23)
    x = activations(rng, (1200, 7168), "bfloat16", specials=True)
    weight = activations(rng, (7168,), "bfloat16")
    residual = activations(rng, (1200, 7168), "bfloat16")
    check_norm(x, weight, 1e-6, residual, "torch", 128, "e4m3", "ue8m0", "packed")
    assert names and names[-1].endswith(", 1, false>"), names
    assert grids and grids[-1][0] < 1200, grids  # fewer blocks than rows: they walk


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_norm_rows_inside_wider_buffers_many_rows_and_odd_widths(lib):
    rng = np.random.default_rng(12)
    x = activations(rng, (1000, 2688), "bfloat16")  # 21 groups: a row of 168 lanes
    weight = activations(rng, (2688,), "bfloat16")
    residual = activations(rng, (1000, 2688), "bfloat16")
    check_norm(x, weight, 1e-6, residual, lib, 128, "e4m3", "ue8m0", "packed",
               x_device=wider_rows(x, 128, lib, 64))  # fmt: skip
    tiny = activations(rng, (3, 32), "float32")  # one lane pair, one warp mostly idle
    check_norm(tiny, activations(rng, (32,), "float32"), 1e-3, None, lib, 32, "int8", "float32",
               "col")  # fmt: skip
    zero_rows = np.zeros((4, 512), NP_INPUT["float16"])  # mean 0: r = 1 / sqrt(eps)
    check_norm(zero_rows, activations(rng, (512,), "float16"), 1e-6, None, lib, 128, "e5m2",
               "ue8m0", "row")  # fmt: skip


def test_norm_refuses_bad_arguments_before_writing_anything():
    import cupy
    import torch

    rng = np.random.default_rng(11)
    x = to_device(activations(rng, (4, 256), "bfloat16"), "torch")
    w = torch.ones(256, dtype=torch.bfloat16, device="cuda")
    residual = torch.zeros_like(x)
    bad = (
        (dict(norm=(w.float(), 1e-6)), ValueError, "norm: the weight must be a bfloat16 array"),
        (dict(norm=(w[:128], 1e-6)), ValueError, "norm: the weight must be a bfloat16 array"),
        (dict(norm=(w.cpu(), 1e-6)), (ValueError, TypeError), "norm"),
        (dict(norm=(cupy.ones(256, cupy.float32), 1e-6)), ValueError, "norm: the weight"),
        (dict(norm=(w, 0.0)), ValueError, "norm: eps_norm must be a positive finite float"),
        (dict(norm=(w, float("nan"))), ValueError, "norm: eps_norm"),
        (dict(norm=(w, 1e-6), residual=residual[:2]), ValueError, "residual: expected a bfloat16"),
        (dict(norm=(w, 1e-6), residual=residual.float()), ValueError, "residual: expected"),
        (dict(norm=(w, 1e-6), residual=residual.t().contiguous().t()), ValueError,
         "residual: the last dimension must be contiguous"),
        (dict(norm=(w, 1e-6), residual=x), ValueError, "residual: its memory overlaps x"),
        (dict(norm=(w, 1e-6), activation="silu_mul"), ValueError, "norm: cannot be combined"),
        (dict(residual=residual), ValueError, "residual: the fused add needs norm"),
    )  # fmt: skip
    before = x.clone()
    for kwargs, error, match in bad:
        with pytest.raises(error, match=match):
            fgq.quantize(x, 128, **kwargs)
    assert not residual.any() and torch.equal(x, before)
    wide = torch.zeros((4, 264), dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="x: norm needs a 16-byte aligned input"):
        fgq.quantize(wide[:, 4:260], 128, norm=(w, 1e-6))
    with pytest.raises(ValueError, match="norm: the weight must be 16-byte aligned"):
        fgq.quantize(x, 128, norm=(wide[0, 4:260], 1e-6))
    with pytest.raises(ValueError, match="x: norm takes rows of at most 16384"):
        fgq.quantize(
            torch.zeros((1, 16512), dtype=torch.bfloat16, device="cuda"),
            128,
            norm=(torch.ones(16512, dtype=torch.bfloat16, device="cuda"), 1e-6),
        )
    q, s = fgq.quantize(x[:0], 128, norm=(w, 1e-6), residual=residual[:0])
    assert q.shape == (0, 256) and s.shape[0] == 0


def test_norm_captured_in_a_cuda_graph_replays_with_new_inputs():
    import torch

    rng = np.random.default_rng(13)
    x = to_device(activations(rng, (64, 2048), "bfloat16"), "torch")
    w = to_device(activations(rng, (2048,), "bfloat16"), "torch")
    residual = to_device(activations(rng, (64, 2048), "bfloat16"), "torch")
    options = dict(scale="ue8m0", layout="packed")
    q, s = fgq.quantize(x, 128, **options, norm=(w, 1e-6), residual=residual.clone())  # warm
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fgq.quantize(x, 128, **options, norm=(w, 1e-6), residual=residual, out=q, scale_out=s)
    for seed in (14, 15):
        fresh_x = activations(np.random.default_rng(seed), (64, 2048), "bfloat16")
        fresh_r = activations(np.random.default_rng(seed + 10), (64, 2048), "bfloat16")
        x.copy_(to_device(fresh_x, "torch"))
        residual.copy_(to_device(fresh_r, "torch"))
        graph.replay()
        torch.cuda.synchronize()
        r_host = fresh_r.copy()
        hq, hs = fgq.quantize(fresh_x, 128, **options, norm=(to_host(w), 1e-6), residual=r_host)
        assert_same_bytes(to_host_bytes(q), np.ascontiguousarray(hq), "q after replay")
        assert_same_bytes(to_host_bytes(s), np.ascontiguousarray(hs), "scales after replay")
        assert_same_bytes(to_host_bytes(residual), r_host, "residual after replay")


def to_host(tensor) -> np.ndarray:
    import ml_dtypes

    return tensor.view(__import__("torch").int16).cpu().numpy().view(ml_dtypes.bfloat16)


# prepare() with the fused inputs: masked_m, the norm's weight and the residual are bound ----------


def test_prepare_binds_masked_m_and_reads_it_at_each_call():
    import cupy

    rng = np.random.default_rng(16)
    x_host = activations(rng, (4, 16, 2 * 256), "bfloat16")
    x = cupy.asarray(x_host)
    counts = cupy.asarray(np.array([3, 0, 16, 7], np.int32))
    options = dict(scale="ue8m0", layout="packed", activation="silu_mul")
    call = fgq.prepare(x, 128, **options, masked_m=counts)
    for new_counts in ([16, 16, 0, 1], [0, 5, 9, 16]):
        counts[...] = cupy.asarray(np.array(new_counts, np.int32))  # in place, as DeepEP does
        q, s = call(x)
        assert q is call.q and s is call.scales
        hq, hs = fgq.quantize(x_host, 128, **options, masked_m=np.array(new_counts, np.int32))
        got_q, got_s = cupy.asnumpy(q).view(np.uint8), cupy.asnumpy(s)
        for e, n in enumerate(new_counts):  # the real rows (the others are left as they were)
            assert np.array_equal(got_q[e, :n], hq[e, :n].view(np.uint8)), f"q, expert {e}"
            assert np.array_equal(got_s[e, :n], hs[e, :n]), f"scales, expert {e}"
    with pytest.raises(ValueError, match="expected_m: a hint"):
        fgq.prepare(x, 128, **options, expected_m=4)


def test_prepare_binds_the_norm_and_writes_the_residual_at_each_call():
    import torch

    rng = np.random.default_rng(17)
    w_host = activations(rng, (1024,), "bfloat16")
    x = to_device(activations(rng, (8, 1024), "bfloat16"), "torch")
    residual = to_device(activations(rng, (8, 1024), "bfloat16"), "torch")
    options = dict(scale="ue8m0", layout="packed")
    # the weight is a temporary on purpose: the prepared call must keep it alive
    call = fgq.prepare(x, 128, **options, norm=(to_device(w_host, "torch"), 1e-6),
                       residual=residual)  # fmt: skip
    for seed in (18, 19):
        x_host = activations(np.random.default_rng(seed), (8, 1024), "bfloat16")
        r_host = activations(np.random.default_rng(seed + 5), (8, 1024), "bfloat16")
        x.copy_(to_device(x_host, "torch"))
        residual.copy_(to_device(r_host, "torch"))
        q, s = call(x)
        hq, hs = fgq.quantize(x_host, 128, **options, norm=(w_host, 1e-6), residual=r_host)
        assert_same_bytes(to_host_bytes(q), np.ascontiguousarray(hq), "prepared norm q")
        assert_same_bytes(to_host_bytes(s), np.ascontiguousarray(hs), "prepared norm scales")
        assert_same_bytes(to_host_bytes(residual), r_host, "prepared norm residual")
    with pytest.raises(ValueError, match="residual: its memory overlaps x"):
        call(residual)  # x may not be the bound residual
    with pytest.raises(ValueError, match="norm: cannot be combined with masked_m"):
        fgq.prepare(x, 128, norm=(to_device(w_host, "torch"), 1e-6),
                    masked_m=torch.zeros(8, dtype=torch.int32, device="cuda"))  # fmt: skip


# scale_rule="floor": the OCP MX exponent rule, a runtime flag of every UE8M0 kernel ---------------

FLOOR_COMBINATIONS = [c for c in COMBINATIONS if c[3] == "ue8m0" and c[2] in ("e4m3", "e5m2")]


@pytest.mark.parametrize("input_dtype, group_size, dtype, scale, layout", FLOOR_COMBINATIONS)
def test_floor_rule_every_combination(input_dtype, group_size, dtype, scale, layout, kernel_path):
    index = FLOOR_COMBINATIONS.index((input_dtype, group_size, dtype, scale, layout))
    lib = ("cupy", "torch")[index % 2]
    rng = np.random.default_rng(4000 + index)
    args = (lib, group_size, dtype, scale, layout)
    x = activations(rng, (5, 21 * group_size), input_dtype, specials=True)
    check(x, to_device(x, lib), *args, scale_rule="floor")
    x = activations(rng, (2, 3, 7168), input_dtype, specials=True)
    check(x, wider_rows(x, 256, lib, 128), *args, pad_rows=True, scale_rule="floor")
    x = activations(rng, (7, 2 * group_size), input_dtype)  # the element-wise load path
    check(x, wider_rows(x, 3, lib, 1), *args, scale_rule="floor")
    tiny = float(np.finfo(np.float32).tiny)  # exponents clamped at 1
    check(x * 0, to_device(x * 0, lib), *args, eps=tiny, scale_rule="floor")


def test_floor_rule_in_the_fused_kernels():
    import cupy

    rng = np.random.default_rng(23)
    options = dict(dtype="e4m3", scale="ue8m0", layout="packed", scale_rule="floor")
    x = activations(rng, (3, 4, 2 * 512), "bfloat16", specials=True)
    counts = np.array([4, 0, 2], np.int32)
    for kwargs in ({"activation": "silu_mul"}, {"activation": "silu_mul", "masked_m": counts},
                   {"masked_m": counts}):  # fmt: skip
        device = {k: cupy.asarray(v) if k == "masked_m" else v for k, v in kwargs.items()}
        q, s = fgq.quantize(cupy.asarray(x), 128, **options, **device)
        hq, hs = fgq.quantize(x, 128, **options, **kwargs)
        got_q, got_s = cupy.asnumpy(q).view(np.uint8), cupy.asnumpy(s)
        for e in range(3):
            rows = counts[e] if "masked_m" in kwargs else 4
            assert np.array_equal(got_q[e, :rows], hq[e, :rows].view(np.uint8)), (kwargs, e)
            assert np.array_equal(got_s[e, :rows], hs[e, :rows]), (kwargs, e)
    w = activations(rng, (1024,), "bfloat16")
    r = activations(rng, (3, 4, 1024), "bfloat16")
    xn = x[..., :1024].copy()
    r_device = cupy.asarray(r)
    q, s = fgq.quantize(cupy.asarray(xn), 128, **options, norm=(cupy.asarray(w), 1e-6),
                        residual=r_device)  # fmt: skip
    hq, hs = fgq.quantize(xn, 128, **options, norm=(w, 1e-6), residual=r)
    assert np.array_equal(cupy.asnumpy(q).view(np.uint8), hq.view(np.uint8))
    assert np.array_equal(cupy.asnumpy(s), hs)
    assert np.array_equal(cupy.asnumpy(r_device).view(np.uint16), r.view(np.uint16))


# ordering with the work before the call on the same stream ---------------------------------------


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_a_call_right_after_a_device_copy_reads_the_copy(lib):
    # the previous operation on the stream is a device-to-device copy into x (no kernel): the
    # launch must not start reading x before the copy is done, PDL or not
    rng = np.random.default_rng(24)
    fresh = [activations(rng, (64, 1024), "bfloat16") for _ in range(2)]
    w_host = activations(rng, (1024,), "bfloat16")
    sources = [to_device(f, lib) for f in fresh]
    x = to_device(fresh[0], lib)
    weight = to_device(w_host, lib)
    options = dict(scale="ue8m0", layout="packed")
    expected = [fgq.quantize(f, 128, **options)[0] for f in fresh]
    expected_norm = [fgq.quantize(f, 128, **options, norm=(w_host, 1e-6))[0] for f in fresh]
    step = fgq.prepare(x, 128, **options)
    calls = {
        "quantize": (lambda: fgq.quantize(x, 128, **options), expected),
        "prepared": (lambda: step(x), expected),
        "norm": (lambda: fgq.quantize(x, 128, **options, norm=(weight, 1e-6)), expected_norm),
    }

    def copy_into_x(source):
        if lib == "torch":
            x.copy_(source)
        else:
            x[...] = source

    for i in range(60):
        for name, (call, wanted) in calls.items():
            copy_into_x(sources[i % 2])
            q = call()[0]
            assert_same_bytes(to_host_bytes(q), np.ascontiguousarray(wanted[i % 2]),
                              f"{name} right after a copy, call {i}")  # fmt: skip


@pytest.mark.parametrize("rule", ["rceil", "floor"])
def test_blocked_scales_across_tiles_batches_and_padding(rule, kernel_path):
    # rows past one 128-row tile, a partial last tile, group columns past one 4-group tile with
    # padding columns, batches that each own their padded tiles, one token (127 padding rows)
    rng = np.random.default_rng(25)
    shapes = [((129, 5 * 32), 32), ((300, 56 * 32), 32), ((2, 130, 7 * 32), 32),
              ((1, 7168), 32), ((3, 2, 257, 2048), 64), ((256, 1024), 128)]  # fmt: skip
    for i, (shape, group_size) in enumerate(shapes):
        for input_dtype in ("bfloat16", "float32"):
            x = activations(rng, shape, input_dtype, specials=True)
            lib = ("cupy", "torch")[i % 2]
            for dtype in ("e4m3", "e5m2"):
                check(x, to_device(x, lib), lib, group_size, dtype, "ue8m0", "blocked",
                      pad_rows=i % 3 == 0, scale_rule=rule)  # fmt: skip


# NVFP4 (issue 14) -------------------------------------------------------------------------------


def poison_pool(lib: str, sizes) -> None:
    """Fill and free blocks of these byte sizes, so that the pool hands them out poisoned next:
    bytes a kernel leaves unwritten then show up as 0xAB (a best effort: the pools reuse freed
    blocks of the same size)."""
    if lib == "cupy":
        import cupy

        blocks = [cupy.full(n, 0xAB, cupy.uint8) for n in sizes]
    else:
        import torch

        blocks = [torch.full((n,), 0xAB, dtype=torch.uint8, device="cuda") for n in sizes]
    del blocks


def nvfp4_call(x, global_scale):
    return fgq.quantize(x, 16, dtype="e2m1", scale="e4m3", layout="blocked",
                        global_scale=global_scale)  # fmt: skip


@pytest.mark.parametrize("input_dtype", list(INPUT_TYPES))
@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_nvfp4_kernel_matches_the_numpy_backend(input_dtype, lib):
    from test_nvfp4 import nvfp4_inputs

    rng = np.random.default_rng(len(input_dtype) + len(lib))
    shapes = [(1, 16), (5, 48), (129, 80), (2, 3, 64), (2, 130, 224), (1, 7168), (300, 2048),
              (4, 0), (3, 0, 32)]  # fmt: skip
    for shape in shapes:
        x = nvfp4_inputs(rng, shape, input_dtype)
        geometry = Geometry(shape, 16, "blocked", False)
        device_g = to_device(np.array([0.75], np.float32), lib)
        for given, host_given in ((None, None), (3.0, 3.0), (device_g, 0.75)):
            expected = nvfp4_call(x, host_given)
            for inputs in (to_device(x, lib), wider_rows(x, 64, lib, 32)):
                poison_pool(lib, (x.size // 2, geometry.scale_storage, 8))
                got = nvfp4_call(inputs, given)
                assert len(got) == len(expected)
                what = f"NVFP4 {lib} {input_dtype} {shape} global={host_given}"
                for name, a, b in zip(("q", "scales", "global"), got, expected):
                    assert tuple(a.shape) == b.shape, (what, name)
                    assert_same_bytes(to_host_bytes(a), b, f"{name} ({what})")
                back = fgq.dequantize(got[0], got[1], 16, dtype="e2m1",
                                      global_scale=got[2] if given is None else given)  # fmt: skip
                host_g = expected[2] if given is None else host_given
                want = fgq.dequantize(expected[0], expected[1], 16, dtype="e2m1",
                                      global_scale=host_g)  # fmt: skip
                assert_same_bytes(to_host_bytes(back), np.asarray(want), f"dequantize ({what})")


def test_nvfp4_device_checks():
    import cupy

    x = cupy.zeros((4, 64), cupy.float32)
    with pytest.raises(ValueError, match="16-byte aligned base"):
        nvfp4_call(x[:, 1:33], 1.0)  # the base 4 bytes past an aligned address
    with pytest.raises(TypeError, match="global_scale: expected a float or a one-element"):
        nvfp4_call(x, np.ones(1, np.float32))  # a host array for a GPU call
    with pytest.raises(ValueError, match="global_scale: expected one float32 element"):
        nvfp4_call(x, cupy.ones(2, cupy.float32))


def test_blocked_scale_out_must_be_16_byte_aligned():
    import cupy

    x = cupy.asarray(activations(np.random.default_rng(26), (5, 128), "bfloat16"))
    storage = cupy.zeros(128 * 4 + 16, cupy.uint8)
    misaligned = storage[4 : 4 + 128 * 4].reshape(128, 4)
    with pytest.raises(ValueError, match="scale_out: expected a 16-byte aligned pointer"):
        fgq.quantize(x, 32, scale="ue8m0", layout="blocked", scale_out=misaligned)
    aligned = storage[16:].reshape(128, 4)
    q, s = fgq.quantize(x, 32, scale="ue8m0", layout="blocked", scale_out=aligned)
    _, want = fgq.quantize(cupy.asnumpy(x), 32, scale="ue8m0", layout="blocked")
    assert s is aligned and np.array_equal(cupy.asnumpy(s), want)


@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_nvfp4_subnormal_edges_on_the_gpu(lib):
    # -ftz=true must not turn a subnormal amax or d into zero (compared as bits in the kernel)
    from test_nvfp4 import SUBNORMAL_CASES

    for values, input_dtype, given in SUBNORMAL_CASES:
        x = values.astype(NP_INPUT[input_dtype])
        want = nvfp4_call(x, given)
        got = nvfp4_call(to_device(x, lib), given)
        for name, a, b in zip(("q", "scales", "global"), got, want):
            assert_same_bytes(to_host_bytes(a), b, f"{name} ({lib} {input_dtype} {values[0, 0]})")


# the fused inputs on drawn shapes, views and options ----------------------------------------------

# each fused path's kernels and grids, forced through the launch layer's knobs (_launch globals)
SILU_PATHS = {
    "as planned": {},
    "one pass, the table copied by every thread": {"TABLE_BY_THREADS_WAVES": 0.0},
    "one pass, six blocks an SM": {"SILU_SIX_BLOCKS_WAVES": 0.0},
    "persistent": {"PERSISTENT_FUSED_WAVES": 0.0},
}
NORM_PATHS = {
    "as planned": {},
    "one lane, a block a row": {"NORM_LANES": 1, "NORM_WAVES": 0.0},
    "two lanes, a block a row": {"NORM_LANES": 2, "NORM_WAVES": 0.0},
    "one lane, walking blocks": {"NORM_LANES": 1, "NORM_WAVES": 0.004},  # one or two blocks
    "two lanes, walking blocks": {"NORM_LANES": 2, "NORM_WAVES": 0.004},
}
# (q, scale) poisons: a store the kernel misses shows unless its right value is the poison
POISONS = [(Q_POISON, SCALE_POISON), (0x00, 0xAB), (0x5A, 0x00)]


def wide_view(lib_array, shape, extra: int, offset: int, reverse: bool):
    """A view of ``shape`` into ``lib_array`` (rows ``extra`` elements wider), ``offset``
    elements in, its rows in reverse order if ``reverse``."""
    view = lib_array[..., offset : offset + shape[-1]]
    return view[..., ::-1, :] if reverse else view


def widened(x: np.ndarray, extra: int, offset: int, reverse: bool, fill: float = 0.0):
    """Host buffer whose view ``wide_view(buffer, x.shape, extra, offset, reverse)`` reads x;
    the columns outside it hold ``fill``."""
    wide = np.full(x.shape[:-1] + (x.shape[-1] + extra,), fill, x.dtype)
    wide_view(wide, x.shape, extra, offset, reverse)[...] = x
    return wide


@st.composite
def fused_cases(draw):
    """A fused call: its mode, input type, format, scale, layout, group size, shape, the views x
    (and the residual) are read through, the kernel path forced or planned, and its options.
    Sizes stay small for the NumPy reference; the forced paths reach the grids large inputs
    take."""
    mode = draw(st.sampled_from(["silu_mul", "norm", "add_norm", "masked", "masked_silu_mul"]))
    input_dtype = draw(st.sampled_from(sorted(INPUT_TYPES)))
    fmt, scale, layout = draw(st.sampled_from(supported_combinations()))
    group = draw(st.sampled_from(GROUP_SIZES))
    itemsize = NP_INPUT[input_dtype].itemsize
    silu = mode in ("silu_mul", "masked_silu_mul")
    norm = mode in ("norm", "add_norm")
    longest = 32768 // itemsize if norm else 16384  # a norm row: at most 1024 lanes of 32 bytes
    groups = draw(st.one_of(st.integers(1, 12), st.sampled_from([56, longest // group])))
    groups = max(1, min(groups, longest // group))
    k = group * groups * (2 if silu else 1)
    most = 1_000_000 // k  # rows, for the NumPy reference's time
    if mode.startswith("masked"):
        experts = draw(st.integers(1, 40))
        lead = (experts, max(1, min(draw(st.integers(1, 48)), most // experts)))
    else:
        rows = draw(st.one_of(st.integers(1, 20), st.sampled_from([129, 264, 265, 529, 1100])))
        rows = max(1, min(rows, most))
        lead = draw(st.sampled_from([(rows,), (1, rows), (2, -(-rows // 2))]))
    floors = scale == "ue8m0" and OUTPUT_FORMATS[fmt].emax_elem is not None  # scale_rule="floor"
    vector = 16 // itemsize  # the fused kernels read 16-byte aligned rows

    def view():  # rows `extra` elements wider than K, `offset` in, maybe reversed
        extra = vector * draw(st.sampled_from([0, 0, 1, 3]))
        offset = vector * draw(st.integers(0, extra // vector))
        return dict(extra=extra, offset=offset, reverse=draw(st.booleans()))

    paths = NORM_PATHS if norm else SILU_PATHS if mode == "silu_mul" else {"as planned": {}}
    return dict(
        mode=mode, input_dtype=input_dtype, fmt=fmt, scale=scale, layout=layout, group=group,
        shape=(*lead, k), x_view=view(), r_view=view(), pad_rows=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-10, 1e-4])),
        scale_rule=draw(st.sampled_from(["rceil", "floor"])) if floors else "rceil",
        specials=draw(st.booleans()), eps_norm=draw(st.sampled_from([1e-6, 1e-5, 0.5])),
        path=draw(st.sampled_from(sorted(paths))), poisons=draw(st.sampled_from(POISONS)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )  # fmt: skip


@contextlib.contextmanager
def launch_path(knobs: dict):
    """The launch layer's knobs set to ``knobs`` (none: as planned), with a fresh plan cache."""
    from fp8_group_quant import api

    saved = {name: getattr(_launch, name) for name in knobs}, api._PLANS
    for name, value in knobs.items():
        setattr(_launch, name, value)
    if knobs:
        api._PLANS = api.PlanCache(api.MAX_PLANS)
    try:
        yield
    finally:
        for name, value in saved[0].items():
            setattr(_launch, name, value)
        api._PLANS = saved[1]


@settings(max_examples=200, deadline=None)
@drawn(case=fused_cases())
def test_fused_kernels_match_the_numpy_backend_on_drawn_calls(case):
    # any fused mode, input type, format, layout, group size, rule, view and kernel path: every
    # byte of the poisoned device storage, and of the residual's whole buffer, as the NumPy
    # backend writes them
    import cupy

    rng = np.random.default_rng(case["seed"])
    shape, dtype, mode = case["shape"], case["input_dtype"], case["mode"]
    x = activations(rng, shape, dtype, specials=case["specials"])
    options = {name: case[name] for name in ("eps", "pad_rows", "scale_rule", "scale", "layout")}
    options["dtype"] = case["fmt"]
    host, device = {}, {}
    if mode in ("silu_mul", "masked_silu_mul"):
        host["activation"] = device["activation"] = "silu_mul"
    if mode.startswith("masked"):
        counts = rng.integers(-2, shape[1] + 3, shape[0]).astype(rng.choice([np.int32, np.int64]))
        host["masked_m"], device["masked_m"] = counts, cupy.asarray(counts)
    r_host = r_wide = None
    if mode in ("norm", "add_norm"):
        weight = activations(rng, shape[-1:], dtype)
        host["norm"] = (weight, case["eps_norm"])
        device["norm"] = (cupy.asarray(weight), case["eps_norm"])
        if mode == "add_norm":  # in a buffer of its own view, its other columns NaN
            r_host = activations(rng, shape, dtype)
            r_wide = cupy.asarray(widened(r_host, **case["r_view"], fill=np.nan))
            device["residual"] = wide_view(r_wide, shape, **case["r_view"])
            host["residual"] = r_host
    n = shape[-1] // (2 if "activation" in host else 1)
    geometry = Geometry((*shape[:-1], n), case["group"], case["layout"], case["pad_rows"])
    poisons = case["poisons"]
    q, s, q_buf, s_buf = poisoned_outputs(geometry, "cupy", case["fmt"], *poisons)
    x_device = wide_view(cupy.asarray(widened(x, **case["x_view"])), shape, **case["x_view"])
    paths = NORM_PATHS if "norm" in host else SILU_PATHS if mode == "silu_mul" else {}
    with launch_path(paths.get(case["path"], {})):
        q_got, s_got = fgq.quantize(x_device, case["group"], **options, **device, out=q,
                                    scale_out=s)  # fmt: skip
    assert q_got is q and s_got is s
    hq, hs, hq_buf, hs_buf = host_poisoned(geometry, case["fmt"], *poisons)
    fgq.quantize(x, case["group"], **options, **host, out=hq, scale_out=hs)
    what = " ".join(f"{k}={v}" for k, v in case.items() if k != "seed")
    assert_same_bytes(to_host_bytes(q_buf), hq_buf, f"q ({what})")
    assert_same_bytes(to_host_bytes(s_buf), hs_buf, f"scales ({what})")
    if r_host is not None:
        expected = widened(host["residual"], **case["r_view"], fill=np.nan)
        assert_same_bytes(to_host_bytes(r_wide), expected.view(np.uint8).ravel(),
                          f"residual's buffer ({what})")  # fmt: skip
