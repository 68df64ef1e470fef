"""Turn numpy / cupy / torch arrays into (pointer, shape, strides, dtype, device) and back.

Nothing here converts through DLPack on the hot path: torch tensors are read through
``data_ptr()``, shape and strides, and outputs are allocated by the caller's own library.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

NUMPY = "numpy"
CUPY = "cupy"
TORCH = "torch"


@dataclass(frozen=True)
class ArrayInfo:
    kind: str  # NUMPY, CUPY or TORCH
    obj: Any  # the caller's array (numpy, cupy or torch)
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
        dtype = str(array.dtype).removeprefix("torch.")  # torch.bfloat16 -> bfloat16
        if array.device.type != "cuda":  # CPU tensors go through numpy views before this
            raise TypeError(
                f"{name}: expected a CUDA tensor like the call's other arrays, got one on device "
                f"{array.device} (a call's arrays all live on one device)"
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
        strides = _element_strides(array.strides, itemsize, name)
        return ArrayInfo(NUMPY, array, array.ctypes.data, array.shape, strides,
                         dtype_name(array.dtype), itemsize, None)  # fmt: skip
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(array, cupy.ndarray):
        itemsize, data = array.itemsize, array.data
        strides = _element_strides(array.strides, itemsize, name)
        # NOTES: the pointer's device_id is a plain read; array.device builds a Device
        return ArrayInfo(CUPY, array, data.ptr, array.shape, strides, dtype_name(array.dtype),
                         itemsize, data.device_id)  # fmt: skip
    hint = ""
    if isinstance(array, (list, tuple, int, float)):
        dtype = ", numpy.float32" if name == "x" else ""
        hint = f": make it an array first, e.g. numpy.asarray({name}{dtype})"
    raise TypeError(
        f"{name}: expected a numpy array, a torch tensor (CPU or CUDA) or a cupy array, "
        f"got {kind_of(array)}{hint}"
    )


def _element_strides(byte_strides, itemsize: int, name: str) -> tuple[int, ...]:
    """Strides in elements; ValueError naming the array where one is not a whole element."""
    strides = tuple([s // itemsize for s in byte_strides])
    if [s for s in byte_strides if s % itemsize]:
        raise ValueError(f"{name}: strides must be multiples of the item size")
    return strides


_dtype_names: dict = {}
MAX_DTYPE_NAMES = 256  # dtypes whose names are remembered; a program uses a handful


def dtype_name(dtype) -> str:
    """``dtype.name`` of a numpy dtype, remembered.

    NOTES: numpy computes the name in Python at each read (0.5-1.7 us on the CI host, float16
    and float32 the slowest), more than the rest of a description together.
    """
    name = _dtype_names.get(dtype)
    if name is None:
        name = dtype.name
        if len(_dtype_names) < MAX_DTYPE_NAMES:
            _dtype_names[dtype] = name
    return name


def library_of(array) -> str:
    """The top-level module of ``array``'s type: "numpy", "torch", "cupy", "jax", ..."""
    return type(array).__module__.split(".")[0]


def kind_of(array) -> str:
    """The library, type and (torch) device of ``array``, for messages."""
    device = getattr(array, "device", None)
    where = f" on device {device}" if type(array).__module__.startswith("torch") else ""
    return f"{type(array).__module__}.{type(array).__name__}{where}"


def check_companion(
    info: ArrayInfo, other: ArrayInfo, name: str, leader: str = "x", what: str = "expected an array"
) -> None:
    """``other``, the argument ``name``, must be of the library of ``info`` (the argument
    ``leader``; else a TypeError) and on its device (else a ValueError)."""
    if other.kind != info.kind:
        raise TypeError(
            f"{name}: {what} of {leader}'s library ({info.kind}), got {kind_of(other.obj)}"
        )
    if other.device != info.device:
        raise ValueError(
            f"{name}: {what} on {leader}'s device ({info.kind} device {info.device}), got "
            f"device {other.device}"
        )


def is_torch_cpu(array) -> bool:
    torch = _torch()
    return torch is not None and isinstance(array, torch.Tensor) and array.device.type == "cpu"


