"""The CPU backend's memory-accounted cache of weights decoded to float32, or repacked for the
compiled kernels (DESIGN decision 8).

numpy has no quantized matrix product, so a quantized (or F16/BF16) weight is decoded to
float32 once and reused by every later product, instead of being decoded on each token; and
the compiled kernels multiply a few activation rows fastest by a weight with 16 rows
interleaved (native/interleaved.c), made once per weight the same way. Only
tensors in WEIGHTS buffers are cached. An entry is keyed by its buffer's ``uid`` (never
reused, unlike ``id()``) and is stale as soon as the buffer's generation changes (every write
through polydev bumps it); freeing a buffer drops its entries. The cache holds at most
``budget`` bytes ($POLYDEV_CPU_WEIGHT_CACHE_MB, else half the physical memory) and evicts the
least recently used entries; a weight larger than the budget is decoded per use.
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

log = logging.getLogger(__name__)

BUDGET_ENV = "POLYDEV_CPU_WEIGHT_CACHE_MB"


class WeightCache:
    """LRU cache of decoded weights keyed by where their bytes are."""

    def __init__(self, default_budget: Callable[[], int]) -> None:
        self._default_budget = default_budget
        self._budget: int | None = None
        self.nbytes = 0
        self._entries: OrderedDict[tuple, tuple[int, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()

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

    def forget(self, buffer: Buffer) -> None:
        """Drop every entry of ``buffer`` (it is being freed)."""
        with self._lock:
            for key in [k for k in self._entries if k[0] == buffer.uid]:
                self.nbytes -= self._entries.pop(key)[1].nbytes

    def _store(self, key: tuple, generation: int, values: np.ndarray) -> None:
        budget = self.budget
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[1].nbytes
            if values.nbytes > budget:
                log.debug("weight of %d bytes exceeds the cache budget; decoded per use",
                          values.nbytes)
                return
            while self.nbytes + values.nbytes > budget and self._entries:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.nbytes -= evicted.nbytes
            self._entries[key] = (generation, values)
            self.nbytes += values.nbytes

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self.nbytes = 0
