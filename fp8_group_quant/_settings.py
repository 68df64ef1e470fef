"""The user settings: four environment variables, read here and nowhere else.

- ``FP8_GROUP_QUANT_CACHE_DIR`` (directory; default ``$XDG_CACHE_HOME/fp8_group_quant``, else
  ``~/.cache/fp8_group_quant``): where compiled kernels are kept; read at each compile.
- ``FP8_GROUP_QUANT_KERNEL_DIR`` (directory of ``.cu`` sources; default the packaged
  ``kernels/``): read at each compile.
- ``FP8_GROUP_QUANT_COMPILE_ON_IMPORT`` (``1`` or ``0``; default ``1``): compile the default
  kernel into the disk cache at import, on a machine with a GPU.
- ``FP8_GROUP_QUANT_PDL`` (``1`` or ``0``; default ``1``): Programmatic Dependent Launch on
  SM90 and newer; read at import.

Tuning choices (grid sizes, wave limits) are not settings: they are a table in ``_tuning``.
"""

from __future__ import annotations

import os
from pathlib import Path

PREFIX = "FP8_GROUP_QUANT_"
CACHE_DIR = PREFIX + "CACHE_DIR"
KERNEL_DIR = PREFIX + "KERNEL_DIR"
COMPILE_ON_IMPORT = PREFIX + "COMPILE_ON_IMPORT"
PDL = PREFIX + "PDL"
NAMES = (CACHE_DIR, KERNEL_DIR, COMPILE_ON_IMPORT, PDL)


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if value not in ("0", "1"):
        raise ValueError(f"{name}: expected 0 or 1, got {value!r}")
    return value == "1"


def cache_dir() -> Path:
    """Where compiled kernels are kept."""
    override = os.environ.get(CACHE_DIR)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fp8_group_quant"


def cache_dir_chosen() -> bool:
    """Whether the user chose the cache directory (else it is the default)."""
    return bool(os.environ.get(CACHE_DIR))


def kernel_dir_override() -> str | None:
    """The kernel directory the user chose, or None for the packaged sources."""
    return os.environ.get(KERNEL_DIR) or None


def compile_on_import() -> bool:
    """Compile the default kernel into the disk cache when the package is imported."""
    return _flag(COMPILE_ON_IMPORT, True)


def pdl() -> bool:
    """Launch with Programmatic Dependent Launch on devices that have it (SM90 and newer)."""
    return _flag(PDL, True)
