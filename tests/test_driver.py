"""The CUDA driver through NVIDIA's bindings (``cuda.bindings.driver``): device queries without
a context, the launch configuration built once, pre-packed arguments, error names; and CuPy's
runtime and launch where the bindings are missing.

The CPU tests stand a small fake in for the bindings where the real ones cannot run (no driver
here); the tests that build real ``CUlaunchConfig`` values run wherever the bindings import.
The GPU tests run in fresh processes, with and without the bindings importable.
"""

import ctypes
import os
import subprocess
import sys
import types
import warnings

import pytest

from fp8_group_quant import _jit, _launch

PSS = "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION"


class _Config:
    """CUlaunchConfig as the library uses it; counts the writes of its stream."""

    def __init__(self):
        self.attrs, self.numAttrs, self.stream_writes = [], 0, []

    @property
    def hStream(self):
        return self.stream_writes[-1] if self.stream_writes else 0

    @hStream.setter
    def hStream(self, value):
        self.stream_writes.append(int(value))


def fake_bindings(launch_status: int = 0, count: int = 2, capability=(9, 0), status: int = 0):
    """A stand-in for ``cuda.bindings.driver``: records launches, answers device queries."""
    launches = []
    major, minor = capability

    def attribute(which, handle):
        return status, major if which == "major" else minor

    def launch(config, function, params, extra):
        launches.append((config, function, params, extra))
        return (launch_status,)

    names = {0: b"CUDA_SUCCESS", 1: b"CUDA_ERROR_INVALID_VALUE", 101: b"CUDA_ERROR_INVALID_DEVICE"}
    return types.SimpleNamespace(
        launches=launches,
        CUlaunchConfig=_Config,
        CUlaunchAttribute=lambda: types.SimpleNamespace(id=None, value=types.SimpleNamespace()),
        CUlaunchAttributeID=types.SimpleNamespace(**{PSS: 6}),
        CUfunction=lambda handle: ("CUfunction", handle),
        CUdevice_attribute=types.SimpleNamespace(
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR="major",
            CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR="minor",
        ),
        cuLaunchKernelEx=launch,
        cuDeviceGetCount=lambda: (status, count),
        cuDeviceGet=lambda ordinal: (status, 1000 + ordinal),
        cuDeviceGetAttribute=attribute,
        cuGetErrorName=lambda error: (0, names[error]) if error in names else (1, None),
    )


def _pointed_at(address: int, count: int) -> list[int]:
    """The ``count`` addresses a ``void*`` array at ``address`` holds."""
    return list((ctypes.c_void_p * count).from_address(address))


# the launch through the bindings ---------------------------------------------------------------


def test_a_launch_passes_its_prepacked_arguments_and_writes_only_a_new_stream(monkeypatch):
    bindings = fake_bindings()
    monkeypatch.setattr(_jit, "driver", lambda: bindings)
    args = [ctypes.c_uint64(7), ctypes.c_int32(3)]
    launch = _launch.KernelLaunch(0xABC, (5, 2, 1), (128, 1, 1), args, pdl=True, shared=4096)
    for stream in (11, 11, 22):
        launch(stream)
    configs = {id(config) for config, *_ in bindings.launches}
    config, function, params, extra = bindings.launches[-1]
    assert len(bindings.launches) == 3 and len(configs) == 1  # one config, built once
    assert config.stream_writes == [11, 22]  # the repeated stream was not written again
    assert function == ("CUfunction", 0xABC) and extra == 0
    # the arguments: the address of a void* array pointing at the ctypes values themselves
    assert _pointed_at(params, 2) == [ctypes.addressof(a) for a in args]
    grid = (config.gridDimX, config.gridDimY, config.gridDimZ)
    block = (config.blockDimX, config.blockDimY, config.blockDimZ)
    assert grid == (5, 2, 1) and block == (128, 1, 1) and config.sharedMemBytes == 4096
    (attribute,) = config.attrs
    assert config.numAttrs == 1 and launch.pdl
    assert attribute.id == 6 and attribute.value.programmaticStreamSerializationAllowed == 1


def test_a_launch_without_pdl_carries_no_attribute(monkeypatch):
    bindings = fake_bindings()
    monkeypatch.setattr(_jit, "driver", lambda: bindings)
    launch = _launch.KernelLaunch(1, (1, 1, 1), (32, 1, 1), [ctypes.c_int64(0)], pdl=False)
    launch(0)
    config = bindings.launches[-1][0]
    assert config.numAttrs == 0 and config.attrs == [] and not launch.pdl


def test_a_failed_launch_names_the_drivers_error(monkeypatch):
    bindings = fake_bindings(launch_status=1)
    monkeypatch.setattr(_jit, "driver", lambda: bindings)
    launch = _launch.KernelLaunch(1, (1, 1, 1), (32, 1, 1), [ctypes.c_int64(0)])
    with pytest.raises(RuntimeError, match="cuLaunchKernelEx failed: CUDA_ERROR_INVALID_VALUE"):
        launch(0)
    assert _jit.driver_error(12345) == "CUresult 12345"  # a number the driver has no name for


