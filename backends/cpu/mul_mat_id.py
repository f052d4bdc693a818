"""MUL_MAT_ID (mixture of experts) with block-format weights, read in place by the kernels.

The array kernel decodes every expert's matrix to float32 (the weight cache: four to seven
times the bytes of the blocks, for experts most tokens never use) and multiplies through
BLAS. Here, where the weight cache keeps the experts' interleaved copy (interleaved.py) and
the numerics are integer ones, the whole op is one call of the kernels, which sort the
(token, slot) pairs by expert themselves. Otherwise the pairs are grouped by expert as in the
array kernel, and each expert in use multiplies the rows routed to it straight from its own
blocks, by the path MUL_MAT would take for that many rows (product_path.py, matmul.py).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.backends.array.movement import check_indices
from polydev.backends.array.mul_mat_id import expert_groups
from polydev.errors import AllocationError
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .interleaved import CopyAddress, interleaved_copy
from .matmul import bind_product
from .native import kernels, loaded_kernels
from .native.arguments import MulMatIdInterleavedArguments
from .product_path import ProductPath, product_path
from .replay import CallCode, replayable


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
    lib, type_id = kernels(), int(as_t.type)
    # the kernels read the ids with unit stride within a token
    copy = interleaved_copy(env, as_t) if ids.strides[1] == 4 else None
    path = product_path(env.numerics, lib, type_id, ids.size, interleaved=copy is not None)
    if path.interleaved:
        return _bind_interleaved(env, path, copy, as_t, b, ids, d, name)

    def run() -> None:
        experts = ids.reshape(-1)
        check_indices(np, experts, n_expert, "mul_mat_id")
        for expert, pairs in expert_groups(np, experts):
            x = np.ascontiguousarray(rows[b_row[pairs]])
            y = np.empty((len(pairs), m), dtype=np.float32)
            expert_path = product_path(env.numerics, lib, type_id, len(pairs))
            bind_product(env, expert_path, type_id, experts_base + expert * as_t.nb[2],
                         as_t.nb[1], m, k, x, y, name)()
            d[pairs] = y
    return run


def _bind_interleaved(env, path: ProductPath, copy: Callable[[], np.ndarray], as_t: Tensor,
                      b: np.ndarray, ids: np.ndarray, d: np.ndarray,
                      name: str) -> Callable[[], None]:
    """The whole MUL_MAT_ID in one call of the kernels, from the experts' interleaved copy
    (``copy`` gets it), the activations quantized to the integers ``path`` names: the pairs
    sorted by expert, each expert's rows multiplied at once, the rows put back."""
    n_expert, m, k = as_t.ne[2], as_t.ne[1], as_t.ne[0]
    n_tokens, n_b, _ = b.shape
    args = MulMatIdInterleavedArguments(
        type=int(as_t.type), p=0, n_expert=n_expert, M=m, K=k, b=b.ctypes.data, n_b=n_b,
        ids=ids.ctypes.data, ids_stride=ids.strides[0] // 4, n_tokens=n_tokens,
        n_used=ids.shape[1], d=d.ctypes.data, n_threads=env.n_threads,
        bits=path.activation_bits)
    mul_mat_id, where = kernels().mul_mat_id_interleaved_packed, args.address

    def run() -> None:
        args.p = copy().ctypes.data       # asked every call: the cache may have made it again
        status = mul_mat_id(where)
        if status == 3:                 # an expert id out of range: nothing written
            check_indices(np, ids.reshape(-1), n_expert, "mul_mat_id")
        if status != 0:
            raise AllocationError(f"{name}: no memory to sort {ids.size} rows by expert")
    return replayable(run, CallCode.MUL_MAT_ID_INTERLEAVED, args,
                      prepare=CopyAddress(as_t, env.weight_cache, copy, args))
