"""The kernel table shared by the array backends (CPU and CUDA), and its type rules.

Each entry binds a node to zero-copy views of the backend's array namespace once (an
``ArrayEnv``: ``backend.env``) and returns the call that computes it; its ``accepts`` function
holds the type rules, so ``supports_op`` can never claim what the kernels cannot run.
"""

from __future__ import annotations

from typing import Hashable

from polydev.kernels import Kernel, KernelTable
from polydev.ops import GluParams, Op, RopeParams
from polydev.tensor import Tensor
from polydev.types import GGMLType, TYPE_TRAITS

from . import (attention, conv, elementwise, generate, matmul, movement, mul_mat_id, norm, reduce,
               resample, rope, scan, softmax, sort)
from .env import needs_codec

F32, F16, BF16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I64
FLOATS = (F32, F16)


def _types(node: Tensor, *allowed) -> bool:
    """The node and each present source have a type among ``allowed[i]`` (node first)."""
    tensors = [node] + list(node.src)
    return all(t is None or t.type in ok for t, ok in zip(tensors, allowed))


def _decodable(t: Tensor) -> bool:
    tr = TYPE_TRAITS[t.type]
    return (t.type in (F32, F16, BF16, GGMLType.F64, I32, GGMLType.I16, GGMLType.I8, I64)
        or tr.can_dequantize)


def _encodable(t: Tensor) -> bool:
    tr = TYPE_TRAITS[t.type]
    return not tr.is_quantized or tr.can_quantize


def _copy_ok(node: Tensor) -> bool:
    src = node.src[0]
    if TYPE_TRAITS[node.type].is_quantized:
        return _encodable(node) and src.type in FLOATS + (BF16,) and node.is_contiguous()
    if TYPE_TRAITS[src.type].is_quantized:
        return _decodable(src) and src.is_contiguous_rows()
    return _decodable(src) and _encodable(node)


