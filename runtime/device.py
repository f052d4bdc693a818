"""Regs, devices, backends (streams) and events: the contract every backend implements.

A backend package subclasses ``Device``, ``Backend`` and ``Event`` and overrides the hooks
below (``runtime/buffer.py`` has the memory half). Public methods own the checks and fallbacks
and call the hooks. Required hooks raise NotImplementedError here. An optional hook is a
capability: the base class holds the fallback, and the capability exists exactly when a
subclass overrides the hook (``polydev.hooks.overrides``); ``Device.caps`` is derived that way.
A derived hook is the runtime's own, built on the others; a backend that works differently (one
that ships whole graphs elsewhere) may still override it. ``close()`` calls ``_free``.

  Reg      Reg(name, devices, procs, unavailable_reason, excluded)   a record; nothing to
           override (``excluded``: devices found but not offered, each with its reason)
  Device   memory() -> (free, total)          required
           buffer_type                        required  the default BufferType
           supports_buft(buft)                required  can its kernels use that memory in place
           backend_class                      required  the Backend subclass of its streams
           kernels                            required  a KernelTable, unless supports_op and the
                                                        backend's bind are both overridden
           supports_op(op)                    derived   kernels.find(op) is not None
           supported_op_names()               derived   kernels.op_names()
           _init_backend(params)              optional  backend_class(self)
           offload_op(op)                     optional  False
           device_id                          optional  None
           _host_buffer_type()                optional  caps.host_buffer; else host_buffer_type None
           _buffer_from_host_ptr(host, max)   optional  caps.buffer_from_host_ptr; else
                                                        UnsupportedError
           _event_new()                       optional  caps.events; else event_new() gives None
                                                        and callers synchronize instead
  Backend  bind(node) -> call                 derived   the kernel of device.kernels, bound here
           _compute_scope()                   optional  a context binding and replay run in
                                                        (device and stream current); none
           _graph_plan_create/_compute/_free  derived   bind every node once, replay the calls
           _graph_compute(graph)              derived   one plan, made and replayed
           _set_tensor_async(t, raw, offset)  optional  caps.async_, with _get_tensor_async and
           _get_tensor_async(t, out, offset)            _holds_memory_of: one enqueue each, of
           _holds_memory_of(t)                          checked bytes; what they return is kept
                                                        alive until synchronize; else (and for
                                                        memory the stream does not hold)
                                                        synchronize + a blocking copy
           _cpy_tensor_async(src_be, src, dst) optional may decline (False); else both streams
                                                        synchronize, then tensor_copy
           _synchronize()                     optional  nothing (a synchronous stream)
           kernel_errors, _read_error_flags() optional  None: kernels that cannot raise set
                                                        flags (polydev.inflight), raised at
                                                        synchronize
           _event_record(e), _event_wait(e)   required  where the device has _event_new; only
                                                        for events of the same reg (the host
                                                        waits for any other)
           _free()                            optional  nothing
  Event    _synchronize()                     required
           _free()                            optional  nothing

A backend that holds its calls back to send them together registers a hook with
``before_host_waits``: the runtime calls it before it blocks on any stream or event.
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager

import numpy as np

from .buffer import (Buffer, BufferType, as_bytes, check_range, data_buffer, output_bytes,
                     tensor_copy, tensor_get, tensor_set)
from .errors import (ClosedError, InvalidArgumentError, NotAllocatedError, ShapeError,
                     UnsupportedError, UnsupportedOpError)
from .hooks import overrides
from .inflight import HostKeepAlive, KernelErrorFlags
from .lifetime import Resource
from .ops import VIEW_OPS, Op, op_desc
from .tensor import Tensor

if TYPE_CHECKING:
    from .graph import Graph
    from .kernels import KernelTable


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
    """What a device can do beyond the required minimum (derived from its hooks)."""

    async_: bool = False                 # async set/get/copy and graph_compute_async
    host_buffer: bool = False            # host_buffer_type gives pinned host memory
    buffer_from_host_ptr: bool = False   # buffer_from_host_ptr wraps user memory
    events: bool = False                 # event_new gives events


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


def lost_text(name: str, reason: str) -> str:
    """How a lost device is named in messages: "ray:node-b/CPU is lost: why"."""
    return f"{name} is lost: {reason}"


class Device:
    """One physical or logical device; see the module docstring for its hooks."""

    type = DeviceType.CPU
    backend_class: "type[Backend]"

    def __init__(self, name: str, description: str, reg: "Reg | None" = None) -> None:
        self.name = name
        self.description = description
        self.reg = reg

    # --- what it is -------------------------------------------------------------------------

    @property
    def caps(self) -> DeviceCaps:
        """The optional capabilities, read off the hooks this device and its backend override."""
        return DeviceCaps(
            async_=overrides(self.backend_class, Backend, "_set_tensor_async"),
            host_buffer=overrides(self, Device, "_host_buffer_type"),
            buffer_from_host_ptr=overrides(self, Device, "_buffer_from_host_ptr"),
            events=overrides(self, Device, "_event_new"))

    @property
    def device_id(self) -> str | None:
        """The PCI bus id ("dddd:bb:dd.f") where there is one."""
        return None

    @property
    def host(self) -> str:
        """The machine the device is in ("local": this one; a remote device, its node's
        address): CPU devices of one host compute on the same cores."""
        return "local"

    @property
    def lost(self) -> str | None:
        """Why the device is out of service for good (a remote device whose node is gone);
        None while it serves. A local device is never lost."""
        return None

    def memory(self) -> tuple[int, int]:
        """(free, total) bytes."""
        raise NotImplementedError

    def props(self) -> DeviceProps:
        """Name, description, memory, type, PCI id and caps in one record."""
        free, total = self.memory()
        return DeviceProps(self.name, self.description, free, total, self.type, self.device_id,
                           self.caps)

    # --- memory ---------------------------------------------------------------------------------

    @property
    def buffer_type(self) -> BufferType:
        """The preferred buffer type."""
        raise NotImplementedError

    @property
    def host_buffer_type(self) -> BufferType | None:
        """Pinned host memory for fast transfers, or None where the device has none."""
        return self._host_buffer_type() if overrides(self, Device, "_host_buffer_type") else None

    def buffer_from_host_ptr(self, host: Any, max_tensor_size: int = 0) -> Buffer:
        """A buffer over existing host memory (a numpy array, memoryview or mmap), no copy."""
        if not overrides(self, Device, "_buffer_from_host_ptr"):
            raise UnsupportedError(f"device {self.name} cannot wrap host memory "
                                   f"(caps.buffer_from_host_ptr is false)")
        return self._buffer_from_host_ptr(host, max_tensor_size)

    def supports_buft(self, buft: BufferType) -> bool:
        """Whether this device's kernels can use tensors in ``buft`` in place."""
        raise NotImplementedError

    # --- compute ------------------------------------------------------------------------------

    @property
    def kernels(self) -> "KernelTable":
        """The kernel table that ``supports_op`` and the backend's ``bind`` read."""
        raise NotImplementedError(f"device {self.name} has no kernel table: it must override "
                                  f"supports_op and its backend's bind")

    def supports_op(self, op: Tensor) -> bool:
        """Whether this device can compute ``op`` (its sources already set)."""
        return self.kernels.find(op) is not None

    def supported_op_names(self) -> list[str]:
        """The op names (unary and glu functions by their own names) of the kernel table."""
        return self.kernels.op_names()

    def offload_op(self, op: Tensor) -> bool:
        """Whether this device wants ``op`` even though its weights are in host memory."""
        return False

    def init_backend(self, params: str | None = None) -> "Backend":
        """A new stream on this device (``params`` is free-form, as in ggml)."""
        return self._init_backend(params)

    def event_new(self) -> "Event | None":
        """A new event, or None where the device has no events (callers then synchronize)."""
        return self._event_new() if overrides(self, Device, "_event_new") else None

    # --- hooks ------------------------------------------------------------------------------

    def _init_backend(self, params: str | None) -> "Backend":
        return self.backend_class(self)

    def _host_buffer_type(self) -> BufferType:
        raise NotImplementedError

    def _buffer_from_host_ptr(self, host: Any, max_tensor_size: int) -> Buffer:
        raise NotImplementedError

    def _event_new(self) -> "Event":
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.description!r}, {self.type.name})"


