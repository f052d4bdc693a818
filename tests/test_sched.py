"""The scheduler: placement and splits of canonical graphs, the caller's graph left alone,
eval callbacks, reuse, and random graphs over the CPU and two OpenCL devices that must give
the single-CPU result."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polydev
from polydev import (BufferUsage, Context, GGMLType, GraphAllocator, alloc_ctx_tensors,
                     build_graph, ops)
from polydev.errors import ClosedError, ConfigError, InvalidArgumentError, UnsupportedError
from polydev.sched import Scheduler
from polydev import sched_split

from needs import OPENCL, opencl_mark

needs_opencl = opencl_mark()
K = 64


@pytest.fixture
def backends():
    made = [d.init_backend() for d in OPENCL[:2]] + [polydev.init_backend("CPU")]
    yield made
    for b in made:
        b.close()


def _weights(backend, values: dict[str, np.ndarray], type_=GGMLType.F32):
    ctx = Context()
    tensors = {k: ctx.new_tensor(type_, v.shape[::-1], k) for k, v in values.items()}
    buf = alloc_ctx_tensors(ctx, backend)
    buf.usage = BufferUsage.WEIGHTS
    for k, v in values.items():
        tensors[k].set_data(v)
    return buf, tensors


def _mlp(w0, w1, n_tokens=3):
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, (K, n_tokens), "x").set_input()
    h = ops.silu(ctx, ops.mul_mat(ctx, w0, x))
    y = ops.rms_norm(ctx, ops.mul_mat(ctx, w1, h), 1e-6).set_output()
    return x, y, build_graph(y)


def _mlp_ref(x, w0, w1):
    h = x @ w0.T
    h = h / (1 + np.exp(-h))
    z = h @ w1.T
    return z / np.sqrt((z * z).mean(-1, keepdims=True) + 1e-6)


def test_the_last_backend_must_be_a_cpu():
    with polydev.init_backend("CPU") as cpu:
        Scheduler([cpu])
        if OPENCL and OPENCL[0].type != polydev.DeviceType.CPU:
            with pytest.raises(InvalidArgumentError, match="last backend"):
                Scheduler([cpu, OPENCL[0].init_backend()])
    with pytest.raises(InvalidArgumentError):
        Scheduler([])


@needs_opencl
def test_weights_decide_placement_and_splits(backends, rng):
    ocl, cpu = backends[0], backends[-1]
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    buf0, t0 = _weights(ocl, {"w0": w0v})
    buf1, t1 = _weights(cpu, {"w1": w1v})
    with buf0, buf1, Scheduler([ocl, cpu]) as sched:
        x, y, graph = _mlp(t0["w0"], t1["w1"])
        sources = [list(n.src) for n in graph.nodes]
        sched.alloc_graph(graph)
        xv = rng.standard_normal((3, K)).astype(np.float32)
        x.set_data(xv)
        assert sched.compute(graph)
        np.testing.assert_allclose(y.numpy()[0, 0], _mlp_ref(xv, w0v, w1v), rtol=1e-4,
                                   atol=1e-5)
        assert sched.n_splits == 2
        placements = [sched.placement(n) for n in graph.nodes]
        assert placements == [("OpenCL0", "1.wgt0"), ("OpenCL0", "2.sup"), ("CPU", "1.wgt0"),
                              ("CPU", "2.sup")]
        assert sched.placement(x) == ("CPU", "1.inp")
        assert [list(n.src) for n in graph.nodes] == sources      # the caller's graph is intact


@needs_opencl
def test_a_pinned_tensor_stays_where_the_user_put_it(backends, rng):
    ocl, cpu = backends[0], backends[-1]
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    buf, t = _weights(cpu, {"w0": w0v, "w1": w1v})
    with buf, Scheduler([ocl, cpu]) as sched:
        x, y, graph = _mlp(t["w0"], t["w1"])
        silu = graph.nodes[1]
        sched.set_tensor_backend(silu, ocl)
        sched.alloc_graph(graph)
        xv = rng.standard_normal((3, K)).astype(np.float32)
        x.set_data(xv)
        sched.compute(graph)
        assert sched.placement(silu) == ("OpenCL0", "usr")
        assert sched.get_tensor_backend(silu) is ocl
        np.testing.assert_allclose(y.numpy()[0, 0], _mlp_ref(xv, w0v, w1v), rtol=1e-4,
                                   atol=1e-5)


def test_eval_callback_batches_and_cancels(rng):
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    with polydev.init_backend("CPU") as cpu, Scheduler([cpu]) as sched:
        buf, t = _weights(cpu, {"w0": w0v, "w1": w1v})
        with buf:
            x, y, graph = _mlp(t["w0"], t["w1"])
            asked, seen = [], []

            def wants_silu(node, ask):
                if ask:
                    asked.append(node.op.name)
                    return node.op.name == "UNARY"
                seen.append(node.numpy().copy())
                return True
            sched.set_eval_callback(wants_silu)
            sched.alloc_graph(graph)
            xv = rng.standard_normal((3, K)).astype(np.float32)
            x.set_data(xv)
            assert sched.compute(graph)
            assert asked == ["MUL_MAT", "UNARY", "MUL_MAT", "RMS_NORM"]
            h = xv @ w0v.T
            np.testing.assert_allclose(seen[0][0, 0], h / (1 + np.exp(-h)), rtol=1e-5)
            y.buffer.clear(0)
            sched.set_eval_callback(lambda node, ask: True if ask else False)
            assert sched.compute(graph) is False            # cancelled after the first node
            assert not y.numpy().any()                      # the rest never ran


def test_a_graph_of_the_same_structure_reuses_the_placement(rng, monkeypatch):
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    calls = []
    real = sched_split.SplitPlanner.pass1
    monkeypatch.setattr(sched_split.SplitPlanner, "pass1",
                        lambda self, g: calls.append(1) or real(self, g))
    with polydev.init_backend("CPU") as cpu, Scheduler([cpu]) as sched:
        buf, t = _weights(cpu, {"w0": w0v, "w1": w1v})
        with buf:
            for _ in range(3):
                _new_graph_step(sched, t["w0"], t["w1"], w0v, w1v, rng)
    assert len(calls) == 1


def _new_graph_step(sched, w0, w1, w0v, w1v, rng) -> None:
    """One step of a loop that builds a new graph each time, checked against numpy."""
    x, y, graph = _mlp(w0, w1)
    sched.alloc_graph(graph)
    xv = rng.standard_normal((3, K)).astype(np.float32)
    x.set_data(xv)
    sched.compute(graph)
    np.testing.assert_allclose(y.numpy()[0, 0], _mlp_ref(xv, w0v, w1v), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("use_opencl", [False, pytest.param(True, marks=needs_opencl)])
def test_a_new_graph_of_the_same_structure_keeps_the_bound_plans(rng, monkeypatch, use_opencl):
    """A decode loop that builds a new Graph per step binds its kernels once, not per step."""
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    backends = ([OPENCL[0].init_backend()] if use_opencl else []) + [polydev.init_backend("CPU")]
    binds = []
    for b in backends:
        real = b.bind
        monkeypatch.setattr(b, "bind", lambda node, real=real: binds.append(node) or real(node))
    with Scheduler(backends) as sched:
        buf, t = _weights(backends[0], {"w0": w0v})
        buf1, t1 = _weights(backends[-1], {"w1": w1v})
        with buf, buf1:
            for step in range(4):
                _new_graph_step(sched, t["w0"], t1["w1"], w0v, w1v, rng)
                if step == 0:
                    first = len(binds)
    assert first > 0 and len(binds) == first
    for b in backends:
        b.close()


def _counting_builds_and_allocations(monkeypatch) -> tuple[list, list]:
    """Lists that grow by one for each step of twins the scheduler builds and each graph the
    allocator lays out."""
    built, allocated = [], []
    real_build, real_alloc = Scheduler._build_step, GraphAllocator.alloc_graph
    monkeypatch.setattr(Scheduler, "_build_step",
                        lambda self, *a: built.append(1) or real_build(self, *a))
    monkeypatch.setattr(GraphAllocator, "alloc_graph",
                        lambda self, g: allocated.append(1) or real_alloc(self, g))
    return built, allocated


@pytest.mark.parametrize("use_opencl", [False, pytest.param(True, marks=needs_opencl)])
def test_a_new_graph_of_the_allocated_structure_takes_over_its_step(rng, monkeypatch,
                                                                    use_opencl):
    """A loop that builds a new graph per step (bench/sched.py's reuse path): from the second
    step on nothing is built or allocated again, each new graph computes with its own
    inputs, and the scheduler answers for its tensors as for the first graph's."""
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    backends = ([OPENCL[0].init_backend()] if use_opencl else []) + [polydev.init_backend("CPU")]
    built, allocated = _counting_builds_and_allocations(monkeypatch)
    with Scheduler(backends) as sched:
        buf, t = _weights(backends[0], {"w0": w0v})
        buf1, t1 = _weights(backends[-1], {"w1": w1v})
        with buf, buf1:
            x0, y0, first = _mlp(t["w0"], t1["w1"])
            sched.alloc_graph(first)
            placements = [sched.placement(n) for n in first.nodes + [x0]]
            counts = (len(built), len(allocated))
            for _ in range(4):
                _new_graph_step(sched, t["w0"], t1["w1"], w0v, w1v, rng)
                x, y, graph = _mlp(t["w0"], t1["w1"])
                sched.alloc_graph(graph)
                assert [sched.placement(n) for n in graph.nodes + [x]] == placements
                assert sched.get_tensor_backend(y) is sched.get_tensor_backend(y0)
            assert (len(built), len(allocated)) == counts
            assert sched.n_splits == (2 if use_opencl else 1)
    for b in backends:
        b.close()


@needs_opencl
def test_graphs_that_took_over_a_step_compute_again_in_any_order(backends, rng, monkeypatch):
    """Graph objects kept by the scheduler come back after others took their step over (a
    server alternating graphs): each computes with its own inputs and its own outputs."""
    ocl, cpu = backends[0], backends[-1]
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    buf0, t0 = _weights(ocl, {"w0": w0v})
    buf1, t1 = _weights(cpu, {"w1": w1v})
    with buf0, buf1, Scheduler([ocl, cpu]) as sched:
        graphs = [_mlp(t0["w0"], t1["w1"]) for _ in range(3)]
        for k in (0, 1, 2, 0, 2, 1, 1, 0):
            x, y, graph = graphs[k]
            sched.alloc_graph(graph)
            xv = rng.standard_normal((3, K)).astype(np.float32)
            x.set_data(xv)
            sched.compute(graph)
            np.testing.assert_allclose(y.numpy()[0, 0], _mlp_ref(xv, w0v, w1v), rtol=1e-4,
                                       atol=1e-5)


@needs_opencl
def test_a_graph_that_took_over_a_step_comes_back_after_another_structure(backends, rng):
    """A graph that took a step over, allocated again after a graph of another structure
    replaced the memory's layout, and after its planned graph grew: each computes with its
    own inputs."""
    ocl, cpu = backends[0], backends[-1]
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    buf0, t0 = _weights(ocl, {"w0": w0v})
    buf1, t1 = _weights(cpu, {"w1": w1v})

    def step(x, y, graph, n_tokens=3):
        sched.alloc_graph(graph)
        xv = rng.standard_normal((n_tokens, K)).astype(np.float32)
        x.set_data(xv)
        sched.compute(graph)
        np.testing.assert_allclose(y.numpy()[0, 0], _mlp_ref(xv, w0v, w1v), rtol=1e-4,
                                   atol=1e-5)
    with buf0, buf1, Scheduler([ocl, cpu]) as sched:
        a, b, c = _mlp(t0["w0"], t1["w1"]), _mlp(t0["w0"], t1["w1"]), _mlp(t0["w0"], t1["w1"], 7)
        for graph in (a, b, c, b, a, b):
            step(*graph, n_tokens=7 if graph is c else 3)
        a[2].build_forward_expand(ops.neg(Context(), a[1]))       # the planned graph grows
        step(*b)
        step(*a)
        step(*b)            # its kept step laid out again for a's new layout


def test_a_new_graph_reading_other_memory_is_placed_again(rng, monkeypatch):
    """Equal structure means the same weights at the same bytes: a new graph over another
    weight buffer is placed and allocated anew, and computes with its own weights; one with
    a leaf the caller allocated at the same bytes takes the step over."""
    w0v, w1v, w2v = rng.standard_normal((3, K, K)).astype(np.float32)
    built, allocated = _counting_builds_and_allocations(monkeypatch)
    with polydev.init_backend("CPU") as cpu, Scheduler([cpu]) as sched:
        buf, t = _weights(cpu, {"w0": w0v, "w1": w1v})
        buf2, t2 = _weights(cpu, {"w2": w2v})
        with buf, buf2:
            _new_graph_step(sched, t["w0"], t["w1"], w0v, w1v, rng)
            counts = (len(built), len(allocated))
            _new_graph_step(sched, t["w0"], t2["w2"], w0v, w2v, rng)
            assert len(built) == counts[0] + 1 and len(allocated) > counts[1]
            counts = (len(built), len(allocated))
            _new_graph_step(sched, t["w0"], t2["w2"], w0v, w2v, rng)
            assert (len(built), len(allocated)) == counts


def test_eval_callbacks_see_the_nodes_of_the_graph_that_took_over(rng):
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    with polydev.init_backend("CPU") as cpu, Scheduler([cpu]) as sched:
        buf, t = _weights(cpu, {"w0": w0v, "w1": w1v})
        with buf:
            _new_graph_step(sched, t["w0"], t["w1"], w0v, w1v, rng)
            x, y, graph = _mlp(t["w0"], t["w1"])
            seen = []
            sched.set_eval_callback(lambda node, ask: seen.append(node) or True)
            sched.alloc_graph(graph)
            x.set_data(rng.standard_normal((3, K)).astype(np.float32))
            assert sched.compute(graph)
            assert {id(n) for n in seen} == {id(n) for n in graph.nodes}


def test_the_same_graph_again_is_neither_placed_nor_allocated_again(rng, monkeypatch):
    """A decode loop computing one Graph object with new inputs: after the first step,
    alloc_graph keeps the placement and the memory; a node added to the graph, or a tensor
    pinned to a backend, makes it place the graph again."""
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    planned, allocated = [], []
    real_pass1, real_alloc = sched_split.SplitPlanner.pass1, GraphAllocator.alloc_graph
    monkeypatch.setattr(sched_split.SplitPlanner, "pass1",
                        lambda self, g: planned.append(1) or real_pass1(self, g))
    monkeypatch.setattr(GraphAllocator, "alloc_graph",
                        lambda self, g: allocated.append(1) or real_alloc(self, g))
    with polydev.init_backend("CPU") as cpu, Scheduler([cpu]) as sched:
        buf, t = _weights(cpu, {"w0": w0v, "w1": w1v})
        with buf:
            x, y, graph = _mlp(t["w0"], t["w1"])
            for _ in range(3):
                sched.alloc_graph(graph)
                xv = rng.standard_normal((3, K)).astype(np.float32)
                x.set_data(xv)
                sched.compute(graph)
                np.testing.assert_allclose(y.numpy()[0, 0], _mlp_ref(xv, w0v, w1v),
                                           rtol=1e-4, atol=1e-5)
            assert (len(planned), len(allocated)) == (1, 1)
            graph.build_forward_expand(ops.neg(Context(), y))
            sched.alloc_graph(graph)
            assert (len(planned), len(allocated)) == (2, 2)
            sched.set_tensor_backend(y, cpu)
            sched.alloc_graph(graph)
            assert (len(planned), len(allocated)) == (3, 3)


def test_a_changed_graph_is_bound_again(rng):
    """Plans follow the ops, not only the memory: same shapes, another op, another result."""
    with polydev.init_backend("CPU") as cpu, Scheduler([cpu]) as sched:
        for fn, ref in ((ops.silu, lambda v: v / (1 + np.exp(-v))), (ops.neg, np.negative)):
            ctx = Context()
            x = ctx.new_tensor(GGMLType.F32, (K, 2), "x").set_input()
            y = fn(ctx, x).set_output()
            graph = build_graph(y)
            sched.alloc_graph(graph)
            xv = rng.standard_normal((2, K)).astype(np.float32)
            x.set_data(xv)
            sched.compute(graph)
            np.testing.assert_allclose(y.numpy()[0, 0], ref(xv), rtol=1e-6)


def test_a_closed_scheduler_raises(rng):
    with polydev.init_backend("CPU") as cpu:
        sched = Scheduler([cpu])
        buf, t = _weights(cpu, {"w0": np.eye(K, dtype=np.float32),
                                "w1": np.eye(K, dtype=np.float32)})
        x, y, graph = _mlp(t["w0"], t["w1"])
        sched.alloc_graph(graph)
        sched.close()
        sched.close()                            # twice is fine
        for call in (sched.compute, sched.compute_async, sched.alloc_graph, sched.reserve):
            with pytest.raises(ClosedError, match="scheduler was closed"):
                call(graph)
        with pytest.raises(ClosedError):
            sched.synchronize()
        buf.close()


@pytest.mark.parametrize("value", ["abc", "-1", "3", "1.5"])
def test_a_bad_sched_debug_value_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("POLYDEV_SCHED_DEBUG", value)
    with polydev.init_backend("CPU") as cpu:
        with pytest.raises(ConfigError, match=f"POLYDEV_SCHED_DEBUG='{value}'"):
            Scheduler([cpu])


def test_only_a_missing_plan_falls_back_to_graph_compute(rng, monkeypatch):
    """A backend whose plans fail for another reason raises that error; it is not hidden."""
    with polydev.init_backend("CPU") as cpu, Scheduler([cpu]) as sched:
        buf, t = _weights(cpu, {"w0": np.eye(K, dtype=np.float32),
                                "w1": np.eye(K, dtype=np.float32)})
        with buf:
            x, y, graph = _mlp(t["w0"], t["w1"])
            sched.alloc_graph(graph)
            x.set_data(np.ones((3, K), np.float32))

            def broken(graph):
                raise RuntimeError("bind failed")
            monkeypatch.setattr(cpu, "graph_plan_create", broken)
            with pytest.raises(RuntimeError, match="bind failed"):
                sched.compute(graph)

            def no_plans(graph):
                raise UnsupportedError("no plans here")
            monkeypatch.setattr(cpu, "graph_plan_create", no_plans)
            assert sched.compute(graph)
            np.testing.assert_allclose(y.numpy()[0, 0], _mlp_ref(np.ones((3, K)), np.eye(K),
                                                                  np.eye(K)), rtol=1e-5)


# --- random graphs, random weight placement: the single-CPU result ------------------------------

OPS = ["mul_mat", "add", "mul", "silu", "rms_norm", "soft_max", "scale", "gelu"]


@needs_opencl
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_graphs_match_one_cpu(backends, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    n_layers = data.draw(st.integers(1, 5))
    places = data.draw(st.lists(st.integers(0, len(backends) - 1), min_size=n_layers,
                                max_size=n_layers))
    op_names = data.draw(st.lists(st.sampled_from(OPS), min_size=n_layers, max_size=n_layers))
    n_tokens = data.draw(st.sampled_from([1, 3, 8]))
    weights = [rng.standard_normal((K, K)).astype(np.float32) / 8 for _ in range(n_layers)]
    inputs = rng.standard_normal((2, n_tokens, K)).astype(np.float32)

    def run(owner_of_layer, scheduler_backends):
        """The outputs for each input, each from a new graph (the second takes over the
        first's step)."""
        bufs, ws = [], []
        for i, w in enumerate(weights):
            buf, t = _weights(owner_of_layer(i), {f"w{i}": w})
            bufs.append(buf)
            ws.append(t[f"w{i}"])
        with Scheduler(scheduler_backends) as sched:
            results = [step(sched, ws, xv) for xv in inputs]
        for b in bufs:
            b.close()
        return results

    def step(sched, ws, xv):
        ctx = Context()
        x = ctx.new_tensor(GGMLType.F32, (K, n_tokens), "x").set_input()
        cur = x
        for i, name in enumerate(op_names):
            if name == "mul_mat":
                cur = ops.mul_mat(ctx, ws[i], cur)
            elif name in ("add", "mul"):
                cur = getattr(ops, name)(ctx, cur, ops.mul_mat(ctx, ws[i], cur))
            elif name in ("rms_norm",):
                cur = ops.rms_norm(ctx, cur, 1e-6)
            elif name == "soft_max":
                cur = ops.soft_max_ext(ctx, cur, None, 0.5)
            elif name == "scale":
                cur = ops.scale(ctx, cur, 0.5, 0.1)
            else:
                cur = getattr(ops, name)(ctx, cur)
        out = cur.set_output()
        graph = build_graph(out)
        sched.alloc_graph(graph)
        x.set_data(xv)
        sched.compute(graph)
        return out.numpy().copy()

    cpu = backends[-1]
    expected = run(lambda i: cpu, [cpu])
    got = run(lambda i: backends[places[i]], backends)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


# --- the ops at a boundary between backends ------------------------------------------------------

def _residual_layers(owners, n_tokens=3, inplace=False):
    """Pre-norm residual layers, layer i's weights on ``owners[i]``: x += w_i (norm(x) * g_i)
    (``inplace``: into the residual's memory); the graph, its input, its output, and a
    float64 reference of it."""
    rng = np.random.default_rng(5)
    values = [(rng.standard_normal(K).astype(np.float32),
               (rng.standard_normal((K, K)) / 8).astype(np.float32)) for _ in owners]
    bufs, ctx = [], Context()
    x = ctx.new_tensor(GGMLType.F32, (K, n_tokens), "x").set_input()
    cur, nodes = x, {}
    for i, (owner, (g, w)) in enumerate(zip(owners, values)):
        buf, t = _weights(owner, {f"g{i}": g, f"w{i}": w})
        bufs.append(buf)
        norm = ops.rms_norm(ctx, cur, 1e-6)
        cur = ops.add(ctx, cur, ops.mul_mat(ctx, t[f"w{i}"], ops.mul(ctx, norm, t[f"g{i}"])),
                      inplace=inplace and i > 0)
        nodes[f"norm{i}"], nodes[f"out{i}"] = norm, cur
    out = ops.rms_norm(ctx, cur, 1e-6).set_output()

    def reference(xv):
        h = xv.astype(np.float64)
        for g, w in values:
            normed = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6)
            h = h + (normed * g) @ w.T.astype(np.float64)
        return h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6)
    return x, out, build_graph(out), nodes, bufs, reference


