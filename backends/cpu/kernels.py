"""The CPU backend's kernel table: its own kernels first, then the shared array kernels."""

from __future__ import annotations

from polydev.kernels import Kernel, KernelTable
from polydev.ops import GluOp, Op

from polydev.backends.array import KERNELS, TABLE

from .attention import bind_native_flash_attn, native_flash_attn_ok
from .binary import bind_native_binary, bind_native_scale, native_binary_ok, native_scale_ok
from .blas import product_macs, sized_for_blas
from .get_rows import bind_native_get_rows, native_get_rows_ok
from .glu import bind_native_glu, native_glu_ok
from .matmul import bind_native_mul_mat, native_mul_mat_ok
from .mul_mat_id import bind_native_mul_mat_id, native_mul_mat_id_ok
from .norm import bind_native_rms_norm, native_rms_norm_ok
from .rope import bind_native_rope, native_rope_ok
from .row_ops import (bind_native_clamp, bind_native_soft_max, bind_native_sum_rows,
                      bind_native_top_k, native_clamp_ok, native_soft_max_ok,
                      native_sum_rows_ok, native_top_k_ok)
from .set_rows import bind_native_set_rows, native_set_rows_ok


def _blas_sized(kernel: Kernel) -> Kernel:
    """An array kernel's product through numpy's BLAS, a small one on one thread (blas.py)."""
    bind = kernel.bind
    return Kernel(kernel.accepts,
                  lambda env, node: sized_for_blas(bind(env, node), product_macs(node)))


# the products the compiled kernels leave to numpy, then the other array kernels
_NUMPY_PRODUCTS = KernelTable({op: _blas_sized(KERNELS[op])
                               for op in (Op.MUL_MAT, Op.MUL_MAT_ID, Op.OUT_PROD)},
                              target=lambda backend: backend.env, fallback=TABLE)

CPU_TABLE = KernelTable({
    Op.MUL_MAT: Kernel(native_mul_mat_ok, bind_native_mul_mat),
    Op.MUL_MAT_ID: Kernel(native_mul_mat_id_ok, bind_native_mul_mat_id),
    Op.FLASH_ATTN_EXT: Kernel(native_flash_attn_ok, bind_native_flash_attn),
    (Op.GLU, GluOp.SWIGLU): Kernel(native_glu_ok, bind_native_glu),
    (Op.GLU, GluOp.GEGLU): Kernel(native_glu_ok, bind_native_glu),
    Op.GET_ROWS: Kernel(native_get_rows_ok, bind_native_get_rows),
    Op.ROPE: Kernel(native_rope_ok, bind_native_rope),
    Op.RMS_NORM: Kernel(native_rms_norm_ok, bind_native_rms_norm),
    Op.SET_ROWS: Kernel(native_set_rows_ok, bind_native_set_rows),
    Op.ADD: Kernel(native_binary_ok, bind_native_binary),
    Op.SUB: Kernel(native_binary_ok, bind_native_binary),
    Op.MUL: Kernel(native_binary_ok, bind_native_binary),
    Op.DIV: Kernel(native_binary_ok, bind_native_binary),
    Op.SCALE: Kernel(native_scale_ok, bind_native_scale),
    Op.SOFT_MAX: Kernel(native_soft_max_ok, bind_native_soft_max),
    Op.TOP_K: Kernel(native_top_k_ok, bind_native_top_k),
    Op.SUM_ROWS: Kernel(native_sum_rows_ok, bind_native_sum_rows),
    Op.CLAMP: Kernel(native_clamp_ok, bind_native_clamp),
}, target=lambda backend: backend.env, fallback=_NUMPY_PRODUCTS)
