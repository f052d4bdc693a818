"""Element-wise kernels: binary arithmetic with repeat, ADD1, SCALE, SQR, SQRT, LOG, SIN, COS,
CLAMP, LEAKY_RELU, FILL, UNARY and GLU.

Every function here is written against the array module ``xp`` (numpy or CuPy). Half-precision
tensors are computed in float32 and rounded once when stored, as ggml does.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from polydev.ops import (ClampParams, FillParams, GluOp, GluParams, LeakyReluParams, Op,
                         ScaleParams, UnaryOp, UnaryParams)
from polydev.tensor import Tensor

from .broadcast import repeat_views
from .rows import as_rows, row_blocks

_BINARY = {Op.ADD: "add", Op.SUB: "subtract", Op.MUL: "multiply", Op.DIV: "divide"}


def bind_binary(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    fn = getattr(xp, _BINARY[node.op])
    (d, a), b = repeat_views([env.view(node), env.view(node.src[0])], env.view(node.src[1]))
    return lambda: fn(a, b, out=d)


def bind_scale(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    params = ScaleParams.of(node)
    s, bias = params.scale, params.bias
    d, a = env.view(node), env.view(node.src[0])
    if bias == 0.0:
        return lambda: xp.multiply(a, s, out=d)

    def run() -> None:
        xp.multiply(a, s, out=d)
        xp.add(d, bias, out=d)
    return run


def bind_sqr(env, node: Tensor) -> Callable[[], None]:
    d, a = env.view(node), env.view(node.src[0])
    return lambda: env.xp.square(a, out=d)


def bind_sqrt(env, node: Tensor) -> Callable[[], None]:
    d, a = env.view(node), env.view(node.src[0])
    return lambda: env.xp.sqrt(a, out=d)


# --- unary functions: f(xp, x, out) with x float32; out may be x itself ------------------------

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_COEF_A = 0.044715
_GELU_QUICK_COEF = -1.702
_SQRT_HALF = math.sqrt(0.5)


def _sigmoid(xp, x, out):
    e = xp.exp(-x)
    e += 1
    xp.divide(1.0, e, out=out)


def _silu(xp, x, out):
    e = xp.exp(-x)
    e += 1
    xp.divide(x, e, out=out)


def _gelu(xp, x, out):
    inner = x * x
    inner *= _GELU_COEF_A
    inner += 1
    inner *= x
    inner *= _SQRT_2_OVER_PI
    xp.tanh(inner, out=inner)
    inner += 1
    inner *= 0.5
    xp.multiply(x, inner, out=out)


# numpy has no erf. This is Numerical Recipes' Chebyshev fit of erfc (fractional error below
# 1.2e-7 for every x), so 1 + erf is float32-accurate where GELU needs it; numpy ops only, so it
# runs on CuPy too.
def _erf(xp, x):
    a = xp.abs(x)
    t = 1.0 / (1.0 + 0.5 * a)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    return xp.copysign(1.0 - t * xp.exp(-a * a + poly), x)


def _gelu_erf(xp, x, out):
    y = _erf(xp, x * _SQRT_HALF)
    y += 1
    y *= 0.5
    xp.multiply(x, y, out=out)


def _gelu_quick(xp, x, out):
    e = xp.exp(x * _GELU_QUICK_COEF)
    e += 1
    xp.divide(x, e, out=out)


def _hardsigmoid(xp, x, out):
    t = x + 3.0
    t /= 6.0
    xp.clip(t, 0.0, 1.0, out=out)


def _hardswish(xp, x, out):
    t = x + 3.0
    t /= 6.0
    xp.clip(t, 0.0, 1.0, out=t)
    xp.multiply(x, t, out=out)


def _elu(xp, x, out):
    xp.copyto(out, xp.where(x > 0, x, xp.expm1(x)))


def _softplus(xp, x, out):
    xp.copyto(out, xp.where(x > 20.0, x, xp.log1p(xp.exp(xp.minimum(x, 20.0)))))


def _step(xp, x, out):
    xp.copyto(out, x > 0)


UNARY_FUNCTIONS: dict[UnaryOp, Callable[[Any, Any, Any], None]] = {
    UnaryOp.ABS: lambda xp, x, out: xp.abs(x, out=out),
    UnaryOp.SGN: lambda xp, x, out: xp.sign(x, out=out),
    UnaryOp.NEG: lambda xp, x, out: xp.negative(x, out=out),
    UnaryOp.STEP: _step,
    UnaryOp.TANH: lambda xp, x, out: xp.tanh(x, out=out),
    UnaryOp.ELU: _elu,
    UnaryOp.RELU: lambda xp, x, out: xp.maximum(x, 0.0, out=out),
    UnaryOp.SIGMOID: _sigmoid,
    UnaryOp.GELU: _gelu,
    UnaryOp.GELU_QUICK: _gelu_quick,
    UnaryOp.GELU_ERF: _gelu_erf,
    UnaryOp.SILU: _silu,
    UnaryOp.HARDSWISH: _hardswish,
    UnaryOp.HARDSIGMOID: _hardsigmoid,
    UnaryOp.EXP: lambda xp, x, out: xp.exp(x, out=out),
    UnaryOp.EXPM1: lambda xp, x, out: xp.expm1(x, out=out),
    UnaryOp.SOFTPLUS: _softplus,
    UnaryOp.FLOOR: lambda xp, x, out: xp.floor(x, out=out),
    UnaryOp.CEIL: lambda xp, x, out: xp.ceil(x, out=out),
    UnaryOp.ROUND: lambda xp, x, out: xp.copyto(out, xp.trunc(x + xp.copysign(0.5, x))),
    UnaryOp.TRUNC: lambda xp, x, out: xp.trunc(x, out=out),
}


def _map_float32(xp, d, a, fn: Callable[[Any, Any], None]) -> Callable[[], None]:
    """The call computing ``fn(x, out)`` from ``a`` into ``d``: directly for float32, else in
    float32 rounded once on store (ggml's half-precision rule)."""
    if d.dtype == xp.float32 and a.dtype == xp.float32:
        return lambda: fn(a, d)

    def run() -> None:
        x = a.astype(xp.float32)
        fn(x, x)
        xp.copyto(d, x, casting="unsafe")
    return run


def bind_unary(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    fn = UNARY_FUNCTIONS[UnaryParams.of(node).fn]
    return _map_float32(xp, env.view(node), env.view(node.src[0]), lambda x, out: fn(xp, x, out))


_UFUNCS = {Op.LOG: "log", Op.SIN: "sin", Op.COS: "cos"}


def bind_ufunc(env, node: Tensor) -> Callable[[], None]:
    """LOG, SIN and COS."""
    fn = getattr(env.xp, _UFUNCS[node.op])
    return _map_float32(env.xp, env.view(node), env.view(node.src[0]),
                        lambda x, out: fn(x, out=out))


def bind_clamp(env, node: Tensor) -> Callable[[], None]:
    """As clip, in two ufunc calls: numpy's clip costs a few µs more per call, which a mixture
    of experts' router pays every layer of a decode step."""
    xp = env.xp
    params = ClampParams.of(node)
    lo, hi = xp.float32(params.min), xp.float32(params.max)
    d, a = env.view(node), env.view(node.src[0])

    def run() -> None:
        xp.maximum(a, lo, out=d)
        xp.minimum(d, hi, out=d)
    return run


def bind_leaky_relu(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    slope = LeakyReluParams.of(node).negative_slope

    def leaky(x, out):
        xp.copyto(out, xp.where(x > 0, x, x * xp.float32(slope)))
    return _map_float32(xp, env.view(node), env.view(node.src[0]), leaky)


def bind_add1(env, node: Tensor) -> Callable[[], None]:
    d, a, b = env.view(node), env.view(node.src[0]), env.view(node.src[1])
    return lambda: env.xp.add(a, b, out=d, casting="unsafe")


def bind_fill(env, node: Tensor) -> Callable[[], None]:
    c = FillParams.of(node).value
    d = env.view(node)
    return lambda: d.fill(c)


GLU_ACTIVATIONS = {
    GluOp.REGLU: UnaryOp.RELU,
    GluOp.GEGLU: UnaryOp.GELU,
    GluOp.SWIGLU: UnaryOp.SILU,
    GluOp.GEGLU_QUICK: UnaryOp.GELU_QUICK,
    GluOp.GEGLU_ERF: UnaryOp.GELU_ERF,
}


GLU_FUNCTIONS = frozenset(GLU_ACTIVATIONS) | {GluOp.SWIGLU_OAI}


def _glu_combine(xp, node: Tensor) -> Callable[[Any, Any], Any]:
    """f(x, g) -> result for the node's GLU; x is a float32 copy the function may overwrite."""
    params = GluParams.of(node)
    fn = params.fn
    if fn == GluOp.SWIGLU_OAI:
        alpha, limit = params.alpha, params.limit

        def swiglu_oai(x, g):
            xp.minimum(x, limit, out=x)
            e = xp.exp(x * xp.float32(-alpha))
            e += 1
            x /= e
            x *= xp.clip(g, -limit, limit) + xp.float32(1)
            return x
        return swiglu_oai
    act = UNARY_FUNCTIONS[GLU_ACTIVATIONS[fn]]

    def gated(x, g):
        act(xp, x, x)
        x *= g
        return x
    return gated


def bind_glu(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    combine = _glu_combine(xp, node)
    swapped = GluParams.of(node).swapped
    d, a = env.view(node), env.view(node.src[0])
    if len(node.src) > 1 and node.src[1] is not None:
        x, g = a, env.view(node.src[1])
    else:
        n = d.shape[-1]
        x, g = a[..., :n], a[..., n:]
        if swapped:
            x, g = g, x
    if xp is np and d.dtype == np.float32:
        blocked = _bind_glu_by_rows(combine, d, x, g)
        if blocked is not None:
            return blocked
    return lambda: xp.copyto(d, combine(x.astype(xp.float32), g), casting="unsafe")


def _bind_glu_by_rows(combine, d, x, g) -> Callable[[], None] | None:
    """A float32 host GLU computed in the destination, a block of rows at a time (see
    ``rows``); None where the operands are not rows of one stride. The destination never
    shares memory with the sources: the graph allocator does not run GLU in place."""
    n = d.shape[-1]
    d2, x2, g2 = as_rows(d, n), as_rows(x, n), as_rows(g, n)
    if d2 is None or x2 is None or g2 is None:
        return None
    blocks = list(row_blocks(d2.shape[0], n))

    def run() -> None:
        for rows in blocks:
            out = d2[rows]
            np.copyto(out, x2[rows], casting="unsafe")
            combine(out, g2[rows])
    return run
