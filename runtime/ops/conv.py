"""Convolutions and pooling over [W, H, C, N] tensors (ggml's layout: width fastest).

IM2COL, CONV_2D, CONV_2D_DW, CONV_TRANSPOSE_1D/2D, POOL_1D/2D are ops; conv_1d, conv_2d and
conv_2d_dw are compositions (im2col then mul_mat), exactly as ggml builds them.
"""

from __future__ import annotations

from ..errors import InvalidArgumentError, ShapeError, TensorTypeError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result
from .catalogue import Op, PoolOp
from .params import (Conv2dParams, ConvTranspose1dParams, ConvTranspose2dParams, Im2ColParams,
                     Pool1dParams, Pool2dParams)
from .matmul import mul_mat
from .views import cont, permute, reshape

__all__ = [
    "conv_output_size", "im2col", "conv_1d", "conv_2d", "conv_2d_direct", "conv_2d_dw",
    "conv_2d_dw_direct", "conv_transpose_1d", "conv_transpose_2d_p0", "pool_1d", "pool_2d",
]

FLOATS = (GGMLType.F32, GGMLType.F16)


def conv_output_size(n: int, k: int, s: int, p: int, d: int) -> int:
    """Output length of a convolution (ggml_calc_conv_output_size)."""
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _check_geometry(op: str, s: tuple, p: tuple, d: tuple) -> None:
    _check(min(s) >= 1 and min(d) >= 1 and min(p) >= 0, op,
           f"strides {s} and dilations {d} must be >= 1, paddings {p} >= 0", InvalidArgumentError)


def _float(op: str, t: Tensor, name: str) -> None:
    _check(t.type in FLOATS, op, f"{name} {_ne(t)} must be f32 or f16, got {t.type}",
           TensorTypeError)


def im2col(ctx, a: Tensor, b: Tensor, s0: int, s1: int, p0: int, p1: int, d0: int, d1: int,
           is_2d: bool = True, dst_type: GGMLType = GGMLType.F16) -> Tensor:
    """The patches of ``b`` under kernel ``a``'s window, one row per output position.

    2-D: a [KW, KH, IC, OC], b [W, H, IC, N] -> [IC*KH*KW, OW, OH, N]; 1-D: a [K, IC, OC],
    b [W, IC, N] -> [IC*K, OW, N]. Row elements are ordered (ic, kh, kw), kw fastest.
    """
    _check_geometry("im2col", (s0, s1 if is_2d else 1), (p0, p1), (d0, d1 if is_2d else 1))
    _check(dst_type in FLOATS, "im2col", f"dst_type must be f32 or f16, got {dst_type}",
           TensorTypeError)
    _float("im2col", b, "input")
    if is_2d:
        _check(a.ne[2] == b.ne[2], "im2col", f"kernel {_ne(a)} and input {_ne(b)} differ in "
               f"channels (ne[2])")
        oh = conv_output_size(b.ne[1], a.ne[1], s1, p1, d1)
    else:
        _check(a.ne[1] == b.ne[1] and b.ne[3] == 1, "im2col", f"kernel {_ne(a)} and 1-d input "
               f"{_ne(b)} differ in channels (ne[1])")
        oh = 1
    ow = conv_output_size(b.ne[0], a.ne[0], s0, p0, d0)
    _check(ow > 0 and oh > 0, "im2col", f"input {_ne(b)} is smaller than kernel {_ne(a)}")
    ne = ((a.ne[2] * a.ne[1] * a.ne[0], ow, oh, b.ne[3]) if is_2d
        else (a.ne[1] * a.ne[0], ow, b.ne[2], 1))
    return _result(ctx, Op.IM2COL, dst_type, ne, [a, b],
                   Im2ColParams(int(s0), int(s1), int(p0), int(p1), int(d0), int(d1),
                                int(bool(is_2d))).pack())


def conv_1d(ctx, a: Tensor, b: Tensor, s0: int = 1, p0: int = 0, d0: int = 1) -> Tensor:
    """1-D convolution: kernel a [K, IC, OC], input b [W, IC, N] -> [OW, OC, N].

    ggml reshapes the product straight to [OW, OC, N], which mixes batches when N > 1; here
    the batch axis is permuted into place (the same result for N = 1)."""
    cols = im2col(ctx, a, b, s0, 0, p0, 0, d0, 0, False)                  # [IC*K, OW, N]
    out = mul_mat(ctx, reshape(ctx, cols, cols.ne[0], cols.ne[2] * cols.ne[1]),
                  reshape(ctx, a, a.ne[0] * a.ne[1], a.ne[2]))            # [N*OW, OC]
    if cols.ne[2] == 1:
        return reshape(ctx, out, cols.ne[1], a.ne[2], 1)
    out = reshape(ctx, out, cols.ne[1], cols.ne[2], a.ne[2])              # [OW, N, OC]
    return cont(ctx, permute(ctx, out, 0, 2, 1, 3))


