"""Fill the kernel disk cache with every instantiation, compiled by several processes at once.

    PYTHONPATH=. python3 tools/precompile.py [PROCESSES]

Compiles the chunks that ``warmup(device, "all")`` and the GPU tests' fixtures load (one NVRTC
program per chunk of ``_jit.preload_chunks``) for the architecture of every visible GPU, chunk
i in process i mod PROCESSES, creating no CUDA context. On the H200 machine (16 cores) this
takes about a tenth of one process's time; later processes read the cache.
"""

import multiprocessing
import sys
import time

from fp8_group_quant import _jit, _plan


def compile_chunks(part: int, parts: int) -> int:
    keys = _plan.all_name_expressions()
    chunks = _jit.preload_chunks(keys)[part::parts]
    for chunk in chunks:
        failures = _jit.precompile(_plan.SOURCE, chunk)
        if failures:
            raise SystemExit(f"precompile: {failures}")
    return len(chunks)


if __name__ == "__main__":
    parts = int(sys.argv[1]) if len(sys.argv) > 1 else multiprocessing.cpu_count()
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(parts) as pool:
        done = pool.starmap(compile_chunks, [(i, parts) for i in range(parts)])
    print(f"precompile: {sum(done)} NVRTC programs in {time.perf_counter() - started:.1f} s")
