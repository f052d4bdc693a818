"""The CPU backend's memory-accounted cache of weights decoded to float32 (DESIGN decision 8).

numpy has no quantized matrix product, so a quantized (or F16/BF16) weight is decoded to
float32 once and reused by every later product, instead of being decoded on each token. Only
tensors in WEIGHTS buffers are cached; an entry is stale as soon as its buffer's generation
changes (every write through polydev bumps it). The cache holds at most ``budget`` bytes and
evicts the least recently used entries; a weight larger than the budget is decoded per use.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from typing import Callable

import numpy as np

from polydev.tensor import Tensor

log = logging.getLogger(__name__)

BUDGET_ENV = "POLYDEV_CPU_WEIGHT_CACHE_MB"


def default_budget(total_memory: int) -> int:
    """Bytes the cache may hold: $POLYDEV_CPU_WEIGHT_CACHE_MB, else half the physical memory."""
    env = os.environ.get(BUDGET_ENV)
    if env:
        return int(float(env) * 2**20)
    return total_memory // 2


class WeightCache:
    """LRU cache of decoded weights keyed by where their bytes are."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.nbytes = 0
        self._entries: OrderedDict[tuple, tuple[int, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, t: Tensor, decode: Callable[[], np.ndarray]) -> np.ndarray:
        buf = t.buffer
        key = (id(buf), t.offset, t.type, t.ne, t.nb)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0] == buf.generation:
                self._entries.move_to_end(key)
                return hit[1]
        values = decode()
        self._store(key, buf.generation, values)
        return values

    def _store(self, key: tuple, generation: int, values: np.ndarray) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.nbytes -= old[1].nbytes
            if values.nbytes > self.budget:
                log.debug("weight of %d bytes exceeds the cache budget; decoded per use",
                          values.nbytes)
                return
            while self.nbytes + values.nbytes > self.budget and self._entries:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.nbytes -= evicted.nbytes
            self._entries[key] = (generation, values)
            self.nbytes += values.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.nbytes = 0
