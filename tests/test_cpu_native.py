"""The CPU backend's compiled kernels: products read straight from the blocks (in float32, and
with int16 activations), and fp16 conversion, against float64 numpy of ggml's decoded values
and against the numpy path."""

from __future__ import annotations

import os

import numpy as np
import pytest

import polydev
from polydev import GGMLType, RopeMode, dequantize, ops
from polydev.backends.array.matmul import bind_mul_mat
from polydev.backends.cpu import matmul as cpu_matmul
from polydev.backends.cpu import native
from polydev.backends.cpu.native import kernels
from polydev.backends.cpu.product_path import BLOCK_PRODUCT_ROWS

from conftest import assert_close, compute, nmse
from test_ops import f32, random_blocks

pytestmark = pytest.mark.skipif(kernels() is None, reason="no C compiler for the CPU kernels")

NATIVE_TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]
K_TYPES = [GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]


@pytest.fixture
def cpu():
    """The CPU backend computing exactly: its float32 products (numerics="exact")."""
    with polydev.init_backend("CPU") as b:
        b.set_numerics("exact")
        yield b


def _product(cpu, raw, qtype, b):
    return compute(cpu, lambda ctx, w, x: ops.mul_mat(ctx, w, x), raw, b, types=[qtype, None])


@pytest.mark.parametrize("qtype", NATIVE_TYPES, ids=str)
# 1 and 3 rows: from the blocks; 9: one pass of 8 rows and one of 1; 40: decoded tiles + BLAS
@pytest.mark.parametrize("n", [1, 3, 9, 40])
def test_block_product_equals_decoded_float64(cpu, rng, qtype, n):
    m, k = 37, 512                      # an odd row count: the threads' chunks end mid-way
    raw = random_blocks(rng, qtype, m, k)
    b = f32(rng, (1, 1, n, k))
    w = dequantize(raw, qtype).reshape(m, k).astype(np.float64)
    assert_close(_product(cpu, raw, qtype, b)[0, 0], b[0, 0].astype(np.float64) @ w.T, 1e-10)


def int16_error_bound(x: np.ndarray, w: np.ndarray, group: int) -> np.ndarray:
    """The most the int16 products may differ from float64 for activations x [n, K] and
    decoded weights w [M, K]: each activation is rounded to the nearest of its ``group``'s
    steps of max|x| / 32767 (half a step off at most), plus float32 rounding of the sums
    (relative to sum |w| |x|)."""
    groups = np.abs(x.astype(np.float64)).reshape(x.shape[0], -1, group).max(axis=2)
    half_step = np.repeat(groups / 32767 / 2, group, axis=1)       # [n, K]
    magnitude = np.abs(x.astype(np.float64)) @ np.abs(w).T
    return (1 + 1e-6) * half_step @ np.abs(w).T + 1e-6 * magnitude


def _int16_rows(qtype) -> list[int]:
    """1: decode; 4 and 5: a pass of four rows, and one row after it; 8 and 32: the fewest and
    most rows before BLAS, and the K-quants' GEMM from 8 on (70: tiles of four rows and two
    left over)."""
    return [1, 4, 5, 8, 32, 70] if qtype in K_TYPES else [1, 4, 5, 8, 32]


@pytest.mark.parametrize("qtype, n", [(t, n) for t in NATIVE_TYPES for n in _int16_rows(t)],
                         ids=str)
def test_int16_product_within_its_rounding_of_the_activations(fast_cpu, rng, qtype, n):
    m, k = 37, 512                       # 37 weight rows: the GEMM's tiles end mid-way
    raw = random_blocks(rng, qtype, m, k)
    x = f32(rng, (1, 1, n, k))
    # the activations share one scale per block of the weight's type (32 or 256 values), so
    # a block of small values keeps its own precision
    group = qtype.traits.block_size
    x[0, 0, :, :group] *= 1e-3
    w = dequantize(raw, qtype).reshape(m, k).astype(np.float64)
    out = _product(fast_cpu, raw, qtype, x)[0, 0]
    ref = x[0, 0].astype(np.float64) @ w.T
    assert np.all(np.abs(out - ref) <= int16_error_bound(x[0, 0], w, group))
    assert nmse(out, ref) > 0            # the integer path ran: it is not float32-exact


@pytest.mark.parametrize("qtype", K_TYPES, ids=str)
def test_int16_gemm_is_the_decode_step_product_row_by_row(fast_cpu, rng, qtype):
    """A prompt's rows (the GEMM) give what each row gives alone (the decode-step kernel):
    the same int16 activations and integer sums, up to the order of the float sums."""
    raw = random_blocks(rng, qtype, 45, 768)
    x = f32(rng, (1, 1, 41, 768))
    together = _product(fast_cpu, raw, qtype, x)[0, 0]
    alone = np.concatenate([_product(fast_cpu, raw, qtype, x[:, :, i:i + 1])[0, 0]
                            for i in range(x.shape[2])])
    np.testing.assert_allclose(together, alone, rtol=1e-5, atol=1e-5 * np.abs(alone).max())


