"""Find ``kernels/``, fingerprint it, compile with NVRTC and cache the result per device.

This module knows nothing about quantization: it turns (source file, template name expression)
into a loaded CuPy function. ``compile_offline`` runs NVRTC without a GPU for a given
architecture, which is how CI proves that every instantiation compiles for sm_90, sm_100 and
sm_120.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from functools import cache
from pathlib import Path

__all__ = [
    "CompileError",
    "GpuUnavailableError",
    "compile_offline",
    "current_device",
    "get_function",
    "preload",
    "kernel_dir",
    "nvrtc_options",
    "source_text",
]

KERNEL_DIR_ENV = "FP8_GROUP_QUANT_KERNEL_DIR"
KERNEL_SUFFIXES = (".cu", ".cuh")
# Options CuPy's RawModule adds on its own (cupy/cuda/compiler.py); compile_offline adds them
# too, so the offline check compiles exactly what a GPU machine compiles.
CUPY_ADDED_OPTIONS = ("--device-as-default-execution-space", "-ftz=true")


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries the NVRTC log."""


class GpuUnavailableError(RuntimeError):
    """A GPU call was made but CuPy, NVRTC or a CUDA device is missing."""


def kernel_dir() -> Path:
    """Directory holding the ``.cu`` sources.

    ``$FP8_GROUP_QUANT_KERNEL_DIR`` if set; else ``fp8_group_quant/kernels`` inside an installed
    wheel; else ``kernels/`` beside the package in a source checkout or editable install.
    """
    override = os.environ.get(KERNEL_DIR_ENV)
    candidates = [Path(override)] if override else []
    package = Path(__file__).resolve().parent
    candidates += [package / "kernels", package.parent / "kernels"]
    for candidate in candidates:
        if candidate.is_dir() and any(candidate.glob("*.cu")):
            return candidate
    raise FileNotFoundError(
        f"no CUDA sources found; looked in {', '.join(str(c) for c in candidates)}"
    )


