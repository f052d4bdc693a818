"""Ops that rearrange, extend or overwrite a tensor's elements: repeat, concat, pad, roll,
upscale, and acc/set (which write into a strided window of a copy of ``a``)."""

from __future__ import annotations

from ..errors import InvalidArgumentError, TensorTypeError
from ..tensor import MAX_DIMS, Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result, _unary_like
from .catalogue import Op, ScaleMode
from .params import (ConcatParams, PadParams, PadReflect1dParams, RollParams, UpscaleParams,
                     WindowParams)

__all__ = [
    "repeat", "concat", "pad_ext", "pad", "pad_circular", "pad_reflect_1d", "roll", "interpolate",
    "upscale", "acc", "set_", "set_1d", "set_2d",
]


def repeat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """``a`` tiled to ``b``'s shape."""
    _check(a.can_repeat_to(b), "repeat", f"{_ne(a)} cannot be repeated to {_ne(b)}")
    return _result(ctx, Op.REPEAT, a.type, b.ne, [a])


def concat(ctx, a: Tensor, b: Tensor, dim: int) -> Tensor:
    """``a`` and ``b`` joined along dimension ``dim`` (the others must match)."""
    _check(0 <= dim < MAX_DIMS, "concat", f"dim={dim} is not in 0..3", InvalidArgumentError)
    _check(a.type == b.type, "concat", f"types differ: {a.type} and {b.type}", TensorTypeError)
    for d in range(MAX_DIMS):
        _check(d == dim or a.ne[d] == b.ne[d], "concat",
               f"{_ne(a)} and {_ne(b)} differ in dimension {d} (concatenating along {dim})")
    ne = tuple(a.ne[d] + b.ne[d] if d == dim else a.ne[d] for d in range(MAX_DIMS))
    return _result(ctx, Op.CONCAT, a.type, ne, [a, b], ConcatParams(dim).pack())


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
    params = PadParams(pads[0::2], pads[1::2], bool(circular)).pack()
    return _result(ctx, Op.PAD, a.type, ne, [a], params)


