"""CUDA memory: device buffers from CuPy's pool, and pinned host buffers ("CUDA_Host").

A tensor lives at ``MemoryPointer + offset``. Blocking transfers first wait for the whole
device (every stream of every backend on it), so they see all work queued before them; the
backends' async transfers are in backend.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from polydev.buffer import Buffer, BufferType, HostArrayBuffer
from polydev.errors import AllocationError
from polydev.tensor import Tensor

if TYPE_CHECKING:
    from .device import CUDADevice

ALIGNMENT = 128      # ggml-cuda's; CuPy's pool hands out 512-byte aligned blocks


class CUDABuffer(Buffer):
    """Device memory of one GPU: one allocation of CuPy's memory pool."""

    def __init__(self, buft: BufferType, size: int, memptr: Any, device: "CUDADevice") -> None:
        super().__init__(buft, size)
        self.memptr = memptr
        self.ptr = int(memptr.ptr)
        self.device = device

    # A plain cudaMemcpy from pageable memory may return before its DMA lands, ordered only
    # on the legacy stream, which the backends' non-blocking streams do not wait for: the
    # copies go on the transfer stream, whose synchronize on leaving idle() waits for them.
    def _set(self, t: Tensor, data: np.ndarray, offset: int) -> None:
        with self.device.idle() as stream:
            (self.memptr + t.offset + offset).copy_from_host_async(data.ctypes.data,
                                                                   data.nbytes, stream)

    def _get(self, t: Tensor, out: np.ndarray, offset: int) -> None:
        with self.device.idle() as stream:
            (self.memptr + t.offset + offset).copy_to_host_async(out.ctypes.data, out.nbytes,
                                                                 stream)

    def _memset(self, t: Tensor, value: int, offset: int, size: int) -> None:
        self._fill(value, t.offset + offset, size)

    def _clear(self, value: int) -> None:
        self._fill(value, 0, self.size)

    def _fill(self, value: int, offset: int, size: int) -> None:
        runtime = self.device.cupy.cuda.runtime
        with self.device.idle() as stream:
            runtime.memsetAsync(self.ptr + offset, value, size, stream.ptr)

    def _cpy(self, src: Tensor, dst: Tensor) -> bool:
        """Device to device: within the GPU, or peer to peer between two GPUs."""
        sbuf = src.buffer
        if not isinstance(sbuf, CUDABuffer):
            return False
        runtime = self.device.cupy.cuda.runtime
        with sbuf.device.idle(), self.device.idle() as stream:
            if sbuf.device is self.device:
                runtime.memcpyAsync(self.ptr + dst.offset, sbuf.ptr + src.offset, src.nbytes,
                                    runtime.memcpyDeviceToDevice, stream.ptr)
            else:
                runtime.memcpyPeerAsync(self.ptr + dst.offset, self.device.index,
                                        sbuf.ptr + src.offset, sbuf.device.index, src.nbytes,
                                        stream.ptr)
        return True

    def _free(self) -> None:
        with self.device.idle():
            pass
        self.memptr = None         # back to CuPy's pool (its free bytes count as free memory)


class CUDAHostBuffer(HostArrayBuffer):
    """Pinned host memory: the host reads and writes it as a numpy array; copies between it
    and a GPU run at full speed and truly asynchronously. On an integrated GPU the device
    reads it in place (``memptr``)."""

    def __init__(self, buft: BufferType, size: int, pinned: Any, device: "CUDADevice") -> None:
        super().__init__(buft, np.ndarray((size,), dtype=np.uint8, buffer=pinned))
        self._pinned = pinned
        self.device = device
        self.memptr = device.mapped_host_pointer(pinned, size) if device.integrated else None
        self.ptr = int(pinned.ptr)

    def _wait(self) -> None:
        self.device.reg_idle()     # any GPU's stream may be copying from or into these pages

    def _free(self) -> None:
        super()._free()
        self.memptr = None
        self._pinned = None       # back to CuPy's pinned pool


class CUDABufferType(BufferType):
    """Device memory of one GPU ("CUDA0")."""

    def __init__(self, device: "CUDADevice") -> None:
        super().__init__(device.name, device, alignment=ALIGNMENT)

    def _alloc(self, size: int) -> Buffer:
        dev: CUDADevice = self.device
        cupy = dev.cupy
        try:
            with cupy.cuda.Device(dev.index):
                memptr = cupy.cuda.alloc(size)
        except cupy.cuda.memory.OutOfMemoryError as e:
            message = f"{self.name}: cannot allocate {size / 2**20:.2f} MiB: {e}"
            raise AllocationError(message) from None
        return CUDABuffer(self, size, memptr, dev)


class CUDAHostBufferType(BufferType):
    """Pinned host memory usable by every GPU ("CUDA_Host"): is_host."""

    def __init__(self, device: "CUDADevice") -> None:
        super().__init__("CUDA_Host", device, alignment=ALIGNMENT, is_host=True)

    def _alloc(self, size: int) -> Buffer:
        dev: CUDADevice = self.device
        cupy = dev.cupy
        try:
            with cupy.cuda.Device(dev.index):
                pinned = cupy.cuda.alloc_pinned_memory(size)
        except cupy.cuda.runtime.CUDARuntimeError as e:
            raise AllocationError(f"{self.name}: cannot allocate {size / 2**20:.2f} MiB of "
                                  f"pinned memory: {e}") from None
        return CUDAHostBuffer(self, size, pinned, dev)
