"""MUL_MAT_ID (mixture-of-experts) and OUT_PROD on every device against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

from polydev import GGMLType, dequantize, ops
from polydev.errors import OutOfBoundsError, ShapeError

from conftest import assert_close, compute
from test_ops import f32, random_blocks


def _mul_mat_id_ref(w, b, ids):
    """w (n_expert, M, K), b (n_tokens, n_b, K), ids (n_tokens, n_used) -> (n_tokens, n_used, M)"""
    n_used = ids.shape[1]
    rows = b[:, np.arange(n_used) % b.shape[1]]              # (n_tokens, n_used, K)
    return np.einsum("temk,tek->tem", w[ids], rows)


def _routing(rng, n_tokens, n_used, n_expert):
    return np.stack([rng.choice(n_expert, n_used, replace=False)
                     for _ in range(n_tokens)]).astype(np.int32)


@pytest.mark.parametrize("n_expert,n_used,n_tokens,n_b", [(8, 2, 1, 2), (8, 2, 7, 2),
                                                          (4, 4, 33, 1), (16, 3, 5, 3)])
@pytest.mark.parametrize("btype", [np.float32, np.float16])
def test_mul_mat_id(backend, rng, n_expert, n_used, n_tokens, n_b, btype):
    m, k = 24, 64
    w = f32(rng, (1, n_expert, m, k))
    b = f32(rng, (1, n_tokens, n_b, k)).astype(btype)
    ids = _routing(rng, n_tokens, n_used, n_expert)
    out = compute(backend, lambda ctx, a_, x, i: ops.mul_mat_id(ctx, a_, x, i), w, b, ids)
    ref = _mul_mat_id_ref(w[0].astype(np.float64), b[0].astype(np.float64), ids)
    assert_close(out[0], ref, 5e-4)


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K], ids=str)
def test_mul_mat_id_quantized_experts(backend, rng, qtype):
    n_expert, m, k, n_tokens = 4, 8, 256, 6
    blocks = random_blocks(rng, qtype, n_expert * m, k)
    ids = _routing(rng, n_tokens, 2, n_expert)
    b = f32(rng, (1, n_tokens, 2, k))
    out = compute(backend, lambda ctx, a_, x, i: ops.mul_mat_id(ctx, a_, x, i),
                  blocks.reshape(1, n_expert, m, -1), b, ids, types=[qtype, None, None])
    w = dequantize(blocks, qtype).reshape(n_expert, m, k).astype(np.float64)
    assert_close(out[0], _mul_mat_id_ref(w, b[0].astype(np.float64), ids), 5e-4)


def test_mul_mat_id_rejects_bad_ids(backend, rng):
    w, b = f32(rng, (1, 4, 8, 16)), f32(rng, (1, 3, 2, 16))
    ids = np.array([[0, 1], [2, 4], [3, 3]], np.int32)
    with pytest.raises(OutOfBoundsError):
        compute(backend, lambda ctx, a_, x, i: ops.mul_mat_id(ctx, a_, x, i), w, b, ids)
    with pytest.raises(ShapeError):
        compute(backend, lambda ctx, a_, x, i: ops.mul_mat_id(ctx, a_, x, i), w,
                f32(rng, (1, 2, 2, 16)), ids)


@pytest.mark.parametrize("ashape,bshape", [((1, 1, 7, 5), (1, 1, 7, 9)),
                                           ((1, 2, 16, 3), (2, 4, 16, 11)),
                                           ((3, 1, 1, 8), (3, 2, 1, 6))])
@pytest.mark.parametrize("btype", [np.float32, np.float16])
def test_out_prod(backend, rng, ashape, bshape, btype):
    a, b = f32(rng, ashape), f32(rng, bshape).astype(btype)
    out = compute(backend, lambda ctx, x, y: ops.out_prod(ctx, x, y), a, b)
    ra, rb = ashape[0], ashape[1]
    a_b = np.repeat(np.repeat(a.astype(np.float64), bshape[0] // ra, 0), bshape[1] // rb, 1)
    ref = np.swapaxes(b.astype(np.float64), -1, -2) @ a_b
    assert_close(out, ref, 5e-4)


def test_out_prod_of_transposed_b(backend, rng):
    a, b = f32(rng, (1, 1, 6, 4)), f32(rng, (1, 1, 5, 6))
    out = compute(backend, lambda ctx, x, y: ops.out_prod(ctx, x, ctx.transpose(y)), a, b)
    assert_close(out, b.astype(np.float64) @ a, 5e-4)
