"""Every core op on every device against an independent float64 numpy reference.

Thresholds are test-backend-ops' NMSE thresholds (1e-7 by default, 5e-4 for MUL_MAT, 1e-6 for
SOFT_MAX). Each op runs on several shapes (odd sizes included), on non-contiguous inputs
(transposed or sliced views) and in its in-place form where ggml has one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from polydev import Context, GGMLType, GluOp, RopeMode, UnaryOp, ops
from polydev.errors import InvalidArgumentError
from polydev.types import dequantize, quantize
from polydev.types import random_blocks as _random_blocks

from conftest import assert_close, compute, compute_graph

SHAPES = [(2, 3, 5, 16), (1, 1, 7, 13), (1, 2, 2, 128)]


def f32(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


# --- element-wise -------------------------------------------------------------------------------

BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}


@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shape,bshape", [
    ((2, 3, 5, 16), (2, 3, 5, 16)),   # same shape
    ((2, 3, 5, 16), (1, 1, 1, 16)),   # row vector broadcast
    ((2, 6, 4, 10), (1, 3, 2, 5)),    # ggml's repeat: every dim a multiple, not 1
    ((1, 1, 3, 7), (1, 1, 1, 1)),
])
def test_binary_broadcast(backend, rng, name, shape, bshape):
    a = f32(rng, shape)
    b = f32(rng, bshape, 0.5, 1.5)
    out = compute(backend, lambda ctx, x, y: getattr(ops, name)(ctx, x, y), a, b)
    reps = [s // t for s, t in zip(shape, bshape)]
    ref = BINARY[name](a.astype(np.float64), np.tile(b.astype(np.float64), reps))
    assert_close(out, ref)


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_inplace_and_f16(backend, rng, name):
    a, b = f32(rng, (1, 2, 3, 32)), f32(rng, (1, 1, 1, 32), 0.5, 1.5)
    out = compute(backend, lambda ctx, x, y: getattr(ops, name)(ctx, x, y, inplace=True), a, b)
    assert_close(out, BINARY[name](a.astype(np.float64), b))
    a16, b16 = a.astype(np.float16), b.astype(np.float16)
    out = compute(backend, lambda ctx, x, y: getattr(ops, name)(ctx, x, y), a16, b16)
    assert out.dtype == np.float16
    assert_close(out, BINARY[name](a16.astype(np.float64), b16), 1e-6)


def test_binary_transposed_source(backend, rng):
    a, b = f32(rng, (1, 1, 6, 9)), f32(rng, (1, 1, 9, 6))
    out = compute(backend, lambda ctx, x, y: ops.add(ctx, x, ctx.transpose(y)), a, b)
    assert_close(out, a.astype(np.float64) + b.swapaxes(-1, -2))


def test_scale_with_bias(backend, rng):
    a = f32(rng, (2, 3, 4, 20))
    out = compute(backend, lambda ctx, x: ops.scale(ctx, x, 0.25, 1.5), a)
    assert_close(out, a.astype(np.float64) * 0.25 + 1.5)
    out = compute(backend, lambda ctx, x: ops.scale(ctx, x, -3.0, inplace=True), a)
    assert_close(out, a.astype(np.float64) * -3.0)


def test_sqr_sqrt(backend, rng):
    a = f32(rng, (1, 3, 5, 11), 0.0, 2.0)
    assert_close(compute(backend, lambda ctx, x: ops.sqr(ctx, x), a), a.astype(np.float64) ** 2)
    assert_close(compute(backend, lambda ctx, x: ops.sqrt(ctx, x), a), np.sqrt(a.astype(np.float64)))


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)))


UNARY_REF = {
    UnaryOp.GELU: _gelu,
    UnaryOp.SILU: lambda x: x / (1 + np.exp(-x)),
    UnaryOp.RELU: lambda x: np.maximum(x, 0),
    UnaryOp.TANH: np.tanh,
    UnaryOp.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    UnaryOp.EXP: np.exp,
    UnaryOp.NEG: np.negative,
    UnaryOp.ABS: np.abs,
    UnaryOp.SGN: np.sign,
    UnaryOp.STEP: lambda x: (x > 0).astype(np.float64),
    UnaryOp.ELU: lambda x: np.where(x > 0, x, np.expm1(x)),
    UnaryOp.GELU_ERF: lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2))),
    UnaryOp.GELU_QUICK: lambda x: x / (1 + np.exp(-1.702 * x)),
    UnaryOp.HARDSWISH: lambda x: x * np.clip((x + 3) / 6, 0, 1),
    UnaryOp.HARDSIGMOID: lambda x: np.clip((x + 3) / 6, 0, 1),
    UnaryOp.EXPM1: np.expm1,
    UnaryOp.SOFTPLUS: lambda x: np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))),
    UnaryOp.FLOOR: np.floor,
    UnaryOp.CEIL: np.ceil,
    UnaryOp.ROUND: lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),   # C's round: half away
    UnaryOp.TRUNC: np.trunc,
}


@pytest.mark.parametrize("fn", list(UNARY_REF), ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", [(2, 2, 2, 128), (13, 11, 7, 5)])
def test_unary(backend, rng, fn, dtype, shape):
    a = (rng.uniform(-3, 3, size=shape)).astype(dtype)
    out = compute(backend, lambda ctx, x: ops.unary(ctx, x, fn), a)
    ref = UNARY_REF[fn](a.astype(np.float64))
    assert out.dtype == dtype
    assert_close(out, ref, 1e-7 if dtype == np.float32 else 1e-5)


@pytest.mark.parametrize("fn", [UnaryOp.SGN, UnaryOp.STEP, UnaryOp.ROUND, UnaryOp.FLOOR,
                                UnaryOp.CEIL, UnaryOp.TRUNC, UnaryOp.SOFTPLUS], ids=str)
def test_unary_special_values(backend, fn):
    a = np.array([0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 2.5, 30.0, -30.0, 1e-8],
                 np.float32).reshape(1, 1, 1, -1)
    out = compute(backend, lambda ctx, x: ops.unary(ctx, x, fn), a)
    np.testing.assert_allclose(out, UNARY_REF[fn](a.astype(np.float64)), rtol=1e-6)

@pytest.mark.parametrize("fn", list(UNARY_REF), ids=lambda f: f.name)
def test_unary_view_and_inplace(backend, rng, fn):
    big = f32(rng, (1, 4, 6, 40))
    # a strided view: the first 24 elements of every row of a bigger tensor
    out = compute(backend, lambda ctx, x: ops.unary(
        ctx, ctx.view_4d(x, 24, 6, 4, 1, x.nb[1], x.nb[2], x.nb[3], 0), fn), big)
    assert_close(out, UNARY_REF[fn](big[..., :24].astype(np.float64)))
    out = compute(backend, lambda ctx, x: ops.unary(ctx, x, fn, inplace=True), big)
    assert_close(out, UNARY_REF[fn](big.astype(np.float64)))


@pytest.mark.parametrize("fn,act", [(GluOp.SWIGLU, UNARY_REF[UnaryOp.SILU]),
                                    (GluOp.GEGLU, _gelu)], ids=["swiglu", "geglu"])
@pytest.mark.parametrize("swapped", [False, True])
def test_glu_fused(backend, rng, fn, act, swapped):
    a = f32(rng, (1, 3, 5, 64), -2, 2)
    out = compute(backend, lambda ctx, x: ops.glu(ctx, x, fn, swapped), a)
    x, g = a[..., :32].astype(np.float64), a[..., 32:].astype(np.float64)
    if swapped:
        x, g = g, x
    assert_close(out, act(x) * g)


@pytest.mark.parametrize("fn,act", [(GluOp.SWIGLU, UNARY_REF[UnaryOp.SILU]),
                                    (GluOp.GEGLU, _gelu)], ids=["swiglu", "geglu"])
def test_glu_split(backend, rng, fn, act):
    a, b = f32(rng, (2, 1, 3, 33), -2, 2), f32(rng, (2, 1, 3, 33))
    out = compute(backend, lambda ctx, x, y: ops.glu_split(ctx, x, y, fn), a, b)
    assert_close(out, act(a.astype(np.float64)) * b)


@pytest.mark.parametrize("swapped", [False, True])
def test_glu_by_blocks_of_rows_on_the_host(cpu, rng, monkeypatch, swapped):
    """The host GLU runs a block of rows at a time: blocks of two rows (the last one short)
    give the whole-tensor result, fused and split."""
    from polydev.backends.array import rows

    monkeypatch.setattr(rows, "HOST_BLOCK_ELEMENTS", 2 * 32)
    a, b = f32(rng, (1, 3, 5, 64), -2, 2), f32(rng, (1, 3, 5, 32))
    out = compute(cpu, lambda ctx, x: ops.glu(ctx, x, GluOp.SWIGLU, swapped), a)
    x, g = a[..., :32].astype(np.float64), a[..., 32:].astype(np.float64)
    if swapped:
        x, g = g, x
    assert_close(out, UNARY_REF[UnaryOp.SILU](x) * g)
    out = compute(cpu, lambda ctx, x, y: ops.glu_split(ctx, x, y, GluOp.GEGLU), a[..., :32], b)
    assert_close(out, _gelu(a[..., :32].astype(np.float64)) * b)


# --- reductions ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
def test_reductions(backend, rng, shape):
    a = f32(rng, shape)
    a64 = a.astype(np.float64)
    assert_close(compute(backend, ops.sum_, a), np.full((1, 1, 1, 1), a64.sum()))
    assert_close(compute(backend, ops.sum_rows, a), a64.sum(-1, keepdims=True))
    assert_close(compute(backend, ops.mean, a), a64.mean(-1, keepdims=True))


def test_argmax(backend, rng):
    a = f32(rng, (1, 1, 9, 257))
    out = compute(backend, ops.argmax, a)
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.reshape(-1), np.argmax(a[0, 0], axis=-1))


# --- shape ops ----------------------------------------------------------------------------------

def test_repeat(backend, rng):
    a = f32(rng, (1, 2, 1, 3))
    target = np.zeros((2, 4, 3, 6), np.float32)
    out = compute(backend, lambda ctx, x, t: ops.repeat(ctx, x, t), a, target)
    assert_close(out, np.tile(a.astype(np.float64), (2, 2, 3, 2)))


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_concat(backend, rng, dim):
    shape_a = [2, 3, 4, 5]
    shape_b = list(shape_a)
    shape_b[3 - dim] = 2
    a, b = f32(rng, shape_a), f32(rng, shape_b)
    out = compute(backend, lambda ctx, x, y: ops.concat(ctx, x, y, dim), a, b)
    assert_close(out, np.concatenate([a, b], axis=3 - dim).astype(np.float64))


def test_concat_transposed_input(backend, rng):
    a, b = f32(rng, (1, 1, 4, 6)), f32(rng, (1, 1, 6, 4))
    out = compute(backend, lambda ctx, x, y: ops.concat(ctx, x, ctx.transpose(y), 1), a, b)
    assert_close(out, np.concatenate([a, b.swapaxes(-1, -2)], axis=2).astype(np.float64))



@pytest.mark.parametrize("pads", [(0, 3, 0, 0, 0, 0, 0, 0), (1, 2, 3, 0, 0, 1, 2, 1),
                                  (2, 2, 1, 1, 0, 0, 0, 0)])
@pytest.mark.parametrize("circular", [False, True])
def test_pad(backend, rng, pads, circular):
    a = f32(rng, (2, 3, 4, 5))
    out = compute(backend, lambda ctx, x: ops.pad_ext(ctx, x, *pads, circular=circular), a)
    width = [(pads[2 * (3 - k)], pads[2 * (3 - k) + 1]) for k in range(4)]
    expected = np.pad(a.astype(np.float64), width, mode="wrap" if circular else "constant")
    assert_close(out, expected)


def test_pad_of_transposed_input(backend, rng):
    a = f32(rng, (1, 1, 4, 6))
    out = compute(backend, lambda ctx, x: ops.pad(ctx, ctx.transpose(x), 3, 1), a)
    expected = np.pad(a.swapaxes(-1, -2).astype(np.float64), [(0, 0), (0, 0), (0, 1), (0, 3)])
    assert_close(out, expected)


def test_pad_rejects_negative_padding():
    ctx = Context()
    with pytest.raises(InvalidArgumentError, match="negative padding"):
        ops.pad(ctx, ctx.new_tensor_1d(GGMLType.F32, 4), -1)

def test_cont_of_permute(backend, rng):
    a = f32(rng, (2, 3, 4, 5))
    out = compute(backend, lambda ctx, x: ops.cont(ctx, ctx.permute(x, 1, 2, 0, 3)), a)
    # ggml permute(1,2,0,3): source dim i goes to result dim axis_i
    assert_close(out, np.transpose(a, (0, 2, 3, 1)).astype(np.float64))


def test_reshape_view_and_dup(backend, rng):
    a = f32(rng, (1, 1, 6, 8))
    out = compute(backend, lambda ctx, x: ops.dup(ctx, ctx.reshape(x, 4, 12)), a)
    assert_close(out, a.reshape(1, 1, 12, 4).astype(np.float64))
    out = compute(backend, lambda ctx, x: ops.cont(ctx, ctx.view_2d(x, 3, 6, x.nb[1], 8)), a)
    assert_close(out, a[0, 0, :, 2:5][None, None].astype(np.float64))


@pytest.mark.parametrize("src_type,dst_type", [
    (GGMLType.F32, GGMLType.F16), (GGMLType.F16, GGMLType.F32), (GGMLType.F32, GGMLType.BF16),
    (GGMLType.BF16, GGMLType.F32), (GGMLType.F32, GGMLType.F32),
])
def test_cpy_converts(backend, rng, src_type, dst_type):
    a = f32(rng, (1, 2, 3, 32))
    dst = np.zeros((1, 1, 6, 32), np.float32)
    out = compute(backend, lambda ctx, x, y: ops.cpy(ctx, x, y), a, dst, types=[src_type, dst_type])
    src_vals = dequantize(quantize(a, src_type), src_type) if src_type != GGMLType.F32 else a
    ref = (dequantize(quantize(src_vals.reshape(1, 1, 6, 32), dst_type), dst_type)
        if dst_type != GGMLType.F32 else src_vals.reshape(1, 1, 6, 32))
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
                                   GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K])
def test_cpy_quantizes_and_back(backend, rng, qtype):
    a = f32(rng, (1, 1, 4, 256))
    dst = np.zeros((1, 1, 4, 256), np.float32)
    # F32 -> quantized -> F32 through two CPY nodes
    def build(ctx, x, y):
        q = ctx.new_tensor(qtype, (256, 4))
        back = ctx.new_tensor(GGMLType.F32, (256, 4))
        return ops.cpy(ctx, ops.cpy(ctx, x, q), back)
    out = compute(backend, build, a, dst)
    np.testing.assert_array_equal(out, dequantize(quantize(a, qtype), qtype))



# --- normalisation --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("eps", [1e-6, 1e-3])
def test_norms(backend, rng, shape, eps):
    a = f32(rng, shape)
    x = a.astype(np.float64)
    centered = x - x.mean(-1, keepdims=True)
    ref_norm = centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + eps)
    ref_rms = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + eps)
    assert_close(compute(backend, lambda ctx, t: ops.norm(ctx, t, eps), a), ref_norm)
    assert_close(compute(backend, lambda ctx, t: ops.rms_norm(ctx, t, eps), a), ref_rms)
    assert_close(compute(backend, lambda ctx, t: ops.rms_norm(ctx, t, eps, inplace=True), a), ref_rms)


def test_rms_norm_of_view(backend, rng):
    a = f32(rng, (1, 3, 4, 50))
    out = compute(backend, lambda ctx, t: ops.rms_norm(
        ctx, ctx.view_3d(t, 32, 4, 3, t.nb[1], t.nb[2], 8), 1e-6), a)
    x = a[..., 2:34].astype(np.float64)
    assert_close(out, x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6))


# --- matrix product --------------------------------------------------------------------------------

def _mul_mat_ref(a, b):
    """dst[.., n, m] = sum_k a[.., m, k] b[.., n, k] with ggml's broadcast of a over b."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    r3, r2 = b.shape[0] // a.shape[0], b.shape[1] // a.shape[1]
    a = np.repeat(np.repeat(a, r3, axis=0), r2, axis=1)
    return b @ np.swapaxes(a, -1, -2)


