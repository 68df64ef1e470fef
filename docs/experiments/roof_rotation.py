"""How the rotation of input buffers sets the roofline kernel's time (issue 10's question).

The benchmark rotates over up to 64 separately allocated inputs. This times the roofline kernel
and the quantizer (the production launch) at K = 7168 with three rotations: 64 separate
allocations (as `bench`), the same bytes as consecutive slices of one allocation, and two
buffers (L2-resident below M = 1024). Same traffic, same graph replay; only where the bytes live
changes. Run from the repository root: PYTHONPATH=$PWD python3 docs/experiments/roof_rotation.py
"""

import cupy
import harness
import ml_dtypes
import numpy as np

from fp8_group_quant import _launch, api, bench

K = 7168
M_VALUES = (1, 16, 64, 256, 512, 2048, 8192)


def rotations(m: int) -> dict:
    host = np.random.default_rng(m).standard_normal((m, K), dtype=np.float32)
    host = host.astype(ml_dtypes.bfloat16)
    count = max(2, min(64, -(-harness.ROTATE_BYTES // host.nbytes)))
    separate = [cupy.asarray(host) for _ in range(count)]
    block = cupy.empty((count, m, K), dtype=ml_dtypes.bfloat16)
    block[...] = cupy.asarray(host)
    sliced = [block[i] for i in range(count)]
    return {"separate": separate, "sliced": sliced, "two": separate[:2]}


def main() -> None:
    _launch.PDL = False  # as the roofline kernel: no overlap between back-to-back launches
    roofline = harness.roofline_function()
    print(f"{'M':>6} " + " ".join(f"{n + ' roof':>14} {n + ' ours':>14}" for n in
          ("separate", "sliced", "two")))  # fmt: skip
    for m in M_VALUES:
        cells = []
        for inputs in rotations(m).values():
            outputs = [api.quantize_packed(x) for x in inputs]
            roof = harness.time_roofline(roofline, inputs, outputs)

            def call(i, inputs=inputs, outputs=outputs):
                x, (q, s) = inputs[i % len(inputs)], outputs[i % len(inputs)]
                return lambda: api.quantize_packed(x, out=q, scale_out=s)

            calls = [call(i) for i in range(max(len(inputs), harness.CALLS))]
            ours = bench.graph_time_us(cupy, calls, 9)
            cells.append(f"{roof:>14.2f} {ours:>8.2f} ({ours / roof:.2f})")
        print(f"{m:>6} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
