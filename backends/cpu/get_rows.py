"""GET_ROWS of block-format rows (a token embedding) in the compiled kernels.

The array kernel gathers the rows' blocks and decodes them through numpy: for a decode step's
one token about 0.18 ms at the 1B class. The compiled kernel checks every index, then decodes
each row into the result with the same decoders as the products.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.backends.array.movement import check_indices
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .buffer import CPUBuffer
from .native import kernels, loaded_kernels


def native_get_rows_ok(node: Tensor) -> bool:
    """One matrix of whole blocks the kernels decode, int32 indices, float32 rows out."""
    lib = loaded_kernels()
    a, idx = node.src[0], node.src[1]
    if lib is None or node.type != GGMLType.F32 or idx.type != GGMLType.I32:
        return False
    block = lib.block_size(int(a.type))
    return (block > 1 and a.ne[0] % block == 0 and a.ne[2] == 1 and a.ne[3] == 1
            and a.is_contiguous_rows() and idx.is_contiguous() and node.nb[0] == 4
            and node.ne[2] == 1 and node.ne[3] == 1)


def bind_native_get_rows(env, node: Tensor) -> Callable[[], None]:
    lib, a = kernels(), node.src[0]
    idx = env.view(node.src[1]).reshape(-1)
    d = env.view(node)[0, 0]                        # (n, ne0)
    w, n_rows, k = env.rows(a).ctypes.data, a.ne[1], a.ne[0]
    get_rows = lib.get_rows_f32
    type_id, w_stride, d_stride = int(a.type), a.nb[1], d.strides[0] // 4
    file_pages = a.buffer if isinstance(a.buffer, CPUBuffer) else None

    def run() -> None:
        if get_rows(type_id, w, w_stride, n_rows, idx.ctypes.data, idx.size, k, d.ctypes.data,
                    d_stride) >= 0:
            check_indices(np, idx, n_rows, "get_rows")     # raises, with the range
        if file_pages is not None:      # a tied embedding: its copy, not its file, stays
            file_pages.rows_read(a.offset, a.nbytes, idx.size)
    return run
