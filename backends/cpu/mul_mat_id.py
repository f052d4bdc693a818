"""MUL_MAT_ID (mixture of experts) with block-format weights, read in place by the kernels.

The array kernel decodes every expert's matrix to float32 (the weight cache: four to seven
times the bytes of the blocks, for experts most tokens never use) and multiplies through
BLAS. Here the (token, slot) pairs are grouped by expert as there, and each expert in use
multiplies the rows routed to it straight from its own blocks, by the kernel MUL_MAT would
choose for that many rows (matmul.bind_product): integer products under numerics="fast"
(int16) and "int8", from the experts' interleaved copy where the build has one
(matmul.interleaved_copy).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.backends.array.movement import check_indices
from polydev.backends.array.mul_mat_id import expert_groups
from polydev.errors import AllocationError
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .matmul import activation_bits, bind_product, interleaved_copy
from .native import kernels, loaded_kernels, pack


def native_mul_mat_id_ok(node: Tensor) -> bool:
    """The kernels read the experts' type, each expert is one matrix of whole blocks, and the
    activations, ids and result are as the array kernel takes them (float32, int32)."""
    lib = loaded_kernels()
    a, b, ids = node.src[0], node.src[1], node.src[2]
    if lib is None or b.type != GGMLType.F32 or node.type != GGMLType.F32:
        return False
    block = lib.block_size(int(a.type))
    return (block > 0 and a.ne[0] % block == 0 and a.ne[3] == 1 and a.is_contiguous_rows()
            and ids.type == GGMLType.I32 and b.is_contiguous() and node.is_contiguous())


def bind_native_mul_mat_id(env, node: Tensor) -> Callable[[], None]:
    as_t, b_t, ids_t = node.src[0], node.src[1], node.src[2]
    n_expert, m, k = as_t.ne[2], as_t.ne[1], as_t.ne[0]
    experts_base = env.rows(as_t).ctypes.data
    b = env.view(b_t)[0]                                # (n_tokens, n_b, K)
    ids = env.view(ids_t)[0, 0]                         # (n_tokens, n_used)
    d = env.view(node)[0].reshape(-1, m)                # (n_tokens * n_used, M)
    n_tokens, n_b, _ = b.shape
    n_used = ids.shape[1]
    # the b row of pair (t, e) is row t * n_b + e % n_b of b's rows
    b_row = (np.arange(n_tokens)[:, None] * n_b + np.arange(n_used)[None, :] % n_b).reshape(-1)
    rows = b.reshape(-1, k)
    name = f"MUL_MAT_ID {node.name or '<unnamed>'}"
    copy = interleaved_copy(env, as_t)
    if copy is not None and ids.strides[1] == 4:
        return _bind_interleaved(env, copy, as_t, b, ids, d, name)

    def run() -> None:
        experts = ids.reshape(-1)
        check_indices(np, experts, n_expert, "mul_mat_id")
        for expert, pairs in expert_groups(np, experts):
            x = np.ascontiguousarray(rows[b_row[pairs]])
            y = np.empty((len(pairs), m), dtype=np.float32)
            bind_product(env, int(as_t.type), experts_base + expert * as_t.nb[2], as_t.nb[1],
                         m, k, x, y, name)()
            d[pairs] = y
    return run


def _bind_interleaved(env, copy, as_t: Tensor, b: np.ndarray, ids: np.ndarray, d: np.ndarray,
                      name: str) -> Callable[[], None]:
    """The whole MUL_MAT_ID in one call of the kernels, from the experts' interleaved copy:
    the pairs sorted by expert, each expert's rows multiplied at once, the rows put back."""
    lib = kernels()
    n_expert, m, k = as_t.ne[2], as_t.ne[1], as_t.ne[0]
    n_tokens, n_b, _ = b.shape
    args = pack(int(as_t.type), 0, n_expert, m, k, b.ctypes.data, n_b, ids.ctypes.data,
                ids.strides[0] // 4, n_tokens, ids.shape[1], d.ctypes.data, env.n_threads,
                activation_bits(env))
    mul_mat_id, where = lib.mul_mat_id_interleaved_packed, args.ctypes.data

    def run() -> None:
        args[1] = copy().ctypes.data
        status = mul_mat_id(where)
        if status == 3:                 # an expert id out of range: nothing written
            check_indices(np, ids.reshape(-1), n_expert, "mul_mat_id")
        if status != 0:
            raise AllocationError(f"{name}: no memory to sort {ids.size} rows by expert")
    run.keep_alive = args
    return run
