"""How the benchmark times: CUDA graphs replayed over rotating buffers larger than L2, medians.

GPU time per call comes from replaying a graph of many launches (CuPy's graphs, or torch's where
the inputs are torch tensors); host-inclusive time per call from back-to-back eager calls with
one synchronisation per repeat. Each figure is a median.
"""

from __future__ import annotations

import gc
import statistics
import time

ROTATE_BYTES = 256 * 2**20  # rotate over at least this much input: several times the 50 MB L2
CALLS = 32  # launches per graph, at least one per rotated buffer
ROOFLINE_THREADS = 256  # threads a block of the roofline kernels (kernels/roofline.cu)


def copy_bandwidth(cupy, nbytes: int = 2**31, repeats: int = 10) -> float:
    """Device-to-device copy, bytes read + written per second (median of repeats)."""
    src = cupy.ones(nbytes // 4, cupy.float32)
    dst = cupy.empty_like(src)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats + 2):
        start.record()
        dst[...] = src
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    del src, dst
    return 2 * nbytes / statistics.median(times[2:])


def graph_time_us(cupy, calls, replays: int = 7) -> float:
    """Median GPU time per call of ``calls`` (a list of launches) captured in one CUDA graph."""
    return interleaved_graph_times_us(cupy, [calls], replays)[0]


def interleaved_graph_times_us(cupy, call_lists, replays: int = 7) -> list[float]:
    """Median GPU time per call of each list of launches, each captured in its own CUDA graph.

    NOTES: the graphs are replayed in turn (a, b, a, b, ...), so a drift of the GPU's clocks
    during the measurement (as after a run of large shapes) moves every list alike and their
    ratio stays fair; the same kernel at M = 16 has taken 1.50 us and 1.67 us minutes apart
    when timed one list after the other.
    """
    stream = cupy.cuda.Stream(non_blocking=True)
    graphs = []
    with stream:
        for calls in call_lists:
            for call in calls[:2]:  # warm up outside the capture
                call()
            stream.synchronize()
            stream.begin_capture()
            for call in calls:
                call()
            graphs.append(stream.end_capture())
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times: list[list[float]] = [[] for _ in graphs]
    for _ in range(replays + 1):
        for graph, calls, series in zip(graphs, call_lists, times):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            series.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / len(calls))
    return [statistics.median(series[1:]) for series in times]


def torch_graph_time_us(torch, calls, replays: int = 7) -> float:
    """Median GPU time per call of ``calls`` captured in one torch CUDA graph."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for call in calls[:2]:  # warm up outside the capture
            call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for call in calls:
            call()
    times = []
    for _ in range(replays + 1):  # replay() runs on the current stream: time it there
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times[1:])


def cupy_stream(torch):
    """torch's current stream as a CuPy stream (for launches through CuPy inside its graphs).

    NOTES: through the CUDA stream protocol where both sides have it (CuPy 14 deprecates
    ExternalStream, and its warning filled `bench --fused`'s output), else ExternalStream."""
    import cupy

    stream = torch.cuda.current_stream()
    if hasattr(cupy.cuda.Stream, "from_external") and hasattr(stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(stream)
    return cupy.cuda.ExternalStream(stream.cuda_stream)


def eager_time_us(sync, call, iterations: int = 200, repeats: int = 11) -> float:
    """Host-inclusive time per call, issuing back to back and synchronising once per repeat.

    NOTES: the garbage collector is paused while timing, as ``timeit`` does: a collection of the
    whole interpreter's objects landing in one 200-call loop would be charged to these calls.
    """
    for _ in range(10):
        call()
    sync()
    times = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(iterations):
                call()
            sync()
            times.append((time.perf_counter() - start) / iterations * 1e6)
    finally:
        if collecting:
            gc.enable()
    return statistics.median(times)


def interleaved_quantiles_us(calls: dict, sync=None, each: int = 10_000, rounds: int = 10):
    """{name: (p50, p90, [each round's p50])} of the host time of single calls of each of
    ``calls``, timed in ``rounds`` rounds of ``each // rounds`` calls a name (at least one),
    the names' order rotated a round and reversed every other round, so that no name always
    follows the same one: a drift of the host over the run (clocks, other processes) falls on
    every name alike, and the per-round medians show how far one comparison can be trusted.
    """
    names = list(calls)
    samples: dict = {name: [] for name in names}
    rounds_p50: dict = {name: [] for name in names}
    per_round = max(1, each // rounds)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order[::-1] if r % 2 else order:
            p50, _, taken = _quantiles_and_samples(calls[name], sync, per_round, warmup=20)
            samples[name] += taken
            rounds_p50[name].append(p50)
    return {name: (*_p50_p90_us(samples[name]), rounds_p50[name]) for name in names}


def call_quantiles_us(call, sync=None, calls: int = 10_000, sync_every: int = 500):
    """(p50, p90) of the host time of ``calls`` single calls, in microseconds.

    NOTES: each call is timed alone (perf_counter_ns around it, about 0.1 us of its own), so
    the quantiles are of calls, not of batches; ``sync`` (where the call launches work) runs
    every ``sync_every`` calls outside the timed spans, so the launch queue never fills and a
    call never waits for the GPU. The garbage collector is paused, as in ``eager_time_us``.
    """
    p50, p90, _ = _quantiles_and_samples(call, sync, calls, 200, sync_every)
    return p50, p90


def _quantiles_and_samples(call, sync, calls: int, warmup: int, sync_every: int = 500):
    """(p50 us, p90 us, the samples in ns) of ``calls`` single calls after ``warmup``."""
    clock = time.perf_counter_ns
    for _ in range(warmup):
        call()
    if sync is not None:
        sync()
    samples = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for start in range(0, calls, sync_every):
            for _ in range(min(sync_every, calls - start)):
                began = clock()
                call()
                samples.append(clock() - began)
            if sync is not None:
                sync()
    finally:
        if collecting:
            gc.enable()
    return (*_p50_p90_us(samples), samples)


def _p50_p90_us(samples_ns) -> tuple[float, float]:
    """(p50, p90) in microseconds of samples in nanoseconds."""
    ordered = sorted(samples_ns)
    return ordered[len(ordered) // 2] / 1e3, ordered[(len(ordered) * 9) // 10] / 1e3
