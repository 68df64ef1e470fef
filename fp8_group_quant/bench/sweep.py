"""``bench --sweep``: the plain kernel at every 32 rows from 32 to 2048, then powers of two to
65536, at K = 2048, 4096 and 7168 (``--m`` and ``--k`` replace either list), with PDL and
without, beside the roofline kernel and, given ``--peers sglang=PATH``, SGLang's v2 kernel
built from its source (``peers``), launched as its host launches it.

GPU us per call by CUDA-graph replay over rotating buffers, every column's graph replayed in
turn (``timing.interleaved_graph_times_us``), as ``bench --peers`` times them: roof; ours (PDL
off) and ours_pdl; sgl (its kUsePDL build without the attribute), sgl_nopdl (built without PDL)
and sgl_pdl (with the attribute). The input rows are a 2048-row activation sample repeated (row
r of buffer j is sample row (r + 97 j) mod 2048), so a point at 65536 rows needs no host work.
Before timing, our launches (both ways) write sampled rows (the first, the last and random ones)
checked bit for bit against the NumPy backend, and SGLang's differing bytes on those rows are
counted. The ratios: ours / the faster of sgl and sgl_nopdl without PDL, ours_pdl / sgl_pdl
with it (ours / roof where SGLang's source is not given); the worst of each per K ends the run.
"""

from __future__ import annotations

import numpy as np

from .. import api
from .._layout import SCALE_LAYOUTS, Geometry
from .._sample import activation
from . import _hooks, peers
from .shapes import DEFAULT_K, DEFAULT_M
from .timing import CALLS, ROTATE_BYTES, interleaved_graph_times_us

SWEEP_K = (2048, 4096, 7168)
SAMPLE_ROWS = 2048  # rows of the activation sample the inputs repeat
CHECKED = 64  # rows checked at each point beside the first and last
REPLAYS = 9


def sweep_m() -> list[int]:
    """Every 32 rows from 32 to 2048, then the powers of two to 65536."""
    return list(range(32, 2049, 32)) + [2**e for e in range(12, 17)]


def run_sweep(args, sglang_path: str | None) -> list[dict]:
    """The table, row by row as measured, and the worst ratios; the rows."""
    import cupy

    ms = list(args.m) if list(args.m) != list(DEFAULT_M) else sweep_m()
    ks = list(args.k) if list(args.k) != list(DEFAULT_K) else list(SWEEP_K)
    roofline = _hooks.compile_text(_hooks.kernel_source("roofline.cu"), "fgq::roofline_copy")
    sglang = {}
    if sglang_path:
        sglang = {"sgl": peers.sglang_function(sglang_path),
                  "sgl_nopdl": peers.sglang_function(sglang_path, peers.NAME_NO_PDL)}  # fmt: skip
    else:
        print("# no --peers sglang=PATH: ours and the roofline kernel only")
    rows: list[dict] = []
    header: list[str] = []
    for k in ks:
        sample = _Sample(cupy, k)
        for m in ms:
            times, differing = _point(cupy, sample, m, roofline, sglang)
            off, on = _ratios(times)
            rows.append({"m": m, "k": k, "us": times, "off": off, "on": on,
                         "sgl_bytes_differing": differing})  # fmt: skip
            if not header:
                header = list(times)
                print(f"{'M':>6} {'K':>5} " + " ".join(f"{c:>9}" for c in header)
                      + f" {'off':>7} {'on':>7}  sgl bytes differing")  # fmt: skip
            print(f"{m:>6} {k:>5} " + " ".join(f"{times[c]:>9.2f}" for c in header)
                  + f" {off:>7.3f} {on:>7.3f}  {differing}", flush=True)  # fmt: skip
            cupy.get_default_memory_pool().free_all_blocks()
    print_worst(rows, bool(sglang))
    return rows


def _ratios(times: dict) -> tuple[float, float]:
    """(without PDL, with PDL): ours over SGLang's time, or over the roof without SGLang."""
    if "sgl_pdl" in times:
        return times["ours"] / min(times["sgl"], times["sgl_nopdl"]), (
            times["ours_pdl"] / times["sgl_pdl"]
        )
    return times["ours"] / times["roof"], times["ours_pdl"] / times["roof"]


