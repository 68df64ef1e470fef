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


def test_the_main_job_labels_its_times(capsys):
    # issue 43, item 4: on a GPU the kernel's time (CUDA-graph replay) and the eager call's
    # (host included) are reported apart, each named; without one, the NumPy backend's
    cli._print_times(0.25, {"kernel": 22e-6, "eager": 40e-6}, 88_000_000)
    gpu = capsys.readouterr().out
    assert "kernel 22.0 us a call (4000 GB/s), from CUDA-graph replay" in gpu
    assert "eager call 40.0 us, host included" in gpu and "NumPy backend 250 ms" in gpu
    cli._print_times(0.25, {}, 88_000_000)
    assert capsys.readouterr().out.strip() == "time       250 ms (NumPy)"


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
        (["run", "--m", "1"], "unrecognized arguments: --m 1"),
        (["bench", "--tokens", "4"], "unrecognized arguments: --tokens 4"),
        # --peers: NAME=PATH, a source that exists, a mode that has the peer
        (["bench", "--peers", "sglang"], "expected NAME=PATH"),
        (["bench", "--peers", "triton=x.cuh"], "expected NAME=PATH"),
        (["bench", "--peers", "sglang=/no/such/v2.cuh"], "no such file"),
        (["bench", "--peers", "vllm=/no/such.ptx"], "add --fused"),
        (["bench", "--matrix", "--peers", "sglang=x.cuh"], "--fused or --chain only"),
        (["bench", "--fused", "--peers", "vllm=/no/such.ptx"], "from the vllm sdist"),
        (["bench", "--fused", "--paths", "masked", "--peers", "vllm=x"], "no peer given has"),
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
    assert "\nbindings   cuda-bindings " in out  # their version, or that CuPy launches without


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
    from fp8_group_quant import _tuning
    from fp8_group_quant.bench import _hooks

    before = _tuning.active()
    with _hooks.pdl_launches(on):
        assert _tuning.active()[1].pdl is on
        assert _tuning.active()[0] != before[0]  # no plan prepared the other way is reused
    assert _tuning.active() == before
    with pytest.raises(KeyError), _hooks.pdl_launches(on):
        raise KeyError("a failing benchmark")
    assert _tuning.active() == before


# every path in its own order, two asked out of order, one
@pytest.mark.parametrize("paths, expected", [
    (None, [("silu_mul", 1), ("silu_mul", 512), ("gelu_tanh_mul", 1), ("gelu_tanh_mul", 512),
            ("add_rms_norm", 1), ("rms_norm", 1), ("add_rms_norm", 512), ("rms_norm", 512),
            ("masked",)]),
    (["masked", "rms_norm"], [("rms_norm", 1), ("rms_norm", 512), ("masked",)]),
    (["add_rms_norm"], [("add_rms_norm", 1), ("add_rms_norm", 512)]),
])  # fmt: skip
def test_bench_fused_times_the_paths_asked_in_its_own_order(monkeypatch, capsys, paths, expected):
    # the row functions replaced by recorders, and the GPU modules by stand-ins: which rows
    # run_fused asks for, with --paths and without
    import argparse
    import sys
    import types

    from fp8_group_quant.bench import cli as bench_cli
    from fp8_group_quant.bench import fused

    calls = []
    runtime = types.SimpleNamespace(getDevice=lambda: 0)
    monkeypatch.setitem(
        sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))
    )
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace())
    monkeypatch.setattr(fused, "copy_bandwidth", lambda cupy: 4.0e12)
    monkeypatch.setattr(fused._hooks, "get_function", lambda *args: None)

    def record(*key):
        calls.append(key)
        return {"path": key[0]}

    monkeypatch.setattr(fused, "_gated_row", lambda t, roof, bw, m, n, act: record(act, m))
    monkeypatch.setattr(fused, "_norm_row", lambda t, roofs, bw, m, n, residual: record(
        "add_rms_norm" if residual else "rms_norm", m))  # fmt: skip
    monkeypatch.setattr(fused, "_masked_row", lambda t: record("masked"))
    argv = ["--fused", "--m", "1", "512"] + (["--paths", *paths] if paths else [])
    args = bench_cli.add_arguments(argparse.ArgumentParser()).parse_args(argv)
    rows = fused.run_fused(args)
    assert calls == expected and [row["path"] for row in rows] == [c[0] for c in expected]
    out = capsys.readouterr().out
    assert ("# fused SiLU" in out) == (paths is None)
    assert ("# fused RMSNorm" in out) == any("norm" in c[0] for c in expected)


