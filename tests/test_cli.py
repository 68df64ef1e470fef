"""The command line: python -m fp8_group_quant [run|bench|info], its checks and its exits."""

import os
from pathlib import Path

import numpy as np
import pytest

import fp8_group_quant as fgq
from fp8_group_quant import __main__ as cli
from fp8_group_quant import api

ROOT = Path(__file__).resolve().parents[1]


def test_the_main_job_checks_against_the_spec_model(capsys):
    assert cli.main(["--tokens", "8", "--hidden", "512"]) == 0
    out = capsys.readouterr().out
    assert "groups recomputed with the spec's scalar model" in out and "MISMATCH" not in out


def test_the_main_job_fails_on_a_wrong_code(capsys, monkeypatch):
    real = api.quantize_packed

    def off_by_one(x, *args, **kwargs):  # one code of the result changed
        q, s = real(x, *args, **kwargs)
        if isinstance(q, np.ndarray):
            codes = q.view(np.uint8)
            codes[0, 0] ^= 1
        return q, s

    monkeypatch.setattr(api, "quantize_packed", off_by_one)
    monkeypatch.setattr(cli, "_gpu", lambda: None)
    assert cli.main(["run", "--tokens", "4", "--hidden", "256"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


# each argument check of run and bench, and an unknown subcommand
@pytest.mark.parametrize(
    "argv, words",
    [
        (["--tokens", "3", "--hidden", "100"], "--hidden: expected a positive multiple of 128"),
        (["--tokens", "-1"], "--tokens"),
        (["bench", "--layout", "nope"], "invalid choice: 'nope'"),
        (["bench", "--group-size", "100"], "invalid choice: 100"),
        (["bench", "--k", "0"], "positive integer"),
        (["bench", "--layout", "packed", "--scale", "float32"], "needs scale='ue8m0'"),
        (["bench", "--layout", "blocked", "--dtype", "int8"], "Blackwell's MX formats"),
        (["bench", "--scale-rule", "floor", "--dtype", "int8"], "scale_rule='floor'"),
        (["bench", "--paths", "rms_norm"], "--paths: only with --fused"),
        (["bench", "--fused", "--paths", "rmsnorm"], "invalid choice: 'rmsnorm'"),
        (["nope"], "invalid choice: 'nope'"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def test_version_and_info(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0 and fgq.__version__ in capsys.readouterr().out
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "cache" in out and "kernels" in out and "devices" in out


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(word in out for word in ("run", "bench", "info"))


def test_bench_without_a_gpu_says_so_and_exits_1():
    # a subprocess with no device visible, so that this runs on GPU machines too
    import subprocess
    import sys

    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "fp8_group_quant", "bench", "--m", "1", "--k", "256"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "needs a CUDA GPU" in done.stderr and "Traceback" not in done.stderr


# PDL on and off
@pytest.mark.parametrize("on", [False, True])
def test_bench_pdl_launches_sets_pdl_with_a_plan_cache_of_its_own_and_restores_both(on):
    from fp8_group_quant import _launch, api, bench

    before = (_launch.PDL, api._PLANS)
    with bench.pdl_launches(on):
        assert _launch.PDL is on
        assert api._PLANS is not before[1]  # no plan prepared the other way is reused
    assert (_launch.PDL, api._PLANS) == before
    with pytest.raises(KeyError), bench.pdl_launches(on):
        raise KeyError("a failing benchmark")
    assert _launch.PDL is before[0] and api._PLANS is before[1]


# every path in its own order, two asked out of order, one
@pytest.mark.parametrize("paths, expected", [
    (None, [("silu_mul", 1), ("silu_mul", 512), ("add_rms_norm", 1), ("rms_norm", 1),
            ("add_rms_norm", 512), ("rms_norm", 512), ("masked",)]),
    (["masked", "rms_norm"], [("rms_norm", 1), ("rms_norm", 512), ("masked",)]),
    (["add_rms_norm"], [("add_rms_norm", 1), ("add_rms_norm", 512)]),
])  # fmt: skip
def test_bench_fused_times_the_paths_asked_in_its_own_order(monkeypatch, capsys, paths, expected):
    # the row functions replaced by recorders, and the GPU modules by stand-ins: which rows
    # run_fused asks for, with --paths and without
    import argparse
    import sys
    import types

    from fp8_group_quant import bench, bench_fused

    calls = []
    runtime = types.SimpleNamespace(getDevice=lambda: 0)
    monkeypatch.setitem(
        sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace())
    monkeypatch.setattr(bench_fused, "copy_bandwidth", lambda cupy: 4.0e12)
    monkeypatch.setattr(bench_fused._jit, "get_function", lambda *args: None)

    def record(*key):
        calls.append(key)
        return {"path": key[0]}

    monkeypatch.setattr(bench_fused, "_silu_row", lambda t, roof, bw, m, n: record("silu_mul", m))
    monkeypatch.setattr(bench_fused, "_norm_row", lambda t, roofs, bw, m, n, residual: record(
        "add_rms_norm" if residual else "rms_norm", m))  # fmt: skip
    monkeypatch.setattr(bench_fused, "_masked_row", lambda t: record("masked"))
    argv = ["--fused", "--m", "1", "512"] + (["--paths", *paths] if paths else [])
    args = bench.add_arguments(argparse.ArgumentParser()).parse_args(argv)
    rows = bench_fused.run_fused(args)
    assert calls == expected and [row["path"] for row in rows] == [c[0] for c in expected]
    out = capsys.readouterr().out
    assert ("# fused SiLU" in out) == (paths is None)
    assert ("# fused RMSNorm" in out) == any("norm" in c[0] for c in expected)


@pytest.mark.gpu
def test_bench_chain_runs_and_checks(capsys):
    from fp8_group_quant import bench

    args = bench.main(["--chain", "--m", "1", "64", "--k", "2048"])
    assert args == 0
    out = capsys.readouterr().out
    assert "no PDL" in out and len([line for line in out.splitlines() if line[:6].strip()]) >= 3
