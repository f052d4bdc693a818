"""RMS_NORM of float32 rows in the compiled kernels.

A decode step normalises one row per layer twice, and as six numpy calls each cost about
28 µs of call overhead. The compiled kernel is one call and follows ggml's CPU kernel: each
square in float, summed in double (eight partial sums where ggml has one), then
x * (1 / sqrt(mean + eps)); a prompt's rows are split over the threads.
"""

from __future__ import annotations

from typing import Callable

from polydev.tensor import Tensor
from polydev.types import GGMLType
from polydev.ops import NormParams

from .native import kernels, loaded_kernels
from .native.arguments import RmsNormArguments, TensorWords
from .replay import CallCode, replayable


def native_rms_norm_ok(node: Tensor) -> bool:
    a = node.src[0]
    return (loaded_kernels() is not None and a.type == GGMLType.F32
            and node.type == GGMLType.F32
            and a.nb[0] == 4 and node.nb[0] == 4)


def bind_native_rms_norm(env, node: Tensor) -> Callable[[], None]:
    a = node.src[0]
    eps = NormParams.of(node).eps
    args = RmsNormArguments(a=TensorWords.of(env.view(a).ctypes.data, a),
                            d=TensorWords.of(env.view(node).ctypes.data, node),
                            n_threads=env.n_threads)
    rms_norm, where = kernels().rms_norm_f32_packed, args.address

    def run() -> None:
        rms_norm(where, eps)
    run.keep_alive = args
    return replayable(run, CallCode.RMS_NORM, args, f0=eps)
