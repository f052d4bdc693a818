"""Ops computed from parameters alone: ARANGE and TIMESTEP_EMBEDDING (float32 as ggml)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.tensor import Tensor
from polydev.ops import ArangeParams, TimestepEmbeddingParams


def bind_arange(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    params = ArangeParams.of(node)
    start, step = params.start, params.step
    d = env.view(node).reshape(-1)
    # start + step * i rounded once (as an fma does); no inputs, so computed once per plan
    i = np.arange(d.shape[0], dtype=np.float64)
    values = xp.asarray((np.float64(start) + np.float64(step) * i).astype(np.float32))
    return lambda: xp.copyto(d, values)


def bind_timestep_embedding(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    params = TimestepEmbeddingParams.of(node)
    dim, max_period = params.dim, params.max_period
    half = dim // 2
    d, t = env.view(node)[0, 0], env.view(node.src[0]).reshape(-1, 1)
    j = np.arange(half, dtype=np.float32)
    freqs = xp.asarray(np.exp(-np.log(np.float32(max_period)) * j / np.float32(half)))
    cos_part, sin_part, tail = d[:, :half], d[:, half:2 * half], d[:, 2 * half:]

    def run() -> None:
        args = t * freqs
        xp.cos(args, out=cos_part)
        xp.sin(args, out=sin_part)
        tail.fill(0)
    return run