@needs_opencl
def test_a_boundary_between_backends_copies_one_activation(backends, rng):
    """Layers on OpenCL0, the CPU, the CPU, OpenCL0: ggml's passes take two activations
    across each boundary (the next layer's norm, or the last layer's residual add, placed on
    the other side); the scheduler moves that op so one crosses, as llama.cpp's pinned norms
    do one way, and computes what one CPU does."""
    ocl, cpu = backends[0], backends[-1]
    x, out, graph, nodes, bufs, reference = _residual_layers([ocl, cpu, cpu, ocl])
    with Scheduler([ocl, cpu]) as sched:
        sched.alloc_graph(graph)
        xv = rng.standard_normal((3, K)).astype(np.float32)
        x.set_data(xv)
        sched.compute(graph)
        np.testing.assert_allclose(out.numpy()[0, 0], reference(xv), rtol=1e-4, atol=1e-5)
        assert sched.placement(nodes["norm1"]) == ("CPU", "4.cut")     # OpenCL0 -> CPU
        assert sched.placement(nodes["out2"]) == ("CPU", "4.cut")      # CPU -> OpenCL0
        activation = K * 3 * 4
        # x onto OpenCL0, then one activation at each of the two boundaries
        assert sum(sched.copied_bytes.values()) == 3 * activation
    for buf in bufs:
        buf.close()


