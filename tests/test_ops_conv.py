"""Convolutions and pooling on every device against float64 numpy references written from the
definitions (loops over kernel taps or output positions are fine in a reference)."""

from __future__ import annotations

import numpy as np
import pytest

from polydev import Context, GGMLType, Op, build_graph, ops
from polydev.errors import InvalidArgumentError, ShapeError
from polydev.ops import PoolOp

from conftest import assert_close, compute
from test_ops import f32


def _pad_hw(x, p1, p0, value=0.0):
    return np.pad(x, [(0, 0)] * (x.ndim - 2) + [(p1, p1), (p0, p0)], constant_values=value)


def _conv2d_ref(x, k, s, p, d):
    """x (N, IC, H, W), k (OC, IC, KH, KW) -> (N, OC, OH, OW)."""
    (s1, s0), (p1, p0), (d1, d0) = s, p, d
    xp_ = _pad_hw(x, p1, p0)
    oc, ic, kh, kw = k.shape
    oh = (x.shape[2] + 2 * p1 - d1 * (kh - 1) - 1) // s1 + 1
    ow = (x.shape[3] + 2 * p0 - d0 * (kw - 1) - 1) // s0 + 1
    out = np.zeros((x.shape[0], oc, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = xp_[:, :, i * d1:i * d1 + s1 * (oh - 1) + 1:s1,
                        j * d0:j * d0 + s0 * (ow - 1) + 1:s0]
            out += np.einsum("nchw,oc->nohw", patch, k[:, :, i, j])
    return out


GEOMETRIES = [((1, 1), (0, 0), (1, 1)), ((2, 1), (1, 2), (1, 1)), ((1, 2), (2, 1), (2, 1)),
              ((3, 2), (0, 1), (1, 2))]


@pytest.mark.parametrize("s,p,d", GEOMETRIES)
@pytest.mark.parametrize("ktype", [np.float32, np.float16])
def test_conv_2d_direct_and_composed(backend, rng, s, p, d, ktype):
    x, k = f32(rng, (2, 3, 9, 11)), f32(rng, (4, 3, 3, 2)).astype(ktype)
    args = (s[1], s[0], p[1], p[0], d[1], d[0])
    ref = _conv2d_ref(x.astype(np.float64), k.astype(np.float64), s, p, d)
    out = compute(backend, lambda ctx, a, b: ops.conv_2d_direct(ctx, a, b, *args), k, x)
    assert_close(out, ref, 5e-4)
    out = compute(backend, lambda ctx, a, b: ops.conv_2d(ctx, a, b, *args), k, x)
    assert_close(out, ref, 5e-4)                    # im2col goes through f16, as in ggml


@pytest.mark.parametrize("s,p,d", GEOMETRIES)
def test_im2col(backend, rng, s, p, d):
    x, k = f32(rng, (2, 3, 7, 8)), np.zeros((4, 3, 2, 3), np.float32)
    (s1, s0), (p1, p0), (d1, d0) = s, p, d
    out = compute(backend, lambda ctx, a, b: ops.im2col(ctx, a, b, s0, s1, p0, p1, d0, d1, True,
                                                        GGMLType.F32), k, x)
    xp_ = _pad_hw(x.astype(np.float64), p1, p0)
    oh, ow = out.shape[1], out.shape[2]
    ref = np.empty((2, oh, ow, 3, 2, 3))
    for i in range(2):
        for j in range(3):
            taps = xp_[:, :, i * d1::s1, j * d0::s0][:, :, :oh, :ow]
            ref[..., i, j] = taps.transpose(0, 2, 3, 1)
    assert_close(out, ref.reshape(2, oh, ow, 18))


def test_im2col_1d_and_conv_1d(backend, rng):
    x, k = f32(rng, (2, 3, 20)), f32(rng, (5, 3, 4))       # numpy (N, IC, W), (OC, IC, K)
    out = compute(backend, lambda ctx, a, b: ops.conv_1d(ctx, a, b, 2, 1, 1), k, x)
    ref = _conv2d_ref(x[:, :, None].astype(np.float64), k[:, :, None].astype(np.float64),
                      (1, 2), (0, 1), (1, 1))[:, :, 0]      # (N, OC, OW)
    assert_close(out[0], ref, 5e-4)


@pytest.mark.parametrize("s,p,d", GEOMETRIES)
def test_conv_2d_dw(backend, rng, s, p, d):
    x, k = f32(rng, (2, 5, 9, 10)), f32(rng, (5, 1, 3, 3))
    args = (s[1], s[0], p[1], p[0], d[1], d[0])
    ref = np.stack([_conv2d_ref(x[:, c:c + 1].astype(np.float64), k[c:c + 1].astype(np.float64),
                                s, p, d)[:, 0] for c in range(5)], axis=1)
    out = compute(backend, lambda ctx, a, b: ops.conv_2d_dw_direct(ctx, a, b, *args), k, x)
    assert_close(out, ref)
    out = compute(backend, lambda ctx, a, b: ops.conv_2d_dw(ctx, a, b, *args), k, x)
    assert_close(out, ref, 5e-4)


@pytest.mark.parametrize("stride", [1, 2, 3])
def test_conv_transpose_1d(backend, rng, stride):
    k, x = f32(rng, (1, 3, 4, 5)), f32(rng, (1, 1, 3, 9))   # numpy (IC, OC, K), (IC, L)
    out = compute(backend, lambda ctx, a, b: ops.conv_transpose_1d(ctx, a, b, stride), k, x)
    ic, oc, kk = k.shape[1:]
    length = x.shape[-1]
    ref = np.zeros((oc, (length - 1) * stride + kk))
    for pos in range(length):
        ref[:, pos * stride:pos * stride + kk] += np.einsum("c,cok->ok", x[0, 0, :, pos], k[0])
    assert_close(out[0, 0], ref, 5e-4)
    with pytest.raises(InvalidArgumentError):
        compute(backend, lambda ctx, a, b: ops.conv_transpose_1d(ctx, a, b, 1, 1), k, x)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("ktype", [np.float32, np.float16])
def test_conv_transpose_2d(backend, rng, stride, ktype):
    k, x = f32(rng, (3, 4, 3, 2)).astype(ktype), f32(rng, (2, 3, 5, 6))  # (IC, OC, KH, KW)
    out = compute(backend, lambda ctx, a, b: ops.conv_transpose_2d_p0(ctx, a, b, stride), k, x)
    n, ic, h, w = x.shape
    kh, kw = k.shape[2:]
    ref = np.zeros((n, 4, (h - 1) * stride + kh, (w - 1) * stride + kw))
    for y in range(h):
        for z in range(w):
            ref[:, :, y * stride:y * stride + kh, z * stride:z * stride + kw] += np.einsum(
                "nc,cokl->nokl", x[:, :, y, z].astype(np.float64), k.astype(np.float64))
    assert_close(out, ref, 5e-4)


@pytest.mark.parametrize("op", [PoolOp.MAX, PoolOp.AVG], ids=["max", "avg"])
@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 1, 1), (3, 2, 2), (5, 3, 0)])
def test_pool_1d(backend, rng, op, k, s, p):
    x = f32(rng, (2, 3, 4, 13))
    out = compute(backend, lambda ctx, a: ops.pool_1d(ctx, a, op, k, s, p), x)
    ow = (13 + 2 * p - k) // s + 1
    ref = np.empty(x.shape[:3] + (ow,))
    for o in range(ow):                              # padding is skipped, not counted
        lo, hi = max(0, o * s - p), min(13, o * s - p + k)
        win = x[..., lo:hi].astype(np.float64)
        ref[..., o] = win.max(-1) if op == PoolOp.MAX else win.mean(-1)
    assert_close(out, ref)


