"""``bench --profile-host``: where each microsecond of an eager call goes, beside a compiled torch
op timed in the same process.

Every line is the host time of single calls, p50 and p90 of ``CALLS`` calls (``timing.
call_quantiles_us``), all on one stream (a CuPy stream, which torch uses too). The floors: an
empty kernel launched through NVIDIA's bindings with pre-packed arguments (the library's
launch), through ``cuda.core`` and through CuPy's ``RawKernel``, timed interleaved in rounds
(``timing.interleaved_quantiles_us``: each round's p50 kept, and in how many rounds the fastest
was fastest), and a driver call that launches nothing. Then, at each M (``--m``, default 1,
16, 64) and K (``--k``, default 7168), bf16 input: ``torch.abs(x, out=y)`` and
``torch.abs(x)``, and for torch and CuPy inputs the steps of
``quantize_packed(x)``'s fast path each alone (describing x, the plan lookup, allocation,
argument packing, the launch), a prepared call, ``quantize_packed(x)`` and, for torch, the torch
custom op. Last, the ratios the targets are set in (issue 45): a prepared call at most 1.0x
``torch.abs(x, out=y)``, ``quantize_packed(x)`` at most 1.5x ``torch.abs(x)``, the torch op at
most 2.0x ``torch.abs(x)``. A line that cannot run here (no torch, no cuda.core, no bindings)
says why instead of a time.
"""

from __future__ import annotations

from typing import Any

from .. import api
from .._sample import activation
from . import _hooks
from .shapes import own_k, own_m
from .timing import call_quantiles_us, interleaved_quantiles_us

HOST_M = (1, 16, 64)
HOST_K = 7168
CALLS = 10_000
# (ours, the torch op it is held to, the most the ratio of their p50 may be)
TARGETS = (
    ("prepared call", "torch.abs(x, out=y)", 1.0),
    ("quantize_packed(x)", "torch.abs(x)", 1.5),
    ("torch op", "torch.abs(x)", 2.0),
)


def _optional(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def profile_host(args) -> list[dict]:
    """Print and return the lines (dicts: lib, M, K, line, p50_us, p90_us or skipped)."""
    import contextlib

    import cupy

    torch = _optional("torch")
    device = cupy.cuda.runtime.getDevice()
    name = cupy.cuda.runtime.getDeviceProperties(device)["name"].decode()
    stream = cupy.cuda.Stream(non_blocking=True)
    ks, ms = own_k(args, HOST_K), own_m(args, HOST_M)
    print(f"# {name}: host time per call, p50 / p90 of {CALLS} calls (us), bf16 input, K={ks}")
    print(f"{'line':<44} {'lib':>6} {'M':>5} {'p50':>8} {'p90':>8}")
    rows: list[dict] = []
    with contextlib.ExitStack() as scope:
        scope.enter_context(stream)
        if torch is not None:  # torch's work on the same stream
            scope.enter_context(torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)))
        rows += _floors(device, stream)
        for k in ks:
            for m in ms:
                rows += _at_shape(cupy, torch, stream, m, k)
    _print_ratios(rows)
    return rows


def _line(rows: list, line: str, call, sync=None, lib: str = "-", m: Any = "-", k: Any = "-",
          timed: tuple | None = None):  # fmt: skip
    """Time ``call`` (or record why it cannot run: a string), print and append its row;
    ``timed``: its (p50, p90, each round's p50) where already timed."""
    row = {"lib": lib, "M": m, "K": k, "line": line}
    if timed is None and (isinstance(call, str) or call is None):
        row["skipped"] = call or "not available here"
        print(f"{line:<44} {lib:>6} {m!s:>5}   skipped: {row['skipped']}", flush=True)
    else:
        if timed is None:
            row["p50_us"], row["p90_us"] = call_quantiles_us(call, sync, CALLS)
        else:
            row["p50_us"], row["p90_us"], row["rounds_p50_us"] = timed
        print(f"{line:<44} {lib:>6} {m!s:>5} {row['p50_us']:>8.2f} {row['p90_us']:>8.2f}",
              flush=True)  # fmt: skip
    rows.append(row)


