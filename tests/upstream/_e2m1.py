"""The e2m1 helpers vLLM's tests/kernels/quantization/test_nvfp4_quant.py (commit
07b13497a9b52274d334090a9a8e04d5ec9ca7e9; SPDX-License-Identifier: Apache-2.0, Copyright
contributors to the vLLM project) and FlashInfer's tests/test_helpers/utils_fp4.py (commit
78096bae3d47541f364895ea6d05041c1a6332e3; Apache-2.0, Copyright (c) 2025 by FlashInfer team)
both define, in the same words: carried once here, as test data, re-expressed."""

import torch

# e2m1 code -> value: codes 0-7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign
E2M1_TO_FLOAT32 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                   0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]  # fmt: skip


def cast_to_fp4(x: torch.Tensor) -> torch.Tensor:
    """Round |x| <= 6 to the e2m1 grid by upstream's intervals (ties to the even code)."""
    sign = torch.sign(x)
    x = torch.abs(x)
    x[(x >= 0.0) & (x <= 0.25)] = 0.0
    x[(x > 0.25) & (x < 0.75)] = 0.5
    x[(x >= 0.75) & (x <= 1.25)] = 1.0
    x[(x > 1.25) & (x < 1.75)] = 1.5
    x[(x >= 1.75) & (x <= 2.5)] = 2.0
    x[(x > 2.5) & (x < 3.5)] = 3.0
    x[(x >= 3.5) & (x <= 5.0)] = 4.0
    x[x > 5.0] = 6.0
    return x * sign


def get_reciprocal(x):
    """1 / x, and 0 for x == 0."""
    if isinstance(x, torch.Tensor):
        return torch.where(x == 0, torch.tensor(0.0, dtype=x.dtype, device=x.device), 1.0 / x)
    if isinstance(x, (float, int)):
        return 0.0 if x == 0 else 1.0 / x
    raise TypeError("Input must be a float, int, or a torch.Tensor.")
