"""ADD, SUB, MUL and DIV of float32 tensors in the compiled kernels (native/binary.c), and
SCALE without a bias as a MUL by its one factor.

A decode step adds its residuals, multiplies its norms' weights and, in a mixture of experts,
scales and normalizes the router's weights: a token's rows, where a numpy call costs more
than the arithmetic, and where, between two compiled calls, it would split a plan's replay
(replay.py) in two. The kernel takes ggml's repeat of ``b`` over ``a`` (each of b's
dimensions divides a's) with unit element strides (b may also be one value per row); other
layouts, and a result that overlaps a source other than element for element, go to the
array kernel. The float32 operations are numpy's, so results are equal. SCALE (gemma's token
embedding times sqrt(n_embd)) is numpy's multiply by the factor as float32 too: compiled, it
no longer splits a step's run of calls.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np

from polydev.backends.array.elementwise import bind_binary, bind_scale
from polydev.ops import Op, ScaleParams
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .native import kernels, loaded_kernels
from .native.arguments import BinaryArguments, TensorWords
from .replay import CallCode, replayable

_CODES = {Op.ADD: 0, Op.SUB: 1, Op.MUL: 2, Op.DIV: 3}     # binary.c's BINARY_*


def native_binary_ok(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    return (loaded_kernels() is not None and node.op in _CODES
            and node.type == a.type == b.type == GGMLType.F32 and a.ne == node.ne
            and all(m and n % m == 0 for n, m in zip(a.ne, b.ne))
            and a.nb[0] == node.nb[0] == 4 and (b.nb[0] == 4 or b.ne[0] == 1))


def bind_native_binary(env, node: Tensor) -> Callable[[], None]:
    a, b = node.src[0], node.src[1]
    d_view, a_view, b_view = env.view(node), env.view(a), env.view(b)
    if overlaps_shifted(d_view, a_view) or overlaps_shifted(d_view, b_view):
        return bind_binary(env, node)     # numpy buffers the overlap; the threads would not
    return _bound(env, TensorWords.of(a_view.ctypes.data, a),
                  TensorWords.of(b_view.ctypes.data, b),
                  TensorWords.of(d_view.ctypes.data, node), node.op)


def _bound(env, a: TensorWords, b: TensorWords, d: TensorWords, op: Op,
           *keep: object) -> Callable[[], None]:
    """The bound call of pd_binary_f32 (``keep``: what its record points to, kept alive)."""
    args = BinaryArguments(a=a, b=b, d=d, op=_CODES[op], n_threads=env.n_threads)
    binary, where = kernels().binary_f32_packed, args.address

    def run() -> None:
        binary(where)
    run.keep_alive = (args, *keep)
    return replayable(run, CallCode.BINARY, args)


def overlaps_shifted(d: np.ndarray, x: np.ndarray) -> bool:
    """Whether ``d`` shares memory with source ``x`` other than as the same elements (an
    in-place op): then a row written may be one another thread still reads."""
    same = (d.ctypes.data == x.ctypes.data and d.strides == x.strides and d.shape == x.shape)
    return not same and np.may_share_memory(d, x)


def native_scale_ok(node: Tensor) -> bool:
    """SCALE without a bias (a * scale) of float32 rows with unit element stride."""
    a = node.src[0]
    return (loaded_kernels() is not None and node.type == a.type == GGMLType.F32
            and a.ne == node.ne and a.nb[0] == node.nb[0] == 4
            and ScaleParams.of(node).bias == 0.0)


def bind_native_scale(env, node: Tensor) -> Callable[[], None]:
    a = node.src[0]
    d_view, a_view = env.view(node), env.view(a)
    if overlaps_shifted(d_view, a_view):
        return bind_scale(env, node)
    factor = np.array([ScaleParams.of(node).scale], dtype=np.float32)   # b: one value
    one = SimpleNamespace(ne=(1, 1, 1, 1), nb=(4, 4, 4, 4))
    return _bound(env, TensorWords.of(a_view.ctypes.data, a),
                  TensorWords.of(factor.ctypes.data, one),
                  TensorWords.of(d_view.ctypes.data, node), Op.MUL, factor)
