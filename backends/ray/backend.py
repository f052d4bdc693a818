"""A remote device's stream: the calls of its actor, submitted without waiting.

Writes, reads, copies and plan computes are queued and return at once: they go to the actor
in batches, one call each (``call_queue.py``); ``synchronize`` waits for all of them (within
the time-out) and fills the outputs of reads. A graph goes to the actor once, as tuples, when
its plan is made; computing the plan sends only its id. An event of another remote stream is
an argument of this stream's next call, so Ray makes the actor wait for it and the driver
never blocks. A copy from another remote device goes actor to actor: the bytes one batch
reads are an argument of the other's.
"""

from __future__ import annotations

import itertools
import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from polydev.buffer import host_bytes
from polydev.device import Backend, DeviceType, Event, GraphPlan, before_host_waits
from polydev.errors import InvalidArgumentError, RemoteDeviceError, UnsupportedError
from polydev.numerics import check_numerics
from polydev.ops import VIEW_OPS, Op
from polydev.tensor import Tensor

from .call_queue import Pending, send_all
from .wire import graph_fields

if TYPE_CHECKING:
    from .device import RayDevice

log = logging.getLogger(__name__)

_plan_ids = itertools.count(1)

before_host_waits(send_all)       # a wait on a local stream sends the queued batches first


class RayGraphPlan(GraphPlan):
    """A plan whose calls live on the actor, under ``remote_id``."""

    def __init__(self, backend: "RayBackend", graph, remote_id: int) -> None:
        super().__init__(backend, graph, [])
        self.remote_id = remote_id


