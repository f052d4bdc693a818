"""Reductions and scans: SUM, SUM_ROWS, MEAN, ARGMAX, CUMSUM, COUNT_EQUAL."""

from __future__ import annotations

from typing import Callable

from polydev.tensor import Tensor


def bind_sum(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    d, a = env.view(node), env.view(node.src[0])
    # ggml accumulates f32 sums in double
    return lambda: xp.copyto(d, a.sum(dtype=xp.float64).reshape(d.shape), casting="unsafe")


def bind_sum_rows(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    d, a = env.view(node), env.view(node.src[0])
    if d.dtype == xp.float32 and a.dtype == xp.float32:
        return lambda: xp.sum(a, axis=-1, keepdims=True, out=d)
    return lambda: xp.copyto(d, a.sum(axis=-1, keepdims=True, dtype=xp.float32), casting="unsafe")


def bind_mean(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    d, a = env.view(node), env.view(node.src[0])
    n = a.shape[-1]

    def run() -> None:
        xp.sum(a, axis=-1, keepdims=True, dtype=xp.float32, out=d)
        xp.divide(d, n, out=d)
    return run


def bind_argmax(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    d, a = env.view(node), env.view(node.src[0])
    rows, out = a.reshape(a.shape[-2:]), d.reshape(-1)
    return lambda: xp.copyto(out, xp.argmax(rows, axis=-1), casting="unsafe")


def bind_cumsum(env, node: Tensor) -> Callable[[], None]:
    d, a = env.view(node), env.view(node.src[0])
    return lambda: env.xp.cumsum(a, axis=-1, out=d)


def bind_count_equal(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    d, a, b = env.view(node).reshape(()), env.view(node.src[0]), env.view(node.src[1])
    return lambda: xp.copyto(d, xp.count_nonzero(a == b))