@pytest.mark.parametrize("ashape,bshape", [
    ((1, 1, 16, 32), (1, 1, 8, 32)),
    ((1, 1, 7, 33), (1, 1, 1, 33)),       # k not a multiple of 32, one column
    ((1, 2, 10, 64), (3, 4, 5, 64)),      # broadcast over dims 2 and 3
    ((2, 3, 4, 16), (2, 3, 6, 16)),
])
@pytest.mark.parametrize("btype", [np.float32, np.float16])
def test_mul_mat_float(backend, rng, ashape, bshape, btype):
    a, b = f32(rng, ashape), f32(rng, bshape).astype(btype)
    out = compute(backend, ops.mul_mat, a, b)
    assert_close(out, _mul_mat_ref(a, b), 5e-4)
    a16 = a.astype(np.float16)
    assert_close(compute(backend, ops.mul_mat, a16, b), _mul_mat_ref(a16, b), 5e-4)


def test_mul_mat_permuted_b(backend, rng):
    a, b = f32(rng, (1, 1, 12, 16)), f32(rng, (1, 1, 16, 5))
    out = compute(backend, lambda ctx, x, y: ops.mul_mat(ctx, x, ctx.transpose(y)), a, b)
    assert_close(out, _mul_mat_ref(a, b.swapaxes(-1, -2)), 5e-4)


QTYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
          GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
          GGMLType.IQ4_NL, GGMLType.IQ4_XS]


def random_blocks(rng, qtype: GGMLType, rows: int, cols: int) -> np.ndarray:
    """Valid random blocks of ``qtype`` as raw rows (see polydev.types.random_blocks)."""
    n_blocks = rows * cols // qtype.traits.block_size
    return _random_blocks(qtype, n_blocks, rng).reshape(rows, -1)


@pytest.mark.parametrize("qtype", QTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 7])
def test_mul_mat_quantized(backend, rng, qtype, n):
    m, k = 6, 512
    raw = random_blocks(rng, qtype, m, k)
    b = f32(rng, (1, 1, n, k))
    weights = np.zeros((1, 1, m, k), np.float32)   # placeholder shape; bytes set below

    from polydev import Context, alloc_ctx_tensors
    ctx = Context()
    wt = ctx.new_tensor(qtype, (k, m))
    bt = ctx.new_tensor(GGMLType.F32, (k, n))
    out_t = ops.mul_mat(ctx, wt, bt)
    buf = alloc_ctx_tensors(ctx, backend)
    wt.set_data(raw.tobytes())
    bt.set_data(b)
    compute_graph(backend, out_t)
    ref = _mul_mat_ref(dequantize(raw, qtype).reshape(1, 1, m, k), b)
    assert_close(out_t.numpy(), ref, 5e-4)
    buf.close()
    del weights


