"""A CPU plan's compiled calls replayed from C (backends/cpu/replay.py, native/replay.c): one
layer of a decode step runs as one run of calls and gives the results of the same calls made
one by one from Python, follows a rewrite of its weights, falls back to calls one by one where
the weight cache cannot hold the run's copies together, and stops at a call whose status says
it failed, with that call's error; and the kernels it brought into the compiled set (ADD and
MUL of rows, GEGLU) against numpy and float64."""

from __future__ import annotations

import numpy as np
import pytest

import polydev
from polydev import Context, GGMLType, alloc_ctx_tensors, build_graph, ops
from polydev.backends.cpu.native import kernels
from polydev.backends.cpu.replay import NativeRun, ReplayPlan
from polydev.buffer import BufferUsage
from polydev.errors import OutOfBoundsError

from conftest import assert_close, compute
from test_ops import f32, random_blocks

pytestmark = pytest.mark.skipif(kernels() is None, reason="no C compiler for the CPU kernels")

K, M = 256, 64           # the layer's width and its projection's rows


class Layer:
    """norm(x) * w_norm -> W (Q4_K, in a weights buffer) -> ROPE as 4 heads at a position ->
    + x -> SWIGLU with itself -> SET_ROWS into a cache at the row: a decode step's
    kinds of calls, planned once."""

    def __init__(self, backend, rng) -> None:
        wctx, ctx = Context(), Context()
        self.w = wctx.new_tensor_2d(GGMLType.Q4_K, K, M, name="w")
        self.w_norm = wctx.new_tensor_1d(GGMLType.F32, K, name="w_norm")
        self.x = ctx.new_tensor_2d(GGMLType.F32, K, 1, name="x")
        self.idx = ctx.new_tensor_1d(GGMLType.I32, 1, name="idx")
        self.pos = ctx.new_tensor_1d(GGMLType.I32, 1, name="pos")
        self.cache = ctx.new_tensor_2d(GGMLType.F32, M // 2, 4, name="cache")
        h = ops.mul(ctx, ops.rms_norm(ctx, self.x, 1e-6), self.w_norm)
        y = ops.mul_mat(ctx, self.w, h)
        y = ops.rope(ctx, ops.reshape_3d(ctx, y, M // 4, 4, 1), self.pos, M // 4)
        y = ops.add(ctx, ops.reshape_2d(ctx, y, M, 1),
                    ops.view_2d(ctx, self.x, M, 1, self.x.nb[1], 0))
        z = ops.swiglu(ctx, y)
        self.out = ops.set_rows(ctx, self.cache, z, self.idx)
        self.z = z
        self.backend = backend
        self.wbuf = alloc_ctx_tensors(wctx, backend)
        self.wbuf.usage = BufferUsage.WEIGHTS
        self.buf = alloc_ctx_tensors(ctx, backend)
        self.w.set_data(random_blocks(rng, GGMLType.Q4_K, M, K))
        self.w_norm.set_data(f32(rng, (K,)))
        self.plan = backend.graph_plan_create(build_graph(self.out))

    def __call__(self, x: np.ndarray, row: int, replayed: bool = True,
                 position: int = 7) -> np.ndarray:
        self.x.set_data(x)
        self.pos.set_data(np.array([position], np.int32))
        self.idx.set_data(np.array([row], np.int32))
        self.cache.set_data(np.zeros((4, M // 2), np.float32))
        self.plan.replayed = replayed
        self.backend.graph_plan_compute(self.plan)
        return self.cache.numpy().reshape(4, M // 2).copy()

    def close(self) -> None:
        self.backend.graph_plan_free(self.plan)
        self.buf.close()
        self.wbuf.close()


@pytest.fixture
def layer(fast_cpu, rng):
    made = Layer(fast_cpu, rng)
    yield made
    made.close()


def test_a_layer_is_one_run_equal_to_its_calls_one_by_one(layer, rng):
    assert isinstance(layer.plan, ReplayPlan)
    runs = [s for s in layer.plan.steps if isinstance(s, NativeRun)]
    assert len(runs) == 1 and len(runs[0].calls) == len(layer.plan.calls)
    for row in (0, 3):
        x = f32(rng, (1, K))
        replayed = layer(x, row, position=row)          # each step its own angle tables
        np.testing.assert_array_equal(replayed, layer(x, row, replayed=False, position=row))
        assert np.any(replayed[row] != 0) and not np.any(np.delete(replayed, row, axis=0))


def test_a_rewritten_weight_is_read_by_the_replay(layer, rng):
    x = f32(rng, (1, K))
    before = layer(x, 1)
    layer.w.set_data(random_blocks(rng, GGMLType.Q4_K, M, K))
    after = layer(x, 1)
    assert not np.array_equal(before, after)
    np.testing.assert_array_equal(after, layer(x, 1, replayed=False))


def test_copies_that_evict_each_other_run_one_by_one(fast_cpu, rng, monkeypatch):
    """Two products whose interleaved copies the cache cannot hold together: every compute
    makes them again, so the run falls back to calls one by one, each taking its copy as it
    runs, and gives the results of both weights."""
    wctx, ctx = Context(), Context()
    w1 = wctx.new_tensor_2d(GGMLType.Q4_K, K, M, name="w1")
    w2 = wctx.new_tensor_2d(GGMLType.Q4_K, K, M, name="w2")
    x = ctx.new_tensor_2d(GGMLType.F32, K, 1, name="x")
    out = ops.add(ctx, ops.mul_mat(ctx, w1, x), ops.mul_mat(ctx, w2, x))
    wbuf = alloc_ctx_tensors(wctx, fast_cpu)
    wbuf.usage = BufferUsage.WEIGHTS
    buf = alloc_ctx_tensors(ctx, fast_cpu)
    cache = fast_cpu.env.weight_cache
    copy_bytes = kernels().interleaved_bytes(int(GGMLType.Q4_K), M, K)
    monkeypatch.setattr(cache, "_budget", copy_bytes + copy_bytes // 2)
    try:
        raws = [random_blocks(rng, GGMLType.Q4_K, M, K) for _ in range(2)]
        w1.set_data(raws[0])
        w2.set_data(raws[1])
        xs = f32(rng, (1, K))
        x.set_data(xs)
        plan = fast_cpu.graph_plan_create(build_graph(out))
        replays = []
        monkeypatch.setattr(kernels(), "replay", lambda *a: replays.append(a) or 0)
        for _ in range(2):
            fast_cpu.graph_plan_compute(plan)
        assert not replays                          # never replayed: each time one by one
        want = sum(compute(fast_cpu, lambda c, w, v: ops.mul_mat(c, w, v), raw, xs,
                           types=[GGMLType.Q4_K, None]) for raw in raws)
        np.testing.assert_allclose(out.numpy().reshape(1, M), want.reshape(1, M), rtol=1e-6,
                                   atol=1e-6 * np.abs(want).max())
        fast_cpu.graph_plan_free(plan)
    finally:
        buf.close()
        wbuf.close()


def test_a_failing_call_stops_the_run_with_its_error(layer, rng):
    """SET_ROWS of an index past the cache's rows: the run stops there with the error the
    call raises alone (the destination as it was); the calls before it have run."""
    x = f32(rng, (1, K))
    want_z = None
    layer(x, 2)
    want_z = layer.z.numpy().copy()
    layer.z.set_data(np.zeros_like(want_z))
    with pytest.raises(OutOfBoundsError, match="set_rows"):
        layer(x, 4)
    np.testing.assert_array_equal(layer.z.numpy(), want_z)
    assert not np.any(layer.cache.numpy())


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("b_shape", [(2, 3, 37), (1, 37), (2, 1, 37), (2, 3, 1), (1, 1, 1)],
                         ids=["same", "row", "repeat", "value-per-row", "one-value"])
def test_binary_repeats_b_as_ggml_and_equals_numpy(cpu, rng, op, b_shape):
    """ADD, SUB, MUL and DIV of float32 tensors, b repeated over a along any dimension
    (compiled): numpy's float32 results exactly."""
    a, b = f32(rng, (2, 3, 37)), f32(rng, b_shape, 0.5, 2)
    got = compute(cpu, lambda ctx, x, y: getattr(ops, op)(ctx, x, y), a, b)
    want = getattr(np, {"add": "add", "sub": "subtract", "mul": "multiply",
                        "div": "divide"}[op])(a, b)
    np.testing.assert_array_equal(got.reshape(want.shape), want)


def test_binary_of_strided_views_equals_numpy(cpu, rng):
    a, b = f32(rng, (4, 40)), f32(rng, (4, 16))
    got = compute(cpu, lambda ctx, x, y: ops.add(
        ctx, ops.view_2d(ctx, x, 16, 4, x.nb[1], 8), y), a, b)
    np.testing.assert_array_equal(got.reshape(4, 16), a[:, 2:18] + b)


@pytest.mark.parametrize("rows,n", [(1, 2048), (3, 37)])
def test_geglu_equals_float64(cpu, rng, rows, n):
    """GEGLU with ggml's tanh GELU, over values where 1 + tanh is tiny (x near -8) too."""
    x, g = f32(rng, (1, 1, rows, n), -8, 8), f32(rng, (1, 1, rows, n))
    out = compute(cpu, lambda ctx, a, b: ops.geglu(ctx, a, b), x, g)
    x64 = x.astype(np.float64)
    gelu = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * x64 * (1 + 0.044715 * x64 ** 2)))
    assert_close(out, gelu * g, 1e-13)


def test_a_freed_plan_lets_go_of_its_calls_at_once(fast_cpu, rng):
    """No reference cycle keeps a freed plan's calls (and through them its tensors' memory:
    the compute buffers a longer prompt reallocated) until the cycle collector runs."""
    import gc
    import weakref

    layer = Layer(fast_cpu, rng)
    layer(f32(rng, (1, K)), 0)
    calls = [weakref.ref(c) for c in layer.plan.calls]
    gc.disable()
    try:
        fast_cpu.graph_plan_free(layer.plan)
        assert not [c for c in calls if c() is not None]
    finally:
        gc.enable()
        layer.close()
