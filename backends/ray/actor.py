"""The remote side: one Ray actor owning one polydev device of its node.

The actor runs polydev itself with that node's backends. It holds the device's buffers and
one backend (its in-order stream) by the ids the driver gave them, rebuilds graphs sent as
plain tuples (``wire.py``) once per plan, and replays a plan by id. Ray runs an actor's
calls one at a time, in the order one caller submitted them, so the actor is a stream; an
event of another stream arrives as an ``ObjectRef`` argument, which Ray resolves before the
call starts. Heartbeats alone run on a thread of their own (``heartbeat.py``). Every id,
offset and size a call carries is checked before it is used (``WireError``).
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

from polydev.errors import WireError

from .call_queue import MAX_PIECES
from .wire_checks import is_count

__all__ = ["BATCH_CALLS", "HEARTBEAT_GROUP", "RELEASES", "WIRE_VERSION", "DeviceActor",
           "catalogue"]

# the actor's second thread: the heartbeat starts there, never behind a computation (its
# default group has one thread, so the device's calls still run one at a time, in order)
HEARTBEAT_GROUP = "heartbeat"

# what a batch of calls may run: the device's own calls (each checks its arguments), never the
# batch itself or the heartbeat
BATCH_CALLS = frozenset({
    "memory", "alloc_size", "op_names", "supports_op", "alloc", "set_usage", "free", "write",
    "file_signature", "write_from_file", "read_pieces", "read", "memset", "clear", "copy",
    "set_numerics", "set_n_threads", "plan_create", "plan_compute", "plan_free", "marker", "info"})
RELEASES = frozenset({"plan_free"})       # run even after a failed call of their batch

# the calls and arguments the two sides exchange: bumped where they change (1: a call each,
# 2: batches), so a node of another build is refused as it connects
WIRE_VERSION = 2


def catalogue() -> dict[str, Any]:
    """What both sides must agree on: polydev's version, its ops and its types."""
    import polydev
    from polydev.ops import GluOp, Op, UnaryOp
    from polydev.types import GGMLType

    return {"version": polydev.__version__, "wire": WIRE_VERSION, "ops": [op.name for op in Op],
            "unary": [fn.name for fn in UnaryOp], "glu": [fn.name for fn in GluOp],
            "types": [t.name for t in GGMLType]}


def node_devices() -> list[dict[str, Any]]:
    """The devices of the node this runs on (a probe task, before the actors exist). The
    probe holds no GPU, so Ray hides the node's GPUs from it: they are counted from the
    node's resources instead."""
    _leave_ray_out()
    import polydev

    return [{"name": d.name, "type": int(d.type)} for d in polydev.devices()]


def _leave_ray_out() -> None:
    # The actor's polydev must not connect to Ray itself: only its node's own backends.
    os.environ.pop("POLYDEV_RAY_ADDRESS", None)