# --- rows ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", QTYPES, ids=str)
def test_cpy_dequantizes_every_type_with_a_dequantizer(backend, rng, qtype):
    from polydev import Context, alloc_ctx_tensors
    raw = random_blocks(rng, qtype, 3, 256)
    ctx = Context()
    q = ctx.new_tensor(qtype, (256, 3))
    out = ops.cpy(ctx, q, ctx.new_tensor(GGMLType.F32, (256, 3)))
    with alloc_ctx_tensors(ctx, backend):
        q.set_data(raw.tobytes())
        compute_graph(backend, out)
        np.testing.assert_array_equal(out.numpy()[0, 0], dequantize(raw, qtype))

@pytest.mark.parametrize("qtype", [GGMLType.F32, GGMLType.F16, GGMLType.BF16] + QTYPES, ids=str)
def test_get_rows(backend, rng, qtype):
    n_rows, k = 10, 256
    if qtype.traits.is_quantized:
        raw = random_blocks(rng, qtype, n_rows, k)
        values = dequantize(raw, qtype)
        data = raw.tobytes()
    else:
        values = (dequantize(quantize(f32(rng, (n_rows, k)), qtype), qtype)
            if qtype != GGMLType.F32 else f32(rng, (n_rows, k)))
        data = values
    idx = np.array([3, 0, 9, 3, 5], dtype=np.int32)
    from polydev import Context, alloc_ctx_tensors
    ctx = Context()
    at = ctx.new_tensor(qtype, (k, n_rows))
    it = ctx.new_tensor(GGMLType.I32, (5,))
    out_t = ops.get_rows(ctx, at, it)
    with alloc_ctx_tensors(ctx, backend):
        at.set_data(data)
        it.set_data(idx)
        compute_graph(backend, out_t)
        np.testing.assert_array_equal(out_t.numpy()[0, 0], values[idx])


