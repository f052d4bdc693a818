"""A device on another host, seen through its Ray actor: the device, its buffer type, its
buffers and its events.

The buffer type mirrors the remote one (alignment, max size, and alloc sizes where the remote
pads tensors). A buffer is a handle: its id names the actor's buffer; reads and writes move
numpy bytes through Ray's object store and block, as ggml's ``tensor_set``/``tensor_get`` do;
a weight whose file the remote node has too is read there (``set_from_file``).
Which ops the device computes is the remote kernel table's answer, asked once per distinct
node shape.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from typing import Any

import numpy as np

from polydev.buffer import Buffer, BufferType, BufferUsage
from polydev.device import Device, DeviceType, Event
from polydev.errors import RemoteDeviceError
from polydev.tensor import Tensor

from .backend import RayBackend
from .calls import wait
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
        self.actor = actor
        self.remote_name = info["name"]
        self.type = DeviceType(info["type"])
        self._buft = RayBufferType(self, info)
        self._supports: dict[tuple, bool] = {}
        self._op_names: list[str] | None = None
        self._lost: str | None = None

    @property
    def lost(self) -> str | None:
        """Why the device is lost (its node or actor gone or stalled); None while it answers."""
        return self._lost

    def mark_lost(self, reason: str) -> None:
        """Take the device out of use: every wait on it raises ``RemoteDeviceError`` now."""
        if self._lost is None:
            self._lost = reason
            log.error("%s is lost: %s", self.name, reason)

    def call(self, ref: Any, what: str) -> Any:
        """Wait for one of this device's calls (see ``calls.wait``)."""
        return wait(self, ref, what)

    def memory(self) -> tuple[int, int]:
        free, total = self.call(self.actor.memory.remote(), "reading its memory")
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
            asked = self.actor.supports_op.remote(key)
            known = self._supports[key] = bool(self.call(asked, f"asking about {op.op.name}"))
        return known

    def supported_op_names(self) -> list[str]:
        if self._op_names is None:
            self._op_names = list(self.call(self.actor.op_names.remote(), "listing its ops"))
        return self._op_names

    def _event_new(self) -> Event:
        return RayEvent(self)


class RayEvent(Event):
    """An ``ObjectRef`` of the recording stream's last call: done when that call is."""

    def __init__(self, device: RayDevice) -> None:
        super().__init__(device)
        self.ref: Any = None

    def _synchronize(self) -> None:
        if self.ref is not None:
            self.device.call(self.ref, "waiting for an event")

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
            size = self._sizes[key] = int(device.call(device.actor.alloc_size.remote(key),
                                                      "sizing a tensor"))
        return size


class RayBuffer(Buffer):
    """A buffer of the remote device, named by its id on the actor."""

    def __init__(self, buft: RayBufferType, size: int) -> None:
        super().__init__(buft, size)
        self.device: RayDevice = buft.device        # type: ignore[assignment]
        self.remote_id = next(_buffer_ids)
        self.device.call(self.device.actor.alloc.remote(self.remote_id, size),
                         f"allocating {size / 2**20:.2f} MiB")

    @Buffer.usage.setter   # type: ignore[attr-defined]
    def usage(self, usage: BufferUsage) -> None:
        """The usage, on the actor's buffer too: a remote CPU keeps its weights' interleaved
        copies only in a buffer of weights, as a local one does."""
        Buffer.usage.fset(self, usage)        # type: ignore[attr-defined]
        self.device.call(self.device.actor.set_usage.remote(self.remote_id, int(self.usage)),
                         "setting a buffer's usage")

    def _set(self, tensor: Tensor, data: np.ndarray, offset: int) -> None:
        self.device.call(self.device.actor.write.remote(self.remote_id, tensor.offset + offset,
                                                        data), "writing a tensor")

    def _get(self, tensor: Tensor, out: np.ndarray, offset: int) -> None:
        data = self.device.call(self.device.actor.read.remote(
            self.remote_id, tensor.offset + offset, out.nbytes), "reading a tensor")
        out.reshape(-1).view(np.uint8)[:] = data

    def _set_from_file(self, tensor: Tensor, data: np.ndarray, path: str, offset: int) -> bool:
        """The actor reads its node's copy of the file when the bytes there hash as ``data``
        does; only the hash travels."""
        digest = hashlib.blake2b(data, digest_size=16).hexdigest()
        return bool(self.device.call(self.device.actor.write_from_file.remote(
            self.remote_id, tensor.offset, path, offset, data.nbytes, digest),
            f"reading {path} on {self.device.node}"))

    def _memset(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self.device.call(self.device.actor.memset.remote(self.remote_id, value,
                                                         tensor.offset + offset, size),
                         "setting bytes of a tensor")

    def _cpy(self, src: Tensor, dst: Tensor) -> bool:
        """From another buffer of a remote device: actor to actor, never through here."""
        source = src.buffer
        if not isinstance(source, RayBuffer):
            return False
        actor = self.device.actor
        if source.device is self.device:
            ref = actor.copy.remote(source.remote_id, src.offset, self.remote_id, dst.offset,
                                    src.nbytes)
        else:
            data = source.device.actor.read.remote(source.remote_id, src.offset, src.nbytes)
            ref = actor.write.remote(self.remote_id, dst.offset, data)
        self.device.call(ref, "copying a tensor")
        return True

    def _clear(self, value: int) -> None:
        self.device.call(self.device.actor.clear.remote(self.remote_id, value),
                         "clearing a buffer")

    def _free(self) -> None:
        try:
            self.device.call(self.device.actor.free.remote(self.remote_id), "freeing a buffer")
        except RemoteDeviceError:
            pass            # a lost device has nothing left to free