def test_int16_product_of_many_rows_without_a_gemm_is_the_float32_product(fast_cpu, cpu, rng):
    """Above BLOCK_PRODUCT_ROWS rows (a prompt) the 32-value types multiply through BLAS under
    both numerics."""
    raw = random_blocks(rng, GGMLType.Q8_0, 16, 256)
    x = f32(rng, (1, 1, BLOCK_PRODUCT_ROWS + 1, 256))
    np.testing.assert_array_equal(_product(fast_cpu, raw, GGMLType.Q8_0, x),
                                  _product(cpu, raw, GGMLType.Q8_0, x))


@pytest.mark.parametrize("qtype", [GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K], ids=str)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_int16_product_carries_non_finite_activations(fast_cpu, rng, qtype, bad):
    """An inf or NaN activation makes the rows it meets NaN or inf, as in float32, never a
    finite made-up value; the other rows are unaffected."""
    raw = random_blocks(rng, qtype, 8, 512)
    x = f32(rng, (1, 1, 2, 512))
    x[0, 0, 1, 300] = bad
    out = _product(fast_cpu, raw, qtype, x)[0, 0]
    assert np.all(np.isfinite(out[0])) and not np.any(np.isfinite(out[1]))


def test_numerics_is_checked(fast_cpu):
    with pytest.raises(polydev.errors.InvalidArgumentError, match="exact, fast"):
        fast_cpu.set_numerics("fastest")
    assert fast_cpu.numerics == "fast"


def test_f16_weight_and_many_tiles(cpu, rng, monkeypatch):
    monkeypatch.setattr(cpu_matmul, "TILE_BYTES", 4 * 64 * 5)      # 5 rows per tile
    w = f32(rng, (1, 1, 23, 64)).astype(np.float16)
    b = f32(rng, (1, 1, 50, 64))
    out = compute(cpu, lambda ctx, a_, x: ops.mul_mat(ctx, a_, x), w, b)
    ref = b[0, 0].astype(np.float64) @ w[0, 0].astype(np.float64).T
    assert_close(out[0, 0], ref, 1e-10)


def test_batched_activations_share_one_weight(cpu, rng):
    """Activations (2, 3, n, K) against one weight matrix: all rows in one product."""
    m, k = 16, 256
    raw = random_blocks(rng, GGMLType.Q4_K, m, k)
    b = f32(rng, (2, 3, 4, k))
    out = _product(cpu, raw, GGMLType.Q4_K, b)
    w = dequantize(raw, GGMLType.Q4_K).reshape(m, k).astype(np.float64)
    assert_close(out, b.astype(np.float64) @ w.T, 1e-10)


def test_kernels_match_the_numpy_path(cpu, rng):
    """The compiled path and the array kernel (decode to float32, BLAS) agree to float32
    rounding: the same decoded values, only the order of the sums differs. Rounding scales
    with the sum of the terms' magnitudes, not with the result, which cancellation can make
    small (an element of 1.09 summed from terms of up to 400 differs by 3e-5 between BLAS's
    order on AMD Zen 4 and ours): the bound is relative to sum |w| |x|."""
    ctx = polydev.Context()
    w = ctx.new_tensor(GGMLType.Q6_K, (512, 24))
    x = ctx.new_tensor(GGMLType.F32, (512, 3))
    out = ops.mul_mat(ctx, w, x)
    buf = polydev.alloc_ctx_tensors(ctx, cpu)
    try:
        raw = random_blocks(rng, GGMLType.Q6_K, 24, 512)
        w.set_data(raw)
        values = f32(rng, (3, 512))
        x.set_data(values)
        native = cpu.bind(out)
        native()
        fast = out.numpy().copy()
        bind_mul_mat(cpu.env, out)()
        weights = dequantize(raw, GGMLType.Q6_K).reshape(24, 512).astype(np.float64)
        magnitude = np.abs(values.astype(np.float64)) @ np.abs(weights).T
        assert np.all(np.abs(fast - out.numpy()).reshape(magnitude.shape) <= 1e-6 * magnitude)
    finally:
        buf.close()