def conv_2d(ctx, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
            d0: int = 1, d1: int = 1) -> Tensor:
    """2-D convolution as ggml builds it (im2col + mul_mat): kernel a [KW, KH, IC, OC],
    input b [W, H, IC, N] -> [OW, OH, OC, N].

    The patches (IM2COL) take the kernel's type, as in the ggml that ggml-python builds: an
    F32 kernel keeps F32 patches. (Newer ggml, llama.cpp #23660, makes them F16 unless the
    kernel is BF16, which rounds the input of an F32 convolution to half precision.)
    """
    cols = im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True, a.type)        # [IC*KH*KW, OW, OH, N]
    out = mul_mat(ctx, reshape(ctx, cols, cols.ne[0], cols.ne[3] * cols.ne[2] * cols.ne[1]),
                  reshape(ctx, a, a.ne[0] * a.ne[1] * a.ne[2], a.ne[3]))  # [N*OH*OW, OC]
    out = reshape(ctx, out, cols.ne[1], cols.ne[2], cols.ne[3], a.ne[3])  # [OW, OH, N, OC]
    return cont(ctx, permute(ctx, out, 0, 1, 3, 2))


def _conv_params(s0, s1, p0, p1, d0, d1) -> tuple:
    return Conv2dParams(*(int(v) for v in (s0, s1, p0, p1, d0, d1))).pack()


def conv_2d_direct(ctx, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0,
                   p1: int = 0, d0: int = 1, d1: int = 1) -> Tensor:
    """2-D convolution as one op (CONV_2D): kernel a [KW, KH, IC, OC], input b [W, H, IC, N]
    -> [OW, OH, OC, N] of b's type."""
    _check_geometry("conv_2d", (s0, s1), (p0, p1), (d0, d1))
    _float("conv_2d", a, "kernel")
    _float("conv_2d", b, "input")
    _check(a.ne[2] == b.ne[2], "conv_2d", f"kernel {_ne(a)} and input {_ne(b)} differ in "
           f"channels (ne[2])")
    ne = (conv_output_size(b.ne[0], a.ne[0], s0, p0, d0),
          conv_output_size(b.ne[1], a.ne[1], s1, p1, d1), a.ne[3], b.ne[3])
    _check(ne[0] > 0 and ne[1] > 0, "conv_2d", f"input {_ne(b)} is smaller than kernel {_ne(a)}")
    return _result(ctx, Op.CONV_2D, b.type, ne, [a, b], _conv_params(s0, s1, p0, p1, d0, d1))


def conv_2d_dw(ctx, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0, p1: int = 0,
               d0: int = 1, d1: int = 1) -> Tensor:
    """Depthwise 2-D convolution as ggml builds it (im2col + mul_mat): kernel a
    [KW, KH, 1, C], input b [W, H, C, N] -> [OW, OH, C, N]."""
    new_a = reshape(ctx, a, a.ne[0], a.ne[1], 1, a.ne[2] * a.ne[3])
    cols = im2col(ctx, new_a, reshape(ctx, b, b.ne[0], b.ne[1], 1, b.ne[2] * b.ne[3]),
                  s0, s1, p0, p1, d0, d1, True)                         # [KH*KW, OW, OH, N*C]
    new_b = reshape(ctx, cols, cols.ne[0], cols.ne[2] * cols.ne[1], b.ne[2], b.ne[3])
    new_a = reshape(ctx, new_a, new_a.ne[0] * new_a.ne[1], new_a.ne[2], new_a.ne[3], 1)
    out = mul_mat(ctx, new_a, new_b)
    return reshape(ctx, out, cols.ne[1], cols.ne[2], b.ne[2], b.ne[3])


def conv_2d_dw_direct(ctx, a: Tensor, b: Tensor, s0: int = 1, s1: int = 1, p0: int = 0,
                      p1: int = 0, d0: int = 1, d1: int = 1) -> Tensor:
    """Depthwise 2-D convolution as one op (CONV_2D_DW): kernel a [KW, KH, 1, C], input b
    [W, H, C, N] -> [OW, OH, C, N]. (ggml gives channel-innermost inputs a channel-innermost
    result; polydev's result is always in the standard layout, with the same values.)"""
    _check_geometry("conv_2d_dw", (s0, s1), (p0, p1), (d0, d1))
    _float("conv_2d_dw", a, "kernel")
    _float("conv_2d_dw", b, "input")
    _check(a.ne[2] == 1 and a.ne[3] == b.ne[2], "conv_2d_dw",
           f"kernel {_ne(a)} must be [KW, KH, 1, C] for input {_ne(b)}")
    ne = (conv_output_size(b.ne[0], a.ne[0], s0, p0, d0),
          conv_output_size(b.ne[1], a.ne[1], s1, p1, d1), b.ne[2], b.ne[3])
    _check(ne[0] > 0 and ne[1] > 0, "conv_2d_dw", f"input {_ne(b)} is smaller than kernel "
           f"{_ne(a)}")
    return _result(ctx, Op.CONV_2D_DW, b.type, ne, [a, b], _conv_params(s0, s1, p0, p1, d0, d1))


