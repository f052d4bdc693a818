"""Cases for data movement: copies and conversions, row gathers and scatters, repeat, concat,
padding, rolls, windows (ACC/SET), resampling and the generators."""

from __future__ import annotations

import itertools
from typing import Iterator

from polydev import GGMLType, ops
from polydev.ops import ScaleMode
from polydev.types import TYPE_TRAITS

from .case import Case, CaseContext, case, distinct_per_row, integers, uniform

F32, F16, BF16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32, GGMLType.I64
FLOAT_TYPES = (F16, F32)
# every type polydev can put test data in and read back
ALL_TYPES = (F32, F16, BF16) + tuple(t for t in GGMLType if TYPE_TRAITS[t].is_quantized
                                     and TYPE_TRAITS[t].can_dequantize)
QUANT_BITS_SCALE = {GGMLType.Q4_0: 1.0, GGMLType.Q4_1: 1.0, GGMLType.IQ4_NL: 2.0,
                    GGMLType.Q5_0: 0.5, GGMLType.Q5_1: 0.5, GGMLType.Q8_0: 1 / 8}


def quant_step_err(type_dst: GGMLType, n: int, span: float) -> float:
    """test-backend-ops' threshold for a conversion to a legacy quant type: the NMSE of one
    quantized value being one step off, for values uniform in [-span, span]."""
    step = QUANT_BITS_SCALE[type_dst] * span / 8
    return step * step / (span * span * 0.25 * n)


def _copy_err(src: GGMLType, dst: GGMLType, n: int, span: float) -> float:
    if src == dst:
        return 0.0
    if dst in QUANT_BITS_SCALE:
        return quant_step_err(dst, n, span)
    return 1e-6


def _cpy(src_type: GGMLType, dst_type: GGMLType, ne, perm_src=None, perm_dst=None) -> Case:
    span = 150.0

    def build(ctx: CaseContext):
        src = ctx.input(src_type, ne, "src", uniform(-span, span))
        if perm_src:
            src = ctx.permute(src, *perm_src)
        dst = ctx.input(dst_type, src.ne, "dst")
        if perm_dst:
            dst = ctx.permute(dst, *perm_dst)
        return ops.cpy(ctx, src, dst)
    n = ne[0] * ne[1] * ne[2] * ne[3]
    return case("CPY", build, max_err=_copy_err(src_type, dst_type, n, span), type_src=src_type,
                type_dst=dst_type, ne=ne, permute_src=perm_src or (0, 0, 0, 0),
                permute_dst=perm_dst or (0, 0, 0, 0))


def copy_cases() -> Iterator[Case]:
    for type_ in ALL_TYPES:
        nk = TYPE_TRAITS[type_].block_size
        for k in (1, 2, 3):
            yield _cpy(type_, type_, (k * nk, 2, 3, 4))
            yield _cpy(type_, type_, (k * nk, 2, 3, 4), (0, 2, 1, 3))
            yield _cpy(type_, type_, (k * nk, 2, 3, 4), (0, 3, 1, 2), (0, 2, 1, 3))
    for src in (F16, BF16, F32):
        for dst in ALL_TYPES:
            yield _cpy(src, dst, (256, 4, 4, 4))
            yield _cpy(src, dst, (256, 2, 3, 4), (0, 2, 1, 3))
    for src in ALL_TYPES[3:]:       # the float sources were paired with every type above
        yield _cpy(src, F32, (256, 4, 4, 4))
        yield _cpy(src, F32, (256, 2, 3, 4), (0, 2, 1, 3))
    for src, dst in itertools.product(FLOAT_TYPES, FLOAT_TYPES):
        yield _cpy(src, dst, (256, 2, 3, 4), (1, 0, 2, 3))        # not contiguous
    for src, dst in ((F32, I32), (I32, F32)):
        yield _cpy(src, dst, (256, 2, 3, 4))
        yield _cpy(src, dst, (256, 2, 3, 4), (1, 0, 2, 3))
    yield _cpy(I32, I32, (256, 1, 4, 1), (1, 2, 0, 3))
    yield _cpy(F32, F32, (2, 2097121, 1, 1), (1, 0, 2, 3))        # many short rows
    for type_ in (F32, F16, I32):
        for ne in ((10, 10, 10, 1), (2, 3, 5, 7), (1, 8, 17, 1)):
            for view in ("permute", "transpose", "reshape"):
                yield _dup(type_, ne, view)
            yield _cont(type_, ne, (2, 1, 0, 3))
            yield _cont(type_, ne, (0, 2, 1, 3))


