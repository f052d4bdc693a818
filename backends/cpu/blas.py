"""numpy's BLAS beside the compiled kernels: a small product runs on the calling thread alone.

The compiled kernels run on OpenMP threads, one per core, and numpy's BLAS (OpenBLAS) has a
pool of its own. OpenBLAS's workers spin for a while after each call they share before they
sleep, so a product that BLAS splits over its pool leaves workers competing with the OpenMP
threads of the kernels after it. In a mixture of experts the router (F32 weights: 512 rows x
2048 by 16 experts, once per layer) sat between the integer products, and the 1B-class
qwen3moe of bench/models.py ran a 512-token prompt at 998 t/s where it runs at 1934 t/s with
this (2 Zen 4 cores). A product of fewer than ``SMALL_PRODUCT_MACS`` multiply-adds gains
little from a second thread, so it runs with the pool limited to one, which wakes no worker;
larger ones (float weights, exact numerics' tiles) keep the pool, where their own speed-up
outweighs the spin.

The limit is set through OpenBLAS's own ``openblas_set_num_threads`` (found as threadpoolctl
finds the library); where numpy's BLAS is another library, or threadpoolctl is missing, the
products run as they are.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
from typing import Callable

from polydev.ops import Op
from polydev.tensor import Tensor

log = logging.getLogger(__name__)

SMALL_PRODUCT_MACS = 1 << 25     # multiply-adds below which a product runs on one thread

_OPENBLAS_PREFIXES = ("", "scipy_")          # numpy's wheels carry scipy-openblas
_OPENBLAS_SUFFIXES = ("", "64_", "_64")      # ... with 64-bit integers


@functools.cache
def openblas_threads() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """numpy's OpenBLAS (get_num_threads, set_num_threads), or None where there is none."""
    import numpy  # noqa: F401  (threadpoolctl finds the BLAS numpy has loaded)
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    for lib in ThreadpoolController().select(internal_api="openblas").lib_controllers:
        dll = ctypes.CDLL(lib.filepath)
        for prefix, suffix in itertools.product(_OPENBLAS_PREFIXES, _OPENBLAS_SUFFIXES):
            get = getattr(dll, f"{prefix}openblas_get_num_threads{suffix}", None)
            set_ = getattr(dll, f"{prefix}openblas_set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.restype, get.argtypes = ctypes.c_int, []
                set_.restype, set_.argtypes = None, [ctypes.c_int]
                return get, set_
    log.debug("numpy's BLAS is not OpenBLAS: small products keep its thread pool")
    return None


def sized_for_blas(call: Callable[[], None], macs: int) -> Callable[[], None]:
    """``call`` (a product through numpy's BLAS of ``macs`` multiply-adds), run with BLAS on
    the calling thread alone when the product is small (see the module); else ``call``."""
    threads = openblas_threads() if macs < SMALL_PRODUCT_MACS else None
    if threads is None:
        return call
    get_threads, set_threads = threads

    def on_one_thread() -> None:
        n = get_threads()
        if n == 1:
            call()
            return
        set_threads(1)
        try:
            call()
        finally:
            set_threads(n)
    return on_one_thread


def product_macs(node: Tensor) -> int:
    """Multiply-adds of a MUL_MAT, MUL_MAT_ID or OUT_PROD node: its outputs times the length
    they sum over."""
    k = node.src[1].ne[1] if node.op == Op.OUT_PROD else node.src[0].ne[0]
    return node.ne[0] * node.ne[1] * node.ne[2] * node.ne[3] * k
