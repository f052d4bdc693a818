"""The CPU backend's memory-accounted cache of weights decoded to float32, or repacked for the
compiled kernels (docs/design.md, decision 8).

numpy has no quantized matrix product, so a quantized (or F16/BF16) weight is decoded to
float32 once and reused by every later product, instead of being decoded on each token; and
the compiled kernels multiply a few activation rows fastest by a weight with 16 rows
interleaved (native/interleaved.c), made once per weight the same way. Only
tensors in WEIGHTS buffers are cached. An entry is keyed by its buffer's ``uid`` (never
reused, unlike ``id()``) and is stale as soon as the buffer's generation changes (every write
through polydev bumps it); freeing a buffer drops its entries. The cache holds at most
``budget`` bytes ($POLYDEV_CPU_WEIGHT_CACHE_MB, else half the physical memory) and evicts the
least recently used entries; a weight larger than the budget is decoded per use.

A copy the kernels read in place of a weight (the interleaved one) replaces the weight's own
bytes, and where those are a model file's pages the cache lets them go as it makes the copy
(``replacement``): the file's pages and the copy are not held at once.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from polydev.buffer import Buffer
from polydev.env import env_float
from polydev.tensor import Tensor

from .buffer import CPUBuffer

log = logging.getLogger(__name__)

BUDGET_ENV = "POLYDEV_CPU_WEIGHT_CACHE_MB"
REPLACE_STEP_BYTES = 16 << 20   # a weight's bytes copied between two drops of their pages


class WeightCache:
    """LRU cache of decoded weights keyed by where their bytes are."""

    def __init__(self, default_budget: Callable[[], int]) -> None:
        self._default_budget = default_budget
        self._budget: int | None = None
        self.nbytes = 0
        self._entries: OrderedDict[tuple, tuple[int, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        # bumped by every store, eviction and drop: a holder of an entry's address (a replayed
        # plan, replay.py) whose version is unchanged holds an entry still in the cache
        self.version = 0

    @property
    def budget(self) -> int:
        """Bytes the cache may hold, read from the environment on first use."""
        if self._budget is None:
            mib = env_float(BUDGET_ENV)           # None when unset
            self._budget = self._default_budget() if mib is None else int(mib * 2**20)
        return self._budget

    def get(self, t: Tensor, decode: Callable[[], np.ndarray], kind: str = "f32") -> np.ndarray:
        """``t``'s values in the form ``kind`` names ("f32": decoded to float32): cached while
        its buffer is unchanged, else ``decode()``."""
        buf = t.buffer
        key = (buf.uid, t.offset, t.type, t.ne, t.nb, kind)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0] == buf.generation:
                self._entries.move_to_end(key)
                return hit[1]
        values = decode()
        self._store(key, buf.generation, values)
        return values

    def replacement(self, t: Tensor, kind: str, nbytes: int,
                    copy_rows: Callable[[np.ndarray, int, int], None],
                    row_multiple: int = 1) -> Callable[[], np.ndarray]:
        """The getter of a copy of ``t`` (``nbytes`` bytes, in the form ``kind`` names) that
        the kernels read in place of ``t``'s own bytes: cached as ``get`` caches, and made,
        where it is not, by ``copy_rows(out, r0, n)``, which writes rows [r0, r0 + n) of
        ``t`` (its rows counted across its matrices, ``t.nb[1]`` bytes apart throughout) into
        their place in ``out``; see ``copy_replacing``."""
        def make() -> np.ndarray:
            return copy_replacing(t, nbytes, copy_rows, row_multiple)
        return lambda: self.get(t, make, kind)

    def forget(self, buffer: Buffer) -> None:
        """Drop every entry of ``buffer`` (it is being freed)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == buffer.uid]:
                self.nbytes -= self._entries.pop(key)[1].nbytes
            self.version += 1

    def _store(self, key: tuple, generation: int, values: np.ndarray) -> None:
        budget = self.budget
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[1].nbytes
                self.version += 1
            if values.nbytes > budget:
                log.debug("weight of %d bytes exceeds the cache budget; decoded per use",
                          values.nbytes)
                return
            while self.nbytes + values.nbytes > budget and self._entries:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.nbytes -= evicted.nbytes
            self._entries[key] = (generation, values)
            self.nbytes += values.nbytes
            self.version += 1

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self.nbytes = 0
            self.version += 1


def copy_replacing(t: Tensor, nbytes: int, copy_rows: Callable[[np.ndarray, int, int], None],
                   row_multiple: int = 1) -> np.ndarray:
    """A copy of ``t`` of ``nbytes`` bytes, made by ``copy_rows`` (see
    ``WeightCache.replacement``) about REPLACE_STEP_BYTES of ``t``'s bytes at a time, in
    whole multiples of ``row_multiple`` rows. Where ``t``'s bytes are a read-only file's pages
    (a model's weights), each step's pages are dropped as soon as they are copied, so that the
    file's pages and the copy are never resident whole at once (gemma-3's 170 MiB token
    embedding would otherwise add its size to the peak); then the whole range is marked as
    replaced, which drops the pages the steps' edges shared, and drops them again as reads of
    the weight's rows (GET_ROWS of a tied embedding) bring them back."""
    out = np.empty(nbytes, dtype=np.uint8)
    file_pages = t.buffer if isinstance(t.buffer, CPUBuffer) else None
    n_rows, row_bytes = t.nrows, t.nb[1]
    step = max(row_multiple, REPLACE_STEP_BYTES // row_bytes // row_multiple * row_multiple)
    for r0 in range(0, n_rows, step):
        n = min(step, n_rows - r0)
        copy_rows(out, r0, n)
        if file_pages is not None:
            file_pages.drop_pages(t.offset + r0 * row_bytes, n * row_bytes)
    if file_pages is not None:
        file_pages.replaced_by_copy(t.offset, t.nbytes)
    return out
