"""What the tables measure when ``--m`` and ``--k`` are left alone, and the bytes a call moves.

Bytes moved per call (the model every figure uses): ``M*K*in_bytes`` read, ``M*K`` written for
q, plus the scale storage written.
"""

from __future__ import annotations

from .._layout import Geometry
from .._spec import INPUT_TYPES

DEFAULT_M = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_K = (2048, 7168)
INPUT_BYTES = {name: t.itemsize for name, t in INPUT_TYPES.items()}


def bytes_moved(m: int, k: int, input_dtype: str, geometry: Geometry) -> int:
    scale_bytes = geometry.scale_storage_bytes
    return m * k * INPUT_BYTES[input_dtype] + m * k + scale_bytes


def own_m(args, own) -> list[int]:
    """``--m`` as given, or a table's own tokens where ``--m`` was left at DEFAULT_M."""
    return args.m if args.m != list(DEFAULT_M) else list(own)


def own_k(args, own: int) -> list[int]:
    """``--k`` as given, or ``[own]`` where ``--k`` was left at DEFAULT_K."""
    return list(args.k) if args.k and list(args.k) != list(DEFAULT_K) else [own]