@pytest.mark.parametrize("inplace", [False, True])
def test_an_op_in_place_stays_in_its_sources_memory(inplace):
    """The boundary pass alone, over two backends that cannot read each other's memory: an
    add whose sources and reader are on backend 0 moves there, unless it writes into its
    source's memory (in place: a view of it)."""
    from polydev.sched_boundary import fewer_copies

    class Planner:          # what fewer_copies asks of a SplitPlanner
        ids = sched_split.Assignment()
        bufts = ["buft0", "buft1"]
        backends = [type("B", (), {"supports_buft": lambda self, buft: False})()] * 2

        def supports_op(self, b, t):
            return True

        def buffer_supported(self, t, b):
            return False
    ctx = Context()
    a, b = (ctx.new_tensor(GGMLType.F32, (K, 1), name) for name in "ab")
    added = ops.add(ctx, a, b, inplace=inplace)
    reader = ops.silu(ctx, added)
    graph = build_graph(reader)
    planner = Planner()
    for t, backend, cause in ((a, 0, "1.wgt0"), (b, 0, "1.wgt0"), (added, 1, "2.sup"),
                              (reader, 0, "1.wgt0")):
        planner.ids.set(t, backend, cause)
    fewer_copies(planner, graph)
    assert planner.ids.get(added) == (1 if inplace else 0)


