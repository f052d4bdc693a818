"""The CPU's compiled router ops (backends/cpu/row_ops.py, get_rows.py, native/row_ops.c):
SOFT_MAX of float32 rows against float64; TOP_K's indices in numpy's stable argsort order
(largest first, ties by index, NaN last), a large k left to numpy; GET_ROWS of float32 rows
in ggml's batched form equal to numpy's gather, a bad index refused with nothing written;
SUM_ROWS against float64; CLAMP equal to numpy's; strided and in-place layouts, and the
threaded loops equal to one thread; layouts they do not take go to numpy; and a mixture of
experts' router is one replay run."""

from __future__ import annotations

import numpy as np
import pytest

import polydev
from polydev import Context, GGMLType, alloc_ctx_tensors, build_graph, ops
from polydev.backends.cpu.native import kernels
from polydev.backends.cpu.replay import NativeRun
from polydev.errors import OutOfBoundsError

from conftest import assert_close, compute
from test_ops import f32

pytestmark = pytest.mark.skipif(kernels() is None, reason="no C compiler for the CPU kernels")


def _bound_compiled(cpu, build, *tensors) -> bool:
    """Whether the CPU backend binds the last node of ``build`` to a compiled call;
    ``tensors``: (type, ne) of its inputs."""
    ctx = polydev.Context()
    out = build(ctx, *(ctx.new_tensor(t, ne) for t, ne in tensors))
    with polydev.alloc_ctx_tensors(ctx, cpu):
        return getattr(cpu.bind(out), "native", None) is not None


def _softmax64(x: np.ndarray, scale: float = 1.0) -> np.ndarray:
    w = x.astype(np.float64) * scale
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 8), (2, 37), (1, 128), (64, 1031)])
@pytest.mark.parametrize("scale", [1.0, 0.125])
def test_soft_max_equals_float64(cpu, rng, shape, scale):
    """Rows of every length a vector loop leaves a tail of, one row to many (threaded)."""
    x = f32(rng, shape, -20, 20)
    assert _bound_compiled(cpu, lambda ctx, a: ops.soft_max_ext(ctx, a, None, scale),
                           (GGMLType.F32, tuple(reversed(shape))))
    got = compute(cpu, lambda ctx, a: ops.soft_max_ext(ctx, a, None, scale), x)
    assert_close(got.reshape(shape), _softmax64(x, scale), 1e-12)
    np.testing.assert_allclose(got.reshape(shape).sum(axis=-1), 1.0, rtol=1e-6)


