"""Row and group normalisation."""

from __future__ import annotations

from ..tensor import Tensor
from ._build import _unary_like
from .catalogue import Op

__all__ = [
    "norm", "rms_norm",
]


def norm(ctx, a: Tensor, eps: float = 1e-5, inplace: bool = False) -> Tensor:
    """(x - mean) / sqrt(var + eps) over each row."""
    return _unary_like(ctx, Op.NORM, a, (float(eps),), inplace)


def rms_norm(ctx, a: Tensor, eps: float = 1e-6, inplace: bool = False) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over each row."""
    return _unary_like(ctx, Op.RMS_NORM, a, (float(eps),), inplace)
