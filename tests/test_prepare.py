"""Prepared calls, the plan cache, warm-up, import, threads and the compile cache: how a call of a
kind seen before (or a prepared one) reaches its launch, on the host and the GPU."""

import os

import numpy as np
import pytest
from backends import (
    compiled_kernels,  # noqa: F401 - autouse: GPU tests find every kernel loaded
    to_device,
    to_host_bytes,
    wider_rows,
)
from helpers import activations, assert_same_bytes, force_path

import fp8_group_quant as fgq
from fp8_group_quant import _jit, _plan

# the plan cache -----------------------------------------------------------------------------------


def test_a_cached_plan_does_not_keep_its_first_input_alive():
    import gc
    import weakref

    pytest.importorskip("cupy", reason="plans are built for CuPy and torch arrays")
    from helpers import make_request

    from fp8_group_quant._arrays import CUPY, ArrayInfo
    from fp8_group_quant._device import DevicePlan
    from fp8_group_quant._tuning import Tuning

    class Input:  # stands in for a device array: plans never read it after they are built
        pass

    first = Input()
    info = ArrayInfo(CUPY, first, 4096, (0, 256), (256, 1), "bfloat16", 2, 0)  # nothing to launch
    request = make_request(info, 128, "e4m3", "ue8m0", "packed", 1e-10, False)
    plan = DevicePlan(info, request, Tuning())
    alive = weakref.ref(first)
    del first, info
    gc.collect()
    assert alive() is None and plan.x_info.obj is None and plan.device == 0


def test_the_plan_cache_is_bounded_and_keeps_its_newest():
    from fp8_group_quant._device import PlanCache

    cache = PlanCache(3)
    for i in range(5):
        cache.put(("key", i), f"plan {i}")
    assert len(cache) == 3
    assert cache.get(("key", 0)) is None and cache.get(("key", 4)) == "plan 4"
    assert cache.get(("key", [1])) is None  # an unhashable option is no key
    cache.put(("key", [1]), "never stored")
    assert len(cache) == 3


def test_the_plan_cache_is_safe_under_threads():
    import threading

    from fp8_group_quant._device import PlanCache

    cache = PlanCache(64)
    errors = []

    def work(start):
        try:
            for i in range(2000):
                cache.put((start, i), i)
                cache.get((start, i - 1))
        except Exception as error:  # pragma: no cover - the assertion below reports it
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(cache) == 64


# prepared calls and cached plans on the GPU -------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("lib", ["cupy", "torch"])  # both GPU libraries
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


@pytest.mark.gpu
@pytest.mark.parametrize("lib", ["cupy", "torch"])  # both GPU libraries
def test_repeated_calls_take_the_cached_plan(lib, monkeypatch):
    from fp8_group_quant import _run

    rng = np.random.default_rng(9)
    hosts = [activations(rng, (5, 2048), "float16") for _ in range(2)]
    first = to_device(hosts[0], lib)
    fgq.quantize(first, 64, dtype="e5m2", layout="col_tma")
    q_ref, s_ref = fgq.quantize(hosts[1], 64, dtype="e5m2", layout="col_tma")  # NumPy: unplanned

    def validate_again(*args, **kwargs):
        raise AssertionError("a repeated call of the same kind was validated and planned again")

    monkeypatch.setattr(_run, "quantize", validate_again)
    q, s = fgq.quantize(to_device(hosts[1], lib), 64, dtype="e5m2", layout="col_tma")
    assert_same_bytes(to_host_bytes(q), np.asarray(q_ref).view(np.uint8), "q")
    assert_same_bytes(to_host_bytes(s), np.ascontiguousarray(s_ref), "scales")


@pytest.mark.gpu
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


# import and warm-up: no context until the first call or warmup ------------------------------------

CONTEXT_PROBE = """
import sys
if sys.argv[1] == "without":  # CuPy's runtime answers the device queries instead
    sys.modules["cuda.bindings"] = None
import fp8_group_quant
from fp8_group_quant import _jit
assert (_jit.driver() is None) == (sys.argv[1] == "without")
if sys.modules.get("cuda.bindings", 0) is None:
    del sys.modules["cuda.bindings"]  # the probe itself reads the driver through them
from cuda.bindings import driver as cuda
assert cuda.cuInit(0)[0] == 0
status, count = cuda.cuDeviceGetCount()
active = []
for ordinal in range(count):
    status, device = cuda.cuDeviceGet(ordinal)
    status, flags, state = cuda.cuDevicePrimaryCtxGetState(device)
    active.append(state)
status, current = cuda.cuCtxGetCurrent()
print("active", active, "current", int(current), "modules", len(_jit._functions))
assert "cupy" not in sys.modules or not any(active)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("bindings", ["with", "without"])  # the device queries of both paths
def test_import_compiles_but_creates_no_cuda_context(tmp_path, bindings):
    import subprocess
    import sys

    env = dict(os.environ, FP8_GROUP_QUANT_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", CONTEXT_PROBE, bindings], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "current 0" in done.stdout and "modules 0" in done.stdout, done.stdout
    assert "active [0" in done.stdout and " 1" not in done.stdout.split("current")[0]
    # the default kernel was compiled into the disk cache at import, for this device's target
    assert len(list(tmp_path.glob("quantize-*.cubin"))) == 1


@pytest.mark.gpu
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
        "fgq::quantize_groups<fgq::kBF16, 128, fgq::kFloat8, fgq::kUE8M0Scale, "
        "fgq::kPackedExponents, true, true, fgq::kSiluMul>"
    ]
    assert all((device, _plan.SOURCE, e) in _jit._functions for e in loaded)
    assert fgq.warmup(device) == [key.name_expression for key in _plan.DEFAULT_KEYS]
    with pytest.raises(TypeError, match="variants: unknown option"):
        fgq.warmup(device, [{"colour": "red"}])
    with pytest.raises(ValueError, match="layout=.packed. packs UE8M0"):
        fgq.warmup(device, [{"layout": "packed"}])


# threads and the compile cache (issue 11) ---------------------------------------------------------


@pytest.mark.gpu
def test_sixteen_threads_first_use_compiles_each_kernel_once(tmp_path, monkeypatch):  # item 7
    import threading

    import cupy

    monkeypatch.setenv(_jit.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(_jit, "_functions", {})
    monkeypatch.setattr(_jit, "_loading", {})
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
    with force_path(fresh_plans=True):  # no plan from an earlier test: every thread plans
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors, errors
    assert len(compiles) == len(set(compiles)), compiles  # no kernel compiled twice
    assert len(set(compiles)) <= 4  # row, col and col_tma may share one address function


@pytest.mark.gpu
@pytest.mark.parametrize("variable", ["CUPY_CACHE_DIR", _jit.CACHE_DIR_ENV])  # CuPy's, ours
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


# prepare() with the fused inputs: masked_m, the norm's weight and the residual are bound ----------


@pytest.mark.gpu
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


@pytest.mark.gpu
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
