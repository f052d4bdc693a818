"""A device on another host, seen through its Ray actor: the device, its buffer type, its
buffers and its events.

The buffer type mirrors the remote one (alignment, max size, and alloc sizes where the remote
pads tensors). A buffer is a handle: its id names the actor's buffer. A write returns once
Ray (or the queue) has copied its bytes, a read once its bytes are here, as ggml's
``tensor_set``/``tensor_get`` do (``call_queue.py`` says how few calls that takes); a weight
whose file the remote node has too is read there (``set_from_file``). Which ops the device
computes is the remote kernel table's answer, asked once per distinct node shape.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Sequence

import numpy as np

from polydev.buffer import Buffer, BufferType, BufferUsage
from polydev.device import Device, DeviceType, Event, lost_text
from polydev.errors import RemoteDeviceError
from polydev.tensor import Tensor

from .backend import RayBackend
from .call_queue import CallQueue
from .calls import wait
from .file_digest import bytes_digest, file_signature
from .wire import node_signature, tensor_shape

__all__ = ["RayBuffer", "RayBufferType", "RayDevice", "RayEvent"]

log = logging.getLogger(__name__)

_buffer_ids = itertools.count(1)


class RayDevice(Device):
    """``ray:<node>/<device>``: one device of one node, owned by one actor."""

    backend_class = RayBackend

    def __init__(self, node: str, actor: Any, info: dict[str, Any]) -> None:
        super().__init__(f"ray:{node}/{info['name']}", f"{info['description']} (on {node})")
        self.node = node
        self.node_id: str = info["node_id"]   # Ray's id of the node the actor runs on
        self.pid: int = info["pid"]           # the actor's process on that node
        self._host: str = info["host"]
        self.actor = actor
        self.remote_name = info["name"]
        self.type = DeviceType(info["type"])
        self._buft = RayBufferType(self, info)
        self._supports: dict[tuple, bool] = {}
        self._op_names: list[str] | None = None
        self._lost: str | None = None
        self.calls = CallQueue(actor)
        self._files: dict[str, bool] = {}     # path -> whether the node has the driver's file

    @property
    def host(self) -> str:
        """The node's address (nodes of one machine share it)."""
        return self._host

    @property
    def lost(self) -> str | None:
        """Why the device is lost (its node or actor gone or stalled); None while it answers."""
        return self._lost

    def mark_lost(self, reason: str) -> None:
        """Take the device out of use: every wait on it raises ``RemoteDeviceError`` now, and
        its actor is stopped (its node's CPUs and memory come back if the node does)."""
        if self._lost is None:
            self._lost = reason
            log.error("%s", lost_text(self.name, reason))
            import ray

            try:
                ray.kill(self.actor, no_restart=True)
            except Exception:                 # gone with its node already
                pass

    def remote(self, method: str, *args: Any, num_returns: int | None = None) -> Any:
        """Call the actor's ``method`` without waiting (see ``CallQueue.remote``)."""
        return self.calls.remote(method, *args, num_returns=num_returns)

    def write(self, buffer_id: int, offset: int, data: np.ndarray,
              after: Sequence[Any] = ()) -> Any:
        """Write ``data`` to a buffer after ``after`` without waiting for it
        (``CallQueue.write``: the write's completion, a Pending or an ``ObjectRef``); past
        POSTED_LIMIT bytes in flight, wait for them."""
        done = self.calls.write(buffer_id, offset, data, after)
        if self.calls.over_limit:
            self.call([], "writing")
        return done

    def post(self, ref: Any) -> None:
        """A call whose answer nothing needs; the device's next wait raises its failure."""
        self.calls.post(ref)

    def call(self, ref: Any, what: str) -> Any:
        """Wait for one of this device's calls (one ref or Pending, or a list; see
        ``calls.wait``), and for the calls posted before it, whose failure is raised here."""
        refs, n_posted = self.calls.with_posted(ref)
        if not refs:
            return []
        got = wait(self, refs, what)[n_posted:]
        return got if isinstance(ref, list) else got[0]

    def has_file(self, path: str) -> bool:
        """Whether the node has a copy of the driver's file at ``path`` (its size and first
        MiB alike; asked once per file)."""
        if path not in self._files:
            theirs = self.call(self.remote("file_signature", path), f"looking for {path}")
            mine = file_signature(path)
            self._files[path] = mine is not None and tuple(theirs or ()) == mine
        return self._files[path]

    def memory(self) -> tuple[int, int]:
        free, total = self.call(self.remote("memory"), "reading its memory")
        return int(free), int(total)

    @property
    def buffer_type(self) -> BufferType:
        return self._buft

    def supports_buft(self, buft: BufferType) -> bool:
        return buft is self._buft

    def supports_op(self, op: Tensor) -> bool:
        key = node_signature(op)
        known = self._supports.get(key)
        if known is None:
            asked = self.remote("supports_op", key)
            known = self._supports[key] = bool(self.call(asked, f"asking about {op.op.name}"))
        return known

    def supported_op_names(self) -> list[str]:
        if self._op_names is None:
            self._op_names = list(self.call(self.remote("op_names"), "listing its ops"))
        return self._op_names

    def _event_new(self) -> Event:
        return RayEvent(self)