def torch_cpu_to_numpy(tensor, name: str) -> np.ndarray:
    """A numpy view of a torch CPU tensor's memory, in the numpy dtype of its torch dtype
    (``bfloat16`` and the float8 types through ml_dtypes, which torch's ``.numpy()`` lacks).

    NOTES: the view is made over the tensor's whole storage, so that the root of its chain of
    views is the allocation and the checks of a caller's output see the bytes the storage
    holds. A tensor that requires grad is read as it is on the GPU: no gradient flows
    through quantization on any backend.
    """
    import ml_dtypes

    torch = _torch()
    dtype = str(tensor.dtype).removeprefix("torch.")
    special = {
        name: getattr(ml_dtypes, name)
        for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz")
    }
    try:  # the others: the dtype torch's own .numpy() gives, from an empty tensor
        if dtype in special:
            np_dtype = np.dtype(special[dtype])
        else:
            np_dtype = torch.empty(0, dtype=tensor.dtype).numpy().dtype
    except (TypeError, RuntimeError) as error:
        raise TypeError(
            f"{name}: expected a torch tensor of a dtype numpy can hold, got dtype {dtype}"
        ) from error
    tensor = tensor.detach()
    whole = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage()).numpy()
    size = np_dtype.itemsize
    start = tensor.storage_offset() * size
    flat = whole[start : start + max(0, whole.size - start) // size * size]
    raw = flat.view(f"V{size}")  # as_strided cannot rebuild ml_dtypes' types
    strides = tuple(s * size for s in tensor.stride())
    view = np.lib.stride_tricks.as_strided(raw, tuple(tensor.shape), strides)
    return view.view(np_dtype)


def numpy_to_torch_cpu(array: np.ndarray):
    """A torch CPU tensor over a numpy array's memory (float8 and bfloat16 included).

    NOTES: the tensor's storage is the whole allocation the view lies in (a padded layout's
    padding rows included, as on the GPU), not only the view's extent, which is all that
    ``torch.from_numpy`` of the view itself would keep.
    """
    torch = _torch()
    root = _root_array(array)
    if root.dtype != array.dtype or not root.flags.c_contiguous:
        root = np.ascontiguousarray(array) if array.size == 0 else array
    name = array.dtype.name
    flat = root.reshape(-1) if root.flags.c_contiguous else root
    if name == "bfloat16" or name.startswith("float8"):
        base = torch.from_numpy(flat.view(np.int16 if array.itemsize == 2 else np.uint8))
        base = base.view(getattr(torch, name))
    else:
        base = torch.from_numpy(flat)
    if flat is array:
        return base
    offset = (array.ctypes.data - root.ctypes.data) // array.itemsize
    strides = [s // array.itemsize for s in array.strides]
    return base.as_strided(array.shape, strides, offset)


CUPY_POOL_ROUNDING = 512  # CuPy's memory pool rounds every block up to this many bytes


def allocation_bytes(info: ArrayInfo) -> tuple[int | None, int]:
    """(bytes of the buffer ``info`` lies in, from ``info.ptr`` on, or None if unknown; the
    rounding of that end: 1 where the end is exact).

    NOTES: the buffer is the nearest record of the caller's allocation. torch: the tensor's
    storage. numpy and cupy: the array at the root of the view chain (through ``as_strided``'s
    helper object, a ``DummyArray`` holding the original as its base) where it is one dense
    run of memory; a numpy root that is not is unknown. CuPy's ``as_strided`` and arrays made
    on a memory pointer keep no base: their bound is the memory block the pointer lies in,
    which the pool rounds up to 512 bytes (docs/spec.md, outputs).
    """
    if info.kind == TORCH:
        tensor = info.obj
        nbytes = tensor.untyped_storage().nbytes() - tensor.storage_offset() * info.itemsize
        return nbytes, 1
    root = _root_array(info.obj)
    # NOTES: a cupy array without a base may be a view made on a pointer, whose own extent (a
    # (5, 1) view with strides (1, 8) looks dense) says nothing of the buffer under it
    owner = info.kind == NUMPY or root is not info.obj
    if owner and (root.flags.c_contiguous or root.flags.f_contiguous):
        start = root.ctypes.data if info.kind == NUMPY else root.data.ptr
        if start <= info.ptr <= start + root.nbytes:
            return start + root.nbytes - info.ptr, 1
    if info.kind == CUPY:
        memory = info.obj.data.mem
        if memory.size:
            return memory.size - (info.ptr - memory.ptr), CUPY_POOL_ROUNDING
    return None, 1


def _root_array(array):
    """The array at the root of ``array``'s chain of views (through ``as_strided`` helpers)."""
    kind = type(array)
    root = array
    while True:
        base = root.base
        if isinstance(base, kind):
            root = base
        elif isinstance(getattr(base, "base", None), kind) and hasattr(
            base, "__array_interface__"
        ):  # numpy's DummyArray from as_strided
            root = base.base
        else:
            return root


def torch_bytes(tensor):
    """The bytes of a torch tensor's elements in row-major order, as a 1-D uint8 tensor (a view
    where the tensor is contiguous, else of a copy). Flattened first and given a unit stride:
    torch calls a tensor contiguous whatever the strides of its size-1 dimensions (packed scales
    of one word a row, ``[M, 1]`` with strides ``(1, M)``; one element with a stride of 4), and
    a view to a smaller dtype refuses a last stride other than 1."""
    import torch

    flat = tensor.contiguous().reshape(-1)
    return flat.as_strided((flat.numel(),), (1,)).view(torch.uint8)


def byte_extent(ptr: int, shape, strides, itemsize: int) -> tuple[int, int]:
    """[first, last + 1) byte addresses an array of ``shape`` and element ``strides`` touches;
    an empty array touches none."""
    if 0 in shape:
        return ptr, ptr
    low = high = ptr
    for n, stride in zip(shape, strides):
        span = (n - 1) * stride * itemsize
        low, high = (low + span, high) if span < 0 else (low, high + span)
    return low, high + itemsize


# the hot path: cheap reads, allocation and streams in the caller's library ------------------------


def device_signature(x):
    """(kind, dtype, shape, strides, device, 16-byte aligned, pointer) of a GPU array, or None.

    Reads only cheap attributes (no DLPack); the tuple without its pointer keys the plan cache.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        # NOTES: under torch.compile a tensor has no pointer to read; the entry point then
        # takes the custom op (api._dynamo_tracing)
        if not x.is_cuda or is_dynamo_compiling(torch):
            return None
        ptr = x.data_ptr()
        return TORCH, x.dtype, x.shape, x.stride(), x.get_device(), ptr % 16 == 0, ptr
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        data = x.data  # the pointer's device_id is a plain read; x.device builds a Device
        ptr = data.ptr
        return CUPY, x.dtype, x.shape, x.strides, data.device_id, ptr % 16 == 0, ptr
    return None


def is_dynamo_compiling(torch) -> bool:
    """Whether torch.compile's dynamo is tracing the caller (False in eager, where it costs a
    call; older torch has no such function and no tracing of this package)."""
    check = getattr(torch.compiler, "is_dynamo_compiling", None)
    return check is not None and check()


def pointer(array, kind: str) -> int:
    return array.data_ptr() if kind == TORCH else array.data.ptr


def strided_extent(shape, strides) -> int:
    """Elements from an array's first to its last, inclusive (non-negative strides); 0 when
    it is empty."""
    if 0 in shape:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def device_allocator(kind: str, device: int, shape, strides, storage: int, dtype: str):
    """A function allocating a ``shape``/``strides`` array over ``storage`` elements.

    ``dtype`` is the dtype's name in the caller's library ("float8_e4m3fn", "int8", "int32",
    "float32"; cupy has no float8 type, so its callers pass the uint8 container). Runs on the
    current device.
    """
    shape, strides = tuple(shape), tuple(strides)
    if kind == TORCH:
        torch = _torch()
        torch_dtype = getattr(torch, dtype)
        where = torch.device("cuda", device)
        # NOTES: empty_strided allocates the view's extent; one call where that is the whole
        # storage (contiguous arrays, MN-major scales of M a multiple of the padding), about
        # 1 us less than empty and as_strided on the H200's host
        if storage == strided_extent(shape, strides):
            empty_strided = torch.empty_strided
            return lambda: empty_strided(shape, strides, dtype=torch_dtype, device=where)
        return lambda: torch.empty(storage, dtype=torch_dtype, device=where).as_strided(
            shape, strides
        )
    import cupy

    shape, byte_strides, storage, np_dtype = _cupy_spec(shape, strides, storage, dtype)
    alloc, ndarray, nbytes = cupy.cuda.alloc, cupy.ndarray, storage * np_dtype.itemsize
    return lambda: ndarray(shape, np_dtype, alloc(nbytes), byte_strides)


def pair_allocator(kind: str, device: int, first, second):
    """A function returning ``(a, a_ptr, b, b_ptr)``: new arrays of two specs, as
    ``device_allocator`` takes them (shape, strides, storage, dtype). Runs on the current device.

    NOTES: cupy gets one allocation holding both (256-byte aligned), which halves the pool calls
    of a plain call; torch gets one ``empty_strided`` per contiguous array (about 1 us less than
    ``empty`` with a device argument, measured on the H200).
    """
    if kind == TORCH:
        make_a = device_allocator(kind, device, *first)
        make_b = device_allocator(kind, device, *second)

        def allocate_torch():
            a, b = make_a(), make_b()
            return a, a.data_ptr(), b, b.data_ptr()

        return allocate_torch
    import cupy

    (a_shape, a_strides, a_storage, a_dtype), (b_shape, b_strides, b_storage, b_dtype) = (
        _cupy_spec(*first),
        _cupy_spec(*second),
    )
    b_offset = -(-a_storage * a_dtype.itemsize // 256) * 256
    total = b_offset + b_storage * b_dtype.itemsize
    alloc, ndarray = cupy.cuda.alloc, cupy.ndarray

    def allocate_cupy():
        memory = alloc(total)
        b_memory = memory + b_offset
        a = ndarray(a_shape, a_dtype, memory, a_strides)
        b = ndarray(b_shape, b_dtype, b_memory, b_strides)
        return a, memory.ptr, b, b_memory.ptr

    return allocate_cupy


def _cupy_spec(shape, strides, storage: int, dtype: str):
    """(shape, byte strides, storage, numpy dtype) of a cupy array."""
    np_dtype = np.dtype(dtype)
    return tuple(shape), tuple(s * np_dtype.itemsize for s in strides), storage, np_dtype


def stream_getter(kind: str):
    """A function of the device index giving the caller's current stream handle.

    torch: torch's current stream (``torch._C._cuda_getCurrentRawStream``, the cheap read Triton
    uses, else ``torch.cuda.current_stream``); cupy: CuPy's current stream.
    """
    if kind == TORCH:
        torch = _torch()
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw
        return lambda device: torch.cuda.current_stream(device).cuda_stream
    import cupy

    return lambda device: cupy.cuda.get_current_stream().ptr


# other GPU array libraries (JAX, numba, anything with DLPack or the CUDA array interface) ---------

JAX = "jax"
NUMBA = "numba"
OTHER = "other"


def foreign_library(x) -> str | None:
    """JAX, NUMBA or OTHER for a CUDA array this module does not read natively, else None."""
    torch = _torch()
    if isinstance(x, np.ndarray) or (torch is not None and isinstance(x, torch.Tensor)):
        return None  # read natively (a tensor on another device is refused by describe)
    if device_signature(x) is not None:
        return None
    has_cai = hasattr(x, "__cuda_array_interface__")
    if not has_cai and not hasattr(x, "__dlpack__"):
        return None
    if not has_cai:
        device = getattr(x, "__dlpack_device__", None)
        if device is None or device()[0] not in (2, 13):  # kDLCUDA, kDLCUDAManaged
            return None
    root = library_of(x)
    if root in ("jax", "jaxlib"):
        return JAX
    if root == "numba":
        return NUMBA
    return OTHER


def to_cupy(x, name: str = "x"):
    """A cupy view of a foreign CUDA array, without a copy (CUDA array interface or DLPack).

    NOTES: the CUDA array interface has no typestr for bfloat16: exporters fall back to a void
    type ('<V2'), which must be refused here rather than read as raw bytes.
    """
    from ._jit import cupy_module

    cupy = cupy_module()

    if hasattr(x, "__cuda_array_interface__"):
        interface = x.__cuda_array_interface__
        typestr = interface.get("typestr") if isinstance(interface, dict) else None
        try:
            kind = np.dtype(typestr).kind
        except TypeError:
            kind = None
        if kind not in ("f", "i", "u", "b"):
            raise TypeError(
                f"{name}: its __cuda_array_interface__ typestr {typestr!r} is not a numeric type "
                "(the interface has none for bfloat16: pass bfloat16 data as a torch tensor, a "
                "cupy array or through DLPack)"
            )
        try:
            return cupy.asarray(x)
        except Exception as error:  # CuPy's own message may name nothing of ours
            raise ValueError(
                f"{name}: cannot read its __cuda_array_interface__: {error}"
            ) from error
    return cupy.from_dlpack(x)


def from_cupy(array, library: str, float8: str | None):
    """``array`` back in the caller's library; ``float8`` names the format of uint8 codes."""
    if library == NUMBA:
        from numba import cuda

        return cuda.as_cuda_array(array)
    if library == JAX:
        import cupy
        import jax
        import jax.numpy as jnp

        # NOTES: JAX arrays are values without strides: padded and column-major layouts come back
        # as compact arrays of their logical values
        result = jax.dlpack.from_dlpack(cupy.ascontiguousarray(array))
        if float8 is not None:  # JAX holds float8: reinterpret the codes (JAX arrays are values)
            result = jax.lax.bitcast_convert_type(result, getattr(jnp, float8))
        return result
    return array