_before_host_waits: list[Callable[[], None]] = []


def before_host_waits(hook: Callable[[], None]) -> None:
    """Have ``hook`` called each time this process is about to block on a stream or an event
    (``Backend.synchronize``, ``Event.synchronize``): a backend that holds its calls back to
    send them together (the Ray backend's batches) sends them then, so that its streams never
    wait for the host while the host waits for another stream (a pipeline's stages overlap)."""
    if hook not in _before_host_waits:
        _before_host_waits.append(hook)


def _host_waits() -> None:
    for hook in _before_host_waits:
        hook()


class Event(Resource):
    """A point in a backend's stream that other streams or the host can wait for."""

    def __init__(self, device: Device) -> None:
        self.device = device

    def record(self, backend: "Backend") -> None:
        """Mark the current end of ``backend``'s stream."""
        backend.event_record(self)

    def wait(self, backend: "Backend") -> None:
        """Make ``backend``'s stream wait for this event (the host does not block)."""
        backend.event_wait(self)

    def synchronize(self) -> None:
        """Block the host until the event has completed."""
        self._check_open()
        _host_waits()
        self._synchronize()

    def _describe(self) -> str:
        return f"event of {self.device.name}"

    def _synchronize(self) -> None:
        raise NotImplementedError


BoundCall = Callable[[], None]


