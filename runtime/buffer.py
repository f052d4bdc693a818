"""Buffer types, buffers and the tensor data functions (ggml-backend's buffer layer).

``BufferType`` is a memory kind, ``Buffer`` a range of it; a tensor lives at ``(buffer,
offset)``. The public functions here own every check (allocated, in bounds, not closed, the
bytes' length) and then call the hooks a backend overrides, the methods named with a leading
underscore. An optional hook falls back as below (the rule of ``polydev.hooks``).

  BufferType  (name, device, alignment, max_size, is_host)   its data, given to __init__
              _alloc(size) -> Buffer          required
              _alloc_size(tensor) -> int      optional  tensor.nbytes (never less)
  Buffer      _set(t, data, offset)           required  data: uint8 bytes, range checked
              _get(t, out, offset)            required  out: C-contiguous uint8, range checked
              _clear(value)                   required  every byte of the buffer
              _host_array() -> np.ndarray     required  where the buffer type is_host
              _memset(t, value, offset, n)    optional  a _set of n bytes of value
              _cpy(src, dst) -> bool          optional  may decline (False); else tensor_copy
                                                        stages the bytes through the host
              _set_from_file(t, data, path, offset) -> bool
                                              optional  False: the caller writes data itself
              _init_tensor(t), _reset()       optional  nothing
              _free()                         optional  nothing

Host memory needs none of that: ``HostArrayBuffer`` implements every hook over a numpy uint8
array. A backend whose device may still be working on those bytes (pinned memory of a GPU
stream) overrides its one hook ``_wait``, called before the host touches them.
"""

from __future__ import annotations

import enum
import itertools
import sys
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .errors import (AllocationError, InvalidArgumentError, NotAllocatedError,
                     OutOfBoundsError, ShapeError, UnsupportedError)
from .hooks import overrides
from .lifetime import Resource
from .tensor import Tensor

if TYPE_CHECKING:
    from .device import Device


class BufferUsage(enum.IntEnum):
    """What a buffer holds; the scheduler places ops by where WEIGHTS live."""

    ANY = 0
    WEIGHTS = 1
    COMPUTE = 2


class BufferType:
    """A kind of memory: where buffers come from, their alignment and maximum size."""

    def __init__(self, name: str, device: "Device | None" = None, alignment: int = 32,
                 max_size: int = sys.maxsize, is_host: bool = False) -> None:
        self.name = name
        self.device = device
        self.alignment = alignment
        self.max_size = max_size
        self.is_host = is_host

    def alloc_buffer(self, size: int) -> "Buffer":
        """A new buffer of ``size`` bytes; size 0 gives a dummy buffer, as in ggml."""
        if size < 0:
            raise AllocationError(f"{self.name}: cannot allocate a buffer of {size} bytes")
        if size == 0:
            return DummyBuffer(self)
        try:
            return self._alloc(size)
        except MemoryError as e:
            if isinstance(e, AllocationError):
                raise
            raise AllocationError(f"{self.name}: failed to allocate {size / 2**20:.2f} MiB") from e

    def alloc_size(self, tensor: Tensor) -> int:
        """Bytes ``tensor`` needs in this memory (at least its nbytes)."""
        if not overrides(self, BufferType, "_alloc_size"):
            return tensor.nbytes
        size = self._alloc_size(tensor)
        assert size >= tensor.nbytes, f"{self.name}: alloc size {size} < nbytes {tensor.nbytes}"
        return size

    # --- hooks ------------------------------------------------------------------------------

    def _alloc(self, size: int) -> "Buffer":
        raise NotImplementedError

    def _alloc_size(self, tensor: Tensor) -> int:
        return tensor.nbytes

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name!r}, alignment={self.alignment}, "
                f"host={self.is_host})")


_buffer_ids = itertools.count(1)


