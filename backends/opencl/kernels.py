"""The OpenCL kernel table: which ops and types the device computes.

``KERNELS`` maps an op (or (Op.UNARY, fn) / (Op.GLU, fn)) to its type rules and its binder
(``binders.py``); ``supports_op`` is derived from it, so the device never claims an op it
cannot run.
"""

from __future__ import annotations

from typing import Hashable

from polydev.kernels import Kernel, KernelTable
from polydev.ops import GluOp, Op, RopeMode, RopeParams, RopeSources, SoftMaxSources
from polydev.tensor import Tensor

from .binders import (bind_arange, bind_argmax, bind_argsort, bind_binary, bind_concat,
                      bind_copy, bind_cumsum, bind_diag_mask_inf, bind_flash_attn_ext,
                      bind_get_rows, bind_glu, bind_group_norm, bind_mul_mat, bind_mul_mat_id,
                      bind_norm, bind_pad, bind_pad_reflect_1d, bind_repeat, bind_roll,
                      bind_rope, bind_set_rows, bind_soft_max, bind_ssm_conv, bind_sum,
                      bind_sum_rows, bind_timestep_embedding, bind_unary)
from .types import (ENCODABLE, F16, F32, FLASH_ATTN_MAX_DV, FLOATS, I32, I64, MATMUL_WEIGHTS,
                    ONE_SOURCE_OPS, QUANT_NAMES, UNARY_FUNCTIONS)

# --- type rules ---------------------------------------------------------------------------------

def _all(node: Tensor, allowed) -> bool:
    return all(t is None or t.type in allowed for t in [node] + list(node.src))


def _float_ops(node: Tensor) -> bool:
    return _all(node, FLOATS)


def _copy_ok(node: Tensor) -> bool:
    src = node.src[0]
    if src.type == I32 or node.type == I32:
        return src.type == node.type == I32
    if node.type in ENCODABLE:
        return src.type in FLOATS and node.is_contiguous()
    if src.type in QUANT_NAMES:
        return node.type in FLOATS and src.is_contiguous_rows()
    return src.type in FLOATS and node.type in FLOATS


def _f32_rows(node: Tensor) -> bool:
    return node.type == F32 and node.src[0].type == F32


def _soft_max_ok(node: Tensor) -> bool:
    _, mask, sinks = SoftMaxSources.of(node)
    return (_f32_rows(node) and (mask is None or mask.type in FLOATS)
        and (sinks is None or sinks.type == F32))


def _rope_ok(node: Tensor) -> bool:
    x, _, ff = RopeSources.of(node)
    params = RopeParams.of(node)
    return (params.mode in (RopeMode.NORMAL, RopeMode.NEOX) and params.n_offs == 0
        and x.type in FLOATS and node.type == x.type and (ff is None or ff.type == F32))


def _get_rows_ok(node: Tensor) -> bool:
    src, idx = node.src[0], node.src[1]
    if idx.type != I32:
        return False
    if src.type == I32:
        return node.type == I32
    return (node.type == F32 and (src.type in FLOATS or src.type in QUANT_NAMES)
        and src.is_contiguous_rows())


def _set_rows_ok(node: Tensor) -> bool:
    return (node.src[0].type in FLOATS and node.type in FLOATS + ENCODABLE
        and node.src[1].type in (I32, I64))


def _mul_mat_ok(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    return (node.type == F32 and b.type in FLOATS and a.type in MATMUL_WEIGHTS
        and (a.type in FLOATS or a.is_contiguous_rows()))


def _mul_mat_id_ok(node: Tensor) -> bool:
    return _mul_mat_ok(node) and node.src[2].type == I32


def _flash_attn_ok(node: Tensor) -> bool:
    q, k, v = node.src[0], node.src[1], node.src[2]
    mask = node.src[3] if len(node.src) > 3 else None
    sinks = node.src[4] if len(node.src) > 4 else None
    kv_ok = k.type == v.type and k.type in MATMUL_WEIGHTS
    return (q.type == F32 and kv_ok and (mask is None or mask.type == F16)
        and (sinks is None or sinks.type == F32) and v.ne[0] <= FLASH_ATTN_MAX_DV)


KERNELS: dict[Hashable, Kernel] = {
    **{(Op.UNARY, fn): Kernel(_float_ops, bind_unary) for fn in UNARY_FUNCTIONS},
    **{op: Kernel(_float_ops, bind_unary) for op in ONE_SOURCE_OPS},
    **{op: Kernel(_float_ops, bind_binary) for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV)},
    **{(Op.GLU, fn): Kernel(_float_ops, bind_glu) for fn in GluOp},
    **{op: Kernel(_copy_ok, bind_copy) for op in (Op.DUP, Op.CPY, Op.CONT)},
    Op.REPEAT: Kernel(_float_ops, bind_repeat),
    Op.CONCAT: Kernel(_float_ops, bind_concat),
    Op.DIAG_MASK_INF: Kernel(_f32_rows, bind_diag_mask_inf),
    Op.SUM_ROWS: Kernel(_float_ops, bind_sum_rows),
    Op.MEAN: Kernel(lambda n: n.src[0].type in FLOATS and n.type == F32, bind_sum_rows),
    Op.SUM: Kernel(_float_ops, bind_sum),
    Op.ARGMAX: Kernel(lambda n: n.src[0].type == F32, bind_argmax),
    Op.NORM: Kernel(_f32_rows, bind_norm),
    Op.RMS_NORM: Kernel(_f32_rows, bind_norm),
    Op.L2_NORM: Kernel(_f32_rows, bind_norm),
    Op.ADD1: Kernel(_float_ops, bind_binary),
    Op.MUL_MAT_ID: Kernel(_mul_mat_id_ok, bind_mul_mat_id),
    Op.ARGSORT: Kernel(lambda n: n.src[0].type == F32, bind_argsort),
    Op.TOP_K: Kernel(lambda n: n.src[0].type == F32, bind_argsort),
    Op.CUMSUM: Kernel(_f32_rows, bind_cumsum),
    Op.PAD: Kernel(_float_ops, bind_pad),
    Op.ARANGE: Kernel(lambda n: n.type == F32, bind_arange),
    Op.GROUP_NORM: Kernel(_f32_rows, bind_group_norm),
    Op.SSM_CONV: Kernel(lambda n: _all(n, (F32,)), bind_ssm_conv),
    Op.ROLL: Kernel(_float_ops, bind_roll),
    Op.PAD_REFLECT_1D: Kernel(_f32_rows, bind_pad_reflect_1d),
    Op.TIMESTEP_EMBEDDING: Kernel(_f32_rows, bind_timestep_embedding),
    Op.FLASH_ATTN_EXT: Kernel(_flash_attn_ok, bind_flash_attn_ext),
    Op.SOFT_MAX: Kernel(_soft_max_ok, bind_soft_max),
    Op.ROPE: Kernel(_rope_ok, bind_rope),
    Op.GET_ROWS: Kernel(_get_rows_ok, bind_get_rows),
    Op.SET_ROWS: Kernel(_set_rows_ok, bind_set_rows),
    Op.MUL_MAT: Kernel(_mul_mat_ok, bind_mul_mat),
}


TABLE = KernelTable(KERNELS)
