"""What every builder shares: validation that raises typed errors, and result creation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..errors import ShapeError
from ..tensor import MAX_DIMS, Tensor
from ..types import GGMLType
from .catalogue import Op

if TYPE_CHECKING:
    from ..context import Context


def _ne(t: Tensor) -> str:
    return f"{t.name or '<unnamed>'} ne={list(t.ne)}"


def _check(cond: bool, op: str, msg: str, exc: type = ShapeError) -> None:
    if not cond:
        raise exc(f"{op}: {msg}")


def _result(ctx: "Context", op: Op, type_: GGMLType, ne: Sequence[int], srcs: Sequence,
            params: tuple = ()) -> Tensor:
    t = ctx.new_tensor(type_, ne)
    t.op, t.src, t.op_params = op, list(srcs), params
    return t


def _same_or_view(ctx: "Context", a: Tensor, inplace: bool) -> Tensor:
    return view_tensor(ctx, a) if inplace else ctx.new_tensor(a.type, a.ne)


def _unary_like(ctx, op: Op, a: Tensor, params: tuple = (), inplace: bool = False,
                srcs: Sequence | None = None) -> Tensor:
    t = _same_or_view(ctx, a, inplace)
    t.op, t.op_params, t.src = op, params, list(srcs if srcs is not None else [a])
    return t


def _pad4(ne: Sequence[int]) -> tuple[int, int, int, int]:
    if not 1 <= len(ne) <= MAX_DIMS:
        raise ShapeError(f"a tensor has 1 to 4 dimensions, got ne={list(ne)}")
    if any(int(n) < 0 for n in ne):
        raise ShapeError(f"negative dimension in ne={list(ne)}")
    return tuple(int(n) for n in ne) + (1,) * (MAX_DIMS - len(ne))  # type: ignore[return-value]


def view_tensor(ctx: "Context", a: Tensor) -> Tensor:
    """A tensor with ``a``'s shape and strides over ``a``'s memory (op NONE: set by callers)."""
    t = ctx.new_view(a, a.ne, a.nb, 0)
    t.name = f"{a.name} (view)"
    return t
