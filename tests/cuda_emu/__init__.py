"""polydev's CUDA kernels compiled for the CPU against ``emu.h``, an emulation of the CUDA
execution model, and a launcher that runs them on tensors in CPU buffers.

This tests the kernels' logic and the binders' launch geometry and argument packing on
machines without a GPU; what it cannot test (CuPy, streams, real hardware) the ``cuda``-marked
tests check where a GPU exists.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from polydev.inflight import KernelErrorFlags
from polydev.kernel_build import compile_cached
from polydev.tensor import Tensor

EMU_HEADER = Path(__file__).with_name("emu.h")
FLAGS = ("-std=c++20", "-O1", "-shared", "-fPIC", "-pthread")


def compiler() -> str | None:
    """The C++ compiler the emulation needs (C++20 for std::barrier), or None."""
    return shutil.which("g++") or shutil.which("clang++")


def build(source: str) -> ctypes.CDLL:
    """Compile CUDA ``source`` for the CPU (through the runtime's compile_cached, as every
    backend builds its kernels) and load it."""
    cxx = compiler()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout

    def compile(target: Path) -> None:
        with tempfile.TemporaryDirectory() as work:
            body = Path(work) / "kernels.cpp"
            body.write_text(source)
            expanded = subprocess.run(
                [cxx, "-std=c++20", "-E", "-include", str(EMU_HEADER), str(body)],
                check=True, capture_output=True, text=True).stdout
            names = sorted(set(re.findall(r'extern "C" void (\w+)\s*\(', expanded))
                           - {n for n in re.findall(r'extern "C" void (emu_\w+)', expanded)})
            exports = "\n".join(f"EMU_EXPORT({n})" for n in names)
            body.write_text(f"{source}\n{exports}\n")
            subprocess.run([cxx, *FLAGS, "-include", str(EMU_HEADER), str(body), "-o",
                            str(target)], check=True, capture_output=True, text=True)
    path = compile_cached("cuda-emu", "the CUDA kernels for the CPU emulation",
                          {"emu.h": EMU_HEADER.read_text(), "kernels.cu": source}, FLAGS,
                          {"compiler": cxx, "version": version}, compile, suffix=".so")
    return ctypes.CDLL(str(path))


class EmuLauncher:
    """The ``Launcher`` of polydev.backends.cuda.binders over tensors in CPU buffers."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.kernel_errors = KernelErrorFlags("emulated CUDA")
        self.flags = np.zeros(self.kernel_errors.n_slots, np.int32)

    def address(self, t: Tensor) -> int:
        return t.buffer.host_array.ctypes.data + t.offset

    def error_flag(self, node: Tensor) -> np.uint64:
        return np.uint64(self.flags.ctypes.data + 4 * self.kernel_errors.slot(node))

    def scratch(self, nbytes: int) -> tuple[int, np.ndarray]:
        memory = np.empty(nbytes, np.uint8)
        return memory.ctypes.data, memory

    def launch(self, name: str, grid: Sequence[int], block: Sequence[int], args: list,
               checks_indices: bool = False) -> Callable[[], None]:
        fn = getattr(self.lib, f"emu_{name}")
        g = (ctypes.c_uint * 3)(*(tuple(grid) + (1, 1))[:3])
        b = (ctypes.c_uint * 3)(*(tuple(block) + (1, 1))[:3])
        # each argument's bytes, as cuLaunchKernel reads them
        cells = [np.array([a]) for a in args]
        pointers = (ctypes.c_void_p * len(args))(*[c.ctypes.data for c in cells])

        errors = self.kernel_errors

        def call() -> None:
            if min(tuple(grid)) > 0:
                fn(g, b, pointers)
                if checks_indices:
                    errors.launched()
        call.keep = (cells, pointers, g, b)      # alive as long as the call
        return call
