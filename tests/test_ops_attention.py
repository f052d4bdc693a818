"""FLASH_ATTN_EXT on every device against an independent float64 reference (threshold 5e-4 as
test-backend-ops), and against the unfused graph it replaces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polydev import GGMLType, RopeMode, dequantize, ops
from polydev.errors import InvalidArgumentError, ShapeError, TensorTypeError

from conftest import assert_close, compute
from test_ops import _alibi, f32, random_blocks


def _attention_ref(q, k, v, mask=None, scale=1.0, max_bias=0.0, softcap=0.0, sinks=None):
    """q (s, H, n_q, D), k (s, Hkv, n_kv, D), v (s, Hkv, n_kv, Dv), mask (m3, m2, >=n_q, n_kv)
    -> (s, n_q, H, Dv), all float64."""
    n_seq, n_head, n_q, _ = q.shape
    group = n_head // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("shqd,shkd->shqk", q, k) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        heads = np.arange(n_head) % mask.shape[1]
        seqs = np.arange(n_seq) % mask.shape[0]
        m = mask[seqs][:, heads][:, :, :n_q].astype(np.float64)
        slopes = _alibi(n_head, max_bias) if max_bias > 0 else np.ones(n_head)
        s = s + slopes[None, :, None, None] * m
    logits = s if sinks is None else np.concatenate(
        [s, np.broadcast_to(sinks[None, :, None, None], s.shape[:3] + (1,))], axis=-1)
    top = logits.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    e = np.exp(logits - top)
    p = e / np.where(e.sum(-1, keepdims=True) > 0, e.sum(-1, keepdims=True), 1)
    out = np.einsum("shqk,shkd->shqd", p[..., :s.shape[-1]], v)
    return out.transpose(0, 2, 1, 3)


def _causal_mask(rng, n_q, n_kv, n_pad=0, heads=1, seqs=1):
    past = n_kv - n_q
    m = np.where(np.arange(n_kv)[None, :] > past + np.arange(n_q + n_pad)[:, None], -np.inf, 0.0)
    m = m + rng.uniform(-1, 0, size=m.shape) * (m == 0)        # finite entries vary too
    return np.broadcast_to(m, (seqs, heads) + m.shape).astype(np.float16).copy()


CASES = [  # n_seq, n_head, n_head_kv, n_q, n_kv, D, Dv
    (1, 4, 4, 1, 37, 64, 64),
    (1, 8, 2, 7, 64, 32, 32),        # grouped-query attention
    (2, 4, 1, 5, 129, 16, 24),       # multi-query, two sequences, Dv != D
    (1, 2, 2, 33, 33, 128, 128),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("kv_type", [np.float32, np.float16])
def test_flash_attn_ext(backend, rng, case, kv_type):
    n_seq, n_head, n_head_kv, n_q, n_kv, dk, dv = case
    q = f32(rng, (n_seq, n_head, n_q, dk))
    k = f32(rng, (n_seq, n_head_kv, n_kv, dk)).astype(kv_type)
    v = f32(rng, (n_seq, n_head_kv, n_kv, dv)).astype(kv_type)
    mask = _causal_mask(rng, n_q, n_kv, n_pad=3)
    scale = 1 / math.sqrt(dk)
    out = compute(backend, lambda ctx, a, b, c, m: ops.flash_attn_ext(ctx, a, b, c, m, scale),
                  q, k, v, mask)
    ref = _attention_ref(*(x.astype(np.float64) for x in (q, k, v)), mask, scale)
    assert_close(out, ref, 5e-4)


@pytest.mark.parametrize("max_bias,softcap", [(0.0, 0.0), (8.0, 0.0), (0.0, 20.0), (4.0, 5.0)])
def test_flash_attn_ext_alibi_softcap_sinks(backend, rng, max_bias, softcap):
    q, k = f32(rng, (1, 8, 6, 32), -3, 3), f32(rng, (1, 2, 40, 32), -3, 3)
    v = f32(rng, (1, 2, 40, 32))
    mask = _causal_mask(rng, 6, 40, heads=4)              # one mask per head pair: h % 4
    sinks = f32(rng, (8,), -2, 2)

    def build(ctx, a, b, c, m, s):
        t = ops.flash_attn_ext(ctx, a, b, c, m, 0.3, max_bias, softcap)
        ops.flash_attn_ext_add_sinks(t, s)
        return t
    out = compute(backend, build, q, k, v, mask, sinks)
    ref = _attention_ref(*(x.astype(np.float64) for x in (q, k, v)), mask, 0.3, max_bias,
                         softcap, sinks.astype(np.float64))
    assert_close(out, ref, 5e-4)


def test_flash_attn_ext_without_mask_and_fully_masked_rows(backend, rng):
    q, k, v = f32(rng, (1, 2, 3, 16)), f32(rng, (1, 2, 10, 16)), f32(rng, (1, 2, 10, 16))
    out = compute(backend, lambda ctx, a, b, c: ops.flash_attn_ext(ctx, a, b, c, None, 0.25),
                  q, k, v)
    assert_close(out, _attention_ref(*(x.astype(np.float64) for x in (q, k, v)), None, 0.25),
                 5e-4)
    mask = np.zeros((1, 1, 3, 10), np.float16)
    mask[..., 1, :] = -np.inf                             # query row 1 sees nothing: zeros
    out = compute(backend, lambda ctx, a, b, c, m: ops.flash_attn_ext(ctx, a, b, c, m, 0.25),
                  q, k, v, mask)
    assert np.all(out[0, 1] == 0)
    assert_close(out, _attention_ref(*(x.astype(np.float64) for x in (q, k, v)), mask, 0.25),
                 5e-4)


def test_flash_attn_ext_in_blocks_of_query_rows(cpu, rng, monkeypatch):
    """The array kernel splits many queries into blocks of rows (bounded working memory); a
    budget of 3 rows' scores makes blocks of 3, 3, ... and a last short one."""
    from polydev.backends.array import attention

    n_head, n_kv = 4, 40
    monkeypatch.setattr(attention, "HOST_SCORE_BLOCK", 3 * n_head * n_kv)
    q, k, v = f32(rng, (1, n_head, 17, 32)), f32(rng, (1, 2, n_kv, 32)), f32(rng, (1, 2, n_kv, 32))
    mask = _causal_mask(rng, 17, n_kv)
    out = compute(cpu, lambda ctx, a, b, c, m: ops.flash_attn_ext(ctx, a, b, c, m, 0.2),
                  q, k, v, mask)
    ref = _attention_ref(*(x.astype(np.float64) for x in (q, k, v)), mask, 0.2)
    assert_close(out, ref, 5e-4)


