"""Every kernel instantiation compiles with NVRTC for sm_90, sm_100 and sm_120, without a GPU.

The default run compiles one instantiation of each kernel template for each architecture, to
machine code (NVRTC's front end and ptxas); all of them (minutes on two cores) compile only with
``pytest --compile-all``, as CI's own step does: to machine code for sm_90, where ptxas also
proves that nothing spills, and through NVRTC's front end to PTX for sm_100 and sm_120.
"""

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from fp8_group_quant import _abi, _jit, _plan
from fp8_group_quant._spec import INPUT_MODES

ARCHS = ["sm_90", "sm_100", "sm_120"]  # Hopper, datacenter Blackwell, consumer Blackwell
# NOTES: instantiations per NVRTC program in the exhaustive compile, whatever their count: enough
# programs to keep every core busy to the end, each long enough that its fixed cost (the front
# end of quantize.cu, 0.2-0.4 s) stays small; 12 was the fastest of 1 to 96 (docs/perf.md).
COMPILE_CHUNK = 12
# NOTES: the exhaustive compile's target per architecture. The source differs between the three
# only where it tests __CUDA_ARCH__, which the front end sees in the PTX of each; the PTX that
# ptxas assembles for sm_90 (every instantiation, below) uses no instruction newer than sm_90
# and no sm_90a feature, and PTX of an architecture assembles for every later one, so the
# per-instantiation ptxas run for sm_100 and sm_120 proved nothing new: it was 46% of their
# compile (docs/perf.md, CI). Each template still goes through ptxas for all three in the
# default run (test_each_kernel_template_compiles).
EXHAUSTIVE_TARGETS = {"sm_90": "sm_90", "sm_100": "compute_100", "sm_120": "compute_120"}

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy is not installed")


def _compile_chunk(arch: str, names: list[str]) -> tuple[dict[str, str], list[str]]:
    """(lowered names, ptxas's report) of one NVRTC program; module level to run in a worker."""
    report: list[str] = []
    return _jit.compile_offline(_plan.SOURCE, names, arch, report), report


def _check_compiled(arch: str, keys: list[str], lowered: dict[str, str], report: list[str]):
    """``arch``: the NVRTC target, sm_XY (machine code, with ptxas's report) or compute_XY."""
    assert set(lowered) == set(keys)
    assert len(set(lowered.values())) == len(keys)  # one distinct kernel per key
    kernels = ("_ZN3fgq15quantize_groups", "_ZN3fgq15quantize_masked", "_ZN3fgq13quantize_norm",
               "_ZN3fgq12quantize_fp4", "_ZN3fgq10nvfp4_amax", "_ZN3fgq22quantize_weight_blocks",
               "_ZN3fgq16quantize_columns")  # fmt: skip
    assert all(name.startswith(kernels) for name in lowered.values())
    if arch.startswith("compute_"):  # PTX: no ptxas, no report
        return
    # ptxas's resource report: a spill line for each function, one per kernel (the others are
    # device functions kept out of line, as the tile kernels' rare paths), and on Hopper, where
    # the register bounds were measured, no function spills (a spill in the loop cost int8 and
    # float-scale variants 10-20% on the H200, docs/perf.md)
    owners = [line.split("Function properties for ")[-1].strip() for line in report
              if "Function properties for " in line]  # fmt: skip
    spills = [line for line in report if "spill" in line]
    assert len(spills) == len(owners), report[:20]
    assert sum(owner.startswith(kernels) for owner in owners) == len(keys), report[:20]
    assert arch != "sm_90" or all(
        " 0 bytes spill stores, 0 bytes spill loads" in line for line in spills
    ), [line for line in spills if " 0 bytes spill stores" not in line]


def test_the_sources_take_no_path_newer_than_sm_90():
    """The premise of EXHAUSTIVE_TARGETS: sm_90, sm_100 and sm_120 compile the same code, so
    ptxas for sm_90 covers the others. An architecture test above 900 (or one this cannot
    read) must come with machine code for the architectures it singles out."""
    import re

    tests = []
    for path in sorted(Path(_jit.kernel_dir()).glob("*.cu*")):
        tests += re.findall(r"__CUDA_ARCH__[^\n]*", path.read_text())
    assert tests, "no architecture test found: the pattern is stale"
    for test in tests:
        match = re.fullmatch(r"__CUDA_ARCH__ >= (\d+)", test.strip())
        assert match and int(match.group(1)) <= 900, test


