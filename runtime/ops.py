"""The op catalogue: ggml's op names and one builder per op.

This is the single place that defines what an op means: its result's type and shape, its
``op_params`` (in ggml's order) and which source goes in which slot. Builders validate the way
ggml's asserts do, but raise a typed ``polydev.errors`` exception naming the offending shapes.
Builders only record metadata; backends compute.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Sequence

from .errors import InvalidArgumentError, ShapeError, TensorTypeError
from .tensor import MAX_DIMS, Tensor, contiguous_strides
from .types import GGMLType, TYPE_TRAITS

if TYPE_CHECKING:
    from .context import Context

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
    NORMAL = 0
    NEOX = 2
    MROPE = 8
    VISION = 24
    IMROPE = 40


VIEW_OPS = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})

# ggml_op_can_inplace: ops whose result may reuse a source's memory in the graph allocator.
INPLACE_OPS = frozenset({
    Op.FILL, Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD_ID, Op.ADD1, Op.SUB,
    Op.MUL, Op.DIV, Op.SQR, Op.SQRT, Op.LOG, Op.UNARY, Op.ROPE, Op.ROPE_BACK, Op.SILU_BACK,
    Op.RMS_NORM, Op.RMS_NORM_BACK, Op.SOFT_MAX, Op.SOFT_MAX_BACK,
})


def is_view_op(op: Op) -> bool:
    return op in VIEW_OPS


def op_desc(t: Tensor) -> str:
    """ggml_op_desc: the op name, or the unary/glu function's name."""
    if t.op == Op.UNARY:
        return UnaryOp(t.op_params[0]).name
    if t.op == Op.GLU:
        return GluOp(t.op_params[0]).name
    return t.op.name


# --- helpers ----------------------------------------------------------------------------------

def _ne(t: Tensor) -> str:
    return f"{t.name or '<unnamed>'} ne={list(t.ne)}"


def _check(cond: bool, op: str, msg: str, exc: type = ShapeError) -> None:
    if not cond:
        raise exc(f"{op}: {msg}")


def _result(ctx: "Context", op: Op, type_: GGMLType, ne: Sequence[int], srcs: Sequence,
            params: tuple = ()) -> Tensor:
    t = ctx.new_tensor(type_, ne)
    t.op, t.src, t.op_params = op, list(srcs), params
    return t


def _same_or_view(ctx: "Context", a: Tensor, inplace: bool) -> Tensor:
    return view_tensor(ctx, a) if inplace else ctx.new_tensor(a.type, a.ne)


def _unary_like(ctx, op: Op, a: Tensor, params: tuple = (), inplace: bool = False,
                srcs: Sequence | None = None) -> Tensor:
    t = _same_or_view(ctx, a, inplace)
    t.op, t.op_params, t.src = op, params, list(srcs if srcs is not None else [a])
    return t


def _pad4(ne: Sequence[int]) -> tuple[int, int, int, int]:
    if not 1 <= len(ne) <= MAX_DIMS:
        raise ShapeError(f"a tensor has 1 to 4 dimensions, got ne={list(ne)}")
    if any(int(n) < 0 for n in ne):
        raise ShapeError(f"negative dimension in ne={list(ne)}")
    return tuple(int(n) for n in ne) + (1,) * (MAX_DIMS - len(ne))  # type: ignore[return-value]


# --- views (no compute; the result shares its source's memory) ---------------------------------

def view_tensor(ctx: "Context", a: Tensor) -> Tensor:
    """A tensor with ``a``'s shape and strides over ``a``'s memory (op NONE: set by callers)."""
    t = ctx.new_view(a, a.ne, a.nb, 0)
    t.name = f"{a.name} (view)"
    return t


def _view(ctx, a: Tensor, ne: Sequence[int], nb: Sequence[int] | None, offset: int) -> Tensor:
    ne4 = _pad4(ne)
    # strides given for dims 1..k; dim 0 is packed and dims above k are packed after k
    nb4 = list(contiguous_strides(a.type, ne4))
    for i, stride in enumerate(nb or (), start=1):
        nb4[i] = stride
    for i in range(len(nb or ()) + 1, MAX_DIMS):
        nb4[i] = nb4[i - 1] * ne4[i - 1]
    t = ctx.new_view(a, ne4, tuple(nb4), offset)
    t.name = f"{a.name} (view)"
    t.op, t.op_params, t.src = Op.VIEW, (offset,), [a]
    return t


