"""The CPU device and its reg: numpy memory and compute, always available."""

from __future__ import annotations

import logging
import os
import platform
from typing import Any

from polydev.buffer import Buffer, BufferType
from polydev.device import Backend, Device, DeviceCaps, DeviceType, Reg
from polydev.tensor import Tensor

from polydev.backends.array import find_kernel, supported_op_names

from .backend import CPUBackend
from .buffer import CPUBufferType, CPUMappedBufferType
from .weights import WeightCache, default_budget

log = logging.getLogger(__name__)


def cpu_model() -> str:
    """The CPU's brand string (ggml's CPU description)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def physical_memory() -> tuple[int, int]:
    """(available, total) bytes of system memory."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, total
    except OSError:
        pass
    return total, total


class CPUDevice(Device):
    """The "CPU" device: host memory, numpy kernels, BLAS threads."""

    type = DeviceType.CPU
    caps = DeviceCaps(async_=False, host_buffer=False, buffer_from_host_ptr=True, events=False,
                      mmap_support=True)

    def __init__(self) -> None:
        super().__init__("CPU", cpu_model())
        self._buft = CPUBufferType(self)
        self._mapped_buft = CPUMappedBufferType(self)
        self.weight_cache = WeightCache(default_budget(physical_memory()[1]))
        self._blas_limits: Any = None

    def memory(self) -> tuple[int, int]:
        return physical_memory()

    @property
    def buffer_type(self) -> BufferType:
        return self._buft

    def _init_backend(self, params: str | None) -> Backend:
        return CPUBackend(self)

    def _buffer_from_host_ptr(self, host: Any, max_tensor_size: int) -> Buffer:
        return self._mapped_buft.wrap(host)

    def supports_op(self, op: Tensor) -> bool:
        return find_kernel(op) is not None

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host

    def supported_op_names(self) -> list[str]:
        return supported_op_names()

    def set_blas_threads(self, n_threads: int) -> None:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            log.warning("threadpoolctl is not installed, so the thread count cannot reach "
                        "numpy's BLAS (pip install 'polydev[threads]')")
            return
        self._blas_limits = threadpool_limits(limits=n_threads, user_api="blas")


def _set_n_threads(backend: CPUBackend, n_threads: int) -> None:
    backend.set_n_threads(n_threads)


def make_reg() -> Reg:
    return Reg("CPU", [CPUDevice()], procs={"set_n_threads": _set_n_threads})
