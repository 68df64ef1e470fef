"""Find ``kernels/``, fingerprint it, compile with NVRTC, cache binaries on disk, load per device.

This module knows nothing about quantization: it turns (source file, template name expressions)
into loaded CuPy functions. Compiling needs no CUDA context: NVRTC is called directly for the
architecture a context-free driver query reports, and the binary is cached on disk under a key
of the source text (every file in ``kernels/`` fingerprinted), the options, the architecture and
the NVRTC version. Loading (``cupy.RawModule(path=...)``) happens on first use on each device.
``compile_offline`` is the same compile without the cache, which is how CI proves that every
instantiation compiles for sm_90, sm_100 and sm_120 on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
import warnings
from functools import cache
from pathlib import Path

from . import _settings

__all__ = [
    "CompileError",
    "GpuUnavailableError",
    "cache_dir",
    "compile_cached",
    "compile_offline",
    "compute_capability",
    "current_device",
    "device_count",
    "driver",
    "driver_error",
    "get_function",
    "kernel_dir",
    "nvrtc_options",
    "precompile",
    "preload",
    "register_header",
    "source_text",
]

log = logging.getLogger("fp8_group_quant")

KERNEL_DIR_ENV = _settings.KERNEL_DIR
CACHE_DIR_ENV = _settings.CACHE_DIR
KERNEL_SUFFIXES = (".cu", ".cuh")
# Options CuPy's RawModule adds on its own (cupy/cuda/compiler.py); we pass them too, so the
# binaries equal those CuPy compiled for earlier versions (and their measured speed).
CUPY_ADDED_OPTIONS = ("--device-as-default-execution-space", "-ftz=true")


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries the NVRTC log."""


class GpuUnavailableError(RuntimeError):
    """A GPU call was made but CuPy, NVRTC or a CUDA device is missing."""


def kernel_dir() -> Path:
    """Directory holding the ``.cu`` sources.

    ``$FP8_GROUP_QUANT_KERNEL_DIR`` if set (it must be a directory holding ``.cu`` sources:
    no silent fallback to the packaged ones); else ``fp8_group_quant/kernels`` inside an
    installed wheel; else ``kernels/`` beside the package in a source checkout or editable
    install.
    """
    override = _settings.kernel_dir_override()
    if override:
        path = Path(override)
        if not path.is_dir():
            raise FileNotFoundError(
                f"{KERNEL_DIR_ENV}={override}: not a directory"
                + (" (it is a file)" if path.exists() else " (it does not exist)")
            )
        if not any(path.glob("*.cu")):
            raise FileNotFoundError(f"{KERNEL_DIR_ENV}={override}: the directory holds no .cu file")
        return path
    package = Path(__file__).resolve().parent
    candidates = [package / "kernels", package.parent / "kernels"]
    for candidate in candidates:
        if candidate.is_dir() and any(candidate.glob("*.cu")):
            return candidate
    raise FileNotFoundError(
        f"no CUDA sources found; looked in {', '.join(str(c) for c in candidates)}"
    )


def _where(directory: Path) -> str:
    """How to name ``directory`` in an error: by the variable that chose it, if one did."""
    override = _settings.kernel_dir_override()
    return f"{KERNEL_DIR_ENV}={override}" if override else str(directory)


_generated: dict[str, str] = {}  # headers written by Python: name -> text


def register_header(name: str, text: str) -> None:
    """Serve ``text`` wherever a source includes ``"name"``, before ``kernels/`` is looked at.

    NOTES: how facts defined in Python (constants, argument structs) reach the kernels without
    Python ever reading C++; the text is part of the compiled source, so of the cache key.
    """
    if _generated.get(name, text) != text:
        raise ValueError(f"{name}: a different header of that name is registered already")
    _generated[name] = text


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
    """``filename`` with each quoted include replaced by the text of that file in ``directory``
    (once per file, as ``#pragma once`` would), numbered with ``#line`` marks; a quoted include
    missing from ``directory`` is an error."""
    lines = []
    if filename in _generated:
        return _generated[filename]
    path = directory / filename
    if not path.is_file():
        raise FileNotFoundError(f"{_where(directory)}: {filename} is missing")
    for number, line in enumerate(path.read_text().splitlines(), 1):
        include = _QUOTED_INCLUDE.fullmatch(line)
        if include:
            # NOTES: a quoted include must be ours: left to NVRTC it would be looked for in the
            # working directory, where a stray file of that name would be compiled instead
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
    """NVRTC options of every compile, but the architecture."""
    return ("--std=c++17", *CUPY_ADDED_OPTIONS)


