"""The host's memory read bandwidth: what a decode step, which reads each weight once, can
reach at most.

    python bench/bandwidth.py [--threads 2] [--mib 1024]

A loop over a buffer far larger than the caches, split over OpenMP threads as the kernels
split a product's rows, folding its 64-bit words with XOR in vector registers (the result is
returned, so the compiler keeps the reads). The loop is compiled here with the host's C
compiler at first use, for this host (-O3 -march=native: the widest loads it has; scalar
loads read 20% less than the kernels did), into a temporary folder: a bench helper, never
shipped, so the kernels' library carries no such function. Best of 5 passes, in bytes/s;
``measured_in_child`` runs it in a fresh process, as a parent's peak RSS (a 1 GiB buffer)
would count in every child it starts.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

SOURCE = r"""
#include <stdint.h>
uint64_t read_all(const uint64_t *p, int64_t n, int n_threads) {
    uint64_t total = 0;
#pragma omp parallel num_threads(n_threads) reduction(^:total)
    {
        uint64_t lanes[8] = {0};
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i += 8)
            for (int j = 0; j < 8; j++) lanes[j] ^= p[i + j];
        for (int j = 0; j < 8; j++) total ^= lanes[j];
    }
    return total;
}
"""


@functools.cache
def _library() -> ctypes.CDLL:
    folder = Path(tempfile.mkdtemp(prefix="polydev-bandwidth-"))
    (folder / "read.c").write_text(SOURCE)
    subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-o",
                    str(folder / "read.so"), str(folder / "read.c")], check=True)
    lib = ctypes.CDLL(str(folder / "read.so"))
    lib.read_all.restype = ctypes.c_uint64
    lib.read_all.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    return lib


def read_bandwidth(threads: int = 2, mib: int = 1024, passes: int = 5) -> float:
    """Bytes/s that ``threads`` threads read from a ``mib`` MiB buffer: the best of
    ``passes``."""
    words = np.ones(mib * 2**20 // 8, dtype=np.uint64)      # written: its pages are real
    lib, best = _library(), 0.0
    lib.read_all(words.ctypes.data, words.size, threads)      # threads started, pages warm
    for _ in range(passes):
        start = time.perf_counter()
        lib.read_all(words.ctypes.data, words.size, threads)
        best = max(best, words.nbytes / (time.perf_counter() - start))
    return best


def median_bandwidth(threads: int = 2) -> float:
    """The median of 3 ``read_bandwidth(threads)``."""
    return sorted(read_bandwidth(threads) for _ in range(3))[1]


def measured_in_child(threads: int = 2) -> float:
    """``median_bandwidth(threads)`` in a fresh interpreter."""
    from figures import run_child  # bench/

    done = run_child("bandwidth", f"median_bandwidth({threads})")
    if isinstance(done, str):
        raise RuntimeError(f"measuring the read bandwidth failed: {done}")
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="threads reading (2)")
    parser.add_argument("--mib", type=int, default=1024, help="buffer size in MiB (1024)")
    args = parser.parse_args()
    print(f"{read_bandwidth(args.threads, args.mib) / 1e9:.1f} GB/s read, "
          f"{args.threads} threads")


if __name__ == "__main__":
    main()
