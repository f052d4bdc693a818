"""GET_ROWS in the compiled kernels: of block-format rows (a token embedding), and of float32
rows (a mixture of experts' router weights of the chosen experts).

The array kernel gathers the rows' blocks and decodes them through numpy: for a decode step's
one token about 0.18 ms at the 1B class. The compiled kernel checks every index, then decodes
each row into the result with the same decoders as the products; it is a replayable call, so a
decode step's plan is one run from its token embedding on (as a Python call it took about
80 µs of a step, its caches cold). A float32 row gather, ggml's batched form (each token's
indices into its own rows), is a replayable call too (native/row_ops.c), so a router keeps its
layer's replay run whole.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.backends.array.movement import check_indices
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .buffer import CPUBuffer
from .native import kernels, loaded_kernels
from .native.arguments import GetF32RowsArguments, GetRowsArguments, TensorWords
from .replay import CallCode, replayable


def native_get_rows_ok(node: Tensor) -> bool:
    """Block-format rows or float32 rows the compiled kernels take."""
    return _block_rows_ok(node) or _f32_rows_ok(node)


def bind_native_get_rows(env, node: Tensor) -> Callable[[], None]:
    return (_bind_block_rows if _block_rows_ok(node) else _bind_f32_rows)(env, node)


def _f32_rows_ok(node: Tensor) -> bool:
    """float32 rows by int32 indices, ggml's batched GET_ROWS: index row (i1, i2) picks rows
    of a's matrix (i1, i2); values contiguous along rows."""
    a, idx = node.src[0], node.src[1]
    return (loaded_kernels() is not None and node.type == a.type == GGMLType.F32
            and idx.type == GGMLType.I32 and a.ne[2:] == idx.ne[1:3] and idx.ne[3] == 1
            and node.ne == (a.ne[0], *idx.ne[:3]) and a.nb[0] == node.nb[0] == 4)


def _bind_f32_rows(env, node: Tensor) -> Callable[[], None]:
    a, idx = node.src[0], node.src[1]
    args = GetF32RowsArguments(a=TensorWords.of(env.view(a).ctypes.data, a),
                               idx=TensorWords.of(env.view(idx).ctypes.data, idx),
                               d=TensorWords.of(env.view(node).ctypes.data, node))
    get_rows, where, indices = kernels().get_f32_rows_packed, args.address, env.view(idx)

    def run() -> None:
        if get_rows(where) != 0:
            check_indices(np, indices, a.ne[1], "get_rows")     # raises, with the range
            raise AssertionError("get_rows: the kernel refused indices that are in range")
    run.keep_alive = args
    return replayable(run, CallCode.GET_F32_ROWS, args)


def _block_rows_ok(node: Tensor) -> bool:
    """One matrix of whole blocks the kernels decode, int32 indices, float32 rows out."""
    lib = loaded_kernels()
    a, idx = node.src[0], node.src[1]
    if lib is None or node.type != GGMLType.F32 or idx.type != GGMLType.I32:
        return False
    block = lib.block_size(int(a.type))
    return (block > 1 and a.ne[0] % block == 0 and a.ne[2] == 1 and a.ne[3] == 1
            and a.is_contiguous_rows() and idx.is_contiguous() and node.nb[0] == 4
            and node.ne[2] == 1 and node.ne[3] == 1)


def _bind_block_rows(env, node: Tensor) -> Callable[[], None]:
    lib, a = kernels(), node.src[0]
    idx = env.view(node.src[1]).reshape(-1)
    d = env.view(node)[0, 0]                        # (n, ne0)
    args = GetRowsArguments(type=int(a.type), w=env.rows(a).ctypes.data, w_stride=a.nb[1],
                            n_src_rows=a.ne[1], idx=idx.ctypes.data, n_idx=idx.size,
                            K=a.ne[0], dst=d.ctypes.data, dst_stride=d.strides[0] // 4)
    get_rows, where, n_rows = lib.get_rows_f32_packed, args.address, a.ne[1]
    file_pages = a.buffer if isinstance(a.buffer, CPUBuffer) else None

    def run() -> None:
        if get_rows(where) != 0:
            check_indices(np, idx, n_rows, "get_rows")     # raises, with the range
            raise AssertionError("get_rows: the kernel refused indices that are in range")
        if count_rows is not None:
            count_rows()

    # the rows read, for a tied embedding's file pages (CPUBuffer.rows_read): in a replay,
    # the call's bookkeeping after the run
    count_rows = None if file_pages is None else (
        lambda: file_pages.rows_read(a.offset, a.nbytes, idx.size))
    run.keep_alive = args
    return replayable(run, CallCode.GET_ROWS, args, after=count_rows)
