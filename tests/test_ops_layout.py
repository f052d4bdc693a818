"""Layout ops: PAD_REFLECT_1D, ROLL, ACC, SET, UPSCALE and GET_ROWS_BACK on every device against
independent float64 numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from polydev import Context, GGMLType, ops
from polydev.errors import InvalidArgumentError, OutOfBoundsError, ShapeError
from polydev.ops import ScaleMode

from conftest import assert_close, compute
from test_ops import f32


@pytest.mark.parametrize("p0,p1", [(0, 0), (3, 2), (1, 0), (0, 6), (6, 6)])
def test_pad_reflect_1d(backend, rng, p0, p1):
    a = f32(rng, (2, 3, 4, 7))
    out = compute(backend, lambda ctx, x: ops.pad_reflect_1d(ctx, x, p0, p1), a)
    ref = np.pad(a.astype(np.float64), [(0, 0)] * 3 + [(p0, p1)], mode="reflect")
    assert_close(out, ref)


def test_pad_reflect_1d_rejects_long_padding():
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F32, (5, 2))
    with pytest.raises(InvalidArgumentError):
        ops.pad_reflect_1d(ctx, a, 5, 0)


@pytest.mark.parametrize("shifts", [(0, 0, 0, 0), (3, 0, 0, 0), (-2, 1, 0, 0), (5, -2, 1, 1),
                                    (0, 0, -2, 0)])
def test_roll(backend, rng, shifts):
    a = f32(rng, (2, 3, 4, 7))
    out = compute(backend, lambda ctx, x: ops.roll(ctx, x, *shifts), a)
    assert_close(out, np.roll(a.astype(np.float64), shifts, axis=(3, 2, 1, 0)))


def test_roll_of_transposed_view(backend, rng):
    a = f32(rng, (1, 1, 5, 8))
    out = compute(backend, lambda ctx, x: ops.roll(ctx, ops.cont(ctx, ctx.transpose(x)), 2, -1),
                  a)
    assert_close(out, np.roll(a.swapaxes(-1, -2).astype(np.float64), (-1, 2), axis=(2, 3)))


def _window_ref(a, b, nb1, nb2, nb3, offset, add):
    flat = a.astype(np.float64).reshape(-1).copy()
    item = 4
    i3, i2, i1, i0 = np.indices(b.shape)
    pos = (offset + i0 * item + i1 * nb1 + i2 * nb2 + i3 * nb3) // item
    if add:
        flat[pos] += b
    else:
        flat[pos] = b
    return flat.reshape(a.shape)


@pytest.mark.parametrize("op", ["acc", "set_"])
@pytest.mark.parametrize("inplace", [False, True])
def test_acc_and_set(backend, rng, op, inplace):
    a, b = f32(rng, (2, 3, 5, 10)), f32(rng, (2, 2, 3, 4))
    # b's rows land at column 3 of rows 1.. of a, two rows apart, in channels 0-1
    nb1, nb2, nb3, offset = 2 * 40, 200, 600, 40 + 12
    out = compute(backend, lambda ctx, x, y: getattr(ops, op)(ctx, x, y, nb1, nb2, nb3, offset,
                                                               inplace=inplace), a, b)
    assert_close(out, _window_ref(a, b, nb1, nb2, nb3, offset, op == "acc"))


def test_set_1d_2d_and_bounds(backend, rng):
    a, b = f32(rng, (1, 1, 4, 6)), f32(rng, (1, 1, 1, 5))
    out = compute(backend, lambda ctx, x, y: ops.set_1d(ctx, x, y, 4), a, b)
    assert_close(out, _window_ref(a, b, 24, 96, 96, 4, False))
    b2 = f32(rng, (1, 1, 2, 3))
    out = compute(backend, lambda ctx, x, y: ops.set_2d(ctx, x, y, 48, 8), a, b2)
    assert_close(out, _window_ref(a, b2, 48, 96, 96, 8, False))
    with pytest.raises(ShapeError):
        compute(backend, lambda ctx, x, y: ops.set_1d(ctx, x, y, 80), a, b)


def _source_coords(n_out, n_in, align, mode_base):
    """The source coordinate of every output pixel along one axis (float64)."""
    if align and n_out > 1 and n_in > 1:
        return np.arange(n_out) * (n_in - 1) / (n_out - 1)
    return (np.arange(n_out) + 0.5) * n_in / n_out - 0.5


def _bilinear_ref(x, n0, n1, align=False):
    h, w = x.shape[-2:]
    ys, xs = _source_coords(n1, h, align, 1), _source_coords(n0, w, align, 1)
    y0 = np.clip(np.floor(ys).astype(int), 0, h - 1)
    x0 = np.clip(np.floor(xs).astype(int), 0, w - 1)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    dy = np.clip(ys - y0, 0, 1)[:, None]
    dx = np.clip(xs - x0, 0, 1)[None, :]
    p = lambda yy, xx: x[..., yy[:, None], xx[None, :]]      # noqa: E731
    return (p(y0, x0) * (1 - dx) * (1 - dy) + p(y0, x1) * dx * (1 - dy)
        + p(y1, x0) * (1 - dx) * dy + p(y1, x1) * dx * dy)


def _cubic_weights(t, a=-0.75):
    def near(s):
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s):
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _bicubic_ref(x, n0, n1):
    h, w = x.shape[-2:]
    ys, xs = _source_coords(n1, h, False, 2), _source_coords(n0, w, False, 2)
    fy, fx = np.floor(ys).astype(int), np.floor(xs).astype(int)
    wy, wx = _cubic_weights(ys - fy), _cubic_weights(xs - fx)
    out = 0.0
    for i in range(4):                           # 16 taps over whole arrays: no per-pixel loop
        for j in range(4):
            yy, xx = np.clip(fy + i - 1, 0, h - 1), np.clip(fx + j - 1, 0, w - 1)
            out = out + x[..., yy[:, None], xx[None, :]] * (wy[i][:, None] * wx[j][None, :])
    return out


@pytest.mark.parametrize("shape,target", [((2, 3, 4, 5), (10, 8, 3, 2)),
                                          ((1, 2, 6, 9), (4, 3, 2, 1)),
                                          ((1, 1, 3, 3), (7, 5, 1, 1))])
def test_upscale_nearest(backend, rng, shape, target):
    a = f32(rng, shape)
    out = compute(backend, lambda ctx, x: ops.interpolate(ctx, x, *target), a)
    idx = [np.floor(np.arange(t) * s / t).astype(int) for t, s in zip(target[::-1], shape)]
    ref = a.astype(np.float64)[np.ix_(*idx)]
    assert_close(out, ref)


def test_upscale_integer_factor_repeats(backend, rng):
    a = f32(rng, (1, 2, 3, 4))
    out = compute(backend, lambda ctx, x: ops.upscale(ctx, x, 3), a)
    assert_close(out, a.astype(np.float64).repeat(3, axis=2).repeat(3, axis=3))


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("shape,target", [((1, 2, 4, 5), (11, 9)), ((2, 1, 7, 6), (3, 2)),
                                          ((1, 1, 1, 4), (8, 3))])
def test_upscale_bilinear(backend, rng, shape, target, align):
    a = f32(rng, shape)
    mode = ScaleMode.BILINEAR | (ScaleMode.ALIGN_CORNERS if align else 0)
    out = compute(backend, lambda ctx, x: ops.interpolate(ctx, x, *target, shape[1], shape[0],
                                                          mode), a)
    assert_close(out, _bilinear_ref(a.astype(np.float64), *target, align))


@pytest.mark.parametrize("shape,target", [((1, 2, 4, 5), (11, 9)), ((1, 1, 9, 8), (3, 4))])
def test_upscale_bicubic(backend, rng, shape, target):
    a = f32(rng, shape)
    out = compute(backend, lambda ctx, x: ops.interpolate(ctx, x, *target, shape[1], shape[0],
                                                          ScaleMode.BICUBIC), a)
    assert_close(out, _bicubic_ref(a.astype(np.float64), *target))


def _antialias_axis(n_out, n_in):
    """The dense resampling matrix of PyTorch's antialiased bilinear along one axis."""
    scale = n_out / n_in
    support = max(1.0, 1.0 / scale)
    m = np.zeros((n_out, n_in))
    for i in range(n_out):                       # the reference builds a small matrix
        centre = (i + 0.5) / scale
        for s in range(n_in):
            m[i, s] = max(0.0, 1 - abs((s - centre + 0.5) / support))
        m[i] /= m[i].sum()
    return m