# the benchmark's options in the order of the JSON config's keys (the order of add_arguments)
BENCH_OPTIONS = ["--m", "--k", "--input-dtype", "--dtype", "--scale", "--layout", "--group-size",
                 "--scale-rule", "--json", "--plot", "--only", "--cold-start", "--matrix",
                 "--profile-host", "--fused", "--paths", "--nvfp4", "--chain",
                 "--peers", "--linear", "--n", "--sweep"]  # fmt: skip


def test_bench_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m fp8_group_quant bench")
    assert all(f"{option} " in out for option in BENCH_OPTIONS)


def test_bench_json_config_keeps_its_keys_and_their_order(monkeypatch):
    # runs before and after a change are compared by their JSON: the config lists the CLI's own
    # options first (bench was once a subcommand's parser), then the benchmark's in their order;
    # --peers only where given
    from fp8_group_quant.bench import cli as bench_cli

    seen = []
    monkeypatch.setattr(bench_cli, "run_parsed", lambda args, parser: seen.append(args) or 0)
    assert cli.main(["bench", "--m", "1", "--k", "256"]) == 0
    config = bench_cli.json_config(seen[-1])
    assert list(config) == ["command", "tokens", "hidden"] + [
        option[2:].replace("-", "_") for option in BENCH_OPTIONS if option != "--peers"
    ]
    assert config["command"] == "bench" and config["tokens"] == 4096
    assert config["m"] == [1] and config["k"] == [256]
    assert cli.main(["bench", "--peers", "sglang=v2.cuh"]) == 0
    assert bench_cli.json_config(seen[-1])["peers"] == [("sglang", "v2.cuh")]


def test_bench_peers_reach_the_gpu_check_with_a_source_given(tmp_path, monkeypatch, capsys):
    from fp8_group_quant.bench import cli as bench_cli

    source = tmp_path / "per_token_group_quant_8bit_v2.cuh"
    source.write_text("namespace sglang {\n// ----\n// Launcher (JIT)\n}\n")
    monkeypatch.setattr(bench_cli, "gpu_missing", lambda: "no GPU in this test")
    assert cli.main(["bench", "--peers", f"sglang={source}"]) == 1
    assert "no GPU in this test" in capsys.readouterr().err
    source.write_text("// some other file\n")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "--peers", f"sglang={source}"])
    assert exit_info.value.code == 2 and "not SGLang's v2 kernel" in capsys.readouterr().err


@pytest.mark.gpu
def test_bench_chain_runs_and_checks(capsys):
    from fp8_group_quant import bench

    args = bench.main(["--chain", "--m", "1", "64", "--k", "2048"])
    assert args == 0
    out = capsys.readouterr().out
    assert "no PDL" in out and len([line for line in out.splitlines() if line[:6].strip()]) >= 3


def test_help_shows_the_defaults_and_counts_agree_in_number(capsys):
    # issue 43: --hidden showed no default; one row printed "1 groups" and "1 channels"
    from fp8_group_quant import __main__ as cli

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "(default 7168)" in capsys.readouterr().out
    assert cli.main(["--tokens", "1", "--hidden", "128"]) == 0
    out = capsys.readouterr().out
    assert "outliers in 1 channel" in out
    assert "1 group recomputed" in out and "1 groups" not in out and "1 channels" not in out
