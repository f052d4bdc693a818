"""CPU memory: 64-byte-aligned numpy buffers, and buffers over existing host memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from polydev.buffer import Buffer, BufferType, HostArrayBuffer, wrap_host_memory
from polydev.errors import UnsupportedError

if TYPE_CHECKING:
    from .device import CPUDevice

ALIGNMENT = 64   # cache-line aligned base, and the alignment of every tensor in it


class CPUBuffer(HostArrayBuffer):
    """Host memory the CPU computes on; freeing it drops its decoded weights from the cache."""

    def _free(self) -> None:
        device: CPUDevice = self.buft.device
        device.weight_cache.forget(self)
        super()._free()


class CPUBufferType(BufferType):
    """The "CPU" buffer type: host memory owned by numpy, 64-byte aligned."""

    def __init__(self, device: "CPUDevice") -> None:
        super().__init__("CPU", device, alignment=ALIGNMENT, is_host=True)

    def _alloc(self, size: int) -> Buffer:
        raw = np.empty(size + ALIGNMENT, dtype=np.uint8)
        start = -raw.ctypes.data % ALIGNMENT
        return CPUBuffer(self, raw[start:start + size])


class CPUMappedBufferType(BufferType):
    """The "CPU_Mapped" buffer type of buffers over memory polydev does not own."""

    def __init__(self, device: "CPUDevice") -> None:
        super().__init__("CPU_Mapped", device, alignment=ALIGNMENT, is_host=True)

    def _alloc(self, size: int) -> Buffer:
        raise UnsupportedError("CPU_Mapped buffers wrap existing memory: use "
                               "device.buffer_from_host_ptr")

    def wrap(self, host: Any) -> Buffer:
        """A buffer over ``host`` (numpy array, memoryview, bytes, mmap) without copying."""
        return CPUBuffer(self, wrap_host_memory(host))
