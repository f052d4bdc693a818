"""The CUDA backend's kernels: one module of the ``cu/`` sources, compiled once per device by
NVRTC through CuPy (which caches the binaries on disk), and their functions looked up once.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

SOURCE_DIR = Path(__file__).with_name("cu")
SOURCE_FILES = ("common.cuh", "quant.cu", "rows.cu", "rope.cu")


def kernel_source() -> str:
    """The whole CUDA C++ source, common.cuh first (NVRTC gets no include path)."""
    return "\n".join((SOURCE_DIR / name).read_text() for name in SOURCE_FILES)


class KernelModule:
    """The compiled module of one device and its kernel functions, made on first use."""

    def __init__(self, cupy: Any, device_id: int) -> None:
        self._cupy = cupy
        self._device_id = device_id
        self._module: Any = None
        self._functions: dict[str, Any] = {}
        self._lock = threading.Lock()

    def function(self, name: str) -> Any:
        """The ``cupy.cuda.Function`` of kernel ``name`` on this device."""
        with self._lock:
            fn = self._functions.get(name)
            if fn is None:
                with self._cupy.cuda.Device(self._device_id):
                    if self._module is None:
                        self._module = self._cupy.RawModule(code=kernel_source(),
                                                            options=("--std=c++17",))
                    # RawKernel.kernel compiles (or loads) for the current device
                    fn = self._module.get_function(name).kernel
                self._functions[name] = fn
            return fn
