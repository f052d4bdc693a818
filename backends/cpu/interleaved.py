"""A weight's copy with 16 rows interleaved (native/interleaved.h), kept in the weight cache.

The interleaved kernels hold 16 weight rows value pair by value pair, so one vector
instruction adds a product pair to each of the 16 rows' own lanes (interleaved.h says why that
is faster than the rows one at a time). That layout is not the file's, so it is a copy: made
on first use, kept and counted by the device's weight cache (evicted, or made again after a
rewrite of the weight, as the cache decides), and read in place of the weight's own bytes,
whose file pages the cache lets go as it makes the copy (weights.py).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.buffer import BufferUsage
from polydev.tensor import Tensor

from .native import kernels

INTERLEAVE_GROUP = 16    # rows interleaved together (native/interleaved.c's ROWS16)


def interleaved_copy(env, w: Tensor) -> Callable[[], np.ndarray] | None:
    """The getter of ``w``'s interleaved copy (its matrices one after the other), or None where
    the weight cache keeps none: a weight outside a weights buffer (its bytes may change under
    a bound plan), a type and shape this build has no interleaved kernel for, or a copy larger
    than the cache's budget. Ask it on every call: a copy the cache evicted, or one of a
    rewritten buffer, is made again, and what the cache holds is what it counts."""
    lib = kernels()
    type_id, k = int(w.type), w.ne[0]
    if (w.buffer is None or w.buffer.usage != BufferUsage.WEIGHTS
            or w.ne[3] != 1 or w.nb[2] != w.ne[1] * w.nb[1]):
        return None
    size = lib.interleaved_bytes(type_id, w.ne[1], k) * w.ne[2]
    cache = env.weight_cache
    if not size or size > cache.budget:
        return None
    rows, row_bytes, n_threads = env.rows(w), w.nb[1], env.n_threads

    def interleave(out: np.ndarray, r0: int, n: int) -> None:
        lib.interleave(type_id, rows.ctypes.data + r0 * row_bytes, row_bytes, n, k,
                       out.ctypes.data + lib.interleaved_bytes(type_id, r0, k), n_threads)
    return cache.replacement(w, "interleaved", size, interleave, INTERLEAVE_GROUP)


class CopyAddress:
    """A replay's prepare of a call that reads ``weight``'s cached copy (``copy`` gets it) at
    ``args.p``: asks the cache only when the cache or the weight's buffer changed since it
    last did, and holds the copy it wrote the address of, so that another stream's eviction
    cannot free it under a replay (``release`` lets go). Returns True when asking changed
    the cache (it made the copy, and may have evicted another run's call's)."""

    def __init__(self, weight: Tensor, cache, copy: Callable[[], np.ndarray], args) -> None:
        self._buffer, self._cache, self._copy, self._args = weight.buffer, cache, copy, args
        self._seen: tuple[int, int] | None = None
        self._held: np.ndarray | None = None

    def __call__(self) -> bool:
        cache = self._cache
        if self._seen == (cache.version, self._buffer.generation):
            return False
        before = cache.version
        self._held = self._copy()
        self._args.p = self._held.ctypes.data
        self._seen = (cache.version, self._buffer.generation)
        return cache.version != before

    def watched(self) -> tuple:
        """The weight cache and the buffer whose versions this prepare compares: while
        neither changed since a pass left it as it was, calling it changes nothing."""
        return self._cache, self._buffer

    def release(self) -> None:
        """Let go of the copy (the next call asks the cache again)."""
        self._held, self._seen = None, None
