"""Element-wise math, GLU variants, L2/group norms, scans, sorting and generated values, on every
device against independent float64 numpy references (test-backend-ops' thresholds)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polydev import GGMLType, GluOp, ops
from polydev.errors import InvalidArgumentError, ShapeError, TensorTypeError
from polydev.ops import SortOrder

from conftest import assert_close, compute
from test_ops import UNARY_REF, f32


@pytest.mark.parametrize("name,ref,lo", [("log", np.log, 0.1), ("sin", np.sin, -6.0),
                                         ("cos", np.cos, -6.0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_log_sin_cos(backend, rng, name, ref, lo, dtype):
    a = rng.uniform(lo, 6.0, size=(2, 3, 5, 17)).astype(dtype)
    out = compute(backend, lambda ctx, x: getattr(ops, name)(ctx, x), a)
    assert out.dtype == dtype
    assert_close(out, ref(a.astype(np.float64)), 1e-7 if dtype == np.float32 else 1e-5)
    out = compute(backend, lambda ctx, x: getattr(ops, name)(ctx, x, inplace=True), a)
    assert_close(out, ref(a.astype(np.float64)), 1e-7 if dtype == np.float32 else 1e-5)


def test_clamp_is_in_place_like_ggml(backend, rng):
    a = f32(rng, (1, 2, 7, 31), -3, 3)
    out = compute(backend, lambda ctx, x: ops.clamp(ctx, x, -0.5, 1.25), a)
    assert_close(out, np.clip(a.astype(np.float64), -0.5, 1.25))
    with pytest.raises(InvalidArgumentError):
        compute(backend, lambda ctx, x: ops.clamp(ctx, x, 1.0, 0.0), a)


@pytest.mark.parametrize("slope", [0.01, 0.5])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_leaky_relu(backend, rng, slope, dtype):
    a = rng.uniform(-2, 2, size=(3, 2, 4, 9)).astype(dtype)
    out = compute(backend, lambda ctx, x: ops.leaky_relu(ctx, x, slope), a)
    x = a.astype(np.float64)
    assert_close(out, np.where(x > 0, x, slope * x), 1e-7 if dtype == np.float32 else 1e-6)


def test_add1_and_fill(backend, rng):
    a, b = f32(rng, (2, 3, 4, 5)), np.array([0.75], np.float32)
    out = compute(backend, lambda ctx, x, y: ops.add1(ctx, x, y), a, b)
    assert_close(out, a.astype(np.float64) + 0.75)
    out = compute(backend, lambda ctx, x, y: ops.add1(ctx, x, y, inplace=True), a, b)
    assert_close(out, a.astype(np.float64) + 0.75)
    with pytest.raises(ShapeError):
        compute(backend, lambda ctx, x, y: ops.add1(ctx, x, y), a, a)
    out = compute(backend, lambda ctx, x: ops.fill(ctx, x, -2.5), a.astype(np.float16))
    assert out.dtype == np.float16 and np.all(out == -2.5) and out.shape == a.shape
    with pytest.raises(TensorTypeError):
        compute(backend, lambda ctx, x: ops.fill(ctx, x, 1.0), a.astype(np.int32))


def _swiglu_oai(x, g, alpha=1.702, limit=7.0):
    x = np.minimum(x, limit)
    return x / (1 + np.exp(-alpha * x)) * (np.clip(g, -limit, limit) + 1)


GLU_REF = {
    GluOp.REGLU: lambda x, g: UNARY_REF[ops.UnaryOp.RELU](x) * g,
    GluOp.GEGLU_ERF: lambda x, g: UNARY_REF[ops.UnaryOp.GELU_ERF](x) * g,
    GluOp.GEGLU_QUICK: lambda x, g: UNARY_REF[ops.UnaryOp.GELU_QUICK](x) * g,
    GluOp.SWIGLU_OAI: _swiglu_oai,
}
GLU_BUILDERS = {GluOp.REGLU: ops.reglu, GluOp.GEGLU_ERF: ops.geglu_erf,
                GluOp.GEGLU_QUICK: ops.geglu_quick, GluOp.SWIGLU_OAI: ops.swiglu_oai}


@pytest.mark.parametrize("fn", list(GLU_REF), ids=lambda f: f.name)
@pytest.mark.parametrize("swapped", [False, True])
def test_glu_variants_fused(backend, rng, fn, swapped):
    a = f32(rng, (1, 3, 5, 64), -9, 9)           # beyond swiglu_oai's limit of 7
    out = compute(backend, lambda ctx, x: GLU_BUILDERS[fn](ctx, x, swapped=swapped), a)
    x, g = a[..., :32].astype(np.float64), a[..., 32:].astype(np.float64)
    if swapped:
        x, g = g, x
    assert_close(out, GLU_REF[fn](x, g))


@pytest.mark.parametrize("fn", list(GLU_REF), ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_glu_variants_split(backend, rng, fn, dtype):
    a, b = f32(rng, (2, 1, 3, 33), -3, 3).astype(dtype), f32(rng, (2, 1, 3, 33)).astype(dtype)
    out = compute(backend, lambda ctx, x, y: GLU_BUILDERS[fn](ctx, x, y), a, b)
    assert out.dtype == dtype
    assert_close(out, GLU_REF[fn](a.astype(np.float64), b.astype(np.float64)),
                 1e-7 if dtype == np.float32 else 1e-5)


def test_swiglu_oai_params(backend, rng):
    a, b = f32(rng, (1, 1, 4, 16), -3, 3), f32(rng, (1, 1, 4, 16), -3, 3)
    out = compute(backend, lambda ctx, x, y: ops.swiglu_oai(ctx, x, y, alpha=0.5, limit=1.0), a, b)
    assert_close(out, _swiglu_oai(a.astype(np.float64), b.astype(np.float64), 0.5, 1.0))


# --- norms ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 5, 16), (1, 1, 7, 13)])
def test_l2_norm(backend, rng, shape):
    a = f32(rng, shape)
    a[0, 0, 0] = 0.0                              # a zero row: divided by eps, not by 0
    out = compute(backend, lambda ctx, x: ops.l2_norm(ctx, x, 1e-6), a)
    x = a.astype(np.float64)
    ref = x / np.maximum(np.sqrt((x * x).sum(-1, keepdims=True)), 1e-6)
    assert_close(out, ref)


def _group_norm_ref(x, n_groups, eps):
    n3, channels = x.shape[:2]
    per = math.ceil(channels / n_groups)
    out = np.empty_like(x)
    for start in range(0, channels, per):        # the reference may loop: it is not the kernel
        g = x[:, start:start + per]
        mean = g.mean(axis=(1, 2, 3), keepdims=True)
        var = ((g - mean) ** 2).mean(axis=(1, 2, 3), keepdims=True)
        out[:, start:start + per] = (g - mean) / np.sqrt(var + eps)
    return out


@pytest.mark.parametrize("shape,n_groups", [((2, 8, 5, 7), 4), ((1, 10, 3, 4), 3),
                                            ((1, 7, 2, 3), 7), ((3, 5, 4, 4), 1)])
def test_group_norm(backend, rng, shape, n_groups):
    a = f32(rng, shape, -2, 3)
    out = compute(backend, lambda ctx, x: ops.group_norm(ctx, x, n_groups, 1e-5), a)
    assert_close(out, _group_norm_ref(a.astype(np.float64), n_groups, 1e-5))
    out = compute(backend, lambda ctx, x: ops.group_norm(ctx, x, n_groups, 1e-5, inplace=True), a)
    assert_close(out, _group_norm_ref(a.astype(np.float64), n_groups, 1e-5))


# --- scans, counts and sorting -----------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3, 5, 16), (1, 1, 3, 1000)])
def test_cumsum(backend, rng, shape):
    a = f32(rng, shape)
    out = compute(backend, lambda ctx, x: ops.cumsum(ctx, x), a)
    assert_close(out, np.cumsum(a.astype(np.float64), axis=-1))


def test_cumsum_of_transposed_view(backend, rng):
    a = f32(rng, (1, 1, 9, 6))
    out = compute(backend, lambda ctx, x: ops.cumsum(ctx, ctx.transpose(x)), a)
    assert_close(out, np.cumsum(a.swapaxes(-1, -2).astype(np.float64), axis=-1))


def test_count_equal(backend, rng):
    a = rng.integers(0, 4, size=(2, 3, 5, 7)).astype(np.int32)
    b = rng.integers(0, 4, size=(2, 3, 5, 7)).astype(np.int32)
    out = compute(backend, lambda ctx, x, y: ops.count_equal(ctx, x, y), a, b)
    assert out.dtype == np.int64 and out.size == 1
    assert int(out.reshape(-1)[0]) == int((a == b).sum())


@pytest.mark.parametrize("order", [SortOrder.ASC, SortOrder.DESC], ids=["asc", "desc"])
@pytest.mark.parametrize("shape", [(1, 2, 3, 16), (2, 1, 5, 1025), (1, 1, 1, 1)])
def test_argsort(backend, rng, order, shape):
    a = rng.permutation(np.prod(shape)).astype(np.float32).reshape(shape)   # distinct values
    out = compute(backend, lambda ctx, x: ops.argsort(ctx, x, order), a)
    assert out.dtype == np.int32
    ref = np.argsort(a if order == SortOrder.ASC else -a, axis=-1)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("shape,k", [((1, 2, 3, 16), 4), ((2, 1, 5, 1000), 40), ((1, 1, 2, 7), 7),
                                     ((1, 1, 3, 9), 1)])
def test_top_k(backend, rng, shape, k):
    a = rng.permutation(np.prod(shape)).astype(np.float32).reshape(shape)
    out = compute(backend, lambda ctx, x: ops.top_k(ctx, x, k), a)
    assert out.shape == tuple(shape[:-1]) + (k,) and out.dtype == np.int32
    ref = np.argsort(-a, axis=-1)[..., :k]
    # ggml leaves the order of the k open: compare as sets, and check ours is largest first
    np.testing.assert_array_equal(np.sort(out, axis=-1), np.sort(ref, axis=-1))
    np.testing.assert_array_equal(out, ref)
    with pytest.raises(InvalidArgumentError):
        compute(backend, lambda ctx, x: ops.top_k(ctx, x, shape[-1] + 1), a)


# --- generated values -------------------------------------------------------------------------

@pytest.mark.parametrize("start,stop,step", [(0.0, 10.0, 1.0), (-3.0, 4.5, 0.7), (1.0, 2.0, 3.0)])
def test_arange(backend, start, stop, step):
    out = compute(backend, lambda ctx: ops.arange(ctx, start, stop, step))
    ref = start + step * np.arange(math.ceil((stop - start) / step))
    assert_close(out.reshape(-1), ref)
    with pytest.raises(InvalidArgumentError):
        compute(backend, lambda ctx: ops.arange(ctx, stop, start, step))


@pytest.mark.parametrize("dim", [64, 15])
def test_timestep_embedding(backend, rng, dim):
    t = rng.uniform(0, 1000, size=(5,)).astype(np.float32)
    out = compute(backend, lambda ctx, x: ops.timestep_embedding(ctx, x, dim, 10000), t)
    half = dim // 2
    freqs = np.exp(-math.log(10000) * np.arange(half) / half)
    args = t.astype(np.float64)[:, None] * freqs
    ref = np.concatenate([np.cos(args), np.sin(args), np.zeros((5, dim - 2 * half))], axis=1)
    out = out.reshape(5, dim)
    assert_close(out, ref, 1e-6)      # float32 arguments up to 1000 rad lose ~1e-4 absolute


def test_type_rules():
    from polydev import Context
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F16, (8, 2))
    with pytest.raises(TensorTypeError):
        ops.cumsum(ctx, a)
    with pytest.raises(TensorTypeError):
        ops.argsort(ctx, a)
    with pytest.raises(TensorTypeError):
        ops.count_equal(ctx, a, a)
