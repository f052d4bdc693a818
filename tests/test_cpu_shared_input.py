"""Consecutive products of one activation replayed as one call (backends/cpu/shared_input.py,
pd_mul_mat_interleaved_shared in native/interleaved.c): which calls join, that the joined
call gives the results of the products made one by one (bit for bit: the same quantized
activations, the same kernels) and of float64 within the int16 activations' rounding, for one
row and a prompt's, over types of one block size with any number of groups a thread; and that
a joined call whose status is not 0 runs its products one by one."""

from __future__ import annotations

import numpy as np
import pytest

from polydev import Context, GGMLType, alloc_ctx_tensors, build_graph, dequantize, ops
from polydev.backends.cpu.native import kernels
from polydev.backends.cpu.replay import NativeRun
from polydev.backends.cpu.shared_input import MAX_SHARED
from polydev.buffer import BufferUsage

from test_ops import f32, random_blocks

pytestmark = pytest.mark.skipif(
    kernels() is None or not kernels().interleaved_bytes(int(GGMLType.Q4_K), 16, 256),
    reason="this build of the CPU kernels has no interleaved products (they need AVX2)")

K = 512


class Planned:
    """Products ``ys`` of weights in a weights buffer (``wbuf``; the rest in ``buf``),
    planned once (``planned`` sets these)."""

    def planned(self, backend, wbuf, buf, ys) -> None:
        self.backend, self.wbuf, self.buf, self.ys = backend, wbuf, buf, ys
        self.plan = backend.graph_plan_create(build_graph(*ys))
        self.run = next(s for s in self.plan.steps if isinstance(s, NativeRun))

    def groups(self) -> list[int]:
        """The sizes of the run's table entries (a joined call's products, or 1)."""
        return [len(entry) for entry in self.run._entries]

    def __call__(self, replayed: bool = True) -> list[np.ndarray]:
        for y in self.ys:
            y.set_data(np.full_like(y.numpy(), np.nan))
        self.plan.replayed = replayed
        self.backend.graph_plan_compute(self.plan)
        return [y.numpy().copy() for y in self.ys]

    def close(self) -> None:
        self.backend.graph_plan_free(self.plan)
        self.buf.close()
        self.wbuf.close()


def _weights_buffer(wctx, backend):
    wbuf = alloc_ctx_tensors(wctx, backend)
    wbuf.usage = BufferUsage.WEIGHTS
    return wbuf


class Products(Planned):
    """y_i = W_i x_(i's activation) for weights of ``types`` with ``rows`` rows each, the
    products next to each other in the graph (expanded in order), planned once."""

    def __init__(self, backend, rng, types, rows, n_tokens=1, activations=None) -> None:
        activations = activations or [0] * len(types)
        wctx, ctx = Context(), Context()
        self.weights = [wctx.new_tensor_2d(t, K, m, name=f"w{i}")
                        for i, (t, m) in enumerate(zip(types, rows))]
        self.xs = [ctx.new_tensor_2d(GGMLType.F32, K, n_tokens, name=f"x{j}")
                   for j in range(max(activations) + 1)]
        ys = [ops.mul_mat(ctx, w, self.xs[j]) for w, j in zip(self.weights, activations)]
        self.activations = activations
        wbuf, buf = _weights_buffer(wctx, backend), alloc_ctx_tensors(ctx, backend)
        self.raws = [random_blocks(rng, t, m, K) for t, m in zip(types, rows)]
        for w, raw in zip(self.weights, self.raws):
            w.set_data(raw)
        self.x_values = [f32(rng, (n_tokens, K)) for _ in self.xs]
        for x, values in zip(self.xs, self.x_values):
            x.set_data(values)
        self.planned(backend, wbuf, buf, ys)

    def exact(self) -> list[np.ndarray]:
        """The products in float64 from the decoded weights."""
        return [self.x_values[j].astype(np.float64)
                @ dequantize(raw, w.type).reshape(w.ne[1], K).astype(np.float64).T
                for w, raw, j in zip(self.weights, self.raws, self.activations)]


@pytest.fixture
def made(fast_cpu):
    made = []
    yield lambda *args, **kw: made.append(Products(fast_cpu, *args, **kw)) or made[-1]
    for products in made:
        products.close()


def _assert_equal_and_near_exact(products: Products) -> None:
    joined, one_by_one = products(), products(replayed=False)
    for got, alone, want in zip(joined, one_by_one, products.exact()):
        np.testing.assert_array_equal(got, alone)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=0,
                                   atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("n_tokens", [1, 5, 40, 600])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_q_k_v_of_one_activation_are_one_call(made, fast_cpu, rng, n_tokens, threads):
    """A q, k and v of one block size (Q4_K, Q6_K, Q4_K: 256 values) join, whatever their rows
    (a 16-row weight, one group, included); a Q8_0 after them (32 values) stays apart. Up to
    512 rows of 512 values the threads share the groups out and help each other finish; 600
    rows go in two passes over fixed shares."""
    fast_cpu.set_n_threads(threads)
    types = [GGMLType.Q4_K, GGMLType.Q6_K, GGMLType.Q4_K, GGMLType.Q4_K, GGMLType.Q8_0]
    products = made(rng, types, [96, 32, 16, 48, 64], n_tokens)
    assert products.groups() == [4, 1]
    _assert_equal_and_near_exact(products)


def test_products_of_other_activations_stay_apart(made, rng):
    products = made(rng, [GGMLType.Q4_0] * 4, [32, 32, 64, 16], activations=[0, 0, 1, 1])
    assert products.groups() == [2, 2]
    _assert_equal_and_near_exact(products)


