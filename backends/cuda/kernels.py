"""The CUDA backend's kernel table: its own kernels where they apply, else the array kernels
shared with the CPU backend run through CuPy (DESIGN decision 4).

An entry binds a node to the backend once and returns the call that queues it on the
backend's stream. ``supports_op`` is derived from the table, so it never claims more than
the kernels run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

from polydev.ops import Op
from polydev.tensor import Tensor

from polydev.backends.array import kernels as array_kernels

from . import binders, gemm


@dataclass(frozen=True)
class CUDAKernel:
    """``bind(target, node)``: ``target`` is a Launcher for the kernels of cu/*.cu (the
    backend, or the CPU emulation in the tests), the backend for the others."""

    accepts: Callable[[Tensor], bool]
    bind: Callable[..., Callable[[], None]]


def _array(accepts, bind) -> CUDAKernel:
    """An array kernel (CuPy), bound through the backend's CupyEnv."""
    return CUDAKernel(accepts, lambda backend, node: bind(backend.env, node))


# the kernels of cu/*.cu, tried first for their op
OWN_KERNELS: dict[Hashable, CUDAKernel] = {
    Op.MUL_MAT: CUDAKernel(binders.mul_mat_vec_ok, binders.bind_mul_mat_vec),
    Op.MUL_MAT_ID: CUDAKernel(binders.mul_mat_id_vec_ok, binders.bind_mul_mat_id_vec),
    Op.GET_ROWS: CUDAKernel(binders.get_rows_ok, binders.bind_get_rows),
    Op.NORM: CUDAKernel(binders.norm_ok, binders.bind_norm),
    Op.RMS_NORM: CUDAKernel(binders.norm_ok, binders.bind_norm),
    Op.L2_NORM: CUDAKernel(binders.norm_ok, binders.bind_norm),
    Op.SOFT_MAX: CUDAKernel(binders.soft_max_ok, binders.bind_soft_max),
    Op.ROPE: CUDAKernel(binders.rope_ok, binders.bind_rope),
}

# array kernels that replace the shared ones where they apply
CUPY_KERNELS: dict[Hashable, CUDAKernel] = {
    Op.MUL_MAT: _array(gemm.half_gemm_ok, gemm.bind_half_gemm),
}


def _applicable(table: dict[Hashable, CUDAKernel], node: Tensor) -> CUDAKernel | None:
    k = table.get(array_kernels.kernel_key(node))
    return k if k is not None and k.accepts(node) else None


def find_own_kernel(node: Tensor) -> CUDAKernel | None:
    """The kernel of cu/*.cu for ``node``, if one applies."""
    return _applicable(OWN_KERNELS, node)


def find_kernel(node: Tensor) -> CUDAKernel | None:
    """The kernel that computes ``node`` on a GPU, or None if there is none."""
    k = _applicable(OWN_KERNELS, node) or _applicable(CUPY_KERNELS, node)
    if k is not None:
        return k
    shared = array_kernels.find_kernel(node)
    return _array(shared.accepts, shared.bind) if shared is not None else None


def supported_op_names() -> list[str]:
    return array_kernels.supported_op_names()
