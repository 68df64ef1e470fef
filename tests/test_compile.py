"""Every kernel instantiation compiles with NVRTC for sm_90, sm_100 and sm_120, without a GPU."""

import pytest

from fp8_group_quant import _jit, _launch

ARCHS = ["sm_90", "sm_100", "sm_120"]  # Hopper, datacenter Blackwell, consumer Blackwell

nvrtc = pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy is not installed")


@pytest.mark.parametrize("arch", ARCHS)
def test_every_instantiation_compiles(arch):
    keys = _launch.all_kernel_keys()
    assert len(keys) == 3 * 4 * 3 * 3 * 2
    report = []
    lowered = _jit.compile_offline(_launch.SOURCE, [k.name_expression for k in keys], arch, report)
    assert len(set(lowered.values())) == len(keys)  # one distinct kernel per key
    assert all(name.startswith("_ZN3fgq15quantize_groups") for name in lowered.values())
    # ptxas's resource report: one spill line per kernel, and on Hopper, where the register
    # bounds were measured, no kernel spills (a spill in the loop cost int8 and float-scale
    # variants 10-20% on the H200, docs/perf.md step 8)
    spills = [line for line in report if "spill" in line]
    assert len(spills) == len(keys), report[:20]
    assert arch != "sm_90" or all(
        " 0 bytes spill stores, 0 bytes spill loads" in line for line in spills
    ), [line for line in spills if " 0 bytes spill stores" not in line]


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
    source = _jit.source_text(_launch.SOURCE)
    assert "#include" not in source  # self-contained: nothing left for NVRTC to look up
    _jit.compile_offline(_launch.SOURCE, [_launch.DEFAULT_KEY.name_expression], "sm_90")


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
    assert not ({"_launch", "api", "reference", "_spec", "_layout"} & (imported | modules))


def test_missing_cupy_or_nvrtc_gives_an_install_hint(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy now raises ImportError
    with pytest.raises(_jit.GpuUnavailableError, match=r"pip install 'fp8_group_quant\[cuda12\]'"):
        # a device no earlier test compiled for, so the memo cannot answer first
        _jit.get_function(_launch.SOURCE, _launch.DEFAULT_KEY.name_expression, 4321)
    with pytest.raises(_jit.GpuUnavailableError, match="NVRTC was not found"):
        _jit._raise_if_nvrtc_missing(OSError("CuPy failed to load libnvrtc.so.12"))
    _jit._raise_if_nvrtc_missing(OSError("some other failure"))  # unrelated errors pass through
