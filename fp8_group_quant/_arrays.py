"""Turn numpy / cupy / torch arrays into (pointer, shape, strides, dtype, device) and back.

Nothing here converts through DLPack on the hot path: torch tensors are read through
``data_ptr()``, shape and strides, and outputs are allocated by the caller's own library.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

NUMPY = "numpy"
CUPY = "cupy"
TORCH = "torch"

# dtype names as this library spells them, per library's own dtype objects
_TORCH_NAMES = {
    "torch.bfloat16": "bfloat16",
    "torch.float16": "float16",
    "torch.float32": "float32",
    "torch.float8_e4m3fn": "float8_e4m3fn",
    "torch.float8_e5m2": "float8_e5m2",
    "torch.uint8": "uint8",
    "torch.int8": "int8",
    "torch.int32": "int32",
}


@dataclass(frozen=True)
class ArrayInfo:
    kind: str  # NUMPY, CUPY or TORCH
    obj: object
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: str
    itemsize: int
    device: int | None  # CUDA ordinal; None on the host


def _torch():
    return sys.modules.get("torch")


def describe(array, name: str) -> ArrayInfo:
    """Read what the launch layer needs from ``array``; ``name`` is used in errors."""
    torch = _torch()
    if torch is not None and isinstance(array, torch.Tensor):
        dtype = _TORCH_NAMES.get(str(array.dtype), str(array.dtype))
        if array.device.type != "cuda":
            raise TypeError(
                f"{name}: torch tensors must be on a CUDA device, got device {array.device}"
                " (pass a numpy array for the CPU backend)"
            )
        return ArrayInfo(
            TORCH,
            array,
            array.data_ptr(),
            tuple(array.shape),
            tuple(array.stride()),
            dtype,
            array.element_size(),
            array.device.index,
        )
    if isinstance(array, np.ndarray):
        itemsize = array.itemsize
        strides = tuple(s // itemsize for s in array.strides)
        if any(s % itemsize for s in array.strides):
            raise ValueError(f"{name}: strides must be multiples of the item size")
        return ArrayInfo(
            NUMPY, array, array.ctypes.data, array.shape, strides, array.dtype.name, itemsize, None
        )
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(array, cupy.ndarray):
        itemsize = array.itemsize
        if any(s % itemsize for s in array.strides):
            raise ValueError(f"{name}: strides must be multiples of the item size")
        return ArrayInfo(
            CUPY,
            array,
            array.data.ptr,
            array.shape,
            tuple(s // itemsize for s in array.strides),
            array.dtype.name,
            itemsize,
            array.device.id,
        )
    raise TypeError(
        f"{name}: expected a numpy array, a cupy array or a torch CUDA tensor, "
        f"got {type(array).__module__}.{type(array).__name__}"
    )


def available_bytes(info: ArrayInfo) -> int | None:
    """Bytes of the underlying allocation from ``info.ptr`` on, or None if unknown."""
    if info.kind == TORCH:
        tensor = info.obj
        return tensor.untyped_storage().nbytes() - tensor.storage_offset() * info.itemsize
    if info.kind == CUPY:
        memory = info.obj.data.mem
        return memory.size - (info.ptr - memory.ptr) if memory.size else None
    root = info.obj
    while isinstance(root.base, np.ndarray):
        root = root.base
    if not root.flags.c_contiguous:
        return None
    return root.ctypes.data + root.nbytes - info.ptr


# allocation in the caller's library --------------------------------------------------------------


def _torch_dtype(name: str):
    return getattr(_torch(), name)


def empty_strided(kind: str, device: int | None, shape, strides, storage: int, dtype: str):
    """A ``shape``/``strides`` view over a fresh flat buffer of ``storage`` elements.

    ``dtype`` is this library's name ("float8_e4m3fn", "uint8", "int32", ...); cupy has no
    float8 type, so float8 outputs are uint8 there.
    """
    if kind == TORCH:
        torch = _torch()
        buffer = torch.empty(
            storage, dtype=_torch_dtype(dtype), device=torch.device("cuda", device)
        )
        return buffer.as_strided(shape, strides)
    if kind == CUPY:
        import cupy

        np_dtype = np.dtype("uint8" if dtype.startswith("float8") else dtype)
        with cupy.cuda.Device(device):
            buffer = cupy.empty(storage, dtype=np_dtype)
        itemsize = np_dtype.itemsize
        return cupy.lib.stride_tricks.as_strided(
            buffer, shape, tuple(s * itemsize for s in strides)
        )
    raise ValueError(f"no device allocation for {kind} arrays")


def current_stream(info: ArrayInfo):
    """The stream the caller's library would use now, as a CuPy stream object (None = CuPy's)."""
    if info.kind == TORCH:
        return _external_stream(_torch().cuda.current_stream(info.device).cuda_stream, info.device)
    return None


_streams: dict[tuple[int, int], object] = {}


def _external_stream(handle: int, device: int):
    key = (handle, device)
    stream = _streams.get(key)
    if stream is None:
        import warnings

        import cupy

        with warnings.catch_warnings():  # CuPy 14 deprecates it; older CuPy lacks the new API
            warnings.simplefilter("ignore", DeprecationWarning)
            stream = cupy.cuda.ExternalStream(handle, device)
        _streams[key] = stream
    return stream
