"""Regs, devices, backends (streams) and events: the contract every backend implements.

Reading order for a backend author: ``Reg`` enumerates ``Device``s; a device creates ``Backend``
streams, names its buffer types and answers supports_op/supports_buft/offload_op; a backend
computes graphs and moves data asynchronously; ``Event``s order work between streams.

Public methods own the checks and the fallbacks; backends override the underscore hooks.
Optional hooks fall back as ggml's do: async copies become synchronize + blocking copy, graph
plans raise UnsupportedError, events are None where a device has none.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .buffer import Buffer, BufferType, tensor_copy, tensor_get, tensor_set
from .errors import ClosedError, UnsupportedError
from .tensor import Tensor

if TYPE_CHECKING:
    from .graph import Graph


class DeviceType(enum.IntEnum):
    """ggml's device types: CPU (system memory), GPU (own memory), IGPU (shares host memory),
    ACCEL (used together with the CPU), META (several devices as one)."""

    CPU = 0
    GPU = 1
    IGPU = 2
    ACCEL = 3
    META = 4


@dataclass(frozen=True)
class DeviceCaps:
    """What a device can do beyond the required minimum."""

    async_: bool = False                 # async set/get/copy and graph_compute_async
    host_buffer: bool = False            # host_buffer_type gives pinned host memory
    buffer_from_host_ptr: bool = False   # buffer_from_host_ptr wraps user memory
    events: bool = False                 # event_new works
    mmap_support: bool = False           # weights can be used straight from an mmap


@dataclass(frozen=True)
class DeviceProps:
    """ggml_backend_dev_props: everything ``polydev devices`` prints about a device."""

    name: str
    description: str
    memory_free: int
    memory_total: int
    type: DeviceType
    device_id: str | None
    caps: DeviceCaps


class Device:
    """One physical or logical device. Subclasses implement the hooks below."""

    caps = DeviceCaps()
    type = DeviceType.CPU

    def __init__(self, name: str, description: str, reg: "Reg | None" = None) -> None:
        self.name = name
        self.description = description
        self.reg = reg

    @property
    def device_id(self) -> str | None:
        """The PCI bus id ("dddd:bb:dd.f") where there is one."""
        return None

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes."""
        raise NotImplementedError

    def props(self) -> DeviceProps:
        free, total = self.memory()
        return DeviceProps(self.name, self.description, free, total, self.type, self.device_id,
                           self.caps)

    def init_backend(self, params: str | None = None) -> "Backend":
        """A new stream on this device."""
        return self._init_backend(params)

    @property
    def buffer_type(self) -> BufferType:
        """The preferred buffer type."""
        raise NotImplementedError

    @property
    def host_buffer_type(self) -> BufferType | None:
        """Pinned host memory for fast transfers, or None."""
        return None

    def buffer_from_host_ptr(self, host: Any, max_tensor_size: int = 0) -> Buffer:
        """A buffer over existing host memory (a numpy array, memoryview or mmap), no copy."""
        if not self.caps.buffer_from_host_ptr:
            raise UnsupportedError(f"device {self.name} cannot wrap host memory "
                                   f"(caps.buffer_from_host_ptr is false)")
        return self._buffer_from_host_ptr(host, max_tensor_size)

    def supports_op(self, op: Tensor) -> bool:
        """Whether this device can compute ``op`` (its sources already set)."""
        raise NotImplementedError

    def supports_buft(self, buft: BufferType) -> bool:
        """Whether this device can use tensors in ``buft`` in place."""
        raise NotImplementedError

    def offload_op(self, op: Tensor) -> bool:
        """Whether this device wants ``op`` even though its weights are in host memory."""
        return False

    def supported_op_names(self) -> list[str] | None:
        """The op names (unary and glu functions by their own names) in this device's kernel
        table, for coverage reports; None where the device cannot list them."""
        return None

    def event_new(self) -> "Event | None":
        """A new event, or None where the device has no events (callers then synchronize)."""
        return self._event_new() if self.caps.events else None

    # --- hooks ------------------------------------------------------------------------------

    def _init_backend(self, params: str | None) -> "Backend":
        raise NotImplementedError

    def _buffer_from_host_ptr(self, host: Any, max_tensor_size: int) -> Buffer:
        raise NotImplementedError

    def _event_new(self) -> "Event":
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.description!r}, {self.type.name})"


class Event:
    """A point in a backend's stream that other streams or the host can wait for."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self.closed = False

    def record(self, backend: "Backend") -> None:
        """Mark the current end of ``backend``'s stream."""
        self._check_open()
        backend.event_record(self)

    def wait(self, backend: "Backend") -> None:
        """Make ``backend``'s stream wait for this event (the host does not block)."""
        self._check_open()
        backend.event_wait(self)

    def synchronize(self) -> None:
        """Block the host until the event has completed."""
        self._check_open()
        self._synchronize()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._free()

    def __enter__(self) -> "Event":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError(f"event of {self.device.name} was closed")

    def _synchronize(self) -> None:
        raise NotImplementedError

    def _free(self) -> None:
        pass


class GraphPlan:
    """A graph prepared once for repeated computes on one backend."""

    def __init__(self, graph: "Graph") -> None:
        self.graph = graph


class BoundGraphPlan(GraphPlan):
    """A plan whose every compute node is bound to its kernel call: computing it replays
    ``calls`` in order (the plans of the CPU, OpenCL and CUDA backends)."""

    def __init__(self, graph: "Graph", calls: "list[Callable[[], None]]") -> None:
        super().__init__(graph)
        self.calls = calls


