"""The backends a test runs on: the NumPy backend ("numpy") and the GPU through either of its
array libraries ("cupy", "torch"). Moving data to and from each, outputs over poisoned storage
in each, the plain path's check against the NumPy reference, and the kernel preload that GPU
tests share.

A test parametrised over ``backend`` with ``NUMPY_AND_GPU`` (or ``backends(...)``) runs on the
NumPy backend everywhere and on the GPU where conftest sees a device: the GPU params carry the
``gpu`` marker.
"""

from __future__ import annotations

import functools
import itertools

import ml_dtypes
import numpy as np
import pytest
from helpers import (
    PLAIN_PATHS,
    Q_POISON,
    SCALE_POISON,
    assert_same_bytes,
    force_path,
    host_poisoned,
    reference_storage,
)

import fp8_group_quant as fgq
from fp8_group_quant import _jit, _plan
from fp8_group_quant._layout import Geometry, supported_combinations
from fp8_group_quant._spec import GROUP_SIZES, INPUT_TYPES, OUTPUT_FORMATS

GPU_LIBS = ("cupy", "torch")


def backends(*names: str) -> list:
    """pytest params for a ``backend`` argument: "numpy" as is, "cupy" and "torch" (the GPU)
    with the ``gpu`` marker and ids gpu-cupy, gpu-torch."""
    return [
        pytest.param(n, marks=pytest.mark.gpu, id=f"gpu-{n}") if n in GPU_LIBS else n for n in names
    ]


NUMPY_AND_GPU = backends("numpy", "cupy", "torch")
# the host backends (NumPy, and torch CPU tensors through it) and the GPU from both libraries
HOST_AND_GPU = backends("numpy", "torch_cpu", "cupy", "torch")

# every row of every registry: a new format or layout is tested here without a new line
COMBINATIONS = [
    (i, g, *combination)
    for i, g in itertools.product(INPUT_TYPES, GROUP_SIZES)
    for combination in supported_combinations()
]


@functools.cache
def _every_instantiation() -> tuple[str, ...]:
    return tuple(_plan.all_name_expressions())


@pytest.fixture(autouse=True)
def compiled_kernels(request):
    """A GPU test finds every instantiation compiled and loaded: the first one of a process
    compiles them in few NVRTC calls (much faster than one call per test), the others find
    them loaded. Import it into a test module to use it there; CPU tests are left alone."""
    if request.node.get_closest_marker("gpu") is None:
        return
    import cupy

    _jit.preload(_plan.SOURCE, _every_instantiation(), cupy.cuda.runtime.getDevice())


@pytest.fixture(params=list(PLAIN_PATHS), name="kernel_path")  # the plain path's two kernels
def plain_kernel_path(request):
    """Both kernel paths of plain input, each forced (helpers.PLAIN_PATHS), with a fresh plan
    cache. Import it into a test module (it is named there ``kernel_path``) to use it."""
    with force_path(**PLAIN_PATHS[request.param]):
        yield request.param


# moving data between the host and each library ---------------------------------------------------


def gpu_only_past_one_input(backend: str, input_dtype: str) -> None:
    """Skip the NumPy backend for every input type but bfloat16, in tests of GPU paths the
    NumPy backend does not have (one input type there checks the test itself)."""
    if backend == "numpy" and input_dtype != "bfloat16":
        pytest.skip("the NumPy backend has no such path: one input type checks the test")


def array_module(lib: str):
    """The array module of ``lib`` for tests written once for numpy and cupy."""
    if lib == "numpy":
        return np
    import cupy

    return cupy


def poisoned_bytes(n: int, poison: int, lib: str):
    """``n`` bytes of ``lib`` (numpy, torch_cpu, cupy, torch), each set to ``poison``."""
    if lib == "numpy":
        return np.full(n, poison, np.uint8)
    if lib == "cupy":
        import cupy

        return cupy.full(n, poison, cupy.uint8)
    torch = pytest.importorskip("torch")
    device = "cpu" if lib == "torch_cpu" else "cuda"
    return torch.full((n,), poison, dtype=torch.uint8, device=device)


def strided_view(buffer, dtype: str, shape, strides, lib: str):
    """A ``shape`` / ``strides`` (elements) view of ``dtype`` over the bytes ``buffer`` (a 1-D
    uint8 array of ``lib``) from its first byte; cupy holds float8 in its uint8 container."""
    if lib in ("numpy", "cupy"):
        xp = array_module(lib)
        size = np.dtype(dtype).itemsize if lib == "cupy" or dtype[:6] != "float8" else 1
        raw = buffer.view(xp.dtype(f"u{size}"))
        view = _sliced_view(raw, tuple(shape), tuple(strides)) if lib == "cupy" else None
        if view is None:
            view = xp.lib.stride_tricks.as_strided(raw, tuple(shape), [s * size for s in strides])
        if lib == "cupy" and dtype.startswith("float8"):
            return view
        return view.view(getattr(ml_dtypes, dtype) if dtype.startswith("float8") else dtype)
    import torch

    return buffer.view(getattr(torch, dtype)).as_strided(tuple(shape), tuple(strides))