def _rope_float64(x, pos, ff, mode, n_dims, freq_base, freq_scale, ext_factor, attn_factor,
                  beta_fast, beta_slow, n_ctx_orig):
    """ROPE of x [tokens, heads, channels] in float64 from ggml's float32 angles (its running
    product p s^i, frequency factors, YaRN's ramp and magnitude scale: at position 5000 the
    float32 angle itself is off by up to 2e-4 rad, which ggml and both kernels share), the
    first n_dims channels turned, the rest kept."""
    from polydev.ops import yarn_corr_dims, yarn_mscale, yarn_ramp_width

    half, f32_ = n_dims // 2, np.float32
    scale = f32_(freq_base) ** f32_(-2.0 / n_dims)
    extrap = np.empty((pos.size, half), np.float32)
    extrap[:, 0] = pos
    for i in range(1, half):
        extrap[:, i] = extrap[:, i - 1] * scale
    extrap /= ff[:half]
    low, high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
    ramp = (np.arange(half, dtype=np.float32) - f32_(low)) / f32_(yarn_ramp_width(low, high))
    mix = (1 - np.minimum(1, np.maximum(0, ramp))) * f32_(ext_factor)
    theta = (extrap * f32_(freq_scale)) * (1 - mix) + extrap * mix          # float32
    mscale = float(yarn_mscale(attn_factor, freq_scale, ext_factor))
    theta = theta.astype(np.float64)
    cos, sin = (np.cos(theta) * mscale)[:, None], (np.sin(theta) * mscale)[:, None]
    y = x.astype(np.float64).copy()
    pairs = (slice(0, half), slice(half, n_dims)) if mode == RopeMode.NEOX else (
        slice(0, n_dims, 2), slice(1, n_dims, 2))
    x0, x1 = y[..., pairs[0]].copy(), y[..., pairs[1]].copy()
    y[..., pairs[0]] = x0 * cos - x1 * sin
    y[..., pairs[1]] = x0 * sin + x1 * cos
    return y


@pytest.mark.parametrize("mode", [RopeMode.NORMAL, RopeMode.NEOX], ids=["normal", "neox"])
@pytest.mark.parametrize("inplace", [False, True])
def test_rope_against_float64_and_the_array_kernel(cpu, rng, mode, inplace):
    """The compiled ROPE (its angles computed in C) over rows of a strided view (every other
    head of a bigger tensor), 24 of 40 channels turned and the rest copied, with YaRN and
    frequency factors: within a few float32 roundings of float64, and of the array kernel
    (whose numpy float32 cos and sin are an ulp off more often than libm's)."""
    from polydev.backends.array.rope import bind_rope
    from polydev.backends.cpu.rope import native_rope_ok

    ctx = polydev.Context()
    big = ctx.new_tensor(GGMLType.F32, (40, 6, 5))
    x = ctx.view_3d(big, 40, 3, 5, 2 * big.nb[1], big.nb[2], 0)
    pos = ctx.new_tensor(GGMLType.I32, (5,))
    ff = ctx.new_tensor(GGMLType.F32, (12,))
    yarn = (4096, 50000.0, 0.5, 1.0, 0.9, 32.0, 1.0)
    out = ops.rope_ext(ctx, x, pos, ff, 24, mode, *yarn, inplace=inplace)
    buf = polydev.alloc_ctx_tensors(ctx, cpu)
    try:
        values = f32(rng, (5, 6, 40))
        positions = np.array([0, 7, 300, 2047, 5000], np.int32)
        factors = rng.uniform(1.0, 3.0, 12).astype(np.float32)
        pos.set_data(positions)
        ff.set_data(factors)
        assert native_rope_ok(out)
        results = []
        for bind in (cpu.bind, lambda node: bind_rope(cpu.env, node)):
            big.set_data(values)
            bind(out)()
            results.append(out.numpy().reshape(5, 3, 40).copy())
        n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = yarn
        want = _rope_float64(values[:, 0::2], positions, factors, mode, 24, freq_base,
                             freq_scale, ext_factor, attn_factor, beta_fast, beta_slow,
                             n_ctx_orig)
        scale = np.abs(values[:, 0::2]).max()
        np.testing.assert_allclose(results[0], want, rtol=0, atol=4e-6 * scale)
        np.testing.assert_array_equal(results[0][..., 24:], values[:, 0::2, 24:])
        np.testing.assert_allclose(results[0], results[1], rtol=0, atol=2e-6 * scale)
        # the compiled angles nearer float64 than numpy's, over these 5 x 12 angles
        assert (np.abs(results[0] - want).max() <= np.abs(results[1] - want).max())
    finally:
        buf.close()


