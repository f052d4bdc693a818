"""``Context``: the factory of tensor metadata (ggml_context with no_alloc).

A context creates tensors and remembers them in creation order, so ``alloc_ctx_tensors`` can
place all of them in one buffer. It holds no tensor data.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from . import ops
from .errors import OutOfBoundsError
from .ops import Op
from .tensor import Tensor, contiguous_strides
from .types import GGMLType


class Context:
    """Creates tensors (1-4 dimensions), views and reshapes; see ``polydev.ops`` for compute ops."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.tensors: list[Tensor] = []

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def get_tensor(self, name: str) -> Tensor | None:
        """The first tensor of this context with that name (ggml_get_tensor)."""
        return next((t for t in self.tensors if t.name == name), None)

    # --- new tensors ------------------------------------------------------------------------

    def new_tensor(self, type_: GGMLType | str, ne: Sequence[int], name: str = "") -> Tensor:
        """A new contiguous tensor of 1 to 4 dimensions (ne[0] first)."""
        type_ = GGMLType.parse(type_)
        ne4 = ops._pad4(ne)
        t = Tensor(type_, ne4, contiguous_strides(type_, ne4), Op.NONE, name=name)
        self.tensors.append(t)
        return t

    def new_tensor_1d(self, type_, ne0: int, name: str = "") -> Tensor:
        """A new contiguous tensor [ne0]."""
        return self.new_tensor(type_, (ne0,), name)

    def new_tensor_2d(self, type_, ne0: int, ne1: int, name: str = "") -> Tensor:
        """A new contiguous tensor [ne0, ne1] (numpy shape (ne1, ne0))."""
        return self.new_tensor(type_, (ne0, ne1), name)

    def new_tensor_3d(self, type_, ne0: int, ne1: int, ne2: int, name: str = "") -> Tensor:
        """A new contiguous tensor [ne0, ne1, ne2]."""
        return self.new_tensor(type_, (ne0, ne1, ne2), name)

    def new_tensor_4d(self, type_, ne0: int, ne1: int, ne2: int, ne3: int, name: str = "") -> Tensor:
        """A new contiguous tensor [ne0, ne1, ne2, ne3]."""
        return self.new_tensor(type_, (ne0, ne1, ne2, ne3), name)

    def dup_tensor(self, a: Tensor) -> Tensor:
        """A new tensor with ``a``'s type and shape (no data, no op)."""
        return self.new_tensor(a.type, a.ne)

    def new_view(self, a: Tensor, ne: Sequence[int], nb: Sequence[int], offset: int) -> Tensor:
        """A tensor over ``a``'s memory at byte ``offset`` with the given ne/nb (op NONE).

        Views of views resolve to the root tensor that owns the memory, as in ggml.
        """
        root = a.view_src if a.view_src is not None else a
        view_offs = a.view_offs + offset
        t = Tensor(a.type, ne, nb, Op.NONE, view_src=root, view_offs=view_offs)
        if offset < 0 or (t.nbytes and view_offs + t.nbytes > root.nbytes):
            raise OutOfBoundsError(
                f"view ne={list(t.ne)} nb={list(t.nb)} at offset {offset} of "
                f"{a.name or '<unnamed>'} spans bytes [{view_offs}, {view_offs + t.nbytes}) but "
                f"{root.name or 'its source'} has only {root.nbytes} bytes")
        if root.buffer is not None:   # a view of allocated memory is usable at once
            t.buffer, t.offset = root.buffer, root.offset + view_offs
        self.tensors.append(t)
        return t

    # --- views and reshapes (delegating to the op catalogue) --------------------------------

    def view_1d(self, a, ne0, offset=0):
        """``polydev.ops.view_1d`` in this context."""
        return ops.view_1d(self, a, ne0, offset)

    def view_2d(self, a, ne0, ne1, nb1, offset=0):
        """``polydev.ops.view_2d`` in this context."""
        return ops.view_2d(self, a, ne0, ne1, nb1, offset)

    def view_3d(self, a, ne0, ne1, ne2, nb1, nb2, offset=0):
        """``polydev.ops.view_3d`` in this context."""
        return ops.view_3d(self, a, ne0, ne1, ne2, nb1, nb2, offset)

    def view_4d(self, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset=0):
        """``polydev.ops.view_4d`` in this context."""
        return ops.view_4d(self, a, ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset)

    def reshape(self, a: Tensor, *ne: int) -> Tensor:
        """``a``'s memory with the shape ``ne`` (1 to 4 sizes, same element count)."""
        return ops.reshape(self, a, *ne)

    def permute(self, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
        """``a`` with dimension i moved to position axis_i (ggml_permute)."""
        return ops.permute(self, a, axis0, axis1, axis2, axis3)

    def transpose(self, a: Tensor) -> Tensor:
        """``a`` with its first two dimensions swapped (a strided view)."""
        return ops.transpose(self, a)

    def cont(self, a: Tensor, *ne: int) -> Tensor:
        """A contiguous copy of ``a``, optionally reshaped to ``ne``."""
        return ops.cont(self, a, *ne)