_functions: dict[tuple[int, str, str], object] = {}
_modules: list = []  # loaded modules stay alive with the functions taken from them
_lock = threading.RLock()
_loading: dict[tuple[int, str, str], threading.Lock] = {}  # one lock per function being loaded


CUPY_CACHE_ENV = "CUPY_CACHE_DIR"


def _unusable_cupy_cache() -> str | None:
    """Why ``CUPY_CACHE_DIR`` would break ``import cupy`` (its path runs through a file), or
    None where it is unset or usable."""
    value = os.environ.get(CUPY_CACHE_ENV)
    if not value:
        return None
    path = Path(value).absolute()
    for part in (path, *path.parents):
        if part.exists():
            return None if part.is_dir() else f"{part} is a file"
    return None


def cupy_module():
    """``cupy``, or GpuUnavailableError saying how to install it.

    NOTES: ``import cupy`` creates ``CUPY_CACHE_DIR`` and fails, half imported, where that path
    runs through a file. Then CuPy is imported against a private directory, with one warning,
    and the variable is set back at once: the user's environment is not changed for the process.
    """
    if "cupy" not in sys.modules:
        problem = _unusable_cupy_cache()
        if problem is not None:
            return _import_cupy_with_private_cache(problem)
    try:
        import cupy
    except ImportError as error:  # pragma: no cover - depends on the machine
        raise GpuUnavailableError(_CUPY_HINT) from error
    return cupy


_CUPY_HINT = (
    "GPU arrays need CuPy and NVRTC: pip install 'fp8_group_quant[cuda12]' (or [cuda13] for "
    "CUDA 13)"
)


def _import_cupy_with_private_cache(problem: str):
    value = os.environ[CUPY_CACHE_ENV]
    private = tempfile.mkdtemp(prefix="fp8_group_quant-cupy-")
    os.environ[CUPY_CACHE_ENV] = private
    try:
        import cupy
    except ImportError as error:  # pragma: no cover - depends on the machine
        raise GpuUnavailableError(_CUPY_HINT) from error
    finally:
        os.environ[CUPY_CACHE_ENV] = value
    warnings.warn(
        f"fp8_group_quant: {CUPY_CACHE_ENV}={value} cannot be used ({problem}); CuPy's own "
        f"cache is {private} in this process (the variable is left as it is)",
        RuntimeWarning,
        stacklevel=3,
    )
    return cupy


NVRTC_HINT = (
    "NVRTC was not found: pip install 'fp8_group_quant[cuda12]' (nvidia-cuda-nvrtc-cu12 >= 12.8) "
    "or 'fp8_group_quant[cuda13]' (nvidia-cuda-nvrtc 13), or put a CUDA toolkit's libnvrtc on "
    "the library path"
)


def _raise_if_nvrtc_missing(error: BaseException) -> None:
    if "nvrtc" in str(error).lower():
        raise GpuUnavailableError(f"{NVRTC_HINT} ({error})") from error


# devices, without a CUDA context ----------------------------------------------------------------

# cudaDevAttrComputeCapabilityMajor / Minor (the runtime's numbers; CuPy names neither)
_RUNTIME_CAPABILITY_MAJOR, _RUNTIME_CAPABILITY_MINOR = 75, 76


