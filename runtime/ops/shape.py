"""Ops that rearrange or extend a tensor's elements: repeat, concat, pad."""

from __future__ import annotations

from ..errors import InvalidArgumentError, TensorTypeError
from ..tensor import MAX_DIMS, Tensor
from ._build import _check, _ne, _result
from .catalogue import Op

__all__ = [
    "repeat", "concat", "pad_ext", "pad", "pad_circular",
]


def repeat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """``a`` tiled to ``b``'s shape."""
    _check(a.can_repeat_to(b), "repeat", f"{_ne(a)} cannot be repeated to {_ne(b)}")
    return _result(ctx, Op.REPEAT, a.type, b.ne, [a])


def concat(ctx, a: Tensor, b: Tensor, dim: int) -> Tensor:
    _check(0 <= dim < MAX_DIMS, "concat", f"dim={dim} is not in 0..3", InvalidArgumentError)
    _check(a.type == b.type, "concat", f"types differ: {a.type} and {b.type}", TensorTypeError)
    for d in range(MAX_DIMS):
        _check(d == dim or a.ne[d] == b.ne[d], "concat",
               f"{_ne(a)} and {_ne(b)} differ in dimension {d} (concatenating along {dim})")
    ne = tuple(a.ne[d] + b.ne[d] if d == dim else a.ne[d] for d in range(MAX_DIMS))
    return _result(ctx, Op.CONCAT, a.type, ne, [a, b], (dim,))


def pad_ext(ctx, a: Tensor, lp0: int = 0, rp0: int = 0, lp1: int = 0, rp1: int = 0,
            lp2: int = 0, rp2: int = 0, lp3: int = 0, rp3: int = 0,
            circular: bool = False) -> Tensor:
    """``a`` with lp_i/rp_i elements added before/after dimension i: zeros, or with
    ``circular`` the values wrapped around (as on a torus)."""
    pads = (lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)
    _check(all(int(p) >= 0 for p in pads), "pad", f"negative padding {list(pads)}",
           InvalidArgumentError)
    if circular:
        _check(all(a.ne[d] > 0 or pads[2 * d] + pads[2 * d + 1] == 0 for d in range(MAX_DIMS)),
               "pad", f"cannot wrap around an empty dimension of {_ne(a)}", InvalidArgumentError)
    ne = tuple(a.ne[d] + pads[2 * d] + pads[2 * d + 1] for d in range(MAX_DIMS))
    return _result(ctx, Op.PAD, a.type, ne, [a], tuple(int(p) for p in pads) + (int(circular),))


def pad(ctx, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """``a`` with p_i zeros appended to dimension i."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def pad_circular(ctx, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """``a`` with p_i wrapped-around values appended to dimension i."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3, circular=True)
