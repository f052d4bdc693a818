"""Convolutions: IM2COL, CONV_2D, CONV_2D_DW, CONV_TRANSPOSE_1D/2D; and POOL_1D/2D.

Everything starts from zero-copy sliding-window views of the (padded) input, made with
as_strided: IM2COL copies the windows once into its rows, CONV_2D contracts them with the
kernel in one BLAS product (tensordot), and the depthwise and transposed convolutions loop
over the kernel's taps (a handful), each tap one whole-array multiply-add.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from polydev.ops import (Conv2dParams, ConvTranspose1dParams, ConvTranspose2dParams, Im2ColParams,
                         Pool1dParams, Pool2dParams, PoolOp)
from polydev.tensor import Tensor

FLT_MAX = float(np.finfo(np.float32).max)


def _padded(xp, x, pads: dict[int, tuple[int, int]], value: float = 0.0):
    """``x`` as float32 with ``pads[axis] = (before, after)`` elements of ``value`` added."""
    x = x.astype(xp.float32, copy=False)
    if not any(b or a for b, a in pads.values()):
        return x
    width = [pads.get(axis, (0, 0)) for axis in range(x.ndim)]
    return xp.pad(x, width, constant_values=value)


def slide(xp, x, axis: int, n_out: int, k: int, stride: int, dilation: int):
    """A view of ``x`` where ``axis`` holds the n_out window starts and a new last axis the k
    taps of each window (tap j of window o is element o*stride + j*dilation)."""
    shape = x.shape[:axis] + (n_out,) + x.shape[axis + 1:] + (k,)
    strides = (x.strides[:axis] + (x.strides[axis] * stride,) + x.strides[axis + 1:]
               + (x.strides[axis] * dilation,))
    return xp.lib.stride_tricks.as_strided(x, shape, strides)


def _right_pad(n: int, n_out: int, k: int, s: int, p: int, d: int) -> int:
    """Padding after the input so that every window lies inside the padded array."""
    return max(0, (n_out - 1) * s + d * (k - 1) + 1 - p - n)


def _windows_2d(xp, x, out_hw, k_hw, s_hw, p_hw, d_hw, value=0.0):
    """(..., H, W) -> (..., OH, OW, KH, KW) windows of the padded input."""
    (oh, ow), (kh, kw), (s1, s0), (p1, p0), (d1, d0) = out_hw, k_hw, s_hw, p_hw, d_hw
    h, w = x.shape[-2:]
    nd = x.ndim
    x = _padded(xp, x, {nd - 2: (p1, _right_pad(h, oh, kh, s1, p1, d1)),
                        nd - 1: (p0, _right_pad(w, ow, kw, s0, p0, d0))}, value)
    rows = slide(xp, x, nd - 2, oh, kh, s1, d1)                 # (..., OH, W, KH)
    win = slide(xp, rows, nd - 1, ow, kw, s0, d0)               # (..., OH, OW, KH, KW)
    return win


def bind_im2col(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    a_t, b_t = node.src[0], node.src[1]
    s0, s1, p0, p1, d0, d1, is_2d = dataclasses.astuple(Im2ColParams.of(node))
    b, d = env.view(b_t), env.view(node)
    if is_2d:                                                    # b (N, IC, H, W)
        n, ic = b.shape[0], b.shape[1]
        oh, ow = node.ne[2], node.ne[1]
        kh, kw = a_t.ne[1], a_t.ne[0]
        rows = d.reshape(n, oh, ow, ic, kh, kw)
        return lambda: xp.copyto(rows, xp.moveaxis(_windows_2d(
            xp, b, (oh, ow), (kh, kw), (s1, s0), (p1, p0), (d1, d0)), 1, 3), casting="unsafe")
    x = b[0]                                                     # (N, IC, W)
    n, ic, w = x.shape
    ow, k = node.ne[1], a_t.ne[0]
    rows = d.reshape(n, ow, ic, k)

    def run_1d() -> None:
        padded = _padded(xp, x, {2: (p0, _right_pad(w, ow, k, s0, p0, d0))})
        xp.copyto(rows, xp.swapaxes(slide(xp, padded, 2, ow, k, s0, d0), 1, 2),
                  casting="unsafe")
    return run_1d


def _conv_geometry(node: Tensor):
    s0, s1, p0, p1, d0, d1 = dataclasses.astuple(Conv2dParams.of(node))
    a = node.src[0]
    return (node.ne[1], node.ne[0]), (a.ne[1], a.ne[0]), (s1, s0), (p1, p0), (d1, d0)


def bind_conv_2d(env, node: Tensor) -> Callable[[], None]:
    """CONV_2D: windows (N, IC, OH, OW, KH, KW) . kernel (OC, IC, KH, KW) -> (N, OC, OH, OW)."""
    xp = env.xp
    geometry = _conv_geometry(node)
    kernel = env.weight_f32(node.src[0])
    b, d = env.view(node.src[1]), env.view(node)

    def run() -> None:
        win = _windows_2d(xp, b, *geometry)
        out = xp.tensordot(win, kernel(), axes=([1, 4, 5], [1, 2, 3]))   # (N, OH, OW, OC)
        xp.copyto(d, xp.moveaxis(out, 3, 1), casting="unsafe")
    return run


def bind_conv_2d_dw(env, node: Tensor) -> Callable[[], None]:
    """CONV_2D_DW: per channel, the sum over the KH*KW taps of window * weight."""
    xp = env.xp
    geometry = _conv_geometry(node)
    a, b, d = env.view(node.src[0]), env.view(node.src[1]), env.view(node)
    kh, kw = geometry[1]

    def run() -> None:
        win = _windows_2d(xp, b, *geometry)                      # (N, C, OH, OW, KH, KW)
        weights = a[:, 0].astype(xp.float32)[None, :, None, None]   # (1, C, 1, 1, KH, KW)
        acc = xp.zeros(win.shape[:4], dtype=xp.float32)
        for i in range(kh):
            for j in range(kw):
                acc += win[..., i, j] * weights[..., i, j]
        xp.copyto(d, acc, casting="unsafe")
    return run


def bind_conv_transpose_1d(env, node: Tensor) -> Callable[[], None]:
    """CONV_TRANSPOSE_1D: each input position l adds kernel * b[:, l] at output l*s."""
    xp = env.xp
    s0 = ConvTranspose1dParams.of(node).s0
    kernel = env.weight_f32(node.src[0])                         # (1, IC, OC, K)
    b, d = env.view(node.src[1])[0, 0], env.view(node)[0, 0]     # (IC, L), (OC, OL)
    ic, length = b.shape
    oc, k = node.src[0].ne[1], node.src[0].ne[0]
    span = (length - 1) * s0 + 1

    def run() -> None:
        x = b.astype(xp.float32, copy=False)
        taps = (x.T @ kernel()[0].reshape(ic, oc * k)).reshape(length, oc, k)
        d.fill(0)
        for j in range(k):
            d[:, j:j + span:s0] += taps[:, :, j].T
    return run


def bind_conv_transpose_2d(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    stride = ConvTranspose2dParams.of(node).stride
    kernel = env.weight_f32(node.src[0])                         # (IC, OC, KH, KW)
    b, d = env.view(node.src[1]), env.view(node)                 # (N, IC, H, W), (N, OC, OH, OW)
    h, w = b.shape[2:]
    kh, kw = node.src[0].ne[1], node.src[0].ne[0]
    span_h, span_w = (h - 1) * stride + 1, (w - 1) * stride + 1

    def run() -> None:
        x = b.astype(xp.float32, copy=False)
        taps = xp.tensordot(x, kernel(), axes=([1], [0]))        # (N, H, W, OC, KH, KW)
        d.fill(0)
        for i in range(kh):
            for j in range(kw):
                window = d[:, :, i:i + span_h:stride, j:j + span_w:stride]
                window += xp.moveaxis(taps[..., i, j], 3, 1)
    return run


def bind_pool_1d(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    op, k, s, p = dataclasses.astuple(Pool1dParams.of(node))
    a, d = env.view(node.src[0]), env.view(node)
    n, ow = a.shape[-1], node.ne[0]
    right = _right_pad(n, ow, k, s, p, 1)
    if op == PoolOp.MAX:
        return lambda: xp.copyto(d, slide(xp, _padded(xp, a, {3: (p, right)}, -FLT_MAX), 3, ow,
                                           k, s, 1).max(axis=-1))
    starts = np.arange(ow) * s - p                                # ggml skips the padding
    counts = np.minimum(starts + k, n) - np.maximum(starts, 0)
    inv_count = xp.asarray(np.where(counts > 0, 1.0 / np.maximum(counts, 1), 0.0)
                           .astype(np.float32))

    def run_avg() -> None:
        sums = slide(xp, _padded(xp, a, {3: (p, right)}), 3, ow, k, s, 1).sum(axis=-1)
        xp.multiply(sums, inv_count, out=d)
    return run_avg


def bind_pool_2d(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    op, k0, k1, s0, s1, p0, p1 = dataclasses.astuple(Pool2dParams.of(node))
    a, d = env.view(node.src[0]), env.view(node)
    geometry = ((node.ne[1], node.ne[0]), (k1, k0), (s1, s0), (p1, p0), (1, 1))
    if op == PoolOp.MAX:
        return lambda: xp.copyto(d, _windows_2d(xp, a, *geometry, value=-FLT_MAX)
                                 .max(axis=(-2, -1)))

    def run_avg() -> None:
        sums = _windows_2d(xp, a, *geometry).sum(axis=(-2, -1))
        xp.multiply(sums, xp.float32(1.0 / (k0 * k1)), out=d)   # padding counts, as ggml
    return run_avg
