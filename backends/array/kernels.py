"""The kernel table shared by the array backends, and the type rules behind supports_op.

A kernel is found by its key: the op, or (Op.UNARY, UnaryOp) / (Op.GLU, GluOp). Each entry
binds a node to zero-copy views once and returns the call that computes it; its ``accepts``
function holds the type rules, so ``supports_op`` can never claim what the kernels cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

from polydev.ops import GluOp, Op, UnaryOp
from polydev.tensor import Tensor
from polydev.types import GGMLType, TYPE_TRAITS

from . import (attention, conv, elementwise, generate, matmul, movement, mul_mat_id, norm, reduce,
               resample, rope, scan, softmax, sort)
from .env import needs_codec

F32, F16, BF16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I64
FLOATS = (F32, F16)


@dataclass(frozen=True)
class Kernel:
    bind: Callable[..., Callable[[], None]]
    accepts: Callable[[Tensor], bool]


def kernel_key(node: Tensor) -> Hashable:
    if node.op == Op.UNARY:
        return (Op.UNARY, UnaryOp(node.op_params[0]))
    if node.op == Op.GLU:
        return (Op.GLU, GluOp(node.op_params[0]))
    return node.op


def key_name(key: Hashable) -> str:
    return key[1].name if isinstance(key, tuple) else key.name


def _types(node: Tensor, *allowed) -> bool:
    """The node and each present source have a type among ``allowed[i]`` (node first)."""
    tensors = [node] + list(node.src)
    return all(t is None or t.type in ok for t, ok in zip(tensors, allowed))


def _decodable(t: Tensor) -> bool:
    tr = TYPE_TRAITS[t.type]
    return t.type in (F32, F16, BF16, GGMLType.F64, I32, GGMLType.I16, GGMLType.I8, I64) \
        or tr.can_dequantize


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
    return node.type in FLOATS and node.src[0].type == node.type \
        and node.op_params[2] in rope.SUPPORTED_MODES and node.src[0].nb[0] == node.nb[0]


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


def _glu_ok(node: Tensor) -> bool:
    return _float_same(node) and GluOp(node.op_params[0]) in elementwise.GLU_FUNCTIONS


def needs_codec_any(node: Tensor) -> bool:
    return any(t is not None and needs_codec(t.type) for t in [node] + list(node.src))


KERNELS: dict[Hashable, Kernel] = {
    Op.NONE: Kernel(lambda env, node: (lambda: None), lambda node: True),
    Op.DUP: Kernel(movement.bind_copy, _copy_ok),
    Op.CONT: Kernel(movement.bind_copy, _copy_ok),
    Op.CPY: Kernel(movement.bind_copy, _copy_ok),
    Op.ADD: Kernel(elementwise.bind_binary, _float_same),
    Op.SUB: Kernel(elementwise.bind_binary, _float_same),
    Op.MUL: Kernel(elementwise.bind_binary, _float_same),
    Op.DIV: Kernel(elementwise.bind_binary, _float_same),
    Op.SCALE: Kernel(elementwise.bind_scale, _float_same),
    Op.SQR: Kernel(elementwise.bind_sqr, _float_same),
    Op.SQRT: Kernel(elementwise.bind_sqrt, _float_same),
    Op.LOG: Kernel(elementwise.bind_ufunc, _float_same),
    Op.SIN: Kernel(elementwise.bind_ufunc, _float_same),
    Op.COS: Kernel(elementwise.bind_ufunc, _float_same),
    Op.CLAMP: Kernel(elementwise.bind_clamp, _float_same),
    Op.LEAKY_RELU: Kernel(elementwise.bind_leaky_relu, _float_same),
    Op.ADD1: Kernel(elementwise.bind_add1, _float_same),
    Op.FILL: Kernel(elementwise.bind_fill, _float_same),
    Op.SUM: Kernel(reduce.bind_sum, _float_same),
    Op.SUM_ROWS: Kernel(reduce.bind_sum_rows, _float_same),
    Op.MEAN: Kernel(reduce.bind_mean, _src_float),
    Op.ARGMAX: Kernel(reduce.bind_argmax, _src_float),
    Op.REPEAT: Kernel(movement.bind_repeat, lambda n: not needs_codec_any(n)),
    Op.CONCAT: Kernel(movement.bind_concat, lambda n: not needs_codec_any(n)),
    Op.PAD: Kernel(movement.bind_pad, _float_same),
    Op.PAD_REFLECT_1D: Kernel(movement.bind_pad_reflect_1d, _f32_only),
    Op.ROLL: Kernel(movement.bind_roll, _f32_only),
    Op.ACC: Kernel(movement.bind_window, _f32_only),
    Op.SET: Kernel(movement.bind_window, lambda n: not needs_codec_any(n)),
    Op.UPSCALE: Kernel(resample.bind_upscale, _f32_only),
    Op.ARANGE: Kernel(generate.bind_arange, lambda n: n.type == F32),
    Op.TIMESTEP_EMBEDDING: Kernel(generate.bind_timestep_embedding, _f32_only),
    Op.CUMSUM: Kernel(reduce.bind_cumsum, _f32_only),
    Op.COUNT_EQUAL: Kernel(reduce.bind_count_equal, lambda n: n.src[0].type == I32),
    Op.ARGSORT: Kernel(sort.bind_argsort, lambda n: n.src[0].type == F32),
    Op.TOP_K: Kernel(sort.bind_top_k, lambda n: n.src[0].type == F32),
    Op.NORM: Kernel(norm.bind_norm, _f32_only),
    Op.L2_NORM: Kernel(norm.bind_l2_norm, _f32_only),
    Op.GROUP_NORM: Kernel(norm.bind_group_norm, _f32_only),
    Op.RMS_NORM: Kernel(norm.bind_rms_norm, _f32_only),
    Op.MUL_MAT: Kernel(matmul.bind_mul_mat, _mul_mat_ok),
    Op.MUL_MAT_ID: Kernel(mul_mat_id.bind_mul_mat_id, _mul_mat_ok),
    Op.OUT_PROD: Kernel(matmul.bind_out_prod, _mul_mat_ok),
    Op.IM2COL: Kernel(conv.bind_im2col, lambda n: n.src[1].type in FLOATS),
    Op.CONV_2D: Kernel(conv.bind_conv_2d, _conv_ok),
    Op.CONV_2D_DW: Kernel(conv.bind_conv_2d_dw, _conv_ok),
    Op.CONV_TRANSPOSE_1D: Kernel(conv.bind_conv_transpose_1d, _conv_ok),
    Op.CONV_TRANSPOSE_2D: Kernel(conv.bind_conv_transpose_2d, _conv_ok),
    Op.POOL_1D: Kernel(conv.bind_pool_1d, _src_float),
    Op.POOL_2D: Kernel(conv.bind_pool_2d, _src_float),
    Op.SSM_CONV: Kernel(scan.bind_ssm_conv, _all_f32),
    Op.SSM_SCAN: Kernel(scan.bind_ssm_scan, lambda n: all(s.type == F32 for s in n.src[:6])),
    Op.RWKV_WKV6: Kernel(scan.bind_rwkv_wkv6, _all_f32),
    Op.GATED_LINEAR_ATTN: Kernel(scan.bind_gated_linear_attn, _all_f32),
    Op.GET_ROWS: Kernel(movement.bind_get_rows, _get_rows_ok),
    Op.GET_ROWS_BACK: Kernel(movement.bind_get_rows_back,
                             lambda n: _src_float(n) and n.src[1].type == I32),
    Op.SET_ROWS: Kernel(movement.bind_set_rows, _set_rows_ok),
    Op.DIAG_MASK_INF: Kernel(softmax.bind_diag_mask_inf, _f32_only),
    Op.SOFT_MAX: Kernel(softmax.bind_soft_max, _soft_max_ok),
    Op.ROPE: Kernel(rope.bind_rope, _rope_ok),
    Op.FLASH_ATTN_EXT: Kernel(attention.bind_flash_attn_ext, _flash_attn_ok),
    **{(Op.UNARY, fn): Kernel(elementwise.bind_unary, _float_same)
       for fn in elementwise.UNARY_FUNCTIONS},
    **{(Op.GLU, fn): Kernel(elementwise.bind_glu, _glu_ok) for fn in elementwise.GLU_FUNCTIONS},
}

# view ops compute nothing: their memory is their source's
for _op in (Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE):
    KERNELS[_op] = KERNELS[Op.NONE]


def find_kernel(node: Tensor) -> Kernel | None:
    """The kernel that computes ``node``, or None if there is none for its op and types."""
    k = KERNELS.get(kernel_key(node))
    return k if k is not None and k.accepts(node) else None


def supported_op_names() -> list[str]:
    """The ops (unary and glu functions by their own name) this kernel table computes."""
    return sorted({key_name(k) for k in KERNELS})
