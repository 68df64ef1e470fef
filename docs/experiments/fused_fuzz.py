"""Experiment (issue 13, session 27, device run 8): many more drawn fused calls than the GPU
suite's 200, with fresh seeds: tests/test_properties.py's Hypothesis test of the fused kernels
against the NumPy backend (every byte of poisoned storage, and the residual), N examples a
process (it was in tests/test_gpu.py then).
Run from the repository root after tools/precompile.py, several processes at once:

    PYTHONPATH=$PWD python3 docs/experiments/fused_fuzz.py 700
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
import test_properties  # noqa: E402
from hypothesis import given, settings  # noqa: E402

fused = test_properties.test_fused_kernels_match_the_numpy_backend_on_drawn_calls
test = fused.hypothesis.inner_test
run = settings(max_examples=int(sys.argv[1]), deadline=None, database=None, derandomize=False)(
    given(case=test_properties.fused_cases())(test)
)
run()
print("fused fuzz: passed", sys.argv[1], "drawn calls")
