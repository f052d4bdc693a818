"""UPSCALE (ggml_interpolate): nearest, bilinear, bicubic and antialiased bilinear resampling.

Every mode is separable: along each axis, output element i is a weighted sum of a few source
elements (its taps). The taps are computed once per plan on the host, in float32 with ggml's
formulas, and applied as gathers along one axis at a time; dims 2 and 3 are always nearest.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.ops import ScaleMode, UpscaleParams
from polydev.tensor import Tensor

F32 = np.float32


def _nearest(n_out: int, sf: np.float32) -> tuple[np.ndarray, None]:
    return (np.arange(n_out, dtype=F32) / sf).astype(np.int64)[:, None], None


def _linear(n_out: int, n_in: int, sf: np.float32, offset: np.float32):
    x = (np.arange(n_out, dtype=F32) + offset) / sf - offset
    x0 = np.floor(x).astype(np.int64)
    idx = np.clip(np.stack([x0, x0 + 1], axis=1), 0, n_in - 1)
    dx = np.clip(x - idx[:, 0].astype(F32), F32(0), F32(1))
    return idx, np.stack([1 - dx, dx], axis=1)


def _cubic(n_out: int, n_in: int, sf: np.float32, offset: np.float32):
    a = F32(-0.75)                      # PyTorch's and ggml's alpha
    x = (np.arange(n_out, dtype=F32) + offset) / sf - offset
    x0 = np.floor(x)
    t = x - x0
    near = lambda s: ((a + 2) * s - (a + 3)) * s * s + 1                 # noqa: E731  |s| <= 1
    far = lambda s: ((a * s - 5 * a) * s + 8 * a) * s - 4 * a            # noqa: E731  1 < |s| < 2
    w = np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=1).astype(F32)
    idx = np.clip(x0.astype(np.int64)[:, None] + np.arange(-1, 3), 0, n_in - 1)
    return idx, w


def _antialiased(n_out: int, n_in: int, sf: np.float32, offset: np.float32):
    support = max(F32(1), F32(1) / sf)
    invscale = F32(1) / support
    centre = (np.arange(n_out, dtype=F32) + offset) / sf
    lo = np.maximum((centre - support + offset).astype(np.int64), 0)
    hi = np.minimum((centre + support + offset).astype(np.int64), n_in)
    taps = int((hi - lo).max())
    idx = lo[:, None] + np.arange(taps)
    w = np.maximum(1 - np.abs((idx - centre[:, None] + offset) * invscale), 0).astype(F32)
    w[idx >= hi[:, None]] = 0
    w /= np.maximum(w.sum(axis=1, keepdims=True), np.finfo(F32).tiny)
    return np.minimum(idx, n_in - 1), w


def _taps(mode: int, n_out: int, n_in: int, sf: np.float32, offset: np.float32):
    base = mode & 0xFF
    if base == ScaleMode.NEAREST:
        return _nearest(n_out, sf)
    if base == ScaleMode.BICUBIC:
        return _cubic(n_out, n_in, sf, offset)
    if mode & ScaleMode.ANTIALIAS:
        return _antialiased(n_out, n_in, sf, offset)
    return _linear(n_out, n_in, sf, offset)


def _scale_factors(node: Tensor, src: Tensor, align_corners: bool) -> list[np.float32]:
    sf = [F32(node.ne[i]) / F32(src.ne[i]) for i in range(4)]
    if align_corners:
        for i in (0, 1):
            if node.ne[i] > 1 and src.ne[i] > 1:
                sf[i] = F32(node.ne[i] - 1) / F32(src.ne[i] - 1)
    return sf


def _apply(xp, x, axis: int, idx, w):
    """Resample ``x`` along ``axis`` with taps (idx[n_out, T], w[n_out, T] or None)."""
    if w is None:
        return xp.take(x, idx[:, 0], axis=axis)
    shape = [1] * x.ndim
    shape[axis] = -1
    out = xp.take(x, idx[:, 0], axis=axis) * w[:, 0].reshape(shape)
    for t in range(1, idx.shape[1]):
        out += xp.take(x, idx[:, t], axis=axis) * w[:, t].reshape(shape)
    return out


def bind_upscale(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    src = node.src[0]
    mode = UpscaleParams.of(node).mode
    align = bool(mode & ScaleMode.ALIGN_CORNERS)
    sf = _scale_factors(node, src, align)
    offset = F32(0.0 if align else 0.5)
    # numpy axis k is ggml dimension 3 - k; dims 2 and 3 are nearest whatever the mode
    plan = []
    for dim in range(4):
        idx, w = _taps(mode if dim < 2 else ScaleMode.NEAREST, node.ne[dim], src.ne[dim],
                       sf[dim], offset)
        if w is None and node.ne[dim] == src.ne[dim]:
            continue                  # nearest at scale 1 is the identity
        plan.append((3 - dim, xp.asarray(idx), None if w is None else xp.asarray(w)))
    a, d = env.view(src), env.view(node)

    def run() -> None:
        x = a
        for axis, idx, w in plan:
            x = _apply(xp, x, axis, idx, w)
        xp.copyto(d, x)
    return run
