"""ggml itself as the oracle for the rest of the op catalogue (see test_ggml_oracle.py)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from polydev import GGMLType, ops
from polydev.ops import ScaleMode, SortOrder

from test_ggml_oracle import F16, F32, I32, check, ggml, u
from test_ops import random_blocks

pytestmark = pytest.mark.ggml


@pytest.mark.parametrize("name,lo", [("log", 0.1), ("sin", -7.0), ("cos", -7.0)])
def test_log_sin_cos(cpu, ggml_backend, rng, name, lo):
    a = u(rng, (2, 3, 5, 19), lo, 7.0)
    check(cpu, ggml_backend, getattr(ops, name), getattr(ggml, f"ggml_{name}"), [a], [F32])


def test_clamp_leaky_relu_add1_fill(cpu, ggml_backend, rng):
    a, b = u(rng, (1, 3, 5, 21), -3, 3), u(rng, (1,))
    check(cpu, ggml_backend, lambda c, x: ops.clamp(c, x, -0.7, 1.1),
          lambda c, x: ggml.ggml_clamp(c, x, -0.7, 1.1), [a], [F32], 0.0)
    check(cpu, ggml_backend, lambda c, x: ops.leaky_relu(c, x, 0.1),
          lambda c, x: ggml.ggml_leaky_relu(c, x, 0.1, False), [a], [F32])
    check(cpu, ggml_backend, ops.add1, ggml.ggml_add1, [a, b], [F32, F32])
    check(cpu, ggml_backend, lambda c, x: ops.fill(c, x, 3.25),
          lambda c, x: ggml.ggml_fill(c, x, 3.25), [a], [F32], 0.0)


def test_swiglu_oai(cpu, ggml_backend, rng):
    a, b = u(rng, (1, 2, 3, 40), -9, 9), u(rng, (1, 2, 3, 40), -9, 9)
    check(cpu, ggml_backend, lambda c, x, y: ops.swiglu_oai(c, x, y, 1.702, 7.0),
          lambda c, x, y: ggml.ggml_swiglu_oai(c, x, y, 1.702, 7.0), [a, b], [F32, F32])


def test_norms(cpu, ggml_backend, rng):
    a = u(rng, (2, 10, 3, 7), -2, 3)
    check(cpu, ggml_backend, lambda c, x: ops.l2_norm(c, x, 1e-6),
          lambda c, x: ggml.ggml_l2_norm(c, x, 1e-6), [a], [F32])
    for groups in (5, 3, 10):
        check(cpu, ggml_backend, lambda c, x: ops.group_norm(c, x, groups, 1e-5),
              lambda c, x: ggml.ggml_group_norm(c, x, groups, 1e-5), [a], [F32])


def test_pad_reflect_roll(cpu, ggml_backend, rng):
    a = u(rng, (2, 3, 4, 9))
    check(cpu, ggml_backend, lambda c, x: ops.pad_reflect_1d(c, x, 4, 8),
          lambda c, x: ggml.ggml_pad_reflect_1d(c, x, 4, 8), [a], [F32], 0.0)
    check(cpu, ggml_backend, lambda c, x: ops.roll(c, x, -4, 2, 1, 1),
          lambda c, x: ggml.ggml_roll(c, x, -4, 2, 1, 1), [a], [F32], 0.0)


def test_acc_and_set(cpu, ggml_backend, rng):
    a, b = u(rng, (2, 3, 5, 10)), u(rng, (2, 2, 3, 4))
    args = (80, 200, 600, 52)
    check(cpu, ggml_backend, lambda c, x, y: ops.acc(c, x, y, *args),
          lambda c, x, y: ggml.ggml_acc(c, x, y, *args), [a, b], [F32, F32])
    check(cpu, ggml_backend, lambda c, x, y: ops.set_(c, x, y, *args),
          lambda c, x, y: ggml.ggml_set(c, x, y, *args), [a, b], [F32, F32], 0.0)


@pytest.mark.parametrize("mode", [ScaleMode.NEAREST, ScaleMode.BILINEAR, ScaleMode.BICUBIC,
                                  ScaleMode.BILINEAR | ScaleMode.ALIGN_CORNERS,
                                  ScaleMode.NEAREST | ScaleMode.ALIGN_CORNERS],
                         ids=["nearest", "bilinear", "bicubic", "bilinear-ac", "nearest-ac"])
@pytest.mark.parametrize("target", [(13, 7, 6, 2), (3, 2, 3, 1)])
def test_upscale(cpu, ggml_backend, rng, mode, target):
    a = u(rng, (1, 3, 5, 6))
    check(cpu, ggml_backend, lambda c, x: ops.interpolate(c, x, *target, mode),
          lambda c, x: ggml.ggml_interpolate(c, x, *target, int(mode)), [a], [F32])


def test_upscale_antialias(cpu, ggml_backend, rng):
    a = u(rng, (1, 2, 17, 23))
    mode = int(ScaleMode.BILINEAR | ScaleMode.ANTIALIAS)
    check(cpu, ggml_backend, lambda c, x: ops.interpolate(c, x, 7, 5, 2, 1, mode),
          lambda c, x: ggml.ggml_interpolate(c, x, 7, 5, 2, 1, mode), [a], [F32])


def test_sorting_and_scans(cpu, ggml_backend, rng):
    a = rng.permutation(2 * 3 * 200).astype(np.float32).reshape(1, 2, 3, 200)
    for order in SortOrder:
        check(cpu, ggml_backend, lambda c, x: ops.argsort(c, x, order),
              lambda c, x: ggml.ggml_argsort(c, x, int(order)), [a], [F32], 0.0)
    check(cpu, ggml_backend, lambda c, x: ops.top_k(c, x, 17),
          lambda c, x: ggml.ggml_top_k(c, x, 17), [a], [F32], 0.0,
          post=lambda r: np.sort(r, axis=-1))
    x = u(rng, (2, 3, 4, 50))
    check(cpu, ggml_backend, ops.cumsum, ggml.ggml_cumsum, [x], [F32])


def test_count_equal(cpu, ggml_backend, rng):
    # matrices only: ggml's CPU kernel misindexes rows when ne[2] or ne[3] > 1
    a = rng.integers(0, 3, size=(30, 40)).astype(np.int32)
    b = rng.integers(0, 3, size=(30, 40)).astype(np.int32)
    check(cpu, ggml_backend, ops.count_equal, ggml.ggml_count_equal, [a, b], [I32, I32], 0.0)


def test_arange_and_timestep_embedding(cpu, ggml_backend, rng):
    check(cpu, ggml_backend, lambda c: ops.arange(c, -2.0, 5.3, 0.3),
          lambda c: ggml.ggml_arange(c, -2.0, 5.3, 0.3), [], [], 1e-12)   # fma or not
    t = rng.uniform(0, 1000, size=(6,)).astype(np.float32)
    for dim in (64, 31):
        check(cpu, ggml_backend, lambda c, x: ops.timestep_embedding(c, x, dim, 10000),
              lambda c, x: ggml.ggml_timestep_embedding(c, x, dim, 10000), [t], [F32])


def test_get_rows_back(cpu, ggml_backend, rng):
    grads, like = u(rng, (7, 12)), u(rng, (5, 12))
    idx = np.array([3, 0, 3, 4, 3, 1, 0], np.int32)
    check(cpu, ggml_backend, ops.get_rows_back, ggml.ggml_get_rows_back, [grads, idx, like],
          [F32, I32, F32])



@pytest.mark.parametrize("n_tokens,n_b", [(1, 4), (9, 1), (9, 4)])
def test_mul_mat_id(cpu, ggml_backend, rng, n_tokens, n_b):
    w, b = u(rng, (1, 8, 16, 64)), u(rng, (1, n_tokens, n_b, 64))
    ids = np.stack([rng.choice(8, 4, replace=False) for _ in range(n_tokens)]).astype(np.int32)
    check(cpu, ggml_backend, ops.mul_mat_id, ggml.ggml_mul_mat_id, [w, b, ids],
          [F32, F32, I32], 5e-4)


def test_out_prod(cpu, ggml_backend, rng):
    a, b = u(rng, (1, 2, 16, 7)), u(rng, (2, 4, 16, 11))
    check(cpu, ggml_backend, ops.out_prod, ggml.ggml_out_prod, [a, b], [F32, F32], 5e-4)


@pytest.mark.parametrize("kv", [F32, F16, GGMLType.Q8_0], ids=str)
@pytest.mark.parametrize("max_bias,softcap,sinks", [(0.0, 0.0, False), (8.0, 0.0, True),
                                                    (0.0, 30.0, False)])
def test_flash_attn_ext(cpu, ggml_backend, rng, kv, max_bias, softcap, sinks):
    n_q, n_kv, d = 7, 96, 64
    q = u(rng, (1, 8, n_q, d))
    k, v = u(rng, (1, 2, n_kv, d)), u(rng, (1, 2, n_kv, d))
    if kv == GGMLType.Q8_0:
        k, v = (random_blocks(rng, kv, 2 * n_kv, d).reshape(1, 2, n_kv, -1) for _ in range(2))
    elif kv == F16:
        k, v = k.astype(np.float16), v.astype(np.float16)
    mask = np.where(np.arange(n_kv)[None, :] > n_kv - n_q + np.arange(n_q + 9)[:, None],
                    -np.inf, rng.uniform(-1, 0, size=(n_q + 9, n_kv))).astype(np.float16)
    s = u(rng, (8,), -1, 1)
    arrays, types = [q, k, v, mask.reshape(1, 1, *mask.shape)], [F32, kv, kv, F16]
    if sinks:
        arrays, types = arrays + [s], types + [F32]

    def ours(c, *t):
        out = ops.flash_attn_ext(c, *t[:4], 0.125, max_bias, softcap)
        ops.flash_attn_ext_add_sinks(out, t[4] if sinks else None)
        return out

    def theirs(c, *t):
        out = ggml.ggml_flash_attn_ext(c, *t[:4], 0.125, max_bias, softcap)
        if sinks:
            ggml.ggml_flash_attn_ext_add_sinks(out, t[4])
        return out
    check(cpu, ggml_backend, ours, theirs, arrays, types, 5e-4)


@pytest.mark.parametrize("mode,n_dims,sections", [(8, 64, (8, 12, 12, 0)),
                                                  (40, 64, (12, 10, 10, 0)),
                                                  (24, 32, (8, 8, 8, 8))],
                         ids=["mrope", "imrope", "vision"])
def test_rope_multi(cpu, ggml_backend, rng, mode, n_dims, sections):
    head_dim = 64 if mode == 24 else 96
    a = u(rng, (1, 5, 3, head_dim))
    pos = rng.integers(0, 3000, size=(20,)).astype(np.int32)
    secs = (ctypes.c_int * 4)(*sections)
    args = (4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    check(cpu, ggml_backend, lambda c, x, p: ops.rope_multi(c, x, p, None, n_dims, sections,
                                                            mode, *args),
          lambda c, x, p: ggml.ggml_rope_multi(c, x, p, None, n_dims, secs, mode, *args),
          [a, pos], [F32, I32])


@pytest.mark.parametrize("geometry", [(1, 1, 0, 0, 1, 1), (2, 1, 1, 2, 1, 2)])
def test_convolutions(cpu, ggml_backend, rng, geometry):
    x, k = u(rng, (2, 3, 9, 11)), u(rng, (4, 3, 3, 2))
    check(cpu, ggml_backend, lambda c, a, b: ops.conv_2d_direct(c, a, b, *geometry),
          lambda c, a, b: ggml.ggml_conv_2d_direct(c, a, b, *geometry), [k, x], [F32, F32], 5e-4)
    k16 = k.astype(np.float16)
    check(cpu, ggml_backend, lambda c, a, b: ops.conv_2d(c, a, b, *geometry),
          lambda c, a, b: ggml.ggml_conv_2d(c, a, b, *geometry), [k16, x], [F16, F32], 5e-4)
    check(cpu, ggml_backend, lambda c, a, b: ops.im2col(c, a, b, *geometry, True, F32),
          lambda c, a, b: ggml.ggml_im2col(c, a, b, *geometry, True, int(F32)), [k16, x],
          [F16, F32], 0.0)
    kd = u(rng, (3, 1, 3, 3))
    check(cpu, ggml_backend, lambda c, a, b: ops.conv_2d_dw_direct(c, a, b, *geometry),
          lambda c, a, b: ggml.ggml_conv_2d_dw_direct(c, a, b, *geometry), [kd, x], [F32, F32])


def test_transposed_convolutions(cpu, ggml_backend, rng):
    k1, x1 = u(rng, (1, 3, 4, 5)), u(rng, (1, 1, 3, 9))
    check(cpu, ggml_backend, lambda c, a, b: ops.conv_transpose_1d(c, a, b, 2),
          lambda c, a, b: ggml.ggml_conv_transpose_1d(c, a, b, 2, 0, 1), [k1, x1], [F32, F32],
          5e-4)
    # one image: ggml's CPU kernel computes only the first of a batch (the rest stay zero)
    k2, x2 = u(rng, (3, 4, 3, 2)).astype(np.float16), u(rng, (1, 3, 5, 6))
    check(cpu, ggml_backend, lambda c, a, b: ops.conv_transpose_2d_p0(c, a, b, 2),
          lambda c, a, b: ggml.ggml_conv_transpose_2d_p0(c, a, b, 2), [k2, x2], [F16, F32], 5e-4)


@pytest.mark.parametrize("op", [0, 1], ids=["max", "avg"])
def test_pooling(cpu, ggml_backend, rng, op):
    x = u(rng, (2, 3, 9, 13))
    check(cpu, ggml_backend, lambda c, a: ops.pool_1d(c, a, op, 3, 2, 1),
          lambda c, a: ggml.ggml_pool_1d(c, a, op, 3, 2, 1), [x], [F32])
    check(cpu, ggml_backend, lambda c, a: ops.pool_2d(c, a, op, 3, 2, 2, 1, 1, 0),
          lambda c, a: ggml.ggml_pool_2d(c, a, op, 3, 2, 2, 1, 1.0, 0.0), [x], [F32])


@pytest.mark.parametrize("mamba", [1, 2])
def test_ssm(cpu, ggml_backend, rng, mamba):
    sx, c = u(rng, (1, 2, 6, 3 + 5)), u(rng, (6, 4))
    check(cpu, ggml_backend, ops.ssm_conv, ggml.ggml_ssm_conv, [sx, c], [F32, F32])
    ns, nt, nh, nr, nc, ng = 2, 9, 4, 3, 8, 2 if mamba == 2 else 4
    s, x = u(rng, (2, nh, nr, nc)), u(rng, (ns, nt, nh, nr))
    dt = u(rng, (ns, nt, nh), -3, 1)
    a = -rng.uniform(0.5, 2, size=(nh, 1 if mamba == 2 else nc)).astype(np.float32)
    b, cc = u(rng, (ns, nt, ng, nc)), u(rng, (ns, nt, ng, nc))
    ids = np.array([1, 0], np.int32)
    check(cpu, ggml_backend, ops.ssm_scan, ggml.ggml_ssm_scan, [s, x, dt, a, b, cc, ids],
          [F32] * 6 + [I32])


def test_wkv6_and_gla(cpu, ggml_backend, rng):
    size, heads, n_seqs, per_seq = 16, 4, 2, 11
    k, v, r = (u(rng, (n_seqs * per_seq, heads, size)) for _ in range(3))
    w = rng.uniform(0.3, 1.0, size=k.shape).astype(np.float32)
    tf, state = u(rng, (heads, size)), u(rng, (n_seqs, heads * size * size))
    check(cpu, ggml_backend, ops.rwkv_wkv6, ggml.ggml_rwkv_wkv6, [k, v, r, tf, w, state],
          [F32] * 6)
    check(cpu, ggml_backend, lambda c, *t: ops.gated_linear_attn(c, *t, 0.25),
          lambda c, *t: ggml.ggml_gated_linear_attn(c, *t, 0.25), [k, v, r, w, state], [F32] * 5)


def test_soft_max_with_sinks(cpu, ggml_backend, rng):
    a, mask = u(rng, (1, 4, 6, 33), -5, 5), u(rng, (1, 1, 6, 33), -3, 0).astype(np.float16)
    sinks = u(rng, (4,), -2, 2)

    def ours(c, x, m, s):
        t = ops.soft_max_ext(c, x, m, 0.7, 0.0)
        ops.soft_max_add_sinks(t, s)
        return t

    def theirs(c, x, m, s):
        t = ggml.ggml_soft_max_ext(c, x, m, 0.7, 0.0)
        ggml.ggml_soft_max_add_sinks(t, s)
        return t
    check(cpu, ggml_backend, ours, theirs, [a, mask, sinks], [F32, F16, F32], 1e-6)
