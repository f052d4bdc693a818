"""MUL_MAT: ``dst = b @ a.T`` per matrix, with a broadcast over b's dims 2 and 3; and OUT_PROD,
``dst = b.T @ a`` per matrix with the same broadcast.

ggml maps b's matrix i12 to a's matrix i12 // (b.ne2 // a.ne2) (and the same for dim 3), so
each of a's matrices serves a run of consecutive b matrices: b's dims are split into
(a's count, ratio) and a gets a size-1 axis for the ratio. Weights of any type go through the
backend's ``weight_f32`` (cached dequantization where the backend has one); the product runs
in float32 through BLAS.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

from polydev.tensor import Tensor


def batch_views(a_shape, b, d):
    """Reshape b (b3, b2, N, K) and d (b3, b2, N, M) to (a3, r3, a2, r2, ...) when a's batch
    dims are neither 1 nor b's; returns (b, d, expand_a) where expand_a adapts a."""
    a3, a2 = a_shape[0], a_shape[1]
    b3, b2 = b.shape[0], b.shape[1]
    if (a2 in (1, b2)) and (a3 in (1, b3)):
        return b, d, lambda a: a
    r3, r2 = b3 // a3, b2 // a2
    b = b.reshape(a3, r3, a2, r2, *b.shape[2:])
    d = d.reshape(a3, r3, a2, r2, *d.shape[2:])
    return b, d, lambda a: a.reshape(a3, 1, a2, 1, *a.shape[2:])


class ProductOperands(NamedTuple):
    """A product's operands as its kernels take them: the weight's values (a call into the
    backend's conversion cache), views of b and the result, and both split into a's batches
    (``batch_views``)."""

    weight: Callable[[], Any]
    b: Any
    d: Any
    b_batched: Any
    d_batched: Any
    expand_a: Callable[[Any], Any]


def product_operands(env, node: Tensor, weight_of: Callable[[Tensor], Callable[[], Any]]
                     ) -> ProductOperands:
    """MUL_MAT's or OUT_PROD's operands, the weight (src 0) read through ``weight_of`` (the
    backend's ``weight_f32``, or a half-precision one)."""
    a_t = node.src[0]
    b, d = env.view(node.src[1]), env.view(node)
    return ProductOperands(weight_of(a_t), b, d, *batch_views(a_t.shape, b, d))


def bind_mul_mat(env, node: Tensor) -> Callable[[], None]:
    xp, a_t = env.xp, node.src[0]
    weight, b, d, b_batched, d_batched, expand_a = product_operands(env, node, env.weight_f32)
    needs_f32 = b.dtype != xp.float32
    # BLAS wants unit stride along K; a permuted b is made contiguous per call
    packed = b.strides[-1] == b.itemsize

    if b.shape[0] == 1 and b.shape[1] == 1 and a_t.ne[2] == 1 and a_t.ne[3] == 1:
        b2d, d2d = b[0, 0], d[0, 0]      # the common case: one matrix product

        def run_2d() -> None:
            rhs = b2d if packed and not needs_f32 else xp.ascontiguousarray(b2d, dtype=xp.float32)
            xp.matmul(rhs, weight()[0, 0].T, out=d2d)
        return run_2d

    def run() -> None:
        rhs = (b_batched if packed and not needs_f32 else
            xp.ascontiguousarray(b_batched, dtype=xp.float32))
        xp.matmul(rhs, xp.swapaxes(expand_a(weight()), -1, -2), out=d_batched)
    return run


def bind_out_prod(env, node: Tensor) -> Callable[[], None]:
    """OUT_PROD: dst (b3, b2, N, M) = b(b3, b2, K, N).T @ a(a3, a2, K, M)."""
    xp = env.xp
    a, _, _, b_batched, d_batched, expand_a = product_operands(env, node, env.weight_f32)

    def run() -> None:
        rhs = b_batched if b_batched.dtype == xp.float32 else b_batched.astype(xp.float32)
        xp.matmul(xp.swapaxes(rhs, -1, -2), expand_a(a()), out=d_batched)
    return run