def _mul_mat_ok(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    return b.type in FLOATS and node.type == F32 and _decodable(a) and a.is_contiguous_rows()


def _get_rows_ok(node: Tensor) -> bool:
    a = node.src[0]
    return node.src[1].type == I32 and _decodable(a) and a.is_contiguous_rows()


def _set_rows_ok(node: Tensor) -> bool:
    return node.src[0].type in FLOATS and node.src[1].type in (I32, I64) and _encodable(node)


def _rope_ok(node: Tensor) -> bool:
    return (node.type in FLOATS and node.src[0].type == node.type
        and RopeParams.of(node).mode in rope.SUPPORTED_MODES and node.src[0].nb[0] == node.nb[0])


def _float_same(node: Tensor) -> bool:
    return node.type in FLOATS and all(s is None or s.type in FLOATS for s in node.src[:2])


def _f32_only(node: Tensor) -> bool:
    return node.type == F32 and node.src[0].type == F32


def _soft_max_ok(node: Tensor) -> bool:
    return _f32_only(node) and (len(node.src) < 2 or node.src[1] is None
                                or node.src[1].type in FLOATS)


def _src_float(node: Tensor) -> bool:
    return node.src[0].type in FLOATS


def _all_f32(node: Tensor) -> bool:
    return node.type == F32 and all(s is None or s.type == F32 for s in node.src)


def _conv_ok(node: Tensor) -> bool:
    return node.src[0].type in FLOATS and node.src[1].type in FLOATS


def _flash_attn_ok(node: Tensor) -> bool:
    q, k, v = node.src[0], node.src[1], node.src[2]
    return q.type == F32 and _decodable(k) and _decodable(v) and k.ne[2] == v.ne[2]


def _get_rows_back_ok(node: Tensor) -> bool:
    return _src_float(node) and node.src[1].type == I32


def _glu_ok(node: Tensor) -> bool:
    return _float_same(node) and GluParams.of(node).fn in elementwise.GLU_FUNCTIONS


def needs_codec_any(node: Tensor) -> bool:
    return any(t is not None and needs_codec(t.type) for t in [node] + list(node.src))


KERNELS: dict[Hashable, Kernel] = {
    Op.DUP: Kernel(_copy_ok, movement.bind_copy),
    Op.CONT: Kernel(_copy_ok, movement.bind_copy),
    Op.CPY: Kernel(_copy_ok, movement.bind_copy),
    Op.ADD: Kernel(_float_same, elementwise.bind_binary),
    Op.SUB: Kernel(_float_same, elementwise.bind_binary),
    Op.MUL: Kernel(_float_same, elementwise.bind_binary),
    Op.DIV: Kernel(_float_same, elementwise.bind_binary),
    Op.SCALE: Kernel(_float_same, elementwise.bind_scale),
    Op.SQR: Kernel(_float_same, elementwise.bind_sqr),
    Op.SQRT: Kernel(_float_same, elementwise.bind_sqrt),
    Op.LOG: Kernel(_float_same, elementwise.bind_ufunc),
    Op.SIN: Kernel(_float_same, elementwise.bind_ufunc),
    Op.COS: Kernel(_float_same, elementwise.bind_ufunc),
    Op.CLAMP: Kernel(_float_same, elementwise.bind_clamp),
    Op.LEAKY_RELU: Kernel(_float_same, elementwise.bind_leaky_relu),
    Op.ADD1: Kernel(_float_same, elementwise.bind_add1),
    Op.FILL: Kernel(_float_same, elementwise.bind_fill),
    Op.SUM: Kernel(_float_same, reduce.bind_sum),
    Op.SUM_ROWS: Kernel(_float_same, reduce.bind_sum_rows),
    Op.MEAN: Kernel(_src_float, reduce.bind_mean),
    Op.ARGMAX: Kernel(_src_float, reduce.bind_argmax),
    Op.REPEAT: Kernel(lambda n: not needs_codec_any(n), movement.bind_repeat),
    Op.CONCAT: Kernel(lambda n: not needs_codec_any(n), movement.bind_concat),
    Op.PAD: Kernel(_float_same, movement.bind_pad),
    Op.PAD_REFLECT_1D: Kernel(_f32_only, movement.bind_pad_reflect_1d),
    Op.ROLL: Kernel(_f32_only, movement.bind_roll),
    Op.ACC: Kernel(_f32_only, movement.bind_window),
    Op.SET: Kernel(lambda n: not needs_codec_any(n), movement.bind_window),
    Op.UPSCALE: Kernel(_f32_only, resample.bind_upscale),
    Op.ARANGE: Kernel(lambda n: n.type == F32, generate.bind_arange),
    Op.TIMESTEP_EMBEDDING: Kernel(_f32_only, generate.bind_timestep_embedding),
    Op.CUMSUM: Kernel(_f32_only, reduce.bind_cumsum),
    Op.COUNT_EQUAL: Kernel(lambda n: n.src[0].type == I32, reduce.bind_count_equal),
    Op.ARGSORT: Kernel(lambda n: n.src[0].type == F32, sort.bind_argsort),
    Op.TOP_K: Kernel(lambda n: n.src[0].type == F32, sort.bind_top_k),
    Op.NORM: Kernel(_f32_only, norm.bind_norm),
    Op.L2_NORM: Kernel(_f32_only, norm.bind_l2_norm),
    Op.GROUP_NORM: Kernel(_f32_only, norm.bind_group_norm),
    Op.RMS_NORM: Kernel(_f32_only, norm.bind_rms_norm),
    Op.MUL_MAT: Kernel(_mul_mat_ok, matmul.bind_mul_mat),
    Op.MUL_MAT_ID: Kernel(_mul_mat_ok, mul_mat_id.bind_mul_mat_id),
    Op.OUT_PROD: Kernel(_mul_mat_ok, matmul.bind_out_prod),
    Op.IM2COL: Kernel(lambda n: n.src[1].type in FLOATS, conv.bind_im2col),
    Op.CONV_2D: Kernel(_conv_ok, conv.bind_conv_2d),
    Op.CONV_2D_DW: Kernel(_conv_ok, conv.bind_conv_2d_dw),
    Op.CONV_TRANSPOSE_1D: Kernel(_conv_ok, conv.bind_conv_transpose_1d),
    Op.CONV_TRANSPOSE_2D: Kernel(_conv_ok, conv.bind_conv_transpose_2d),
    Op.POOL_1D: Kernel(_src_float, conv.bind_pool_1d),
    Op.POOL_2D: Kernel(_src_float, conv.bind_pool_2d),
    Op.SSM_CONV: Kernel(_all_f32, scan.bind_ssm_conv),
    Op.SSM_SCAN: Kernel(lambda n: all(s.type == F32 for s in n.src[:6]), scan.bind_ssm_scan),
    Op.RWKV_WKV6: Kernel(_all_f32, scan.bind_rwkv_wkv6),
    Op.GATED_LINEAR_ATTN: Kernel(_all_f32, scan.bind_gated_linear_attn),
    Op.GET_ROWS: Kernel(_get_rows_ok, movement.bind_get_rows),
    Op.GET_ROWS_BACK: Kernel(_get_rows_back_ok, movement.bind_get_rows_back),
    Op.SET_ROWS: Kernel(_set_rows_ok, movement.bind_set_rows),
    Op.DIAG_MASK_INF: Kernel(_f32_only, softmax.bind_diag_mask_inf),
    Op.SOFT_MAX: Kernel(_soft_max_ok, softmax.bind_soft_max),
    Op.ROPE: Kernel(_rope_ok, rope.bind_rope),
    Op.FLASH_ATTN_EXT: Kernel(_flash_attn_ok, attention.bind_flash_attn_ext),
    **{(Op.UNARY, fn): Kernel(_float_same, elementwise.bind_unary)
       for fn in elementwise.UNARY_FUNCTIONS},
    **{(Op.GLU, fn): Kernel(_glu_ok, elementwise.bind_glu) for fn in elementwise.GLU_FUNCTIONS},
}

# the array kernels bind to the backend's array namespace (numpy or CuPy views)
TABLE = KernelTable(KERNELS, target=lambda backend: backend.env)