class Buffer(Resource):
    """A range of memory of one buffer type; a context manager (``close()`` frees it)."""

    def __init__(self, buft: BufferType, size: int) -> None:
        self.buft = buft
        self.size = size
        # Unique for the life of the process (``id()`` is reused once a buffer is freed), so
        # caches of derived data can key on it.
        self.uid = next(_buffer_ids)
        self._usage = BufferUsage.ANY
        # Bumped by every write through this API; caches of derived data (e.g. dequantized
        # weights) compare it to know they are stale.
        self.generation = 0

    @property
    def name(self) -> str:
        """The buffer type's name."""
        return self.buft.name

    @property
    def alignment(self) -> int:
        """The buffer type's alignment."""
        return self.buft.alignment

    @property
    def max_size(self) -> int:
        """The buffer type's largest buffer."""
        return self.buft.max_size

    @property
    def is_host(self) -> bool:
        """Whether the bytes are host memory the CPU reads in place."""
        return self.buft.is_host

    @property
    def is_multi_buffer(self) -> bool:
        """Whether this buffer groups several (alloc_ctx_tensors past max_size)."""
        return False

    @property
    def usage(self) -> BufferUsage:
        """What the buffer holds (ANY, WEIGHTS, COMPUTE); the scheduler reads WEIGHTS."""
        return self._usage

    @usage.setter
    def usage(self, usage: BufferUsage) -> None:
        self._usage = _usage(usage)

    def alloc_size(self, tensor: Tensor) -> int:
        """Bytes ``tensor`` needs in this buffer's memory."""
        return self.buft.alloc_size(tensor)

    @property
    def host_array(self) -> np.ndarray:
        """The buffer's bytes as a uint8 numpy array (host buffer types only; no copy)."""
        self._check_open()
        if not self.is_host:
            raise UnsupportedError(f"buffer {self.name} is not in host memory")
        return self._host_array()

    def clear(self, value: int = 0) -> None:
        """Set every byte of the buffer to ``value``."""
        self._check_open()
        if self.size:
            self._clear(value & 0xFF)
            self.mark_modified()

    def reset(self) -> None:
        """Drop per-tensor state created by init_tensor (the graph allocator calls this)."""
        self._check_open()
        self._reset()

    def init_tensor(self, tensor: Tensor) -> None:
        """Let the backend set up per-tensor state for ``tensor`` (ggml's init_tensor)."""
        self._init_tensor(tensor)

    def mark_modified(self) -> None:
        """Tell caches that the bytes changed (needed after writing ``host_array`` directly)."""
        self.generation += 1

    def set_from_file(self, tensor: Tensor, data: np.ndarray, path: str, offset: int) -> bool:
        """Write ``data``, the bytes of the file at ``path`` from byte ``offset``, into
        ``tensor`` by reading them where this buffer's memory is, when it can: a buffer on
        another host reads that host's copy of the file, if its bytes there hash the same
        (ggml's RPC SET_TENSOR_HASH). False when it did not; the caller then writes
        ``data`` itself."""
        self._check_open()
        if not overrides(self, Buffer, "_set_from_file"):
            return False
        check_range(tensor, 0, data.nbytes, "set_from_file")
        written = self._set_from_file(tensor, data, path, offset)
        if written:
            self.generation += 1
        return written

    def _describe(self) -> str:
        return f"buffer {self.name} ({self.size} bytes)"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, size={self.size}, usage={self.usage.name})"

    # --- hooks ------------------------------------------------------------------------------

    def _set(self, tensor: Tensor, data: np.ndarray, offset: int) -> None:
        raise NotImplementedError

    def _get(self, tensor: Tensor, out: np.ndarray, offset: int) -> None:
        raise NotImplementedError

    def _memset(self, tensor: Tensor, value: int, offset: int, size: int) -> None:
        self._set(tensor, np.full(size, value, dtype=np.uint8), offset)

    def _cpy(self, src: Tensor, dst: Tensor) -> bool:
        return False

    def _set_from_file(self, tensor: Tensor, data: np.ndarray, path: str, offset: int) -> bool:
        return False

    def _clear(self, value: int) -> None:
        raise NotImplementedError

    def _host_array(self) -> np.ndarray:
        raise NotImplementedError

    def _init_tensor(self, tensor: Tensor) -> None:
        pass

    def _reset(self) -> None:
        pass

    def _free(self) -> None:
        pass


def _usage(usage) -> BufferUsage:
    try:
        return BufferUsage(usage)
    except ValueError:
        names = ", ".join(f"{u.name} ({u.value})" for u in BufferUsage)
        message = f"buffer usage must be one of {names}, got {usage!r}"
        raise InvalidArgumentError(message) from None


class HostArrayBuffer(Buffer):
    """A buffer whose bytes are a numpy uint8 array, read and written without copies.

    ``_wait`` is the one hook: where a device may still be reading or writing these bytes
    (pinned memory of a GPU stream), it waits for that device before the host touches them.
    """

    def __init__(self, buft: BufferType, array: np.ndarray) -> None:
        super().__init__(buft, array.size)
        self._array: np.ndarray | None = array

    def _wait(self) -> None:
        """Let every device that may touch these bytes finish (none: plain host memory)."""

    def _bytes(self, t: Tensor, offset: int, size: int) -> np.ndarray:
        start = t.offset + offset
        return self._array[start:start + size]

    def _writable(self) -> np.ndarray:
        if not self._array.flags.writeable:
            raise UnsupportedError(f"buffer {self.name} wraps read-only memory")
        self._wait()
        return self._array

    def _set(self, t: Tensor, data: np.ndarray, offset: int) -> None:
        self._writable()
        self._bytes(t, offset, data.size)[...] = data

    def _get(self, t: Tensor, out: np.ndarray, offset: int) -> None:
        self._wait()
        out[...] = self._bytes(t, offset, out.size)

    def _memset(self, t: Tensor, value: int, offset: int, size: int) -> None:
        self._writable()
        self._bytes(t, offset, size).fill(value)

    def _clear(self, value: int) -> None:
        self._writable().fill(value)

    def _host_array(self) -> np.ndarray:
        self._wait()
        return self._array

    def _free(self) -> None:
        self._wait()
        self._array = None


