"""First timing of the fused SiLU-and-multiply quantizer on a GPU (issue 13).

For each M (N = 7168, bf16 -> e4m3, packed UE8M0 scales), CUDA-graph replay over rotating
buffers, median us per call: the fused kernel; the plain quantizer on [M, N] (the second
half of the unfused path); torch's SiLU-and-multiply ([M, 2N] -> [M, N], rounded twice as
defined) then the plain quantizer (the unfused path); and the floor, bytes / copy bandwidth.
Usage: PYTHONPATH=. python3 docs/experiments/silu_mul_timing.py
"""

import math

import cupy
import ml_dtypes  # noqa: F401  (numpy learns bfloat16)
import numpy as np
import torch

import fp8_group_quant as fgq
from fp8_group_quant import bench

N = 7168
ROTATE = 256 << 20


def main():
    bandwidth = bench.copy_bandwidth(cupy)
    print(f"# copy bandwidth {bandwidth / 1e12:.2f} TB/s; N = {N}, bf16 -> e4m3, packed scales")
    print(f"{'M':>6} {'floor':>7} {'fused':>7} {'plain[M,N]':>10} {'torch act':>9} "
          f"{'unfused':>8} {'fused/floor':>11} {'unfused/fused':>13}")  # fmt: skip
    for m in (1, 64, 512, 4096):
        measure(m, bandwidth)
    masked()


def masked(experts: int = 32, tokens: int = 1024, k: int = 7168, share: float = 0.05) -> None:
    """The masked layout with sum(masked_m) = share * E * T against the plain quantizer on the
    same number of rows, and against the masked grid with every row counted."""
    print(f"# masked: E = {experts}, T = {tokens}, K = {k}, sum(masked_m) = {share:.0%} of E*T")
    x = torch.randn(experts, tokens, k, device="cuda", dtype=torch.bfloat16)
    rng = np.random.default_rng(0)
    counts = rng.multinomial(int(share * experts * tokens), [1 / experts] * experts)
    counts_t = torch.from_numpy(counts.astype(np.int32)).cuda()
    full_t = torch.full((experts,), tokens, dtype=torch.int32, device="cuda")
    rows = int(counts.sum())
    plain_x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    options = dict(scale="ue8m0", layout="packed")
    q, s = fgq.quantize(x, 128, **options, masked_m=counts_t)
    pq, ps = fgq.quantize(plain_x, 128, **options)

    def run_masked(c):
        return lambda: fgq.quantize(x, 128, **options, masked_m=c, out=q, scale_out=s)

    t_masked = torch_graph_time_us([run_masked(counts_t)] * 32)
    t_full = torch_graph_time_us([run_masked(full_t)] * 4)
    t_plain = torch_graph_time_us(
        [lambda: fgq.quantize(plain_x, 128, **options, out=pq, scale_out=ps)] * 32
    )
    print(f"masked {t_masked:.2f} us, plain on the same {rows} rows {t_plain:.2f} us "
          f"(ratio {t_masked / t_plain:.2f}); every row counted {t_full:.2f} us")  # fmt: skip


def measure(m: int, bandwidth: float) -> None:
    buffers = max(2, min(32, math.ceil(ROTATE / (m * 2 * N * 2))))
    xs = [torch.randn(m, 2 * N, device="cuda", dtype=torch.bfloat16) * 3 for _ in range(buffers)]
    ys = [torch.randn(m, N, device="cuda", dtype=torch.bfloat16) for _ in range(buffers)]
    options = dict(scale="ue8m0", layout="packed")
    outs = [fgq.quantize(x, 128, **options, activation="silu_mul") for x in xs]
    calls = max(buffers, 32)

    def fused(i):
        x, (q, s) = xs[i % buffers], outs[i % buffers]
        return lambda: fgq.quantize(x, 128, **options, activation="silu_mul", out=q, scale_out=s)

    def plain(i):
        y, (q, s) = ys[i % buffers], outs[i % buffers]
        return lambda: fgq.quantize(y, 128, **options, out=q, scale_out=s)

    def act(i):  # the engines' silu_and_mul: SiLU rounded to bf16, then the product
        x, y = xs[i % buffers], ys[i % buffers]
        return lambda: torch.mul(torch.nn.functional.silu(x[:, :N]), x[:, N:], out=y)

    def unfused(i):
        a, p = act(i), plain(i)
        return lambda: (a(), p())

    t_fused = torch_graph_time_us([fused(i) for i in range(calls)])
    t_plain = torch_graph_time_us([plain(i) for i in range(calls)])
    t_act = torch_graph_time_us([act(i) for i in range(calls)])
    t_unfused = torch_graph_time_us([unfused(i) for i in range(calls)])
    moved = m * 2 * N * 2 + m * N + m * math.ceil(N / 512) * 4
    floor = moved / bandwidth * 1e6
    print(f"{m:>6} {floor:>7.2f} {t_fused:>7.2f} {t_plain:>10.2f} {t_act:>9.2f} "
          f"{t_unfused:>8.2f} {t_fused / floor:>11.2f} {t_unfused / t_fused:>13.2f}",
          flush=True)  # fmt: skip
    # the fused result is the NumPy backend's, bit for bit
    host = xs[0].view(torch.int16).cpu().numpy().view(np.dtype("bfloat16"))
    q, s = outs[0]
    q_ref, s_ref = fgq.quantize(host, 128, **options, activation="silu_mul")
    assert np.array_equal(q.view(torch.uint8).cpu().numpy(), q_ref.view(np.uint8))
    assert np.array_equal(s.cpu().numpy(), s_ref)


def torch_graph_time_us(calls, replays: int = 7) -> float:
    import statistics

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for call in calls[:2]:
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


if __name__ == "__main__":
    main()
