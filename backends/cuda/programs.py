"""The CUDA backend's kernels: one module of the ``cu/`` sources, compiled by NVRTC (CuPy's
binding) into a cubin for the GPU's architecture through the runtime's ``compile_cached`` (so a
second process, or a second GPU of the same kind, loads it), and their functions looked up once.
"""

from __future__ import annotations

import threading
import zlib
from pathlib import Path
from typing import Any

from polydev.errors import CompileError
from polydev.kernel_build import compile_cached
from polydev.probes import error_lines

SOURCE_DIR = Path(__file__).with_name("cu")
SOURCE_FILES = ("common.cuh", "quant.cu", "rows.cu", "rope.cu", "attention.cu",
                "elementwise.cu")


def kernel_source() -> str:
    """The whole CUDA C++ source, common.cuh first (NVRTC gets no include path)."""
    return "\n".join((SOURCE_DIR / name).read_text() for name in SOURCE_FILES)


def gpu_name(props: dict) -> str:
    """The GPU's name from CuPy's device properties (bytes in some CuPy versions)."""
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def compiler_identity(cupy: Any, device_id: int) -> dict[str, object]:
    """What the module's build depends on besides its source and options: the compiler
    (NVRTC's version, CuPy's), the driver and the GPU's architecture."""
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    try:
        nvrtc = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
    except Exception as e:             # NVRTC missing: the build says so, and is kept
        nvrtc = f"unavailable ({type(e).__name__})"
    return {"gpu": gpu_name(props), "architecture": _architecture(props),
            "driver": cupy.cuda.runtime.driverGetVersion(), "nvrtc": nvrtc,
            "cupy": cupy.__version__}


def build_key(cupy: Any, device_id: int) -> dict[str, object]:
    """Everything whether the module builds on a GPU depends on (the discovery probe's key):
    the source and the compiler's identity."""
    return {"source": f"{zlib.crc32(kernel_source().encode()):08x}",
            **compiler_identity(cupy, device_id)}


def build_error(error: Exception, limit: int = 3) -> str:
    """Why a GPU cannot run the module: a CompileError says it with NVRTC's lines; anything
    else (a driver that refuses the cubin) with its type and its own error lines."""
    if isinstance(error, CompileError):
        return str(error)
    lines = error_lines(str(error))
    said = "; ".join(lines[:limit]) or str(error).strip()
    return f"its kernels do not load: {type(error).__name__}: {said}"


def _architecture(props: dict) -> str:
    return f"sm_{props.get('major', 0)}{props.get('minor', 0)}"


def nvrtc_options(architecture: str) -> list[str]:
    """NVRTC's options for the module on a GPU of ``architecture`` ("sm_90")."""
    return ["--std=c++17", f"--gpu-architecture={architecture}"]


def compile_module(cupy: Any, device_id: int) -> Path:
    """The cubin of the ``cu/`` sources for the GPU's architecture: NVRTC's build, through
    ``compile_cached`` (a CompileError with NVRTC's log where it fails)."""
    props = cupy.cuda.runtime.getDeviceProperties(device_id)
    options = nvrtc_options(_architecture(props))
    source, what = kernel_source(), f"the CUDA kernels for {gpu_name(props)}"
    nvrtc = cupy.cuda.nvrtc

    def compile(target: Path) -> None:
        program = nvrtc.createProgram(source, "polydev.cu", [], [])
        try:
            try:
                nvrtc.compileProgram(program, options)
            except nvrtc.NVRTCError:
                log = nvrtc.getProgramLog(program)
                lines = error_lines(log)
                raise CompileError(f"{what} did not build: "
                                   f"{'; '.join(lines[:3]) or log.strip()}") from None
            target.write_bytes(nvrtc.getCUBIN(program))
        finally:
            nvrtc.destroyProgram(program)
    return compile_cached("cuda", what, {"polydev.cu": source}, options,
                          compiler_identity(cupy, device_id), compile, suffix=".cubin")


class KernelModule:
    """The compiled module of one device and its kernel functions, loaded on first use (or by
    ``build`` when the device is proved at discovery)."""

    def __init__(self, cupy: Any, device_id: int) -> None:
        self._cupy = cupy
        self._device_id = device_id
        self._module: Any = None
        self._functions: dict[str, Any] = {}
        self._lock = threading.Lock()

    def build(self) -> None:
        """Build (or find in the cache) the module and load it on this device now; raises
        CompileError, or what the driver raises where it refuses the cubin."""
        with self._lock:
            self._loaded()

    def function(self, name: str) -> Any:
        """The ``cupy.cuda.Function`` of kernel ``name`` on this device."""
        with self._lock:
            fn = self._functions.get(name)
            if fn is None:
                module = self._loaded()
                with self._cupy.cuda.Device(self._device_id):
                    fn = self._functions[name] = module.get_function(name)
            return fn

    def _loaded(self) -> Any:
        if self._module is None:
            cubin = compile_module(self._cupy, self._device_id).read_bytes()
            with self._cupy.cuda.Device(self._device_id):     # a module is per device
                module = self._cupy.cuda.function.Module()
                module.load(cubin)
            self._module = module
        return self._module