def computing_nodes(graph: "Graph") -> list[Tensor]:
    """The nodes of ``graph`` a plan binds a call to, in order (views compute nothing)."""
    return [n for n in graph.nodes if n.op not in VIEW_OPS and n.op != Op.NONE]


class GraphPlan:
    """A graph prepared once for repeated computes on one backend: each compute node's kernel
    call, bound to its tensors' memory; computing the plan replays ``calls`` in order."""

    def __init__(self, backend: "Backend", graph: "Graph", calls: list[BoundCall]) -> None:
        self.backend = backend
        self.graph = graph
        self.calls = calls
        self.freed = False


class Backend(Resource):
    """An execution stream bound to one device; a context manager (``close()`` waits for its
    work and releases it)."""

    # Errors its kernels report through flags in device memory; a backend whose kernels do
    # sets one and overrides _read_error_flags.
    kernel_errors: KernelErrorFlags | None = None

    # True where every write into the device's memory (a host write, an async copy) runs
    # after the work queued on this stream before it, as a remote device's calls run in one
    # queue: the scheduler then writes a split's inputs without first waiting for the stream
    # to finish with them (ggml waits, for devices that do not keep that order).
    writes_in_stream_order: bool = False

    def __init__(self, device: Device, name: str | None = None) -> None:
        self.device = device
        self.name = name or device.name
        self.in_flight = HostKeepAlive()     # host memory of queued transfers

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for hooks in (("_set_tensor_async", "_get_tensor_async", "_holds_memory_of"),
                      ("_event_record", "_event_wait")):
            if len({overrides(cls, Backend, hook) for hook in hooks}) > 1:
                raise TypeError(f"{cls.__name__} must override {', '.join(hooks[:-1])} and "
                                f"{hooks[-1]} together, or none of them")

    def close(self) -> None:
        """Wait for the stream's work and release it (and the host memory it held)."""
        super().close()
        self.in_flight.release()

    # --- memory shortcuts on the default buffer type -----------------------------------------

    @property
    def default_buffer_type(self) -> BufferType:
        """The device's preferred buffer type."""
        return self.device.buffer_type

    def alloc_buffer(self, size: int) -> Buffer:
        """A buffer of ``size`` bytes of the default buffer type."""
        return self.default_buffer_type.alloc_buffer(size)

    @property
    def alignment(self) -> int:
        """The default buffer type's alignment."""
        return self.default_buffer_type.alignment

    @property
    def max_size(self) -> int:
        """The default buffer type's largest buffer."""
        return self.default_buffer_type.max_size

    # --- async data movement ------------------------------------------------------------------

    def set_tensor_async(self, t: Tensor, data, offset: int = 0) -> None:
        """Queue a write of raw bytes (any buffer-protocol object) into ``t`` at byte
        ``offset``. The stream keeps ``data`` alive, but it must stay unchanged until the
        stream synchronizes. Memory this stream cannot reach asynchronously (another device's,
        or any on a stream without async transfers) is written after a synchronize."""
        self._check_open()
        raw = as_bytes(data)
        data_buffer(t)
        check_range(t, offset, raw.size, "set_tensor_async")
        if raw.size == 0:
            return
        if not self._holds_memory_of(t):
            self.synchronize()
            tensor_set(t, raw, offset)
            return
        self.in_flight.hold(raw, self._set_tensor_async(t, raw, offset))
        t.buffer.mark_modified()

    def get_tensor_async(self, t: Tensor, out: np.ndarray, offset: int = 0) -> None:
        """Queue a read of ``t``'s bytes from ``offset`` into ``out`` (a writable C-contiguous
        array, as many bytes as it holds); ``out`` holds them after ``synchronize()``."""
        self._check_open()
        target = output_bytes(out, "get_tensor_async")
        data_buffer(t)
        check_range(t, offset, target.size, "get_tensor_async")
        if target.size == 0:
            return
        if not self._holds_memory_of(t):
            self.synchronize()
            tensor_get(t, offset, target.size, target)
            return
        self.in_flight.hold(out, self._get_tensor_async(t, target, offset))

    def synchronize(self) -> None:
        """Wait until everything queued on this stream has finished; raise what its kernels
        reported meanwhile (an index out of range), naming the op and the tensor."""
        self._check_open()
        _host_waits()
        self._synchronize()
        self.in_flight.release()
        errors = self.kernel_errors
        if errors is not None and errors.pending:
            errors.raise_reported(self._read_error_flags())

    # --- compute ----------------------------------------------------------------------------

    @property
    def kernels(self) -> "KernelTable":
        """The kernel table ``bind`` reads: the device's, unless the stream has its own."""
        return self.device.kernels

    def bind(self, node: Tensor) -> BoundCall:
        """The call that computes ``node`` on this stream, its arguments bound once."""
        kernel = self.kernels.find(node)
        if kernel is None:
            types = ", ".join(f"{s.type}" for s in node.src if s is not None)
            raise UnsupportedOpError(f"{self.name} has no kernel for {op_desc(node)} of "
                                     f"{node.name!r} (result {node.type}, sources {types})")
        return kernel.bind(self, node)

    def graph_compute(self, graph: "Graph") -> None:
        """Compute every node of ``graph`` and wait for it."""
        self.graph_compute_async(graph)
        self.synchronize()

    def graph_compute_async(self, graph: "Graph") -> None:
        """Queue the graph's computation (synchronous on backends without async)."""
        self._check_open()
        self._check_graph(graph)
        self._graph_compute(graph)

    def graph_plan_create(self, graph: "Graph") -> GraphPlan:
        """Prepare ``graph`` once for repeated ``graph_plan_compute`` calls."""
        self._check_open()
        self._check_graph(graph)
        return self._graph_plan_create(graph)

    def graph_plan_compute(self, plan: GraphPlan) -> None:
        """Queue one computation of a plan made by this backend."""
        self._check_open()
        if plan.backend is not self:
            raise InvalidArgumentError(f"a plan of {plan.backend.name} cannot run on {self.name}")
        if plan.freed:
            raise ClosedError(f"the plan of {self.name} was freed")
        self._graph_plan_compute(plan)

    def graph_plan_free(self, plan: GraphPlan) -> None:
        """Release a plan; computing it afterwards raises ClosedError."""
        if not plan.freed:
            plan.freed = True
            self._graph_plan_free(plan)

    def _check_graph(self, graph: "Graph") -> None:
        """Every computing node and its sources are allocated, open, and in memory this device
        computes on. View ops compute nothing (a scheduler's split may hold views of another
        device's tensors, as in ggml), so only their allocation is checked."""
        usable: dict[int, bool] = {}
        for node in graph.nodes:
            if node.op in VIEW_OPS or node.op == Op.NONE:
                if node.buffer is None:
                    raise NotAllocatedError(f"{self.name}: view {node.name!r} "
                                            f"ne={list(node.ne)} is not allocated")
                continue
            for t in (node, *node.src):
                if t is None:
                    continue
                buf = t.buffer
                if buf is None:
                    raise NotAllocatedError(f"{self.name} cannot compute {op_desc(node)} "
                                            f"{node.name!r}: tensor {t.name or '<unnamed>'} "
                                            f"ne={list(t.ne)} is not allocated")
                buf._check_open()
                ok = usable.get(id(buf.buft))
                if ok is None:
                    ok = usable[id(buf.buft)] = self.device.supports_buft(buf.buft)
                if not ok:
                    raise UnsupportedError(f"{self.name} cannot compute {op_desc(node)} "
                                           f"{node.name!r}: tensor {t.name or '<unnamed>'} is "
                                           f"in {buf.name} memory, which {self.device.name} "
                                           f"cannot use (copy it, or let a Scheduler do)")

    # --- device questions -----------------------------------------------------------------------

    def supports_op(self, op: Tensor) -> bool:
        """The device's answer (ggml's deprecated backend forwards)."""
        return self.device.supports_op(op)

    def supports_buft(self, buft: BufferType) -> bool:
        """The device's answer."""
        return self.device.supports_buft(buft)

    def offload_op(self, op: Tensor) -> bool:
        """The device's answer."""
        return self.device.offload_op(op)

    # --- events -------------------------------------------------------------------------------

    def event_record(self, event: Event) -> None:
        """Mark the current end of this stream in ``event`` (an event of this device)."""
        self._check_open()
        if not overrides(self, Backend, "_event_record"):
            raise UnsupportedError(f"backend {self.name} has no events")
        if not isinstance(event, Event) or event.device is not self.device:
            raise InvalidArgumentError(f"{self.name} can only record events of its own device, "
                                       f"not {event!r}")
        event._check_open()
        self._event_record(event)

    def event_wait(self, event: Event) -> None:
        """Make this stream wait for ``event``; an event of another backend library (or a
        backend without events) makes the host wait instead, which orders the same way."""
        self._check_open()
        event._check_open()
        same_reg = event.device.reg is not None and event.device.reg is self.device.reg
        if same_reg and overrides(self, Backend, "_event_wait"):
            self._event_wait(event)
        else:
            event.synchronize()

    def _describe(self) -> str:
        return f"backend {self.name}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # --- hooks ------------------------------------------------------------------------------

    def _compute_scope(self) -> ContextManager:
        return contextlib.nullcontext()

    def _graph_plan_create(self, graph: "Graph") -> GraphPlan:
        return GraphPlan(self, graph, self._bind_graph(graph))

    def _bind_graph(self, graph: "Graph") -> list[BoundCall]:
        """Each computing node's bound call, in order."""
        with self._compute_scope():
            return [self.bind(n) for n in computing_nodes(graph)]

    def _graph_plan_compute(self, plan: GraphPlan) -> None:
        with self._compute_scope():
            for call in plan.calls:
                call()

    def _graph_plan_free(self, plan: GraphPlan) -> None:
        plan.calls = []

    def _graph_compute(self, graph: "Graph") -> None:
        self._graph_plan_compute(self._graph_plan_create(graph))

    def _holds_memory_of(self, t: Tensor) -> bool:
        """Whether ``t``'s memory is this stream's to copy to and from asynchronously."""
        return False

    def _set_tensor_async(self, t: Tensor, raw: np.ndarray, offset: int) -> Any:
        """Enqueue the write of ``raw`` (flat uint8, range checked); return anything that must
        live until the stream passes it (an event that pins the memory), or None."""
        raise NotImplementedError

    def _get_tensor_async(self, t: Tensor, out: np.ndarray, offset: int) -> Any:
        """Enqueue the read into ``out`` (flat writable uint8, range checked); as above."""
        raise NotImplementedError

    def _read_error_flags(self) -> np.ndarray:
        """The kernel error flags (int32, one per slot of ``kernel_errors``), zeroed after the
        read; called after ``_synchronize`` when a checking kernel ran."""
        raise NotImplementedError

    def _cpy_tensor_async(self, backend_src: "Backend", src: Tensor, dst: Tensor) -> bool:
        return False

    def _synchronize(self) -> None:
        pass

    def _event_record(self, event: Event) -> None:
        raise NotImplementedError

    def _event_wait(self, event: Event) -> None:
        raise NotImplementedError


