"""Row normalisation: NORM and RMS_NORM (float32, as ggml's CPU kernels)."""

from __future__ import annotations

from typing import Callable

from polydev.tensor import Tensor


def bind_norm(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    (eps,) = node.op_params
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
    (eps,) = node.op_params
    d, a = env.view(node), env.view(node.src[0])
    n = a.shape[-1]

    def run() -> None:
        ms = xp.square(a).sum(axis=-1, keepdims=True)
        ms /= n
        ms += eps
        xp.sqrt(ms, out=ms)
        xp.divide(a, ms, out=d)
    return run