@cache
def driver():
    """NVIDIA's driver bindings (``cuda.bindings.driver``, the ``cuda12`` / ``cuda13`` extras),
    initialised, or None where they or a usable driver are missing.

    NOTES: cuInit, cuDeviceGetCount and cuDeviceGetAttribute create no context and select no
    device, unlike the runtime calls CuPy makes to compile: importing the package must not
    allocate on GPU 0 in a serving worker that has not chosen its device yet. Without a driver
    library the bindings raise RuntimeError (cuda-pathfinder's DynamicLibNotFoundError).
    """
    try:
        from cuda.bindings import driver as bindings
    except ImportError:
        return None
    try:
        (status,) = bindings.cuInit(0)
    except RuntimeError:
        return None
    return None if status else bindings


def _runtime():
    """CuPy's runtime module, or None without CuPy: the device queries where the bindings are
    missing (cudaGetDeviceCount and cudaDeviceGetAttribute create no context either)."""
    try:
        return cupy_module().cuda.runtime
    except GpuUnavailableError:
        return None


def device_count() -> int:
    """CUDA devices visible to this process (0 without a driver); creates no context."""
    bindings = driver()
    if bindings is not None:
        status, count = bindings.cuDeviceGetCount()
        return 0 if status else count
    runtime = _runtime()
    if runtime is None:
        return 0
    try:
        return runtime.getDeviceCount()
    except runtime.CUDARuntimeError:  # no driver, or one older than CuPy's runtime
        return 0


def compute_capability(device: int) -> tuple[int, int]:
    """(major, minor) of ``device``; creates no context."""
    bindings = driver()
    if bindings is None:
        runtime = _runtime()
        if runtime is None or not device_count():
            raise GpuUnavailableError(
                "no CUDA driver: the CUDA kernels need an NVIDIA GPU and driver"
            )
        return (runtime.deviceGetAttribute(_RUNTIME_CAPABILITY_MAJOR, device),
                runtime.deviceGetAttribute(_RUNTIME_CAPABILITY_MINOR, device))  # fmt: skip
    status, handle = bindings.cuDeviceGet(device)
    named = bindings.CUdevice_attribute
    major = minor = 0
    if not status:
        status, major = bindings.cuDeviceGetAttribute(
            named.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, handle
        )
    if not status:
        status, minor = bindings.cuDeviceGetAttribute(
            named.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, handle
        )
    if status:
        raise GpuUnavailableError(
            f"device {device}: the CUDA driver answered {driver_error(status)}"
        )
    return major, minor


def driver_error(status) -> str:
    """The name of a CUresult, e.g. CUDA_ERROR_INVALID_VALUE."""
    bindings = driver()
    if bindings is not None:
        found, name = bindings.cuGetErrorName(int(status))
        if not found and name:
            return name.decode()
    return f"CUresult {int(status)}"


def _nvrtc():
    cupy_module()  # CuPy whole before cupy_backends: importing that first can half-import cupy
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError as error:
        cupy_module()  # the install hint when CuPy itself is missing
        _raise_if_nvrtc_missing(error)
        raise
    return nvrtc


def target_for(capability: tuple[int, int]) -> str:
    """The NVRTC target of a device: ``sm_XY`` when NVRTC knows it, else PTX of the newest
    architecture it knows (``compute_XY``), which the driver compiles for the device."""
    wanted = capability[0] * 10 + capability[1]
    try:
        supported = [int(a) for a in _nvrtc().getSupportedArchs()]
    except (ImportError, OSError, RuntimeError) as error:
        _raise_if_nvrtc_missing(error)
        raise
    if wanted in supported:
        return f"sm_{wanted}"
    older = [a for a in supported if a <= wanted]
    if not older:
        raise CompileError(f"NVRTC supports none of the architectures up to sm_{wanted}")
    return f"compute_{max(older)}"


# compiling ----------------------------------------------------------------------------------------