def tensor_copy_async(backend_src: Backend, backend_dst: Backend, src: Tensor, dst: Tensor) -> None:
    """Copy ``src`` to ``dst`` after the work queued on ``backend_src``; ``backend_dst`` waits
    for the copy. Falls back to synchronizing both streams and a blocking copy."""
    if not src.same_layout(dst):
        raise ShapeError(f"tensor_copy_async needs the same layout: {src.name or 'src'} "
                         f"{src.type} ne={list(src.ne)} nb={list(src.nb)} vs {dst.name or 'dst'} "
                         f"{dst.type} ne={list(dst.ne)} nb={list(dst.nb)}")
    if src is dst:
        return
    backend_src._check_open()
    backend_dst._check_open()
    if backend_dst._cpy_tensor_async(backend_src, src, dst):
        return
    backend_src.synchronize()
    backend_dst.synchronize()
    tensor_copy(src, dst)


@dataclass(frozen=True)
class ExcludedDevice:
    """A device a backend found but does not offer: ``description`` names it (its platform and
    driver version where it has them), ``reason`` says why (the compiler's own message for a
    driver that cannot build the backend's kernels, or the device it duplicates)."""

    description: str
    reason: str


class Reg:
    """One backend library's registry entry: a name and its devices.

    ``unavailable_reason`` explains an empty device list (e.g. "pyopencl is not installed");
    ``excluded`` lists the devices found but left out, each with its reason; ``procs`` holds
    optional named functions (ggml's get_proc_address), e.g. "set_n_threads".
    """

    def __init__(self, name: str, devices: list[Device] | None = None,
                 procs: dict[str, Callable] | None = None,
                 unavailable_reason: str | None = None,
                 excluded: list[ExcludedDevice] | None = None) -> None:
        self.name = name
        self.devices: list[Device] = []
        self.procs = dict(procs or {})
        self.unavailable_reason = unavailable_reason
        self.excluded: list[ExcludedDevice] = list(excluded or [])
        for d in devices or []:
            self.add_device(d)

    def add_device(self, device: Device) -> None:
        """Add a device and make this reg its owner."""
        device.reg = self
        self.devices.append(device)

    @property
    def device_count(self) -> int:
        """How many devices the reg has."""
        return len(self.devices)

    def device(self, i: int) -> Device:
        """The i-th device."""
        return self.devices[i]

    def get_proc_address(self, name: str) -> Callable | None:
        """An optional function of the backend library by name, or None."""
        return self.procs.get(name)

    def __repr__(self) -> str:
        return f"Reg({self.name!r}, devices={[d.name for d in self.devices]})"
