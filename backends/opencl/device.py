"""An OpenCL device: its buffer types, memory accounting, programs and capabilities."""

from __future__ import annotations

import threading
from typing import Any

from polydev.buffer import Buffer, BufferType
from polydev.device import Device, DeviceType, Event
from polydev.kernels import KernelTable

from .backend import OpenCLBackend, OpenCLEvent
from .buffer import OpenCLBufferType, OpenCLHostBufferType, OpenCLMappedBufferType
from .kernels import TABLE
from .platform import PlatformContext
from .probe import compiler_identity
from .programs import ProgramCache

ROW_GROUP_SIZE = 64      # work-items per row in the row kernels (a power of two)
TILE_SIZE = 16           # the tiled matmul's tile edge


def device_type(cl: Any, dev: Any) -> DeviceType:
    """GPU with its own memory, IGPU when it shares host memory, CPU, or ACCEL."""
    if dev.type & cl.device_type.GPU:
        return DeviceType.IGPU if dev.host_unified_memory else DeviceType.GPU
    if dev.type & cl.device_type.ACCELERATOR:
        return DeviceType.ACCEL
    return DeviceType.CPU


class OpenCLDevice(Device):
    """One OpenCL device ("OpenCL0"); its platform's context is shared with its siblings."""

    backend_class = OpenCLBackend

    def __init__(self, index: int, platform: PlatformContext, cl_device: Any) -> None:
        cl = platform.cl
        super().__init__(f"OpenCL{index}", f"{platform.name}: {cl_device.name.strip()}")
        self.cl = cl
        self.platform = platform
        self.cl_device = cl_device
        self.type = device_type(cl, cl_device)
        self.host_unified = bool(cl_device.host_unified_memory)
        self.alignment = max(cl_device.mem_base_addr_align // 8, 16)   # the query is in bits
        self.max_alloc_size = int(cl_device.max_mem_alloc_size)
        self.total_memory = int(cl_device.global_mem_size)
        max_group = int(cl_device.max_work_group_size)
        self.row_group_size = min(ROW_GROUP_SIZE, 1 << (max_group.bit_length() - 1))
        self.tile_size = TILE_SIZE if max_group >= TILE_SIZE * TILE_SIZE else 8
        # A CPU driver (PoCL) runs a work-group's work-items as loops on one core, where a
        # barrier splits the loop and a work-group per row costs more than its row: decode
        # products and attention take barrier-free kernels, one work-item per row(s), there.
        self.barrier_free = self.type == DeviceType.CPU
        self._allocated = 0
        self._lock = threading.Lock()
        self._buft = OpenCLBufferType(self)
        self._host_buft = OpenCLHostBufferType(self)
        self._mapped_buft = OpenCLMappedBufferType(self)
        self._transfer_queue = None
        self._scratch = None
        self._programs: ProgramCache | None = None

    # --- lazily made OpenCL objects ---------------------------------------------------------

    @property
    def transfer_queue(self) -> Any:
        """The queue of blocking buffer reads and writes."""
        with self._lock:
            if self._transfer_queue is None:
                self._transfer_queue = self.cl.CommandQueue(self.platform.context,
                                                            self.cl_device)
            return self._transfer_queue

    @property
    def scratch(self) -> Any:
        """A small buffer passed for absent optional kernel arguments (never read)."""
        with self._lock:
            if self._scratch is None:
                self._scratch = self.cl.Buffer(self.platform.context,
                                               self.cl.mem_flags.READ_WRITE, 64)
            return self._scratch

    @property
    def programs(self) -> ProgramCache:
        with self._lock:
            if self._programs is None:
                defaults = {"LS": self.row_group_size, "TS": self.tile_size}
                if self.barrier_free:        # a CPU driver: see common.h
                    defaults["HALF_BY_BITS"] = defaults["VLOAD_BY_CAST"] = True
                self._programs = ProgramCache(
                    self.cl, self.platform.context, self.cl_device, defaults,
                    compiler_identity(self.platform.platform, self.cl_device))
            return self._programs

    # --- memory -------------------------------------------------------------------------------

    def account(self, nbytes: int) -> None:
        """Track device memory polydev allocated (OpenCL has no free-memory query)."""
        with self._lock:
            self._allocated += nbytes

    def memory(self) -> tuple[int, int]:
        return max(self.total_memory - self._allocated, 0), self.total_memory

    @property
    def buffer_type(self) -> BufferType:
        return self._buft

    def _host_buffer_type(self) -> BufferType:
        return self._host_buft

    def _buffer_from_host_ptr(self, host: Any, max_tensor_size: int) -> Buffer:
        return self._mapped_buft.wrap(host)

    def supports_buft(self, buft: BufferType) -> bool:
        """Device memory of any device of this context; pinned host memory only where the
        device shares host memory (elsewhere kernels may not touch mapped buffers)."""
        other = buft.device
        if not isinstance(other, OpenCLDevice) or other.platform is not self.platform:
            return False
        return not buft.is_host or self.host_unified

    # --- compute -------------------------------------------------------------------------------

    @property
    def kernels(self) -> KernelTable:
        return TABLE

    def _event_new(self) -> Event:
        return OpenCLEvent(self)