def conv_transpose_1d(ctx, a: Tensor, b: Tensor, s0: int = 1, p0: int = 0,
                      d0: int = 1) -> Tensor:
    """Transposed 1-D convolution: kernel a [K, OC, IC], input b [L, IC] -> [(L-1)*s0 + K, OC].
    As in ggml only p0 = 0 and d0 = 1 are defined."""
    _check(p0 == 0 and d0 == 1, "conv_transpose_1d", f"only p0=0 and d0=1 are supported, got "
           f"p0={p0}, d0={d0}", InvalidArgumentError)
    _check(s0 >= 1, "conv_transpose_1d", f"stride {s0} must be >= 1", InvalidArgumentError)
    _check(b.ne[2] == b.ne[3] == 1 and a.ne[3] == 1 and a.ne[2] == b.ne[1],
           "conv_transpose_1d", f"kernel {_ne(a)} must be [K, OC, IC] for input {_ne(b)} [L, IC]")
    _float("conv_transpose_1d", a, "kernel")
    _float("conv_transpose_1d", b, "input")
    ne = ((b.ne[0] - 1) * s0 + a.ne[0], a.ne[1], 1, 1)
    params = ConvTranspose1dParams(int(s0)).pack()
    return _result(ctx, Op.CONV_TRANSPOSE_1D, GGMLType.F32, ne, [a, b], params)


def conv_transpose_2d_p0(ctx, a: Tensor, b: Tensor, stride: int) -> Tensor:
    """Transposed 2-D convolution without padding: kernel a [KW, KH, OC, IC], input b
    [W, H, IC, N] -> [(W-1)*s + KW, (H-1)*s + KH, OC, N]."""
    _check(stride >= 1, "conv_transpose_2d", f"stride {stride} must be >= 1",
           InvalidArgumentError)
    _check(a.ne[3] == b.ne[2], "conv_transpose_2d", f"kernel {_ne(a)} must be [KW, KH, OC, IC] "
           f"for input {_ne(b)}")
    _float("conv_transpose_2d", a, "kernel")
    _float("conv_transpose_2d", b, "input")
    ne = ((b.ne[0] - 1) * stride + a.ne[0], (b.ne[1] - 1) * stride + a.ne[1], a.ne[2], b.ne[3])
    params = ConvTranspose2dParams(int(stride)).pack()
    return _result(ctx, Op.CONV_TRANSPOSE_2D, GGMLType.F32, ne, [a, b], params)


def pool_1d(ctx, a: Tensor, op: PoolOp, k0: int, s0: int, p0: int = 0) -> Tensor:
    """Max or average over windows of k0 along each row (padding is skipped: an average
    divides by the in-bounds count, a window wholly in padding gives -FLT_MAX or 0)."""
    _check(k0 >= 1 and s0 >= 1 and p0 >= 0, "pool_1d", f"k0 {k0}, s0 {s0} must be >= 1 and p0 "
           f"{p0} >= 0", InvalidArgumentError)
    _float("pool_1d", a, "input")
    ow = (a.ne[0] + 2 * p0 - k0) // s0 + 1
    _check(ow > 0, "pool_1d", f"window {k0} is larger than padded {_ne(a)}", ShapeError)
    return _result(ctx, Op.POOL_1D, GGMLType.F32, (ow,) + a.ne[1:], [a],
                   Pool1dParams(PoolOp(op), int(k0), int(s0), int(p0)).pack())


def pool_2d(ctx, a: Tensor, op: PoolOp, k0: int, k1: int, s0: int, s1: int, p0: int = 0,
            p1: int = 0) -> Tensor:
    """Max or average over k0 x k1 windows of dims 0-1 (an average divides by k0*k1, padding
    included, as ggml)."""
    _check(min(k0, k1, s0, s1) >= 1 and min(p0, p1) >= 0, "pool_2d",
           f"kernel ({k0}, {k1}) and stride ({s0}, {s1}) must be >= 1, padding >= 0",
           InvalidArgumentError)
    _float("pool_2d", a, "input")
    ow, oh = (a.ne[0] + 2 * p0 - k0) // s0 + 1, (a.ne[1] + 2 * p1 - k1) // s1 + 1
    _check(ow > 0 and oh > 0, "pool_2d", f"window ({k0}, {k1}) is larger than padded {_ne(a)}")
    return _result(ctx, Op.POOL_2D, GGMLType.F32, (ow, oh) + a.ne[2:], [a],
                   Pool2dParams(PoolOp(op), int(k0), int(k1), int(s0), int(s1), int(p0),
                                int(p1)).pack())