@needs_opencl
@pytest.mark.parametrize("n_tokens", [31, 32])
def test_only_a_decode_steps_ops_move_at_a_boundary(backends, rng, n_tokens):
    """As llama.cpp pins its norms only for ubatches under 32 tokens: a prompt's ops stay
    where ggml's passes put them."""
    ocl, cpu = backends[0], backends[-1]
    x, out, graph, nodes, bufs, reference = _residual_layers([ocl, cpu, cpu, ocl], n_tokens)
    with Scheduler([ocl, cpu]) as sched:
        sched.alloc_graph(graph)
        xv = rng.standard_normal((n_tokens, K)).astype(np.float32)
        x.set_data(xv)
        sched.compute(graph)
        np.testing.assert_allclose(out.numpy()[0, 0], reference(xv), rtol=1e-4, atol=1e-5)
        moved = [n for n in graph.nodes if sched.placement(n)[1] == "4.cut"]
        assert len(moved) == (2 if n_tokens < 32 else 0)
    for buf in bufs:
        buf.close()


@needs_opencl
@pytest.mark.parametrize("pinned", [False, True])
def test_ops_at_a_boundary_stay_where_a_move_copies_as_much(backends, rng, pinned):
    """Single layers alternating already take one activation across each boundary: nothing
    moves; and an op the user pinned never moves."""
    ocl, cpu = backends[0], backends[-1]
    x, out, graph, nodes, bufs, reference = _residual_layers([ocl, cpu, ocl])
    with Scheduler([ocl, cpu]) as sched:
        if pinned:
            sched.set_tensor_backend(nodes["norm1"], cpu)
        sched.alloc_graph(graph)
        xv = rng.standard_normal((3, K)).astype(np.float32)
        x.set_data(xv)
        sched.compute(graph)
        np.testing.assert_allclose(out.numpy()[0, 0], reference(xv), rtol=1e-4, atol=1e-5)
        assert all(sched.placement(n)[1] != "4.cut" for n in graph.nodes)
        if pinned:
            assert sched.placement(nodes["norm1"]) == ("CPU", "usr")
        else:
            assert sum(sched.copied_bytes.values()) == 3 * K * 3 * 4
    for buf in bufs:
        buf.close()


