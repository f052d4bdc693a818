"""The numpy side of the shared array kernels: zero-copy views into host buffers."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from polydev.buffer import BufferUsage
from polydev.errors import NotAllocatedError, UnsupportedError
from polydev.tensor import Tensor
from polydev.types import GGMLType, TYPE_TRAITS, dequantize, quantize

from polydev.backends.array.env import values_of

from .weights import WeightCache


def _host(t: Tensor) -> np.ndarray:
    if t.buffer is None:
        raise NotAllocatedError(f"tensor {t.name or '<unnamed>'} ne={list(t.ne)} is not allocated")
    if not t.buffer.is_host:
        raise UnsupportedError(f"the CPU backend cannot read tensor {t.name or '<unnamed>'} in "
                               f"{t.buffer.name} memory: copy it to host memory first")
    return t.buffer.host_array


class NumpyEnv:
    """ArrayEnv for numpy (see polydev.backends.array.env)."""

    xp = np

    def __init__(self, weight_cache: WeightCache) -> None:
        self.weight_cache = weight_cache

    def view(self, t: Tensor) -> np.ndarray:
        return np.ndarray(t.shape, dtype=TYPE_TRAITS[t.type].np_dtype, buffer=_host(t),
                          offset=t.offset, strides=t.nb[::-1])

    def rows(self, t: Tensor) -> np.ndarray:
        shape = (t.ne[3], t.ne[2], t.ne[1], t.row_bytes)
        return np.ndarray(shape, dtype=np.uint8, buffer=_host(t), offset=t.offset,
                          strides=(t.nb[3], t.nb[2], t.nb[1], 1))

    def dequantize(self, rows: Any, type_: GGMLType, out: Any = None) -> np.ndarray:
        return dequantize(rows, type_, out)

    def quantize(self, values: Any, type_: GGMLType) -> np.ndarray:
        return quantize(values, type_)

    def weight_f32(self, t: Tensor) -> Callable[[], np.ndarray]:
        if t.type == GGMLType.F32:
            values = self.view(t)
            return lambda: values
        decode = lambda: np.ascontiguousarray(values_of(self, t), dtype=np.float32)  # noqa: E731
        if t.buffer is not None and t.buffer.usage == BufferUsage.WEIGHTS:
            cache = self.weight_cache
            return lambda: cache.get(t, decode)
        return decode