def test_ropes_of_a_step_share_their_angles_and_follow_new_positions(cpu, rng):
    """Two ROPEs of one graph with the same positions and parameters (Q's and K's) share one
    angle table, and a third with another base and frequency factors (a gemma-3 global layer
    beside its local ones, say) has its own: each step's positions, and factors rewritten in
    place, turn all three as the array kernel turns each alone (no table left stale)."""
    from polydev.backends.array.rope import bind_rope

    ctx = polydev.Context()
    q = ctx.new_tensor(GGMLType.F32, (16, 4, 2))
    k = ctx.new_tensor(GGMLType.F32, (16, 2, 2))
    pos = ctx.new_tensor(GGMLType.I32, (2,))
    ff = ctx.new_tensor(GGMLType.F32, (8,))
    yarn = (4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
    ropes = [ops.rope_ext(ctx, q, pos, None, 16, RopeMode.NEOX, *yarn),
             ops.rope_ext(ctx, k, pos, None, 16, RopeMode.NEOX, *yarn),
             ops.rope_ext(ctx, k, pos, ff, 16, RopeMode.NEOX, 4096, 1e6, 1.0, 0.0, 1.0,
                          32.0, 1.0)]
    buf = polydev.alloc_ctx_tensors(ctx, cpu)
    try:
        calls = [cpu.bind(r) for r in ropes]
        tables = [call.keep_alive[1] for call in calls]
        assert tables[0] is tables[1] and tables[2] is not tables[0]
        reference = [bind_rope(cpu.env, r) for r in ropes]
        for step in range(3):
            q.set_data(f32(rng, (2, 4, 16)))
            k.set_data(f32(rng, (2, 2, 16)))
            pos.set_data(np.array([2 * step, 2 * step + 1000], np.int32))
            ff.set_data(rng.uniform(1.0, 4.0, 8).astype(np.float32))
            got = []
            for call, rope in zip(calls, ropes):
                call()
                got.append(rope.numpy().copy())
            for call, rope, mine in zip(reference, ropes, got):
                call()
                np.testing.assert_allclose(mine, rope.numpy(), rtol=0, atol=2e-5)
        ff.set_data(rng.uniform(1.0, 4.0, 8).astype(np.float32))    # the factors alone
        calls[2]()
        mine = ropes[2].numpy().copy()
        reference[2]()
        np.testing.assert_allclose(mine, ropes[2].numpy(), rtol=0, atol=2e-5)
    finally:
        buf.close()


@pytest.mark.parametrize("inplace", [False, True])
def test_rms_norm_of_strided_rows_equals_float64(cpu, rng, inplace):
    """The compiled RMS_NORM (ggml's: the sum of squares in double) over every other row of
    a bigger tensor, in place or not, against float64."""
    from polydev.backends.cpu.norm import native_rms_norm_ok

    values = f32(rng, (3, 8, 96), -4, 4)

    def build(ctx, x):
        rows = ctx.view_3d(x, 96, 4, 3, 2 * x.nb[1], x.nb[2], 0)
        out = ops.rms_norm(ctx, rows, 1e-5, inplace=inplace)
        assert native_rms_norm_ok(out)
        return out
    out = compute(cpu, build, values)
    rows = values[:, ::2].astype(np.float64)
    ref = rows / np.sqrt(np.mean(rows * rows, axis=-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out.reshape(ref.shape), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dst_type", [GGMLType.F16, GGMLType.F32], ids=str)
@pytest.mark.parametrize("idx_type", [np.int32, np.int64], ids=["i32", "i64"])
def test_set_rows_equals_numpy_and_checks_before_writing(cpu, rng, dst_type, idx_type):
    """The compiled SET_ROWS writes numpy's fp16 bits (ties, subnormals, infinities), with
    the indices broadcast over dim 2 as ggml does; a bad index raises OutOfBoundsError and
    leaves the destination as it was."""
    from polydev.backends.cpu.set_rows import native_set_rows_ok
    from polydev.errors import OutOfBoundsError

    ctx = polydev.Context()
    dst = ctx.new_tensor(dst_type, (40, 10, 4))
    src = ctx.new_tensor(GGMLType.F32, (40, 3, 4))
    idx = ctx.new_tensor(GGMLType.I64 if idx_type is np.int64 else GGMLType.I32, (3, 2))
    out = ops.set_rows(ctx, dst, src, idx)
    assert native_set_rows_ok(out)
    buf = polydev.alloc_ctx_tensors(ctx, cpu)
    try:
        values = f32(rng, (4, 3, 40), -70000, 70000)
        values[0, 0, :6] = [np.inf, -np.inf, 2.0 ** -20, 65520.0, 1 + 2.0 ** -11, -0.0]
        rows = np.array([[9, 0, 4], [1, 7, 2]], idx_type)
        src.set_data(values)
        idx.set_data(rows)
        dtype = np.float16 if dst_type == GGMLType.F16 else np.float32
        dst.set_data(np.zeros((4, 10, 40), dtype))
        cpu.bind(out)()
        want = np.zeros((4, 10, 40), dtype)
        for i2 in range(4):
            want[i2, rows[i2 % 2]] = values[i2].astype(want.dtype)
        got = dst.numpy().reshape(want.shape)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        before = dst.numpy().copy()
        idx.set_data(np.array([[9, 0, 4], [1, 10, 2]], idx_type))
        with pytest.raises(OutOfBoundsError, match="set_rows"):
            cpu.bind(out)()
        np.testing.assert_array_equal(dst.numpy(), before)
    finally:
        buf.close()


def test_unsupported_shapes_fall_back(cpu, rng):
    """A weight with batch dims is not the kernels' shape: the array kernel computes it."""
    w = f32(rng, (1, 2, 8, 64)).astype(np.float16)
    b = f32(rng, (1, 2, 3, 64))
    out = compute(cpu, lambda ctx, a_, x: ops.mul_mat(ctx, a_, x), w, b)
    assert_close(out, b.astype(np.float64) @ np.swapaxes(w.astype(np.float64), -1, -2), 1e-7)


@pytest.mark.parametrize("shape,axes", [((3, 5, 40), None), ((2, 4, 7, 24), (0, 2, 1, 3)),
                                        ((9, 16), None)])
def test_f16_to_f32_matches_numpy(cpu, rng, shape, axes):
    a = (rng.standard_normal(shape) * 1e3).astype(np.float16)
    flat = a.reshape(-1)
    flat[:6] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 6e-8]      # specials and a subnormal
    view = a.transpose(axes) if axes else a[..., 1:]
    got = cpu.env.float32(view)
    np.testing.assert_array_equal(got, view.astype(np.float32))


@pytest.mark.parametrize("max_bias,softcap,sinks", [(0.0, 0.0, False), (8.0, 0.0, True),
                                                    (0.0, 20.0, False), (4.0, 5.0, True)])
def test_decode_attention_over_f16_cache(cpu, rng, max_bias, softcap, sinks):
    """The compiled FLASH_ATTN_EXT (a few queries, fp16 K/V): GQA, two sequences sharing a
    mask, ALiBi, softcap, sinks and a query that sees nothing, against float64."""
    from test_ops_attention import _causal_mask

    q = f32(rng, (2, 8, 3, 64), -3, 3)
    k = f32(rng, (2, 2, 50, 64), -3, 3).astype(np.float16)
    v = f32(rng, (2, 2, 50, 64)).astype(np.float16)
    mask = _causal_mask(rng, 3, 50, n_pad=1, heads=4)
    mask[..., :5] = -np.inf                               # cells no query sees
    mask[..., 2, :] = -np.inf                             # query 2 sees nothing
    out = _attention_against_float64(cpu, q, k, v, mask, f32(rng, (8,), -2, 2), max_bias,
                                     softcap, sinks)
    if not sinks:
        assert np.all(out[:, 2] == 0)


# n_head, n_head_kv, D, Dv: 8 query heads of a KV head at once, 8 and 4 of 12, two passes of
# 8 of 16, a head wider than 128 and a Dv unlike D
@pytest.mark.parametrize("heads", [(16, 2, 64, 64), (24, 2, 128, 128), (32, 2, 64, 64),
                                   (8, 4, 256, 96)], ids=lambda h: "x".join(map(str, h)))
@pytest.mark.parametrize("max_bias,softcap,sinks", [(0.0, 0.0, False), (4.0, 5.0, True)])
# spans: each query sees most of its span (the blocked kernel); interleaved: the cells of four
# sequences alternate and each query sees a quarter of its span (the grouped row kernel)
@pytest.mark.parametrize("cells", ["spans", "interleaved"])
def test_decode_attention_heads_of_a_kv_head_together(cpu, rng, heads, max_bias, softcap,
                                                      sinks, cells):
    """A mask shared by the heads (a model's): the heads of one KV head attend together, each
    cell's K and V read once for them; two sequences, a run of hidden cells longer than 16, a
    query that sees nothing; against float64."""
    n_head, n_head_kv, d, dv = heads
    q = f32(rng, (2, n_head, 3, d), -3, 3)
    k = f32(rng, (2, n_head_kv, 300, d), -3, 3).astype(np.float16)
    v = f32(rng, (2, n_head_kv, 300, dv)).astype(np.float16)
    mask = np.full((1, 1, 4, 300), -np.inf, dtype=np.float16)
    if cells == "spans":
        mask[..., 0, 40:90] = 0                           # a block, then every third cell
        mask[..., 0, 200::3] = rng.uniform(-1, 0, size=34)
        mask[..., 1, 1::2] = 0
    else:
        mask[..., 0, 0::4] = rng.uniform(-1, 0, size=75)
        mask[..., 0, 100:160] = -np.inf                   # a longer run of hidden cells
        mask[..., 1, 3::4] = 0
    out = _attention_against_float64(cpu, q, k, v, mask, f32(rng, (n_head,), -2, 2), max_bias,
                                     softcap, sinks)
    if not sinks:
        assert np.all(out[:, 2] == 0)                   # query 2 sees nothing


@pytest.mark.parametrize("n_seq,n_q", [(1, 1), (1, 2), (2, 1), (1, 12)])
@pytest.mark.parametrize("max_bias,softcap,sinks", [(0.0, 0.0, False), (4.0, 5.0, True),
                                                    (4.0, 0.0, True)])
@pytest.mark.parametrize("n_kv", [130, 700])
def test_attention_of_fewer_kv_heads_than_threads_splits_its_cells(rng, n_seq, n_q, max_bias,
                                                                    softcap, sinks, n_kv):
    """One KV head (gemma-3's) gives the blocked kernel fewer tiles than threads (one
    sequence: one tile for two threads; two sequences: two, not split): each tile's cells
    are split in whole blocks over the threads and merged after (12 queries: a tile of 48
    rows, the transposed kernel's unless soft-capped). A part that sees no cell
    (130 cells: one block of visible ones), a run of hidden cells across the split, a query
    that sees nothing; against float64 and equal, up to float32 rounding, to one thread's
    single pass."""
    q = f32(rng, (n_seq, 4, n_q, 256), -3, 3)
    k = f32(rng, (n_seq, 1, n_kv, 256), -3, 3).astype(np.float16)
    v = f32(rng, (n_seq, 1, n_kv, 256)).astype(np.float16)
    mask = np.zeros((1, 1, n_q + 1, n_kv), dtype=np.float16)
    mask[..., :70] = -np.inf                               # cells before the visible span
    blocks = -(-(n_kv - 70) // 64)                         # the span's blocks of 64 cells
    split = 70 + blocks // 2 * 64                          # where the second part starts
    mask[..., split - 20:split + 20] = -np.inf             # hidden across the split
    mask[..., 0, n_kv - 3:] = rng.uniform(-2, 0, size=3)
    mask[..., n_q:, :] = -np.inf                           # the padding row
    if n_q > 1:
        mask[..., 1, :] = -np.inf                          # query 1 sees nothing
    sinks_values = f32(rng, (4,), -2, 2)
    outs = []
    for threads in (2, 1):
        with polydev.init_backend("CPU") as backend:
            backend.set_numerics("exact")
            backend.set_n_threads(threads)
            outs.append(_attention_against_float64(backend, q, k, v, mask, sinks_values,
                                                   max_bias, softcap, sinks))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    if n_q > 1 and not sinks:
        assert np.all(outs[0][:, 1] == 0)


def _attention_against_float64(cpu, q, k, v, mask, sinks_values, max_bias, softcap, sinks):
    """FLASH_ATTN_EXT (scale 0.3) on ``cpu``, checked against float64; its result."""
    from test_ops_attention import _attention_ref

    def build(ctx, a, b, c, m, sk):
        t = ops.flash_attn_ext(ctx, a, b, c, m, 0.3, max_bias, softcap)
        if sinks:
            ops.flash_attn_ext_add_sinks(t, sk)
        return t
    out = compute(cpu, build, q, k, v, mask, sinks_values)
    ref = _attention_ref(*(x.astype(np.float64) for x in (q, k, v)), mask, 0.3, max_bias,
                         softcap, sinks_values.astype(np.float64) if sinks else None)
    assert_close(out, ref, 1e-9)
    return out


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K],
                         ids=str)
@pytest.mark.parametrize("numerics", ["exact", "fast"])
@pytest.mark.parametrize("n_tokens", [1, 40])            # a decode step; a prompt's GEMMs
def test_mul_mat_id_reads_the_experts_blocks(rng, qtype, numerics, n_tokens):
    """MUL_MAT_ID multiplies each expert in use from its own blocks (no float32 copy of the
    experts in the weight cache), by the kernel MUL_MAT would take, against float64."""
    from test_ops_products import _mul_mat_id_ref, _routing

    n_expert, m, k = 6, 40, 512
    blocks = random_blocks(rng, qtype, n_expert * m, k)
    ids = _routing(rng, n_tokens, 3, n_expert)
    b = f32(rng, (1, n_tokens, 1, k))
    with polydev.init_backend("CPU") as cpu:
        cpu.set_numerics(numerics)
        cache = cpu.device.weight_cache
        cache.clear()
        out = compute(cpu, lambda ctx, a_, x, i: ops.mul_mat_id(ctx, a_, x, i),
                      blocks.reshape(1, n_expert, m, -1), b, ids, types=[qtype, None, None])
        assert cache.nbytes == 0
    w = dequantize(blocks, qtype).reshape(n_expert, m, k).astype(np.float64)
    # fast: int16 activations, a relative error of 1.5e-5 of their block's largest at most
    # (int8 activations would give NMSE near 1e-5)
    assert_close(out[0], _mul_mat_id_ref(w, b[0].astype(np.float64), ids),
                 1e-12 if numerics == "exact" else 1e-8)


@pytest.mark.parametrize("form", ["fused", "swapped", "split"])
@pytest.mark.parametrize("rows,n", [(1, 5632), (3, 37), (70, 260)])
def test_swiglu_equals_float64(cpu, rng, form, rows, n):
    """SWIGLU of float32 rows (fused [x, gate], swapped, or two tensors; rows whose length
    is not a multiple of the vector width) against float64."""
    x, g = f32(rng, (1, 1, rows, n), -8, 8), f32(rng, (1, 1, rows, n))
    if form == "split":
        out = compute(cpu, lambda ctx, a, b: ops.swiglu(ctx, a, b), x, g)
    else:
        both = np.concatenate([g, x] if form == "swapped" else [x, g], axis=-1)
        out = compute(cpu, lambda ctx, a: ops.swiglu(ctx, a, swapped=form == "swapped"), both)
    x64 = x.astype(np.float64)
    assert_close(out, x64 / (1 + np.exp(-x64)) * g, 1e-13)


@pytest.mark.parametrize("qtype", [GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K],
                         ids=str)
def test_get_rows_of_blocks_is_the_decoded_rows(cpu, rng, qtype):
    """GET_ROWS of block-format rows gives ggml's decoded rows exactly; a bad index is an
    OutOfBoundsError that says the range."""
    raw = random_blocks(rng, qtype, 30, 512)
    idx = np.array([3, 0, 29, 3], np.int32)
    out = compute(cpu, lambda ctx, a, i: ops.get_rows(ctx, a, i), raw, idx,
                  types=[qtype, None])
    np.testing.assert_array_equal(out.reshape(4, 512),
                                  dequantize(raw, qtype).reshape(30, 512)[idx])
    with pytest.raises(polydev.errors.OutOfBoundsError, match=r"\[0, 30\)"):
        compute(cpu, lambda ctx, a, i: ops.get_rows(ctx, a, i), raw,
                np.array([1, 30], np.int32), types=[qtype, None])


PROMPT_CASES = [  # n_seq, n_head, n_head_kv, n_q, n_kv, D, Dv
    (1, 8, 2, 40, 200, 64, 64),      # grouped queries; cells not a whole number of blocks
    (2, 4, 4, 9, 70, 80, 80),        # two sequences, a head size of 80
    (1, 32, 4, 33, 100, 128, 128),   # eight heads per KV head: four queries a tile
    (1, 4, 1, 12, 65, 16, 24),       # one KV head, Dv != D and not a multiple of 16
    (1, 6, 2, 12, 130, 64, 64),      # three heads per KV head: 36 rows, padded to 48 or 64
    (1, 32, 1, 2, 100, 64, 64),      # 32 heads per KV head: even one query's tile is 32 rows
]


@pytest.mark.parametrize("case", PROMPT_CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("max_bias,softcap,sinks", [(0.0, 0.0, False), (8.0, 0.0, True),
                                                    (0.0, 20.0, False)])
def test_prompt_attention_over_f16_cache(cpu, rng, case, max_bias, softcap, sinks):
    """The compiled FLASH_ATTN_EXT of many queries (the blocked kernel): a causal mask with
    padding rows, cells no query sees, a query that sees nothing, ALiBi, softcap and sinks,
    against float64."""
    from test_ops_attention import _causal_mask

    n_seq, n_head, n_head_kv, n_q, n_kv, dk, dv = case
    q = f32(rng, (n_seq, n_head, n_q, dk), -3, 3)
    k = f32(rng, (n_seq, n_head_kv, n_kv, dk), -3, 3).astype(np.float16)
    v = f32(rng, (n_seq, n_head_kv, n_kv, dv)).astype(np.float16)
    mask = _causal_mask(rng, n_q, n_kv, n_pad=2)
    mask[..., :3] = -np.inf                               # cells no query sees
    mask[..., n_q // 2, :] = -np.inf                      # a query that sees nothing
    out = _attention_against_float64(cpu, q, k, v, mask, f32(rng, (n_head,), -2, 2), max_bias,
                                     softcap, sinks)
    if not sinks:
        assert np.all(out[:, n_q // 2] == 0)


@pytest.mark.parametrize("max_bias", [0.0, 8.0])
@pytest.mark.parametrize("per_head", [False, True])
def test_prompt_attention_of_a_plain_causal_mask(cpu, rng, max_bias, per_head):
    """A causal mask of 0 and -inf only (-0 in places), as a model's prompt has: the tiles'
    blocks left of the diagonal take no mask at all in the transposed kernel, those on it
    do; 150 queries of four heads per KV head over 400 cells (a last block of 16), ALiBi or
    none, one mask for all heads or one per head (each head hides cells of its own), against
    float64."""
    n_q, n_kv, n_head = 150, 400, 16
    q = f32(rng, (1, n_head, n_q, 64), -3, 3)
    k = f32(rng, (1, 4, n_kv, 64), -3, 3).astype(np.float16)
    v = f32(rng, (1, 4, n_kv, 64)).astype(np.float16)
    past = n_kv - n_q
    mask = np.where(np.arange(n_kv)[None, :] > past + np.arange(n_q)[:, None], -np.inf, 0.0)
    mask[::3, 100:200] = -0.0
    mask = np.repeat(mask[None, None], n_head if per_head else 1, axis=1)
    if per_head:
        for h in range(n_head):
            mask[0, h, :, 7 * h:7 * h + 30] = -np.inf
    _attention_against_float64(cpu, q, k, v, mask.astype(np.float16), f32(rng, (n_head,)),
                               max_bias, 0.0, False)


@pytest.mark.parametrize("n_q", [16, 48])        # the row kernel's tiles; the transposed one's
def test_prompt_attention_carries_nan(cpu, rng, n_q):
    """A NaN among the keys reaches the outputs of the queries that see it, never hidden."""
    q = f32(rng, (1, 4, n_q, 64))
    k = f32(rng, (1, 4, 80, 64)).astype(np.float16)
    v = f32(rng, (1, 4, 80, 64)).astype(np.float16)
    k[0, 1, 70, 5] = np.nan
    out = compute(cpu, lambda ctx, a, b, c: ops.flash_attn_ext(ctx, a, b, c, None, 0.125),
                  q, k, v)
    assert np.all(np.isnan(out[0, :, 1])) and np.all(np.isfinite(np.delete(out[0], 1, axis=1)))


@pytest.mark.parametrize("n_q", [8, 48])          # tiles of 16 rows (row kernel) and of 64
def test_a_nan_in_cells_the_mask_hides_stays_hidden(cpu, rng, n_q):
    """ggml skips the cells a mask hides (-inf), so a NaN key there reaches no query: a causal
    prompt's NaN at its last cell leaves every query but the last finite."""
    n_kv = 80
    q = f32(rng, (1, 4, n_q, 64))
    k = f32(rng, (1, 2, n_kv, 64)).astype(np.float16)
    v = f32(rng, (1, 2, n_kv, 64)).astype(np.float16)
    k[0, 1, n_kv - 1, 5] = np.nan
    past = n_kv - n_q
    mask = np.where(np.arange(n_kv)[None, :] > past + np.arange(n_q)[:, None], -np.inf, 0.0)
    mask = mask.astype(np.float16)[None, None]
    out = compute(cpu, lambda ctx, a, b, c, m: ops.flash_attn_ext(ctx, a, b, c, m, 0.125),
                  q, k, v, mask)
    assert np.all(np.isnan(out[0, -1, 2:])) and np.all(np.isfinite(out[0, :-1]))
    assert np.all(np.isfinite(out[0, -1, :2]))            # the heads of the other KV head


def test_openmp_spin_count_is_set_as_the_kernels_load_unless_the_user_sets_one(monkeypatch):
    """libgomp reads GOMP_SPINCOUNT as it loads with the kernels: spin_count() then, a user's
    OMP_WAIT_POLICY or GOMP_SPINCOUNT instead, and the environment is left as it was."""
    seen = []
    monkeypatch.setattr(native.ctypes, "CDLL", lambda path: seen.append(
        (os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"))))
    monkeypatch.setattr(native, "host_core_sharers", lambda: ())
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(name, raising=False)
    native._open_library(kernels().path)
    assert seen.pop() == (native.SPIN_COUNT, None) and "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    native._open_library(kernels().path)
    assert seen.pop() == (None, "passive") and "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    native._open_library(kernels().path)
    assert seen.pop() == ("7", None) and os.environ["GOMP_SPINCOUNT"] == "7"


def test_openmp_threads_spin_briefly_beside_a_driver_on_the_same_cores(monkeypatch):
    """Alone, the kernels' threads spin SPIN_COUNT rounds (outlasting the Python between decode
    steps); once a device that computes on the host's cores has opened a backend (an OpenCL
    CPU device), SHARED_SPIN_COUNT, the shorter."""
    from polydev import host_cores

    monkeypatch.setattr(host_cores, "_sharers", [])
    assert native.spin_count() == native.SPIN_COUNT
    assert int(native.SHARED_SPIN_COUNT) < int(native.SPIN_COUNT)
    host_cores.share_host_cores("OpenCL0")
    host_cores.share_host_cores("OpenCL0")
    assert host_cores.host_core_sharers() == ("OpenCL0",)
    assert native.spin_count() == native.SHARED_SPIN_COUNT