def test_the_quantizers_launch_fills_its_pointers_before_each_launch(monkeypatch):
    bindings = fake_bindings()
    monkeypatch.setattr(_jit, "driver", lambda: bindings)
    from fp8_group_quant._abi import params_type

    params = params_type()()
    launch = _launch.Launch(1, (4, 1, 1), (128, 1, 1), params)
    seen = []
    real = bindings.cuLaunchKernelEx

    def reading(config, function, pointers, extra):
        (address,) = _pointed_at(pointers, 1)
        launched = params_type().from_address(address)
        seen.append((launched.x, launched.q, launched.scales, launched.masked_m))
        return real(config, function, pointers, extra)

    monkeypatch.setattr(launch, "_launch_ex", reading)
    launch.launch(0x1000, 0x2000, 0x3000, 5, (("masked_m", 0x4000),))
    launch.launch(0x1100, 0x2100, 0x3100, 5)
    assert seen == [(0x1000, 0x2000, 0x3000, 0x4000), (0x1100, 0x2100, 0x3100, 0x4000)]


def test_pdl_needs_the_bindings_and_sm90(monkeypatch):
    monkeypatch.setattr(_jit, "driver", lambda: None)
    assert not _launch.pdl_supported(0)
    monkeypatch.setattr(_jit, "driver", lambda: fake_bindings())
    monkeypatch.setattr(_jit, "compute_capability", lambda device: (9, 0))
    assert _launch.pdl_supported(0) and not _launch.pdl_supported(0, enabled=False)
    monkeypatch.setattr(_jit, "compute_capability", lambda device: (8, 9))
    assert not _launch.pdl_supported(0)


@pytest.mark.parametrize("configured", [False, True])  # FP8_GROUP_QUANT_PDL=0, and its default
def test_a_benchmark_of_both_ways_takes_pdl_whatever_the_setting(monkeypatch, configured):
    # bench --chain times every step with PDL and without, each set explicitly: the setting,
    # the library's default for its own launches, does not refuse it (it did, and the whole
    # GPU suite with FP8_GROUP_QUANT_PDL=0 failed bench --chain's test)
    from fp8_group_quant import _tuning
    from fp8_group_quant.bench import _hooks

    monkeypatch.setattr(_jit, "driver", lambda: fake_bindings())
    for capability, supported in (((9, 0), True), ((8, 9), False)):
        monkeypatch.setattr(_jit, "compute_capability", lambda device, c=capability: c)
        with _tuning.override(pdl=configured):
            assert _hooks.pdl_supported(0) is supported


def test_real_bindings_take_the_config_and_the_arguments_address(monkeypatch):
    # the binding's own CUlaunchConfig and CUlaunchAttribute: the fields the fake stands in for
    bindings = pytest.importorskip("cuda.bindings.driver", reason="cuda-bindings not installed")
    config = _launch.launch_config(bindings, (7, 3, 2), (256, 1, 1), 1024, pdl=True)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (7, 3, 2)
    assert (config.blockDimX, config.sharedMemBytes, config.numAttrs) == (256, 1024, 1)
    (attribute,) = config.attrs
    assert attribute.id == getattr(bindings.CUlaunchAttributeID, PSS)
    assert attribute.value.programmaticStreamSerializationAllowed == 1
    assert _launch.launch_config(bindings, (1, 1, 1), (32, 1, 1), 0, pdl=False).numAttrs == 0
    config.hStream = 0x5000  # an int is taken as a stream handle
    assert int(config.hStream) == 0x5000
    if _jit.driver() is None:
        # no driver here: the binding converts every argument (a TypeError would say one is
        # refused, the address of the void* array as an int included), then fails to load it
        array = (ctypes.c_void_p * 1)(0)
        with pytest.raises(RuntimeError):
            bindings.cuLaunchKernelEx(config, bindings.CUfunction(1), ctypes.addressof(array), 0)


# device queries --------------------------------------------------------------------------------


def test_device_queries_go_through_the_bindings(monkeypatch):
    monkeypatch.setattr(_jit, "driver", lambda: fake_bindings(count=3, capability=(10, 3)))
    assert _jit.device_count() == 3 and _jit.compute_capability(2) == (10, 3)
    monkeypatch.setattr(_jit, "driver", lambda: fake_bindings(status=101))
    assert _jit.device_count() == 0
    with pytest.raises(_jit.GpuUnavailableError, match="device 1: .*CUDA_ERROR_INVALID_DEVICE"):
        _jit.compute_capability(1)