def view_1d(ctx, a: Tensor, ne0: int, offset: int = 0) -> Tensor:
    return _view(ctx, a, (ne0,), (), offset)


def view_2d(ctx, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int = 0) -> Tensor:
    return _view(ctx, a, (ne0, ne1), (nb1,), offset)


def view_3d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int,
            offset: int = 0) -> Tensor:
    return _view(ctx, a, (ne0, ne1, ne2), (nb1, nb2), offset)


def view_4d(ctx, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
            offset: int = 0) -> Tensor:
    return _view(ctx, a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)


def reshape(ctx, a: Tensor, *ne: int) -> Tensor:
    """ggml_reshape_Nd: the same contiguous memory under a new shape."""
    ne4 = _pad4(ne)
    _check(a.is_contiguous(), "reshape", f"{_ne(a)} is not contiguous (use cont first)")
    n = ne4[0] * ne4[1] * ne4[2] * ne4[3]
    _check(n == a.nelements, "reshape",
           f"cannot reshape {_ne(a)} ({a.nelements} elements) to ne={list(ne4)} ({n} elements)")
    t = ctx.new_view(a, ne4, contiguous_strides(a.type, ne4), 0)
    t.name = f"{a.name} (reshaped)"
    t.op, t.src = Op.RESHAPE, [a]
    return t


def reshape_1d(ctx, a, ne0):
    return reshape(ctx, a, ne0)


def reshape_2d(ctx, a, ne0, ne1):
    return reshape(ctx, a, ne0, ne1)


def reshape_3d(ctx, a, ne0, ne1, ne2):
    return reshape(ctx, a, ne0, ne1, ne2)


def reshape_4d(ctx, a, ne0, ne1, ne2, ne3):
    return reshape(ctx, a, ne0, ne1, ne2, ne3)


def permute(ctx, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """ggml_permute: source dimension i becomes result dimension axis_i."""
    axes = (axis0, axis1, axis2, axis3)
    _check(sorted(axes) == [0, 1, 2, 3], "permute",
           f"axes {list(axes)} are not a permutation of 0..3", InvalidArgumentError)
    ne, nb = [0] * 4, [0] * 4
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    t = ctx.new_view(a, ne, nb, 0)
    t.name = f"{a.name} (permuted)"
    t.op, t.op_params, t.src = Op.PERMUTE, axes, [a]
    return t


def transpose(ctx, a: Tensor) -> Tensor:
    """ggml_transpose: swap dimensions 0 and 1 (a strided view)."""
    ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    t = ctx.new_view(a, ne, nb, 0)
    t.name = f"{a.name} (transposed)"
    t.op, t.src = Op.TRANSPOSE, [a]
    return t


# --- copies ----------------------------------------------------------------------------------

def dup(ctx, a: Tensor) -> Tensor:
    return _result(ctx, Op.DUP, a.type, a.ne, [a])


def cont(ctx, a: Tensor, *ne: int) -> Tensor:
    """ggml_cont / ggml_cont_Nd: a contiguous copy, optionally under a new shape."""
    ne4 = _pad4(ne) if ne else a.ne
    n = ne4[0] * ne4[1] * ne4[2] * ne4[3]
    _check(n == a.nelements, "cont", f"cannot make {_ne(a)} contiguous as ne={list(ne4)}")
    t = _result(ctx, Op.CONT, a.type, ne4, [a])
    t.name = f"{a.name} (cont)"
    return t


def cpy(ctx, a: Tensor, b: Tensor) -> Tensor:
    """ggml_cpy: copy ``a`` into ``b`` in element order, converting to ``b``'s type.

    The result is a view of ``b`` (computing it writes ``b``'s memory).
    """
    _check(a.nelements == b.nelements, "cpy",
           f"{_ne(a)} and {_ne(b)} have different element counts")
    t = view_tensor(ctx, b)
    t.name = f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)"
    t.op, t.src = Op.CPY, [a, b]
    return t


# --- element-wise arithmetic -------------------------------------------------------------------

