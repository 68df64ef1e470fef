"""The GPU backend of a request: a ``DevicePlan`` (outputs, launches, the caller's stream),
the bounded cache of plans, and ``PreparedQuantize``, a plan bound to one set of buffers."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import OrderedDict

from . import _jit, _plan, _tuning
from ._arrays import (
    TORCH,
    ArrayInfo,
    describe,
    device_allocator,
    device_signature,
    pair_allocator,
    pointer,
    stream_getter,
)
from ._outputs import (
    BothOrientations,
    check_disjoint,
    check_output,
    check_writes,
    oriented_names,
    output_pair,
    specs,
    transposed_specs,
    weight_specs,
)
from ._request import BOTH, NVFP4_COMPUTED, Request, WeightRequest

_thread_state = threading.local()
_ONE = 0x3F800000  # float32 1.0: the computed global scale of an empty input


class PlanCache:
    """Plans by key: bounded, thread-safe, never cleared.

    NOTES: a full cache drops its oldest entry, one at a time, under the lock; a caller holding
    a plan keeps it whatever happens to the cache. Reads take no lock (a dict read is atomic).
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._plans: OrderedDict[tuple, _Plan] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple):
        try:
            return self._plans.get(key)
        except TypeError:  # an unhashable option: validation names it
            return None

    def put(self, key: tuple, plan: _Plan) -> None:
        try:
            hash(key)
        except TypeError:
            return
        with self._lock:
            while len(self._plans) >= self.capacity:
                self._plans.popitem(last=False)
            self._plans[key] = plan

    def __len__(self) -> int:
        return len(self._plans)


MAX_PLANS = 4096  # distinct (array layout, options) combinations remembered
PLANS = PlanCache(MAX_PLANS)


def make_plan(x_info: ArrayInfo, request: Request, key: tuple) -> DevicePlan:
    """The plan of ``request``, remembered under ``key`` and the tuning table in force."""
    token, tuning = _tuning.active()
    plan = DevicePlan(x_info, request, tuning)
    PLANS.put((*key, token), plan)
    return plan


def cached(key: tuple):
    """The plan under ``key`` and the tuning table in force (a DevicePlan, or a TilePlan for the
    keys of tile calls), or None."""
    return PLANS.get((*key, _tuning.active()[0]))


class _Plan:
    """What every GPU plan holds: the input's description (without its memory), its device and
    library, the launches, the caller's stream; ``run`` binds the device and calls ``_run``."""

    def __init__(self, x_info: ArrayInfo, request):
        # NOTES: no reference to the first input: a cached plan must not pin its memory
        self.x_info = dataclasses.replace(x_info, obj=None, ptr=0)
        self.request = request
        assert x_info.device is not None  # a GPU array
        self.kind, self.device = x_info.kind, x_info.device
        self._get_device = _jit.cupy_module().cuda.runtime.getDevice
        self.launches: list = []
        self.stream = stream_getter(self.kind)

    def run(self, x_ptr: int, out, scale_out, extra=()):
        """Quantize the array at ``x_ptr`` (laid out as planned); ``extra``: the (Params field,
        pointer) pairs of the call's other arrays."""
        if self.ready():
            return self._run(x_ptr, out, scale_out, extra)
        with self.on_device():
            return self._run(x_ptr, out, scale_out, extra)

    def _run(self, x_ptr: int, out, scale_out, extra):
        raise NotImplementedError

    def ready(self) -> bool:
        """True when the input's device is current and bound to this thread: launch as is."""
        return self._get_device() == self.device and self.device in _thread_state.__dict__.get(
            "bound", ()
        )

    def on_device(self):
        """A context making the input's device (and its primary context) current.

        NOTES: cuLaunchKernel needs a current context; a thread whose first CUDA call is a
        prepared launch has none until a runtime call binds it, so each thread binds once.
        """
        device = self._get_device()
        if device != self.device:
            return _jit.current_device(self.device)
        bound = _thread_state.__dict__.setdefault("bound", set())
        if device not in bound:
            _jit.cupy_module().cuda.runtime.setDevice(device)
            bound.add(device)
        return contextlib.nullcontext()


