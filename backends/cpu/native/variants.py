"""The builds of the CPU kernels: one per x86-64 feature level, chosen at run time.

The kernels' C sources pick their SIMD code by the compiler's target macros (``__AVX2__``,
``__AVX512VNNI__``, ...), so one source gives one library per level. The package build
compiles every level (setup.py), which runs on any x86-64 processor; at run time the loader
takes the best level this CPU reports. The lowest level needs nothing beyond x86-64 (SSE2),
so no processor is left without kernels, and a machine that is not x86-64 gets one portable
build.

This module imports nothing from polydev: setup.py loads it by path, before polydev is
installed.
"""

from __future__ import annotations

import platform
import zlib
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BASE_FLAGS", "OPENMP_FLAGS", "Variant", "source_id", "supported", "variants"]

HERE = Path(__file__).parent
# -ffp-contract=off: each block decodes with ggml's own float32 operations, never fused
BASE_FLAGS = ("-O3", "-ffp-contract=off", "-fno-math-errno")
OPENMP_FLAGS = ("-fopenmp",)

# Feature flags as Linux's /proc/cpuinfo names them, and the compiler flags that enable them.
# Each level is written out as features rather than -march=x86-64-v3: GCC before 11 and old
# clang do not know the level names.
_V3_NEEDS = ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe")
_V3_FLAGS = ("-mavx", "-mavx2", "-mfma", "-mf16c", "-mbmi", "-mbmi2", "-mlzcnt", "-mmovbe")
_V4_NEEDS = _V3_NEEDS + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
_V4_FLAGS = _V3_FLAGS + ("-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl")


@dataclass(frozen=True)
class Variant:
    """One build of the kernels: its name, the compiler flags of its level, and the CPU
    features (``/proc/cpuinfo`` flags) it needs to run."""

    name: str
    flags: tuple[str, ...]
    needs: tuple[str, ...]

    @property
    def module(self) -> str:
        """The library's module name in this package (an identifier, as setuptools wants)."""
        return "_kernels_" + "".join(c if c.isalnum() else "_" for c in self.name)

    def runs_on(self, cpu_flags: frozenset[str]) -> bool:
        return all(f in cpu_flags for f in self.needs)


# Best first: the loader takes the first one the CPU can run.
_X86_64 = (
    Variant("x86-64-v4+vnni", _V4_FLAGS + ("-mavx512vnni",), _V4_NEEDS + ("avx512_vnni",)),
    Variant("x86-64-v3+vnni", _V3_FLAGS + ("-mavxvnni",), _V3_NEEDS + ("avx_vnni",)),
    Variant("x86-64-v3", _V3_FLAGS, _V3_NEEDS),
    Variant("x86-64", (), ()),
)
_PORTABLE = (Variant("portable", (), ()),)


def variants(machine: str | None = None) -> tuple[Variant, ...]:
    """The builds for ``machine`` (default: this one, as ``platform.machine()`` names it),
    best first."""
    machine = (machine or platform.machine()).lower()
    return _X86_64 if machine in ("x86_64", "amd64") else _PORTABLE


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux reports them (those the kernel lets programs use);
    empty where there is no /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def supported() -> tuple[Variant, ...]:
    """The builds this CPU can run, best first (at least the lowest level)."""
    flags = cpu_flags()
    return tuple(v for v in variants() if v.runs_on(flags))


def source_id() -> str:
    """A checksum of the kernels' sources (``*.c``, ``*.h``), compiled into each library
    (``pd_source_id``) so the loader can tell a build of other sources, such as an editable
    install whose C files changed since it was built. CRC-32 and Adler-32 (zlib): a key needs
    no cryptographic hash, and hashlib loads OpenSSL's libcrypto."""
    data = b"\0".join(f.read_bytes() for f in sorted(HERE.glob("*.[ch]")))
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}{len(data):x}"
