"""``bench --profile-host``: the steps it times are the fast path's, its quantiles are of single
calls, its ratios hold each target to its torch op, and a line that cannot run says why.

The plumbing runs on the CPU through ``fake_gpu`` (tests/fake_gpu.py); the whole profile runs
on the GPU.
"""

import json
import time

import pytest

from fp8_group_quant.bench import _hooks, host, timing


def test_the_steps_are_those_of_quantize_packeds_fast_path(fake_gpu):
    from fake_gpu import fake

    x = fake((4, 1024))
    steps = _hooks.call_steps(x)
    assert list(steps) == ["describe x", "plan lookup", "allocate q, scales", "pack arguments",
                           "launch", "prepared call"]  # fmt: skip
    assert len(fake_gpu.plans) == 1  # quantize_packed's plan, found by the lookup step
    (request, _, _) = fake_gpu.plans[0]
    plan = steps["plan lookup"]()
    assert plan is not None and plan.request is request
    assert steps["describe x"]()[-1] == x.data.ptr
    (launch,) = plan.launches
    steps["pack arguments"]()
    assert launch.params.x == x.data.ptr and launch.params.q and launch.params.scales
    fake_gpu.stream, before = 0x77, len(fake_gpu.launches)
    steps["launch"]()  # the launch step launches on the stream read when the steps were made
    assert fake_gpu.launches[-1][1:3] == (x.data.ptr, 0)
    steps["prepared call"]()
    assert fake_gpu.launches[-1][2] == 0x77 and len(fake_gpu.launches) == before + 2
    q, _, scales, _ = steps["allocate q, scales"]()
    assert q.shape == (4, 1024) and scales.shape == (4, 2)
    assert len(fake_gpu.plans) == 1  # no step planned anew


def test_quantiles_are_of_single_calls_and_the_queue_is_drained_outside_them():
    count, synced = [0], [0]

    def call():  # every fifth call takes about 2 ms
        count[0] += 1
        if count[0] % 5 == 0:
            time.sleep(0.002)

    p50, p90 = timing.call_quantiles_us(call, lambda: synced.__setitem__(0, synced[0] + 1),
                                        calls=100, sync_every=25)  # fmt: skip
    assert p50 < 1000 <= p90  # a batch mean would be ~400 us at both quantiles
    assert count[0] == 300 and synced[0] == 1 + 4  # 200 warm-up calls, then a sync per 25


def test_interleaved_timing_rotates_the_order_each_round():
    order: list = []
    calls = {name: (lambda n=name: order.append(n)) for name in ("a", "b", "c")}
    synced = [0]
    timed = timing.interleaved_quantiles_us(calls, lambda: synced.__setitem__(0, synced[0] + 1),
                                            each=30, rounds=3)  # fmt: skip
    # each round: 20 warm-up calls and 10 timed a name, the names rotated by one a round and
    # every other round reversed (a c b: a no longer precedes b)
    rounds = [[order[i * 90 + j * 30] for j in range(3)] for i in range(3)]
    assert rounds == [["a", "b", "c"], ["a", "c", "b"], ["c", "a", "b"]]
    assert all(order.count(name) == 3 * 30 for name in calls)
    assert set(timed) == {"a", "b", "c"} and synced[0] == 3 * 3 * 2  # after warm-up and run
    for p50, p90, rounds in timed.values():
        assert p50 <= p90 and len(rounds) == 3


def test_the_launch_floors_are_timed_interleaved_and_compared(monkeypatch, capsys):
    def slow():  # about 0.5 ms: slower than the others in every round
        time.sleep(0.0005)

    monkeypatch.setattr(host, "CALLS", 40)
    monkeypatch.setattr(_hooks, "driver_call", lambda: lambda: None)
    monkeypatch.setattr(_hooks, "empty_launches", lambda device, stream: {
        "bindings": lambda: None, "cuda.core": slow, "cupy": "no CuPy kernel here"})  # fmt: skip
    stream = type("Stream", (), {"ptr": 0, "synchronize": lambda self: None})()
    rows = host._floors(0, stream)
    by_line = {row["line"]: row for row in rows}
    assert by_line["empty kernel: cuda.core LaunchConfig + launch"]["p50_us"] > 100
    assert len(by_line["empty kernel: cuda.bindings, pre-packed"]["rounds_p50_us"]) == 10
    assert by_line["empty kernel: CuPy RawKernel"]["skipped"] == "no CuPy kernel here"
    out = capsys.readouterr().out
    assert "fastest launch of the empty kernel: bindings" in out
    assert "the fastest in 10 of 10 interleaved rounds" in out


def test_the_ratios_hold_each_target_to_its_torch_op(capsys):
    rows = [{"lib": "torch", "M": 1, "K": 7168, "line": line, "p50_us": us}
            for line, us in (("torch.abs(x, out=y)", 10.0), ("torch.abs(x)", 12.0),
                             ("prepared call", 9.0), ("quantize_packed(x)", 20.0),
                             ("torch op", 24.0))]  # fmt: skip
    rows.append({"lib": "cupy", "M": 1, "K": 7168, "line": "prepared call", "p50_us": 11.0})
    host._print_ratios(rows)
    out = capsys.readouterr().out
    assert "prepared call        / torch.abs(x, out=y)    0.90  (target 1.0: met)" in out
    assert "quantize_packed(x)   / torch.abs(x)           1.67  (target 1.5: MISSED)" in out
    assert "torch op             / torch.abs(x)           2.00  (target 2.0: met)" in out
    assert "cupy M=1     K=7168  prepared call        / torch.abs(x, out=y)    1.10" in out


def test_a_line_that_cannot_run_says_why(capsys):
    rows: list = []
    host._line(rows, "empty kernel: cuda.core", "cuda.core unusable here (ImportError: x)")
    host._line(rows, "timer", lambda: None)
    assert rows[0]["skipped"].startswith("cuda.core unusable") and "p50_us" not in rows[0]
    assert rows[1]["p50_us"] <= rows[1]["p90_us"]
    assert "skipped: cuda.core unusable here" in capsys.readouterr().out


def test_profile_host_writes_its_lines_to_the_json(tmp_path, monkeypatch):
    from fp8_group_quant.bench import cli

    rows = [{"lib": "-", "M": "-", "K": "-", "line": "timer", "p50_us": 0.1, "p90_us": 0.2}]
    monkeypatch.setattr(cli, "gpu_missing", lambda: None)
    monkeypatch.setattr(host, "profile_host", lambda args: rows)
    out = tmp_path / "host.json"
    assert cli.main(["--profile-host", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["rows"] == rows and written["config"]["profile_host"] is True


@pytest.mark.gpu
def test_bench_profile_host_runs_every_line(capsys):
    from fp8_group_quant import bench

    assert bench.main(["--profile-host", "--m", "1"]) == 0
    out = capsys.readouterr().out
    for line in ("empty kernel: cuda.bindings, pre-packed", "empty kernel: CuPy RawKernel",
                 "torch.abs(x, out=y)", "describe x", "launch", "quantize_packed(x)",
                 "torch op"):  # fmt: skip
        assert line in out, line
    assert "skipped" not in out.split("empty kernel: cuda.bindings")[1].split("\n")[0]
    assert out.count("(target ") == 5  # torch: three targets, cupy: two (no torch op)