def _sliced_view(raw, shape: tuple, strides: tuple):
    """``shape`` / ``strides`` over the 1-D ``raw`` by reshape, transpose and slicing, so that
    the view's chain of bases reaches ``raw`` as a user's would (CuPy's ``as_strided`` keeps no
    base, and the library then bounds the view by its own extent); None where the strides are
    not a padded dense layout."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    if not dims:
        return raw[:1].reshape(shape) if raw.size and all(shape) else None
    dims.sort(key=lambda d: strides[d])
    if strides[dims[0]] < 1:
        return None
    # fastest first: a hidden axis of the smallest stride (element 0 of it is taken), then each
    # dimension's padded extent
    extents = [strides[dims[0]]]
    for inner, outer in zip(dims, dims[1:]):
        if strides[outer] % strides[inner] or strides[outer] // strides[inner] < shape[inner]:
            return None
        extents.append(strides[outer] // strides[inner])
    extents.append(shape[dims[-1]])
    total = int(np.prod(extents))
    if total > raw.size:
        return None
    dense = raw[:total].reshape(tuple(reversed(extents)))  # slowest first; the hidden axis last
    kept = sorted(dims)  # the view's non-unit dimensions in order, each an axis of dense
    view = dense.transpose(tuple(len(dims) - 1 - dims.index(d) for d in kept) + (len(dims),))
    view = view[tuple(slice(0, shape[d]) for d in kept) + (0,)]
    for d in range(len(shape)):
        if shape[d] == 1:
            view = view[(slice(None),) * d + (None,)]
    return view


def to_device(x: np.ndarray, lib: str):
    """``x`` in ``lib``: a copy on the GPU, or a copy on the host for the NumPy backend."""
    if lib == "numpy":
        return x.copy()
    if lib == "cupy":
        import cupy

        if x.dtype.name.startswith("float8"):  # ml_dtypes' float8: cupy holds it as uint8
            x = x.view(np.uint8)
        return cupy.asarray(x)
    torch = pytest.importorskip("torch")
    device = "cpu" if lib == "torch_cpu" else "cuda"
    if x.dtype.name == "bfloat16" or x.dtype.name.startswith("float8"):  # ml_dtypes' types
        carrier = np.int16 if x.itemsize == 2 else np.uint8
        tensor = torch.from_numpy(x.view(carrier).copy()).view(getattr(torch, x.dtype.name))
        return tensor.to(device)
    return torch.from_numpy(x.copy()).to(device)


def e4m3_dtype(lib: str):
    """The dtype of e4m3 codes in ``lib`` (cupy: its uint8 container)."""
    if lib == "numpy":
        return ml_dtypes.float8_e4m3fn
    if lib == "cupy":
        return np.uint8
    import torch

    return torch.float8_e4m3fn


def to_host_bytes(array) -> np.ndarray:
    """The bytes of ``array`` (numpy, cupy or torch) in its logical order."""
    if type(array).__module__.startswith("torch"):
        import torch

        dense = array.clone(memory_format=torch.contiguous_format).reshape(array.shape or (1,))
        return dense.view(torch.uint8).cpu().numpy()  # numpy's view: the last axis in bytes
    if isinstance(array, np.ndarray):
        return np.ascontiguousarray(array).view(np.uint8)
    return np.ascontiguousarray(array.get()).view(np.uint8)


def to_host(array) -> np.ndarray:
    """``array`` (numpy, cupy or torch) as a numpy array of the same values (torch's bfloat16
    as ml_dtypes' bfloat16)."""
    if isinstance(array, np.ndarray):
        return array
    if type(array).__module__.startswith("torch"):
        import torch

        if array.dtype == torch.bfloat16:
            return array.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
        return array.cpu().numpy()
    return array.get()


def wider_rows(x: np.ndarray, extra: int, lib: str, offset: int):
    """``x`` as a view into a buffer of ``lib`` whose rows are ``extra`` elements wider."""
    shape = x.shape[:-1] + (x.shape[-1] + extra,)
    wide = np.zeros(shape, x.dtype)
    wide[..., offset : offset + x.shape[-1]] = x
    return to_device(wide, lib)[..., offset : offset + x.shape[-1]]


def allocation_of_exactly(n: int, dtype, lib: str):
    """``n`` items of ``dtype`` (numpy or cupy) that end where their allocation ends: cupy's pool
    rounds blocks up to 512 bytes, so the array is the tail of a block of exactly 512."""
    if lib == "numpy":
        return np.empty(n, dtype)
    import cupy

    nbytes = n * np.dtype(dtype).itemsize
    assert nbytes <= 512
    block = cupy.cuda.alloc(512)  # one pool block of exactly 512 bytes
    return cupy.ndarray((n,), dtype, block + (512 - nbytes))


def poisoned_outputs(
    geometry: Geometry, lib: str, fmt: str, q_poison=Q_POISON, s_poison=SCALE_POISON
):
    """(q view, scale view, q storage, scale storage): views in the layout over poisoned storage."""
    if lib == "numpy":
        return host_poisoned(geometry, fmt, q_poison, s_poison)
    fmt = OUTPUT_FORMATS[fmt]
    if lib == "cupy":
        import cupy

        q_buf = cupy.full(geometry.q_storage, q_poison, cupy.uint8)
        s_buf = cupy.full(geometry.scale_storage_bytes, s_poison, cupy.uint8)
        s_buf = s_buf.view(geometry.layout.dtype)
        q_view = q_buf.view(fmt.container)

        def strided(buffer, shape, strides):
            return cupy.lib.stride_tricks.as_strided(
                buffer, shape, tuple(s * buffer.itemsize for s in strides)
            )

    else:
        import torch

        q_buf = torch.full((geometry.q_storage,), q_poison, dtype=torch.uint8, device="cuda")
        s_buf = torch.full(
            (geometry.scale_storage_bytes,), s_poison, dtype=torch.uint8, device="cuda"
        )
        s_buf = s_buf.view(getattr(torch, geometry.layout.dtype))
        q_view = q_buf.view(getattr(torch, fmt.dtype_name))

        def strided(buffer, shape, strides):
            return buffer.as_strided(shape, strides)

    q = strided(q_view, geometry.shape, geometry.q_strides)
    s = strided(s_buf, geometry.scale_shape, geometry.scale_strides)
    return q, s, q_buf, s_buf


def check(x_host, x_device, lib, group_size, dtype, scale, layout, pad_rows=False, eps=1e-10,
          scale_rule="rceil"):  # fmt: skip
    """Run ``lib``'s backend into poisoned outputs; compare every storage byte with the
    reference, then the plain call (outputs allocated by the library) with the same values."""
    geometry = Geometry(tuple(x_host.shape), group_size, layout, pad_rows)
    q, s, q_buf, s_buf = poisoned_outputs(geometry, lib, dtype)
    q_got, s_got = fgq.quantize(
        x_device, group_size, dtype=dtype, scale=scale, layout=layout, eps=eps,
        out=q, scale_out=s, pad_rows=pad_rows, scale_rule=scale_rule,
    )  # fmt: skip
    assert q_got is q and s_got is s
    q_ref, s_ref = reference_storage(x_host, geometry, dtype, scale, eps, scale_rule)
    what = f"{lib} {x_host.dtype} G={group_size} {dtype} {scale} {layout} shape={x_host.shape}"
    assert_same_bytes(to_host_bytes(q_buf), q_ref, f"q ({what})", inputs=x_host)
    assert_same_bytes(to_host_bytes(s_buf), s_ref, f"scales ({what})")

    # the plain call (library-allocated outputs) returns the same values
    q2, s2 = fgq.quantize(x_device, group_size, dtype=dtype, scale=scale, layout=layout, eps=eps,
                          scale_rule=scale_rule)  # fmt: skip
    assert tuple(q2.shape) == geometry.shape and tuple(s2.shape) == geometry.scale_shape
    rows = q_ref.reshape(geometry.batches, geometry.q_rows, geometry.k)[:, : geometry.rows]
    assert_same_bytes(to_host_bytes(q2), rows, f"q, allocated ({what})")
    assert_same_bytes(to_host_bytes(s2), to_host_bytes(s), f"scales, allocated ({what})")


def spec_itemsize(spec) -> int:
    """Bytes an element of an ``OutputSpec`` (float32 and int32 scales; one-byte codes)."""
    return 4 if spec.dtype in ("float32", "int32") else 1


def poisoned_spec(spec, lib: str, poison: int):
    """(view, storage bytes): a view with ``spec``'s shape and strides (an ``OutputSpec`` of
    fp8_group_quant._outputs) over ``spec.storage`` poisoned elements of ``lib``."""
    buffer = poisoned_bytes(spec.storage * spec_itemsize(spec), poison, lib)
    return strided_view(buffer, spec.dtype, spec.shape, spec.strides, lib), buffer


def assert_allocated(results, expected: tuple, what: str) -> None:
    """The outputs of a call that allocated them hold ``expected`` bytes (logical order),
    one entry per output."""
    assert len(results) == len(expected), f"{what}: {len(results)} outputs"
    for i, (got, want) in enumerate(zip(results, expected)):
        assert_same_bytes(to_host_bytes(got), want, f"output {i}, allocated ({what})")