# --- the other placement rules ------------------------------------------------------------------

def _matmul_graph(w, n_tokens):
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, (K, n_tokens), "x").set_input()
    out = ops.mul_mat(ctx, w, x).set_output()
    return x, out, build_graph(out)


@needs_opencl
@pytest.mark.parametrize("n_tokens,expected", [(31, ("CPU", "1.wgt0")),
                                               (32, ("OpenCL0", "1.off"))])
def test_op_offload_from_host_weights_at_large_batches(backends, rng, monkeypatch, n_tokens,
                                                       expected):
    ocl, cpu = backends[0], backends[-1]
    # a device that wants big batches, as ggml's CUDA backend does (batch >= 32)
    monkeypatch.setattr(ocl.device, "offload_op", lambda op: op.ne[1] >= 32, raising=False)
    wv = rng.standard_normal((K, K)).astype(np.float32)
    buf, t = _weights(cpu, {"w": wv})
    with buf, Scheduler([ocl, cpu]) as sched:
        x, out, graph = _matmul_graph(t["w"], n_tokens)
        sched.alloc_graph(graph)
        xv = rng.standard_normal((n_tokens, K)).astype(np.float32)
        x.set_data(xv)
        sched.compute(graph)
        assert sched.placement(out) == expected
        np.testing.assert_allclose(out.numpy()[0, 0], xv @ wv.T, rtol=1e-4, atol=1e-4)
    with buf, Scheduler([ocl, cpu], op_offload=False) as sched:
        x, out, graph = _matmul_graph(t["w"], n_tokens)
        sched.alloc_graph(graph)
        assert sched.placement(out) == ("CPU", "1.wgt0")


