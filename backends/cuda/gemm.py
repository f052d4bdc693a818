"""MUL_MAT in half precision through cuBLAS: what runs when the mat-vec kernel does not.

Weights of F16, BF16 or a block format are used as float16 (F16 viewed, the others decoded per
call by the backend's kernels into pool memory), the activations are rounded to float16, and
cuBLAS multiplies on the tensor cores with float32 accumulation into a float16 product that is
widened into the float32 result. That is ggml-cuda's cuBLAS path; its float16 product
overflows past 65504, as ggml's does. It is the "fast" numerics; under "exact" the shared
array kernel multiplies the decoded weights in float32.
"""

from __future__ import annotations

from typing import Callable

from polydev.tensor import Tensor
from polydev.types import GGMLType

from polydev.backends.array.matmul import bind_mul_mat, product_operands

from .binders import ROW_TYPE_NAMES


def half_gemm_ok(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    return (a.type in ROW_TYPE_NAMES and a.type != GGMLType.F32 and a.is_contiguous_rows()
        and b.type in (GGMLType.F32, GGMLType.F16) and node.type == GGMLType.F32)


def bind_half_gemm(env, node: Tensor) -> Callable[[], None]:
    if env.backend.numerics == "exact":
        return bind_mul_mat(env, node)
    xp = env.xp
    weight, _, _, b_batched, d_batched, expand_a = product_operands(env, node, env.weight_f16)

    def run() -> None:
        rhs = b_batched if b_batched.dtype == xp.float16 else b_batched.astype(xp.float16)
        product = xp.matmul(rhs, xp.swapaxes(expand_a(weight()), -1, -2))
        xp.copyto(d_batched, product, casting="unsafe")
    return run
