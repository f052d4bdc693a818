"""Reductions over rows or whole tensors."""

from __future__ import annotations

from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result
from .catalogue import Op

__all__ = [
    "sum_", "sum_rows", "mean", "argmax",
]


def sum_(ctx, a: Tensor) -> Tensor:
    """The sum of all elements, as a 1-element tensor of a's type."""
    return _result(ctx, Op.SUM, a.type, (1,), [a])


def sum_rows(ctx, a: Tensor) -> Tensor:
    return _result(ctx, Op.SUM_ROWS, a.type, (1,) + a.ne[1:], [a])


def mean(ctx, a: Tensor) -> Tensor:
    return _result(ctx, Op.MEAN, GGMLType.F32, (1,) + a.ne[1:], [a])


def argmax(ctx, a: Tensor) -> Tensor:
    """Index of the largest element of each row of a matrix (I32)."""
    _check(a.ne[2] == 1 and a.ne[3] == 1, "argmax", f"{_ne(a)} must be a matrix")
    return _result(ctx, Op.ARGMAX, GGMLType.I32, (a.ne[1],), [a])