@pytest.mark.parametrize("qtype", [GGMLType.Q8_0, GGMLType.Q4_0], ids=str)
def test_flash_attn_ext_quantized_kv(backend, rng, qtype):
    n_kv, d = 24, 64
    q = f32(rng, (1, 4, 3, d))
    kb, vb = random_blocks(rng, qtype, 2 * n_kv, d), random_blocks(rng, qtype, 2 * n_kv, d)
    mask = _causal_mask(rng, 3, n_kv)
    out = compute(backend, lambda ctx, a, b, c, m: ops.flash_attn_ext(ctx, a, b, c, m, 0.125),
                  q, kb.reshape(1, 2, n_kv, -1), vb.reshape(1, 2, n_kv, -1), mask,
                  types=[None, qtype, qtype, None])
    k = dequantize(kb, qtype).reshape(1, 2, n_kv, d).astype(np.float64)
    v = dequantize(vb, qtype).reshape(1, 2, n_kv, d).astype(np.float64)
    assert_close(out, _attention_ref(q.astype(np.float64), k, v, mask, 0.125), 5e-4)


def test_flash_attn_ext_of_permuted_q(backend, rng):
    """llama.cpp's layout: q arrives as [D, H, n_q] and is permuted to [D, n_q, H]."""
    q = f32(rng, (1, 5, 4, 32))                      # numpy (1, n_q, H, D)
    k, v = f32(rng, (1, 4, 9, 32)), f32(rng, (1, 4, 9, 32))
    mask = _causal_mask(rng, 5, 9)
    out = compute(backend, lambda ctx, a, b, c, m: ops.flash_attn_ext(
        ctx, ops.permute(ctx, a, 0, 2, 1, 3), b, c, m, 0.2), q, k, v, mask)
    ref = _attention_ref(q.transpose(0, 2, 1, 3).astype(np.float64), k.astype(np.float64),
                         v.astype(np.float64), mask, 0.2)
    assert_close(out, ref, 5e-4)