def pad(ctx, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """``a`` with p_i zeros appended to dimension i."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def pad_circular(ctx, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """``a`` with p_i wrapped-around values appended to dimension i."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3, circular=True)


def pad_reflect_1d(ctx, a: Tensor, p0: int, p1: int) -> Tensor:
    """``a``'s rows extended by p0/p1 mirrored values (the edge not repeated), as np.pad's
    "reflect"; each must be shorter than the row."""
    _check(0 <= p0 < a.ne[0] and 0 <= p1 < a.ne[0], "pad_reflect_1d",
           f"paddings {p0}, {p1} must be in [0, ne[0]) for {_ne(a)}", InvalidArgumentError)
    _check(a.type == GGMLType.F32, "pad_reflect_1d", f"{_ne(a)} must be f32, got {a.type}",
           TensorTypeError)
    _check(a.is_contiguous(), "pad_reflect_1d", f"{_ne(a)} must be contiguous")
    return _result(ctx, Op.PAD_REFLECT_1D, a.type, (a.ne[0] + p0 + p1,) + a.ne[1:], [a],
                   PadReflect1dParams(int(p0), int(p1)).pack())


def roll(ctx, a: Tensor, shift0: int = 0, shift1: int = 0, shift2: int = 0,
         shift3: int = 0) -> Tensor:
    """``a`` rotated by shift_i along dimension i (element i moves to i + shift, np.roll)."""
    shifts = (shift0, shift1, shift2, shift3)
    _check(a.nb[0] == a.traits.type_size, "roll", f"{_ne(a)} must have packed elements")
    _check(all(abs(s) < n for s, n in zip(shifts, a.ne)), "roll",
           f"shifts {list(shifts)} must be smaller than {_ne(a)}", InvalidArgumentError)
    return _result(ctx, Op.ROLL, a.type, a.ne, [a], RollParams(shifts).pack())


def interpolate(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int,
                mode: int = ScaleMode.NEAREST) -> Tensor:
    """``a`` resampled to [ne0, ne1, ne2, ne3] (ggml_interpolate / ggml_upscale_ext).

    Dimensions 0 and 1 use ``mode`` (nearest, bilinear or bicubic; ALIGN_CORNERS maps the corner
    pixels onto each other, ANTIALIAS filters bilinear downscales); dimensions 2 and 3 nearest.
    """
    base = int(mode) & 0xFF
    _check(base in (ScaleMode.NEAREST, ScaleMode.BILINEAR, ScaleMode.BICUBIC), "upscale",
           f"unknown scale mode {base}", InvalidArgumentError)
    _check(not int(mode) & ScaleMode.ANTIALIAS or base == ScaleMode.BILINEAR, "upscale",
           "antialiasing is for bilinear only", InvalidArgumentError)
    _check(a.type == GGMLType.F32, "upscale", f"{_ne(a)} must be f32, got {a.type}",
           TensorTypeError)
    ne = (ne0, ne1, ne2, ne3)
    _check(all(n > 0 for n in ne), "upscale", f"target shape {list(ne)} must be positive")
    return _result(ctx, Op.UPSCALE, a.type, ne, [a], UpscaleParams(int(mode)).pack())


def upscale(ctx, a: Tensor, scale_factor: int, mode: int = ScaleMode.NEAREST) -> Tensor:
    """``a`` with dimensions 0 and 1 multiplied by ``scale_factor``."""
    _check(scale_factor >= 1, "upscale", f"scale factor {scale_factor} must be >= 1",
           InvalidArgumentError)
    return interpolate(ctx, a, a.ne[0] * scale_factor, a.ne[1] * scale_factor, a.ne[2], a.ne[3],
                       mode)


def _window_fits(op: str, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> None:
    """ggml's bound check: b's last element, placed with strides nb1..3 at ``offset``, is
    inside ``a``."""
    _check(offset >= 0 and min(nb1, nb2, nb3) >= 0, op,
           f"offset {offset} and strides ({nb1}, {nb2}, {nb3}) must be >= 0",
           InvalidArgumentError)
    if b.nelements == 0:
        return
    strides = (a.traits.type_size, nb1, nb2, nb3)
    last = offset + sum((n - 1) * s for n, s in zip(b.ne, strides))
    _check(last + a.traits.type_size <= a.nbytes, op,
           f"{_ne(b)} with strides ({nb1}, {nb2}, {nb3}) at offset {offset} runs past the end of "
           f"{_ne(a)} ({a.nbytes} bytes)")


def _window_op(ctx, op: Op, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int,
               inplace: bool) -> Tensor:
    name = op.name.lower()
    _check(a.is_contiguous(), name, f"{_ne(a)} must be contiguous")
    _check(b.nelements <= a.nelements, name, f"{_ne(b)} is larger than {_ne(a)}")
    _window_fits(name, a, b, nb1, nb2, nb3, offset)
    params = WindowParams(int(nb1), int(nb2), int(nb3), int(offset), int(inplace)).pack()
    return _unary_like(ctx, op, a, params, inplace, srcs=[a, b])


def acc(ctx, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int = 0,
        inplace: bool = False) -> Tensor:
    """``a`` with ``b`` added into the window of a's bytes at ``offset`` with strides nb1..3."""
    _check(a.type == GGMLType.F32 and b.type == GGMLType.F32, "acc",
           f"{_ne(a)} and {_ne(b)} must be f32", TensorTypeError)
    return _window_op(ctx, Op.ACC, a, b, nb1, nb2, nb3, offset, inplace)


def set_(ctx, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int = 0,
         inplace: bool = False) -> Tensor:
    """``a`` with ``b`` written into the window of a's bytes at ``offset`` with strides nb1..3."""
    _check(a.type == b.type, "set", f"types differ: {a.type} and {b.type}", TensorTypeError)
    return _window_op(ctx, Op.SET, a, b, nb1, nb2, nb3, offset, inplace)


def set_1d(ctx, a: Tensor, b: Tensor, offset: int = 0, inplace: bool = False) -> Tensor:
    """``a`` with ``b``'s values written at byte ``offset`` (a's row strides)."""
    return set_(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset, inplace)


def set_2d(ctx, a: Tensor, b: Tensor, nb1: int, offset: int = 0, inplace: bool = False) -> Tensor:
    """``a`` with ``b``'s rows written from byte ``offset``, ``nb1`` bytes apart."""
    return set_(ctx, a, b, nb1, a.nb[2], a.nb[3], offset, inplace)
