"""``bench --sweep``: the sizes it covers, the ratios it reports, the worst of them per K and
PDL setting, and how it takes SGLang's source; on the GPU, a short sweep end to end."""

import pytest

from fp8_group_quant.bench import cli, sweep


def test_the_sweep_covers_every_32_rows_then_powers_of_two():
    ms = sweep.sweep_m()
    assert ms[:3] == [32, 64, 96] and 384 in ms and 512 in ms and 2048 in ms
    assert all(b - a == 32 for a, b in zip(ms[:64], ms[1:64]))
    assert ms[64:] == [4096, 8192, 16384, 32768, 65536] and len(ms) == 69
    assert sweep.SWEEP_K == (2048, 4096, 7168)


def test_ratios_take_sglangs_faster_build_without_pdl_and_its_pdl_launch_with_it():
    times = {"roof": 1.0, "ours": 3.3, "ours_pdl": 2.0, "sgl": 3.0, "sgl_nopdl": 2.97,
             "sgl_pdl": 2.5}  # fmt: skip
    off, on = sweep._ratios(times)
    assert off == pytest.approx(3.3 / 2.97) and on == pytest.approx(0.8)
    off, on = sweep._ratios({"roof": 2.0, "ours": 3.0, "ours_pdl": 2.2})  # no SGLang: the roof
    assert (off, on) == (pytest.approx(1.5), pytest.approx(1.1))


def test_the_worst_ratio_per_k_and_pdl_setting_names_its_m(capsys):
    rows = [{"m": m, "k": k, "off": off, "on": on}
            for m, k, off, on in ((32, 2048, 0.98, 0.9), (384, 2048, 1.12, 0.95),
                                  (512, 2048, 1.03, 0.97), (32, 7168, 0.99, 1.01))]  # fmt: skip
    sweep.print_worst(rows, against_sglang=True)
    out = capsys.readouterr().out
    assert "ours / SGLang v2" in out
    assert "K=2048  PDL off  worst 1.120 at M=384; 2 of 3 points above 1" in out
    assert "K=2048  PDL on   worst 0.970 at M=512; 0 of 3 points above 1" in out
    assert "K=7168  PDL on   worst 1.010 at M=32; 1 of 1 points above 1" in out


def test_the_sweep_takes_sglangs_source_from_peers(tmp_path, monkeypatch):
    from fp8_group_quant.bench import peers

    source = tmp_path / "v2.cuh"
    source.write_text(f"namespace sglang {{\n// ----\n{peers.LAUNCHER_MARK}\n}}\n")
    seen = []
    monkeypatch.setattr(cli, "gpu_missing", lambda: None)
    monkeypatch.setattr(sweep, "run_sweep", lambda args, path: seen.append(path) or [])
    assert cli.main(["--sweep", "--peers", f"sglang={source}"]) == 0
    assert cli.main(["--sweep", "--m", "64"]) == 0
    assert seen == [str(source), None]


@pytest.mark.gpu
def test_a_short_sweep_runs_checks_and_reports_the_worst(capsys):
    from fp8_group_quant import bench

    assert bench.main(["--sweep", "--m", "32", "384", "4096", "--k", "2048"]) == 0
    out = capsys.readouterr().out
    assert "no --peers sglang=PATH" in out and "ours / the roofline kernel" in out
    table = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [row[:2] for row in table] == [["32", "2048"], ["384", "2048"], ["4096", "2048"]]
    assert all(float(row[3]) > 0 and float(row[4]) > 0 for row in table)  # ours, ours_pdl
    worst = [line for line in out.splitlines() if line.lstrip().startswith("K=")]
    assert len(worst) == 2 and all(" worst " in line for line in worst)  # PDL off and on
