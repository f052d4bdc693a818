"""MUL_MAT with a block-format (or F16) weight, in the compiled kernels.

numpy has no product of a quantized weight, so without these kernels a weight is decoded to
float32 and multiplied by BLAS: four to seven times the bytes of its blocks, in memory and
read on every product. Here the product takes the path ``product_path`` names for it (see
product_path.py for the paths and why each wins where it does), and each path has its binder
below: from the weight's interleaved copy, from its own blocks (integer or float32
activations), or a tile of decoded rows at a time through BLAS. Shapes the kernels do not take
go to the shared array kernel: batched weights through the kernel table (the type rule below
refuses them), activation rows without one stride through the ARRAY path.

The experts of MUL_MAT_ID multiply through the same binders (mul_mat_id.py).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.backends.array.rows import as_rows
from polydev.errors import AllocationError
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .blas import product_macs, sized_for_blas
from .interleaved import CopyAddress, interleaved_copy
from .native import kernels, loaded_kernels
from .native.arguments import MulMatArguments, MulMatInterleavedArguments
from .product_path import ProductPath, product_path
from .replay import CallCode, replayable

TILE_BYTES = 1 << 20     # float32 bytes of one decoded tile (larger tiles ran prompts no faster)


def native_mul_mat_ok(node: Tensor) -> bool:
    """The kernels read the weight's type, the weight is one matrix of whole blocks, and the
    activations and result are float32 with unit element stride."""
    lib = loaded_kernels()
    a, b = node.src[0], node.src[1]
    if lib is None or b.type != GGMLType.F32 or node.type != GGMLType.F32:
        return False
    block = lib.block_size(int(a.type))
    return (block > 0 and a.ne[0] % block == 0 and a.ne[2] == 1 and a.ne[3] == 1
            and a.is_contiguous_rows() and b.nb[0] == 4 and node.nb[0] == 4)


def bind_native_mul_mat(env, node: Tensor) -> Callable[[], None]:
    w, b = node.src[0], node.src[1]
    k, m = w.ne[0], w.ne[1]
    x, y = as_rows(env.view(b), k), as_rows(env.view(node), m)
    one_stride = x is not None and y is not None
    copy = interleaved_copy(env, w) if one_stride else None
    path = product_path(env.numerics, kernels(), int(w.type), b.nrows,
                        interleaved=copy is not None, one_stride=one_stride)
    if path is ProductPath.ARRAY:
        from polydev.backends.array.matmul import bind_mul_mat
        return sized_for_blas(bind_mul_mat(env, node), product_macs(node))
    name = f"MUL_MAT {node.name or '<unnamed>'}"
    if path.interleaved:
        return _bind_interleaved(env, path, w, copy, m, k, x, y, name)
    return bind_product(env, path, int(w.type), env.rows(w).ctypes.data, w.nb[1], m, k, x, y,
                        name)


def _bind_interleaved(env, path: ProductPath, weight: Tensor, copy: Callable[[], np.ndarray],
                      m: int, k: int, x: np.ndarray, y: np.ndarray,
                      name: str) -> Callable[[], None]:
    """y = x W^T from the interleaved copy of ``weight`` (``copy`` gets it; m x k values),
    the activations quantized to the integers ``path`` names; x and y float32 rows with unit
    element stride."""
    n_rows, bits = x.shape[0], path.activation_bits
    args = MulMatInterleavedArguments(
        type=int(weight.type), p=0, M=m, K=k, x=x.ctypes.data, x_stride=x.strides[0] // 4,
        n_rows=n_rows, y=y.ctypes.data, y_stride=y.strides[0] // 4, n_threads=env.n_threads,
        bits=bits)
    mul_mat, where = kernels().mul_mat_interleaved_packed, args.address

    def from_interleaved() -> None:
        args.p = copy().ctypes.data       # asked every call: the cache may have made it again
        if mul_mat(where) != 0:
            raise AllocationError(f"{name}: no memory for the int{bits} copy of {n_rows} x {k} "
                                  f"activations")
    return replayable(from_interleaved, CallCode.MUL_MAT_INTERLEAVED, args,
                      prepare=CopyAddress(weight, env.weight_cache, copy, args))


def bind_product(env, path: ProductPath, type_id: int, w_ptr: int, w_stride: int, m: int,
                 k: int, x: np.ndarray, y: np.ndarray, name: str) -> Callable[[], None]:
    """y = x W^T by ``path`` (INT16, BLOCKS or TILES_BLAS), bound: W is m rows of k values of
    ggml type ``type_id`` at ``w_ptr`` (``w_stride`` bytes apart), x and y float32 rows with
    unit element stride."""
    if path is ProductPath.TILES_BLAS:
        return _bind_tiles(env, type_id, w_ptr, w_stride, m, k, x, y)
    args = MulMatArguments(type=type_id, w=w_ptr, w_stride=w_stride, M=m, K=k, x=x.ctypes.data,
                           x_stride=x.strides[0] // 4, n_rows=x.shape[0], y=y.ctypes.data,
                           y_stride=y.strides[0] // 4, n_threads=env.n_threads)
    if path is ProductPath.INT16:
        return _bind_int16(args, name)
    if path is ProductPath.BLOCKS:
        return _bind_blocks(args)
    raise ValueError(f"{name}: {path} is not a product of the weight's own layout")


def _bind_blocks(args: MulMatArguments) -> Callable[[], None]:
    """The bound float32 product from the blocks (``pd_mul_mat``)."""
    mul_mat, where = kernels().mul_mat_packed, args.address

    def from_blocks() -> None:
        mul_mat(where)
    from_blocks.keep_alive = args         # the kernel reads the record's memory
    return replayable(from_blocks, CallCode.MUL_MAT, args)


def _bind_int16(args: MulMatArguments, name: str) -> Callable[[], None]:
    """The bound integer product (``pd_mul_mat_int16``)."""
    mul_mat, where = kernels().mul_mat_int16_packed, args.address
    rows, k = args.n_rows, args.K

    def from_integers() -> None:
        if mul_mat(where) != 0:         # 2: its scratch memory could not be had
            raise AllocationError(f"{name}: no memory for the int16 copy of {rows} x {k} "
                                  f"activations and the unpacked weights")
    from_integers.keep_alive = args
    return replayable(from_integers, CallCode.MUL_MAT_INT16, args)


def _bind_tiles(env, type_id: int, w_ptr: int, w_stride: int, m: int, k: int, x: np.ndarray,
                y: np.ndarray) -> Callable[[], None]:
    """The bound float32 product a tile of decoded weight rows at a time, through BLAS."""
    dequantize_rows = kernels().dequantize_rows
    tile_rows = max(1, min(m, TILE_BYTES // (4 * k)))

    def by_tiles() -> None:
        tile = env.scratch(tile_rows * k).reshape(tile_rows, k)
        for i0 in range(0, m, tile_rows):
            i1 = min(m, i0 + tile_rows)
            # one thread: decoding is a few percent of the product, and OpenMP threads
            # left spinning after a parallel region would take the cores BLAS runs on
            dequantize_rows(type_id, w_ptr, w_stride, i0, i1, k, tile.ctypes.data, 1)
            np.matmul(x, tile[:i1 - i0].T, out=y[:, i0:i1])
    return sized_for_blas(by_tiles, x.shape[0] * m * k)