class DummyBuffer(Buffer):
    """The size-0 buffer ggml returns for ``alloc_buffer(0)``: valid, holds nothing."""

    def __init__(self, buft: BufferType) -> None:
        super().__init__(buft, 0)

    def _set(self, t: Tensor, data: np.ndarray, offset: int) -> None:
        raise OutOfBoundsError(f"buffer {self.name} of size 0 holds no tensor")

    def _get(self, t: Tensor, out: np.ndarray, offset: int) -> None:
        raise OutOfBoundsError(f"buffer {self.name} of size 0 holds no tensor")

    def _clear(self, value: int) -> None:
        pass

    def _host_array(self) -> np.ndarray:
        return np.empty(0, dtype=np.uint8)


class MultiBuffer(Buffer):
    """Several buffers of one type acting as one (alloc_ctx_tensors past a max size).

    Tensors live in the child buffers; the multi-buffer forwards usage, clear and close.
    """

    def __init__(self, buffers: Sequence[Buffer]) -> None:
        if not buffers:
            raise AllocationError("a multi-buffer needs at least one buffer")
        super().__init__(buffers[0].buft, sum(b.size for b in buffers))
        self.buffers = list(buffers)

    @property
    def is_multi_buffer(self) -> bool:
        """True."""
        return True

    @Buffer.usage.setter   # type: ignore[attr-defined]
    def usage(self, usage: BufferUsage) -> None:
        """The usage, set on every child buffer."""
        self._usage = _usage(usage)
        for b in self.buffers:
            b.usage = self._usage

    def _clear(self, value: int) -> None:
        for b in self.buffers:
            b.clear(value)

    def _host_array(self) -> np.ndarray:
        raise UnsupportedError("a multi-buffer has no single host view; use its buffers")

    def _free(self) -> None:
        for b in self.buffers:
            b.close()


# --- tensor data (ggml_backend_tensor_set / get / memset / copy) --------------------------------

def data_buffer(t: Tensor) -> Buffer:
    """The open buffer holding ``t``'s bytes (its view source's for a view); a typed error
    where ``t`` is not allocated or its buffer was closed."""
    buf = t.view_src.buffer if t.view_src is not None else t.buffer
    if buf is None or t.buffer is None:
        raise NotAllocatedError(f"tensor {t.name or '<unnamed>'} ne={list(t.ne)} is not allocated")
    buf._check_open()
    return buf


def check_range(t: Tensor, offset: int, size: int, what: str) -> None:
    """That bytes [offset, offset + size) lie within ``t`` (ggml asserts it), the offset a
    whole number; a typed error naming the tensor otherwise."""
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise InvalidArgumentError(f"{what}: the byte offset must be an integer, got "
                                   f"{type(offset).__name__}")
    if offset < 0 or size < 0 or offset + size > t.nbytes:
        raise OutOfBoundsError(f"{what} of bytes [{offset}, {offset + size}) is outside tensor "
                               f"{t.name or '<unnamed>'} ({t.nbytes} bytes)")


def output_bytes(out, what: str) -> np.ndarray:
    """``out``, a writable C-contiguous numpy array, as flat uint8 (no copy): where a read
    lands. A typed error for anything else (a copy would lose what is read into it)."""
    if not isinstance(out, np.ndarray):
        raise InvalidArgumentError(f"{what} reads into a numpy array, got {type(out).__name__}")
    if not out.flags.c_contiguous:
        raise ShapeError(f"{what} needs a C-contiguous output array, got strides {out.strides}")
    if not out.flags.writeable:
        raise InvalidArgumentError(f"{what}: the output array is read-only")
    return out.reshape(-1).view(np.uint8)



def as_bytes(data) -> np.ndarray:
    """Any buffer-protocol object (a numpy array of any dtype, bytes, memoryview) as a flat
    uint8 array, without a copy where its bytes are contiguous."""
    try:
        if isinstance(data, np.ndarray):
            if data.dtype.hasobject:
                raise TypeError("an array of Python objects has no raw bytes")
            return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        return np.frombuffer(data, dtype=np.uint8)
    except (TypeError, ValueError) as e:
        message = f"cannot use {type(data).__name__} as raw bytes: {e}"
        raise InvalidArgumentError(message) from None


