"""The CPU backend's compiled kernels (the ``*.c`` files here).

numpy has no product of a block-format weight with float32 activations, so without these
kernels a quantized weight is decoded to float32 (the weight cache) and multiplied by BLAS:
four to seven times the bytes per product and in memory. ``kernels.c`` multiplies straight
from the blocks.

They are compiled as the package is built or installed (setup.py), one library per x86-64
feature level (``variants.py``), so no compiler is needed at run time. ``kernels()`` loads the
best level this CPU can run and logs once which one. Where no installed library was built from
these sources (a checkout that was never installed, or an editable install whose C files have
changed since) and a C compiler is here (``$CC``, else ``cc``), it builds that level with the
runtime's ``compile_cached`` into ``$POLYDEV_CACHE_DIR/kernels``, under a name that hashes the
sources, flags and compiler. The CPU backend loads them as its first stream starts
(``kernels()``); a type rule asks only ``loaded_kernels()``, which never builds.

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
from pathlib import Path

from polydev.env import env_int, env_text
from polydev.errors import CompileError, ConfigError
from polydev.host_cores import host_core_sharers
from polydev.kernel_build import compile_cached

from . import variants
from .variants import Variant

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = sorted(HERE.glob("*.c"))
DISABLE_ENV = "POLYDEV_CPU_NATIVE"
VARIANT_ENV = "POLYDEV_CPU_KERNELS"
# Rounds an OpenMP thread spins after a parallel region before it sleeps (libgomp's default is
# 300,000). Alone on the host, a thread should outlast the Python between two decode steps
# (0.3-1 ms on a 2-core Zen 4 VM): asleep, it took 60-120 µs to wake for the next step's first
# kernel there, and at 20,000 rounds (0.3-0.5 ms there) it slept in most steps of the host's
# slow phases. 100,000 rounds is about 2.5 ms there. tg128 in turns, 20,000 against 100,000
# (`polydev bench -n 128 -r 3`, 4 rounds, a slow phase): qwen3moe 1B-class 127-166 against
# 150-179 t/s, 1B-class Q4_K 81-95 against 84-96, gemma-3-270m 84-95 against 87-102 (9 of 12
# rounds faster); in fast phases, the same; pp512 the same. Beside a driver that computes on
# the same cores (polydev.host_cores: PoCL), a spinning thread holds a core that driver's
# threads need at the switch to its layers: gemma-3-270m with half its layers on PoCL ran tg
# about 0.9x at 100,000 and 0.77x at 300,000 of its speed at SHARED_SPIN_COUNT.
SPIN_COUNT = "100000"
SHARED_SPIN_COUNT = "20000"

_i64, _ptr, _int, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float


def _entry(fn, argtypes: list, restype=None):
    fn.argtypes, fn.restype = argtypes, restype
    return fn


class NativeKernels:
    """The loaded library's entry points, with their C signatures declared; ``variant`` is
    its feature level, ``origin`` "installed" (built with the package) or "built" (by the
    loader, into the cache)."""

    def __init__(self, library: ctypes.CDLL, path: Path, origin: str) -> None:
        self.path, self.origin = path, origin
        self.variant = _entry(library.pd_variant, [], ctypes.c_char_p)().decode()
        self.source_id = library_source_id(library)
        self.dequantize_rows = _entry(library.pd_dequantize_rows,
                                      [_int, _ptr, _i64, _i64, _i64, _i64, _ptr, _int])
        self.f16_to_f32 = _entry(library.pd_f16_to_f32,
                                 [_ptr, _i64, _i64, _i64, _i64, _i64, _i64, _i64, _ptr])
        # the packed entry points of bound calls, each given its record's address (arguments.py)
        self.mul_mat_packed = _entry(library.pd_mul_mat_packed, [_ptr])
        self.flash_attn_f16_packed = _entry(library.pd_flash_attn_f16_packed, [_ptr, _f32, _f32])
        self.rope_f32_packed = _entry(library.pd_rope_f32_packed, [_ptr])
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
        self.glu_f32_packed = _entry(library.pd_glu_f32_packed, [_ptr])
        self.binary_f32_packed = _entry(library.pd_binary_f32_packed, [_ptr])
        self.soft_max_f32_packed = _entry(library.pd_soft_max_f32_packed, [_ptr, _f32])
        self.top_k_f32_packed = _entry(library.pd_top_k_f32_packed, [_ptr])
        self.sum_rows_f32_packed = _entry(library.pd_sum_rows_f32_packed, [_ptr])
        self.clamp_f32_packed = _entry(library.pd_clamp_f32_packed, [_ptr, _f32, _f32])
        self.get_f32_rows_packed = _entry(library.pd_get_f32_rows_packed, [_ptr], _int)
        self.get_rows_f32_packed = _entry(library.pd_get_rows_f32_packed, [_ptr], _int)
        # a run of bound calls (replay.c): the table's address, the first and the end index
        self.replay = _entry(library.pd_replay, [_ptr, _i64, _i64], _i64)
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


def _compiler_identity(cc: str) -> dict[str, str]:
    """What a build depends on beyond its sources and flags: the compiler, by its path and
    its own version text."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    return {"compiler": cc, "version": version.stdout}


