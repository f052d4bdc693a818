"""CPU memory: 64-byte-aligned numpy buffers, and buffers over existing host memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from polydev.buffer import Buffer, BufferType, wrap_host_memory
from polydev.errors import UnsupportedError
from polydev.tensor import Tensor

ALIGNMENT = 64   # cache-line aligned base, and the alignment of every tensor in it


class HostBuffer(Buffer):
    """A buffer whose bytes are a numpy uint8 array (read and written without copies)."""

    def __init__(self, buft: BufferType, array: np.ndarray) -> None:
        super().__init__(buft, array.size)
        self._array: np.ndarray | None = array

    def _bytes(self, t: Tensor, offset: int, size: int) -> np.ndarray:
        start = t.offset + offset
        return self._array[start:start + size]

    def _set(self, t: Tensor, data: np.ndarray, offset: int) -> None:
        if not self._array.flags.writeable:
            raise UnsupportedError(f"buffer {self.name} wraps read-only memory")
        self._bytes(t, offset, data.size)[...] = data

    def _get(self, t: Tensor, out: np.ndarray, offset: int) -> None:
        out[...] = self._bytes(t, offset, out.size)

    def _memset(self, t: Tensor, value: int, offset: int, size: int) -> None:
        self._bytes(t, offset, size).fill(value)

    def _cpy(self, src: Tensor, dst: Tensor) -> bool:
        if src.buffer is None or not src.buffer.is_host:
            return False
        self._bytes(dst, 0, dst.nbytes)[...] = src.buffer.host_array[src.offset:src.offset + src.nbytes]
        return True

    def _clear(self, value: int) -> None:
        self._array.fill(value)

    def _host_array(self) -> np.ndarray:
        return self._array

    def _free(self) -> None:
        self._array = None


class CPUBufferType(BufferType):
    """The "CPU" buffer type: host memory owned by numpy, 64-byte aligned."""

    def __init__(self, device=None) -> None:
        super().__init__("CPU", device, alignment=ALIGNMENT, is_host=True)

    def _alloc(self, size: int) -> Buffer:
        raw = np.empty(size + ALIGNMENT, dtype=np.uint8)
        start = -raw.ctypes.data % ALIGNMENT
        return HostBuffer(self, raw[start:start + size])


class CPUMappedBufferType(BufferType):
    """The "CPU_Mapped" buffer type of buffers over memory polydev does not own."""

    def __init__(self, device=None) -> None:
        super().__init__("CPU_Mapped", device, alignment=ALIGNMENT, is_host=True)

    def _alloc(self, size: int) -> Buffer:
        raise UnsupportedError("CPU_Mapped buffers wrap existing memory: use "
                               "device.buffer_from_host_ptr")

    def wrap(self, host: Any) -> Buffer:
        """A buffer over ``host`` (numpy array, memoryview, bytes, mmap) without copying."""
        return HostBuffer(self, wrap_host_memory(host))
