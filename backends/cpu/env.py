"""The numpy side of the shared array kernels: zero-copy views into host buffers."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Hashable

import numpy as np

from polydev.buffer import BufferUsage
from polydev.errors import NotAllocatedError, UnsupportedError
from polydev.numerics import DEFAULT_NUMERICS
from polydev.probes import physical_cores
from polydev.tensor import Tensor
from polydev.types import GGMLType, TYPE_TRAITS, dequantize, quantize

from polydev.backends.array.env import values_of

from .native import kernels
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
        self.n_threads = physical_cores()             # threads of the compiled kernels
        self.numerics = DEFAULT_NUMERICS                # see polydev.numerics
        self._scratch = np.empty(0, dtype=np.float32)
        self._memo: dict[Hashable, tuple[tuple, Any]] = {}
        # what the bound calls of this stream share, kept while one of them holds it (the angle
        # tables of a step's ROPEs, which a call fills without a lock: one stream runs one plan
        # at a time)
        self.shared: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def memo(self, key: Hashable, inputs: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``, reused while the arrays in ``inputs`` hold the values they held when
        it last ran for ``key`` (nodes of one graph that derive the same table)."""
        # compared as (shape, dtype, bytes): np.array_equal took about 5 µs per check, and a
        # decode step checks once per ROPE
        seen = tuple((a.shape, a.dtype, a.tobytes()) for a in inputs)
        hit = self._memo.get(key)
        if hit is not None and hit[0] == seen:
            return hit[1]
        value = compute()
        self._memo[key] = (seen, value)
        return value

    def scratch(self, n: int) -> np.ndarray:
        """``n`` float32 of working memory, shared by this stream's kernels (they run one at
        a time): the largest request so far is kept, never one buffer per node."""
        if self._scratch.size < n:
            self._scratch = np.empty(n, dtype=np.float32)
        return self._scratch[:n]

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

    def float32(self, a: np.ndarray) -> np.ndarray:
        """``a``'s values as float32 (a view where they already are); fp16 through the
        compiled kernels, which convert with the CPU's own instructions."""
        lib = kernels()
        if a.dtype != np.float16 or lib is None or a.ndim > 4 or a.strides[-1] != 2:
            return np.asarray(a, dtype=np.float32)
        shape = (1,) * (4 - a.ndim) + a.shape
        strides = (0,) * (4 - a.ndim) + a.strides
        out = np.empty(a.shape, dtype=np.float32)
        lib.f16_to_f32(a.ctypes.data, shape[3], shape[2], strides[2], shape[1], strides[1],
                       shape[0], strides[0], out.ctypes.data)
        return out

    def weight_f32(self, t: Tensor) -> Callable[[], np.ndarray]:
        if t.type == GGMLType.F32:
            values = self.view(t)
            return lambda: values
        decode = lambda: np.ascontiguousarray(values_of(self, t), dtype=np.float32)  # noqa: E731
        if t.buffer is not None and t.buffer.usage == BufferUsage.WEIGHTS:
            cache = self.weight_cache
            return lambda: cache.get(t, decode)
        return decode
