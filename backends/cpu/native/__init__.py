"""The CPU backend's compiled kernels (the ``*.c`` files here).

numpy has no product of a block-format weight with float32 activations, so without these
kernels a quantized weight is decoded to float32 (the weight cache) and multiplied by BLAS:
four to seven times the bytes per product and in memory. ``kernels.c`` multiplies straight
from the blocks.

They are compiled as the package is built or installed (setup.py), one library per x86-64
feature level (``variants.py``), so no compiler is needed at run time. ``kernels()`` loads the
best level this CPU can run and logs once which one. Where no installed library was built from
these sources (a checkout that was never installed, or an editable install whose C files have
changed since) and a C compiler is here (``$CC``, else ``cc``), it builds that level into
``$POLYDEV_CACHE_DIR/kernels`` under a name that hashes the sources, flags and compiler.

Without either, or with ``POLYDEV_CPU_NATIVE=0``, ``kernels()`` is None and the CPU backend
keeps its numpy path, the reference, which gives the same values up to the order of the sums.
``POLYDEV_CPU_KERNELS=<level>`` (``x86-64``, ``x86-64-v3``, ...) asks for a lower level than the
best, as the tests do to check each one.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

import numpy as np

from polydev.env import cache_dir, env_int, env_text
from polydev.errors import ConfigError

from . import variants
from .variants import Variant

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = sorted(HERE.glob("*.c"))
DISABLE_ENV = "POLYDEV_CPU_NATIVE"
VARIANT_ENV = "POLYDEV_CPU_KERNELS"
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


def tensor_words(address: int, t) -> tuple[int, ...]:
    """A tensor argument of a packed entry point (``pd_tensor`` in blocks.h, as the OpenCL
    and CUDA kernels take theirs): the address of its first byte, then ``t.ne`` and
    ``t.nb``; for an absent tensor (``t`` None) a NULL address, one element, no strides."""
    if t is None:
        return (0, 1, 1, 1, 1, 0, 0, 0, 0)
    return (address, *t.ne, *t.nb)


class NativeKernels:
    """The loaded library's entry points, with their C signatures declared; ``variant`` is
    its feature level, ``origin`` "installed" (built with the package) or "built" (by the
    loader, into the cache)."""

    def __init__(self, library: ctypes.CDLL, path: Path, origin: str) -> None:
        self.path, self.origin = path, origin
        self.variant = _entry(library.pd_variant, [], ctypes.c_char_p)().decode()
        self.source_id = _entry(library.pd_source_id, [], ctypes.c_char_p)().decode()
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
        self.mul_mat_interleaved_packed = _entry(library.pd_mul_mat_interleaved_packed, [_ptr],
                                                 _int)
        self.mul_mat_id_interleaved_packed = _entry(library.pd_mul_mat_id_interleaved_packed,
                                                    [_ptr], _int)
        self.interleave = _entry(library.pd_interleave,
                                 [_int, _ptr, _i64, _i64, _i64, _ptr, _int], _int)
        self.interleaved_bytes = _entry(library.pd_interleaved_bytes, [_int, _i64, _i64], _i64)
        self.swiglu_f32_packed = _entry(library.pd_swiglu_f32_packed, [_ptr])
        self.get_rows_f32 = _entry(library.pd_get_rows_f32,
                                   [_int, _ptr, _i64, _i64, _ptr, _i64, _i64, _ptr, _i64], _i64)
        int16_product_of = _entry(library.pd_int16_product_of, [_int], _int)
        self._int16_types = {t for t in range(64) if int16_product_of(t)}
        int16_gemm_of = _entry(library.pd_int16_gemm_of, [_int], _int)
        self._int16_gemm_types = {t for t in range(64) if int16_gemm_of(t)}
        # whether numerics="int8" has kernels here (AVX-512 VNNI), else it runs the int16 ones
        self.has_int8_products = bool(_entry(library.pd_has_int8_products, [], _int)())
        block_size = _entry(library.pd_block_size, [_int], _int)
        self._block_sizes = {t: block_size(t) for t in range(64)}

    def block_size(self, type_id: int) -> int:
        """Elements per block of ggml type ``type_id`` as the kernels read it; 0 where the
        kernels do not read that type."""
        return self._block_sizes.get(type_id, 0)

    def has_int16_product(self, type_id: int) -> bool:
        """Whether ``mul_mat_int16`` multiplies ggml type ``type_id`` on this build."""
        return type_id in self._int16_types

    def has_int16_gemm(self, type_id: int) -> bool:
        """Whether ``mul_mat_int16`` multiplies many rows (a prompt) of ggml type ``type_id``
        by its GEMM on this build, which unpacks each weight block once for all rows."""
        return type_id in self._int16_gemm_types


def chosen_variant() -> Variant:
    """The feature level to load: the best this CPU runs, or the one ``POLYDEV_CPU_KERNELS``
    names (a ConfigError where it is unknown, or needs features this CPU lacks: its code would
    stop the process with an illegal instruction)."""
    runnable = variants.supported()
    name = env_text(VARIANT_ENV)
    if not name:
        return runnable[0]
    known = {v.name: v for v in variants.variants()}
    if name not in known:
        raise ConfigError(f"{VARIANT_ENV}={name!r}: no such build of the CPU kernels here "
                          f"(one of {', '.join(known)})")
    if known[name] not in runnable:
        missing = sorted(set(known[name].needs) - variants.cpu_flags())
        raise ConfigError(f"{VARIANT_ENV}={name!r}: this CPU lacks {', '.join(missing)}")
    return known[name]


def installed_path(variant: Variant) -> Path | None:
    """Where the package's build of ``variant`` is (found as Python finds a module, so an
    editable install's too), or None where it was not built."""
    spec = importlib.util.find_spec(f"{__name__}.{variant.module}")
    return Path(spec.origin) if spec is not None and spec.origin else None


