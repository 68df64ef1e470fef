"""Experiment (issue 10, session 25): does a kernel pay for what else its module holds?

small_m_bisect.py (run 2) timed the roofline kernel's body taking ours' Params, launched by the
library's launch layer, 0.04-0.17 us slower than the roofline kernel at M <= 512; the
parameter's size and the driver call had been ruled out before (docs/perf.md step 22 and
"The driver call that records a launch"). What is left is the module: ours is compiled from
quantize.cu, whose text also defines a __constant__ table (kExpTable, 512 bytes, constant bank
3) and a 64 KB __device__ table (kSiluBandBF16), the roofline kernel from roofline.cu, which
has neither. Columns (us per call, graph replay over rotating buffers, graphs in turn):
- roof: the roofline kernel as `bench` compiles it (roofline.cu);
- roof_ours: the same kernel compiled in quantize.cu's module;
- roof_const: roofline.cu with a 512-byte __constant__ array the kernel does not read;
- roof_dev: roofline.cu with a 64 KB __device__ array the kernel does not read;
- ours: the library's launch; ours_dev: ours compiled with kExpTable a __device__ array
  instead of __constant__ (the module then has no constant bank 3);
- roofp / roofp_dev: small_m_bisect.py's roofline body on ours' Params, in quantize.cu's
  module as it is and with kExpTable a __device__ array.
Run 3 of session 25 measured the kernel of commit 713cc82; since step 27 (perf.md) the table
is a __device__ array, so ours_dev and roofp_dev are ours and roofp again.
Run from the repository root:
PYTHONPATH=$PWD python3 docs/experiments/module_cost.py [--m=M,...] [K ...]
"""

import sys

import cupy
import flat_one_pass
import harness
import ml_dtypes
import small_m_bisect

from fp8_group_quant import _jit, _launch, bench
from fp8_group_quant.__main__ import activation

# the roofline kernel's own text (roofline.cu's first namespace block), without its include
ROOF_TEXT = (_jit.kernel_dir() / "roofline.cu").read_text()
ROOF = ROOF_TEXT[ROOF_TEXT.index("namespace fgq {") : ROOF_TEXT.index("}  // namespace fgq") + 19]
CONSTANT = "\n__constant__ float fgq_unused_constant[128] = {1.0f, 2.0f};\n"
DEVICE = "\n__device__ const unsigned int fgq_unused_device[16384] = {1u, 2u};\n"
NO_CONSTANT_BANK = (
    "__constant__ float kExpTable[128] = {",
    "__device__ const float kExpTable[128] = {",
)
ALL_M = (1, 4, 16, 64, 256, 512, 2048)


def main() -> None:
    _launch.PDL = False
    ks = [int(a) for a in sys.argv[1:] if not a.startswith("--")] or [7168, 2048]
    chosen = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--m=")]
    m_values = [int(v) for v in chosen[0].split(",")] if chosen else ALL_M
    ours_text = _jit.source_text("quantize.cu")
    dev_text = ours_text.replace(*NO_CONSTANT_BANK)
    if dev_text == ours_text:
        print(
            "# kExpTable is already a __device__ array: ours_dev and roofp_dev equal ours and roofp"
        )
    roof_text = _jit.source_text("roofline.cu")
    name = "fgq::roofline_copy"
    roofs = {
        "roof": harness.roofline_function(),
        "roof_ours": harness.compile_function(ours_text + "\n" + ROOF, name),
        "roof_const": harness.compile_function(roof_text + CONSTANT, name),
        "roof_dev": harness.compile_function(roof_text + DEVICE, name),
    }
    expression = _launch.DEFAULT_KEY.name_expression
    variants = {
        "ours_dev": harness.compile_function(dev_text, expression),
        "roofp": harness.compile_function(ours_text + small_m_bisect.KERNELS, "fgq::roof_params"),
        "roofp_dev": harness.compile_function(
            dev_text + small_m_bisect.KERNELS, "fgq::roof_params"
        ),
    }
    header = None
    for k in ks:
        for m in m_values:
            x_host = activation(m, k, seed=m + k).astype(ml_dtypes.bfloat16)
            buffers = max(2, min(64, -(-harness.ROTATE_BYTES // x_host.nbytes)))
            inputs = [cupy.asarray(x_host) for _ in range(buffers)]
            geometry = _launch.Geometry((m, k), 128, "packed", False)
            outputs = [
                (cupy.empty(geometry.q_storage, cupy.uint8),
                 cupy.empty(geometry.scale_storage, cupy.int32))
                for _ in range(buffers)
            ]  # fmt: skip
            calls = {name: harness.roofline_calls(f, inputs, outputs) for name, f in roofs.items()}
            ours = harness.default_launch(m, k)[0]
            calls["ours"] = harness.launch_calls(ours, inputs, outputs)
            expected = flat_one_pass.reference(m, k, x_host)
            for name, function in variants.items():
                launch = flat_one_pass.ours(m, k, inputs[0], 128, True, function)
                if name == "ours_dev":
                    flat_one_pass.check_ours(launch, expected, inputs[0])
                calls[name] = harness.launch_calls(launch, inputs, outputs)
            times = bench.interleaved_graph_times_us(cupy, list(calls.values()), 11)
            harness.print_times(m, k, dict(zip(calls, times)), header is None)
            header = True


if __name__ == "__main__":
    main()
