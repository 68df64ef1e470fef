"""Synthetic activations, for the main job (``python -m fp8_group_quant``) and the benchmark."""

from __future__ import annotations

import ml_dtypes
import numpy as np


def activation(tokens: int, hidden: int, seed: int = 0) -> np.ndarray:
    """bf16 activations with per-token magnitudes and a few outlier channels, like an LLM's."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32)
    x *= np.exp(rng.standard_normal((tokens, 1), dtype=np.float32))
    outlier_channels = rng.choice(hidden, size=max(1, hidden // 512), replace=False)
    x[:, outlier_channels] *= 40.0
    return x.astype(ml_dtypes.bfloat16)