def _dup(type_: GGMLType, ne, view: str = "permute") -> Case:
    def build(ctx: CaseContext):
        src = ctx.input(type_, ne, "src")
        if view == "permute":
            src = ctx.permute(src, 0, 2, 1, 3)
        elif view == "transpose":
            src = ctx.transpose(src)
        else:    # a reshape that merges the first two dimensions
            src = ctx.reshape(src, ne[0] * ne[1], ne[2], ne[3])
        return ops.dup(ctx, src)
    return case("DUP", build, max_err=0.0, type=type_, ne=ne, view=view)


def _cont(type_: GGMLType, ne, perm) -> Case:
    def build(ctx: CaseContext):
        return ops.cont(ctx, ctx.permute(ctx.input(type_, ne, "src"), *perm))
    return case("CONT", build, max_err=0.0, type=type_, ne=ne, perm=perm)


# --- rows ------------------------------------------------------------------------------------

def _get_rows(type_: GGMLType, n: int, m: int, r: int, b: int, v: bool) -> Case:
    def build(ctx: CaseContext):
        src = ctx.input(type_, (n, m, b), "src")
        rows = ctx.input(I32, (r, b), "rows", integers(0, m))
        if v:
            rows = ctx.view_2d(rows, r // 2, b, rows.nb[1])
        return ops.get_rows(ctx, src, rows)
    return case("GET_ROWS", build, type=type_, n=n, m=m, r=r, b=b, v=v)


def _get_rows_back(n: int, m: int, r: int, v: bool) -> Case:
    def build(ctx: CaseContext):
        grads = ctx.input(F32, (n, r), "grads")
        rows = ctx.input(I32, (r,), "rows", integers(0, m))
        like = ctx.input(F32, (n, m), "like")
        if v:
            rows = ctx.view_1d(rows, r // 2)
            grads = ctx.view_2d(grads, n, r // 2, grads.nb[1])
        return ops.get_rows_back(ctx, grads, rows, like)
    return case("GET_ROWS_BACK", build, type=F32, n=n, m=m, r=r, v=v)


def _set_rows(src_type: GGMLType, dst_type: GGMLType, idx_type: GGMLType, ne, nr23, r: int,
              v: bool) -> Case:
    d2, d3 = ne[2] * nr23[0], ne[3] * nr23[1]

    def build(ctx: CaseContext):
        dst = ctx.input(dst_type, (ne[0], ne[1], d2, d3), "dst")
        src = ctx.input(src_type, (ne[0], r, d2, d3), "src")
        rows = ctx.input(idx_type, (r, ne[2], ne[3]), "row_idxs", distinct_per_row(ne[1]))
        if v:
            src = ctx.view_4d(src, ne[0], r // 2, d2, d3, src.nb[1], src.nb[2], src.nb[3])
            rows = ctx.view_3d(rows, r // 2, ne[2], ne[3], rows.nb[1], rows.nb[2])
        return ops.set_rows(ctx, dst, src, rows)
    err = (quant_step_err(dst_type, ne[0] * r * d2 * d3, 1.0) * (16 if src_type == F16 else 1)
        if dst_type in QUANT_BITS_SCALE else 1e-7)
    return case("SET_ROWS", build, max_err=err, type_src=src_type, type=dst_type,
                type_idx=idx_type, ne=ne,
                nr23=nr23, r=r, v=v)


def row_cases() -> Iterator[Case]:
    for type_ in (F32, GGMLType.Q4_0):
        yield _get_rows(type_, 300 * 256, 5, 4, 1, False)
        yield _get_rows(type_, 256, 80000, 7000, 2, False)
        yield _get_rows(type_, 256, 5, 4, 700, False)
    yield _get_rows(F32, 1, 8, 2, 1, False)
    for type_ in ALL_TYPES + (I32,):
        for b in (1, 7):
            for v in (False, True):
                yield _get_rows(type_, 256, 5, 4, b, v)
    yield _get_rows_back(1, 8, 2, False)
    yield _get_rows_back(1, 70000, 4, False)
    for v in (False, True):
        yield _get_rows_back(256, 5, 4, v)
    yield _set_rows(F32, F32, I64, (1, 8, 1, 3), (1, 1), 2, False)
    yield _set_rows(F32, F32, I32, (1, 8, 1, 3), (1, 1), 2, False)
    for src in FLOAT_TYPES:
        for dst in (F32, F16, BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
                    GGMLType.Q8_0):
            bs = TYPE_TRAITS[dst].block_size
            for b in (1, 7):
                for v in (False, True):
                    yield _set_rows(src, dst, I64, (256, 5, b, 3), (1, 1), 1, v)
                    yield _set_rows(src, dst, I64, (256, 11, 1, b), (2, 3), 7, v)
                    yield _set_rows(src, dst, I64, (3 * bs, 3, b, 1), (2, 3), 2, v)
                    if bs == 1:
                        yield _set_rows(src, dst, I64, (31, 3, b, 1), (2, 3), 2, v)
    for idx in (I64, I32):
        for v in (False, True):
            yield _set_rows(F16, F16, idx, (1, 8, 1, 3), (1, 1), 2, v)


# --- repeat, concat, pad, roll ----------------------------------------------------------------

def _repeat(type_: GGMLType, ne, nr) -> Case:
    def build(ctx: CaseContext):
        target = ctx.input(type_, [n * r for n, r in zip(ne, nr)], "target")
        return ops.repeat(ctx, ctx.input(type_, ne, "src"), target)
    return case("REPEAT", build, type=type_, ne=ne, nr=nr)


def _concat(type_: GGMLType, ne_a, ne_b_d: int, dim: int, v: int) -> Case:
    def build(ctx: CaseContext):
        ne_b = list(ne_a)
        ne_b[dim] = ne_b_d
        a = ctx.maybe_strided(bool(v & 1), type_, ne_a, "a")
        b = ctx.maybe_strided(bool(v & 2), type_, ne_b, "b")
        return ops.concat(ctx, a, b, dim)
    return case("CONCAT", build, type=type_, ne_a=ne_a, ne_b_d=ne_b_d, dim=dim, v=v)


def _pad(ne, lp, rp, circular: bool = False, v: bool = False) -> Case:
    def build(ctx: CaseContext):
        a = ctx.maybe_strided(v, F32, ne, "a")
        return ops.pad_ext(ctx, a, lp[0], rp[0], lp[1], rp[1], lp[2], rp[2], lp[3], rp[3],
                           circular=circular)
    return case("PAD", build, type=F32, ne_a=ne, lp=lp, rp=rp, v=v, circular=circular)


def _pad_reflect(ne, p0: int, p1: int) -> Case:
    def build(ctx: CaseContext):
        return ops.pad_reflect_1d(ctx, ctx.input(F32, ne, "a"), p0, p1)
    return case("PAD_REFLECT_1D", build, type=F32, ne_a=ne, pad_0=p0, pad_1=p1)


def _roll(ne, shifts) -> Case:
    def build(ctx: CaseContext):
        return ops.roll(ctx, ctx.input(F32, ne, "a"), *shifts)
    return case("ROLL", build, type=F32, ne=ne, shifts=shifts)


def shape_cases() -> Iterator[Case]:
    for ne3 in (1, 3):
        ne = (10, 5, 4, ne3)
        for nr in ((1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 1), (1, 1, 1, 2)):
            yield _repeat(F32, ne, nr)
        for type_ in (F16, I32, GGMLType.I16, BF16):
            yield _repeat(type_, ne, (2, 1, 1, 1))
    for dim in range(4):
        for v in range(4):
            for type_ in (F32, I32):
                yield _concat(type_, (11, 12, 13, 14), 7, dim, v)
    for lp, rp in (((0, 0, 0, 0), (1, 1, 1, 1)), ((1, 2, 0, 0), (0, 3, 1, 0)),
                   ((2, 1, 1, 1), (1, 2, 0, 1))):
        for v in (False, True):
            yield _pad((512, 512, 3, 1) if lp == (0, 0, 0, 0) else (33, 17, 2, 3), lp, rp,
                       v=v)
        yield _pad((33, 17, 2, 3), lp, rp, circular=True)
    for ne in ((512, 34, 2, 1), (3000, 384, 4, 1)):
        yield _pad_reflect(ne, 10, 9)
    for shifts in ((3, 0, 0, 0), (-1, 2, 0, 0), (0, 0, 1, -2), (7, -3, 2, 1)):
        yield _roll((64, 10, 5, 3), shifts)


# --- windows: ACC and SET ---------------------------------------------------------------------

def _acc(ne_a, ne_b) -> Case:
    def build(ctx: CaseContext):
        a = ctx.input(F32, ne_a, "a")
        b = ctx.input(F32, ne_b, "b")
        offset = a.nb[1] + a.nb[2] + a.nb[3] + 4   # one step in from every edge
        return ops.acc(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset)
    return case("ACC", build, type=F32, ne_a=ne_a, ne_b=ne_b)


def _set(type_: GGMLType, ne, dim: int, inplace: bool) -> Case:
    def build(ctx: CaseContext):
        dst = ctx.input(type_, ne, "dst")
        ne_src = list(ne)
        ne_src[dim] = max(1, ne[dim] // 2)
        src = ctx.input(type_, ne_src, "src")
        offset = (ne[dim] - ne_src[dim]) * dst.nb[dim]
        return ops.set_(ctx, dst, src, dst.nb[1], dst.nb[2], dst.nb[3], offset, inplace=inplace)
    return case("SET", build, type_src=type_, type_dst=type_, ne=ne, dim=dim, inplace=inplace)


def window_cases() -> Iterator[Case]:
    yield _acc((256, 17, 2, 3), (128, 16, 1, 2))
    yield _acc((64, 5, 4, 3), (1, 1, 1, 1))
    for type_ in (F32, I32):
        for dim in (1, 2, 3):
            for inplace in (False, True):
                yield _set(type_, (6, 5, 4, 3), dim, inplace)


# --- resampling and generators -----------------------------------------------------------------

def _interpolate(ne, ne_to, mode: int) -> Case:
    def build(ctx: CaseContext):
        return ops.interpolate(ctx, ctx.input(F32, ne, "a"), *ne_to, mode)
    return case("UPSCALE", build, type=F32, ne=ne, ne_tgt=ne_to, mode=mode)


MODES = {"nearest": ScaleMode.NEAREST, "bilinear": ScaleMode.BILINEAR,
         "bicubic": ScaleMode.BICUBIC,
         "bilinear|align_corners": ScaleMode.BILINEAR | ScaleMode.ALIGN_CORNERS,
         "bicubic|align_corners": ScaleMode.BICUBIC | ScaleMode.ALIGN_CORNERS,
         "bilinear|antialias": ScaleMode.BILINEAR | ScaleMode.ANTIALIAS}


def generator_cases() -> Iterator[Case]:
    for mode in MODES.values():
        yield _interpolate((512, 512, 3, 2), (1024, 1024, 3, 2), int(mode))
        yield _interpolate((2, 5, 7, 11), (5, 7, 11, 13), int(mode))
        yield _interpolate((5, 7, 11, 13), (2, 5, 7, 11), int(mode))
        yield _interpolate((37, 23, 3, 2), (13, 41, 3, 2), int(mode))
    for start, stop, step in ((0.0, 10.0, 1.0), (-4.0, 5.5, 0.5), (3.0, 7.0, 0.3)):
        def build(ctx: CaseContext, start=start, stop=stop, step=step):
            return ops.arange(ctx, start, stop, step)
        yield case("ARANGE", build, type=F32, start=start, stop=stop, step=step)
    for dim, max_period in ((320, 10000), (321, 10000), (128, 5000)):
        def build(ctx: CaseContext, dim=dim, max_period=max_period):
            steps = ctx.input(F32, (12,), "timesteps", uniform(0.0, 1000.0))
            return ops.timestep_embedding(ctx, steps, dim, max_period)
        yield case("TIMESTEP_EMBEDDING", build, type=F32, ne_a=(12, 1, 1, 1), dim=dim,
                   max_period=max_period)
    for ne, n_past in (((10, 10, 1, 1), 5), ((10, 10, 3, 1), 5), ((10, 10, 3, 2), 5)):
        def build(ctx: CaseContext, ne=ne, n_past=n_past):
            return ops.diag_mask_inf(ctx, ctx.input(F32, ne, "a"), n_past)
        yield case("DIAG_MASK_INF", build, type=F32, ne=ne, n_past=n_past)


def cases() -> Iterator[Case]:
    for source in (copy_cases, row_cases, shape_cases, window_cases, generator_cases):
        yield from source()
