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
from .file_digest import bytes_digest, file_signature
from .wire import node_signature, tensor_shape

__all__ = ["RayBuffer", "RayBufferType", "RayDevice", "RayEvent"]

log = logging.getLogger(__name__)

_buffer_ids = itertools.count(1)
# below Ray's max_direct_call_object_size (100 KiB by default): a reply carries the bytes
READ_PIECE_BYTES = 96 << 10
MAX_PIECES = 16
HELD_WRITE_BYTES = 64 << 10     # writes held back for the actor's next call, at most


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
        self._posted: list[Any] = []          # refs of calls not waited for (see post)
        self._held: list[tuple[int, int, np.ndarray]] = []     # writes not sent yet
        self._held_bytes = 0
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
        """Take the device out of use: every wait on it raises ``RemoteDeviceError`` now."""
        if self._lost is None:
            self._lost = reason
            log.error("%s is lost: %s", self.name, reason)

    def remote(self, method: str, *args: Any, num_returns: int | None = None) -> Any:
        """Call the actor's ``method`` without waiting (its ``ObjectRef``), after the writes
        held back for it (``write``): the actor runs them first, in one call."""
        self.flush()
        call = getattr(self.actor, method)
        if num_returns is not None:
            call = call.options(num_returns=num_returns)
        return call.remote(*args)

    def write(self, buffer_id: int, offset: int, data: np.ndarray) -> None:
        """Write ``data`` to a buffer, as a call whose answer nothing waits for. A small write
        is copied and held back until the actor's next call, which carries it (a decode
        step's few inputs were a call each, 130 µs of the actor's time apiece); a large one
        is sent at once (Ray copies its bytes as the call is made)."""
        if data.nbytes > HELD_WRITE_BYTES:
            self.post(self.remote("write", buffer_id, offset, data))
            return
        self._held.append((buffer_id, offset, np.array(data, copy=True)))
        self._held_bytes += data.nbytes
        if self._held_bytes > HELD_WRITE_BYTES:
            self.flush()

    def has_file(self, path: str) -> bool:
        """Whether the node has a copy of the driver's file at ``path`` (its size and first
        MiB alike; asked once per file)."""
        if path not in self._files:
            theirs = self.call(self.remote("file_signature", path), f"looking for {path}")
            mine = file_signature(path)
            self._files[path] = mine is not None and tuple(theirs or ()) == mine
        return self._files[path]

    @property
    def unsettled(self) -> bool:
        """Whether calls were made that no wait has answered yet (posted or held back)."""
        return bool(self._posted or self._held)

    def flush(self) -> None:
        """Send the held-back writes, in one call."""
        if self._held:
            held, self._held, self._held_bytes = self._held, [], 0
            self.post(self.actor.write_many.remote(held))

    def call(self, ref: Any, what: str) -> Any:
        """Wait for one of this device's calls (see ``calls.wait``), and for the posted calls
        before it, whose failure is raised here."""
        self.flush()
        posted, self._posted = self._posted, []
        if not posted:
            return wait(self, ref, what)
        if isinstance(ref, list):
            return wait(self, [*posted, *ref], what)[len(posted):]
        return wait(self, [*posted, ref], what)[-1]

    def post(self, ref: Any) -> None:
        """A call whose answer nothing needs (a write of host bytes, which Ray copied when
        the call was made, so the caller may change them at once): it runs in the actor's
        order before every later call, and the device's next wait raises its failure. A
        blocking write per input tensor was a round trip each (6 of a decode step's 11)."""
        self._posted.append(ref)

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
    """An ``ObjectRef`` of the recording stream's last call: done when that call is."""

    def __init__(self, device: RayDevice) -> None:
        super().__init__(device)
        self.ref: Any = None

    def _synchronize(self) -> None:
        # the event's call alone: the device's posted writes are no work of its stream, and
        # waiting for them here made each input written after an event a round trip
        if self.ref is not None:
            wait(self.device, self.ref, "waiting for an event")

    def _free(self) -> None:
        self.ref = None


def read_in_pieces(device: RayDevice, buffer_id: int, offset: int, out: np.ndarray,
                   *after: Any) -> list[tuple[Any, np.ndarray]]:
    """One call reading ``out.nbytes`` bytes at ``offset`` of the actor's buffer: (each
    returned piece's ref, the bytes of ``out`` it fills). Up to MAX_PIECES pieces small enough
    for Ray to return each in its reply; a larger return goes through the object stores of
    both nodes, which took 5 ms for a decode step's 196 KB of logits against about 1 ms in
    pieces, and is what a read of more than a few pieces takes (683 returns of one call
    moved 64 MiB at a tenth of the object store's rate)."""
    flat = out.reshape(-1).view(np.uint8)
    if len(flat) > READ_PIECE_BYTES * MAX_PIECES:
        return [(device.remote("read", buffer_id, offset, len(flat), *after), flat)]
    places = [flat[start:start + READ_PIECE_BYTES]
              for start in range(0, max(len(flat), 1), READ_PIECE_BYTES)]
    refs = device.remote("read_pieces", buffer_id, offset, [len(p) for p in places], *after,
                         num_returns=len(places))
    return list(zip(refs if len(places) > 1 else [refs], places))


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

    @Buffer.usage.setter   # type: ignore[attr-defined]
    def usage(self, usage: BufferUsage) -> None:
        """The usage, on the actor's buffer too: a remote CPU keeps its weights' interleaved
        copies only in a buffer of weights, as a local one does."""
        Buffer.usage.fset(self, usage)        # type: ignore[attr-defined]
        self.device.call(self.device.remote("set_usage", self.remote_id, int(self.usage)),
                         "setting a buffer's usage")

    def _set(self, tensor: Tensor, data: np.ndarray, offset: int) -> None:
        self.device.write(self.remote_id, tensor.offset + offset, data)

    def _get(self, tensor: Tensor, out: np.ndarray, offset: int) -> None:
        reads = read_in_pieces(self.device, self.remote_id, tensor.offset + offset, out)
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
        except RemoteDeviceError:
            pass            # a lost device has nothing left to free