class DevicePlan(_Plan):
    """Everything a row-wise GPU call of one kind needs: output specs and allocators, the
    launches, the caller's stream."""

    def __init__(self, x_info: ArrayInfo, request: Request, tuning: _tuning.Tuning):
        super().__init__(x_info, request)
        if not request.output.empty:
            with self.on_device():
                self.launches = _plan.prepare(request, self.device, tuning)
        self.q_spec, self.scale_spec = specs(request)
        q_allocation = self.q_spec.allocation(self.kind)
        scale_allocation = self.scale_spec.allocation(self.kind)
        self.q_alloc = device_allocator(self.kind, self.device, *q_allocation)
        self.scale_alloc = device_allocator(self.kind, self.device, *scale_allocation)
        self.alloc_both = pair_allocator(self.kind, self.device, q_allocation, scale_allocation)
        self.scratch = None  # NVFP4 with a computed global scale: amax, then the scale
        if request.nvfp4 and request.global_mode == NVFP4_COMPUTED:
            self.scratch = device_allocator(self.kind, self.device, (2,), (1,), 2, "int32")

    def outputs(self, x_ptr: int, out, scale_out):
        """(q, q pointer, scales, scale pointer): new arrays, or the caller's, checked."""
        if out is None and scale_out is None:
            return self.alloc_both()
        given = []  # the caller's outputs, checked against x and each other before the launch
        if out is None:
            q = self.q_alloc()
            q_ptr = pointer(q, self.kind)
        else:
            q_info = check_output(out, "out", self.x_info, self.q_spec)
            q, q_ptr = out, q_info.ptr
            given.append(("out", q_info, self.q_spec))
        if scale_out is None:
            scales = self.scale_alloc()
            scale_ptr = pointer(scales, self.kind)
        else:
            s_info = check_output(scale_out, "scale_out", self.x_info, self.scale_spec)
            scales, scale_ptr = scale_out, s_info.ptr
            given.append(("scale_out", s_info, self.scale_spec))
        check_disjoint(self.x_info, x_ptr, given)
        return q, q_ptr, scales, scale_ptr

    def _run(self, x_ptr: int, out, scale_out, extra) -> tuple:
        q, q_ptr, scales, scale_ptr = self.outputs(x_ptr, out, scale_out)
        computed: tuple = ()
        if self.scratch is not None:
            scratch, extra = self.new_scratch()
            computed = (scratch[1:2].view(_float32(self.kind)),)
        stream = self.stream(self.device) if self.launches else 0
        for launch in self.launches:
            launch.launch(x_ptr, q_ptr, scale_ptr, stream, extra)
        return (q, scales, *computed)

    def new_scratch(self):
        """NVFP4's zeroed scratch words and their Params fields (amax, then the scale)."""
        scratch = self.scratch()
        scratch.fill(0) if self.kind != TORCH else scratch.zero_()
        if not self.launches:  # nothing is read: the scale of no values
            scratch[1] = _ONE
        ptr = pointer(scratch, self.kind)
        return scratch, (("global_ptr", ptr), ("global_out", ptr + 4))


def _float32(kind: str):
    if kind == TORCH:
        import torch

        return torch.float32
    return "float32"


class PreparedQuantize:
    """``quantize`` fixed to one input layout and one pair of outputs: the leanest eager call.

    Made by ``prepare``. Calling it with an array of the prepared dtype, shape, strides, device
    and 16-byte alignment quantizes into the same ``q`` and ``scales`` every time (like the static
    buffers of a CUDA graph) and returns them; any other array raises ValueError. ``masked_m``,
    the norm's weight and the residual given to ``prepare`` are bound the same way: each call
    reads them (and writes the residual) where they were, so update them in place.
    """

    def __init__(self, plan: DevicePlan, key: tuple, outputs: tuple, extra=(), residual=None,
                 bound=()):  # fmt: skip
        self._plan = plan
        # NOTES: the arrays whose addresses the launch keeps (masked_m, the weight, the
        # residual, a global scale): held, so a temporary passed to prepare is not freed and
        # its memory reused under the kernel
        self._bound = bound
        self._key = key
        self.q, self.scales = outputs[0], outputs[1]
        self._q_ptr = pointer(self.q, plan.kind)
        self._scale_ptr = pointer(self.scales, plan.kind)
        self._residual = residual  # checked against each x: the kernel writes it
        self._extra = tuple(extra)
        self._launches = plan.launches
        self._ready, self._stream, self._device = plan.ready, plan.stream, plan.device

    def __call__(self, x):
        signature = device_signature(x)
        if signature is None or signature[:-1] != self._key:
            raise ValueError(
                f"x: this call was prepared for {self._key[:6]} (library, dtype, shape, strides, "
                f"device, 16-byte aligned), got {signature[:6] if signature else type(x)}"
            )
        if self._residual is not None:
            check_writes([("x", describe(x, "x"))], [("residual", self._residual)])
        if self._plan.scratch is not None:  # NVFP4, computed global scale: a fresh result
            with self._plan.on_device():
                return self._plan.run(signature[-1], self.q, self.scales)
        if self._launches:
            if self._ready():
                self._launch(signature[-1])
            else:
                with self._plan.on_device():  # the stream is read on the input's device
                    self._launch(signature[-1])
        return self.q, self.scales

    def _launch(self, x_ptr: int) -> None:
        stream = self._stream(self._device)
        for launch in self._launches:
            launch.launch(x_ptr, self._q_ptr, self._scale_ptr, stream, self._extra)


