"""Cases for element-wise math, reductions, sorting and normalisation.

The sweeps follow test-backend-ops: f16 and f32, contiguous and strided (``v``) sources, the
{128,2,2,2} and odd {5,7,11,13} shapes, the broadcast factors ``nr`` of the binary ops, and the
eps sweep of the norms.
"""

from __future__ import annotations

from typing import Iterator

from polydev import GGMLType, GluOp, UnaryOp, ops
from polydev.ops import SortOrder

from .case import Case, CaseContext, case, index_set_mismatch, integers, shuffled_rows, uniform

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32
FLOAT_TYPES = (F16, F32)
SHAPES = ((128, 2, 2, 2), (5, 7, 11, 13))


# --- unary and glu ----------------------------------------------------------------------------

def _unary(fn: UnaryOp, type_: GGMLType, ne, v: bool) -> Case:
    # the extended range catches NaNs in GELU; f16 exp would overflow to inf on some backends
    # and saturate on others, so it stays in range (as in test-backend-ops)
    span = 10.0 if type_ == F16 and fn in (UnaryOp.EXP, UnaryOp.EXPM1) else 150.0

    def build(ctx: CaseContext):
        return ops.unary(ctx, ctx.maybe_strided(v, type_, ne, "a", uniform(-span, span)), fn)
    return case(fn.name, build, type=type_, ne_a=ne, v=v)


def _glu(fn: GluOp, type_: GGMLType, ne, v: bool, swapped: bool) -> Case:
    def build(ctx: CaseContext):   # the fused form splits rows of twice the width in halves
        a = ctx.maybe_strided(v, type_, (2 * ne[0],) + tuple(ne[1:]), "a")
        return ops.glu(ctx, a, fn, swapped)
    return case(fn.name, build, type=type_, ne_a=ne, v=v, swapped=swapped)


def _glu_split(fn: GluOp, type_: GGMLType, ne, v: bool) -> Case:
    def build(ctx: CaseContext):
        a = ctx.maybe_strided(v, type_, ne, "a")
        b = ctx.maybe_strided(v, type_, ne, "b")
        return ops.glu_split(ctx, a, b, fn)
    return case(fn.name, build, type=type_, ne_a=ne, v=v, split=True)


def _swiglu_oai(ne, v: bool, alpha: float, limit: float) -> Case:
    def build(ctx: CaseContext):
        a = ctx.maybe_strided(v, F32, ne, "a")
        b = ctx.maybe_strided(v, F32, ne, "b")
        return ops.swiglu_oai(ctx, a, b, alpha, limit)
    return case("SWIGLU_OAI", build, type=F32, ne_a=ne, v=v, alpha=alpha, limit=limit)


def unary_cases() -> Iterator[Case]:
    for type_ in FLOAT_TYPES:
        for v in (False, True):
            for fn in UnaryOp:
                if fn == UnaryOp.XIELU:   # needs its own parameters; polydev has no builder
                    continue
                for ne in SHAPES:
                    yield _unary(fn, type_, ne, v)


def glu_cases() -> Iterator[Case]:
    for type_ in FLOAT_TYPES:
        for v in (False, True):
            for fn in GluOp:
                if fn == GluOp.SWIGLU_OAI:
                    continue
                for swapped in (False, True):
                    for ne in SHAPES:
                        yield _glu(fn, type_, ne, v, swapped)
                for ne in SHAPES:
                    yield _glu_split(fn, type_, ne, v)
    for v in (False, True):
        for alpha in (0.5, 1.702):
            for limit in (2.0, 7.0):
                yield _swiglu_oai((128, 2, 2, 2), v, alpha, limit)


# --- binary broadcast and scalar element-wise ops -------------------------------------------

BINARY = {"ADD": ops.add, "SUB": ops.sub, "MUL": ops.mul, "DIV": ops.div}


def _binary(name: str, type_: GGMLType, ne, nr, perm1: bool = False,
            src_overlap: bool = False, inplace: bool = False) -> Case:
    # MUL and DIV misbehave near zero, so their inputs stay near 1 (as in test-backend-ops)
    init = uniform(0.9, 1.1) if name in ("MUL", "DIV") else None

    def build(ctx: CaseContext):
        a = ctx.input(type_, [n * r for n, r in zip(ne, nr)], "a", init)
        if perm1:
            b = ctx.input(type_, (ne[1], ne[2], ne[0], ne[3]), "b", init)
            b = ctx.permute(b, 1, 2, 0, 3)
        elif src_overlap:   # a and b overlap in memory
            third = ne[3] // 3
            b = ctx.view_4d(a, ne[0], ne[1], ne[2], 2 * third, a.nb[1], a.nb[2], a.nb[3],
                            third * a.nb[3])
            a = ctx.view_4d(a, ne[0], ne[1], ne[2], 2 * third, a.nb[1], a.nb[2], a.nb[3], 0)
        else:
            b = ctx.input(type_, ne, "b", init)
        return BINARY[name](ctx, a, b, inplace=inplace)
    return case(name, build, type=type_, ne=ne, nr=nr, nf=1, perm1=perm1,
                src_overlap=src_overlap, inplace=inplace)