def _floors(device: int, stream) -> list[dict]:
    """The empty kernel three ways, a driver call, and the timer itself."""
    rows: list[dict] = []
    _line(rows, "timer: an empty call", lambda: None)
    driver = _hooks.driver_call()
    _line(rows, "driver call, no launch (cuCtxGetCurrent)", driver)
    launches = _hooks.empty_launches(device, stream.ptr)
    names = {"bindings": "empty kernel: cuda.bindings, pre-packed",
             "cuda.core": "empty kernel: cuda.core LaunchConfig + launch",
             "cupy": "empty kernel: CuPy RawKernel"}  # fmt: skip
    runnable = {way: call for way, call in launches.items() if callable(call)}
    # NOTES: the ways are timed interleaved, in rounds, so that the choice between two launches
    # a fraction of a microsecond apart does not rest on which one ran first
    timed = interleaved_quantiles_us(runnable, stream.synchronize, CALLS) if runnable else {}
    for way, line in names.items():
        _line(rows, line, launches[way], timed=timed.get(way))
    if len(timed) > 1:
        p50 = {way: result[0] for way, result in timed.items()}
        fastest = min(p50, key=p50.get)  # type: ignore[arg-type]
        rounds = len(timed[fastest][2])
        wins = sum(
            all(timed[fastest][2][r] <= timed[way][2][r] for way in timed) for r in range(rounds)
        )
        print(f"# fastest launch of the empty kernel: {fastest} ({p50[fastest]:.2f} us p50, the "
              f"fastest in {wins} of {rounds} interleaved rounds); the library launches through "
              f"cuda.bindings: cuda.core's launch cannot pass its by-value Params struct "
              f"(docs/perf.md)")  # fmt: skip
    return rows


def _at_shape(cupy, torch, stream, m: int, k: int) -> list[dict]:
    """The torch op's lines, then ours for CuPy and torch inputs, at (m, k)."""
    import ml_dtypes

    rows: list[dict] = []
    host = activation(m, k, seed=m + k).astype(ml_dtypes.bfloat16)
    x = cupy.asarray(host)
    sync = stream.synchronize
    inputs = [("cupy", x)]
    if torch is None:
        _line(rows, "torch.abs(x, out=y)", "torch is not installed", m=m, k=k)
    else:
        xt = torch.from_dlpack(x)
        yt = torch.empty_like(xt)
        _line(rows, "torch.abs(x, out=y)", lambda: torch.abs(xt, out=yt), sync, "torch", m, k)
        _line(rows, "torch.abs(x)", lambda: torch.abs(xt), sync, "torch", m, k)
        inputs.append(("torch", xt))
    for lib, array in inputs:
        steps = _hooks.call_steps(array)
        for line, call in steps.items():
            launches = line in ("launch", "prepared call")
            _line(rows, line, call, sync if launches else None, lib, m, k)
        _line(rows, "quantize_packed(x)", lambda a=array: api.quantize_packed(a), sync, lib, m, k)
        if lib == "torch":
            from .. import torch_ops

            _line(rows, "torch op", lambda a=array: torch_ops.quantize_packed(a), sync, lib, m, k)
    return rows


def _print_ratios(rows: list[dict]) -> None:
    """Each target's ratio of p50s, per lib, M and K, against the torch op of the same M, K."""
    p50 = {(r["lib"], r["M"], r["K"], r["line"]): r["p50_us"] for r in rows if "p50_us" in r}
    print("# ratios of p50 to the compiled torch op in this run (target: at most)")
    for lib, m, k, line in sorted(key for key in p50 if key[3] in {t[0] for t in TARGETS}):
        for ours, op, most in TARGETS:
            reference = p50.get(("torch", m, k, op))
            if ours == line and reference:
                ratio = p50[(lib, m, k, line)] / reference
                verdict = "met" if ratio <= most else "MISSED"
                print(f"  {lib:>6} M={m:<5} K={k:<5} {ours:<20} / {op:<20} {ratio:6.2f}  "
                      f"(target {most:.1f}: {verdict})")  # fmt: skip
