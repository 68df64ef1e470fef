"""``python -m fp8_group_quant bench``: where the quantizer stands against the memory floor.

In one process: the device copy bandwidth; the roofline kernel (kernels/roofline.cu: the
quantizer's loads and stores, no work); and the quantizer, as GPU time per call from CUDA-graph
replay over rotating buffers (median of replays) and as host-inclusive time per eager call
(cupy and torch inputs). Every provider is checked before it is timed. ``--peers`` times
SGLang's and vLLM's kernels beside ours in the same run, from their sources (not shipped).

Bytes moved per call (the model every figure uses): ``M*K*in_bytes`` read, ``M*K`` written for q,
plus the scale storage written.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from .._layout import LAYOUTS, SCALE_LAYOUTS, combination_error
from .._spec import (
    GROUP_SIZES,
    OUTPUT_FORMATS,
    SCALE_FORMATS,
    SCALE_RULES,
    check_scale_rule,
)
from . import _hooks, chain, fused, host, nvfp4, peers, peers_fused, peers_vllm, plain, sweep
from .fused import FUSED_PATHS
from .shapes import DEFAULT_K, DEFAULT_M, INPUT_BYTES

PROG = "python -m fp8_group_quant bench"
DESCRIPTION = (
    "Where the quantizer stands against the memory floor: the quantizer and a roofline kernel of "
    "the same traffic, timed by CUDA-graph replay over rotating buffers, every provider checked "
    "against the NumPy backend first. --peers times SGLang's and vLLM's kernels beside ours."
)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The benchmark's options, on ``parser``.

    NOTES: the order of the options is the order of the JSON's ``config`` keys, which runs
    compared before and after a change read: a new option goes last."""
    _shape_and_format_arguments(parser)
    _output_arguments(parser)
    _mode_arguments(parser)
    return parser


def _shape_and_format_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--m", type=_positive, nargs="+", default=list(DEFAULT_M), help="tokens")
    parser.add_argument(
        "--k", type=_positive, nargs="+", default=list(DEFAULT_K), help="hidden size"
    )
    parser.add_argument("--input-dtype", default="bfloat16", choices=list(INPUT_BYTES))
    parser.add_argument("--dtype", default="e4m3", choices=list(OUTPUT_FORMATS))
    parser.add_argument("--scale", default="ue8m0", choices=list(SCALE_FORMATS))
    parser.add_argument("--layout", default="packed", choices=list(LAYOUTS))
    parser.add_argument("--group-size", type=int, default=128, choices=list(GROUP_SIZES))
    parser.add_argument("--scale-rule", default="rceil", choices=list(SCALE_RULES))


def _output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument(
        "--plot", help="draw GB/s and fraction of floor against M (needs the plot extra)"
    )
    parser.add_argument(
        "--only", help="--matrix: time only variants whose 'input G dtype scale layout' matches"
    )
    parser.add_argument(
        "--cold-start", action="store_true", help="also time import + first call in new processes"
    )


def _mode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--matrix", action="store_true", help="time every supported variant at --m[0] x --k[0]"
    )
    parser.add_argument(
        "--profile-host",
        action="store_true",
        help="where the host time of an eager call goes (p50/p90 of 10,000 calls), beside a "
        "compiled torch op and empty-kernel launches (--m default 1 16 64, --k 7168)",
    )
    parser.add_argument(
        "--fused",
        action="store_true",
        help="the fused SiLU-and-multiply, (add-)RMSNorm and masked paths against a same-traffic "
        "roof and the unfused steps (needs torch; --k sets N, --m the tokens)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=FUSED_PATHS,
        help="with --fused: time only these paths (default: all, in the order listed)",
    )
    parser.add_argument(
        "--nvfp4",
        action="store_true",
        help="NVFP4 (e2m1, e4m3 blocked scales, G=16), given and computed global scale, against "
        "a same-traffic roof",
    )
    parser.add_argument(
        "--chain",
        action="store_true",
        help="a graph of [producer -> quantize -> consumer] steps, with and without PDL",
    )
    parser.add_argument(
        "--peers",
        nargs="+",
        type=peers.peer_source,
        metavar="NAME=PATH",
        help="time peers' kernels beside ours in the same run, from their sources (not shipped): "
        "sglang=PATH of per_token_group_quant_8bit_v2.cuh from the sglang wheel (the plain "
        "table, --fused's SiLU-and-multiply, --chain); vllm=PATH of the PTX that `python -m "
        "fp8_group_quant.bench.peers_vllm VLLM_CSRC OUT.ptx` builds from the vllm sdist (--fused)",
    )
    parser.add_argument(
        "--linear",
        action="store_true",
        help="an FP8 linear layer's budget per M: the quantizer (forward; backward: both "
        "orientations and the weight), torch._scaled_mm's FP8 GEMM and bf16's (needs torch; "
        "--k[0] is the hidden size)",
    )
    parser.add_argument("--n", type=_positive, default=2048, help="--linear: the layer's outputs")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="the plain kernel at every 32 rows to 2048, then powers of two to 65536, K = 2048 "
        "4096 7168, PDL off and on, beside the roof (and SGLang's v2 kernel with --peers "
        "sglang=PATH); the worst ratio per K and PDL setting",
    )


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def gpu_missing() -> str | None:
    """Why the benchmark cannot run here (no CuPy, no CUDA device), or None."""
    if not _hooks.device_count():  # the driver's answer: CuPy's names no cause
        return (
            "the benchmark needs a CUDA GPU (an NVIDIA GPU and its driver), and none is visible "
            "(no CUDA driver or no device); `python -m fp8_group_quant` runs the main job on the "
            "host"
        )
    try:
        _hooks.cupy_module()
    except Exception as error:  # no CuPy or no NVRTC: its message says how to install them
        return f"the benchmark needs CuPy and NVRTC: {error}"
    return None


