"""ggml's op names: the Op, UnaryOp and GluOp enums, and the op sets the runtime needs."""

from __future__ import annotations

import enum

from ..tensor import Tensor

__all__ = [
    "Op", "UnaryOp", "GluOp", "RopeMode", "ScaleMode", "SortOrder", "PoolOp", "VIEW_OPS",
    "INPLACE_OPS", "is_view_op", "op_desc",
]


Op = enum.IntEnum("Op", [
    "NONE", "DUP", "ADD", "ADD_ID", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG",
    "SIN", "COS", "SUM", "SUM_ROWS", "CUMSUM", "MEAN", "ARGMAX", "COUNT_EQUAL", "REPEAT",
    "REPEAT_BACK", "CONCAT", "SILU_BACK", "NORM", "RMS_NORM", "RMS_NORM_BACK", "GROUP_NORM",
    "L2_NORM", "MUL_MAT", "MUL_MAT_ID", "OUT_PROD", "SCALE", "SET", "CPY", "CONT", "RESHAPE",
    "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS", "GET_ROWS_BACK", "SET_ROWS", "DIAG",
    "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX", "SOFT_MAX_BACK", "ROPE", "ROPE_BACK", "CLAMP",
    "CONV_TRANSPOSE_1D", "IM2COL", "IM2COL_BACK", "IM2COL_3D", "COL2IM_1D", "CONV_2D", "CONV_3D",
    "CONV_2D_DW", "CONV_TRANSPOSE_2D", "POOL_1D", "POOL_2D", "POOL_2D_BACK", "UPSCALE", "PAD",
    "PAD_REFLECT_1D", "ROLL", "ARANGE", "TIMESTEP_EMBEDDING", "ARGSORT", "TOP_K", "LEAKY_RELU",
    "TRI", "FILL", "FLASH_ATTN_EXT", "FLASH_ATTN_BACK", "SSM_CONV", "SSM_SCAN", "WIN_PART",
    "WIN_UNPART", "GET_REL_POS", "ADD_REL_POS", "RWKV_WKV6", "GATED_LINEAR_ATTN", "RWKV_WKV7",
    "SOLVE_TRI", "GATED_DELTA_NET", "LIGHTNING_INDEXER", "DSV4_HC_COMB", "DSV4_HC_PRE",
    "DSV4_HC_POST", "UNARY", "MAP_CUSTOM1", "MAP_CUSTOM2", "MAP_CUSTOM3", "CUSTOM",
    "CROSS_ENTROPY_LOSS", "CROSS_ENTROPY_LOSS_BACK", "OPT_STEP_ADAMW", "OPT_STEP_SGD", "GLU",
], start=0)
Op.__doc__ = "ggml's ops, in ggml's order (so the numeric values are ggml's)."

UnaryOp = enum.IntEnum("UnaryOp", [
    "ABS", "SGN", "NEG", "STEP", "TANH", "ELU", "RELU", "SIGMOID", "GELU", "GELU_QUICK", "SILU",
    "HARDSWISH", "HARDSIGMOID", "EXP", "EXPM1", "SOFTPLUS", "GELU_ERF", "XIELU", "FLOOR", "CEIL",
    "ROUND", "TRUNC",
], start=0)
UnaryOp.__doc__ = "The element-wise functions of Op.UNARY (op_params[0])."

GluOp = enum.IntEnum("GluOp", [
    "REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK",
], start=0)
GluOp.__doc__ = "The gated linear units of Op.GLU (op_params[0]; op_params[1] = swapped)."


class RopeMode(enum.IntEnum):
    """ggml's rope modes: pairs (i, i+1) in NORMAL; (i, i + n_dims/2) in NEOX; the
    multi-section modes give each pair one of a token's 4 positions."""

    NORMAL = 0
    NEOX = 2
    MROPE = 8
    VISION = 24
    IMROPE = 40


class ScaleMode(enum.IntFlag):
    """UPSCALE's interpolation (low byte) and flags (op_params[0])."""
    NEAREST = 0
    BILINEAR = 1
    BICUBIC = 2
    ALIGN_CORNERS = 1 << 8
    ANTIALIAS = 1 << 9


class SortOrder(enum.IntEnum):
    ASC = 0
    DESC = 1


class PoolOp(enum.IntEnum):
    MAX = 0
    AVG = 1


VIEW_OPS = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})

# ggml_op_can_inplace: ops whose result may reuse a source's memory in the graph allocator.
INPLACE_OPS = frozenset({
    Op.FILL, Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD_ID, Op.ADD1, Op.SUB,
    Op.MUL, Op.DIV, Op.SQR, Op.SQRT, Op.LOG, Op.UNARY, Op.ROPE, Op.ROPE_BACK, Op.SILU_BACK,
    Op.RMS_NORM, Op.RMS_NORM_BACK, Op.SOFT_MAX, Op.SOFT_MAX_BACK,
})


def is_view_op(op: Op) -> bool:
    """Whether ``op`` only views its source's memory (RESHAPE, VIEW, PERMUTE, TRANSPOSE)."""
    return op in VIEW_OPS


def op_desc(t: Tensor) -> str:
    """ggml_op_desc: the op name, or the unary/glu function's name."""
    if t.op == Op.UNARY:
        return UnaryOp(t.op_params[0]).name
    if t.op == Op.GLU:
        return GluOp(t.op_params[0]).name
    return t.op.name
