"""The CPU kernels, compiled as the package is built or installed (the metadata is in
pyproject.toml).

One shared library per x86-64 feature level (backends/cpu/native/variants.py), each a plain
C library that polydev loads with ctypes; the loader picks the best one the CPU can run. A
library that does not build (no compiler, no OpenMP) never fails the install: without OpenMP
it builds single-threaded, and without a compiler polydev multiplies through numpy and says so.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, LinkError

NATIVE = Path("backends/cpu/native")


def _load_variants():
    spec = importlib.util.spec_from_file_location("_polydev_kernel_variants",
                                                  NATIVE / "variants.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


variants = _load_variants()


def _extension(variant) -> Extension:
    openmp = list(variants.OPENMP_FLAGS)
    return Extension(
        f"polydev.backends.cpu.native.{variant.module}",
        sources=sorted(str(p) for p in NATIVE.glob("*.c")),
        depends=sorted(str(p) for p in NATIVE.glob("*.h")),
        define_macros=[("PD_SOURCE_ID", f'"{variants.source_id()}"'),
                       ("PD_VARIANT", f'"{variant.name}"')],
        extra_compile_args=[*variants.BASE_FLAGS, *variant.flags, *openmp],
        extra_link_args=openmp,
        optional=True,                       # a failed build warns; the install goes on
    )


class BuildKernels(build_ext):
    """Builds each variant in a temporary folder of its own (they compile the same sources
    with other flags, so they must not share object files), and retries a failed build
    without OpenMP (clang without libomp, say): one thread, still correct."""

    def build_extension(self, ext: Extension) -> None:
        shared_temp = self.build_temp
        self.build_temp = os.path.join(shared_temp, ext.name)
        try:
            super().build_extension(ext)
        except (CCompilerError, CompileError, LinkError) as e:
            openmp = set(variants.OPENMP_FLAGS)
            if not openmp & set(ext.extra_compile_args):
                raise
            print(f"polydev: {ext.name} did not build with OpenMP ({e}); building it "
                  "single-threaded", file=sys.stderr)
            ext.extra_compile_args = [a for a in ext.extra_compile_args if a not in openmp]
            ext.extra_link_args = [a for a in ext.extra_link_args if a not in openmp]
            super().build_extension(ext)
        finally:
            self.build_temp = shared_temp


setup(ext_modules=[_extension(v) for v in variants.variants()],
      cmdclass={"build_ext": BuildKernels})
