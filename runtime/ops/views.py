"""Views (no compute; the result shares its source's memory) and copies."""

from __future__ import annotations

from typing import Sequence

from ..errors import InvalidArgumentError
from ..tensor import MAX_DIMS, Tensor, contiguous_strides
from ._build import _check, _ne, _pad4, _result, view_tensor
from .catalogue import Op
from .params import PermuteParams, ViewParams

__all__ = [
    "view_tensor", "view_1d", "view_2d", "view_3d", "view_4d", "reshape", "reshape_1d",
    "reshape_2d", "reshape_3d", "reshape_4d", "permute", "transpose", "dup", "cont", "cpy",
]


def _view(ctx, a: Tensor, ne: Sequence[int], nb: Sequence[int] | None, offset: int) -> Tensor:
    ne4 = _pad4(ne)
    # strides given for dims 1..k; dim 0 is packed and dims above k are packed after k
    nb4 = list(contiguous_strides(a.type, ne4))
    for i, stride in enumerate(nb or (), start=1):
        nb4[i] = stride
    for i in range(len(nb or ()) + 1, MAX_DIMS):
        nb4[i] = nb4[i - 1] * ne4[i - 1]
    t = ctx.new_view(a, ne4, tuple(nb4), offset)
    t.name = f"{a.name} (view)"
    t.op, t.op_params, t.src = Op.VIEW, ViewParams(offset).pack(), [a]
    return t


def view_1d(ctx, a: Tensor, ne0: int, offset: int = 0) -> Tensor:
    """ne0 elements of ``a``'s memory from byte ``offset``."""
    return _view(ctx, a, (ne0,), (), offset)


def view_2d(ctx, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int = 0) -> Tensor:
    """A [ne0, ne1] window of ``a``'s memory, rows ``nb1`` bytes apart, from ``offset``."""
    return _view(ctx, a, (ne0, ne1), (nb1,), offset)


def view_3d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int,
            offset: int = 0) -> Tensor:
    """A [ne0, ne1, ne2] window of ``a``'s memory with strides nb1, nb2, from ``offset``."""
    return _view(ctx, a, (ne0, ne1, ne2), (nb1, nb2), offset)


def view_4d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
            offset: int = 0) -> Tensor:
    """A [ne0..ne3] window of ``a``'s memory with strides nb1..nb3, from ``offset``."""
    return _view(ctx, a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)


def reshape(ctx, a: Tensor, *ne: int) -> Tensor:
    """ggml_reshape_Nd: the same contiguous memory under a new shape."""
    ne4 = _pad4(ne)
    _check(a.is_contiguous(), "reshape", f"{_ne(a)} is not contiguous (use cont first)")
    n = ne4[0] * ne4[1] * ne4[2] * ne4[3]
    _check(n == a.nelements, "reshape",
           f"cannot reshape {_ne(a)} ({a.nelements} elements) to ne={list(ne4)} ({n} elements)")
    t = ctx.new_view(a, ne4, contiguous_strides(a.type, ne4), 0)
    t.name = f"{a.name} (reshaped)"
    t.op, t.src = Op.RESHAPE, [a]
    return t


def reshape_1d(ctx, a, ne0):
    """``a``'s memory as 1 dimension of ne0 (a must be contiguous)."""
    return reshape(ctx, a, ne0)


def reshape_2d(ctx, a, ne0, ne1):
    """``a``'s memory as [ne0, ne1] (a must be contiguous)."""
    return reshape(ctx, a, ne0, ne1)


def reshape_3d(ctx, a, ne0, ne1, ne2):
    """``a``'s memory as [ne0, ne1, ne2] (a must be contiguous)."""
    return reshape(ctx, a, ne0, ne1, ne2)


def reshape_4d(ctx, a, ne0, ne1, ne2, ne3):
    """``a``'s memory as [ne0, ne1, ne2, ne3] (a must be contiguous)."""
    return reshape(ctx, a, ne0, ne1, ne2, ne3)


def permute(ctx, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """ggml_permute: source dimension i becomes result dimension axis_i."""
    axes = (axis0, axis1, axis2, axis3)
    _check(sorted(axes) == [0, 1, 2, 3], "permute",
           f"axes {list(axes)} are not a permutation of 0..3", InvalidArgumentError)
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    t = ctx.new_view(a, ne, nb, 0)
    t.name = f"{a.name} (permuted)"
    t.op, t.op_params, t.src = Op.PERMUTE, PermuteParams(axes).pack(), [a]
    return t


def transpose(ctx, a: Tensor) -> Tensor:
    """ggml_transpose: swap dimensions 0 and 1 (a strided view)."""
    ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    t = ctx.new_view(a, ne, nb, 0)
    t.name = f"{a.name} (transposed)"
    t.op, t.src = Op.TRANSPOSE, [a]
    return t


# --- copies ----------------------------------------------------------------------------------

def dup(ctx, a: Tensor) -> Tensor:
    """A copy of ``a`` in new memory, same type and shape (ggml_dup)."""
    return _result(ctx, Op.DUP, a.type, a.ne, [a])


def cont(ctx, a: Tensor, *ne: int) -> Tensor:
    """ggml_cont / ggml_cont_Nd: a contiguous copy, optionally under a new shape."""
    ne4 = _pad4(ne) if ne else a.ne
    n = ne4[0] * ne4[1] * ne4[2] * ne4[3]
    _check(n == a.nelements, "cont", f"cannot make {_ne(a)} contiguous as ne={list(ne4)}")
    t = _result(ctx, Op.CONT, a.type, ne4, [a])
    t.name = f"{a.name} (cont)"
    return t


def cpy(ctx, a: Tensor, b: Tensor) -> Tensor:
    """ggml_cpy: copy ``a`` into ``b`` in element order, converting to ``b``'s type.

    The result is a view of ``b`` (computing it writes ``b``'s memory).
    """
    _check(a.nelements == b.nelements, "cpy",
           f"{_ne(a)} and {_ne(b)} have different element counts")
    t = view_tensor(ctx, b)
    t.name = f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)"
    t.op, t.src = Op.CPY, [a, b]
    return t
