"""The CUDA backend's kernel table: its own kernels where they apply, else the array kernels
shared with the CPU backend run through CuPy (docs/design.md, decision 4).

The own kernels (cu/*.cu) bind to a ``Launcher``: the backend itself, or the CPU emulation in
the tests. The array kernels bind to the backend's CuPy namespace (``backend.env``).
"""

from __future__ import annotations

from typing import Hashable

from polydev.kernels import Kernel, KernelTable
from polydev.ops import GluOp, Op
from polydev.tensor import Tensor

from polydev.backends.array import TABLE as ARRAY_TABLE

from . import binders, gemm

# the kernels of cu/*.cu, tried first for their op
OWN_KERNELS: dict[Hashable, Kernel] = {
    Op.MUL_MAT: Kernel(binders.mul_mat_vec_ok, binders.bind_mul_mat_vec),
    Op.MUL_MAT_ID: Kernel(binders.mul_mat_id_vec_ok, binders.bind_mul_mat_id_vec),
    Op.GET_ROWS: Kernel(binders.get_rows_ok, binders.bind_get_rows),
    Op.NORM: Kernel(binders.norm_ok, binders.bind_norm),
    Op.RMS_NORM: Kernel(binders.norm_ok, binders.bind_norm),
    Op.L2_NORM: Kernel(binders.norm_ok, binders.bind_norm),
    Op.SOFT_MAX: Kernel(binders.soft_max_ok, binders.bind_soft_max),
    Op.ROPE: Kernel(binders.rope_ok, binders.bind_rope),
    Op.SET_ROWS: Kernel(binders.set_rows_ok, binders.bind_set_rows),
    Op.FLASH_ATTN_EXT: Kernel(binders.flash_attn_vec_ok, binders.bind_flash_attn_vec),
    **{op: Kernel(binders.binary_ok, binders.bind_binary) for op in binders.BINARY_KINDS},
    **{(Op.GLU, fn): Kernel(binders.glu_ok, binders.bind_glu) for fn in GluOp},
}

# array kernels that replace the shared ones where they apply
CUPY_KERNELS: dict[Hashable, Kernel] = {
    Op.MUL_MAT: Kernel(gemm.half_gemm_ok, gemm.bind_half_gemm),
}

OWN_TABLE = KernelTable(OWN_KERNELS)
TABLE = KernelTable(OWN_KERNELS, fallback=KernelTable(
    CUPY_KERNELS, target=lambda backend: backend.env, fallback=ARRAY_TABLE))


def find_own_kernel(node: Tensor) -> Kernel | None:
    """The kernel of cu/*.cu for ``node``, if one applies (bound to a Launcher)."""
    return OWN_TABLE.find(node)