def test_instantiation_count():
    # inputs x group sizes x (output binaries (e4m3 and e5m2's one, int8's, e4m3fnuz's) x
    # (float scales, ue8m0 in float words, packed) and the blocked layout of float8), each with
    # plain input (x alignment x the two paths), each gated activation (aligned, one pass), the
    # masked kernel for all (aligned) and the RMSNorm kernel (aligned, residual at run time,
    # one or two lanes a thread, and for 16-bit input the two-lane walking kernel with the
    # weight in shared memory); bfloat16 SiLU of UE8M0 scales (float words and packed, the
    # three binaries) at six blocks an SM too; the one-pass kernel of plain aligned input with
    # the load linear in the slot (contiguous rows);
    # arithmetic="unfloored" (MXFP8: plain input, 32 values, e4m3, UE8M0 in the blocked layout
    # and float words, x the four paths and the linear load) and "multiplier" (torchao's: plain
    # input, 128 and 256 values, e4m3, float scales in float words, x the four paths and the
    # linear load); then per input type the FP4 kernel of each format and layout (NVFP4
    # blocked, MXFP4 row and blocked) by either arithmetic (section 4a's and "reciprocal") and
    # NVFP4's amax kernel; then, for tiles of 128 and of 256 (weight blocks of 256x256, 256
    # tokens by 128 channels), the tiles of e4m3: weight blocks (inputs x scale kinds) and the
    # column-wise kernel (inputs x float words, UE8M0 in them, packed); then section 3c's
    # tiles of float scales: weight blocks (inputs x "reciprocal" and "multiplier") and
    # columns (inputs x "multiplier")
    combinations = 4 * (3 * 3 + 1)
    six_blocks = 4 * 3 * 2
    flat = 3 * combinations
    gated = len(INPUT_MODES) - 1  # SiLU-mul, GeGLU
    assert len(_plan.all_name_expressions()) == (
        3 * combinations * (2 * 2 + gated + (1 + gated) + 2)
        + 2 * combinations
        + six_blocks
        + flat
        + 3 * 2 * (4 + 1)
        + 3 * 2 * (4 + 1)
        + 3 * (3 * 2 + 1)
        + 2 * (3 * 2 + 3 * 3 + 3 * 2 + 3 * 1)
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_each_kernel_template_compiles(arch):
    # the default run's proof that every template compiles for every target, with ptxas's checks
    keys = _one_of_each_kernel()
    report: list[str] = []
    lowered = _jit.compile_offline(_plan.SOURCE, keys, arch, report)
    _check_compiled(arch, keys, lowered, report)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_instantiation_compiles(arch, request):
    if not request.config.getoption("--compile-all"):
        pytest.skip("minutes on two cores: run with `pytest --compile-all` (CI does)")
    target = EXHAUSTIVE_TARGETS[arch]
    keys = _plan.all_name_expressions()
    chunks = [keys[i : i + COMPILE_CHUNK] for i in range(0, len(keys), COMPILE_CHUNK)]
    lowered: dict[str, str] = {}
    report: list[str] = []
    # spawned workers: a forked child would inherit the parent's CUDA state on a GPU machine
    workers = min(os.cpu_count() or 1, len(chunks))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for chunk_lowered, chunk_report in pool.map(_compile_chunk, [target] * len(chunks), chunks):
            lowered.update(chunk_lowered)
            report.extend(chunk_report)
    _check_compiled(target, keys, lowered, report)


def _one_of_each_kernel() -> list[str]:
    """A name expression of each kernel template and input mode of quantize.cu."""
    names = _plan.all_name_expressions()
    kinds = ("quantize_groups", "quantize_masked", "quantize_norm", "nvfp4_amax",
             "quantize_weight_blocks", "quantize_columns")  # fmt: skip
    picked = [next(n for n in names if f"fgq::{kind}<" in n) for kind in kinds]
    # every FP4 format and layout of bfloat16 (one lane a group of 16, two of 32), and MXFP4 of
    # float32 (four lanes a group)
    picked += [n for n in names if n.startswith("fgq::quantize_fp4<fgq::kBF16")]
    picked.append(next(n for n in names if n.startswith("fgq::quantize_fp4<fgq::kF32, fgq::kMx")))
    # SiLU's two tables (bfloat16's band, the others' exponential) and the flat one-pass load
    for input_type in ("fgq::kBF16", "fgq::kF16"):
        prefix = f"fgq::quantize_groups<{input_type}"
        picked.append(next(n for n in names if "kSiluMul" in n and n.startswith(prefix)))
        picked.append(next(n for n in names if "kGeluTanhMul" in n and n.startswith(prefix)))
    picked.append(_plan.DEFAULT_KEY.name_expression)
    # the tiles of 256 (two blocks an SM): float32 input, the most registers
    picked.append(_plan.weight_name("float32", "ue8m0", None, 256))
    picked.append(_plan.columns_name("float32", "ue8m0", "fgq::kPackedExponents", None, 256))
    # the tiles' heaviest: UE8M0 (one block an SM), 16-bit and float32 input, packed columns;
    # and section 3c's products (DeepGEMM's weight blocks; torchao's columns, whose "both" also
    # takes them through the group function)
    picked += [_plan.weight_name("bfloat16", "ue8m0"), _plan.weight_name("float32", "ue8m0"),
               _plan.columns_name("float32", "ue8m0", "fgq::kPackedExponents"),
               _plan.columns_name("bfloat16", "float32", "fgq::kFloatWords"),
               _plan.weight_name("bfloat16", "float32", "reciprocal"),
               _plan.columns_name("float32", "float32", "fgq::kFloatWords",
                                  "multiplier")]  # fmt: skip
    return list(dict.fromkeys(picked))


def test_no_module_declares_constant_memory():
    # a __constant__ variable anywhere in a module cost every kernel launched from it 0.10-0.23
    # us a launch on the H200, read or not (docs/perf.md): the sources declare none, and
    # the PTX of each kernel template (and of the benchmark's modules) has no .const variable
    for path in _jit.kernel_dir().iterdir():
        assert "__constant__" not in path.read_text(), path.name
    modules = [(_plan.SOURCE, _one_of_each_kernel()), ("roofline.cu", ["fgq::roofline_copy"]),
               ("chain.cu", ["fgq::produce_bf16", "fgq::consume"])]  # fmt: skip
    for source, names in modules:
        ptx, _, _ = _jit._nvrtc_compile(source, names, "compute_90")
        text = ptx.decode() if isinstance(ptx, bytes) else ptx
        assert ".global .align" in text or source != _plan.SOURCE  # the tables are global
        assert not [line for line in text.splitlines() if line.lstrip().startswith(".const")], (
            source
        )


def test_jit_layer_compiles_a_toy_kernel(tmp_path, monkeypatch):
    # _jit knows nothing about quantization: any directory of .cu files works through it
    (tmp_path / "toy.cu").write_text(
        '#include "toy.cuh"\n'
        "template <int N> __global__ void add_n(int* data) { data[threadIdx.x] += toy<N>(); }\n"
    )
    (tmp_path / "toy.cuh").write_text("template <int N> __device__ int toy() { return N; }\n")
    monkeypatch.setenv(_jit.KERNEL_DIR_ENV, str(tmp_path))
    _jit.source_text.cache_clear()
    try:
        assert _jit.kernel_dir() == tmp_path
        first = _jit.source_text("toy.cu")
        lowered = _jit.compile_offline("toy.cu", ["add_n<3>"], "sm_90")
        assert lowered["add_n<3>"] == "_Z5add_nILi3EEvPi"

        # editing an included header changes the source text CuPy's cache keys on
        (tmp_path / "toy.cuh").write_text(
            "template <int N> __device__ int toy() { return 2 * N; }\n"
        )
        _jit.source_text.cache_clear()
        _jit._fingerprint.cache_clear()
        assert _jit.source_text("toy.cu") != first

        (tmp_path / "toy.cuh").write_text("this is not C++\n")
        _jit.source_text.cache_clear()
        _jit._fingerprint.cache_clear()
        with pytest.raises(_jit.CompileError, match="toy.cuh"):
            _jit.compile_offline("toy.cu", ["add_n<3>"], "sm_90")
    finally:
        _jit.source_text.cache_clear()
        _jit._fingerprint.cache_clear()


def test_a_header_in_the_working_directory_cannot_replace_ours(tmp_path, monkeypatch):
    # NVRTC resolves a quoted include beside the program, i.e. in the working directory, first
    (tmp_path / "common.cuh").write_text('#error "the working directory\'s common.cuh"\n')
    monkeypatch.chdir(tmp_path)
    source = _jit.source_text(_plan.SOURCE)
    assert "#include" not in source  # self-contained: nothing left for NVRTC to look up
    _jit.compile_offline(_plan.SOURCE, [_plan.DEFAULT_KEY.name_expression], "sm_90")


def test_compile_errors_name_the_header_and_line(tmp_path, monkeypatch):
    (tmp_path / "main.cu").write_text('#include "part.cuh"\n__global__ void k() {}\n')
    (tmp_path / "part.cuh").write_text("#pragma once\n\nint broken = ;\n")
    monkeypatch.setenv(_jit.KERNEL_DIR_ENV, str(tmp_path))
    _jit.source_text.cache_clear()
    _jit._fingerprint.cache_clear()
    try:
        with pytest.raises(_jit.CompileError, match=r"part\.cuh\(3\)"):
            _jit.compile_offline("main.cu", ["k"], "sm_90")
    finally:
        _jit.source_text.cache_clear()
        _jit._fingerprint.cache_clear()


def test_the_jit_layer_does_not_import_quantization_code():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_jit))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not ({"_plan", "api", "reference", "_spec", "_layout"} & (imported | modules))