def test_soft_max_carries_non_finite_values_as_numpy(cpu):
    """-inf takes no weight; a row of -inf, or with NaN or +inf, is NaN throughout (numpy's
    max and subtraction give NaN there too)."""
    x = np.array([[-np.inf, 0.0, 1.0, -np.inf, 2.0, 0.5, -1.0, 3.0, -np.inf, 1.0],
                  [-np.inf] * 10,
                  [0.0, np.nan, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                  [0.0, 1.0, np.inf, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    assert _bound_compiled(cpu, lambda ctx, a: ops.soft_max(ctx, a), (GGMLType.F32, (10, 4)))
    got = compute(cpu, lambda ctx, a: ops.soft_max(ctx, a), x).reshape(x.shape)
    want = np.exp(x[0].astype(np.float64) - 3.0)
    assert_close(got[0], want / want.sum(), 1e-12)
    assert got[0][np.isneginf(x[0])].tolist() == [0.0, 0.0, 0.0]
    assert np.isnan(got[1:]).all()


def test_a_masked_soft_max_goes_to_numpy(cpu, rng):
    x, mask = f32(rng, (4, 16)), np.where(rng.random((4, 16)) < 0.3, -np.inf, 0).astype(np.float32)

    def build(ctx, a, m):
        return ops.soft_max_ext(ctx, a, m, 0.5)
    assert not _bound_compiled(cpu, build, (GGMLType.F32, (16, 4)), (GGMLType.F32, (16, 4)))
    got = compute(cpu, build, x, mask).reshape(4, 16)
    assert_close(got, _softmax64(x * 0.5 + mask), 1e-12)


def _numpy_top_k(x: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-x, axis=-1, kind="stable")[..., :k]


@pytest.mark.parametrize("n,k", [(8, 1), (8, 2), (16, 4), (32, 8), (128, 8), (300, 17), (5, 5)])
def test_top_k_is_numpys_stable_order(cpu, rng, n, k):
    """Values drawn from few levels, so rows hold ties: equal values by index."""
    x = (rng.integers(0, 6, size=(3, 2, n)) / 4).astype(np.float32)
    assert _bound_compiled(cpu, lambda ctx, a: ops.top_k(ctx, a, k),
                           (GGMLType.F32, (n, 2, 3)))
    got = compute(cpu, lambda ctx, a: ops.top_k(ctx, a, k), x).reshape(3, 2, k)
    np.testing.assert_array_equal(got, _numpy_top_k(x, k))


def test_top_k_puts_nan_after_every_number(cpu):
    x = np.array([[np.nan, -np.inf, 1.0, np.nan, -0.0, 0.0, np.inf, -5.0],
                  [np.nan, np.nan, np.nan, 2.0, np.nan, np.nan, np.nan, np.nan]], np.float32)
    assert _bound_compiled(cpu, lambda ctx, a: ops.top_k(ctx, a, 8), (GGMLType.F32, (8, 2)))
    got = compute(cpu, lambda ctx, a: ops.top_k(ctx, a, 8), x).reshape(2, 8)
    np.testing.assert_array_equal(got, _numpy_top_k(x, 8))
    assert got[0].tolist() == [6, 2, 4, 5, 7, 1, 0, 3]


def _gather(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """ggml's batched GET_ROWS in numpy shapes: a (a3, a2, a1, n), idx (a3, a2, m)."""
    i3 = np.arange(a.shape[0])[:, None, None]
    i2 = np.arange(a.shape[1])[None, :, None]
    return a[i3, i2, idx]


@pytest.mark.parametrize("a_shape,idx_shape", [((1, 1, 9, 5), (1, 1, 4)),
                                               ((1, 3, 16, 1), (1, 3, 4)),
                                               ((2, 3, 6, 7), (2, 3, 6))],
                         ids=["matrix", "router", "batched"])
def test_get_rows_of_float32_rows_equals_numpys_gather(cpu, rng, a_shape, idx_shape):
    """One matrix, a router's weights (one value per row, each token its own rows), and a
    batch of matrices with repeated indices."""
    a = f32(rng, a_shape)
    idx = rng.integers(0, a_shape[2], size=idx_shape).astype(np.int32)
    idx_ne = tuple(reversed(idx_shape))[:3]
    assert _bound_compiled(cpu, lambda ctx, x, i: ops.get_rows(ctx, x, i),
                           (GGMLType.F32, tuple(reversed(a_shape))), (GGMLType.I32, idx_ne))
    got = compute(cpu, lambda ctx, x, i: ops.get_rows(ctx, x, i), a, idx[0] if a_shape[0] == 1
                  else idx)
    want = _gather(a, idx)
    np.testing.assert_array_equal(got.reshape(want.shape), want)


@pytest.mark.parametrize("bad", [-1, 9])
@pytest.mark.parametrize("in_run", [False, True], ids=["alone", "in-a-replay-run"])
def test_a_bad_index_raises_and_writes_nothing(cpu, rng, bad, in_run):
    """Alone, and after a compiled SOFT_MAX in one replay run (whose status stops the run
    and whose Python call raises)."""
    a = f32(rng, (9, 4))
    ctx = Context()
    x = ctx.new_tensor_2d(GGMLType.F32, 4, 9, name="x")
    idx = ctx.new_tensor_1d(GGMLType.I32, 3, name="idx")
    out = ops.get_rows(ctx, ops.soft_max(ctx, x) if in_run else x, idx)
    with alloc_ctx_tensors(ctx, cpu):
        plan = cpu.graph_plan_create(build_graph(out))
        try:
            assert any(isinstance(s, NativeRun) for s in plan.steps) == in_run
            x.set_data(a)
            idx.set_data(np.array([0, bad, 2], np.int32))
            out.set_data(np.full((3, 4), 7.0, np.float32))
            with pytest.raises(OutOfBoundsError, match=r"\[0, 9\)"):
                cpu.graph_plan_compute(plan)
            assert (out.numpy() == 7.0).all()
        finally:
            cpu.graph_plan_free(plan)


@pytest.mark.parametrize("shape", [(1, 1), (1, 16), (5, 37), (64, 1031)])
def test_sum_rows_equals_float64(cpu, rng, shape):
    x = f32(rng, shape, -1, 1)
    assert _bound_compiled(cpu, lambda ctx, a: ops.sum_rows(ctx, a),
                           (GGMLType.F32, tuple(reversed(shape))))
    got = compute(cpu, lambda ctx, a: ops.sum_rows(ctx, a), x).reshape(shape[0])
    want = x.astype(np.float64).sum(axis=-1)
    assert np.all(np.abs(got - want) <= np.abs(want) * 2 ** -24)     # the float32 rounding


@pytest.mark.parametrize("lo,hi", [(-0.5, 0.5), (6.103515625e-5, np.inf), (-np.inf, 0.0)])
def test_clamp_equals_numpy_and_carries_nan(cpu, rng, lo, hi):
    x = f32(rng, (3, 41), -2, 2)
    x[1, 3], x[2, 40], x[0, 0] = np.nan, np.inf, -np.inf
    assert _bound_compiled(cpu, lambda ctx, a: ops.clamp(ctx, a, lo, hi),
                           (GGMLType.F32, (41, 3)))
    got = compute(cpu, lambda ctx, a: ops.clamp(ctx, a, lo, hi), x).reshape(x.shape)
    np.testing.assert_array_equal(got, np.minimum(np.maximum(x, np.float32(lo)),
                                                  np.float32(hi)))


def test_a_large_k_goes_to_numpy(cpu, rng):
    """The kernel's insertion is O(n k): beyond a router's k numpy partitions instead."""
    x = f32(rng, (2, 4096))
    assert not _bound_compiled(cpu, lambda ctx, a: ops.top_k(ctx, a, 200),
                               (GGMLType.F32, (4096, 2)))
    got = compute(cpu, lambda ctx, a: ops.top_k(ctx, a, 200), x).reshape(2, 200)
    np.testing.assert_array_equal(np.sort(got, axis=-1),
                                  np.sort(_numpy_top_k(x, 200), axis=-1))


def test_soft_max_in_place_equals_float64(cpu, rng):
    x = f32(rng, (5, 40), -5, 5)
    build = lambda ctx, a: ops.soft_max_ext(ctx, a, None, 0.5, inplace=True)  # noqa: E731
    assert _bound_compiled(cpu, build, (GGMLType.F32, (40, 5)))
    assert_close(compute(cpu, build, x).reshape(x.shape), _softmax64(x, 0.5), 1e-12)


def _padded_4d(ctx, t, ne):
    """A [ne0, ne1, ne2, ne3] view of ``t`` whose rows are 3 floats apart beyond ne0, from an
    offset of 2 floats (t holds (ne0 + 3) * ne1 * ne2 * ne3 + 2 floats)."""
    nb1 = (ne[0] + 3) * 4
    return ops.view_4d(ctx, t, *ne, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2], 8)


@pytest.mark.parametrize("op", ["top_k", "sum_rows", "clamp"])
def test_row_ops_of_padded_4d_views_equal_numpy(cpu, rng, op):
    ne = (19, 3, 2, 2)
    flat = f32(rng, ((ne[0] + 3) * ne[1] * ne[2] * ne[3] + 2,), -2, 2)
    rows = flat[2:].reshape(ne[3], ne[2], ne[1], ne[0] + 3)[..., :ne[0]]
    build = {"top_k": lambda ctx, t: ops.top_k(ctx, _padded_4d(ctx, t, ne), 5),
             "sum_rows": lambda ctx, t: ops.sum_rows(ctx, _padded_4d(ctx, t, ne)),
             "clamp": lambda ctx, t: ops.clamp(ctx, _padded_4d(ctx, t, ne), -0.5, 0.5)}[op]
    assert _bound_compiled(cpu, build, (GGMLType.F32, (flat.size,)))
    got = compute(cpu, build, flat)
    if op == "top_k":
        np.testing.assert_array_equal(got.reshape(*rows.shape[:3], 5), _numpy_top_k(rows, 5))
    elif op == "sum_rows":
        want = rows.astype(np.float64).sum(axis=-1)
        assert np.all(np.abs(got.reshape(want.shape) - want) <= np.abs(want) * 2 ** -24)
    else:           # CLAMP's result is its source's view, clamped in place
        np.testing.assert_array_equal(got.reshape(rows.shape), np.clip(rows, -0.5, 0.5))


def test_get_rows_takes_strided_indices_and_padded_rows(cpu, rng):
    """Three matrices' rows 8 floats apart, of which 5 are values, each with its own 4
    indices read through a transposed view (their values 3 int32 apart)."""
    a = f32(rng, (3, 7, 8))
    idx = rng.integers(0, 7, size=(4, 3)).astype(np.int32)      # matrix i1's are idx[:, i1]

    def build(ctx, x, i):
        rows = ops.view_3d(ctx, x, 5, 7, 3, x.nb[1], x.nb[2], 0)
        return ops.get_rows(ctx, rows, ops.transpose(ctx, i))
    assert _bound_compiled(cpu, build, (GGMLType.F32, (8, 7, 3)), (GGMLType.I32, (3, 4)))
    got = compute(cpu, build, a, idx).reshape(3, 4, 5)
    want = np.stack([a[i1, idx[:, i1], :5] for i1 in range(3)])
    np.testing.assert_array_equal(got, want)


def test_threaded_row_ops_equal_one_thread(rng):
    """Shapes well above the threads' threshold on 4 threads (what one CPU of few cores never
    reaches otherwise) give the one-thread results exactly."""
    x = f32(rng, (256, 1031), -8, 8)
    builds = {"soft_max": lambda ctx, a: ops.soft_max_ext(ctx, a, None, 0.25),
              "top_k": lambda ctx, a: ops.top_k(ctx, a, 16),
              "sum_rows": lambda ctx, a: ops.sum_rows(ctx, a),
              "clamp": lambda ctx, a: ops.clamp(ctx, a, -1.0, 1.0)}
    results = {}
    for threads in (1, 4):
        with polydev.init_backend("CPU") as cpu:
            cpu.set_n_threads(threads)
            for name, build in builds.items():
                assert _bound_compiled(cpu, build, (GGMLType.F32, (1031, 256)))
                results[name, threads] = compute(cpu, build, x)
    for name in builds:
        np.testing.assert_array_equal(results[name, 4], results[name, 1])
    assert_close(results["soft_max", 4].reshape(x.shape), _softmax64(x, 0.25), 1e-12)
    np.testing.assert_array_equal(results["top_k", 4].reshape(256, 16), _numpy_top_k(x, 16))


def test_a_routers_ops_are_one_replay_run_equal_to_numpy(fast_cpu, rng):
    """A mixture of experts' router as models/layers.py builds it (softmax, top-k, the chosen
    weights gathered, renormalised by their clamped sum), for 16 experts, 4 used, 3 tokens:
    one run of compiled calls; the results equal numpy's in float64 within float32 rounding,
    the chosen experts exactly."""
    n_expert, n_used, n_tokens = 16, 4, 3
    ctx = Context()
    logits = ctx.new_tensor_2d(GGMLType.F32, n_expert, n_tokens, name="logits")
    probs = ops.soft_max(ctx, logits)
    selected = ops.top_k(ctx, probs, n_used)
    weights = ops.get_rows(ctx, ops.reshape_3d(ctx, probs, 1, n_expert, n_tokens), selected)
    weights = ops.reshape_2d(ctx, weights, n_used, n_tokens)
    total = ops.clamp(ctx, ops.sum_rows(ctx, weights), 6.103515625e-5, np.inf)
    out = ops.div(ctx, weights, total)
    x = f32(rng, (n_tokens, n_expert), -4, 4)
    with alloc_ctx_tensors(ctx, fast_cpu):
        plan = fast_cpu.graph_plan_create(build_graph(out))
        try:
            runs = [s for s in plan.steps if isinstance(s, NativeRun)]
            assert len(plan.steps) == 1 and len(runs) == 1
            logits.set_data(x)
            fast_cpu.graph_plan_compute(plan)
            chosen, got = selected.numpy().reshape(n_tokens, n_used), out.numpy()
        finally:
            fast_cpu.graph_plan_free(plan)
    p = _softmax64(x)
    np.testing.assert_array_equal(chosen, _numpy_top_k(p.astype(np.float32), n_used))
    w = np.take_along_axis(p, chosen, axis=-1)
    assert_close(got.reshape(n_tokens, n_used), w / w.sum(axis=-1, keepdims=True), 1e-12)
