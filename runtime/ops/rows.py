"""Row gathers and scatters by index."""

from __future__ import annotations

from ..errors import TensorTypeError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result, view_tensor
from .catalogue import Op

__all__ = [
    "get_rows", "set_rows", "get_rows_back",
]


def get_rows(ctx, a: Tensor, b: Tensor) -> Tensor:
    """Gather rows of ``a`` (any type) at the I32 indices ``b``; the result is F32 (I32 for I32)."""
    _check(b.type == GGMLType.I32, "get_rows", f"indices {_ne(b)} must be i32, got {b.type}",
           TensorTypeError)
    _check(a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1, "get_rows",
           f"indices {_ne(b)} must be [n, {a.ne[2]}, {a.ne[3]}, 1] for rows of {_ne(a)}")
    type_ = GGMLType.I32 if a.type == GGMLType.I32 else GGMLType.F32
    return _result(ctx, Op.GET_ROWS, type_, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), [a, b])


def set_rows(ctx, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Write the rows of ``b`` into ``a`` at the indices ``c`` (converting to a's type).

    The result is a view of ``a``; ggml's source order is kept: src = [b, c, a].
    """
    ok = (a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3] and b.ne[1] == c.ne[0]
        and b.ne[2] % c.ne[1] == 0 and b.ne[3] % c.ne[2] == 0 and c.ne[3] == 1)
    _check(ok, "set_rows", f"destination {_ne(a)}, rows {_ne(b)} and indices {_ne(c)} do not fit")
    _check(b.type in (GGMLType.F32, GGMLType.F16), "set_rows", f"rows must be f32 or f16, got "
           f"{b.type}", TensorTypeError)
    _check(c.type in (GGMLType.I64, GGMLType.I32), "set_rows", f"indices must be i64 or i32, got "
           f"{c.type}", TensorTypeError)
    _check(a.is_contiguous_rows() and b.is_contiguous_rows(), "set_rows",
           "destination and source rows must be packed")
    t = view_tensor(ctx, a)
    t.op, t.src = Op.SET_ROWS, [b, c, a]
    return t


def get_rows_back(ctx, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """The gradient of get_rows: an F32 matrix shaped like ``c`` whose row r is the sum of the
    rows i of ``a`` with b[i] == r."""
    _check(a.ne[2] == a.ne[3] == 1 and c.ne[2] == c.ne[3] == 1, "get_rows_back",
           f"{_ne(a)} and {_ne(c)} must be matrices")
    _check(b.type == GGMLType.I32 and b.ne[1:] == (1, 1, 1) and b.ne[0] == a.ne[1],
           "get_rows_back", f"indices {_ne(b)} must be an i32 vector, one per row of {_ne(a)}",
           TensorTypeError)
    _check(a.ne[0] == c.ne[0], "get_rows_back", f"{_ne(a)} and {_ne(c)} differ in ne[0]")
    return _result(ctx, Op.GET_ROWS_BACK, GGMLType.F32, (c.ne[0], c.ne[1]), [a, b])