def _compiler() -> str | None:
    cc = env_text("CC") or "cc"
    return shutil.which(cc)


def _build_flags(variant: Variant, openmp: bool) -> list[str]:
    defines = [f'-DPD_SOURCE_ID="{variants.source_id()}"', f'-DPD_VARIANT="{variant.name}"']
    return [*variants.BASE_FLAGS, *variant.flags, *(variants.OPENMP_FLAGS if openmp else ()),
            *defines, "-fPIC", "-shared"]


def _identity(cc: str, flags: list[str]) -> str:
    """A checksum of what a build depends on beyond the sources (whose checksum is among the
    flags): the flags and the compiler."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    data = "\0".join([*flags, version.stdout]).encode()
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


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


def _load_installed(variant: Variant) -> NativeKernels | None:
    path = installed_path(variant)
    if path is None:
        log.debug("the package has no build of the CPU kernels for %s", variant.name)
        return None
    lib = NativeKernels(_open_library(path), path, "installed")
    if lib.source_id != variants.source_id():
        log.info("the installed CPU kernels (%s) were built from other sources than these "
                 "(reinstall the package to rebuild them)", path)
        return None
    return lib


def _load_built(variant: Variant) -> NativeKernels | None:
    """Build ``variant`` into the cache with this machine's compiler (once), then load it."""
    cc = _compiler()
    if cc is None:
        log.warning("the CPU kernels are not installed and there is no C compiler to build them "
                    "(set $CC or reinstall polydev): the CPU backend multiplies quantized "
                    "weights through float32 copies, which is slower and uses more memory")
        return None
    last_error = None
    for openmp in (True, False):                  # without OpenMP: one thread, still correct
        flags = _build_flags(variant, openmp)
        target = cache_dir("kernels") / f"kernels-{_identity(cc, flags)}.so"
        try:
            if not target.exists():
                log.info("building the CPU kernels (%s) with %s into %s", variant.name, cc, target)
                _build(cc, flags, target)
            return NativeKernels(_open_library(target), target, "built")
        except (OSError, subprocess.SubprocessError) as e:
            last_error = getattr(e, "stderr", None) or str(e)
    log.warning("the CPU kernels did not build (%s): the CPU backend multiplies quantized "
                "weights through float32 copies", str(last_error).strip().splitlines()[-1:])
    return None


def _load() -> NativeKernels | None:
    variant = chosen_variant()
    lib = _load_installed(variant) or _load_built(variant)
    if lib is not None:
        log.info("CPU kernels: %s (%s, %s)", lib.variant, lib.origin, lib.path)
    return lib


@functools.lru_cache(maxsize=1)
def kernels() -> NativeKernels | None:
    """The compiled kernels (see the module); None where there are none: the numpy path."""
    if not env_int(DISABLE_ENV):
        return None
    return _load()