def test_get_rows_batched(backend, rng):
    a = f32(rng, (2, 3, 7, 5))
    idx = rng.integers(0, 7, size=(1, 2, 3, 4)).astype(np.int32)
    out = compute(backend, ops.get_rows, a, idx)
    ref = np.take_along_axis(a, idx[0][..., None], axis=2)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("dst_type", [GGMLType.F32, GGMLType.F16, GGMLType.Q8_0, GGMLType.Q4_K],
                         ids=str)
@pytest.mark.parametrize("idx_type", [np.int64, np.int32])
def test_set_rows(backend, rng, dst_type, idx_type):
    dst = np.zeros((1, 2, 8, 256), np.float32)
    rows = f32(rng, (1, 2, 3, 256))
    idx = np.array([[[5, 1, 7]]], dtype=idx_type)       # broadcast over dim 2 (i % 1)
    out = compute(backend, lambda ctx, d, r, i: ops.set_rows(ctx, d, r, i), dst, rows, idx,
                  types=[dst_type, None, None])
    ref = np.zeros((1, 2, 8, 256), np.float32)
    ref[:, :, [5, 1, 7], :] = rows
    if dst_type != GGMLType.F32:
        ref = dequantize(quantize(ref, dst_type), dst_type).reshape(ref.shape)
    np.testing.assert_array_equal(np.asarray(out, np.float32), ref)