def _nvrtc_compile(filename: str, name_expressions, target: str, extra=()):
    """(binary, lowered names, log) of ``name_expressions`` from ``filename`` for ``target``."""
    nvrtc = _nvrtc()
    try:
        program = nvrtc.createProgram(source_text(filename), filename, [], [])
    except (OSError, RuntimeError) as error:
        _raise_if_nvrtc_missing(error)
        raise
    try:
        for expression in name_expressions:
            nvrtc.addNameExpression(program, expression)
        try:
            nvrtc.compileProgram(program, [*nvrtc_options(), f"-arch={target}", *extra])
        except nvrtc.NVRTCError as error:
            raise CompileError(
                f"NVRTC failed to compile {filename} for {target}:\n{nvrtc.getProgramLog(program)}"
            ) from error
        ptx = target.startswith("compute_")
        binary = nvrtc.getPTX(program) if ptx else nvrtc.getCUBIN(program)
        if not binary:
            raise CompileError(f"NVRTC produced no {'PTX' if ptx else 'cubin'} for {target}")
        lowered = {e: nvrtc.getLoweredName(program, e) for e in name_expressions}
        return binary, lowered, nvrtc.getProgramLog(program)
    finally:
        nvrtc.destroyProgram(program)


def cache_dir() -> Path:
    """``$FP8_GROUP_QUANT_CACHE_DIR``, else ``$XDG_CACHE_HOME/fp8_group_quant``, else
    ``~/.cache/fp8_group_quant``."""
    return _settings.cache_dir()


_compiling: dict[str, threading.Lock] = {}  # one lock per cache key: single-flight compiles
_compiling_lock = threading.Lock()
_fallback_dir: Path | None = None  # a private directory when the cache directory is unusable


def compile_cached(filename: str, name_expressions, target: str) -> tuple[Path, dict[str, str]]:
    """(path of the binary, lowered name of each expression), compiled once per key.

    The key hashes the source text (which carries the fingerprint of every file in
    ``kernels/``), the options, the target, the expressions and the NVRTC version. Files are
    written to a temporary name and renamed, so concurrent processes never read half a binary.
    Threads asking for the same key at once compile it once (the others wait for that
    compile); different keys compile concurrently.
    """
    name_expressions = tuple(name_expressions)
    key = hashlib.sha256(
        json.dumps(
            [source_text(filename), nvrtc_options(), target, name_expressions, nvrtc_version()]
        ).encode()
    ).hexdigest()[:32]
    stem = f"{Path(filename).stem}-{target}-{key}"
    suffix = ".ptx" if target.startswith("compute_") else ".cubin"
    with _compiling_lock:
        lock = _compiling.setdefault(key, threading.Lock())
    with lock:
        for directory in dict.fromkeys((cache_dir(), _fallback_dir)):
            if directory is not None:
                found = _read_cached(directory / (stem + suffix), directory / (stem + ".json"))
                if found is not None and set(found[1]) == set(name_expressions):
                    return found
        started = time.perf_counter()
        binary, lowered, _ = _nvrtc_compile(filename, name_expressions, target)
        log.info(
            "fp8_group_quant: compiled %d kernel(s) of %s for %s with NVRTC in %.2f s",
            len(name_expressions), filename, target, time.perf_counter() - started,
        )  # fmt: skip
        data = binary if isinstance(binary, bytes) else binary.encode()
        directory = _writable_cache_dir()
        _write_atomically(directory / (stem + suffix), data)
        _write_atomically(directory / (stem + ".json"), json.dumps(lowered).encode())
        return directory / (stem + suffix), lowered


def _read_cached(binary_path: Path, names_path: Path):
    try:
        lowered = json.loads(names_path.read_text())
    except (OSError, ValueError):
        return None
    return (binary_path, lowered) if binary_path.is_file() else None


def _writable_cache_dir() -> Path:
    """The cache directory, created if needed; if it cannot be, a private temporary directory
    for this process, with one warning naming the variable.

    NOTES: a cache directory that is a file, or that cannot be created or written, must not
    stop the quantizer: compiling costs a second per kernel, failing costs the call.
    """
    global _fallback_dir
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if os.access(directory, os.W_OK | os.X_OK):
            return directory
        problem = "is not writable"
    except OSError as error:
        problem = f"cannot be created ({error.strerror or error})"
    with _compiling_lock:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="fp8_group_quant-"))
            named = CACHE_DIR_ENV if _settings.cache_dir_chosen() else "the default cache"
            warnings.warn(
                f"fp8_group_quant: kernel cache directory {directory} ({named}) {problem}; "
                f"compiling into {_fallback_dir} for this process only",
                RuntimeWarning,
                stacklevel=3,
            )
    return _fallback_dir


