"""Experiment (issue 13, session 10, fused step 11): the masked layout's persistent kernel with
and without the next iteration's loads issued before it quantizes.

Times, in one process, the masked quantizer on x [E = 32, T = 1024, K = 7168] with
sum(masked_m) at 5%, 25% and 100% of E * T (counts drawn at random, clamped to T), and the
plain quantizer on as many rows, by torch CUDA-graph replay, PDL off as `bench` launches;
bf16 -> e4m3, packed UE8M0 scales. Run it once per copy of the package (the kernel source is
the package's) in alternating processes; the prefetching kernel is this commit's with
`masked_prefetch.patch` applied (`git apply docs/experiments/masked_prefetch.patch` in a copy
of the tree made with `git archive`), e.g.
  for d in .base .; do PYTHONPATH=$d python3 docs/experiments/masked_prefetch.py; done
Every masked result's real rows are checked against the plain quantizer's first. Arguments:
the persistent grid's resident waves to try (default one, as the library launches it; the
script scales the occupancy the launch layer reads while it makes the masked plan).
"""

import sys

import numpy as np
import torch

from fp8_group_quant import _launch, api
from fp8_group_quant.bench import pdl_launches
from fp8_group_quant.bench_fused import OPTIONS, torch_graph_time_us

E, T, K = 32, 1024, 7168


def measure(x, counts, waves: float) -> tuple[int, float, float]:
    """(rows, masked us, plain us) for the counts ``counts``."""
    counts_t = torch.from_numpy(counts.astype(np.int32)).cuda()
    plain_x = torch.cat([x[e, : counts[e]] for e in range(E)])
    # the masked plan, made (and cached) with the persistent grid `waves` resident waves deep
    resident_blocks = _launch.resident_blocks

    def deeper(*args):
        per_sm, sms = resident_blocks(*args)
        return int(per_sm * waves), sms

    _launch.resident_blocks = deeper
    try:
        q, s = api.quantize(x, 128, **OPTIONS, masked_m=counts_t)
    finally:
        _launch.resident_blocks = resident_blocks
    pq, ps = api.quantize(plain_x, 128, **OPTIONS)
    real = torch.cat([q[e, : counts[e]] for e in range(E)])
    if not torch.equal(real.view(torch.uint8), pq.view(torch.uint8)):
        raise AssertionError("the masked codes differ from the plain quantizer's")

    def masked():
        return api.quantize(x, 128, **OPTIONS, masked_m=counts_t, out=q, scale_out=s)

    def plain():
        return api.quantize(plain_x, 128, **OPTIONS, out=pq, scale_out=ps)

    t_masked = torch_graph_time_us(torch, [masked] * 16, 11)
    return int(counts.sum()), t_masked, torch_graph_time_us(torch, [plain] * 16, 11)


def main() -> None:
    x = torch.randn(E, T, K, device="cuda", dtype=torch.bfloat16) * 3
    rng = np.random.default_rng(0)
    waves = [float(a) for a in sys.argv[1:]] or [1.0]
    print(f"{api.__file__}")
    print(f"{'waves':>6} {'share':>6} {'rows':>6} {'masked':>8} {'plain':>8} {'x plain':>8}")
    for share in (0.05, 0.25, 1.0):
        counts = np.minimum(rng.multinomial(int(share * E * T), [1 / E] * E), T)
        for w in waves:
            with pdl_launches(False):  # a fresh plan for each grid
                rows, t_masked, t_plain = measure(x, counts, w)
            print(f"{w:>6} {share:>6.2f} {rows:>6} {t_masked:>8.2f} {t_plain:>8.2f} "
                  f"{t_masked / t_plain:>8.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