def print_worst(rows: list[dict], against_sglang: bool) -> None:
    """The largest ratio per K, without PDL and with it, and the M where it is."""
    peer = "SGLang v2" if against_sglang else "the roofline kernel"
    print(f"# worst ratio ours / {peer} per K (above 1.000: the peer is faster there)")
    for k in dict.fromkeys(r["k"] for r in rows):
        at_k = [r for r in rows if r["k"] == k]
        for setting, label in (("off", "PDL off"), ("on", "PDL on")):
            worst = max(at_k, key=lambda r: r[setting])  # noqa: B023
            slower = sum(r[setting] > 1.0 for r in at_k)
            print(f"  K={k:<5} {label:<8} worst {worst[setting]:.3f} at M={worst['m']}; "
                  f"{slower} of {len(at_k)} points above 1")  # fmt: skip


class _Sample:
    """An activation sample of SAMPLE_ROWS rows at K, on the device, and its reference codes
    and packed scale words (row by row, which no layout choice changes)."""

    def __init__(self, cupy, k: int):
        import ml_dtypes

        host = activation(SAMPLE_ROWS, k, seed=k).astype(ml_dtypes.bfloat16)
        self.k, self.device_rows = k, cupy.asarray(host)
        q, s = api.quantize_packed(host)  # the NumPy backend
        self.q = np.asarray(q).view(np.uint8)
        self.s = np.ascontiguousarray(s)

    def rows(self, cupy, m: int, shift: int):
        """An input of m rows: sample row (r + shift) mod SAMPLE_ROWS at row r."""
        return self.device_rows[(cupy.arange(m) + shift) % SAMPLE_ROWS]

    def check(self, cupy, q, s, geometry: Geometry) -> int:
        """Bytes of the sampled rows of q and the scale words (storage ``q``, ``s``) of an
        input made by ``rows(m, 0)`` that differ from the reference."""
        m, k = geometry.shape
        rng = np.random.default_rng(m + k)
        picked = np.unique(np.r_[0, m - 1, rng.integers(0, m, CHECKED)])
        rows = cupy.asarray(picked)
        words = cupy.lib.stride_tricks.as_strided(
            s, geometry.scale_shape, tuple(4 * v for v in geometry.scale_strides)
        )
        got_q = cupy.asnumpy(q[: m * k].reshape(m, k)[rows])
        got_s = cupy.asnumpy(words[rows])
        expected = picked % SAMPLE_ROWS
        return int((got_q != self.q[expected]).sum() + (got_s != self.s[expected]).sum())


def _point(cupy, sample: _Sample, m: int, roofline, sglang: dict) -> tuple[dict, int | None]:
    """us per call of every column at (m, K), after the checks; SGLang's differing bytes."""
    k = sample.k
    geometry = Geometry((m, k), 128, SCALE_LAYOUTS["packed"], False)
    buffers = max(2, min(64, -(-ROTATE_BYTES // (m * k * 2))))
    inputs = [sample.rows(cupy, m, 97 * j) for j in range(buffers)]
    outputs = peers.packed_outputs(cupy, geometry, buffers)
    device = cupy.cuda.runtime.getDevice()
    launches = peers.our_launches(inputs[0], device)
    q, s = outputs[0]
    stream = cupy.cuda.get_current_stream().ptr
    for name, launch in launches.items():  # over poisoned outputs
        q.fill(0x7F)
        s.fill(0x7F7F7F7F)
        _hooks.run_prepared(launch, inputs[0].data.ptr, q.data.ptr, s.data.ptr, stream)
        wrong = sample.check(cupy, q, s, geometry)
        if wrong:
            raise AssertionError(f"{name} at M={m}, K={k}: {wrong} bytes differ from the reference")
    count = max(buffers, CALLS)
    calls = [peers.roofline_calls(roofline, inputs, outputs)]
    calls += [peers.launch_calls(launch, inputs, outputs) for launch in launches.values()]
    names = ["roof", *launches]
    differing = None
    if sglang:
        sgl = peers.SglangCalls(inputs, outputs, geometry, device)
        q.fill(0x7F)
        s.fill(0)
        sgl.call(sglang["sgl"], 0)()
        differing = sample.check(cupy, q, s, geometry)
        calls += [[sgl.call(function, i) for i in range(count)] for function in sglang.values()]
        calls.append([sgl.pdl_call(sglang["sgl"], i) for i in range(count)])
        names += [*sglang, "sgl_pdl"]
    return dict(zip(names, interleaved_graph_times_us(cupy, calls, REPLAYS))), differing
