"""What a backend gives the shared array kernels: its array module and its views of tensors."""

from __future__ import annotations

from typing import Any, Callable, Hashable, Protocol

from polydev.tensor import Tensor
from polydev.types import GGMLType, TYPE_TRAITS


class ArrayEnv(Protocol):
    """The backend side of the array kernels (numpy for CPU, CuPy for CUDA).

    ``view`` gives a zero-copy strided array of a plain-type tensor (shape ``reversed(ne)``;
    BF16 as uint16 bits); ``rows`` gives a block-format tensor's rows as uint8
    ``(ne3, ne2, ne1, row_bytes)``; ``float32`` gives an array's values as float32 (fp16
    converted fast where the backend can); ``dequantize``/``quantize`` convert rows of any
    type with a codec; ``weight_f32`` returns a callable giving a float32 array of a
    matrix's values, cached across calls where the backend can prove the bytes did not
    change; ``memo(key, inputs, compute)`` may reuse the last ``compute()`` of ``key`` while
    the ``inputs`` arrays are unchanged (or always compute).
    """

    xp: Any

    def view(self, t: Tensor) -> Any: ...

    def rows(self, t: Tensor) -> Any: ...

    def float32(self, a: Any) -> Any: ...

    def memo(self, key: Hashable, inputs: tuple, compute: Callable[[], Any]) -> Any: ...

    def dequantize(self, rows: Any, type_: GGMLType, out: Any = None) -> Any: ...

    def quantize(self, values: Any, type_: GGMLType) -> Any: ...

    def weight_f32(self, t: Tensor) -> Callable[[], Any]: ...


def same_memory(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors are the same bytes under the same layout (an in-place op)."""
    return a.buffer is b.buffer and a.offset == b.offset and a.nb == b.nb and a.ne == b.ne


def needs_codec(type_: GGMLType) -> bool:
    """Whether a type's storage is not directly an array dtype (block formats and BF16)."""
    return TYPE_TRAITS[type_].is_quantized or type_ == GGMLType.BF16


def storage(env: ArrayEnv, t: Tensor) -> Any:
    """The array a kernel writes a tensor's stored form through: rows of block bytes for
    block formats, the element view otherwise (BF16 as uint16 bits)."""
    return env.rows(t) if TYPE_TRAITS[t.type].is_quantized else env.view(t)


def values_of(env: ArrayEnv, t: Tensor) -> Any:
    """A tensor's values as an array of shape reversed(ne): a view for plain types, decoded
    float32 for block formats and BF16."""
    if not needs_codec(t.type):
        return env.view(t)
    return env.dequantize(storage(env, t), t.type).reshape(t.shape)


def window(env: ArrayEnv, t: Tensor, ne, nb, offset: int) -> Any:
    """A zero-copy view of ``t``'s memory at byte ``offset`` with its own shape and strides
    (ggml's ACC/SET window); the caller has checked it lies inside ``t``."""
    w = Tensor(t.type, ne, nb, t.op)
    w.buffer, w.offset = t.buffer, t.offset + offset
    return env.view(w)