# --- attention ---------------------------------------------------------------------------------

def test_diag_mask_inf(backend, rng):
    a = f32(rng, (1, 2, 5, 8))
    for inplace in (False, True):
        out = compute(backend, lambda ctx, x: ops.diag_mask_inf(ctx, x, 2, inplace), a)
        cols, rows = np.arange(8)[None, :], np.arange(5)[:, None]
        ref = np.where(cols > 2 + rows, -np.inf, a)
        np.testing.assert_array_equal(out, ref)


def _softmax_ref(x, mask=None, scale=1.0, slopes=None, sinks=None):
    x = x.astype(np.float64) * scale
    if mask is not None:
        x = x + (mask * (slopes if slopes is not None else 1.0))
    m = x.max(-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, sinks)
    e = np.exp(x - m)
    total = e.sum(-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks - m)
    return e / total


def _alibi(n_head, max_bias):
    n_log2 = 2 ** math.floor(math.log2(n_head))
    m0, m1 = 2 ** (-max_bias / n_log2), 2 ** (-(max_bias / 2) / n_log2)
    return np.array([m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1)
                     for h in range(n_head)])


@pytest.mark.parametrize("mask_type,max_bias", [
    (None, 0.0), (np.float32, 0.0), (np.float16, 0.0), (np.float32, 8.0), (np.float16, 8.0)])
def test_soft_max_ext(backend, rng, mask_type, max_bias):
    a = f32(rng, (2, 6, 5, 17), -3, 3)
    inputs = [a]
    if mask_type is not None:
        mask = f32(rng, (1, 3, 8, 17), -2, 0).astype(mask_type)   # extra rows; heads tile 6 % 3
        inputs.append(mask)
    out = compute(backend, lambda ctx, x, *m: ops.soft_max_ext(
        ctx, x, m[0] if m else None, 0.5, max_bias), *inputs)
    mask_full = None
    if mask_type is not None:
        mask_full = np.tile(inputs[1][:, :, :5, :].astype(np.float64), (2, 2, 1, 1))
    slopes = _alibi(6, max_bias).reshape(1, 6, 1, 1) if max_bias else None
    assert_close(out, _softmax_ref(a, mask_full, 0.5, slopes), 1e-6)


