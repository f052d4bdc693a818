"""``Tensor``: ggml's tensor record (metadata only; the bytes live in a backend buffer).

``ne`` holds the four dimensions with ne[0] the contiguous one, ``nb`` the byte strides, so the
numpy shape of a tensor is ``reversed(ne)``. A tensor is allocated when it has a ``buffer``; its
bytes start at ``offset`` in that buffer (ggml's ``data`` pointer, as an offset).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .errors import NotAllocatedError, ShapeError, TensorTypeError
from .types import GGMLType, TYPE_TRAITS, dequantize

if TYPE_CHECKING:
    from .buffer import Buffer
    from .ops import Op

MAX_DIMS = 4
MAX_SRC = 10


class TensorFlag(enum.IntFlag):
    """ggml's tensor flags: graph inputs/outputs are special to the allocator and scheduler."""

    NONE = 0
    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8


class Tensor:
    """A tensor's type, shape, strides, producing op and placement; see the module docstring."""

    __slots__ = ("type", "ne", "nb", "op", "op_params", "src", "view_src", "view_offs",
                 "buffer", "offset", "name", "flags", "extra", "__weakref__")

    def __init__(self, type_: GGMLType, ne: Sequence[int], nb: Sequence[int], op: "Op",
                 view_src: "Tensor | None" = None, view_offs: int = 0, name: str = ""):
        self.type = type_
        self.ne: tuple[int, int, int, int] = tuple(ne)   # type: ignore[assignment]
        self.nb: tuple[int, int, int, int] = tuple(nb)   # type: ignore[assignment]
        self.op = op
        self.op_params: tuple = ()
        self.src: list[Tensor | None] = []
        self.view_src = view_src
        self.view_offs = view_offs
        self.buffer: Buffer | None = None
        self.offset = 0
        self.name = name
        self.flags = TensorFlag.NONE
        self.extra: Any = None   # backend-private per-tensor state (ggml's tensor->extra)

    # --- shape queries (ggml_nelements, ggml_nbytes, ggml_is_contiguous, ...) ---------------

    @property
    def traits(self):
        """The type's traits: block size, bytes per block, numpy dtype."""
        return TYPE_TRAITS[self.type]

    @property
    def shape(self) -> tuple[int, ...]:
        """The numpy shape: ``reversed(ne)``, all four dimensions."""
        return self.ne[::-1]

    @property
    def n_dims(self) -> int:
        """ggml_n_dims: the number of dimensions up to the last one that is not 1."""
        for i in range(MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    @property
    def nelements(self) -> int:
        """ggml_nelements: the product of ne."""
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    @property
    def nrows(self) -> int:
        """ggml_nrows: ne1 * ne2 * ne3."""
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nbytes(self) -> int:
        """ggml_nbytes: the span from the first to one past the last byte the tensor touches."""
        ne0, ne1, ne2, ne3 = self.ne
        if ne0 <= 0 or ne1 <= 0 or ne2 <= 0 or ne3 <= 0:
            return 0
        nb0, nb1, nb2, nb3 = self.nb
        tr = TYPE_TRAITS[self.type]
        # unrolled: the graph allocator asks for every tensor's size on every new graph
        if tr.block_size == 1:
            n = tr.type_size + (ne0 - 1) * nb0
        else:
            n = ne0 * nb0 // tr.block_size
        return n + (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3

    @property
    def row_bytes(self) -> int:
        """The bytes of one row of ne0 elements (ggml_row_size)."""
        return TYPE_TRAITS[self.type].row_size(self.ne[0])

    def is_contiguous(self, n: int = 0) -> bool:
        """ggml_is_contiguous_n: dimensions above ``n`` are packed (0: fully contiguous)."""
        tr = TYPE_TRAITS[self.type]
        next_nb = tr.type_size
        if self.ne[0] != tr.block_size and self.nb[0] != next_nb:
            return False
        next_nb *= self.ne[0] // tr.block_size
        for i in range(1, MAX_DIMS):
            if self.ne[i] != 1:
                if i > n:
                    if self.nb[i] != next_nb:
                        return False
                    next_nb *= self.ne[i]
                else:
                    next_nb = self.ne[i] * self.nb[i]
        return True

    def is_contiguous_rows(self) -> bool:
        """Each row's elements are packed (nb[0] is the element size)."""
        return (self.ne[0] == TYPE_TRAITS[self.type].block_size or
            self.nb[0] == TYPE_TRAITS[self.type].type_size)

    def is_transposed(self) -> bool:
        """ggml_is_transposed: nb[0] > nb[1]."""
        return self.nb[0] > self.nb[1]

    def is_permuted(self) -> bool:
        """ggml_is_permuted: the strides are not in increasing order."""
        nb = self.nb
        return nb[0] > nb[1] or nb[1] > nb[2] or nb[2] > nb[3]

    def is_empty(self) -> bool:
        """Whether some dimension is 0."""
        return min(self.ne) == 0

    def same_shape(self, other: "Tensor") -> bool:
        """ggml_are_same_shape: equal ne."""
        return self.ne == other.ne

    def same_layout(self, other: "Tensor") -> bool:
        """ggml_are_same_layout: same type, ne and nb."""
        return self.type == other.type and self.ne == other.ne and self.nb == other.nb

    def can_repeat_to(self, other: "Tensor") -> bool:
        """ggml_can_repeat(self, other): every dimension of ``other`` is a multiple of ours."""
        if self.is_empty():
            return other.is_empty()
        return all(o % s == 0 for s, o in zip(self.ne, other.ne))

    @property
    def is_view(self) -> bool:
        """Whether the tensor views another tensor's memory."""
        return self.view_src is not None

    @property
    def is_allocated(self) -> bool:
        """Whether the tensor has a buffer."""
        return self.buffer is not None

    # --- flags ------------------------------------------------------------------------------

    def set_input(self) -> "Tensor":
        """Flag the tensor as a graph input (its memory is set before compute)."""
        self.flags |= TensorFlag.INPUT
        return self

    def set_output(self) -> "Tensor":
        """Flag the tensor as a graph output (its memory is never reused)."""
        self.flags |= TensorFlag.OUTPUT
        return self

    def set_param(self) -> "Tensor":
        """Flag the tensor as a trainable parameter (ggml's PARAM)."""
        self.flags |= TensorFlag.PARAM
        return self

    def set_name(self, name: str) -> "Tensor":
        """Set the name; returns the tensor."""
        self.name = name
        return self

    # --- data access through the tensor's buffer --------------------------------------------

    def _require_buffer(self) -> "Buffer":
        if self.buffer is None:
            raise NotAllocatedError(f"tensor {self.name or '<unnamed>'} has no buffer: allocate it "
                                    f"first (alloc_ctx_tensors, a graph allocator or a scheduler)")
        return self.buffer

    def set_data(self, array: Any) -> None:
        """Write values into the tensor, converting to its type (quantizing where it can).

        ``array`` holds the values in numpy order: its shape is ``reversed(ne)`` (leading 1s
        may be left out on either side, so a 2-d matrix fills an [K, M, 1, 1] tensor). Raw
        bytes load stored forms such as quantized weights: a ``bytes``-like object of exactly
        ``nbytes``, or for a block-format tensor a uint8 array of that many bytes. Anything
        else raises and writes nothing.
        """
        from .buffer import tensor_get, tensor_set   # buffer.py imports this module
        self._require_buffer()
        raw = _raw_bytes_if_any(array, self)
        if raw is not None:
            tensor_set(self, raw)
            return
        values = _checked_values(array, self)
        encoded = _encode(values.reshape(self.shape), self.type)
        if self.is_contiguous():
            tensor_set(self, encoded)
            return
        if self.traits.is_quantized:
            raise ShapeError(f"cannot write values into the non-contiguous quantized tensor "
                             f"{self.name or '<unnamed>'}: write its raw bytes instead")
        span = tensor_get(self)          # read-modify-write keeps the bytes between strides
        _strided(span, self)[...] = encoded
        tensor_set(self, span)

    def numpy(self) -> np.ndarray:
        """The tensor's values as a new contiguous numpy array of shape ``reversed(ne)``.

        Plain types keep their dtype; F16 stays float16; BF16 and block formats are decoded
        to float32.
        """
        from .buffer import tensor_get
        self._require_buffer()
        span = tensor_get(self)
        tr = self.traits
        if tr.is_quantized:
            rows = _strided_rows(span, self)
            return dequantize(rows, self.type).reshape(self.shape)
        values = np.array(_strided(span, self))
        if self.type == GGMLType.BF16:
            return dequantize(values, self.type).reshape(self.shape)
        return values

    def __repr__(self) -> str:
        where = "unallocated"
        if self.buffer is not None:
            where = f"{self.buffer.name}+{self.offset:#x}"
        view = f", view of {self.view_src.name or '?'}+{self.view_offs}" if self.view_src else ""
        flags = f", flags={self.flags!r}" if self.flags else ""
        return (f"Tensor({self.name!r}, {self.type}, ne={list(self.ne)}, nb={list(self.nb)}, "
                f"op={self.op.name}{view}, {where}{flags})")


def contiguous_strides(type_: GGMLType, ne: Sequence[int]) -> tuple[int, int, int, int]:
    """Packed byte strides for ``ne`` (what ggml_new_tensor gives)."""
    tr = TYPE_TRAITS[type_]
    if ne[0] % tr.block_size:
        raise ShapeError(f"ne[0]={ne[0]} is not a multiple of the {tr.name} block size "
                         f"{tr.block_size}")
    nb0 = tr.type_size
    nb1 = nb0 * (ne[0] // tr.block_size)
    nb2 = nb1 * ne[1]
    return (nb0, nb1, nb2, nb2 * ne[2])


def _strided(span: np.ndarray, t: Tensor) -> np.ndarray:
    """A numpy view of a plain-type tensor over the bytes of its span."""
    dtype = t.traits.np_dtype
    return np.ndarray(t.shape, dtype=dtype, buffer=span, offset=0, strides=t.nb[::-1])


def _strided_rows(span: np.ndarray, t: Tensor) -> np.ndarray:
    """A (ne3, ne2, ne1, row_bytes) uint8 view of a block-format tensor's rows."""
    shape = (t.ne[3], t.ne[2], t.ne[1], t.row_bytes)
    return np.ndarray(shape, dtype=np.uint8, buffer=span, offset=0,
                      strides=(t.nb[3], t.nb[2], t.nb[1], 1))


def _encode(values: np.ndarray, type_: GGMLType) -> np.ndarray:
    from .types import quantize
    tr = TYPE_TRAITS[type_]
    if not tr.is_float and not tr.is_quantized:
        if not (np.issubdtype(values.dtype, np.integer) or values.dtype == np.bool_):
            raise TensorTypeError(f"cannot store {values.dtype} values in an {tr.name} tensor")
        return values.astype(tr.np_dtype)
    same_half = type_ == GGMLType.F16 and values.dtype == np.float16
    if type_ in (GGMLType.F32, GGMLType.F64) or same_half:
        return values.astype(tr.np_dtype)
    return quantize(values, type_)


def _raw_bytes_if_any(array: Any, t: Tensor) -> np.ndarray | None:
    """The bytes to write as they are: a bytes-like object (exactly nbytes of them), or a
    uint8 array of exactly nbytes for a block-format tensor."""
    if isinstance(array, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(array, dtype=np.uint8)
        if raw.size != t.nbytes:
            raise ShapeError(f"cannot set {t.name or 'tensor'} ({t.type}, ne={list(t.ne)}, "
                             f"{t.nbytes} bytes) from {raw.size} raw bytes")
        return raw
    if (isinstance(array, np.ndarray) and array.dtype == np.uint8 and t.traits.is_quantized
            and array.nbytes == t.nbytes):
        return np.ascontiguousarray(array).reshape(-1)
    return None


# numpy kinds a tensor's values may come as: booleans, integers and real floats
_VALUE_KINDS = "biuf"


def _checked_values(array: Any, t: Tensor) -> np.ndarray:
    """``array`` as numpy values of real numbers in the tensor's shape, or a typed error."""
    try:
        values = np.asarray(array)
    except (TypeError, ValueError) as e:       # ragged nested sequences
        raise ShapeError(f"cannot set {t.name or 'tensor'} from {type(array).__name__}: "
                         f"{e}") from None
    if values.dtype.kind not in _VALUE_KINDS:
        raise TensorTypeError(f"cannot set {t.name or 'tensor'} ({t.type}) from an array of "
                              f"{values.dtype} values: real numbers only")
    if _without_leading_ones(values.shape) != _without_leading_ones(t.shape):
        raise ShapeError(f"cannot set {t.name or 'tensor'} with ne={list(t.ne)} (numpy shape "
                         f"{_without_leading_ones(t.shape)}) from an array of shape "
                         f"{values.shape}")
    return values


def _without_leading_ones(shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(shape)
    while shape and shape[0] == 1:
        shape = shape[1:]
    return shape