# tiles: quantize_weight and orientation "col" / "both" (kernels/tile.cuh) -------------------


class TilePlan(_Plan):
    """A GPU call of the tile kernels (kernels/tile.cuh): orientation "col" or "both" of a
    ``Request``, or ``quantize_weight``'s ``WeightRequest``. Made once per input layout and
    options, as the row-wise plans are: output specs and allocators, and the launch.

    Its outputs, in the order the launch takes them: q and scales of a weight; qt and scales_t,
    then (for "both") the row-wise q and scales.
    """

    def __init__(self, x_info: ArrayInfo, request, tuning: _tuning.Tuning):
        super().__init__(x_info, request)
        self.weight = isinstance(request, WeightRequest)
        self.both = not self.weight and request.orientation == BOTH
        made: tuple = weight_specs(request) if self.weight else transposed_specs(request)
        row_names, names = oriented_names(self.both)  # a weight's: out and scale_out, as "col"
        if self.both:
            names, made = (*names, *row_names), (*made, *specs(request))
        self.specs = tuple(zip(names, made))
        allocations = [spec.allocation(self.kind) for spec in made]
        self.allocators = [device_allocator(self.kind, self.device, *a) for a in allocations]
        # codes and scales of each orientation in one allocation (pair_allocator)
        self.pairs = [pair_allocator(self.kind, self.device, *allocations[i : i + 2])
                      for i in range(0, len(allocations), 2)]  # fmt: skip
        if not request.output.empty:  # empty: every storage is empty, padding included
            with self.on_device():
                if self.weight:
                    launch = _plan.prepare_weight(request, request.x_aligned, self.device, tuning)
                else:
                    launch = _plan.prepare_columns(request, self.device, tuning)
            self.launches = [launch]

    def _given(self, out, scale_out) -> tuple:
        """The caller's arrays, one (or None) an output."""
        if self.weight:
            return out, scale_out
        row_out, col_out = output_pair(out, "out", self.both)
        row_s, col_s = output_pair(scale_out, "scale_out", self.both)
        return (col_out, col_s, row_out, row_s)[: len(self.specs)]

    def _outputs(self, x_ptr: int, out, scale_out) -> list:
        """(array, pointer) of each output: new, or the caller's checked against its spec, x and
        the others before anything is launched."""
        if out is None and scale_out is None:
            results = []
            for allocate in self.pairs:
                a, a_ptr, b, b_ptr = allocate()
                results += [(a, a_ptr), (b, b_ptr)]
            return results
        results, given = [], []
        for array, (name, spec), allocate in zip(self._given(out, scale_out), self.specs,
                                                 self.allocators):  # fmt: skip
            if array is None:
                array = allocate()
                results.append((array, pointer(array, self.kind)))
            else:
                info = check_output(array, name, self.x_info, spec)
                results.append((array, info.ptr))
                given.append((name, info, spec))
        check_disjoint(self.x_info, x_ptr, given)
        return results

    def _run(self, x_ptr: int, out, scale_out, extra=()):
        outputs = self._outputs(x_ptr, out, scale_out)
        pointers = [ptr for _, ptr in outputs]
        for launch in self.launches:
            stream = self.stream(self.device)
            if self.weight:
                launch.launch(x_ptr, pointers[0], pointers[1], stream)
            else:
                q_ptr, s_ptr = (pointers[2], pointers[3]) if self.both else (0, 0)
                columns = (("qt", pointers[0]), ("scales_t", pointers[1]))
                launch.launch(x_ptr, q_ptr, s_ptr, stream, columns)
        arrays = [array for array, _ in outputs]
        if self.both:
            return BothOrientations(arrays[2], arrays[3], arrays[0], arrays[1])
        return arrays[0], arrays[1]


def tile_plan(x_info: ArrayInfo, request, key: tuple | None) -> TilePlan:
    """The tile plan of ``request`` under ``key`` and the tuning table in force, made once (a
    key of None: made for this call alone)."""
    token, tuning = _tuning.active()
    plan = None if key is None else PLANS.get((*key, token))
    if plan is None:
        plan = TilePlan(x_info, request, tuning)
        if key is not None:
            PLANS.put((*key, token), plan)
    return plan
