"""MUL_MAT with a block-format (or F16) weight, read in place by the compiled kernels.

A few activation rows (a decode step) multiply straight from the weight's blocks: each block's
quantized values are widened in registers and used at once, its scale applied to its partial
sum, so a product reads the weight's own bytes, not a float32 copy of four to seven times
their size. Many rows (a prompt) decode the weight a tile of rows at a time into one scratch
buffer and multiply each tile through BLAS, which is faster per row than the kernels once rows
are many, and still holds no float32 copy of the weight. Either way the values are ggml's
decoded values, so results equal the numpy path's up to float32 rounding. Shapes the kernels
do not take (batched weights, strided activations) fall back to the shared array kernel.

With ``numerics="fast"`` (the default, polydev.numerics) the few-row products quantize the
activations to int16 and multiply integers (``native/int_dot.c``), where the build has those
kernels for the weight's type, and so do the many-row products of the K-quants
(``native/int_gemm.c``: each weight block unpacked once for all rows, instead of decoded to
float32 for BLAS); ``"exact"`` keeps the float32 products. A weight in a weights buffer (a
model's) that the build can interleave (``native/interleaved.c``: AVX2 and up; the block
types but F16; rows a multiple of 16) multiplies from a copy with 16 rows interleaved,
made on first use and kept in the device's weight cache, whatever the activation rows: eight
at a time (four with AVX2), it also outran the GEMM and BLAS (one core at 512 rows, with
AVX-512 VNNI Q4_K 178 against 106 GMAC/s, Q4_0 187 against 60-78; with AVX2 alone Q4_K 87
against 48, Q5_K 89 against 51, and at one row 49 against 29). Under ``numerics="int8"`` the
interleaved products quantize the activations to int8 instead (``native/interleaved_int8.c``,
where the build has AVX-512 VNNI): a 5632 x 2048 weight times 128 rows ran at 520-600 GMAC/s
against 360-380 with int16 (2 threads, Zen 4); products without an interleaved copy stay int16.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.backends.array.rows import as_rows
from polydev.buffer import BufferUsage
from polydev.errors import AllocationError
from polydev.tensor import Tensor
from polydev.types import GGMLType

from .blas import product_macs, sized_for_blas
from .buffer import CPUBuffer
from .native import kernels, loaded_kernels, pack

# up to this many activation rows the kernels multiply from the blocks; above, tiles + BLAS
BLOCK_PRODUCT_ROWS = 32
TILE_BYTES = 1 << 20     # float32 bytes of one decoded tile (4 MiB ran pp512 no faster)
INTERLEAVE_GROUP = 16    # rows interleaved together (native/interleaved.c's ROWS16)
INTERLEAVE_CHUNK_BYTES = 16 << 20   # a weight's bytes interleaved between two page drops


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
    a_t = node.src[0]
    k, m = a_t.ne[0], a_t.ne[1]
    x, y = as_rows(env.view(node.src[1]), k), as_rows(env.view(node), m)
    if x is None or y is None:                      # rows without one stride: the array kernel
        from polydev.backends.array.matmul import bind_mul_mat
        return sized_for_blas(bind_mul_mat(env, node), product_macs(node))
    name = f"MUL_MAT {node.name or '<unnamed>'}"
    interleaved = _bind_interleaved(env, a_t, x, y, name)
    if interleaved is not None:
        return interleaved
    return bind_product(env, int(a_t.type), env.rows(a_t).ctypes.data, a_t.nb[1], m, k, x, y,
                        name)


def interleaved_copy(env, w: Tensor) -> Callable[[], np.ndarray] | None:
    """The getter of ``w``'s copy with 16 rows interleaved (native/interleaved.c; its matrices
    one after the other), made on first use and kept in the weight cache; None where there is
    none: exact numerics, a weight outside a weights buffer (its bytes may change under a
    bound plan), a type and shape this build has no interleaved kernel for, or a copy larger
    than the cache's budget. Ask it on every
    call: a copy the cache evicted, or one of a rewritten buffer, is made again, and what the
    cache holds is what it counts."""
    lib = kernels()
    type_id, k, rows_in_all = int(w.type), w.ne[0], w.ne[1] * w.ne[2]
    if (env.numerics == "exact" or w.buffer is None or w.buffer.usage != BufferUsage.WEIGHTS
            or w.ne[3] != 1 or w.nb[2] != w.ne[1] * w.nb[1]):
        return None
    size = lib.interleaved_bytes(type_id, w.ne[1], k) * w.ne[2]
    cache = env.weight_cache
    if not size or size > cache.budget:       # a copy the cache cannot keep: made every call
        return None
    rows, n_threads = env.rows(w), env.n_threads
    # a model file's pages: the copy replaces them, dropped a chunk at a time as it is made,
    # so that the file's pages and the copy are never resident whole at once (gemma-3's
    # 170 MiB embedding would otherwise add its size to the peak)
    file_pages = w.buffer if isinstance(w.buffer, CPUBuffer) else None
    chunk = max(INTERLEAVE_GROUP, INTERLEAVE_CHUNK_BYTES // w.nb[1] // INTERLEAVE_GROUP
                * INTERLEAVE_GROUP)

    def interleave() -> np.ndarray:
        out = np.empty(size, dtype=np.uint8)
        for r0 in range(0, rows_in_all, chunk):
            n = min(chunk, rows_in_all - r0)
            lib.interleave(type_id, rows.ctypes.data + r0 * w.nb[1], w.nb[1], n, k,
                           out.ctypes.data + lib.interleaved_bytes(type_id, r0, k), n_threads)
            if file_pages is not None:
                file_pages.drop_pages(w.offset + r0 * w.nb[1], n * w.nb[1])
        if file_pages is not None:                # and the pages the chunks' edges shared
            file_pages.replaced_by_copy(w.offset, w.nbytes)
        return out
    return lambda: cache.get(w, interleave, "interleaved")


def activation_bits(env) -> int:
    """The integers the interleaved kernels quantize activations to: 8 under numerics="int8"
    where the build has those kernels (native/interleaved_int8.c), else 16."""
    return 8 if env.numerics == "int8" and kernels().has_int8_products else 16


def interleaved_product(env, type_id: int, m: int, k: int, x: np.ndarray, y: np.ndarray,
                        name: str) -> tuple[Callable[[int], None], np.ndarray]:
    """y = x W^T from an interleaved W of m x k values, bound but for W's address: a call
    taking that address, and the packed arguments it reads (kept alive by the caller)."""
    lib = kernels()
    n_rows, bits = x.shape[0], activation_bits(env)
    args = pack(type_id, 0, m, k, x.ctypes.data, x.strides[0] // 4, n_rows, y.ctypes.data,
                y.strides[0] // 4, env.n_threads, bits)
    mul_mat, where = lib.mul_mat_interleaved_packed, args.ctypes.data

    def multiply(w_ptr: int) -> None:
        args[1] = w_ptr
        if mul_mat(where) != 0:
            raise AllocationError(f"{name}: no memory for the int{bits} copy of {n_rows} x {k} "
                                  f"activations")
    return multiply, args


def _bind_interleaved(env, w: Tensor, x: np.ndarray, y: np.ndarray,
                      name: str) -> Callable[[], None] | None:
    copy = interleaved_copy(env, w)
    if copy is None:
        return None
    multiply, args = interleaved_product(env, int(w.type), w.ne[1], w.ne[0], x, y, name)

    def from_interleaved() -> None:
        multiply(copy().ctypes.data)
    from_interleaved.keep_alive = args
    return from_interleaved


def bind_product(env, type_id: int, w_ptr: int, w_stride: int, m: int, k: int, x: np.ndarray,
                 y: np.ndarray, name: str) -> Callable[[], None]:
    """y = x W^T, bound: W is m rows of k values of ggml type ``type_id`` at ``w_ptr``
    (``w_stride`` bytes apart), x and y float32 rows with unit element stride. The kernel is
    chosen by the rows and the numerics (see the module)."""
    lib = kernels()
    x_ptr, x_stride = x.ctypes.data, x.strides[0] // 4
    y_ptr, y_stride = y.ctypes.data, y.strides[0] // 4
    n_rows = x.shape[0]

    args = pack(type_id, w_ptr, w_stride, m, k, x_ptr, x_stride, n_rows, y_ptr, y_stride,
                env.n_threads)
    if env.numerics != "exact" and (lib.has_int16_gemm(type_id) or (
            n_rows <= BLOCK_PRODUCT_ROWS and lib.has_int16_product(type_id))):
        return _int16_product(lib, args, name)
    if n_rows <= BLOCK_PRODUCT_ROWS:
        mul_mat, where = lib.mul_mat_packed, args.ctypes.data

        def from_blocks() -> None:
            mul_mat(where)
        from_blocks.keep_alive = args
        return from_blocks

    tile_rows = max(1, min(m, TILE_BYTES // (4 * k)))

    def by_tiles() -> None:
        tile = env.scratch(tile_rows * k).reshape(tile_rows, k)
        for i0 in range(0, m, tile_rows):
            i1 = min(m, i0 + tile_rows)
            # one thread: decoding is a few percent of the product, and OpenMP threads
            # left spinning after a parallel region would take the cores BLAS runs on
            lib.dequantize_rows(type_id, w_ptr, w_stride, i0, i1, k, tile.ctypes.data, 1)
            np.matmul(x, tile[:i1 - i0].T, out=y[:, i0:i1])
    return sized_for_blas(by_tiles, n_rows * m * k)


def _int16_product(lib, args: np.ndarray, name: str) -> Callable[[], None]:
    """The bound integer product (``pd_mul_mat_int16``, packed as ``mul_mat``)."""
    mul_mat, where = lib.mul_mat_int16_packed, args.ctypes.data
    rows, k = int(args[7]), int(args[4])

    def from_integers() -> None:
        if mul_mat(where) != 0:         # 2: its scratch memory could not be had
            raise AllocationError(f"{name}: no memory for the int16 copy of {rows} x {k} "
                                  f"activations and the unpacked weights")
    from_integers.keep_alive = args
    return from_integers
