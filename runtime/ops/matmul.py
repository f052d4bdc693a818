"""Matrix products."""

from __future__ import annotations

from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result
from .catalogue import Op

__all__ = [
    "mul_mat",
]


def mul_mat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat: result[i, j] = sum_k a[k, i] * b[k, j], i.e. ``b @ a.T`` per matrix.

    a is [K, M, ...], b is [K, N, ...] and the F32 result is [M, N, b.ne2, b.ne3]; a is
    broadcast over b's dimensions 2 and 3.
    """
    _check(a.ne[0] == b.ne[0], "mul_mat", f"{_ne(a)} and {_ne(b)} differ in ne[0] (the shared K)")
    _check(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, "mul_mat",
           f"{_ne(a)} cannot be broadcast over dims 2 and 3 of {_ne(b)}")
    _check(not a.is_transposed(), "mul_mat", f"{_ne(a)} nb={list(a.nb)} must not be transposed")
    return _result(ctx, Op.MUL_MAT, GGMLType.F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), [a, b])