@pytest.mark.parametrize("op", [PoolOp.MAX, PoolOp.AVG], ids=["max", "avg"])
@pytest.mark.parametrize("k,s,p", [((2, 2), (2, 2), (0, 0)), ((3, 3), (1, 2), (1, 1)),
                                   ((3, 2), (2, 1), (1, 0))])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_pool_2d(backend, rng, op, k, s, p, dtype):
    x = f32(rng, (2, 3, 9, 10)).astype(dtype)
    (k0, k1), (s0, s1), (p0, p1) = k, s, p
    out = compute(backend, lambda ctx, a: ops.pool_2d(ctx, a, op, k0, k1, s0, s1, p0, p1), x)
    fill = -np.inf if op == PoolOp.MAX else 0.0
    xp_ = _pad_hw(x.astype(np.float64), p1, p0, fill)
    oh, ow = (9 + 2 * p1 - k1) // s1 + 1, (10 + 2 * p0 - k0) // s0 + 1
    ref = np.empty(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp_[..., i * s1:i * s1 + k1, j * s0:j * s0 + k0]
            ref[..., i, j] = (win.max((-2, -1)) if op == PoolOp.MAX
                else win.sum((-2, -1)) / (k0 * k1))
    assert_close(out, ref, 1e-7 if dtype == np.float32 else 1e-6)


def test_conv_validation():
    ctx = Context()
    k = ctx.new_tensor(GGMLType.F32, (3, 3, 2, 4))
    x = ctx.new_tensor(GGMLType.F32, (8, 8, 3, 1))
    with pytest.raises(ShapeError):
        ops.conv_2d_direct(ctx, k, x)                 # channels differ
    with pytest.raises(ShapeError):
        ops.pool_2d(ctx, x, PoolOp.MAX, 9, 9, 1, 1)   # window larger than input
    with pytest.raises(InvalidArgumentError):
        ops.conv_2d_direct(ctx, k, ctx.new_tensor(GGMLType.F32, (8, 8, 2, 1)), 0)


@pytest.mark.parametrize("kernel_type", [GGMLType.F32, GGMLType.F16])
def test_conv_2d_patches_take_the_kernels_type(kernel_type):
    """ggml_conv_2d builds its IM2COL with the kernel's type (ggml-python's ggml); an F32
    kernel must not round the input to F16 on the way."""
    ctx = Context()
    a = ctx.new_tensor(kernel_type, (3, 3, 4, 2))
    b = ctx.new_tensor(GGMLType.F32, (8, 8, 4, 1))
    graph = build_graph(ops.conv_2d(ctx, a, b, 1, 1, 1, 1))
    (patches,) = [n for n in graph.nodes if n.op == Op.IM2COL]
    assert patches.type == kernel_type
