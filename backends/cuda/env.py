"""The CuPy side of the shared array kernels: zero-copy views of tensors in GPU memory, and
block formats decoded by the backend's own kernels.

Every array here lives on the backend's device; the kernels that use them run inside the
backend's device and stream context, so CuPy queues their work on the backend's stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from polydev.errors import NotAllocatedError, UnsupportedError
from polydev.tensor import Tensor
from polydev.types import GGMLType, TYPE_TRAITS, dequantize, quantize

from .binders import ROW_TYPE_NAMES, dequantize_args

if TYPE_CHECKING:
    from .backend import CUDABackend


class CupyEnv:
    """ArrayEnv for CuPy (see polydev.backends.array.env)."""

    def __init__(self, backend: "CUDABackend", cupy: Any) -> None:
        self.backend = backend
        self.xp = cupy

    def _memptr(self, t: Tensor) -> Any:
        buf = t.buffer
        if buf is None:
            raise NotAllocatedError(f"tensor {t.name or '<unnamed>'} ne={list(t.ne)} is not "
                                    f"allocated")
        memptr = getattr(buf, "memptr", None)
        if memptr is None:
            raise UnsupportedError(f"{self.backend.name} cannot read tensor "
                                   f"{t.name or '<unnamed>'} in {buf.name} memory")
        return memptr + t.offset

    def view(self, t: Tensor) -> Any:
        return self.xp.ndarray(t.shape, dtype=TYPE_TRAITS[t.type].np_dtype,
                               memptr=self._memptr(t), strides=t.nb[::-1])

    def rows(self, t: Tensor) -> Any:
        shape = (t.ne[3], t.ne[2], t.ne[1], t.row_bytes)
        return self.xp.ndarray(shape, dtype=np.uint8, memptr=self._memptr(t),
                               strides=(t.nb[3], t.nb[2], t.nb[1], 1))

    def memo(self, key: Any, inputs: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()``: comparing device arrays would cost a synchronisation per call."""
        return compute()

    def float32(self, a: Any) -> Any:
        """``a``'s values as float32 (a view where they already are)."""
        return self.xp.asarray(a, dtype=self.xp.float32)

    def dequantize(self, rows: Any, type_: GGMLType, out: Any = None) -> Any:
        return self.decode(rows, type_, np.float32, out)

    def decode(self, rows: Any, type_: GGMLType, dtype: Any, out: Any = None) -> Any:
        """Rows of ``type_`` bytes (last axis: a row's bytes; BF16/F16 may come as their
        uint16/float16 elements) decoded to contiguous ``dtype`` (float32 or float16)."""
        xp = self.xp
        if type_ not in ROW_TYPE_NAMES or type_ == GGMLType.F32:
            return self._decode_on_host(rows, type_, dtype, out)
        tr = TYPE_TRAITS[type_]
        raw = rows if rows.dtype == np.uint8 else rows.view(np.uint8)
        if raw.strides[-1] != 1:
            raw = xp.ascontiguousarray(raw)
        lead = raw.shape[:-1]
        raw4 = raw.reshape((1,) * (4 - raw.ndim) + raw.shape) if raw.ndim < 4 else raw
        if raw4.ndim != 4:
            raw4 = raw.reshape(-1, raw.shape[-1])[None, None]
        k = raw.shape[-1] // tr.type_size * tr.block_size
        result = out if out is not None else xp.empty(lead + (k,), dtype=dtype)
        if result.dtype != dtype or not result.flags.c_contiguous:
            raise UnsupportedError(f"decode into a {result.dtype} array that is not contiguous")
        ne = (k, raw4.shape[2], raw4.shape[1], raw4.shape[0])
        grid, block, args = dequantize_args(raw4.data.ptr, raw4.strides[2::-1], ne,
                                            result.data.ptr)
        kind = "f16" if dtype == np.float16 else "f32"
        self.backend.kernel(f"dequantize_{kind}_{ROW_TYPE_NAMES[type_]}")(grid, block, args)
        return result

    def _decode_on_host(self, rows: Any, type_: GGMLType, dtype: Any, out: Any) -> Any:
        """Types without a GPU decoder (IQ formats, ...) take a round trip through numpy."""
        values = self.xp.asarray(dequantize(self.xp.asnumpy(rows), type_).astype(dtype))
        if out is None:
            return values
        out[...] = values.reshape(out.shape)
        return out

    def quantize(self, values: Any, type_: GGMLType) -> Any:
        """Encoding runs on the host (numpy's reference quantizers), then goes back."""
        return self.xp.asarray(quantize(self.xp.asnumpy(values), type_))

    def weight_f32(self, t: Tensor) -> Callable[[], Any]:
        """F32 weights are viewed; others are decoded per use into stream-ordered pool memory
        (a GPU decodes far faster than it could look a cache up and keep it coherent)."""
        if t.type == GGMLType.F32:
            values = self.view(t)
            return lambda: values
        if t.type == GGMLType.F16:
            values = self.view(t)
            return lambda: values.astype(np.float32)
        rows = self.rows(t)
        return lambda: self.dequantize(rows, t.type).reshape(t.shape)

    def weight_f16(self, t: Tensor) -> Callable[[], Any]:
        """A weight as float16 for cuBLAS' half-precision products: F16 is viewed, others
        are decoded per use."""
        if t.type == GGMLType.F16:
            values = self.view(t)
            return lambda: values
        rows = self.rows(t)
        return lambda: self.decode(rows, t.type, np.float16).reshape(t.shape)
