"""The CPU backend's compiled kernels (the ``*.c`` files here), built once with the system C
compiler.

numpy has no product of a block-format weight with float32 activations, so without these
kernels a quantized weight is decoded to float32 (the weight cache) and multiplied by BLAS:
four to seven times the bytes per product and in memory. ``kernels.c`` multiplies straight
from the blocks. It is compiled on first use, as tinygrad compiles its CPU kernels, with
``$CC`` (else ``cc``) for this machine's CPU (``-march=native``) into
``$POLYDEV_CACHE_DIR/kernels`` under a name that hashes the source, the flags, the compiler
and the CPU, so a changed source or another machine sharing the cache builds its own copy.

Without a compiler, or with ``POLYDEV_CPU_NATIVE=0``, ``kernels()`` is None and the CPU
backend keeps its numpy path, which gives the same values up to the order of the sums.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

import numpy as np

from polydev.env import cache_dir, env_int, env_text
from polydev.probes import host_cpu

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = sorted(HERE.glob("*.c"))
HEADERS = sorted(HERE.glob("*.h"))
DISABLE_ENV = "POLYDEV_CPU_NATIVE"
# -ffp-contract=off: each block decodes with ggml's own float32 operations, never fused
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fPIC", "-shared"]
OPENMP = ["-fopenmp"]
# Rounds an OpenMP thread spins after a parallel region before it sleeps. libgomp's default,
# 300,000, is milliseconds of spinning; on a machine of few cores that spinning holds a core
# the next kernel's threads need (the OpenCL driver's, BLAS's, or the sibling hyperthread's).
# About 0.1 ms keeps the threads warm between the kernels of one step. bench/models.py on this
# 2-core machine: tg128 on the CPU no slower, half the layers on PoCL about 1.1x faster.
SPIN_COUNT = "20000"

_i64, _ptr, _int, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float


def _entry(fn, argtypes: list, restype=None):
    fn.argtypes, fn.restype = argtypes, restype
    return fn


def pack(*args: int | None) -> np.ndarray:
    """The integer arguments of a ``*_packed`` entry point (pointers, strides, sizes, flags, in
    the unpacked C function's order; None is a NULL pointer) as one int64 array. A bound call
    packs once and passes the array's address: ctypes converts one argument per call instead
    of each of them (about 0.3 µs apiece). The caller keeps the array alive."""
    return np.array([0 if a is None else int(a) for a in args], dtype=np.int64)


class NativeKernels:
    """The loaded library's entry points, with their C signatures declared."""

    def __init__(self, library: ctypes.CDLL, path: Path) -> None:
        self.path = path
        self.dequantize_rows = _entry(library.pd_dequantize_rows,
                                      [_int, _ptr, _i64, _i64, _i64, _i64, _ptr, _int])
        self.f16_to_f32 = _entry(library.pd_f16_to_f32,
                                 [_ptr, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _ptr])
        # the packed entry points of bound calls (see ``pack``)
        self.mul_mat_packed = _entry(library.pd_mul_mat_packed, [_ptr])
        self.flash_attn_f16_packed = _entry(library.pd_flash_attn_f16_packed, [_ptr, _f32, _f32])
        self.rope_f32_packed = _entry(library.pd_rope_f32_packed, [_ptr, _ptr, _ptr])
        self.rms_norm_f32_packed = _entry(library.pd_rms_norm_f32_packed, [_ptr, _f32])
        self.set_rows_f32_packed = _entry(library.pd_set_rows_f32_packed, [_ptr], _int)
        self.mul_mat_int16_packed = _entry(library.pd_mul_mat_int16_packed, [_ptr], _int)
        int16_product_of = _entry(library.pd_int16_product_of, [_int], _int)
        self._int16_types = {t for t in range(64) if int16_product_of(t)}
        block_size = _entry(library.pd_block_size, [_int], _int)
        self._block_sizes = {t: block_size(t) for t in range(64)}

    def block_size(self, type_id: int) -> int:
        """Elements per block of ggml type ``type_id`` as the kernels read it; 0 where the
        kernels do not read that type."""
        return self._block_sizes.get(type_id, 0)

    def has_int16_product(self, type_id: int) -> bool:
        """Whether ``mul_mat_int16`` multiplies ggml type ``type_id`` on this build."""
        return type_id in self._int16_types


def _compiler() -> str | None:
    cc = env_text("CC") or "cc"
    return shutil.which(cc)


def _identity(cc: str, flags: list[str]) -> str:
    """A checksum of everything the built library depends on. CRC-32 and Adler-32 (zlib):
    a cache key needs no cryptographic hash, and hashlib would load OpenSSL's libcrypto into
    every process that computes (about 3.5 MiB resident)."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    data = b"\0".join([*(f.read_bytes() for f in SOURCES + HEADERS), " ".join(flags).encode(),
                       version.stdout.encode(), host_cpu().encode()])
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}{len(data):x}"


def _build(cc: str, flags: list[str], target: Path) -> None:
    """Compile into a temporary file beside ``target``, then rename: never half a library."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        subprocess.run([cc, *flags, "-o", tmp, *map(str, SOURCES)], check=True,
                       capture_output=True, text=True, timeout=300)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _open_library(path: Path) -> ctypes.CDLL:
    """dlopen ``path`` with libgomp's spin count at SPIN_COUNT: libgomp reads its settings
    from the environment once, as it loads with the library (a libgomp already loaded keeps its
    own). A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins, and the environment is left as it
    was, so child processes do not inherit the setting."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return ctypes.CDLL(str(path))
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    try:
        return ctypes.CDLL(str(path))
    finally:
        del os.environ["GOMP_SPINCOUNT"]


def _load() -> NativeKernels | None:
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler (set $CC): the CPU backend multiplies quantized weights "
                    "through float32 copies, which is slower and uses more memory")
        return None
    last_error = None
    for flags in (FLAGS + OPENMP, FLAGS):          # without OpenMP: one thread, still correct
        target = cache_dir("kernels") / f"kernels-{_identity(cc, flags)}.so"
        try:
            if not target.exists():
                log.info("building the CPU kernels with %s into %s", cc, target)
                _build(cc, flags, target)
            return NativeKernels(_open_library(target), target)
        except (OSError, subprocess.SubprocessError) as e:
            last_error = getattr(e, "stderr", None) or str(e)
    log.warning("the CPU kernels did not build (%s): the CPU backend multiplies quantized "
                "weights through float32 copies", str(last_error).strip().splitlines()[-1:])
    return None


@functools.lru_cache(maxsize=1)
def kernels() -> NativeKernels | None:
    """The compiled kernels, built on first use; None where they cannot be (see the module)."""
    if not env_int(DISABLE_ENV):
        return None
    return _load()