def _build(cc: str, variant: Variant, flags: list[str]) -> Path:
    """The library of ``variant`` built with ``flags`` (the cache's, where built before)."""
    sources = {p.name: p.read_bytes() for p in sorted(HERE.glob("*.[ch]"))}

    def compile(target: Path) -> None:
        subprocess.run([cc, *flags, "-o", str(target), *map(str, SOURCES)], check=True,
                       capture_output=True, text=True, timeout=300)
    return compile_cached("kernels", f"the CPU kernels ({variant.name})", sources, flags,
                          _compiler_identity(cc), compile, suffix=".so")


def _open_library(path: Path) -> ctypes.CDLL:
    """dlopen ``path`` with libgomp's spin count at spin_count(): libgomp reads its settings
    from the environment once, as it loads with the library (a libgomp already loaded keeps its
    own). A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT wins, and the environment is left as it
    was, so child processes do not inherit the setting."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return ctypes.CDLL(str(path))
    os.environ["GOMP_SPINCOUNT"] = spin_count()
    try:
        return ctypes.CDLL(str(path))
    finally:
        del os.environ["GOMP_SPINCOUNT"]


def spin_count() -> str:
    """The OpenMP threads' spin count for this process (see SPIN_COUNT): SHARED_SPIN_COUNT
    where a device that computes on the host's cores has opened a backend, else SPIN_COUNT."""
    sharers = host_core_sharers()
    if sharers:
        log.debug("CPU kernels: OpenMP threads spin %s rounds (%s computes on these cores)",
                  SHARED_SPIN_COUNT, ", ".join(sharers))
        return SHARED_SPIN_COUNT
    return SPIN_COUNT


def library_source_id(library: ctypes.CDLL) -> str:
    """The checksum of the sources ``library`` was built from (``pd_source_id``)."""
    return _entry(library.pd_source_id, [], ctypes.c_char_p)().decode()


def _load_installed(variant: Variant) -> NativeKernels | None:
    path = installed_path(variant)
    if path is None:
        log.debug("the package has no build of the CPU kernels for %s", variant.name)
        return None
    library = _open_library(path)
    # checked before the entry points are declared: a build of older sources may lack some
    if library_source_id(library) != variants.source_id():
        log.info("the installed CPU kernels (%s) were built from other sources than these "
                 "(reinstall the package to rebuild them)", path)
        return None
    return NativeKernels(library, path, "installed")


def _load_built(variant: Variant) -> NativeKernels | None:
    """Build ``variant`` into the cache with this machine's compiler (once), then load it."""
    cc = _compiler()
    if cc is None:
        log.warning("the CPU kernels are not installed and there is no C compiler to build them "
                    "(set $CC or reinstall polydev): the CPU backend multiplies quantized "
                    "weights through float32 copies, which is slower and uses more memory")
        return None
    last_error: Exception | None = None
    for openmp in (True, False):                  # without OpenMP: one thread, still correct
        try:
            target = _build(cc, variant, _build_flags(variant, openmp))
            return NativeKernels(_open_library(target), target, "built")
        except (CompileError, OSError) as e:
            last_error = e
    log.warning("%s: the CPU backend multiplies quantized weights through float32 copies",
                last_error)
    return None


def _load() -> NativeKernels | None:
    variant = chosen_variant()
    lib = _load_installed(variant) or _load_built(variant)
    if lib is not None:
        log.info("CPU kernels: %s (%s, %s)", lib.variant, lib.origin, lib.path)
    return lib


@functools.lru_cache(maxsize=1)
def kernels() -> NativeKernels | None:
    """The compiled kernels, loaded (and built, where they must be) on the first call; None
    where there are none: the numpy path. The CPU backend calls it as a stream starts."""
    if not env_int(DISABLE_ENV):
        return None
    return _load()


def loaded_kernels() -> NativeKernels | None:
    """The compiled kernels where ``kernels()`` has loaded them, else None; never builds
    (what a type rule asks, so that ``supports_op`` never starts a compiler)."""
    return kernels() if kernels.cache_info().currsize else None