def test_at_most_max_shared_products_join(made, rng):
    n = MAX_SHARED + 2
    products = made(rng, [GGMLType.Q5_K] * n, [16 * (1 + i % 3) for i in range(n)])
    assert products.groups() == [MAX_SHARED, 2]
    _assert_equal_and_near_exact(products)


def test_a_joined_call_that_fails_runs_its_products_one_by_one(made, rng):
    """A status other than 0 (here a record the C function refuses) stops the replay at the
    joined call; its products then run one by one from Python, and the results are theirs."""
    products = made(rng, [GGMLType.Q4_K] * 3, [32, 16, 48])
    assert products.groups() == [3]
    products.run._joined[0].args.n_products = 0
    _assert_equal_and_near_exact(products)


def test_a_models_decode_step_joins_q_k_v_and_gate_up(tmp_path):
    """The step graph puts each layer's q, k and v products next to each other, and its gate
    and up: a decode step replays each set as one call, and its logits are those of the
    calls one by one."""
    pytest.importorskip("gguf")
    from polydev.models import load

    from model_files import write_test_model

    path = write_test_model(tmp_path / "llama.gguf", n_layer=2, weight_type="Q8_0")
    with load(path, devices=[], n_ctx=64, progress=False) as model:
        ev = model.evaluator
        ev.eval([5, 6, 7])
        joined = ev.eval([8]).copy()
        plans = [p for p in ev.sched._step_plans if p]
        entries = [len(e) for p in plans for s in p.steps if isinstance(s, NativeRun)
                   for e in s._entries]
        assert [n for n in entries if n > 1] == [3, 2, 3, 2]
        ev.reset()
        ev.eval([5, 6, 7])
        for plan in plans:
            plan.replayed = False
        np.testing.assert_array_equal(ev.eval([8]), joined)
        assert [p for p in ev.sched._step_plans if p] == plans     # the same plans ran


class Experts(Planned):
    """gate and up experts (MUL_MAT_ID) of one activation and one routing, next to each
    other in the graph, planned once: ``types`` and ``rows`` per weight, ``n_expert`` each
    (the second may have more: a routing valid for the first is valid for it)."""

    def __init__(self, backend, rng, types, rows, n_expert, n_tokens, n_used=2) -> None:
        wctx, ctx = Context(), Context()
        self.weights = [wctx.new_tensor(t, (K, m, n_expert + i), name=f"experts{i}")
                        for i, (t, m) in enumerate(zip(types, rows))]
        self.x = ctx.new_tensor(GGMLType.F32, (K, 1, n_tokens), name="x")
        self.ids = ctx.new_tensor(GGMLType.I32, (n_used, n_tokens), name="ids")
        ys = [ops.mul_mat_id(ctx, w, self.x, self.ids) for w in self.weights]
        wbuf, buf = _weights_buffer(wctx, backend), alloc_ctx_tensors(ctx, backend)
        self.raws = [random_blocks(rng, t, m * w.ne[2], K)
                     for t, m, w in zip(types, rows, self.weights)]
        for w, raw in zip(self.weights, self.raws):
            w.set_data(raw)
        self.x_values = f32(rng, (n_tokens, 1, K))
        self.x.set_data(self.x_values)
        self.routing = np.stack([rng.choice(n_expert, n_used, replace=False)
                                 for _ in range(n_tokens)]).astype(np.int32)
        self.ids.set_data(self.routing)
        self.planned(backend, wbuf, buf, ys)

    def exact(self) -> list[np.ndarray]:
        """Each token's experts' products in float64 from the decoded weights."""
        x = self.x_values[:, 0].astype(np.float64)
        out = []
        for w, raw in zip(self.weights, self.raws):
            experts = dequantize(raw, w.type).reshape(w.ne[2], w.ne[1], K).astype(np.float64)
            out.append(np.einsum("tumk,tk->tum", experts[self.routing], x))
        return out


@pytest.mark.parametrize("n_tokens", [1, 40])
def test_gate_and_up_experts_of_one_routing_are_one_call(fast_cpu, rng, n_tokens):
    """A mixture's gate and up (MUL_MAT_ID of one activation and one routing; Q4_K and Q6_K,
    other rows and other expert counts) join: bit for bit the products one by one, and near
    float64."""
    experts = Experts(fast_cpu, rng, [GGMLType.Q4_K, GGMLType.Q6_K], [48, 32], 6, n_tokens)
    try:
        assert experts.groups() == [2]
        joined, one_by_one = experts(), experts(replayed=False)
        for got, alone, want in zip(joined, one_by_one, experts.exact()):
            np.testing.assert_array_equal(got, alone)
            np.testing.assert_allclose(got.reshape(want.shape), want, rtol=0,
                                       atol=2e-4 * np.abs(want).max())
    finally:
        experts.close()


def test_joined_experts_routed_outside_a_weight_raise_its_error(fast_cpu, rng):
    """An expert id past the first weight's experts (valid for the second's): the joined call
    writes nothing, and the products one by one raise the first's error."""
    from polydev.errors import OutOfBoundsError

    experts = Experts(fast_cpu, rng, [GGMLType.Q4_K, GGMLType.Q4_K], [32, 32], 6, 3)
    try:
        routing = experts.routing.copy()
        routing[1, 0] = 6
        experts.ids.set_data(routing)
        with pytest.raises(OutOfBoundsError, match="mul_mat_id"):
            experts()
    finally:
        experts.close()
