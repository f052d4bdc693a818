"""Normalisation: NORM, RMS_NORM, L2_NORM over rows and GROUP_NORM over groups of channels
(float32, as ggml's CPU kernels)."""

from __future__ import annotations

from typing import Callable

from polydev.tensor import Tensor
from polydev.ops import GroupNormParams, NormParams


def bind_norm(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    eps = NormParams.of(node).eps
    d, a = env.view(node), env.view(node.src[0])

    def run() -> None:
        centered = a - a.mean(axis=-1, keepdims=True)
        var = xp.square(centered).mean(axis=-1, keepdims=True)
        var += eps
        xp.sqrt(var, out=var)
        xp.divide(centered, var, out=d)
    return run


def bind_rms_norm(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    eps = NormParams.of(node).eps
    d, a = env.view(node), env.view(node.src[0])
    n = a.shape[-1]

    def run() -> None:
        ms = xp.square(a).sum(axis=-1, keepdims=True)
        ms /= n
        ms += eps
        xp.sqrt(ms, out=ms)
        xp.divide(a, ms, out=d)
    return run


def bind_l2_norm(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    eps = NormParams.of(node).eps
    d, a = env.view(node), env.view(node.src[0])

    def run() -> None:
        length = xp.sqrt(xp.square(a).sum(axis=-1, keepdims=True, dtype=xp.float64))
        xp.multiply(a, (1.0 / xp.maximum(length, eps)).astype(xp.float32), out=d)
    return run


def _channel_groups(n_channels: int, n_groups: int) -> tuple[list[int], list[int]]:
    """ggml's grouping: ceil(C / G) channels per group, the last groups shorter or empty."""
    per_group = -(-n_channels // n_groups)
    starts = [g * per_group for g in range(n_groups) if g * per_group < n_channels]
    sizes = [min(per_group, n_channels - s) for s in starts]
    return starts, sizes


def bind_group_norm(env, node: Tensor) -> Callable[[], None]:
    """GROUP_NORM: per dim-3 index and channel group, (x - mean) / sqrt(var + eps)."""
    xp = env.xp
    params = GroupNormParams.of(node)
    n_groups, eps = params.n_groups, params.eps
    d, a = env.view(node), env.view(node.src[0])        # (n3, channels, n1, n0)
    starts, sizes = _channel_groups(a.shape[1], n_groups)
    counts = xp.asarray([s * a.shape[2] * a.shape[3] for s in sizes], dtype=xp.float64)
    starts_xp = xp.asarray(starts)
    # each channel's group, to spread per-group statistics back over the channels
    spread = xp.asarray(sum(([g] * s for g, s in enumerate(sizes)), []))

    def per_group(channel_sums):
        return xp.add.reduceat(channel_sums, starts_xp, axis=1) / counts

    def run() -> None:
        mean = per_group(a.sum(axis=(2, 3), dtype=xp.float64))[:, spread, None, None]
        centered = (a - mean.astype(xp.float32))
        var = per_group(xp.square(centered).sum(axis=(2, 3), dtype=xp.float64))
        scale = (1.0 / xp.sqrt(var + eps)).astype(xp.float32)[:, spread, None, None]
        xp.multiply(centered, scale, out=d)
    return run