class DeviceActor:
    """One device of this node, its buffers, its stream and its plans."""

    def __init__(self, device_name: str) -> None:
        _leave_ray_out()
        import polydev

        self.device = polydev.device(device_name)
        self.backend = self.device.init_backend()
        self.buffers: dict[int, Any] = {}
        self.plans: dict[int, Any] = {}
        self._beating: Any = None             # the heartbeat thread's stop (threading.Event)

    # --- what the driver mirrors ---------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        import ray
        from polydev.buffer import BufferType
        from polydev.hooks import overrides

        buft = self.device.buffer_type
        free, total = self.device.memory()
        return {"catalogue": catalogue(), "name": self._public_name(),
                "description": self.device.description, "type": int(self.device.type),
                "alignment": buft.alignment, "max_size": buft.max_size,
                "pads_tensors": overrides(buft, BufferType, "_alloc_size"),
                "free": free, "total": total, "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "host": ray.util.get_node_ip_address()}

    def _public_name(self) -> str:
        """The device's name on its node: a GPU actor sees only the GPU Ray gave it (as
        CUDA0), so it is named by that GPU's id on the node."""
        import ray

        gpus = ray.get_gpu_ids()
        if self.device.name == "CUDA0" and len(gpus) == 1:
            return f"CUDA{gpus[0]}"
        return self.device.name

    def memory(self) -> tuple[int, int]:
        return self.device.memory()

    def alloc_size(self, fields: tuple) -> int:
        from .wire import loose_tensor
        from .wire_checks import check_shape_fields

        check_shape_fields(fields)
        return self.device.buffer_type.alloc_size(loose_tensor(fields))

    def op_names(self) -> list[str]:
        return self.device.supported_op_names()

    def supports_op(self, node_fields: tuple) -> bool:
        from .wire import loose_node
        from .wire_checks import check_node_signature

        check_node_signature(node_fields)
        return self.device.supports_op(loose_node(node_fields))

    # --- buffers ----------------------------------------------------------------------------------

    def alloc(self, buffer_id: int, size: int) -> None:
        max_size = self.device.buffer_type.max_size
        if not is_count(buffer_id) or buffer_id in self.buffers:
            raise WireError(f"buffer id {buffer_id!r} is taken or not an id")
        if not is_count(size) or size > max_size:
            raise WireError(f"a buffer of {size!r} bytes: a size is a count of bytes, at most "
                            f"the device's {max_size}")
        self.buffers[buffer_id] = self.device.buffer_type.alloc_buffer(size)

    def _bytes(self, buffer_id: int, offset: int, size: int) -> Any:
        """A byte tensor over ``size`` bytes at ``offset`` of a buffer, which must hold them."""
        buffer = self._buffer(buffer_id)
        if not (is_count(offset) and is_count(size) and offset + size <= buffer.size):
            raise WireError(f"bytes {offset!r} to {offset!r} + {size!r} are not within buffer "
                            f"{buffer_id}'s {buffer.size}")
        return _bytes_at(buffer, offset, size)

    def _buffer(self, buffer_id: int) -> Any:
        buffer = self.buffers.get(buffer_id) if is_count(buffer_id) else None
        if buffer is None:
            raise WireError(f"buffer {buffer_id!r} is not one of this device's")
        return buffer

    def _plan(self, plan_id: int) -> Any:
        plan = self.plans.get(plan_id) if is_count(plan_id) else None
        if plan is None:
            raise WireError(f"plan {plan_id!r} is not one of this device's")
        return plan

    def set_usage(self, buffer_id: int, usage: int) -> None:
        from polydev.buffer import BufferUsage

        if usage not in {int(u) for u in BufferUsage}:
            raise WireError(f"usage {usage!r} is not a buffer usage")
        self._buffer(buffer_id).usage = BufferUsage(usage)

    def free(self, buffer_id: int) -> None:
        buf = self.buffers.pop(buffer_id, None)
        if buf is not None:
            self.backend.synchronize()
            buf.close()

    def write(self, buffer_id: int, offset: int, data: np.ndarray, *after: Any) -> None:
        """Bytes into a buffer (``after``: events this write waits for, already resolved)."""
        if not isinstance(data, np.ndarray):
            raise WireError(f"a write carries bytes as a numpy array, not {type(data).__name__}")
        view = self._bytes(buffer_id, offset, data.nbytes)
        self.backend.synchronize()
        from polydev.buffer import tensor_set

        tensor_set(view, data)

    def file_signature(self, path: str) -> tuple[int, str] | None:
        """This node's copy of ``path``: its size and the digest of its first MiB (None
        where there is none)."""
        from .file_digest import file_signature

        return file_signature(path) if isinstance(path, str) else None

    def write_from_file(self, buffer_id: int, offset: int, path: str, file_offset: int,
                        size: int, digest: str) -> None:
        """Bytes from this node's copy of a file, checked against the digest of the
        driver's bytes (``file_digest``): bytes that differ are an error, never written."""
        from .file_digest import bytes_digest

        self._bytes(buffer_id, offset, size)          # the buffer holds them: then read
        if not (isinstance(path, str) and is_count(file_offset)):
            raise WireError("a file is read by its path, from a byte offset")
        failure: Exception | None = None
        try:                  # mapped: the bytes go from the page cache to the buffer once
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                data = np.frombuffer(m, np.uint8, count=max(0, min(size, len(m) - file_offset)),
                                     offset=min(file_offset, len(m)))
                try:
                    if len(data) != size or bytes_digest(data) != digest:
                        raise WireError(f"{path} on this node differs from the driver's at "
                                        f"bytes {file_offset}..{file_offset + size}")
                    self.write(buffer_id, offset, data)
                except Exception as e:    # raised once the map is closed: its frames hold
                    failure = e           # the mapped array, and a map with one cannot close
                    e.__traceback__ = None
                finally:
                    del data
        except (OSError, ValueError) as e:        # gone, unreadable, empty (mmap refuses)
            raise WireError(f"{path!r} cannot be read on this node: {e}") from None
        if failure is not None:
            raise failure

    def read_pieces(self, buffer_id: int, offset: int, sizes: list[int],
                    *after: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Consecutive pieces of ``sizes`` bytes from ``offset``, each its own return value
        (small enough for Ray to carry in its reply)."""
        if not (isinstance(sizes, list) and 0 < len(sizes) <= MAX_PIECES
                and all(is_count(n) for n in sizes)):
            raise WireError(f"a read in pieces needs a list of at most {MAX_PIECES} sizes")
        data = self.read(buffer_id, offset, sum(sizes))
        starts = np.cumsum([0, *sizes[:-1]])
        pieces = tuple(data[start:start + n] for start, n in zip(starts, sizes))
        return pieces if len(pieces) > 1 else pieces[0]

    def read(self, buffer_id: int, offset: int, size: int, *after: Any) -> np.ndarray:
        view = self._bytes(buffer_id, offset, size)
        self.backend.synchronize()
        from polydev.buffer import tensor_get

        return tensor_get(view)

    def memset(self, buffer_id: int, value: int, offset: int, size: int) -> None:
        view = self._bytes(buffer_id, offset, size)
        self.backend.synchronize()
        from polydev.buffer import tensor_memset

        tensor_memset(view, value)

    def clear(self, buffer_id: int, value: int) -> None:
        self.backend.synchronize()
        self._buffer(buffer_id).clear(value)

    def copy(self, src_id: int, src_offset: int, dst_id: int, dst_offset: int, size: int) -> None:
        """Within this device (both buffers are its own)."""
        src, dst = self._bytes(src_id, src_offset, size), self._bytes(dst_id, dst_offset, size)
        self.backend.synchronize()
        from polydev.buffer import tensor_copy

        tensor_copy(src, dst)

    # --- batches ----------------------------------------------------------------------------------

    def run(self, entries: list, *refs: Any) -> Any:
        """The calls of a batch (``call_queue.py``), in order: each ``(method, args, slots,
        values)`` runs ``method`` with ``args`` and, at each slot's position, the resolved
        argument it names. Returns None, then the values the calls answer with, as
        separate returns (one where there are none). A call that fails fails the batch: the
        calls after it do not run (they may need what it did), but those that release
        (``RELEASES``), and every answer of the batch raises its error."""
        from .wire_checks import check_batch

        check_batch(entries, len(refs), BATCH_CALLS)
        answers: list[Any] = []
        failure: Exception | None = None
        for method, args, slots, values in entries:
            if failure is not None and method not in RELEASES:
                continue                      # the calls after a failed one wait on it
            call_args = list(args)
            for position, index in slots:
                call_args.insert(position, refs[index])
            try:
                answer = getattr(self, method)(*call_args)
            except Exception as e:
                failure = failure or e
                continue
            if values == 1:
                answers.append(answer)
            elif values > 1:
                if not (isinstance(answer, tuple) and len(answer) == values):
                    raise WireError(f"{method} answers with one value, not {values}")
                answers.extend(answer)
        if failure is not None:
            raise failure
        return (None, *answers) if answers else None

    # --- compute ----------------------------------------------------------------------------------

    def set_numerics(self, numerics: str) -> None:
        """As the device's own reg says (a device with one way of computing has no proc)."""
        from polydev.numerics import set_backend_numerics

        if not isinstance(numerics, str):
            raise WireError("numerics are named by text")
        set_backend_numerics(self.backend, numerics)

    def set_n_threads(self, n_threads: int) -> None:
        """Through the device's own reg, as ggml's "set_n_threads" proc (a CPU's)."""
        from polydev.errors import UnsupportedError

        if not (is_count(n_threads) and n_threads >= 1):
            raise WireError(f"a thread count is an int >= 1, not {n_threads!r}")
        reg = self.device.reg
        proc = reg.get_proc_address("set_n_threads") if reg is not None else None
        if proc is None:
            raise UnsupportedError(f"{self.device.name} has no thread count to set")
        proc(self.backend, n_threads)

    def plan_create(self, plan_id: int, graph_fields: tuple) -> None:
        from .wire import graph_from
        from .wire_checks import check_graph_fields

        if not is_count(plan_id) or plan_id in self.plans:
            raise WireError(f"plan id {plan_id!r} is taken or not an id")
        check_graph_fields(graph_fields, self.buffers)
        graph = graph_from(graph_fields, self.buffers)
        self.plans[plan_id] = self.backend.graph_plan_create(graph)

    def plan_compute(self, plan_id: int, *after: Any) -> None:
        self.backend.graph_plan_compute(self._plan(plan_id))
        self.backend.synchronize()

    def plan_free(self, plan_id: int) -> None:
        plan = self.plans.pop(plan_id, None)
        if plan is not None:
            self.backend.graph_plan_free(plan)

    def marker(self, *after: Any) -> None:
        """A point in the stream: its ``ObjectRef`` is an event."""
        self.backend.synchronize()

    def start_heartbeat(self, collector: Any, key: str, period_s: float) -> None:
        """Send a beat to ``collector`` (``heartbeat.HeartbeatCollector``) every ``period_s``
        seconds from a thread of this process's own (called on ``HEARTBEAT_GROUP``: a stream
        busy or waiting does not hold it back); a beat started before stops."""
        import threading

        if not (isinstance(key, str) and isinstance(period_s, float) and period_s > 0):
            raise WireError("a heartbeat is sent under a key, every period of seconds")
        if self._beating is not None:
            self._beating.set()
        self._beating = stop = threading.Event()

        def beat() -> None:
            while not stop.wait(period_s):
                collector.beat.remote(key)
        collector.beat.remote(key)
        threading.Thread(target=beat, name="polydev-heartbeat", daemon=True).start()


def _bytes_at(buffer: Any, offset: int, size: int):
    """A raw byte tensor over ``size`` bytes of ``buffer`` at ``offset``."""
    from polydev import GGMLType, Op
    from polydev.tensor import Tensor

    t = Tensor(GGMLType.I8, (size, 1, 1, 1), (1, size, size, size), Op.NONE)
    t.buffer, t.offset = buffer, offset
    return t