def test_upscale_bilinear_antialias_downscale(backend, rng):
    a = f32(rng, (1, 2, 12, 16))
    mode = ScaleMode.BILINEAR | ScaleMode.ANTIALIAS
    out = compute(backend, lambda ctx, x: ops.interpolate(ctx, x, 5, 4, 2, 1, mode), a)
    ref = _antialias_axis(4, 12) @ a.astype(np.float64) @ _antialias_axis(5, 16).T
    assert_close(out, ref)


def test_upscale_rejects_bad_modes():
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F32, (4, 4))
    with pytest.raises(InvalidArgumentError):
        ops.interpolate(ctx, a, 8, 8, 1, 1, 7)
    with pytest.raises(InvalidArgumentError):
        ops.interpolate(ctx, a, 2, 2, 1, 1, ScaleMode.NEAREST | ScaleMode.ANTIALIAS)


def test_get_rows_back(backend, rng):
    grads = f32(rng, (1, 1, 6, 8))
    idx = np.array([3, 0, 3, 4, 3, 1], np.int32)
    like = np.zeros((1, 1, 5, 8), np.float32)
    out = compute(backend, lambda ctx, g, i, c: ops.get_rows_back(ctx, g, i, c), grads, idx, like)
    ref = np.zeros((5, 8))
    np.add.at(ref, idx, grads[0, 0].astype(np.float64))
    assert_close(out.reshape(5, 8), ref)
    with pytest.raises(OutOfBoundsError):
        compute(backend, lambda ctx, g, i, c: ops.get_rows_back(ctx, g, i, c), grads,
                idx + 2, like)