class RayBackend(Backend):
    """The in-order stream of one remote device (its actor runs the stream's calls one at a
    time; only heartbeats have a thread of their own)."""

    writes_in_stream_order = True             # writes and computes share the actor's queue

    def __init__(self, device: "RayDevice") -> None:
        super().__init__(device)
        self._pending: list[Pending] = []     # answers of queued calls
        self._reads: dict[Pending, np.ndarray] = {}   # a read's answer -> the bytes it fills
        self._waits: list[Any] = []           # events (Pendings) the next call waits for
        self._last: Any = None                # the last call's completion (an event marks it):
        #                                       a Pending, or the ObjectRef of a call of its own

    # --- submitting -----------------------------------------------------------------------------

    def _after(self) -> list[Any]:
        waits, self._waits = self._waits, []
        return waits

    def _submit(self, answer: Pending) -> Pending:
        self._pending.append(answer)
        self._last = answer.done()
        return answer

    def _queue(self, method: str, *args: Any) -> Pending:
        """Queue a call that waits for the events this stream was told to wait for."""
        return self._submit(self.device.calls.queue(method, args, self._after())[0])

    def _remote_id(self, t: Tensor) -> int | None:
        """The actor's id of the buffer ``t`` is in, or None where it is not this device's."""
        from .device import RayBuffer

        buf = t.buffer
        return buf.remote_id if isinstance(buf, RayBuffer) and buf.device is self.device else None

    # --- data movement --------------------------------------------------------------------------

    def _holds_memory_of(self, t: Tensor) -> bool:
        return self._remote_id(t) is not None

    def _set_tensor_async(self, t: Tensor, raw: np.ndarray, offset: int) -> None:
        self._write_host(self._remote_id(t), t.offset + offset, raw)

    def _write_host(self, buffer_id: int, offset: int, raw: np.ndarray) -> None:
        """Host bytes into the device in the stream's order, after the events it was told to
        wait for (they may change once this returns: a queued write copies them, a large one
        is its own call, serialised as it is made)."""
        self._last = self.device.write(buffer_id, offset, raw, self._after())

    def _get_tensor_async(self, t: Tensor, out: np.ndarray, offset: int) -> None:
        for answer, place in self.device.calls.read(self._remote_id(t), t.offset + offset,
                                                    out, self._after()):
            self._reads[self._submit(answer)] = place

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """Into this device from another remote device (actor to actor: the bytes one batch
        reads are an argument of the other's), from another stream of this device (a copy on
        the actor), or from host memory (sent once from here); anything else takes the
        generic path."""
        from .device import RayBuffer

        buffer_id = self._remote_id(dst)
        source = src.buffer
        if buffer_id is None or source is None:
            return False
        if isinstance(source, RayBuffer):
            waits = backend_src._after() if isinstance(backend_src, RayBackend) else []
            if source.device is self.device:      # another stream of this device
                self._submit(self.device.calls.queue(
                    "copy", (source.remote_id, src.offset, buffer_id, dst.offset, src.nbytes),
                    [*waits, *self._after()])[0])
                return True
            data = source.device.calls.queue("read", (source.remote_id, src.offset,
                                                      src.nbytes), waits, values=1)[0]
        elif source.is_host:
            backend_src.synchronize()
            self._write_host(buffer_id, dst.offset, host_bytes(src))
            return True
        else:
            return False
        self._submit(self.device.calls.queue("write", (buffer_id, dst.offset),
                                             [data, *self._after()])[0])
        return True

    def _synchronize(self) -> None:
        if self._waits:
            self._queue("marker")
        pending, self._pending = self._pending, []
        reads, self._reads = self._reads, {}
        if not pending and not self.device.calls.unsettled:
            return
        results = self.device.call(pending, "the work queued on its stream")
        for answer, result in zip(pending, results):
            out = reads.get(answer)
            if out is not None:
                out[:] = result

    def set_numerics(self, numerics: str) -> None:
        """How the remote device computes (polydev.numerics), for the plans made after."""
        self._queue("set_numerics", check_numerics(numerics))

    def set_n_threads(self, n_threads: int) -> None:
        """Threads of the remote CPU's stream (ggml's "set_n_threads" of its reg). A device
        whose reg has none raises ``UnsupportedError``: here where it is not of the CPU type,
        else (a CPU-type OpenCL device) at the stream's next wait."""
        if self.device.type != DeviceType.CPU:
            raise UnsupportedError(f"{self.name} has no thread count to set (a remote CPU has)")
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
            raise InvalidArgumentError(f"{self.name}: a thread count is an int >= 1, not "
                                       f"{n_threads!r}")
        self._queue("set_n_threads", n_threads)

    # --- compute --------------------------------------------------------------------------------

    def _graph_plan_create(self, graph) -> GraphPlan:
        # views of other devices' tensors compute nothing and stay here (as in a ggml split)
        nodes = [n for n in graph.nodes
                 if (n.op not in VIEW_OPS and n.op != Op.NONE) or self._remote_id(n) is not None]
        plan_id = next(_plan_ids)
        self._queue("plan_create", plan_id, graph_fields(nodes, self._remote_id))
        return RayGraphPlan(self, graph, plan_id)

    def _graph_plan_compute(self, plan: RayGraphPlan) -> None:   # type: ignore[override]
        self._submit(self.device.calls.queue("plan_compute", (plan.remote_id,), self._after(),
                                             compute=True)[0])

    def _graph_plan_free(self, plan: RayGraphPlan) -> None:      # type: ignore[override]
        if not self.closed:
            self._queue("plan_free", plan.remote_id)

    def _graph_compute(self, graph) -> None:
        plan = self._graph_plan_create(graph)
        self._graph_plan_compute(plan)
        self._graph_plan_free(plan)

    # --- events ---------------------------------------------------------------------------------

    def _event_record(self, event: Event) -> None:
        if self._last is None or self._waits:
            self._queue("marker")
        event.ref = self._last

    def _event_wait(self, event: Event) -> None:
        if event.ref is not None:
            self._waits.append(event.ref)

    def _free(self) -> None:
        try:                                  # closing waits for the stream's work, as ggml
            self._synchronize()
        except RemoteDeviceError as e:
            if self.device.lost is None:      # a lost device has no work left to wait for
                log.error("closing the stream of %s: %s", self.device.name, e)
        self._pending.clear()
        self._reads.clear()
        self._waits.clear()