BROADCASTS = ((1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2), (1, 1, 2, 2),
              (1, 2, 2, 2), (2, 2, 2, 2))


def binary_cases() -> Iterator[Case]:
    for type_ in FLOAT_TYPES:
        for perm1 in (False, True):
            shapes = [((1, 1, 8, 1), (1, 1, 1, 1)), ((1, 1, 1, 1), (32, 1, 1, 1)),
                      ((1, 1, 320, 320), (1, 1, 1, 1)), ((10, 5, 1, 1), (1, 1, 1, 1)),
                      ((10, 5, 4, 1), (1, 1, 1, 1))]
            shapes += [((10, 5, 4, 3), nr) for nr in BROADCASTS]
            for ne, nr in shapes:
                for name in BINARY:
                    yield _binary(name, type_, ne, nr, perm1)
        for ne in ((10, 5, 4, 6), (10, 5, 4, 5), (1, 1, 120, 120), (1, 1, 4, 320)):
            for name in BINARY:
                yield _binary(name, type_, ne, (1, 1, 1, 1), src_overlap=True)
        for ne, nr in (((1280, 1, 1, 1), (1, 16, 16, 1)), ((1280, 16, 16, 1), (1, 1, 1, 1)),
                       ((1, 1, 1280, 1), (16, 16, 1, 1)), ((5120, 1, 1, 1), (1, 256, 1, 1))):
            for name in BINARY:
                yield _binary(name, type_, ne, nr)
    for name in BINARY:
        yield _binary(name, F32, (16, 5, 4, 3), (1, 1, 1, 1), inplace=True)


def _scale(ne, s: float, b: float, inplace: bool = False) -> Case:
    def build(ctx: CaseContext):
        return ops.scale(ctx, ctx.input(F32, ne, "a"), s, b, inplace=inplace)
    return case("SCALE", build, type=F32, ne=ne, scale=s, bias=b, inplace=inplace)


def _elementwise(name: str, type_: GGMLType, ne, make, init=None, **params) -> Case:
    def build(ctx: CaseContext):
        return make(ctx, ctx.input(type_, ne, "a", init))
    return case(name, build, type=type_, ne=ne, **params)


def scalar_op_cases() -> Iterator[Case]:
    yield _scale((10, 10, 10, 10), 2.0, 0.0)
    yield _scale((10, 10, 10, 10), 2.0, 1.0)
    yield _scale((10, 10, 10, 10), 2.0, 1.0, inplace=True)
    yield _scale((100, 10, 10, 10), 2.0, 1.0)
    for type_ in FLOAT_TYPES:
        for ne in ((10, 5, 4, 3), (7, 1, 5, 3)):
            yield _elementwise("SQR", type_, ne, ops.sqr)
            yield _elementwise("SQRT", type_, ne, ops.sqrt, uniform(50.0, 100.0))
            yield _elementwise("LOG", type_, ne, ops.log, uniform(0.9, 1.1))
            yield _elementwise("SIN", type_, ne, ops.sin, uniform(-6.5, 6.5))
            yield _elementwise("COS", type_, ne, ops.cos, uniform(-6.5, 6.5))
            for lo, hi in ((-0.5, 0.5), (-0.1, 0.9)):
                yield _elementwise("CLAMP", type_, ne, lambda c, a, lo=lo, hi=hi:
                                   ops.clamp(c, a, lo, hi), min=lo, max=hi)
            yield _elementwise("LEAKY_RELU", type_, ne, lambda c, a: ops.leaky_relu(c, a, 0.1),
                               negative_slope=0.1)
            for value in (0.0, 2.0, -1.5):
                yield _elementwise("FILL", type_, ne, lambda c, a, x=value: ops.fill(c, a, x),
                                   c=value)
    for ne in ((10, 5, 4, 3), (5, 7, 11, 13)):
        def build(ctx: CaseContext, ne=ne):
            return ops.add1(ctx, ctx.input(F32, ne, "a"), ctx.input(F32, (1,), "b"))
        yield case("ADD1", build, type=F32, ne=ne)


# --- reductions, scans and sorting -----------------------------------------------------------