def tensor_set(t: Tensor, data, offset: int = 0) -> None:
    """Write raw bytes (any buffer-protocol object) into ``t`` at byte ``offset``; blocking."""
    raw = as_bytes(data)
    buf = data_buffer(t)
    if raw.size == 0:
        return
    check_range(t, offset, raw.size, "write")
    buf._set(t, raw, offset)
    buf.generation += 1


def tensor_get(t: Tensor, offset: int = 0, size: int | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
    """Read ``size`` raw bytes (default: to the end of ``t``) into ``out`` or a new uint8 array."""
    buf = data_buffer(t)
    if size is None:
        size = (out.nbytes if out is not None else t.nbytes - offset)
    check_range(t, offset, size, "read")
    if out is None:
        out = np.empty(size, dtype=np.uint8)
    elif out.nbytes != size:
        raise ShapeError(f"output array has {out.nbytes} bytes, the read has {size}")
    target = out.reshape(-1).view(np.uint8) if out.flags.c_contiguous else None
    if target is None:
        raise ShapeError("tensor_get needs a C-contiguous output array")
    if size:
        buf._get(t, target, offset)
    return out


def tensor_memset(t: Tensor, value: int, offset: int = 0, size: int | None = None) -> None:
    """Set ``size`` bytes of ``t`` (default: all) to ``value``."""
    buf = data_buffer(t)
    if size is None:
        size = t.nbytes - offset
    check_range(t, offset, size, "memset")
    if size:
        buf._memset(t, value & 0xFF, offset, size)
        buf.generation += 1


def tensor_set_2d(t: Tensor, data, offset: int, size: int, n_copies: int, stride_tensor: int,
                  stride_data: int) -> None:
    """Write ``n_copies`` rows of ``size`` bytes, strided on both sides."""
    raw = as_bytes(data)
    if n_copies <= 0 or size == 0:
        return
    check_range(t, offset, (n_copies - 1) * stride_tensor + size, "2-d write")
    for i in range(n_copies):   # ggml's fallback: one set per row
        tensor_set(t, raw[i * stride_data:i * stride_data + size], offset + i * stride_tensor)


def tensor_get_2d(t: Tensor, out: np.ndarray, offset: int, size: int, n_copies: int,
                  stride_tensor: int, stride_data: int) -> None:
    """Read ``n_copies`` rows of ``size`` bytes into ``out`` (uint8), strided on both sides."""
    if n_copies <= 0 or size == 0:
        return
    check_range(t, offset, (n_copies - 1) * stride_tensor + size, "2-d read")
    flat = out.reshape(-1).view(np.uint8)
    for i in range(n_copies):
        row = flat[i * stride_data:i * stride_data + size]
        tensor_get(t, offset + i * stride_tensor, size, row)


def wrap_host_memory(host) -> np.ndarray:
    """User memory (numpy array, memoryview, bytes, mmap) as a flat uint8 array, no copy: what
    ``buffer_from_host_ptr`` implementations wrap. Read-only memory stays read-only."""
    if isinstance(host, np.ndarray):
        if not host.flags.c_contiguous:
            raise InvalidArgumentError("buffer_from_host_ptr needs C-contiguous memory, got an "
                                       f"array with strides {host.strides}")
        return host.reshape(-1).view(np.uint8)
    try:
        return np.frombuffer(host, dtype=np.uint8)
    except (TypeError, ValueError) as e:
        message = f"cannot wrap {type(host).__name__} as host memory: {e}"
        raise InvalidArgumentError(message) from None


def host_bytes(t: Tensor) -> np.ndarray:
    """The bytes of a host-resident tensor as a uint8 view (no copy)."""
    buf = data_buffer(t)
    return buf.host_array[t.offset:t.offset + t.nbytes]


def tensor_copy(src: Tensor, dst: Tensor) -> None:
    """Copy ``src``'s bytes to ``dst`` (same layout), trying ggml's paths in order:
    host source, host destination, the destination buffer's own copy, then host staging."""
    if not src.same_layout(dst):
        raise ShapeError(f"tensor_copy needs the same layout: {src.name or 'src'} "
                         f"{src.type} ne={list(src.ne)} nb={list(src.nb)} vs {dst.name or 'dst'} "
                         f"{dst.type} ne={list(dst.ne)} nb={list(dst.nb)}")
    if src is dst:
        return
    sbuf, dbuf = data_buffer(src), data_buffer(dst)
    if sbuf.is_host:
        tensor_set(dst, host_bytes(src))
    elif dbuf.is_host:
        tensor_get(src, out=host_bytes(dst))
        dbuf.generation += 1
    elif dbuf._cpy(src, dst):
        dbuf.generation += 1
    else:
        tensor_set(dst, tensor_get(src))
