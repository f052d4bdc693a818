"""Row and group normalisation."""

from __future__ import annotations

from ..tensor import Tensor
from ..errors import InvalidArgumentError, TensorTypeError
from ..types import GGMLType
from ._build import _check, _ne, _unary_like
from .catalogue import Op
from .params import GroupNormParams, NormParams

__all__ = [
    "norm", "rms_norm", "l2_norm", "group_norm",
]


def norm(ctx, a: Tensor, eps: float = 1e-5, inplace: bool = False) -> Tensor:
    """(x - mean) / sqrt(var + eps) over each row."""
    return _unary_like(ctx, Op.NORM, a, NormParams(float(eps)).pack(), inplace)


def rms_norm(ctx, a: Tensor, eps: float = 1e-6, inplace: bool = False) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over each row."""
    return _unary_like(ctx, Op.RMS_NORM, a, NormParams(float(eps)).pack(), inplace)


def l2_norm(ctx, a: Tensor, eps: float = 1e-12, inplace: bool = False) -> Tensor:
    """x / max(||x||, eps) over each row."""
    _check(eps >= 0, "l2_norm", f"eps {eps} must be >= 0", InvalidArgumentError)
    return _unary_like(ctx, Op.L2_NORM, a, NormParams(float(eps)).pack(), inplace)


def group_norm(ctx, a: Tensor, n_groups: int, eps: float = 1e-6, inplace: bool = False) -> Tensor:
    """Normalise (x - mean) / sqrt(var + eps) over groups of channels (dimension 2), each group
    spanning dims 0-1 of ceil(ne[2] / n_groups) channels, separately for each dim-3 index."""
    _check(n_groups >= 1, "group_norm", f"n_groups {n_groups} must be >= 1", InvalidArgumentError)
    _check(a.type == GGMLType.F32 and a.nb[0] == 4, "group_norm",
           f"{_ne(a)} must be f32 with packed elements", TensorTypeError)
    return _unary_like(ctx, Op.GROUP_NORM, a, GroupNormParams(int(n_groups), float(eps)).pack(),
                       inplace)