def _write_atomically(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def precompile(filename: str, name_expressions) -> dict[str, BaseException]:
    """Compile ``name_expressions`` for every architecture among the visible devices into the
    disk cache, creating no CUDA context. Returns the failures by target, each also logged with
    its NVRTC log; the first call that needs the kernel raises it again."""
    failures: dict[str, BaseException] = {}
    targets = set()
    for device in range(device_count()):
        try:
            targets.add(target_for(compute_capability(device)))
        except Exception as error:  # the driver or NVRTC is unusable: say so, do not hide it
            failures[f"device {device}"] = error
    for target in sorted(targets):
        try:
            compile_cached(filename, name_expressions, target)
        except Exception as error:
            failures[target] = error
    for where, failure in failures.items():
        log.warning("fp8_group_quant: could not compile %s for %s: %s", filename, where, failure)
    return failures


# loading, once per device -------------------------------------------------------------------------


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


def _load(filename: str, name_expressions, device: int) -> None:
    """Compile (or take from the disk cache) and load ``name_expressions`` on ``device``."""
    cupy = cupy_module()
    path, lowered = compile_cached(
        filename, name_expressions, target_for(compute_capability(device))
    )
    with current_device(device):
        module = cupy.RawModule(path=str(path))
        for expression in name_expressions:
            function = module.get_function(lowered[expression])
            _ = function.kernel  # load the module on this device now, not at the first launch
            with _lock:
                _functions[(device, filename, expression)] = function
        with _lock:
            _modules.append(module)


def get_function(filename: str, name_expression: str, device: int):
    """One instantiation as a CuPy ``RawKernel`` loaded on ``device``.

    Memoised per (device, file, name expression); thread safe: sixteen threads asking at once
    compile and load it once.
    """
    key = (device, filename, name_expression)
    function = _functions.get(key)
    if function is None:
        with _compiling_lock:
            lock = _loading.setdefault(key, threading.Lock())
        with lock:  # one thread compiles and loads this key; other keys go on in parallel
            if key not in _functions:
                _load(filename, (name_expression,), device)
            function = _functions[key]
    return function


PRELOAD_CHUNK = 96  # instantiations per NVRTC program when many are asked for at once


def preload_chunks(name_expressions) -> list[list[str]]:
    """``name_expressions`` (duplicates dropped, order kept) in runs of PRELOAD_CHUNK: the NVRTC
    programs that preload compiles and caches, the same whichever of them are loaded already,
    so separate processes can fill the disk cache with them in parallel."""
    expressions = list(dict.fromkeys(name_expressions))
    return [expressions[i : i + PRELOAD_CHUNK] for i in range(0, len(expressions), PRELOAD_CHUNK)]


def preload(filename: str, name_expressions, device: int) -> None:
    """Compile many instantiations in few NVRTC calls (far faster than one call each) and load
    them on ``device``: each chunk of preload_chunks() that holds one not loaded yet."""
    for chunk in preload_chunks(name_expressions):
        with _lock:
            if all((device, filename, e) in _functions for e in chunk):
                continue
            _load(filename, chunk, device)


def compile_offline(
    filename: str, name_expressions: list[str], arch: str, report: list | None = None
) -> dict[str, str]:
    """Compile instantiations with NVRTC for ``arch`` (e.g. ``"sm_90"``) without a GPU or the
    cache.

    Returns the lowered (mangled) name of each expression; raises CompileError with the log.
    Given a ``report`` list, also asks ptxas for its resource usage (registers, spills) and
    appends the log lines to it.
    """
    extra = ("--ptxas-options=-v",) if report is not None else ()
    _, lowered, log_text = _nvrtc_compile(filename, name_expressions, arch, extra)
    if report is not None:
        report.extend(log_text.splitlines())
    return lowered


def nvrtc_version() -> tuple[int, int]:
    return tuple(_nvrtc().getVersion())