def _binary(ctx, op: Op, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    _check(b.can_repeat_to(a), op.name.lower(),
           f"{_ne(b)} cannot be broadcast to {_ne(a)} (each dimension of a must be a multiple of b's)")
    return _unary_like(ctx, op, a, inplace=inplace, srcs=[a, b])


def add(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """a + b, with b repeated over a (ggml_can_repeat)."""
    return _binary(ctx, Op.ADD, a, b, inplace)


def sub(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    return _binary(ctx, Op.SUB, a, b, inplace)


def mul(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    return _binary(ctx, Op.MUL, a, b, inplace)


def div(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    return _binary(ctx, Op.DIV, a, b, inplace)


def scale(ctx, a: Tensor, s: float, b: float = 0.0, inplace: bool = False) -> Tensor:
    """a * s + b (ggml_scale / ggml_scale_bias)."""
    padded = a.nb[0] == a.traits.type_size and a.nb[2] == a.nb[1] * a.ne[1] \
        and a.nb[3] == a.nb[2] * a.ne[2]
    _check(padded, "scale", f"{_ne(a)} nb={list(a.nb)} must be padded 1-d (rows may be strided)")
    return _unary_like(ctx, Op.SCALE, a, (float(s), float(b)), inplace)


def sqr(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    return _unary_like(ctx, Op.SQR, a, inplace=inplace)


def sqrt(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    return _unary_like(ctx, Op.SQRT, a, inplace=inplace)


def unary(ctx, a: Tensor, fn: UnaryOp, inplace: bool = False) -> Tensor:
    """An element-wise function of UnaryOp (ggml_unary)."""
    fn = UnaryOp(fn)
    _check(a.is_contiguous(1), fn.name.lower(), f"{_ne(a)} nb={list(a.nb)} must have packed rows "
           f"beyond dimension 1")
    return _unary_like(ctx, Op.UNARY, a, (int(fn),), inplace)


def _unary_fn(fn: UnaryOp):
    def build(ctx, a: Tensor, inplace: bool = False) -> Tensor:
        return unary(ctx, a, fn, inplace)
    build.__name__ = fn.name.lower()
    build.__doc__ = f"Element-wise {fn.name} (Op.UNARY)."
    return build


abs_ = _unary_fn(UnaryOp.ABS)
neg = _unary_fn(UnaryOp.NEG)
tanh = _unary_fn(UnaryOp.TANH)
relu = _unary_fn(UnaryOp.RELU)
sigmoid = _unary_fn(UnaryOp.SIGMOID)
gelu = _unary_fn(UnaryOp.GELU)
silu = _unary_fn(UnaryOp.SILU)
exp = _unary_fn(UnaryOp.EXP)
sgn = _unary_fn(UnaryOp.SGN)
step = _unary_fn(UnaryOp.STEP)
elu = _unary_fn(UnaryOp.ELU)
gelu_erf = _unary_fn(UnaryOp.GELU_ERF)
gelu_quick = _unary_fn(UnaryOp.GELU_QUICK)
hardswish = _unary_fn(UnaryOp.HARDSWISH)
hardsigmoid = _unary_fn(UnaryOp.HARDSIGMOID)
expm1 = _unary_fn(UnaryOp.EXPM1)
softplus = _unary_fn(UnaryOp.SOFTPLUS)
floor = _unary_fn(UnaryOp.FLOOR)
ceil = _unary_fn(UnaryOp.CEIL)
round_ = _unary_fn(UnaryOp.ROUND)
trunc = _unary_fn(UnaryOp.TRUNC)


def glu(ctx, a: Tensor, fn: GluOp, swapped: bool = False) -> Tensor:
    """Fused GLU: ``a``'s rows hold [x, gate] (or [gate, x] if swapped); result = act(x) * gate."""
    fn = GluOp(fn)
    _check(a.is_contiguous(1), fn.name.lower(), f"{_ne(a)} must have packed rows beyond dim 1")
    _check(a.ne[0] % 2 == 0, fn.name.lower(), f"{_ne(a)}: ne[0] must be even to split in halves")
    ne = (a.ne[0] // 2,) + a.ne[1:]
    return _result(ctx, Op.GLU, a.type, ne, [a], (int(fn), int(bool(swapped))))


def glu_split(ctx, a: Tensor, b: Tensor, fn: GluOp) -> Tensor:
    """Split GLU: act(a) * b for same-shape ``a`` and ``b``."""
    fn = GluOp(fn)
    name = fn.name.lower()
    _check(a.is_contiguous(1) and b.is_contiguous(1), name, f"{_ne(a)} and {_ne(b)} must have "
           f"packed rows beyond dim 1")
    _check(a.same_shape(b), name, f"{_ne(a)} and {_ne(b)} must have the same shape")
    _check(a.type == b.type, name, f"types differ: {a.type} and {b.type}", TensorTypeError)
    return _result(ctx, Op.GLU, a.type, a.ne, [a, b], (int(fn), 0))


def swiglu(ctx, a: Tensor, b: Tensor | None = None, swapped: bool = False) -> Tensor:
    return glu(ctx, a, GluOp.SWIGLU, swapped) if b is None else glu_split(ctx, a, b, GluOp.SWIGLU)


def geglu(ctx, a: Tensor, b: Tensor | None = None, swapped: bool = False) -> Tensor:
    return glu(ctx, a, GluOp.GEGLU, swapped) if b is None else glu_split(ctx, a, b, GluOp.GEGLU)


# --- reductions ----------------------------------------------------------------------------------

def sum_(ctx, a: Tensor) -> Tensor:
    """The sum of all elements, as a 1-element tensor of a's type."""
    return _result(ctx, Op.SUM, a.type, (1,), [a])


def sum_rows(ctx, a: Tensor) -> Tensor:
    return _result(ctx, Op.SUM_ROWS, a.type, (1,) + a.ne[1:], [a])


def mean(ctx, a: Tensor) -> Tensor:
    return _result(ctx, Op.MEAN, GGMLType.F32, (1,) + a.ne[1:], [a])


def argmax(ctx, a: Tensor) -> Tensor:
    """Index of the largest element of each row of a matrix (I32)."""
    _check(a.ne[2] == 1 and a.ne[3] == 1, "argmax", f"{_ne(a)} must be a matrix")
    return _result(ctx, Op.ARGMAX, GGMLType.I32, (a.ne[1],), [a])


# --- shape ops -----------------------------------------------------------------------------------

def repeat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """``a`` tiled to ``b``'s shape."""
    _check(a.can_repeat_to(b), "repeat", f"{_ne(a)} cannot be repeated to {_ne(b)}")
    return _result(ctx, Op.REPEAT, a.type, b.ne, [a])


def concat(ctx, a: Tensor, b: Tensor, dim: int) -> Tensor:
    _check(0 <= dim < MAX_DIMS, "concat", f"dim={dim} is not in 0..3", InvalidArgumentError)
    _check(a.type == b.type, "concat", f"types differ: {a.type} and {b.type}", TensorTypeError)
    for d in range(MAX_DIMS):
        _check(d == dim or a.ne[d] == b.ne[d], "concat",
               f"{_ne(a)} and {_ne(b)} differ in dimension {d} (concatenating along {dim})")
    ne = tuple(a.ne[d] + b.ne[d] if d == dim else a.ne[d] for d in range(MAX_DIMS))
    return _result(ctx, Op.CONCAT, a.type, ne, [a, b], (dim,))



def pad_ext(ctx, a: Tensor, lp0: int = 0, rp0: int = 0, lp1: int = 0, rp1: int = 0,
            lp2: int = 0, rp2: int = 0, lp3: int = 0, rp3: int = 0,
            circular: bool = False) -> Tensor:
    """``a`` with lp_i/rp_i elements added before/after dimension i: zeros, or with
    ``circular`` the values wrapped around (as on a torus)."""
    pads = (lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)
    _check(all(int(p) >= 0 for p in pads), "pad", f"negative padding {list(pads)}",
           InvalidArgumentError)
    if circular:
        _check(all(a.ne[d] > 0 or pads[2 * d] + pads[2 * d + 1] == 0 for d in range(MAX_DIMS)),
               "pad", f"cannot wrap around an empty dimension of {_ne(a)}", InvalidArgumentError)
    ne = tuple(a.ne[d] + pads[2 * d] + pads[2 * d + 1] for d in range(MAX_DIMS))
    return _result(ctx, Op.PAD, a.type, ne, [a], tuple(int(p) for p in pads) + (int(circular),))


def pad(ctx, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """``a`` with p_i zeros appended to dimension i."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def pad_circular(ctx, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """``a`` with p_i wrapped-around values appended to dimension i."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3, circular=True)

# --- normalisation -------------------------------------------------------------------------------

def norm(ctx, a: Tensor, eps: float = 1e-5, inplace: bool = False) -> Tensor:
    """(x - mean) / sqrt(var + eps) over each row."""
    return _unary_like(ctx, Op.NORM, a, (float(eps),), inplace)


def rms_norm(ctx, a: Tensor, eps: float = 1e-6, inplace: bool = False) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over each row."""
    return _unary_like(ctx, Op.RMS_NORM, a, (float(eps),), inplace)


# --- matrix product ----------------------------------------------------------------------------

def mul_mat(ctx, a: Tensor, b: Tensor) -> Tensor:
    """ggml_mul_mat: result[i, j] = sum_k a[k, i] * b[k, j], i.e. ``b @ a.T`` per matrix.

    a is [K, M, ...], b is [K, N, ...] and the F32 result is [M, N, b.ne2, b.ne3]; a is
    broadcast over b's dimensions 2 and 3.
    """
    _check(a.ne[0] == b.ne[0], "mul_mat", f"{_ne(a)} and {_ne(b)} differ in ne[0] (the shared K)")
    _check(b.ne[2] % a.ne[2] == 0 and b.ne[3] % a.ne[3] == 0, "mul_mat",
           f"{_ne(a)} cannot be broadcast over dims 2 and 3 of {_ne(b)}")
    _check(not a.is_transposed(), "mul_mat", f"{_ne(a)} nb={list(a.nb)} must not be transposed")
    return _result(ctx, Op.MUL_MAT, GGMLType.F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3]), [a, b])


# --- rows ----------------------------------------------------------------------------------------

def get_rows(ctx, a: Tensor, b: Tensor) -> Tensor:
    """Gather rows of ``a`` (any type) at the I32 indices ``b``; the result is F32 (I32 for I32)."""
    _check(b.type == GGMLType.I32, "get_rows", f"indices {_ne(b)} must be i32, got {b.type}",
           TensorTypeError)
    _check(a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1, "get_rows",
           f"indices {_ne(b)} must be [n, {a.ne[2]}, {a.ne[3]}, 1] for rows of {_ne(a)}")
    type_ = GGMLType.I32 if a.type == GGMLType.I32 else GGMLType.F32
    return _result(ctx, Op.GET_ROWS, type_, (a.ne[0], b.ne[0], b.ne[1], b.ne[2]), [a, b])


def set_rows(ctx, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Write the rows of ``b`` into ``a`` at the indices ``c`` (converting to a's type).

    The result is a view of ``a``; ggml's source order is kept: src = [b, c, a].
    """
    ok = a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3] and b.ne[1] == c.ne[0] \
        and b.ne[2] % c.ne[1] == 0 and b.ne[3] % c.ne[2] == 0 and c.ne[3] == 1
    _check(ok, "set_rows", f"destination {_ne(a)}, rows {_ne(b)} and indices {_ne(c)} do not fit")
    _check(b.type in (GGMLType.F32, GGMLType.F16), "set_rows", f"rows must be f32 or f16, got "
           f"{b.type}", TensorTypeError)
    _check(c.type in (GGMLType.I64, GGMLType.I32), "set_rows", f"indices must be i64 or i32, got "
           f"{c.type}", TensorTypeError)
    _check(a.is_contiguous_rows() and b.is_contiguous_rows(), "set_rows",
           "destination and source rows must be packed")
    t = view_tensor(ctx, a)
    t.op, t.src = Op.SET_ROWS, [b, c, a]
    return t


# --- attention helpers ---------------------------------------------------------------------------

def diag_mask_inf(ctx, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """Set element (i0, i1) to -inf where i0 > n_past + i1 (causal mask)."""
    return _unary_like(ctx, Op.DIAG_MASK_INF, a, (int(n_past),), inplace)


def soft_max(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    return soft_max_ext(ctx, a, None, 1.0, 0.0, inplace)


def soft_max_ext(ctx, a: Tensor, mask: Tensor | None, scale: float = 1.0, max_bias: float = 0.0,
                 inplace: bool = False) -> Tensor:
    """softmax(a * scale + slope * mask) over rows; slope is ALiBi's per head when max_bias > 0."""
    _check(a.is_contiguous(), "soft_max", f"{_ne(a)} must be contiguous")
    if mask is not None:
        _check(mask.type in (GGMLType.F16, GGMLType.F32), "soft_max",
               f"mask must be f16 or f32, got {mask.type}", TensorTypeError)
        _check(mask.is_contiguous(), "soft_max", f"mask {_ne(mask)} must be contiguous")
        ok = mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1] and a.ne[2] % mask.ne[2] == 0 \
            and a.ne[3] % mask.ne[3] == 0
        _check(ok, "soft_max", f"mask {_ne(mask)} does not fit {_ne(a)}: ne[0] must match, ne[1] "
               f"must cover a's rows and dims 2-3 must divide a's")
    _check(max_bias <= 0 or mask is not None, "soft_max", "max_bias > 0 (ALiBi) needs a mask",
           InvalidArgumentError)
    return _unary_like(ctx, Op.SOFT_MAX, a, (float(scale), float(max_bias)), inplace,
                       srcs=[a, mask])


def soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """Attach attention sinks (one F32 logit per head, a's dim 2) to a SOFT_MAX result."""
    if sinks is None:
        return
    _check(a.op == Op.SOFT_MAX, "soft_max_add_sinks", f"{_ne(a)} is not a soft_max result",
           InvalidArgumentError)
    _check(sinks.type == GGMLType.F32 and sinks.ne[0] == a.ne[2], "soft_max_add_sinks",
           f"sinks {_ne(sinks)} must be f32 with one value per head ({a.ne[2]})")
    while len(a.src) < 3:
        a.src.append(None)
    a.src[2] = sinks


def rope(ctx, a: Tensor, pos: Tensor, n_dims: int, mode: int = RopeMode.NORMAL,
         inplace: bool = False) -> Tensor:
    return rope_ext(ctx, a, pos, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0,
                    inplace=inplace)


def rope_ext(ctx, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int,
             mode: int = RopeMode.NORMAL, n_ctx_orig: int = 0, freq_base: float = 10000.0,
             freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
             beta_fast: float = 32.0, beta_slow: float = 1.0,
             sections: Sequence[int] | None = None, inplace: bool = False) -> Tensor:
    """Rotary position embedding with YaRN scaling (ggml_rope_ext).

    ``a`` is [head_dim, n_head, n_tokens, ...], ``pos`` the I32 positions of the tokens (4 per
    token for M-RoPE), ``freq_factors`` optional F32 per-pair divisors of the frequencies.
    op_params follow ggml: [0, n_dims, mode, 0, n_ctx_orig, freq_base, freq_scale, ext_factor,
    attn_factor, beta_fast, beta_slow, sections[4], n_offs].
    """
    _check(mode & 1 == 0, "rope", f"mode {mode} (mode & 1) is no longer supported by ggml",
           InvalidArgumentError)
    _check(pos.type == GGMLType.I32 and pos.ne[1] == pos.ne[2] == pos.ne[3] == 1, "rope",
           f"positions {_ne(pos)} must be an i32 vector", TensorTypeError)
    per_token = 4 if mode & RopeMode.MROPE else 1
    _check(pos.ne[0] == a.ne[2] * per_token, "rope",
           f"positions {_ne(pos)} must hold {per_token} value(s) per token of {_ne(a)}")
    _check(0 < n_dims <= a.ne[0] and n_dims % 2 == 0, "rope",
           f"n_dims={n_dims} must be even and at most ne[0] of {_ne(a)}", InvalidArgumentError)
    if freq_factors is not None:
        _check(freq_factors.type == GGMLType.F32 and freq_factors.ne[0] >= n_dims // 2, "rope",
               f"freq_factors {_ne(freq_factors)} must be f32 with >= n_dims/2 values")
    secs = tuple(sections) if (mode & RopeMode.MROPE and sections) else (0, 0, 0, 0)
    params = (0, int(n_dims), int(mode), 0, int(n_ctx_orig), float(freq_base), float(freq_scale),
              float(ext_factor), float(attn_factor), float(beta_fast), float(beta_slow)) \
        + secs + (0,)
    return _unary_like(ctx, Op.ROPE, a, params, inplace, srcs=[a, pos, freq_factors])