@cache
def _fingerprint(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        if path.suffix in KERNEL_SUFFIXES:
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@cache
def source_text(filename: str) -> str:
    """The source of ``filename``, its ``kernels/`` includes inlined, with a fingerprint of every
    file in ``kernels/`` on line 1.

    NOTES: NVRTC looks for a quoted include beside the program first, and a program compiled
    from a string sits in the process's working directory: a stray ``common.cuh`` there was
    compiled instead of ours (seen in CI, run from /tmp). Inlining the includes, with ``#line``
    marks so that errors still name the header, makes the text self-contained. CuPy's disk cache
    keys on the source string and options only; the fingerprint line keeps that key honest too.
    """
    directory = kernel_dir()
    text = _inline_includes(directory, filename, set())
    return (
        f"// fp8_group_quant kernels fingerprint {_fingerprint(directory)}\n"
        f'#line 1 "{filename}"\n{text}'
    )


_QUOTED_INCLUDE = re.compile(r'\s*#\s*include\s*"([^"]+)"')


def _inline_includes(directory: Path, filename: str, seen: set[str]) -> str:
    """``filename`` with each quoted include of a file in ``directory`` replaced by its text
    (once per file, as ``#pragma once`` would), numbered with ``#line`` marks."""
    lines = []
    for number, line in enumerate((directory / filename).read_text().splitlines(), 1):
        include = _QUOTED_INCLUDE.fullmatch(line)
        if include and (directory / include.group(1)).is_file():
            name = include.group(1)
            if name not in seen:
                seen.add(name)
                lines += [f'#line 1 "{name}"', _inline_includes(directory, name, seen)]
            lines.append(f'#line {number + 1} "{filename}"')
        elif line.strip() == "#pragma once":
            lines.append("")  # the inlining does its work; keeps the line numbers
        else:
            lines.append(line)
    return "\n".join(lines)


def nvrtc_options() -> tuple[str, ...]:
    """NVRTC options we pass (CuPy adds the architecture and ``CUPY_ADDED_OPTIONS``)."""
    return ("--std=c++17", f"-I{kernel_dir()}")


_functions: dict[tuple[int, str, str], object] = {}
_lock = threading.Lock()


def cupy_module():
    """``cupy``, or GpuUnavailableError saying how to install it."""
    try:
        import cupy
    except ImportError as error:  # pragma: no cover - depends on the machine
        raise GpuUnavailableError(
            "GPU arrays need CuPy and NVRTC: pip install 'fp8_group_quant[cuda12]' "
            "(or [cuda13] for CUDA 13)"
        ) from error
    return cupy


NVRTC_HINT = (
    "NVRTC was not found: pip install 'fp8_group_quant[cuda12]' (nvidia-cuda-nvrtc-cu12 >= 12.8) "
    "or 'fp8_group_quant[cuda13]' (nvidia-cuda-nvrtc 13), or put a CUDA toolkit's libnvrtc on "
    "the library path"
)


def _raise_if_nvrtc_missing(error: BaseException) -> None:
    if "nvrtc" in str(error).lower():
        raise GpuUnavailableError(f"{NVRTC_HINT} ({error})") from error


@contextlib.contextmanager
def current_device(device: int):
    """Make ``device`` current, binding its primary context to this thread, then restore.

    NOTES: unlike ``cupy.cuda.Device``, this calls cudaSetDevice even when the device is already
    current: a fresh thread has no current context until then, and driver calls (module loads,
    occupancy queries, cuLaunchKernel) fail with CUDA_ERROR_INVALID_CONTEXT without one.
    """
    runtime = cupy_module().cuda.runtime
    previous = runtime.getDevice()
    runtime.setDevice(device)
    try:
        yield
    finally:
        if previous != device:
            runtime.setDevice(previous)


def get_function(filename: str, name_expression: str, device: int):
    """Compile (or load from CuPy's cache) one instantiation and return it for ``device``.

    Memoised per (device, file, name expression); thread safe.
    """
    key = (device, filename, name_expression)
    function = _functions.get(key)
    if function is not None:
        return function
    cupy = cupy_module()
    with _lock:
        function = _functions.get(key)
        if function is None:
            with current_device(device):
                module = cupy.RawModule(
                    code=source_text(filename),
                    options=nvrtc_options(),
                    name_expressions=(name_expression,),
                )
                try:
                    function = module.get_function(name_expression)
                except cupy.cuda.compiler.CompileException as error:
                    raise CompileError(
                        f"NVRTC failed to compile {name_expression} from {filename}:\n"
                        f"{error.get_message()}"
                    ) from error
                except (ImportError, OSError, RuntimeError) as error:
                    _raise_if_nvrtc_missing(error)
                    raise
            _functions[key] = function
    return function


def preload(filename: str, name_expressions: list[str], device: int) -> None:
    """Compile many instantiations in one NVRTC call (far faster than one call each)."""
    cupy = cupy_module()
    missing = [e for e in name_expressions if (device, filename, e) not in _functions]
    if not missing:
        return
    with _lock, current_device(device):
        module = cupy.RawModule(
            code=source_text(filename), options=nvrtc_options(), name_expressions=tuple(missing)
        )
        try:
            for expression in missing:
                _functions[(device, filename, expression)] = module.get_function(expression)
        except cupy.cuda.compiler.CompileException as error:
            raise CompileError(
                f"NVRTC failed to compile {filename}:\n{error.get_message()}"
            ) from error


def compile_offline(
    filename: str, name_expressions: list[str], arch: str, report: list | None = None
) -> dict[str, str]:
    """Compile instantiations with NVRTC for ``arch`` (e.g. ``"sm_90"``) without a GPU.

    Returns the lowered (mangled) name of each expression; raises CompileError with the log.
    Given a ``report`` list, also asks ptxas for its resource usage (registers, spills) and
    appends the log lines to it.
    """
    from cupy_backends.cuda.libs import nvrtc

    program = nvrtc.createProgram(source_text(filename), filename, [], [])
    try:
        for expression in name_expressions:
            nvrtc.addNameExpression(program, expression)
        options = [*nvrtc_options(), *CUPY_ADDED_OPTIONS, f"-arch={arch}"]
        if report is not None:
            options.append("--ptxas-options=-v")
        try:
            nvrtc.compileProgram(program, options)
        except nvrtc.NVRTCError as error:
            raise CompileError(
                f"NVRTC failed to compile {filename} for {arch}:\n{nvrtc.getProgramLog(program)}"
            ) from error
        if not nvrtc.getCUBIN(program):
            raise CompileError(f"NVRTC produced no cubin for {arch}")
        if report is not None:
            report.extend(nvrtc.getProgramLog(program).splitlines())
        return {e: nvrtc.getLoweredName(program, e) for e in name_expressions}
    finally:
        nvrtc.destroyProgram(program)


def nvrtc_version() -> tuple[int, int]:
    from cupy_backends.cuda.libs import nvrtc

    return tuple(nvrtc.getVersion())
