"""A mixture of experts' router ops in the compiled kernels (native/row_ops.c): SOFT_MAX of
float32 rows without a mask, TOP_K, SUM_ROWS and CLAMP; GET_ROWS of float32 rows is in
get_rows.py.

A decode step's router takes one token's expert logits through these between its compiled
products. As numpy calls they cost more than their arithmetic and split the layer's replay
(replay.py) in three; here each is a replayable call. Other layouts and types (a mask, sinks,
strided values) go to the array kernels.
"""

from __future__ import annotations

from typing import Callable

from polydev.backends.array.elementwise import bind_clamp
from polydev.backends.array.reduce import bind_sum_rows
from polydev.backends.array.softmax import bind_soft_max
from polydev.backends.array.sort import bind_top_k
from polydev.ops import ClampParams, SoftMaxParams, SoftMaxSources
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .binary import overlaps_shifted
from .native import kernels, loaded_kernels
from .native.arguments import RowArguments, TensorWords
from .replay import CallCode, replayable

F32, I32 = GGMLType.F32, GGMLType.I32


def _unit_rows(*tensors: Tensor) -> bool:
    """Whether each tensor's values are contiguous along its rows (float32 and int32: 4
    bytes apart)."""
    return all(t.nb[0] == 4 for t in tensors)


def native_soft_max_ok(node: Tensor) -> bool:
    """Plain rows: float32, no mask, no sinks (the router's softmax)."""
    x, mask, sinks = SoftMaxSources.of(node)
    return (loaded_kernels() is not None and mask is None and sinks is None
            and node.type == x.type == F32 and node.ne == x.ne and _unit_rows(node, x))


# TOP_K's largest k the kernel takes: it inserts each value into the k kept (O(n k)), below
# a sort's cost for a router's k (1 to 32) and far above it for large k (numpy partitions)
TOP_K_MAX = 32


def native_top_k_ok(node: Tensor) -> bool:
    a = node.src[0]
    return (loaded_kernels() is not None and a.type == F32 and node.type == I32
            and node.ne[1:] == a.ne[1:] and 1 <= node.ne[0] <= min(a.ne[0], TOP_K_MAX)
            and _unit_rows(node, a))


def native_sum_rows_ok(node: Tensor) -> bool:
    a = node.src[0]
    return (loaded_kernels() is not None and node.type == a.type == F32 and node.ne[0] == 1
            and node.ne[1:] == a.ne[1:] and _unit_rows(a))


def native_clamp_ok(node: Tensor) -> bool:
    a = node.src[0]
    return (loaded_kernels() is not None and node.type == a.type == F32 and node.ne == a.ne
            and _unit_rows(node, a))


def _row_arguments(env, node: Tensor) -> RowArguments | None:
    """The record of ``node`` from its first source, or None where the result overlaps the
    source other than element for element (numpy buffers that; the kernel would not)."""
    a = node.src[0]
    d_view, a_view = env.view(node), env.view(a)
    if overlaps_shifted(d_view, a_view):
        return None
    return RowArguments(a=TensorWords.of(a_view.ctypes.data, a),
                        d=TensorWords.of(d_view.ctypes.data, node), n_threads=env.n_threads)


def _bind(env, node: Tensor, code: CallCode, entry, array_bind,
          floats: tuple[float, ...] = ()) -> Callable[[], None]:
    """``node`` bound to the packed ``entry`` with ``floats`` (at most two) beside its record;
    to ``array_bind`` where the kernel cannot take its layout."""
    args = _row_arguments(env, node)
    if args is None:
        return array_bind(env, node)
    where = args.address

    def run() -> None:
        entry(where, *floats)
    run.keep_alive = args
    f0, f1 = (*floats, 0.0, 0.0)[:2]
    return replayable(run, code, args, f0=f0, f1=f1)


def bind_native_soft_max(env, node: Tensor) -> Callable[[], None]:
    return _bind(env, node, CallCode.SOFT_MAX, kernels().soft_max_f32_packed, bind_soft_max,
                 (SoftMaxParams.of(node).scale,))


def bind_native_top_k(env, node: Tensor) -> Callable[[], None]:
    return _bind(env, node, CallCode.TOP_K, kernels().top_k_f32_packed, bind_top_k)


def bind_native_sum_rows(env, node: Tensor) -> Callable[[], None]:
    return _bind(env, node, CallCode.SUM_ROWS, kernels().sum_rows_f32_packed, bind_sum_rows)


def bind_native_clamp(env, node: Tensor) -> Callable[[], None]:
    params = ClampParams.of(node)
    return _bind(env, node, CallCode.CLAMP, kernels().clamp_f32_packed, bind_clamp,
                 (params.min, params.max))
