"""The CPU device and its reg: numpy memory and compute, always available."""

from __future__ import annotations

import logging
import os
import platform
from typing import Any

from polydev.buffer import Buffer, BufferType
from polydev.device import Device, DeviceType, Reg
from polydev.errors import InvalidArgumentError
from polydev.kernels import KernelTable
from polydev.probes import cpu_info

from .backend import CPUBackend
from .buffer import CPUBufferType, CPUMappedBufferType
from .kernels import CPU_TABLE
from .weights import WeightCache

log = logging.getLogger(__name__)


def cpu_model() -> str:
    """The CPU's brand string (ggml's CPU description)."""
    return cpu_info().get("model name") or platform.processor() or platform.machine() or "CPU"


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
    backend_class = CPUBackend

    def __init__(self) -> None:
        super().__init__("CPU", cpu_model())
        self._buft = CPUBufferType(self)
        self._mapped_buft = CPUMappedBufferType(self)
        self.weight_cache = WeightCache(lambda: physical_memory()[1] // 2)
        self._blas_limits: Any = None

    def memory(self) -> tuple[int, int]:
        return physical_memory()

    @property
    def buffer_type(self) -> BufferType:
        return self._buft

    @property
    def kernels(self) -> KernelTable:
        return CPU_TABLE

    def _init_backend(self, params: str | None) -> CPUBackend:
        """A stream; ``params`` "numpy": one that computes with the numpy kernels alone."""
        return CPUBackend(self, kernels=params or "compiled")

    def _buffer_from_host_ptr(self, host: Any, max_tensor_size: int) -> Buffer:
        return self._mapped_buft.wrap(host)

    def supports_buft(self, buft: BufferType) -> bool:
        return buft.is_host

    def set_blas_threads(self, n_threads: int) -> None:
        """Limit numpy's BLAS to ``n_threads`` (process-wide: BLAS has one pool)."""
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
            raise InvalidArgumentError(f"the CPU needs a positive number of threads, got "
                                       f"{n_threads!r}")
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:
            log.warning("threadpoolctl is not installed, so the thread count cannot reach "
                        "numpy's BLAS (pip install 'polydev[threads]')")
            return
        self._blas_limits = threadpool_limits(limits=n_threads, user_api="blas")


def _set_n_threads(backend: CPUBackend, n_threads: int) -> None:
    backend.set_n_threads(n_threads)


def _set_numerics(backend: CPUBackend, numerics: str) -> None:
    backend.set_numerics(numerics)


def make_reg() -> Reg:
    """The CPU reg: one device, ggml's "set_n_threads" proc, and "set_numerics"."""
    return Reg("CPU", [CPUDevice()], procs={"set_n_threads": _set_n_threads,
                                            "set_numerics": _set_numerics})
