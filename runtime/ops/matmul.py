"""Matrix products: MUL_MAT, MUL_MAT_ID (mixture-of-experts) and OUT_PROD."""

from __future__ import annotations

from ..errors import TensorTypeError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result
from .catalogue import Op

__all__ = [
    "mul_mat", "mul_mat_id", "out_prod",
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


def mul_mat_id(ctx, as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """Mixture-of-experts matmul: result[:, e, t] = as_[:, :, ids[e, t]] @ b[:, e % b.ne1, t].

    ``as_`` is [K, M, n_expert] (one weight matrix per expert), ``b`` is [K, n_b, n_tokens]
    with n_b equal to ids.ne0 or 1 (broadcast), ``ids`` the I32 [n_used, n_tokens] experts
    chosen per token; the F32 result is [M, n_used, n_tokens].
    """
    _check(not as_.is_transposed(), "mul_mat_id", f"{_ne(as_)} must not be transposed")
    _check(ids.type == GGMLType.I32, "mul_mat_id", f"ids {_ne(ids)} must be i32, got {ids.type}",
           TensorTypeError)
    _check(as_.ne[3] == 1 and b.ne[3] == 1 and ids.ne[2] == ids.ne[3] == 1, "mul_mat_id",
           f"experts {_ne(as_)} and input {_ne(b)} must be 3-d, ids {_ne(ids)} 2-d")
    _check(ids.ne[1] == b.ne[2], "mul_mat_id",
           f"ids {_ne(ids)} must have one expert list per token of {_ne(b)} (ne[2])")
    _check(as_.ne[0] == b.ne[0], "mul_mat_id", f"{_ne(as_)} and {_ne(b)} differ in ne[0] (K)")
    _check(ids.ne[0] % b.ne[1] == 0, "mul_mat_id",
           f"{_ne(b)} ne[1] must divide the experts per token of ids {_ne(ids)}")
    return _result(ctx, Op.MUL_MAT_ID, GGMLType.F32, (as_.ne[1], ids.ne[0], b.ne[2], 1),
                   [as_, b, ids])


def out_prod(ctx, a: Tensor, b: Tensor) -> Tensor:
    """Sum of outer products: result[i, j] = sum_k a[i, k] * b[j, k] per matrix (``a @ b.T``
    in ggml's [ne0, ne1] terms); a is broadcast over b's dimensions 2 and 3."""
    _check(a.ne[1] == b.ne[1] and b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0,
           "out_prod", f"{_ne(a)} and {_ne(b)} must share ne[1] and a must broadcast over b")
    _check(not a.is_transposed(), "out_prod", f"{_ne(a)} must not be transposed")
    return _result(ctx, Op.OUT_PROD, GGMLType.F32, (a.ne[0], b.ne[0], b.ne[2], b.ne[3]), [a, b])
