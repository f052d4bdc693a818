"""The CUDA backend's kernels: one module of the ``cu/`` sources, compiled once per device by
NVRTC through CuPy (which caches the binaries on disk), and their functions looked up once.
"""

from __future__ import annotations

import threading
import zlib
from pathlib import Path
from typing import Any

from polydev.probes import error_lines

SOURCE_DIR = Path(__file__).with_name("cu")
SOURCE_FILES = ("common.cuh", "quant.cu", "rows.cu", "rope.cu", "attention.cu")


def kernel_source() -> str:
    """The whole CUDA C++ source, common.cuh first (NVRTC gets no include path)."""
    return "\n".join((SOURCE_DIR / name).read_text() for name in SOURCE_FILES)


def gpu_name(props: dict) -> str:
    """The GPU's name from CuPy's device properties (bytes in some CuPy versions)."""
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def build_key(cupy: Any, device_id: int) -> dict[str, object]:
    """Everything whether the module builds on a GPU depends on: the source, the compiler
    (NVRTC's version, CuPy's), the driver and the GPU's architecture."""
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    try:
        nvrtc = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
    except Exception as e:             # NVRTC missing: the build says so, and is kept
        nvrtc = f"unavailable ({type(e).__name__})"
    return {"source": f"{zlib.crc32(kernel_source().encode()):08x}",
            "gpu": gpu_name(props),
            "compute_capability": f"{props.get('major', 0)}.{props.get('minor', 0)}",
            "driver": cupy.cuda.runtime.driverGetVersion(), "nvrtc": nvrtc,
            "cupy": cupy.__version__}


def build_error(error: Exception, limit: int = 3) -> str:
    """NVRTC's own error lines (a CompileException holds the whole log), else the error."""
    lines = error_lines(str(error))
    return f"{type(error).__name__}: {'; '.join(lines[:limit]) or str(error).strip()}"


class KernelModule:
    """The compiled module of one device and its kernel functions, made on first use (or by
    ``build`` when the device is proved at discovery)."""

    def __init__(self, cupy: Any, device_id: int) -> None:
        self._cupy = cupy
        self._device_id = device_id
        self._module: Any = None
        self._functions: dict[str, Any] = {}
        self._lock = threading.Lock()

    def build(self) -> None:
        """Compile the module (NVRTC, or CuPy's disk cache) and load it on this device now;
        raises what CuPy raises where it cannot (see ``build_error``)."""
        with self._lock, self._cupy.cuda.Device(self._device_id):
            self._source_module().compile()

    def function(self, name: str) -> Any:
        """The ``cupy.cuda.Function`` of kernel ``name`` on this device."""
        with self._lock:
            fn = self._functions.get(name)
            if fn is None:
                with self._cupy.cuda.Device(self._device_id):
                    # RawKernel.kernel compiles (or loads) for the current device
                    fn = self._source_module().get_function(name).kernel
                self._functions[name] = fn
            return fn

    def _source_module(self) -> Any:
        if self._module is None:
            self._module = self._cupy.RawModule(code=kernel_source(), options=("--std=c++17",))
        return self._module