def test_soft_max_inplace_and_sinks(backend, rng):
    a = f32(rng, (1, 4, 3, 10), -3, 3)
    out = compute(backend, lambda ctx, x: ops.soft_max(ctx, x, inplace=True), a)
    assert_close(out, _softmax_ref(a), 1e-6)
    sinks = f32(rng, (1, 1, 1, 4))

    def build(ctx, x, s):
        y = ops.soft_max_ext(ctx, x, None, 1.0, 0.0)
        ops.soft_max_add_sinks(y, s)
        return y
    out = compute(backend, build, a, sinks)
    assert_close(out, _softmax_ref(a, sinks=sinks.reshape(1, 4, 1, 1)), 1e-6)


def _rope_ref(x, pos, n_dims, mode, freq_base=10000.0, freq_scale=1.0, ff=None, ext_factor=0.0,
              attn_factor=1.0, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=0):
    """Independent float64 RoPE (YaRN included), following the formulas of ggml's docs."""
    x = x.astype(np.float64).copy()
    half = n_dims // 2
    i = np.arange(half)
    theta = pos[:, None].astype(np.float64) * freq_base ** (-2.0 * i / n_dims)
    if ff is not None:
        theta = theta / ff[:half]
    interp = freq_scale * theta
    mscale = attn_factor
    if ext_factor != 0.0:
        def corr(n_rot):
            return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(freq_base))
        low = max(0.0, math.floor(corr(beta_fast)))
        high = min(n_dims - 1.0, math.ceil(corr(beta_slow)))
        ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)
        mix = ramp * ext_factor
        interp = interp * (1 - mix) + theta * mix
        mscale *= 1 + 0.1 * math.log(1 / freq_scale)
    cos, sin = np.cos(interp) * mscale, np.sin(interp) * mscale
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    if mode == RopeMode.NEOX:
        x0, x1 = x[..., :half].copy(), x[..., half:n_dims].copy()
        x[..., :half], x[..., half:n_dims] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_dims:2].copy(), x[..., 1:n_dims:2].copy()
        x[..., 0:n_dims:2], x[..., 1:n_dims:2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return x


@pytest.mark.parametrize("mode", [RopeMode.NORMAL, RopeMode.NEOX], ids=["normal", "neox"])
@pytest.mark.parametrize("n_dims", [64, 32])
def test_rope(backend, rng, mode, n_dims):
    a = f32(rng, (1, 5, 4, 64))               # [head_dim=64, heads=4, tokens=5]
    pos = np.array([0, 3, 17, 100, 2047], dtype=np.int32)
    out = compute(backend, lambda ctx, x, p: ops.rope(ctx, x, p, n_dims, mode), a, pos)
    assert_close(out, _rope_ref(a, pos, n_dims, mode))


@pytest.mark.parametrize("mode", [RopeMode.NORMAL, RopeMode.NEOX], ids=["normal", "neox"])
def test_rope_yarn_freq_factors_inplace(backend, rng, mode):
    a = f32(rng, (1, 3, 2, 32))
    pos = np.array([1, 50, 900], dtype=np.int32)
    ff = rng.uniform(1.0, 4.0, size=(16,)).astype(np.float32)
    kw = dict(freq_base=50000.0, freq_scale=0.25, ext_factor=1.0, attn_factor=0.9,
              beta_fast=32.0, beta_slow=1.0, n_ctx_orig=4096)
    out = compute(backend, lambda ctx, x, p, f: ops.rope_ext(
        ctx, x, p, f, 32, mode, kw["n_ctx_orig"], kw["freq_base"], kw["freq_scale"],
        kw["ext_factor"], kw["attn_factor"], kw["beta_fast"], kw["beta_slow"], inplace=True),
        a, pos, ff)
    assert_close(out, _rope_ref(a, pos, 32, mode, ff=ff, **kw))


def test_rope_f16_of_view(backend, rng):
    a = f32(rng, (1, 4, 3, 48)).astype(np.float16)
    pos = np.arange(4, dtype=np.int32) * 7
    out = compute(backend, lambda ctx, x, p: ops.rope(
        ctx, ctx.view_3d(x, 32, 3, 4, x.nb[1], x.nb[2], 16 * 2), p, 32, RopeMode.NEOX), a, pos)
    assert_close(out, _rope_ref(a[..., 16:], pos, 32, RopeMode.NEOX), 1e-5)