def _reduce(name: str, make, type_: GGMLType, ne, v: bool = False, init=None) -> Case:
    def build(ctx: CaseContext):
        return make(ctx, ctx.maybe_strided(v, type_, ne, "a", init))
    return case(name, build, type=type_, ne=ne, v=v)


def reduction_cases() -> Iterator[Case]:
    for ne in ((10, 5, 4, 3), (33, 1, 1, 1), (1024, 15, 2, 1)):
        for v in (False, True):
            yield _reduce("SUM", ops.sum_, F32, ne, v)
            yield _reduce("SUM_ROWS", ops.sum_rows, F32, ne, v)
            yield _reduce("MEAN", ops.mean, F32, ne, v)
            yield _reduce("CUMSUM", ops.cumsum, F32, ne, v)
    yield _reduce("SUM", ops.sum_, F16, (10, 5, 4, 3))
    yield _reduce("SUM_ROWS", ops.sum_rows, F16, (10, 5, 4, 3))
    for ne in ((32, 1), (32, 513), (100, 10), (1024, 10), (1024, 12), (2000, 10), (5438, 3)):
        yield _reduce("ARGMAX", ops.argmax, F32, ne + (1, 1), init=shuffled_rows())
    for ne in ((4, 500, 1, 1), (4, 5000, 1, 1)):
        def build(ctx: CaseContext, ne=ne):
            a = ctx.input(I32, ne, "a", integers(0, 3))
            b = ctx.input(I32, ne, "b", integers(0, 3))
            return ops.count_equal(ctx, a, b)
        yield case("COUNT_EQUAL", build, max_err=0.0, type=I32, ne=ne)
    for order in SortOrder:
        for ne in ((8, 1, 1, 1), (16, 10, 10, 10), (60, 10, 10, 10), (1023, 2, 1, 3),
                   (1024, 2, 1, 3), (1025, 2, 1, 3), (2047, 2, 1, 3)):
            def build(ctx: CaseContext, ne=ne, order=order):
                return ops.argsort(ctx, ctx.input(F32, ne, "a", shuffled_rows()), order)
            yield case("ARGSORT", build, max_err=0.0, type=F32, ne=ne, order=order)
    for ne in ((16, 10, 10, 10), (60, 10, 10, 10), (1023, 2, 1, 3), (1025, 2, 1, 3)):
        for k in (1, 4, 15):
            def build(ctx: CaseContext, ne=ne, k=k):
                return ops.top_k(ctx, ctx.input(F32, ne, "a", shuffled_rows()), k)
            yield case("TOP_K", build, max_err=0.0, err=index_set_mismatch, type=F32, ne=ne,
                       k=k, ties=False)


# --- normalisation ---------------------------------------------------------------------------

def _norm(name: str, ne, v: bool, eps: float, inplace: bool = False) -> Case:
    make = {"NORM": ops.norm, "RMS_NORM": ops.rms_norm, "L2_NORM": ops.l2_norm}[name]
    # inputs in [-10, 10]: a row of tiny values would make eps dominate (test-backend-ops)
    def build(ctx: CaseContext):
        a = ctx.maybe_strided(v, F32, ne, "a", uniform(-10.0, 10.0))
        return make(ctx, a, eps, inplace=inplace)
    return case(name, build, type=F32, ne=ne, v=v, eps=eps, inplace=inplace)


def norm_cases() -> Iterator[Case]:
    for eps in (0.0, 1e-6, 1e-4, 1e-1, 10.0):
        for n in (64, 1025, 33, 260):
            for v in (False, True):
                yield _norm("NORM", (n, 5, 4, 3), v, eps)
                yield _norm("RMS_NORM", (n, 5, 4, 3), v, eps)
            yield _norm("L2_NORM", (n, 5, 4, 3), False, eps)
    yield _norm("RMS_NORM", (64, 5, 4, 3), False, 1e-6, inplace=True)
    yield _norm("NORM", (64, 5, 4, 3), False, 1e-6, inplace=True)
    for ne, groups in (((64, 64, 320, 1), 32), ((9, 9, 1280, 1), 32), ((64, 64, 320, 1), 8),
                       ((5, 7, 30, 2), 7)):
        def build(ctx: CaseContext, ne=ne, groups=groups):
            return ops.group_norm(ctx, ctx.input(F32, ne, "a"), groups, 1e-6)
        yield case("GROUP_NORM", build, type=F32, ne=ne, num_groups=groups, eps=1e-6)


def cases() -> Iterator[Case]:
    for source in (unary_cases, glu_cases, binary_cases, scalar_op_cases, reduction_cases,
                   norm_cases):
        yield from source()