def test_backends_sharing_a_buffer_type_upgrade_to_the_first(rng):
    with polydev.init_backend("CPU") as first, polydev.init_backend("CPU") as second:
        wv = rng.standard_normal((K, K)).astype(np.float32)
        buf, t = _weights(second, {"w": wv})
        with buf, Scheduler([first, second]) as sched:
            x, out, graph = _matmul_graph(t["w"], 4)
            sched.set_tensor_backend(x, second)
            sched.alloc_graph(graph)
            assert sched.placement(out) == (first.name, "1.wgt0")   # the first that can run it
            assert sched.placement(x) == (second.name, "usr")       # the pin is kept
            assert first.default_buffer_type is second.default_buffer_type


@needs_opencl
def test_a_split_is_cut_when_its_inputs_reach_capacity(backends, rng):
    ocl, cpu = backends[0], backends[-1]
    n = sched_split.MAX_SPLIT_INPUTS + 5
    ctx = Context()
    leaves = [ctx.new_tensor(GGMLType.F32, (K,), f"in{i}").set_input() for i in range(n)]
    cur = ops.scale(ctx, leaves[0], 1.0)
    for leaf in leaves[1:]:
        cur = ops.add(ctx, cur, leaf)
    out = cur.set_output()
    graph = build_graph(out)
    with Scheduler([ocl, cpu]) as sched:
        for node in graph.nodes:
            sched.set_tensor_backend(node, ocl)
        sched.alloc_graph(graph)
        values = rng.standard_normal((n, K)).astype(np.float32)
        for leaf, v in zip(leaves, values):
            leaf.set_data(v)
        sched.compute(graph)
        assert sched.n_splits == 2                       # 30 copies, then a new split
        np.testing.assert_allclose(out.numpy().ravel(), values.sum(0), rtol=1e-5, atol=1e-5)