def test_missing_cupy_or_nvrtc_gives_an_install_hint(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy now raises ImportError
    with pytest.raises(_jit.GpuUnavailableError, match=r"pip install 'fp8_group_quant\[cuda12\]'"):
        # a device no earlier test compiled for, so the memo cannot answer first
        _jit.get_function(_plan.SOURCE, _plan.DEFAULT_KEY.name_expression, 4321)
    with pytest.raises(_jit.GpuUnavailableError, match="NVRTC was not found"):
        _jit._raise_if_nvrtc_missing(OSError("CuPy failed to load libnvrtc.so.12"))
    _jit._raise_if_nvrtc_missing(OSError("some other failure"))  # unrelated errors pass through


# the Params struct: one definition in kernels/params.cuh, its ctypes mirror read from it ---------


def _params_layout(tmp_path, monkeypatch, size: int) -> dict[str, int]:
    """The offset NVRTC gives each field of ``fgq::Params``, read from the PTX of one probe
    kernel per field, after a static_assert that the struct has ``size`` bytes.

    NOTES: NVRTC has no offsetof (no <cstddef>, no __builtin_offsetof), so the offsets come
    from the code it generates: each probe loads one field, as ld.param [probe_param_0+offset].
    """
    import re
    import shutil

    monkeypatch.delenv(_jit.KERNEL_DIR_ENV, raising=False)
    sources = _jit.kernel_dir()
    tmp_path = tmp_path / f"size{size}"
    tmp_path.mkdir()
    for path in sources.iterdir():
        shutil.copy(path, tmp_path / path.name)
    fields = [name for name, _ in _abi.params_type()._fields_]
    probes = [
        f'extern "C" __global__ void probe_{name}(const __grid_constant__ fgq::Params p, '
        f"decltype(p.{name})* out) {{ *out = p.{name}; }}"
        for name in fields
    ]
    (tmp_path / "probe.cu").write_text(
        '#include "common.cuh"\n'
        f'static_assert(sizeof(fgq::Params) == {size}, "the size of Params");\n'
        + "\n".join(probes)
        + "\n"
    )
    monkeypatch.setenv(_jit.KERNEL_DIR_ENV, str(tmp_path))
    _jit.source_text.cache_clear()
    _jit._fingerprint.cache_clear()
    try:
        ptx, _, _ = _jit._nvrtc_compile("probe.cu", [], "compute_90")
    finally:
        _jit.source_text.cache_clear()
        _jit._fingerprint.cache_clear()
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    layout = {}
    for name in fields:
        loads = re.findall(rf"ld\.param\.\w+\s+[^,]+,\s*\[probe_{name}_param_0(?:\+(\d+))?\]", ptx)
        assert len(loads) == 1, (name, loads)
        layout[name] = int(loads[0] or 0)
    return layout


def test_params_mirror_matches_the_struct(tmp_path, monkeypatch):
    import ctypes

    mirror = _abi.params_type()
    fields = [name for name, _ in mirror._fields_]
    assert {"x", "q", "scales", "nonfinite_codes"} <= set(fields)
    expected = {name: getattr(mirror, name).offset for name in fields}
    assert _params_layout(tmp_path, monkeypatch, ctypes.sizeof(mirror)) == expected
    # the size check can fail: a struct of another size does not compile
    with pytest.raises(_jit.CompileError, match="the size of Params"):
        _params_layout(tmp_path, monkeypatch, ctypes.sizeof(mirror) + 8)


def test_the_kernels_facts_have_one_definition_in_python():
    # the constants and Params reach the kernels as the text of abi.cuh, which _abi writes:
    # no file under kernels/ defines them again, and no Python reads them back from C++
    assert _plan.lane_bytes() == 32 and _plan.max_threads_per_block() == 256
    text = _jit.source_text(_plan.SOURCE)
    for name, value in _abi.CONSTANTS.items():
        assert f"constexpr int {name} = {value};" in text
        for path in _jit.kernel_dir().iterdir():
            assert f"constexpr int {name} " not in path.read_text(), (path, name)
    assert "struct Params {" in text and not (_jit.kernel_dir() / "abi.cuh").exists()
    package = Path(_plan.__file__).parent
    for module in package.rglob("*.py"):
        assert "cpp_constant" not in module.read_text(), module


# the disk cache and the compile at import -------------------------------------------------------


def test_compiled_binaries_are_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv(_jit.CACHE_DIR_ENV, str(tmp_path))
    expression = _plan.DEFAULT_KEY.name_expression
    path, lowered = _jit.compile_cached(_plan.SOURCE, [expression], "sm_90")
    assert path.parent == tmp_path and path.suffix == ".cubin" and path.stat().st_size > 0
    assert lowered[expression].startswith("_ZN3fgq15quantize_groups")

    def no_compile(*args, **kwargs):
        raise AssertionError("a cached binary was compiled again")

    monkeypatch.setattr(_jit, "_nvrtc_compile", no_compile)
    assert _jit.compile_cached(_plan.SOURCE, [expression], "sm_90") == (path, lowered)
    with pytest.raises(AssertionError, match="compiled again"):  # another target is a new key
        _jit.compile_cached(_plan.SOURCE, [expression], "sm_100")
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary name and renamed


def test_precompile_needs_no_device_and_logs_failures(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(_jit.CACHE_DIR_ENV, str(tmp_path))
    expression = _plan.DEFAULT_KEY.name_expression
    monkeypatch.setattr(_jit, "device_count", lambda: 0)
    assert _jit.precompile(_plan.SOURCE, [expression]) == {}
    assert not list(tmp_path.iterdir())  # no device, nothing compiled

    # one Hopper device, seen through the context-free query only
    monkeypatch.setattr(_jit, "device_count", lambda: 1)
    monkeypatch.setattr(_jit, "compute_capability", lambda device: (9, 0))
    assert _jit.precompile(_plan.SOURCE, [expression]) == {}
    assert len(list(tmp_path.glob("quantize-sm_90-*.cubin"))) == 1

    def broken(*args, **kwargs):
        raise _jit.CompileError("NVRTC failed: the log says why")

    monkeypatch.setattr(_jit, "compile_cached", broken)
    with caplog.at_level("WARNING", logger="fp8_group_quant"):
        failures = _jit.precompile(_plan.SOURCE, [expression])
    assert list(failures) == ["sm_90"] and "the log says why" in caplog.text


def test_targets_follow_nvrtc(monkeypatch):
    assert _jit.target_for((9, 0)) == "sm_90"
    newest = max(int(a) for a in _jit._nvrtc().getSupportedArchs())
    # a device newer than NVRTC knows gets PTX of the newest architecture it knows
    assert _jit.target_for((newest // 10 + 1, 0)) == f"compute_{newest}"


def test_the_benchmarks_chain_kernels_compile():
    # the names the benchmark asks for (fp8_group_quant.bench.chain), so a rename on either side
    # fails here rather than on a GPU
    from fp8_group_quant.bench.chain import CHAIN_KERNELS, CHAIN_SOURCE

    for arch in ARCHS:
        lowered = _jit.compile_offline(CHAIN_SOURCE, list(CHAIN_KERNELS), arch)
        assert len(set(lowered.values())) == 2
        roofs = ["fgq::roofline_copy", "fgq::roofline_gated", "fgq::roofline_residual",
                 "fgq::roofline_split"]  # fmt: skip
        assert len(set(_jit.compile_offline("roofline.cu", roofs, arch).values())) == 4


# issue 11: compile and cache robustness ---------------------------------------------------------


@pytest.fixture
def toy_kernels(tmp_path, monkeypatch):
    """A kernel directory of one small kernel, chosen through the variable, caches cleared."""
    directory = tmp_path / "kernels"
    directory.mkdir()
    (directory / "toy.cu").write_text("template <int N> __global__ void k(int* d) { d[0] = N; }\n")
    monkeypatch.setenv(_jit.KERNEL_DIR_ENV, str(directory))
    monkeypatch.setenv(_jit.CACHE_DIR_ENV, str(tmp_path / "cache"))
    _jit.source_text.cache_clear()
    _jit._fingerprint.cache_clear()
    yield directory
    _jit.source_text.cache_clear()
    _jit._fingerprint.cache_clear()


def test_threads_asking_for_one_kernel_compile_it_once(toy_kernels, monkeypatch):  # item 7
    import threading
    import time

    compiles, in_flight, most = [], [0], [0]
    real = _jit._nvrtc_compile
    count_lock = threading.Lock()

    def counting(filename, expressions, target, extra=()):
        with count_lock:
            compiles.append(tuple(expressions))
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.2)  # widen the window in which the other threads arrive
        try:
            return real(filename, expressions, target, extra)
        finally:
            with count_lock:
                in_flight[0] -= 1

    monkeypatch.setattr(_jit, "_nvrtc_compile", counting)
    keys = [f"k<{i % 4}>" for i in range(16)]  # 16 threads, 4 distinct kernels
    results, barrier = {}, threading.Barrier(len(keys))

    def work(i):
        barrier.wait()
        results[i] = _jit.compile_cached("toy.cu", [keys[i]], "sm_90")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(keys))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(compiles) == sorted((f"k<{i}>",) for i in range(4))  # once per kernel
    assert len({results[i][0] for i in range(16)}) == 4 and all(
        p.is_file() for p, _ in results.values()
    )
    assert most[0] > 1  # distinct kernels compiled side by side, not queued behind one lock


@pytest.mark.parametrize("problem", ["missing", "file", "empty"])
def test_a_bad_kernel_directory_is_named_not_replaced(tmp_path, monkeypatch, problem):  # item 8
    target = tmp_path / "kernels"
    if problem == "file":
        target.write_text("not a directory")
    elif problem == "empty":
        target.mkdir()
    monkeypatch.setenv(_jit.KERNEL_DIR_ENV, str(target))
    _jit.source_text.cache_clear()
    try:
        with pytest.raises(FileNotFoundError, match=_jit.KERNEL_DIR_ENV):
            _jit.kernel_dir()
        with pytest.raises(FileNotFoundError, match=_jit.KERNEL_DIR_ENV):
            _jit.source_text(_plan.SOURCE)
    finally:
        _jit.source_text.cache_clear()


@pytest.mark.parametrize("missing", ["common.cuh", "quantize.cu"])
def test_a_kernel_directory_missing_a_file_is_named(tmp_path, monkeypatch, missing):  # item 8
    import shutil

    directory = tmp_path / "kernels"
    shutil.copytree(_jit.kernel_dir(), directory)
    (directory / missing).unlink()
    (tmp_path / "common.cuh").write_text('#error "the working directory\'s common.cuh"\n')
    monkeypatch.chdir(tmp_path)  # where NVRTC would have looked for the missing header
    monkeypatch.setenv(_jit.KERNEL_DIR_ENV, str(directory))
    _jit.source_text.cache_clear()
    _jit._fingerprint.cache_clear()
    try:
        with pytest.raises(
            FileNotFoundError, match=f"{_jit.KERNEL_DIR_ENV}=.*{missing} is missing"
        ):
            _jit.compile_offline(_plan.SOURCE, [_plan.DEFAULT_KEY.name_expression], "sm_90")
    finally:
        _jit.source_text.cache_clear()
        _jit._fingerprint.cache_clear()


@pytest.mark.parametrize("problem", ["a file", "under a file"])
def test_an_unusable_cache_directory_warns_once_and_compiles(toy_kernels, monkeypatch, problem):
    # item 9: the cache directory is a file, or cannot be created; the kernel still compiles
    import warnings

    blocker = toy_kernels.parent / "blocker"
    blocker.write_text("not a directory")
    cache = blocker if problem == "a file" else blocker / "cache"
    monkeypatch.setenv(_jit.CACHE_DIR_ENV, str(cache))
    monkeypatch.setattr(_jit, "_fallback_dir", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path, lowered = _jit.compile_cached("toy.cu", ["k<1>"], "sm_90")
        again, _ = _jit.compile_cached("toy.cu", ["k<2>"], "sm_90")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and _jit.CACHE_DIR_ENV in messages[0], messages
    assert path.is_file() and again.parent == path.parent and cache not in path.parents
    assert _jit.compile_cached("toy.cu", ["k<1>"], "sm_90") == (path, lowered)  # found again


def test_a_cupy_cache_path_through_a_file_warns_and_is_left_as_it_is(tmp_path):
    # CuPy creates CUPY_CACHE_DIR when imported, so a file on that path breaks `import cupy`,
    # half importing it. In a fresh process that imports the package first, CuPy is imported
    # against a private directory, with one warning naming the variable, and the variable is
    # left as the user set it (a change would hold for the whole process)
    import subprocess
    import sys

    pytest.importorskip("cupy")
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    for value in (blocker, blocker / "under"):
        env = dict(__import__("os").environ, CUPY_CACHE_DIR=str(value))
        plain = subprocess.run([sys.executable, "-c", "import cupy"], env=env, capture_output=True)
        assert plain.returncode != 0  # CuPy alone fails: the case is real
        script = (
            "import os, sys, warnings, numpy as np\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    import fp8_group_quant as fgq\n"
            "    from fp8_group_quant import _jit\n"
            "    q, s = fgq.quantize(np.ones((2, 128), np.float32))\n"
            "    cupy = _jit.cupy_module()\n"
            "    _jit.cupy_module()\n"
            "print([str(w.message) for w in caught], cupy.__name__, os.environ['CUPY_CACHE_DIR'])\n"
        )
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.count("CUPY_CACHE_DIR=") == 1, done.stdout  # one warning
        assert done.stdout.split()[-2:] == ["cupy", str(value)]  # usable, variable unchanged


def test_compiles_are_logged(toy_kernels, caplog):  # issue 12: JIT compiles through logging
    import logging

    with caplog.at_level(logging.INFO, logger="fp8_group_quant"):
        _jit.compile_cached("toy.cu", ["k<5>"], "sm_90")
        _jit.compile_cached("toy.cu", ["k<5>"], "sm_90")  # a cache hit: no second record
    compiled = [r for r in caplog.records if "compiled 1 kernel(s) of toy.cu" in r.getMessage()]
    assert len(compiled) == 1 and "sm_90" in compiled[0].getMessage()


def test_preload_chunks_are_fixed_runs_of_the_request():
    # the disk cache keys on each chunk's expressions: a process that has loaded some kernels
    # already must ask for the same chunks as a fresh one (tools/precompile.py fills them)
    keys = [key.name_expression for key in _plan.all_kernel_keys()]
    chunks = _jit.preload_chunks(keys + keys[:5])  # duplicates dropped, order kept
    assert [e for chunk in chunks for e in chunk] == keys
    assert all(len(chunk) == _jit.PRELOAD_CHUNK for chunk in chunks[:-1])
    assert 0 < len(chunks[-1]) <= _jit.PRELOAD_CHUNK
