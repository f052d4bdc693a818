"""Element-wise arithmetic, the UNARY functions and the gated linear units (GLU)."""

from __future__ import annotations

from ..errors import InvalidArgumentError, TensorTypeError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result, _unary_like
from .catalogue import GluOp, Op, UnaryOp
from .params import (ClampParams, FillParams, GluParams, LeakyReluParams, ScaleParams,
                     UnaryParams)

__all__ = [
    "add", "sub", "mul", "div", "scale", "sqr", "sqrt", "unary", "abs_", "neg", "tanh", "relu",
    "sigmoid", "gelu", "silu", "exp", "sgn", "step", "elu", "gelu_erf", "gelu_quick",
    "hardswish", "hardsigmoid", "expm1", "softplus", "floor", "ceil", "round_", "trunc", "glu",
    "glu_split", "swiglu", "geglu", "reglu", "geglu_erf", "geglu_quick", "swiglu_oai", "add1",
    "log", "sin", "cos", "clamp", "leaky_relu", "fill",
]


def _binary(ctx, op: Op, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    _check(b.can_repeat_to(a), op.name.lower(),
           f"{_ne(b)} cannot be broadcast to {_ne(a)} "
           f"(each dimension of a must be a multiple of b's)")
    return _unary_like(ctx, op, a, inplace=inplace, srcs=[a, b])


def add(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """a + b, with b repeated over a (ggml_can_repeat)."""
    return _binary(ctx, Op.ADD, a, b, inplace)


def sub(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """a - b, with b repeated over a (ggml_can_repeat)."""
    return _binary(ctx, Op.SUB, a, b, inplace)


def mul(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """a * b, with b repeated over a (ggml_can_repeat)."""
    return _binary(ctx, Op.MUL, a, b, inplace)


def div(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """a / b, with b repeated over a (ggml_can_repeat)."""
    return _binary(ctx, Op.DIV, a, b, inplace)


def scale(ctx, a: Tensor, s: float, b: float = 0.0, inplace: bool = False) -> Tensor:
    """a * s + b (ggml_scale / ggml_scale_bias)."""
    padded = (a.nb[0] == a.traits.type_size and a.nb[2] == a.nb[1] * a.ne[1]
        and a.nb[3] == a.nb[2] * a.ne[2])
    _check(padded, "scale", f"{_ne(a)} nb={list(a.nb)} must be padded 1-d (rows may be strided)")
    return _unary_like(ctx, Op.SCALE, a, ScaleParams(float(s), float(b)).pack(), inplace)


def sqr(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """Element-wise a * a."""
    return _unary_like(ctx, Op.SQR, a, inplace=inplace)


def sqrt(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """Element-wise square root."""
    return _unary_like(ctx, Op.SQRT, a, inplace=inplace)


def unary(ctx, a: Tensor, fn: UnaryOp, inplace: bool = False) -> Tensor:
    """An element-wise function of UnaryOp (ggml_unary)."""
    fn = UnaryOp(fn)
    _check(a.is_contiguous(1), fn.name.lower(), f"{_ne(a)} nb={list(a.nb)} must have packed rows "
           f"beyond dimension 1")
    return _unary_like(ctx, Op.UNARY, a, UnaryParams(UnaryOp(fn)).pack(), inplace)


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
    return _result(ctx, Op.GLU, a.type, ne, [a], GluParams(GluOp(fn), bool(swapped)).pack())


def glu_split(ctx, a: Tensor, b: Tensor, fn: GluOp) -> Tensor:
    """Split GLU: act(a) * b for same-shape ``a`` and ``b``."""
    fn = GluOp(fn)
    name = fn.name.lower()
    _check(a.is_contiguous(1) and b.is_contiguous(1), name, f"{_ne(a)} and {_ne(b)} must have "
           f"packed rows beyond dim 1")
    _check(a.same_shape(b), name, f"{_ne(a)} and {_ne(b)} must have the same shape")
    _check(a.type == b.type, name, f"types differ: {a.type} and {b.type}", TensorTypeError)
    return _result(ctx, Op.GLU, a.type, a.ne, [a, b], GluParams(GluOp(fn)).pack())


def swiglu(ctx, a: Tensor, b: Tensor | None = None, swapped: bool = False) -> Tensor:
    """silu(x) * gate: fused over ``a``'s halves, or split over ``a`` and ``b``."""
    return glu(ctx, a, GluOp.SWIGLU, swapped) if b is None else glu_split(ctx, a, b, GluOp.SWIGLU)


def geglu(ctx, a: Tensor, b: Tensor | None = None, swapped: bool = False) -> Tensor:
    """gelu(x) * gate (tanh GELU): fused over ``a``'s halves, or split over ``a`` and ``b``."""
    return glu(ctx, a, GluOp.GEGLU, swapped) if b is None else glu_split(ctx, a, b, GluOp.GEGLU)


def reglu(ctx, a: Tensor, b: Tensor | None = None, swapped: bool = False) -> Tensor:
    """relu(x) * gate: fused over ``a``'s halves, or split over ``a`` and ``b``."""
    return glu(ctx, a, GluOp.REGLU, swapped) if b is None else glu_split(ctx, a, b, GluOp.REGLU)


def geglu_erf(ctx, a: Tensor, b: Tensor | None = None, swapped: bool = False) -> Tensor:
    """gelu_erf(x) * gate (exact GELU): fused over ``a``'s halves, or split over a and b."""
    return (glu(ctx, a, GluOp.GEGLU_ERF, swapped) if b is None
        else glu_split(ctx, a, b, GluOp.GEGLU_ERF))


def geglu_quick(ctx, a: Tensor, b: Tensor | None = None, swapped: bool = False) -> Tensor:
    """gelu_quick(x) * gate: fused over ``a``'s halves, or split over ``a`` and ``b``."""
    return (glu(ctx, a, GluOp.GEGLU_QUICK, swapped) if b is None
        else glu_split(ctx, a, b, GluOp.GEGLU_QUICK))


def swiglu_oai(ctx, a: Tensor, b: Tensor | None = None, alpha: float = 1.702,
               limit: float = 7.0, swapped: bool = False) -> Tensor:
    """gpt-oss's clamped SwiGLU: x = min(x, limit), g = clamp(g, -limit, limit),
    result = x * sigmoid(alpha * x) * (g + 1). op_params: [fn, swapped, alpha, limit]."""
    t = (glu(ctx, a, GluOp.SWIGLU_OAI, swapped) if b is None
        else glu_split(ctx, a, b, GluOp.SWIGLU_OAI))
    glu_ = GluParams.of(t)
    t.op_params = GluParams(glu_.fn, glu_.swapped, float(alpha), float(limit)).pack()
    return t


def add1(ctx, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    """a + b for a one-element tensor ``b``."""
    _check(b.nelements == 1, "add1", f"{_ne(b)} must be a scalar")
    _check(a.nb[0] == a.traits.type_size, "add1", f"{_ne(a)} must have packed elements")
    return _unary_like(ctx, Op.ADD1, a, inplace=inplace, srcs=[a, b])


def log(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """Element-wise natural logarithm."""
    return _unary_like(ctx, Op.LOG, a, inplace=inplace)


def sin(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """Element-wise sine."""
    return _unary_like(ctx, Op.SIN, a, inplace=inplace)


def cos(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """Element-wise cosine."""
    return _unary_like(ctx, Op.COS, a, inplace=inplace)


def clamp(ctx, a: Tensor, min_: float, max_: float) -> Tensor:
    """Clamp to [min_, max_]. As in ggml the result is a view of ``a``: it clamps in place."""
    _check(min_ <= max_, "clamp", f"min {min_} > max {max_}", InvalidArgumentError)
    return _unary_like(ctx, Op.CLAMP, a, ClampParams(float(min_), float(max_)).pack(), inplace=True)


def leaky_relu(ctx, a: Tensor, negative_slope: float, inplace: bool = False) -> Tensor:
    """x for x > 0, negative_slope * x otherwise."""
    return _unary_like(ctx, Op.LEAKY_RELU, a, LeakyReluParams(float(negative_slope)).pack(),
                       inplace)


def fill(ctx, a: Tensor, c: float, inplace: bool = False) -> Tensor:
    """A tensor of ``a``'s shape with every element ``c``."""
    _check(a.type in (GGMLType.F32, GGMLType.F16), "fill", f"{_ne(a)} must be f32 or f16, got "
           f"{a.type}", TensorTypeError)
    _check(a.is_contiguous(), "fill", f"{_ne(a)} must be contiguous")
    return _unary_like(ctx, Op.FILL, a, FillParams(float(c)).pack(), inplace)