class Backend:
    """An execution stream bound to one device; a context manager (``close()`` releases it)."""

    def __init__(self, device: Device, name: str | None = None) -> None:
        self.device = device
        self.name = name or device.name
        self.closed = False

    # --- memory shortcuts on the default buffer type -----------------------------------------

    @property
    def default_buffer_type(self) -> BufferType:
        return self.device.buffer_type

    def alloc_buffer(self, size: int) -> Buffer:
        return self.default_buffer_type.alloc_buffer(size)

    @property
    def alignment(self) -> int:
        return self.default_buffer_type.alignment

    @property
    def max_size(self) -> int:
        return self.default_buffer_type.max_size

    # --- async data movement ------------------------------------------------------------------

    def set_tensor_async(self, t: Tensor, data, offset: int = 0) -> None:
        """Queue a write of raw bytes; ``data`` must stay unchanged until the stream syncs."""
        self._check_open()
        if not self.device.caps.async_:
            self.synchronize()
            tensor_set(t, data, offset)
            return
        self._set_tensor_async(t, data, offset)

    def get_tensor_async(self, t: Tensor, out: np.ndarray, offset: int = 0) -> None:
        """Queue a read into ``out``; valid after ``synchronize()``."""
        self._check_open()
        if not self.device.caps.async_:
            self.synchronize()
            tensor_get(t, offset, out.nbytes, out)
            return
        self._get_tensor_async(t, out, offset)

    def synchronize(self) -> None:
        """Wait until everything queued on this stream has finished."""
        self._check_open()
        self._synchronize()

    # --- compute ----------------------------------------------------------------------------

    def graph_compute(self, graph: "Graph") -> None:
        """Compute every node of ``graph`` and wait for it."""
        self.graph_compute_async(graph)
        self.synchronize()

    def graph_compute_async(self, graph: "Graph") -> None:
        """Queue the graph's computation (synchronous on backends without async)."""
        self._check_open()
        self._graph_compute(graph)

    def graph_plan_create(self, graph: "Graph") -> GraphPlan:
        """Prepare ``graph`` once for repeated ``graph_plan_compute`` calls."""
        self._check_open()
        return self._graph_plan_create(graph)

    def graph_plan_compute(self, plan: GraphPlan) -> None:
        self._check_open()
        self._graph_plan_compute(plan)

    def graph_plan_free(self, plan: GraphPlan) -> None:
        self._graph_plan_free(plan)

    # --- device questions -----------------------------------------------------------------------

    def supports_op(self, op: Tensor) -> bool:
        return self.device.supports_op(op)

    def supports_buft(self, buft: BufferType) -> bool:
        return self.device.supports_buft(buft)

    def offload_op(self, op: Tensor) -> bool:
        return self.device.offload_op(op)

    # --- events -------------------------------------------------------------------------------

    def event_record(self, event: Event) -> None:
        self._check_open()
        self._event_record(event)

    def event_wait(self, event: Event) -> None:
        self._check_open()
        self._event_wait(event)

    # --- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._free()

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError(f"backend {self.name} was closed")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # --- hooks ------------------------------------------------------------------------------

    def _set_tensor_async(self, t: Tensor, data, offset: int) -> None:
        raise NotImplementedError

    def _get_tensor_async(self, t: Tensor, out: np.ndarray, offset: int) -> None:
        raise NotImplementedError

    def _cpy_tensor_async(self, backend_src: "Backend", src: Tensor, dst: Tensor) -> bool:
        """Copy ``src`` (ordered after ``backend_src``'s work) into ``dst`` on this stream.
        Return False when this pair of buffers cannot be copied asynchronously."""
        return False

    def _synchronize(self) -> None:
        pass

    def _graph_compute(self, graph: "Graph") -> None:
        raise NotImplementedError

    def _graph_plan_create(self, graph: "Graph") -> GraphPlan:
        raise UnsupportedError(f"backend {self.name} has no graph plans")

    def _graph_plan_compute(self, plan: GraphPlan) -> None:
        raise UnsupportedError(f"backend {self.name} has no graph plans")

    def _graph_plan_free(self, plan: GraphPlan) -> None:
        pass

    def _event_record(self, event: Event) -> None:
        raise UnsupportedError(f"backend {self.name} has no events")

    def _event_wait(self, event: Event) -> None:
        raise UnsupportedError(f"backend {self.name} has no events")

    def _free(self) -> None:
        pass


def tensor_copy_async(backend_src: Backend, backend_dst: Backend, src: Tensor, dst: Tensor) -> None:
    """Copy ``src`` to ``dst`` after the work queued on ``backend_src``; ``backend_dst`` waits
    for the copy. Falls back to synchronizing both streams and a blocking copy."""
    if src is dst:
        return
    if backend_dst._cpy_tensor_async(backend_src, src, dst):
        return
    backend_src.synchronize()
    backend_dst.synchronize()
    tensor_copy(src, dst)


class Reg:
    """One backend library's registry entry: a name and its devices.

    ``unavailable_reason`` explains an empty device list (e.g. "pyopencl is not installed");
    ``procs`` holds optional named functions (ggml's get_proc_address), e.g. "set_n_threads".
    """

    def __init__(self, name: str, devices: list[Device] | None = None,
                 procs: dict[str, Callable] | None = None,
                 unavailable_reason: str | None = None) -> None:
        self.name = name
        self.devices: list[Device] = []
        self.procs = dict(procs or {})
        self.unavailable_reason = unavailable_reason
        for d in devices or []:
            self.add_device(d)

    def add_device(self, device: Device) -> None:
        device.reg = self
        self.devices.append(device)

    @property
    def device_count(self) -> int:
        return len(self.devices)

    def device(self, i: int) -> Device:
        return self.devices[i]

    def get_proc_address(self, name: str) -> Callable | None:
        return self.procs.get(name)

    def __repr__(self) -> str:
        return f"Reg({self.name!r}, devices={[d.name for d in self.devices]})"
