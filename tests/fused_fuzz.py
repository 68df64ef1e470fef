"""Many more drawn fused calls than the GPU suite's 200, with fresh seeds: tests/test_gpu.py's
Hypothesis test of the fused kernels against the NumPy backend (every byte of poisoned storage,
and the residual), N examples a process. A script, not collected by pytest; run from the
repository root after tools/precompile.py, several processes at once:

    PYTHONPATH=$PWD python3 tests/fused_fuzz.py 700
"""

import sys

import test_gpu  # this directory's: python puts a script's directory first on sys.path
from hypothesis import given, settings

test = test_gpu.test_fused_kernels_match_the_numpy_backend_on_drawn_calls.hypothesis.inner_test
run = settings(max_examples=int(sys.argv[1]), deadline=None, database=None, derandomize=False)(
    given(case=test_gpu.fused_cases())(test)
)
run()
print("fused fuzz: passed", sys.argv[1], "drawn calls")