def test_flash_attn_ext_equals_the_unfused_graph(backend, rng):
    """The fused op and mul_mat -> soft_max_ext -> mul_mat agree (fusing is not a new op)."""
    q, k, v = f32(rng, (1, 4, 6, 32)), f32(rng, (1, 4, 20, 32)), f32(rng, (1, 4, 20, 32))
    mask = _causal_mask(rng, 6, 20)

    def fused(ctx, a, b, c, m):
        return ops.flash_attn_ext(ctx, a, b, c, m, 0.2)

    def unfused(ctx, a, b, c, m):
        kq = ops.soft_max_ext(ctx, ops.mul_mat(ctx, b, a), ops.cont(ctx, m), 0.2)   # (kv, q, H)
        kqv = ops.mul_mat(ctx, ops.cont(ctx, ctx.transpose(c)), kq)                 # (D, q, H)
        return ops.cont(ctx, ops.permute(ctx, kqv, 0, 2, 1, 3))                     # (D, H, q)
    a = compute(backend, fused, q, k, v, mask)
    b = compute(backend, unfused, q, k, v, mask.astype(np.float32))
    assert_close(a, b, 1e-10)


def test_flash_attn_ext_validates():
    from polydev import Context
    ctx = Context()
    q = ctx.new_tensor(GGMLType.F32, (32, 4, 8))
    k = ctx.new_tensor(GGMLType.F16, (32, 10, 3))
    v = ctx.new_tensor(GGMLType.F16, (32, 10, 3))
    with pytest.raises(ShapeError):
        ops.flash_attn_ext(ctx, q, k, v, None, 1.0)       # 8 heads over 3 kv heads
    k2, v2 = ctx.new_tensor(GGMLType.F16, (32, 10, 2)), ctx.new_tensor(GGMLType.F16, (32, 10, 2))
    with pytest.raises(TensorTypeError):
        ops.flash_attn_ext(ctx, q, k2, v2, ctx.new_tensor(GGMLType.F32, (10, 4)), 1.0)


# --- multi-section RoPE ----------------------------------------------------------------------

def _pair_source(i, sections, mode):
    """Which of the 4 positions drives rotation pair i, and its exponent step (the reference
    spells out ggml's documented rules pair by pair)."""
    s0, s1, s2, s3 = sections
    sector = i % (s0 + s1 + s2 + s3)
    if mode == RopeMode.IMROPE:
        if sector % 3 == 1 and sector < 3 * s1:
            return 1, i
        if sector % 3 == 2 and sector < 3 * s2:
            return 2, i
        if sector % 3 == 0 and sector < 3 * s0:
            return 0, i
        return 3, i
    bounds = [0, s0, s0 + s1, s0 + s1 + s2]
    which = 0 if sector < s0 else 1 if sector < s0 + s1 else 2 if sector < s0 + s1 + s2 else 3
    return which, (sector - bounds[which]) if mode == RopeMode.VISION else i


