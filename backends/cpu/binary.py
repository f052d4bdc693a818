"""ADD and MUL of float32 rows in the compiled kernels (native/binary.c).

A decode step adds its residuals and multiplies its norms' weights: rows of one token, where
a numpy call costs more than the arithmetic, and where, between two compiled calls, it would
split a plan's replay (replay.py) in two. The kernel takes the common shapes, ``b`` with as
many rows as ``a`` or one row repeated over them, each with unit element stride and rows one
stride apart; any other shape (ggml's other repeats, strided views) goes to the array kernel.
The float32 operations are numpy's, so results are equal.
"""

from __future__ import annotations

from typing import Callable

from polydev.backends.array.elementwise import bind_binary
from polydev.backends.array.rows import as_rows
from polydev.ops import Op
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .native import kernels, loaded_kernels
from .native.arguments import BinaryArguments
from .replay import CallCode, replayable

_CODES = {Op.ADD: 0, Op.MUL: 1}         # binary.c's BINARY_ADD, BINARY_MUL


def native_binary_ok(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    return (loaded_kernels() is not None and node.op in _CODES
            and node.type == a.type == b.type == GGMLType.F32 and a.ne == node.ne)


def bind_native_binary(env, node: Tensor) -> Callable[[], None]:
    a_t, b_t = node.src[0], node.src[1]
    n = node.ne[0]
    d, a, b = as_rows(env.view(node), n), as_rows(env.view(a_t), n), _b_rows(env, b_t, node)
    if d is None or a is None or b is None:
        return bind_binary(env, node)
    b_rows, b_stride = b
    args = BinaryArguments(op=_CODES[node.op], a=a.ctypes.data, a_stride=a.strides[0] // 4,
                           b=b_rows.ctypes.data, b_stride=b_stride, d=d.ctypes.data,
                           d_stride=d.strides[0] // 4, n_rows=d.shape[0], n=n,
                           n_threads=env.n_threads)
    binary, where = kernels().binary_f32_packed, args.address

    def run() -> None:
        binary(where)
    run.keep_alive = args
    return replayable(run, CallCode.BINARY, args)


def _b_rows(env, b_t: Tensor, node: Tensor):
    """``b`` as (rows, stride in floats): as many rows as the result, or one row for all
    (stride 0); None for any other shape."""
    n = node.ne[0]
    if b_t.ne[0] != n:
        return None
    b = as_rows(env.view(b_t), n)
    if b is None:
        return None
    if b_t.ne == node.ne:
        return b, b.strides[0] // 4
    if b.shape[0] == 1:
        return b, 0
    return None