class RayEvent(Event):
    """The completion of the recording stream's last call (a queued call's ``Pending``, or
    an ``ObjectRef``): done when that call is."""

    def __init__(self, device: RayDevice) -> None:
        super().__init__(device)
        self.ref: Any = None                  # a Pending, or an ObjectRef

    def _synchronize(self) -> None:
        # the event's call alone: the device's posted writes are no work of its stream, and
        # waiting for them here made each input written after an event a round trip
        if self.ref is not None:
            wait(self.device, self.ref, "waiting for an event")

    def _free(self) -> None:
        self.ref = None


class RayBufferType(BufferType):
    """The remote device's buffer type, mirrored."""

    def __init__(self, device: RayDevice, info: dict[str, Any]) -> None:
        super().__init__(device.name, device, alignment=int(info["alignment"]),
                         max_size=int(info["max_size"]))
        self._pads = bool(info["pads_tensors"])
        self._sizes: dict[tuple, int] = {}

    def _alloc(self, size: int) -> Buffer:
        return RayBuffer(self, size)

    def _alloc_size(self, tensor: Tensor) -> int:
        if not self._pads:
            return tensor.nbytes
        key = tensor_shape(tensor)
        size = self._sizes.get(key)
        if size is None:
            device: RayDevice = self.device       # type: ignore[assignment]
            size = self._sizes[key] = int(device.call(device.remote("alloc_size", key),
                                                      "sizing a tensor"))
        return size


class RayBuffer(Buffer):
    """A buffer of the remote device, named by its id on the actor."""

    def __init__(self, buft: RayBufferType, size: int) -> None:
        super().__init__(buft, size)
        self.device: RayDevice = buft.device        # type: ignore[assignment]
        self.remote_id = next(_buffer_ids)
        self.device.call(self.device.remote("alloc", self.remote_id, size),
                         f"allocating {size / 2**20:.2f} MiB")

    # the usage goes to the actor's buffer too: a remote CPU keeps its weights' interleaved
    # copies only in a buffer of weights, as a local one does
    @Buffer.usage.setter   # type: ignore[attr-defined]
    def usage(self, usage: BufferUsage) -> None:
        Buffer.usage.fset(self, usage)        # type: ignore[attr-defined]
        self.device.call(self.device.remote("set_usage", self.remote_id, int(self.usage)),
                         "setting a buffer's usage")

    def _set(self, tensor: Tensor, data: np.ndarray, offset: int) -> None:
        self.device.write(self.remote_id, tensor.offset + offset, data)

    def _get(self, tensor: Tensor, out: np.ndarray, offset: int) -> None:
        reads = self.device.calls.read(self.remote_id, tensor.offset + offset, out)
        pieces = self.device.call([ref for ref, _ in reads], "reading a tensor")
        for (_, place), data in zip(reads, pieces):
            place[:] = data

    def _set_from_file(self, tensor: Tensor, data: np.ndarray, path: str, offset: int) -> bool:
        """The actor reads its node's copy of the file, where the node has the driver's file
        (``file_digest``); only offsets and the digest of the bytes travel, and nothing
        waits: the actor checks the bytes it read against the digest as this process hashes
        the next weight."""
        if not self.device.has_file(path):
            return False
        self.device.post(self.device.remote("write_from_file", self.remote_id, tensor.offset,
                                            path, offset, data.nbytes, bytes_digest(data)))
        return True

    def _memset(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.device.call(self.device.remote("memset", self.remote_id, value,
                                            tensor.offset + offset, size),
                         "setting bytes of a tensor")

    def _cpy(self, src: Tensor, dst: Tensor) -> bool:
        """From another buffer of a remote device: actor to actor, never through here."""
        source = src.buffer
        if not isinstance(source, RayBuffer):
            return False
        device = self.device
        if source.device is device:
            ref = device.remote("copy", source.remote_id, src.offset, self.remote_id, dst.offset,
                                src.nbytes)
        else:
            data = source.device.remote("read", source.remote_id, src.offset, src.nbytes)
            ref = device.remote("write", self.remote_id, dst.offset, data)
        self.device.call(ref, "copying a tensor")
        return True

    def _clear(self, value: int) -> None:
        self.device.call(self.device.remote("clear", self.remote_id, value),
                         "clearing a buffer")

    def _free(self) -> None:
        try:
            self.device.call(self.device.remote("free", self.remote_id), "freeing a buffer")
        except RemoteDeviceError as e:
            if self.device.lost is None:      # a call before it failed: say so, free on
                log.error("freeing a buffer of %s: %s", self.device.name, e)
