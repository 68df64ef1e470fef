"""Many more drawn fused calls than the GPU suite's 200, with fresh seeds: the Hypothesis test
of the fused kernels against the NumPy backend in tests/test_properties.py (every byte of
poisoned storage, and the residual), N examples a process. A script, not collected by pytest;
run from the repository root after tools/precompile.py, several processes at once:

    PYTHONPATH=$PWD python3 tests/fused_fuzz.py 700
"""

import sys

import test_properties  # this directory's: a script's directory is first on sys.path
from hypothesis import given, settings

test = (
    test_properties.test_fused_kernels_match_the_numpy_backend_on_drawn_calls.hypothesis.inner_test
)
run = settings(max_examples=int(sys.argv[1]), deadline=None, database=None, derandomize=False)(
    given(case=test_properties.fused_cases())(test)
)
run()
print("fused fuzz: passed", sys.argv[1], "drawn calls")