def _mrope_ref(x, pos4, n_dims, sections, mode, freq_base=10000.0, freq_scale=1.0,
               freq_factors=None):
    x = x.astype(np.float64).copy()
    n_pairs = n_dims if mode == RopeMode.VISION else n_dims // 2
    theta = np.empty((pos4.shape[1], n_pairs))
    for i in range(n_pairs):
        which, step = _pair_source(i, sections, mode)
        theta[:, i] = pos4[which] * freq_base ** (-2.0 * step / n_dims)
    if freq_factors is not None:       # one divisor per rotated pair
        theta /= freq_factors[:n_pairs]
    theta *= freq_scale
    cos, sin = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    x0, x1 = x[..., :n_pairs].copy(), x[..., n_pairs:2 * n_pairs].copy()
    x[..., :n_pairs], x[..., n_pairs:2 * n_pairs] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return x


@pytest.mark.parametrize("mode,head_dim,n_dims,sections", [
    (RopeMode.MROPE, 128, 128, (16, 24, 24, 0)),          # Qwen2-VL
    (RopeMode.MROPE, 96, 64, (8, 12, 12, 0)),             # part of the row rotated
    (RopeMode.IMROPE, 128, 128, (24, 20, 20, 0)),         # Qwen3-VL
    (RopeMode.VISION, 80, 40, (10, 10, 10, 10)),          # vision encoder
], ids=["mrope", "mrope-partial", "imrope", "vision"])
def test_rope_multi(backend, rng, mode, head_dim, n_dims, sections):
    n_tokens = 6
    a = f32(rng, (1, n_tokens, 3, head_dim))
    pos4 = rng.integers(0, 500, size=(4, n_tokens)).astype(np.int32)
    out = compute(backend, lambda ctx, x, p: ops.rope_multi(
        ctx, x, p, None, n_dims, sections, mode, freq_base=10000.0, freq_scale=0.5), a,
        pos4.reshape(-1))
    assert_close(out, _mrope_ref(a, pos4, n_dims, sections, mode, freq_scale=0.5))


@pytest.mark.parametrize("mode,head_dim,n_dims,sections", [
    (RopeMode.MROPE, 128, 128, (16, 24, 24, 0)), (RopeMode.VISION, 80, 40, (10, 10, 10, 10))])
def test_rope_multi_with_freq_factors(backend, rng, mode, head_dim, n_dims, sections):
    n_tokens = 5
    a = f32(rng, (1, n_tokens, 3, head_dim))
    pos4 = rng.integers(0, 500, size=(4, n_tokens)).astype(np.int32)
    n_factors = n_dims if mode == RopeMode.VISION else n_dims // 2   # vision: one per pair
    ff = rng.uniform(0.9, 1.1, size=n_factors).astype(np.float32)
    out = compute(backend, lambda ctx, x, p, f: ops.rope_multi(ctx, x, p, f, n_dims, sections,
                                                               mode), a, pos4.reshape(-1), ff)
    assert_close(out, _mrope_ref(a, pos4, n_dims, sections, mode, freq_factors=ff))


def test_rope_multi_validates():
    from polydev import Context
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F32, (64, 2, 3))
    pos = ctx.new_tensor(GGMLType.I32, (12,))
    with pytest.raises(InvalidArgumentError):
        ops.rope_multi(ctx, a, pos, None, 64, (0, 0, 0, 4))
    with pytest.raises(InvalidArgumentError):
        ops.rope_multi(ctx, a, pos, None, 64, (8, 8, 8, 8), RopeMode.VISION)   # needs n_dims 32
    with pytest.raises(ShapeError):
        ops.rope_multi(ctx, a, ctx.new_tensor(GGMLType.I32, (3,)), None, 64, (8, 8, 8, 0))
    with pytest.raises(ShapeError, match="freq_factors"):     # vision reads n_dims factors
        ops.rope_multi(ctx, a, pos, ctx.new_tensor(GGMLType.F32, (16,)), 32, (8, 8, 8, 8),
                       RopeMode.VISION)
