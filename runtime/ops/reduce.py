"""Reductions and scans over rows or whole tensors, and row sorting (argsort, top_k)."""

from __future__ import annotations

from ..errors import InvalidArgumentError, TensorTypeError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result
from .catalogue import Op, SortOrder
from .params import SortParams

__all__ = [
    "sum_", "sum_rows", "mean", "argmax", "cumsum", "count_equal", "argsort", "top_k",
]


def sum_(ctx, a: Tensor) -> Tensor:
    """The sum of all elements, as a 1-element tensor of a's type."""
    return _result(ctx, Op.SUM, a.type, (1,), [a])


def sum_rows(ctx, a: Tensor) -> Tensor:
    """The sum of each row: [ne0, ne1, ne2, ne3] -> [1, ne1, ne2, ne3]."""
    return _result(ctx, Op.SUM_ROWS, a.type, (1,) + a.ne[1:], [a])


def mean(ctx, a: Tensor) -> Tensor:
    """The mean of each row, as f32: [ne0, ne1, ne2, ne3] -> [1, ne1, ne2, ne3]."""
    return _result(ctx, Op.MEAN, GGMLType.F32, (1,) + a.ne[1:], [a])


def argmax(ctx, a: Tensor) -> Tensor:
    """Index of the largest element of each row of a matrix (I32)."""
    _check(a.ne[2] == 1 and a.ne[3] == 1, "argmax", f"{_ne(a)} must be a matrix")
    return _result(ctx, Op.ARGMAX, GGMLType.I32, (a.ne[1],), [a])


def cumsum(ctx, a: Tensor) -> Tensor:
    """The inclusive running sum along each row."""
    _check(a.type == GGMLType.F32, "cumsum", f"{_ne(a)} must be f32, got {a.type}",
           TensorTypeError)
    return _result(ctx, Op.CUMSUM, a.type, a.ne, [a])


def count_equal(ctx, a: Tensor, b: Tensor) -> Tensor:
    """How many elements of the I32 tensors ``a`` and ``b`` are equal (an I64 scalar)."""
    _check(a.same_shape(b), "count_equal", f"{_ne(a)} and {_ne(b)} must have the same shape")
    _check(a.type == GGMLType.I32 and b.type == GGMLType.I32, "count_equal",
           f"{_ne(a)} and {_ne(b)} must be i32", TensorTypeError)
    return _result(ctx, Op.COUNT_EQUAL, GGMLType.I64, (1,), [a, b])


def argsort(ctx, a: Tensor, order: SortOrder = SortOrder.ASC) -> Tensor:
    """The I32 indices that sort each row of ``a`` (ties keep their order)."""
    _check(a.type == GGMLType.F32, "argsort", f"{_ne(a)} must be f32, got {a.type}",
           TensorTypeError)
    return _result(ctx, Op.ARGSORT, GGMLType.I32, a.ne, [a], SortParams(SortOrder(order)).pack())


def top_k(ctx, a: Tensor, k: int) -> Tensor:
    """The I32 indices of each row's ``k`` largest values. As in ggml their order is not part
    of the contract (polydev gives them largest first)."""
    _check(1 <= k <= a.ne[0], "top_k", f"k={k} must be in [1, ne[0]] for {_ne(a)}",
           InvalidArgumentError)
    _check(a.type == GGMLType.F32, "top_k", f"{_ne(a)} must be f32, got {a.type}",
           TensorTypeError)
    return _result(ctx, Op.TOP_K, GGMLType.I32, (k,) + a.ne[1:], [a])