def main(argv: list[str] | None = None, namespace: argparse.Namespace | None = None) -> int:
    """The benchmark with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    ``namespace``: the options the package's CLI parsed before the word ``bench`` (its command,
    ``--tokens``, ``--hidden``), which the JSON's ``config`` lists first."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    args = add_arguments(parser).parse_args(sys.argv[1:] if argv is None else argv, namespace)
    return run_parsed(args, parser)


def run_parsed(args, parser: argparse.ArgumentParser) -> int:
    """Run the benchmark for parsed ``args``; usage errors go through ``parser``."""
    _check_arguments(args, parser)
    missing = gpu_missing()
    if missing:
        print(f"{PROG}: {missing}", file=sys.stderr)
        return 1
    import ml_dtypes

    args.input_dtype_np = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16,
                           "float32": np.float32}[args.input_dtype]  # fmt: skip
    if args.profile_host:
        _write_json(args, host.profile_host(args), {})
        return 0
    # NOTES: every timing table launches the quantizer without PDL, as the roofline kernels and
    # torch's kernels are launched: in a graph of back-to-back calls PDL lets each call overlap
    # the previous one, which they cannot, and a ratio would no longer compare like with like
    # (0.92x the roof at M = 1 with PDL; docs/perf.md). --chain measures PDL, between a
    # producer, the quantizer and a consumer, and --peers launches each kernel both ways where
    # its host does: each of their measurements sets PDL itself.
    with _hooks.pdl_launches(False):
        rows, extra = _timing_rows(args)
    if args.cold_start:
        extra.update(plain.cold_start())
    _write_json(args, rows, extra)
    if args.plot:
        plain.plot(rows, args.plot)
    return 0


def _write_json(args, rows: list[dict], extra: dict) -> None:
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"config": json_config(args), "rows": rows, **extra}, handle, indent=1)


def _check_arguments(args, parser: argparse.ArgumentParser) -> None:
    """Usage errors (exit 2 through ``parser``) before anything touches the GPU."""
    if args.paths and not args.fused:
        parser.error("--paths: only with --fused")
    group = 16 if args.nvfp4 else args.group_size  # NVFP4's groups are 16 values
    if any(k % group for k in args.k):
        parser.error(f"--k: every K must be a multiple of the group size {group}")
    error = combination_error(
        OUTPUT_FORMATS[args.dtype], SCALE_FORMATS[args.scale], SCALE_LAYOUTS[args.layout]
    )
    if error:
        parser.error(error)
    try:
        check_scale_rule(args.scale_rule, OUTPUT_FORMATS[args.dtype], SCALE_FORMATS[args.scale])
    except ValueError as rule_error:
        parser.error(str(rule_error))
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error("--plot needs matplotlib: pip install 'fp8_group_quant[plot]'")
    if args.peers:
        error = peers.source_error(args)
        if error:
            parser.error(error)


def _timing_rows(args) -> tuple[list[dict], dict]:
    """The rows of the table ``args`` asks for, and what the JSON carries beside them."""
    if args.sweep:
        return sweep.run_sweep(args, dict(args.peers or ()).get("sglang")), {}
    if args.peers:
        return _peer_rows(args, dict(args.peers))
    if args.fused:
        return fused.run_fused(args), {}
    if args.chain:
        return chain.run_chain(args), {}
    if args.nvfp4:
        return nvfp4.run_nvfp4(args), {}
    if args.linear:
        from . import linear  # torch only here

        device = _hooks.cupy_module().cuda.runtime.getDevice()
        targets = linear.run_targets(lambda f, name: _hooks.get_function(f, name, device))
        return linear.run_linear(args), {"targets": targets}
    return (plain.run_matrix(args) if args.matrix else plain.run(args)), {}


def _peer_rows(args, sources: dict[str, str]) -> tuple[list[dict], dict]:
    if args.fused:
        rows = peers_fused.run(args, sources["sglang"]) if "sglang" in sources else []
        if "vllm" in sources:
            rows += peers_vllm.run(args, sources["vllm"])
        return rows, {}
    if args.chain:
        return chain.run_peers(args, sources["sglang"]), {}
    return peers.run(args, sources["sglang"])


def json_config(args) -> dict:
    """The options of a run, as the JSON's ``config`` records them.

    NOTES: ``peers`` is left out when not given, so that a run of any other table writes the
    config it wrote before the option existed (runs before and after a change are compared)."""
    return {
        key: value
        for key, value in vars(args).items()
        if key != "input_dtype_np" and not (key == "peers" and value is None)
    }
