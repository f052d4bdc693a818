"""Cases for the products and attention: MUL_MAT over every weight type with batch broadcast
and permutations, MUL_MAT_ID (mixture of experts), OUT_PROD, SOFT_MAX with masks, ALiBi and
sinks, ROPE in every mode, and FLASH_ATTN_EXT."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from polydev import GGMLType, RopeMode, Tensor, ops

from .case import Case, CaseContext, case, distinct_per_row, integers, uniform
from .cases_layout import ALL_TYPES

F32, F16, BF16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.I32
PRODUCT_ERR = 5e-4   # test-backend-ops' threshold for MUL_MAT, MUL_MAT_ID, OUT_PROD, FA, CONV_2D
BASE_TYPES = (F32, F16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
              GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K,
              GGMLType.Q6_K, GGMLType.IQ4_NL)


def mul_mat_flops(out: Tensor) -> int:
    """2·M·N·K per matrix of the result."""
    return 2 * out.nelements * out.src[0].ne[0]


def _mul_mat(type_a: GGMLType, type_b: GGMLType, m: int, n: int, k: int, bs=(1, 1),
             nr=(1, 1), per=(0, 1, 2, 3), weight: bool = False) -> Case:
    """a [k, m, bs0, bs1] times b [k, n, bs0·nr0, bs1·nr1]; ``per`` stores both permuted."""
    def build(ctx: CaseContext):
        ne_a = [k, m, bs[0], bs[1]]
        ne_b = [k, n, bs[0] * nr[0], bs[1] * nr[1]]
        if per != (0, 1, 2, 3):   # create in the permuted order, then permute back
            inverse = [per.index(i) for i in range(4)]
            a = ctx.input(type_a, [ne_a[per[i]] for i in range(4)], "a")
            b = ctx.input(type_b, [ne_b[per[i]] for i in range(4)], "b")
            a, b = ctx.permute(a, *inverse), ctx.permute(b, *inverse)
        else:
            make = ctx.weight if weight else ctx.input
            a = make(type_a, ne_a, "a")
            b = ctx.input(type_b, ne_b, "b")
        return ops.mul_mat(ctx, a, b)
    return case("MUL_MAT", build, max_err=PRODUCT_ERR, flops=mul_mat_flops, type_a=type_a,
                type_b=type_b, m=m, n=n, k=k, bs=bs, nr=nr, per=per)


def mul_mat_cases() -> Iterator[Case]:
    for type_a in ALL_TYPES:
        for n in range(1, 10):
            yield _mul_mat(type_a, F32, 16, n, 256)
        yield _mul_mat(type_a, F32, 1, 64, 256)
    for n in (1, 7, 8, 9, 16, 128, 512):
        yield _mul_mat(F32, F32, 1, n, 2048)
    for type_a in BASE_TYPES:
        for type_b in (F32, F16):
            ks = (256, 4) if type_a.traits.block_size == 1 else (256,)
            for k in ks:
                for n in (1, 16):
                    for bs, nr in (((1, 1), (1, 1)), ((1, 1), (2, 1)), ((1, 1), (1, 2)),
                                   ((3, 1), (1, 1)), ((3, 1), (2, 1)), ((3, 2), (1, 1)),
                                   ((3, 2), (2, 1)), ((3, 2), (1, 2)), ((3, 2), (2, 2))):
                        yield _mul_mat(type_a, type_b, 16, n, k, bs, nr)
                for n in (1, 8, 16):
                    for per in ((0, 2, 1, 3), (0, 1, 3, 2), (0, 3, 2, 1)):
                        yield _mul_mat(type_a, type_b, 16, n, k, (2, 3), (1, 1), per)
            yield _mul_mat(type_a, type_b, 16, 8, 1024, (3, 2))
    for type_a, type_b, m, n, k, bs, nr in (
            (F16, F32, 64, 2, 128, (8, 1), (1, 1)), (F16, F32, 83, 2, 128, (8, 1), (4, 1)),
            (F16, F32, 64, 45, 128, (8, 1), (4, 1)), (F16, F32, 128, 45, 64, (8, 1), (4, 1)),
            (F32, F32, 64, 77, 77, (12, 1), (1, 1)), (GGMLType.Q4_0, F32, 576, 512, 576,
                                                      (1, 1), (1, 1)),
            (F16, F16, 64, 32, 65, (1, 1), (1, 1)), (F16, F16, 64, 32, 588, (1, 1), (1, 1)),
            (GGMLType.Q8_0, F32, 6, 4096, 5120, (1, 1), (1, 1))):
        yield _mul_mat(type_a, type_b, m, n, k, bs, nr)
    for type_a in (F16, BF16, F32):
        for m, k in ((1056, 128), (1057, 129)):
            yield _mul_mat(type_a, F32, m, 1, k, (4, 3), (4, 1), (0, 2, 1, 3))
    yield _mul_mat(GGMLType.Q4_K, F32, 128, 7, 512, weight=True)


# --- mixture of experts ---------------------------------------------------------------------

def mul_mat_id_flops(out: Tensor) -> int:
    return 2 * out.nelements * out.src[0].ne[0]


def _mul_mat_id(type_a: GGMLType, n_mats: int, n_used: int, broadcast_b: bool, m: int, n: int,
                k: int, weight: bool = False) -> Case:
    def build(ctx: CaseContext):
        experts = (ctx.weight if weight else ctx.input)(type_a, (k, m, n_mats), "as")
        ids = ctx.input(I32, (n_mats, n), "ids", distinct_per_row(n_mats))
        if n_used != n_mats:
            ids = ctx.view_2d(ids, n_used, n, ids.nb[1])
        b = ctx.input(F32, (k, 1 if broadcast_b else n_used, n), "b")
        return ops.mul_mat_id(ctx, experts, b, ids)
    return case("MUL_MAT_ID", build, max_err=PRODUCT_ERR, flops=mul_mat_id_flops, type_a=type_a,
                type_b=F32, n_mats=n_mats, n_used=n_used, b=broadcast_b, m=m, n=n, k=k)


def mul_mat_id_cases() -> Iterator[Case]:
    for b in (False, True):
        yield _mul_mat_id(F16, 16, 16, b, 32, 1024, 16)
        yield _mul_mat_id(F16, 2, 2, b, 32, 8192, 64)
        yield _mul_mat_id(BF16, 16, 16, b, 50, 200, 64)
    yield _mul_mat_id(F16, 1, 1, False, 8, 16, 1)
    yield _mul_mat_id(GGMLType.Q4_0, 4, 2, False, 2880, 32, 2880)
    for type_a in ALL_TYPES:
        yield _mul_mat_id(type_a, 4, 2, False, 64, 16, 3 * type_a.traits.block_size)
    for type_a in (F32, F16, GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K):
        for n_mats in (4, 8):
            for n_used in (1, 2, 4):
                for b in (False, True):
                    for n in (1, 5, 32, 129):
                        yield _mul_mat_id(type_a, n_mats, n_used, b, 512, n, 256)


def _out_prod(type_a: GGMLType, type_b: GGMLType, m: int, n: int, k: int, bs, nr) -> Case:
    def build(ctx: CaseContext):
        a = ctx.input(type_a, (m, k, bs[0], bs[1]), "a")
        b = ctx.input(type_b, (n, k, bs[0] * nr[0], bs[1] * nr[1]), "b")
        return ops.out_prod(ctx, a, b)
    return case("OUT_PROD", build, max_err=PRODUCT_ERR, flops=mul_mat_flops, type_a=type_a,
                type_b=type_b, m=m, n=n, k=k, bs=bs, nr=nr)


def out_prod_cases() -> Iterator[Case]:
    for type_a in (F32, F16, GGMLType.Q4_0, GGMLType.Q8_0):
        for type_b in (F32, F16):
            for n in (1, 16):
                for k in (1, 16):
                    for bs in ((1, 1), (3, 3)):
                        for nr in ((1, 1), (2, 2)):
                            yield _out_prod(type_a, type_b, 256, n, k, bs, nr)
    for ne2 in (8, 32):
        yield _out_prod(F32, F32, 256, 16, 16, (ne2, 1), (1, 1))


# --- softmax --------------------------------------------------------------------------------

def _soft_max(ne, mask: bool, sinks: bool, m_prec: GGMLType, nr23, scale: float,
              max_bias: float, inplace: bool = False) -> Case:
    def build(ctx: CaseContext):
        a = ctx.input(F32, (ne[0], ne[1], ne[2] * nr23[0], ne[3] * nr23[1]), "a")
        m = ctx.input(m_prec, ne, "mask") if mask else None
        out = ops.soft_max_ext(ctx, a, m, scale, max_bias, inplace=inplace)
        if sinks:
            ops.soft_max_add_sinks(out, ctx.input(F32, (ne[2] * nr23[0],), "sinks"))
        return out
    return case("SOFT_MAX", build, max_err=1e-6, type=F32, ne=ne, mask=mask, sinks=sinks,
                m_prec=m_prec, nr23=nr23, scale=scale, max_bias=max_bias, inplace=inplace)


def soft_max_cases() -> Iterator[Case]:
    for mask in (False, True):
        for sinks in (False, True):
            for max_bias in (0.0, 8.0):
                if not mask and max_bias > 0:
                    continue
                for scale in (1.0, 0.1):
                    for ne0, ne1 in ((16, 16), (1024, 16), (16, 1024)):
                        for m_prec in ((F32, F16) if mask else (F32,)):
                            yield _soft_max((ne0, ne1, 1, 1), mask, sinks, m_prec, (1, 1), scale,
                                            max_bias)
                            yield _soft_max((ne0 - 1, ne1 - 1, 1, 1), mask, sinks, m_prec,
                                            (1, 1), scale, max_bias)
                            if mask and ne0 <= 32 and ne1 <= 32:
                                yield _soft_max((ne0, ne1, 1, 3), mask, sinks, m_prec, (3, 1),
                                                scale, max_bias)
                                yield _soft_max((ne0 - 1, ne1 - 1, 1, 1), mask, sinks, m_prec,
                                                (2, 3), scale, max_bias)
            yield _soft_max((16, 2, 32, 1), mask, sinks, F32, (1, 1), 0.1, 0.0, inplace=True)
    yield _soft_max((200001, 2, 3, 1), True, True, F16, (1, 1), 0.1, 8.0)
    yield _soft_max((200000, 4, 1, 1), False, False, F32, (1, 1), 1.0, 0.0)


# --- rope -----------------------------------------------------------------------------------

def _rope(type_: GGMLType, ne, n_dims: int, mode: int, n_ctx: int = 512, fs: float = 1.0,
          ef: float = 0.0, af: float = 1.0, ff: bool = False, v: bool = False,
          inplace: bool = False, sections=None) -> Case:
    def build(ctx: CaseContext):
        a = ctx.maybe_strided(v, type_, ne, "a")
        per_token = 4 if sections is not None else 1
        pos = ctx.input(I32, (ne[2] * per_token,), "pos", integers(0, n_ctx))
        n_factors = n_dims if mode == RopeMode.VISION else n_dims // 2
        freq = ctx.input(F32, (n_factors,), "freq_factors", uniform(0.9, 1.1)) if ff else None
        if sections is not None:
            return ops.rope_multi(ctx, a, pos, freq, n_dims, sections, mode, n_ctx, 10000.0, fs,
                                  ef, af, 32.0, 1.0, inplace=inplace)
        return ops.rope_ext(ctx, a, pos, freq, n_dims, mode, n_ctx, 10000.0, fs, ef, af, 32.0,
                            1.0, inplace=inplace)
    return case("ROPE", build, type=type_, ne_a=ne, n_dims=n_dims, mode=mode, n_ctx=n_ctx, fs=fs,
                ef=ef, af=af, ff=ff, v=v, inplace=inplace)


def rope_cases() -> Iterator[Case]:
    for type_ in (F32, F16):
        for fs, ef, af in ((1.0, 0.0, 1.0), (1.4245, 0.7465, 1.4245), (0.5, 0.0, 1.0)):
            for ff in (False, True):
                for v in (False, True):
                    yield _rope(type_, (128, 32, 2, 1), 128, RopeMode.NORMAL, fs=fs, ef=ef, af=af,
                                ff=ff, v=v)                                         # llama
                    yield _rope(type_, (64, 8, 2, 1), 64, RopeMode.NEOX, fs=fs, ef=ef, af=af,
                                ff=ff, v=v)                                         # neox
                    yield _rope(type_, (80, 32, 2, 1), 20, RopeMode.NEOX, fs=fs, ef=ef, af=af,
                                ff=ff, v=v)                                         # phi-2
                    yield _rope(type_, (128, 12, 2, 1), 128, RopeMode.MROPE, fs=fs, ef=ef, af=af,
                                ff=ff, v=v, sections=(16, 24, 24, 0))              # qwen2-vl
                    yield _rope(type_, (128, 12, 2, 1), 128, RopeMode.IMROPE, fs=fs, ef=ef,
                                af=af, ff=ff, v=v, sections=(24, 20, 20, 0))       # qwen3-vl
                    yield _rope(type_, (80, 16, 2, 1), 40, RopeMode.VISION, fs=fs, ef=ef, af=af,
                                ff=ff, v=v, sections=(10, 10, 10, 10))             # vision
        for mode in (RopeMode.NORMAL, RopeMode.NEOX):
            yield _rope(type_, (128, 32, 2, 1), 128, mode, inplace=True)
            yield _rope(type_, (128, 32, 512, 1), 128, mode)


# --- flash attention ------------------------------------------------------------------------

def kq_mask(rng: np.random.Generator, t: Tensor) -> np.ndarray:
    """An attention mask: uniform values with about a tenth of the entries -inf, the first
    column always open (no fully masked row)."""
    values = rng.uniform(-1.0, 1.0, size=t.shape).astype(np.float32)
    values[rng.random(t.shape) < 0.1] = -np.inf
    values[..., 0] = 0.0
    return values


def flash_attn_flops(out: Tensor) -> int:
    q, k, v = out.src[0], out.src[1], out.src[2]
    return 2 * q.ne[1] * q.ne[2] * q.ne[3] * k.ne[1] * (k.ne[0] + v.ne[0])


def _flash_attn(hsk: int, hsv: int, nh: int, nr23, kv: int, nb: int, mask: bool, sinks: bool,
                max_bias: float, softcap: float, type_kv: GGMLType) -> Case:
    def build(ctx: CaseContext):
        nr2, nr3 = nr23
        q = ctx.input(F32, (hsk, nb, nh * nr2, nr3), "q")
        k = ctx.input(type_kv, (hsk, kv, nh, nr3), "k")
        v = ctx.input(type_kv, (hsv, kv, nh, nr3), "v")
        m = ctx.input(F16, (kv, nb, 1, nr3), "mask", kq_mask) if mask else None
        out = ops.flash_attn_ext(ctx, q, k, v, m, 1.0 / np.sqrt(hsk), max_bias, softcap)
        if sinks:
            ops.flash_attn_ext_add_sinks(out, ctx.input(F32, (nh * nr2,), "sinks"))
        return out
    return case("FLASH_ATTN_EXT", build, max_err=PRODUCT_ERR, flops=flash_attn_flops, hsk=hsk,
                hsv=hsv, nh=nh, nr23=nr23, kv=kv, nb=nb, mask=mask, sinks=sinks,
                max_bias=max_bias, logit_softcap=softcap, type_KV=type_kv)


def flash_attn_cases() -> Iterator[Case]:
    for hsk, hsv in ((40, 40), (64, 64), (80, 80), (128, 128), (192, 128), (256, 256),
                     (576, 512)):
        for nr23 in ((1, 1), (4, 1), (1, 3)):
            for kv in (113, 512):
                for nb in (1, 3, 32):
                    yield _flash_attn(hsk, hsv, 4, nr23, kv, nb, True, False, 0.0, 0.0, F16)
    for mask, sinks, max_bias, softcap in ((False, False, 0.0, 0.0), (True, True, 0.0, 0.0),
                                           (True, False, 8.0, 0.0), (True, False, 0.0, 10.0),
                                           (True, True, 8.0, 10.0)):
        for type_kv in (F32, F16, BF16):
            yield _flash_attn(128, 128, 4, (4, 1), 512, 7, mask, sinks, max_bias, softcap,
                              type_kv)
    for type_kv in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0):
        yield _flash_attn(128, 128, 4, (1, 1), 512, 8, True, False, 0.0, 0.0, type_kv)
    yield _flash_attn(128, 128, 8, (4, 1), 4096, 1, True, False, 0.0, 0.0, F16)   # long kv


def cases() -> Iterator[Case]:
    for source in (mul_mat_cases, mul_mat_id_cases, out_prod_cases, soft_max_cases, rope_cases,
                   flash_attn_cases):
        yield from source()
