"""A CPU plan's compiled calls replayed from C (backends/cpu/replay.py, native/replay.c): one
layer of a decode step runs as one run of calls and gives the results of the same calls made
one by one from Python, follows a rewrite of its weights, falls back to calls one by one where
the weight cache cannot hold the run's copies together, stops at a call whose status says it
failed with that call's error, and lets go of its calls when freed; the call codes and record
of replay.py are replay.c's."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest

import polydev
from polydev import Context, GGMLType, alloc_ctx_tensors, build_graph, dequantize, ops
from polydev.backends.cpu import native
from polydev.backends.cpu.native import kernels
from polydev.backends.cpu.replay import CallCode, CallRecord, NativeRun, ReplayPlan
from polydev.buffer import BufferUsage
from polydev.errors import OutOfBoundsError

from conftest import compute
from test_ops import f32, random_blocks

pytestmark = pytest.mark.skipif(kernels() is None, reason="no C compiler for the CPU kernels")

K, M = 256, 64           # the layer's width and its projection's rows


class Layer:
    """norm(x) * w_norm -> W (Q4_K, in a weights buffer) -> ROPE as 4 heads at a position ->
    + x -> SWIGLU with itself -> SET_ROWS into a cache at the row: a decode step's
    kinds of calls, planned once; then the cache squared."""

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
        self.rows = ops.set_rows(ctx, self.cache, z, self.idx)
        self.out = ops.mul(ctx, self.rows, self.rows)     # a call after SET_ROWS
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
        replayed = layer(x, row, position=row)          # each step's positions turn it
        np.testing.assert_array_equal(replayed, layer(x, row, replayed=False, position=row))
        assert np.any(replayed[row] != 0) and not np.any(np.delete(replayed, row, axis=0))


def test_a_rewritten_weight_is_read_by_the_replay(layer, rng):
    x = f32(rng, (1, K))
    before = layer(x, 1)
    layer.w.set_data(random_blocks(rng, GGMLType.Q4_K, M, K))
    after = layer(x, 1)
    assert not np.array_equal(before, after)
    np.testing.assert_array_equal(after, layer(x, 1, replayed=False))


def test_copies_are_asked_again_only_when_the_cache_or_weights_changed(layer, rng,
                                                                        monkeypatch):
    """While the weight cache and the weights' buffer keep their versions, a run's copies are
    not asked again (the prepares of dozens of copies cost a decode step tens of µs); a
    rewrite of the weight asks them, and the replay reads the new copy."""
    from polydev.backends.cpu.interleaved import CopyAddress

    x = f32(rng, (1, K))
    layer(x, 0)
    asked = []
    original = CopyAddress.__call__

    def counted(self) -> bool:
        asked.append(self)
        return original(self)
    monkeypatch.setattr(CopyAddress, "__call__", counted)
    layer(x, 1)
    assert asked == []
    layer.w.set_data(random_blocks(rng, GGMLType.Q4_K, M, K))
    got = layer(x, 1)
    assert asked
    np.testing.assert_array_equal(got, layer(x, 1, replayed=False))


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
        for run in plan.steps:
            if isinstance(run, NativeRun):
                monkeypatch.setattr(run, "_replay", lambda *a: replays.append(a) or 0)
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
    call raises alone (the destination as it was); the calls before it have run, the one
    after it has not."""
    x = f32(rng, (1, K))
    layer(x, 2)
    want_z = layer.z.numpy().copy()
    layer.z.set_data(np.zeros_like(want_z))
    layer.out.set_data(np.full((4, M // 2), 7, np.float32))
    with pytest.raises(OutOfBoundsError, match="set_rows"):
        layer(x, 4)
    np.testing.assert_array_equal(layer.z.numpy(), want_z)
    assert not np.any(layer.cache.numpy())
    assert np.all(layer.out.numpy() == 7)


def test_a_token_embedding_starts_the_run(fast_cpu, rng, monkeypatch):
    """GET_ROWS of a Q6_K embedding, RMS_NORM and a Q4_K product: one run; each step's tokens
    give their decoded rows, the embedding's rows read are counted once a step for its file
    pages (the first step's prepares take two passes, as the product's copy is made), and a
    token past the rows stops the run with the call's error."""
    from polydev.backends.cpu.buffer import CPUBuffer

    wctx, ctx = Context(), Context()
    emb = wctx.new_tensor_2d(GGMLType.Q6_K, K, 40, name="token_embd")
    w = wctx.new_tensor_2d(GGMLType.Q4_K, K, M, name="w")
    tokens = ctx.new_tensor_1d(GGMLType.I32, 2, name="tokens")
    rows = ops.get_rows(ctx, emb, tokens)
    out = ops.mul_mat(ctx, w, ops.rms_norm(ctx, rows, 1e-6))
    wbuf = alloc_ctx_tensors(wctx, fast_cpu)
    wbuf.usage = BufferUsage.WEIGHTS
    buf = alloc_ctx_tensors(ctx, fast_cpu)
    counted = []
    monkeypatch.setattr(CPUBuffer, "rows_read", lambda self, offset, nbytes, n: counted.append(n))
    plan = fast_cpu.graph_plan_create(build_graph(out))
    try:
        raw = random_blocks(rng, GGMLType.Q6_K, 40, K)
        emb.set_data(raw)
        w.set_data(random_blocks(rng, GGMLType.Q4_K, M, K))
        assert [type(step) for step in plan.steps] == [NativeRun]
        decoded = dequantize(raw, GGMLType.Q6_K).reshape(40, K)
        for ids in ([3, 39], [0, 3]):
            tokens.set_data(np.array(ids, np.int32))
            fast_cpu.graph_plan_compute(plan)
            np.testing.assert_array_equal(rows.numpy().reshape(2, K), decoded[ids])
        assert counted == [2, 2]
        tokens.set_data(np.array([1, 40], np.int32))
        with pytest.raises(OutOfBoundsError, match=r"get_rows.*\[0, 40\)"):
            fast_cpu.graph_plan_compute(plan)
    finally:
        fast_cpu.graph_plan_free(plan)
        buf.close()
        wbuf.close()


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


def _c_enum(source: str, prefix: str) -> dict[str, int]:
    return {name: int(value) for name, value in re.findall(rf"{prefix}(\w+) = (\d+)", source)}


def test_the_call_codes_and_record_are_replay_c_s():
    """CallCode is replay.c's PD_CALL_* enum, and CallRecord its pd_call, field by field."""
    source = (Path(native.__file__).parent / "replay.c").read_text()
    assert _c_enum(source, "PD_CALL_") == {c.name: c.value for c in CallCode}
    fields = re.search(r"typedef struct \{(.*?)\} pd_call;", source, re.S).group(1)
    code = [line.split("/*")[0] for line in fields.splitlines()]
    names = [name for line in code for name in re.findall(r"(\w+)[,;]", line)]
    assert names == [name for name, _ in CallRecord._fields_]
    assert ctypes.sizeof(CallRecord) == 24
