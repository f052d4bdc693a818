"""SOFT_MAX (with mask, scale, ALiBi and sinks) and DIAG_MASK_INF."""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.ops import DiagMaskParams, SoftMaxParams, SoftMaxSources, alibi_slopes
from polydev.tensor import Tensor

from .broadcast import split_shapes
from .env import same_memory


def bind_soft_max(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    params = SoftMaxParams.of(node)
    scale, max_bias = params.scale, params.max_bias
    _, mask_t, sinks_t = SoftMaxSources.of(node)
    d, a = env.view(node), env.view(node.src[0])
    head_shape = (1, a.shape[1], 1, 1)           # per-head values broadcast over rows and cols
    slopes = xp.asarray(alibi_slopes(a.shape[1], max_bias).reshape(head_shape))
    sinks = env.view(sinks_t).reshape(head_shape) if sinks_t is not None else None
    mask = None
    if mask_t is not None:
        mask = env.view(mask_t)[:, :, :a.shape[2], :]      # the mask may have extra rows
        big, small = split_shapes(a.shape, mask.shape)
        if big != tuple(a.shape):
            # ggml reads mask head i % mask_heads: split the head (and batch) dims so numpy
            # broadcasting does the same; per-head arrays follow the head dim's split
            per_head = _per_head_shape(a.shape, mask.shape)
            d, a, mask = d.reshape(big), a.reshape(big), mask.reshape(small)
            slopes = slopes.reshape(per_head)
            sinks = sinks.reshape(per_head) if sinks is not None else None

    def run() -> None:
        w = a * xp.float32(scale)
        if mask is not None:
            w += mask * slopes if max_bias > 0.0 else mask
        row_max = w.max(axis=-1, keepdims=True)
        if sinks is not None:
            xp.maximum(row_max, sinks, out=row_max)
        w -= row_max
        xp.exp(w, out=w)
        total = w.sum(axis=-1, keepdims=True)
        if sinks is not None:
            total += xp.exp(sinks - row_max)
        xp.divide(w, total, out=d)
    return run


def _per_head_shape(big, small) -> tuple[int, ...]:
    """The split shape of an array that varies only along numpy dimension 1 (the heads)."""
    shape: list[int] = []
    for i, (b, s) in enumerate(zip(big, small)):
        split = not (s == b or s == 1)
        if i == 1:
            shape += [b // s, s] if split else [b]
        else:
            shape += [1, 1] if split else [1]
    return tuple(shape)


def bind_diag_mask_inf(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    n_past = DiagMaskParams.of(node).n_past
    d, a = env.view(node), env.view(node.src[0])
    rows, cols = a.shape[-2], a.shape[-1]
    masked = xp.asarray(np.arange(cols)[None, :] > n_past + np.arange(rows)[:, None])
    inplace = same_memory(node, node.src[0])

    def run() -> None:
        if not inplace:
            xp.copyto(d, a)
        xp.copyto(d, xp.float32(-xp.inf), where=masked)
    return run