def test_device_queries_fall_back_to_cupys_runtime(monkeypatch):
    class Runtime:
        class CUDARuntimeError(RuntimeError):
            pass

        count = 2

        def getDeviceCount(self):
            if self.count is None:
                raise self.CUDARuntimeError("cudaErrorInsufficientDriver")
            return self.count

        def deviceGetAttribute(self, attribute, device):
            return {75: 9, 76: 0}[attribute]  # cudaDevAttrComputeCapabilityMajor / Minor

    runtime = Runtime()
    monkeypatch.setattr(_jit, "driver", lambda: None)
    monkeypatch.setattr(_jit, "_runtime", lambda: runtime)
    assert _jit.device_count() == 2 and _jit.compute_capability(1) == (9, 0)
    runtime.count = None  # CuPy without a usable driver
    assert _jit.device_count() == 0
    with pytest.raises(_jit.GpuUnavailableError, match="no CUDA driver"):
        _jit.compute_capability(0)
    monkeypatch.setattr(_jit, "_runtime", lambda: None)  # no CuPy either
    assert _jit.device_count() == 0


def _fake_package(monkeypatch, driver) -> None:
    """``cuda.bindings.driver`` importable as ``driver`` (None: not installed)."""
    bindings = None if driver is None else types.SimpleNamespace(driver=driver)
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", driver)


@pytest.mark.parametrize(  # the bindings: usable, without a driver library, no device, missing
    "init, usable",
    [((0,), True), (RuntimeError("no libcuda"), False), ((100,), False), (None, False)],
)
def test_the_bindings_are_used_only_where_the_driver_initialises(monkeypatch, init, usable):
    def cu_init(flags):
        if isinstance(init, Exception):
            raise init
        return init

    driver = None if init is None else types.SimpleNamespace(cuInit=cu_init)
    _fake_package(monkeypatch, driver)
    _jit.driver.cache_clear()
    try:
        assert _jit.driver() is (driver if usable else None)
    finally:
        _jit.driver.cache_clear()


# without the bindings: CuPy's launch, said once --------------------------------------------------


def test_without_the_bindings_cupy_launches_without_pdl_and_says_so_once(monkeypatch):
    cupy_driver = pytest.importorskip("cupy_backends.cuda.api.driver", reason="needs CuPy")
    launched = []
    monkeypatch.setattr(cupy_driver, "launchKernel", lambda *args: launched.append(args))
    monkeypatch.setattr(_jit, "driver", lambda: None)
    monkeypatch.setattr(_launch, "_warned", type(_launch._warned)())
    args = [ctypes.c_int64(5)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _launch.KernelLaunch(9, (3, 1, 1), (64, 1, 1), args, pdl=True, shared=16)
        second = _launch.KernelLaunch(9, (1, 1, 1), (32, 1, 1), args, pdl=True)
    said = [w for w in caught if "cuda-bindings" in str(w.message)]
    assert len(said) == 1 and "without Programmatic Dependent Launch" in str(said[0].message)
    assert not first.pdl and not second.pdl
    first(77)
    (call,) = launched
    assert call[:9] == (9, 3, 1, 1, 64, 1, 1, 16, 77) and call[10] == 0
    assert _pointed_at(call[9], 1) == [ctypes.addressof(args[0])]


CPU_ONLY = """
import sys, warnings
for name in ("cuda", "cuda.bindings", "cupy", "cupy_backends", "torch", "jax"):
    sys.modules[name] = None  # the CPU-only install: none of them importable
warnings.simplefilter("error", RuntimeWarning)  # and nothing to say about them
import numpy as np
import fp8_group_quant as fgq
from fp8_group_quant import _jit
x = (np.arange(2 * 256, dtype=np.float32).reshape(2, 256) - 200.0) / 7.0
q, s = fgq.quantize_packed(x)
print(_jit.device_count(), q.dtype, q.shape, s.dtype, s.shape)
"""


def test_the_cpu_only_install_imports_and_quantizes_without_the_bindings():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", CPU_ONLY], env=env, capture_output=True,
                          text=True, cwd=root)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "float8_e4m3fn", "(2,", "256)", "int32", "(2,", "1)"]
    assert done.stderr == ""


# on the GPU, in fresh processes: with the bindings hidden, CuPy launches, once said ---------------

WITHOUT_BINDINGS = """
import sys, warnings
sys.modules["cuda.bindings"] = None  # CuPy installed, cuda-bindings not
import cupy, numpy as np, ml_dtypes
import fp8_group_quant as fgq
from fp8_group_quant import _jit
assert _jit.driver() is None and _jit.device_count() >= 1
rng = np.random.default_rng(3)
for m in (4, 64):  # two plans, two launches prepared: one warning
    x = rng.standard_normal((m, 2048), np.float32).astype(ml_dtypes.bfloat16)
    q, s = fgq.quantize_packed(cupy.asarray(x))
    q_ref, s_ref = fgq.quantize_packed(x)
    assert np.array_equal(q.get(), np.asarray(q_ref).view(np.uint8)), m
    assert np.array_equal(cupy.asnumpy(s), np.ascontiguousarray(s_ref)), m
print("ok")
"""


@pytest.mark.gpu
def test_without_the_bindings_the_gpu_path_works_and_says_so_once():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", WITHOUT_BINDINGS], env=env,
                          capture_output=True, text=True, cwd=root)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert done.stderr.count("cuda-bindings") == 1, done.stderr
