"""OpenCL memory: device buffers, pinned host buffers, and buffers over user memory.

A tensor is addressed as (cl.Buffer, byte offset): kernels take the offset as an argument, so
no sub-buffers (and no alignment rule of theirs) are involved. Blocking transfers first wait
for every queue of the platform's context, so they see all work queued before them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from polydev.buffer import Buffer, BufferType, HostArrayBuffer, wrap_host_memory
from polydev.errors import AllocationError, UnsupportedError
from polydev.tensor import Tensor

if TYPE_CHECKING:
    from .device import OpenCLDevice
    from .platform import PlatformContext


class CLMemory:
    """What kernels and copies need of any OpenCL buffer: its cl.Buffer and its device."""

    cl_buffer: Any
    device: "OpenCLDevice"


def cl_memory(buf: Buffer | None, platform: "PlatformContext") -> Any:
    """The cl.Buffer of ``buf`` where it is OpenCL memory of ``platform``'s context, else None."""
    if isinstance(buf, CLMemory) and buf.device.platform is platform:
        return buf.cl_buffer
    return None


class OpenCLBuffer(CLMemory, Buffer):
    """Device memory: one cl.Buffer; reads and writes go through the device's transfer queue."""

    def __init__(self, buft: BufferType, size: int, cl_buffer: Any, device: "OpenCLDevice",
                 accounted: bool = True, writable: bool = True) -> None:
        super().__init__(buft, size)
        self.cl_buffer = cl_buffer
        self.device = device
        self._accounted = accounted
        self._writable = writable

    @property
    def _cl(self):
        return self.device.cl

    def _queue(self):
        self.device.platform.finish_all()
        return self.device.transfer_queue

    def _set(self, t: Tensor, data: np.ndarray, offset: int) -> None:
        if not self._writable:
            raise UnsupportedError(f"buffer {self.name} wraps read-only memory")
        self._cl.enqueue_copy(self._queue(), self.cl_buffer, data, dst_offset=t.offset + offset,
                              is_blocking=True)

    def _get(self, t: Tensor, out: np.ndarray, offset: int) -> None:
        self._cl.enqueue_copy(self._queue(), out, self.cl_buffer, src_offset=t.offset + offset,
                              is_blocking=True)

    def _memset(self, t: Tensor, value: int, offset: int, size: int) -> None:
        self._fill(value, t.offset + offset, size)

    def _clear(self, value: int) -> None:
        self._fill(value, 0, self.size)

    def _fill(self, value: int, offset: int, size: int) -> None:
        if not self._writable:
            raise UnsupportedError(f"buffer {self.name} wraps read-only memory")
        self._cl.enqueue_fill_buffer(self._queue(), self.cl_buffer, np.uint8(value), offset,
                                     size).wait()

    def _cpy(self, src: Tensor, dst: Tensor) -> bool:
        """A device-side copy when the source is OpenCL memory of the same context."""
        source = cl_memory(src.buffer, self.device.platform)
        if source is None:
            return False
        self._cl.enqueue_copy(self._queue(), self.cl_buffer, source, byte_count=src.nbytes,
                              src_offset=src.offset, dst_offset=dst.offset).wait()
        return True

    def _free(self) -> None:
        self.device.platform.finish_all()
        self.cl_buffer.release()
        self.cl_buffer = None
        if self._accounted:
            self.device.account(-self.size)


class OpenCLHostBuffer(CLMemory, HostArrayBuffer):
    """Pinned host memory (ALLOC_HOST_PTR), mapped once: the host reads and writes it as a
    numpy array, and copies to device buffers come from pinned pages."""

    def __init__(self, buft: BufferType, cl_buffer: Any, device: "OpenCLDevice",
                 mapped: np.ndarray) -> None:
        super().__init__(buft, mapped)
        self.cl_buffer = cl_buffer
        self.device = device

    def _wait(self) -> None:
        self.device.platform.finish_all()    # kernels and copies of any queue may use it

    def _free(self) -> None:
        mapping = self._array.base
        super()._free()
        mapping.release(self.device.transfer_queue)
        self.cl_buffer.release()
        self.cl_buffer = None


class OpenCLBufferType(BufferType):
    """Device memory of one OpenCL device ("OpenCL0")."""

    def __init__(self, device: "OpenCLDevice") -> None:
        super().__init__(device.name, device, alignment=device.alignment,
                         max_size=device.max_alloc_size)

    def _alloc(self, size: int) -> Buffer:
        dev: OpenCLDevice = self.device
        cl = dev.cl
        try:
            buf = cl.Buffer(dev.platform.context, cl.mem_flags.READ_WRITE, size)
        except cl.Error as e:
            message = f"{self.name}: cannot allocate {size / 2**20:.2f} MiB: {e}"
            raise AllocationError(message) from None
        dev.account(size)
        return OpenCLBuffer(self, size, buf, dev)


class OpenCLHostBufferType(BufferType):
    """Pinned host memory of an OpenCL device's context ("OpenCL0_Host"): is_host."""

    def __init__(self, device: "OpenCLDevice") -> None:
        super().__init__(f"{device.name}_Host", device, alignment=device.alignment,
                         max_size=device.max_alloc_size, is_host=True)

    def _alloc(self, size: int) -> Buffer:
        dev: OpenCLDevice = self.device
        cl = dev.cl
        try:
            buf = cl.Buffer(dev.platform.context,
                            cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, size)
            mapped, _ = cl.enqueue_map_buffer(
                dev.transfer_queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0, (size,),
                np.uint8, is_blocking=True)
        except cl.Error as e:
            raise AllocationError(f"{self.name}: cannot allocate {size / 2**20:.2f} MiB of "
                                  f"pinned memory: {e}") from None
        return OpenCLHostBuffer(self, buf, dev, mapped)


class OpenCLMappedBufferType(BufferType):
    """Buffers over user memory (USE_HOST_PTR): zero-copy where the device shares host memory,
    as PoCL's CPU devices do. The memory must outlive the buffer."""

    def __init__(self, device: "OpenCLDevice") -> None:
        super().__init__(f"{device.name}_Mapped", device, alignment=device.alignment,
                         max_size=device.max_alloc_size)

    def _alloc(self, size: int) -> Buffer:
        raise UnsupportedError(f"{self.name} buffers wrap existing memory: use "
                               f"device.buffer_from_host_ptr")

    def wrap(self, host: Any) -> Buffer:
        dev: OpenCLDevice = self.device
        cl = dev.cl
        array = wrap_host_memory(host)
        writable = array.flags.writeable
        flags = cl.mem_flags.USE_HOST_PTR | (cl.mem_flags.READ_WRITE if writable
                                             else cl.mem_flags.READ_ONLY)
        try:
            buf = cl.Buffer(dev.platform.context, flags, hostbuf=array)
        except cl.Error as e:
            raise AllocationError(f"{self.name}: cannot wrap {array.size} bytes of host memory: "
                                  f"{e}") from None
        wrapped = OpenCLBuffer(self, array.size, buf, dev, accounted=False, writable=writable)
        wrapped.host_memory = array        # keeps the user's memory alive with the buffer
        return wrapped