@needs_opencl
def test_pipelined_copies_rotate_and_stay_correct(backends, rng):
    ocl, cpu = backends[0], backends[-1]
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    buf0, t0 = _weights(ocl, {"w0": w0v})
    buf1, t1 = _weights(cpu, {"w1": w1v})
    with buf0, buf1, Scheduler([ocl, cpu], parallel=True) as sched:
        assert sched.n_copies == 4
        slots = []
        for _ in range(6):
            x, y, graph = _mlp(t0["w0"], t1["w1"])
            sched.alloc_graph(graph)
            slots.append(sched.cur_copy)
            xv = rng.standard_normal((3, K)).astype(np.float32)
            x.set_data(xv)
            sched.compute(graph)
            np.testing.assert_allclose(y.numpy()[0, 0], _mlp_ref(xv, w0v, w1v), rtol=1e-4,
                                       atol=1e-5)
        assert slots == [0, 1, 2, 3, 0, 1]


@needs_opencl
def test_trace_records_copies_and_computes(backends, rng, tmp_path):
    ocl, cpu = backends[0], backends[-1]
    w0v, w1v = rng.standard_normal((2, K, K)).astype(np.float32)
    buf0, t0 = _weights(ocl, {"w0": w0v})
    buf1, t1 = _weights(cpu, {"w1": w1v})
    with buf0, buf1, Scheduler([ocl, cpu]) as sched:
        x, y, graph = _mlp(t0["w0"], t1["w1"])
        sched.alloc_graph(graph)
        x.set_data(rng.standard_normal((3, K)).astype(np.float32))
        with sched.trace() as events:
            sched.compute(graph)
        kinds = [(e["kind"], e["backend"]) for e in events]
        assert kinds == [("copy", "OpenCL0"), ("compute", "OpenCL0"), ("copy", "CPU"),
                         ("compute", "CPU")]
        path = tmp_path / "trace.json"
        sched.write_trace(str(path))
        import json
        doc = json.loads(path.read_text())
        assert len(doc["traceEvents"]) == 4 and doc["traceEvents"][0]["ph"] == "X"
