"""Remote devices through Ray, on a local cluster of this machine: two actors, each owning a
device of this node (the CPU backend's device, and an OpenCL device where PoCL has one),
used through the same contract as local devices and checked against local runs.

The cluster starts once for the module (2 CPUs, a small object store). The last test kills
an actor; every test before it uses both devices.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="remote devices need the ray extra")

import polydev  # noqa: E402
from polydev import (BufferUsage, Context, GGMLType, alloc_ctx_tensors, build_graph,  # noqa: E402
                     ops, tensor_copy)
from polydev.buffer import tensor_memset  # noqa: E402
from polydev.errors import AllocationError, OutOfBoundsError, RemoteDeviceError  # noqa: E402
from polydev.sched import Scheduler  # noqa: E402

import transfer_checks  # noqa: E402
from model_files import SMOLLM2, model_path  # noqa: E402
from needs import missing  # noqa: E402

pytestmark = pytest.mark.ray
K = 64


@pytest.fixture(scope="module")
def remote():
    """The remote devices: [the CPU backend's device, OpenCL0 or None]."""
    from polydev.backends import ray as polydev_ray

    local_opencl = any(d.name == "OpenCL0" for d in polydev.devices())
    wanted = ["CPU", "OpenCL0"] if local_opencl else ["CPU"]
    devices = polydev_ray.connect("local", devices=wanted, num_cpus=2,
                                  object_store_memory=256 << 20, include_dashboard=False,
                                  log_to_driver=False)
    by_name = {d.remote_name: d for d in devices}
    yield [by_name["CPU"], by_name.get("OpenCL0")]
    polydev_ray.disconnect()
    ray.shutdown()


def _remote_pair(remote):
    if remote[1] is None:
        missing("POLYDEV_REQUIRE_OPENCL", "needs an OpenCL device on the node for a second "
                "remote device (pip install -e '.[opencl]')")
    return remote


# --- the devices ------------------------------------------------------------------------------

def test_remote_devices_are_named_listed_and_described(remote, capsys):
    cpu = remote[0]
    node = ray.nodes()[0]["NodeManagerAddress"]
    assert cpu.name == f"ray:{node}/CPU"
    assert polydev.device(cpu.name) is cpu
    props = cpu.props()
    assert props.caps.async_ and props.caps.events and not props.caps.host_buffer
    free, total = cpu.memory()
    assert 0 < free <= total
    assert cpu.buffer_type.alignment == polydev.device("CPU").buffer_type.alignment
    assert polydev.registry().best_device().name == "CPU"     # remote never becomes "best"
    from polydev.tools.cli import main
    assert main(["devices"]) == 0
    assert cpu.name in capsys.readouterr().out


def test_buffers_set_get_memset_clear_and_copy_actor_to_actor(remote, rng):
    a_dev, b_dev = _remote_pair(remote)
    values = rng.standard_normal(1000).astype(np.float32)
    ctx_a, ctx_b, ctx_h = Context(), Context(), Context()
    a = ctx_a.new_tensor(GGMLType.F32, (1000,), "a")
    b = ctx_b.new_tensor(GGMLType.F32, (1000,), "b")
    h = ctx_h.new_tensor(GGMLType.F32, (1000,), "h")
    with (alloc_ctx_tensors(ctx_a, a_dev.buffer_type) as buf_a,
          alloc_ctx_tensors(ctx_b, b_dev.buffer_type),
          alloc_ctx_tensors(ctx_h, polydev.device("CPU").buffer_type)):
        a.set_data(values)
        np.testing.assert_array_equal(a.numpy().ravel(), values)
        tensor_memset(a, 0, 8, 8)
        assert list(a.numpy().ravel()[2:4]) == [0, 0]
        a.set_data(values)
        tensor_copy(a, b)                          # remote to remote: actor to actor
        tensor_copy(b, h)                          # remote to host
        np.testing.assert_array_equal(h.numpy().ravel(), values)
        buf_a.clear(0)
        assert not a.numpy().any()


def test_async_copies_and_events_order_two_remote_streams(remote, rng):
    a_dev, b_dev = _remote_pair(remote)
    ctx_a, ctx_b = Context(), Context()
    x = ctx_a.new_tensor(GGMLType.F32, (K, 4), "x")
    doubled = ops.scale(ctx_a, x, 2.0)
    y = ctx_b.new_tensor(GGMLType.F32, (K, 4), "y")
    with (alloc_ctx_tensors(ctx_a, a_dev.buffer_type),
          alloc_ctx_tensors(ctx_b, b_dev.buffer_type),
          a_dev.init_backend() as sa, b_dev.init_backend() as sb):
        values = rng.standard_normal((4, K)).astype(np.float32)
        sa.set_tensor_async(x, values)
        sa.graph_compute_async(build_graph(doubled))
        event = a_dev.event_new()
        event.record(sa)
        event.wait(sb)                              # the driver does not block here
        polydev.tensor_copy_async(sa, sb, doubled, y)
        out = np.empty((4, K), np.float32)
        sb.get_tensor_async(y, out)
        sb.synchronize()
        np.testing.assert_array_equal(out, 2 * values)
        event.close()


def test_an_async_copy_between_two_streams_of_one_remote_device(remote, rng):
    """Two streams of one remote device: the copy is the actor's own, after the event of the
    stream that computed its source; the same again with a large copy."""
    device = remote[0]
    for n in (K, 1 << 19):
        ctx = Context()
        x = ctx.new_tensor(GGMLType.F32, (n,), "x")
        doubled = ops.scale(ctx, x, 2.0)
        y = ctx.new_tensor(GGMLType.F32, (n,), "y")
        with (alloc_ctx_tensors(ctx, device.buffer_type), device.init_backend() as sa,
              device.init_backend() as sb):
            values = rng.standard_normal(n).astype(np.float32)
            sa.set_tensor_async(x, values)
            sa.graph_compute_async(build_graph(doubled))
            event = device.event_new()
            event.record(sa)
            event.wait(sb)
            polydev.tensor_copy_async(sa, sb, doubled, y)
            out = np.empty(n, np.float32)
            sb.get_tensor_async(y, out)
            sb.synchronize()
            np.testing.assert_array_equal(out, 2 * values)
            event.close()


def test_a_batch_that_fails_raises_its_error_and_the_stream_serves_on(remote):
    """A batch's failed call (a write past its buffer's end, queued with other calls) is
    raised, typed, by the wait on the stream; the calls after it did not run, a plan freed
    after it is freed all the same, and the next batch runs."""
    from polydev.errors import WireError

    cpu = remote[0]
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F32, (K,), "a")
    b = ops.scale(ctx, a, 3.0)
    with alloc_ctx_tensors(ctx, cpu.buffer_type) as buf, cpu.init_backend() as stream:
        a.set_data(np.ones(K, np.float32))
        b.set_data(np.full(K, 7, np.float32))
        plan = stream.graph_plan_create(build_graph(b))
        stream.synchronize()
        n_plans = cpu.call(cpu.remote("__ray_call__", lambda actor: len(actor.plans)), "plans")
        cpu.calls.queue("write", (buf.remote_id, buf.size, np.zeros(4, np.uint8)))
        stream.graph_plan_compute(plan)               # skipped: it follows the failure
        stream.graph_plan_free(plan)                  # runs: it releases
        with pytest.raises(WireError, match="not within"):
            stream.synchronize()
        assert cpu.call(cpu.remote("__ray_call__", lambda actor: len(actor.plans)),
                        "plans") == n_plans - 1
        np.testing.assert_array_equal(b.numpy().reshape(-1), np.full(K, 7, np.float32))
        stream.graph_compute(build_graph(b))
        np.testing.assert_array_equal(b.numpy().reshape(-1), np.full(K, 3, np.float32))


def test_a_batch_is_sent_before_it_holds_more_calls_than_an_actor_takes(remote):
    from polydev.backends.ray.call_queue import MAX_BATCH

    cpu = remote[0]
    ctx = Context()
    t = ctx.new_tensor(GGMLType.I8, (16,), "t")
    with alloc_ctx_tensors(ctx, cpu.buffer_type), cpu.init_backend() as stream:
        for i in range(MAX_BATCH + 3):
            stream.set_tensor_async(t, np.full(16, i % 100, np.int8))
        stream.synchronize()
        np.testing.assert_array_equal(t.numpy().reshape(-1), np.full(16, (MAX_BATCH + 2) % 100))


def test_async_transfers_keep_the_contract_on_a_remote_device(remote, rng):
    """The checks and fallbacks of tests/transfer_checks.py, on the actor's stream."""
    device, host = remote[0], polydev.device("CPU").buffer_type
    with device.init_backend() as b:
        transfer_checks.check_round_trips_keep_host_memory_alive(b, device.buffer_type, rng)
        transfer_checks.check_bad_transfers_are_typed_and_change_nothing(b, device.buffer_type)
        transfer_checks.check_unallocated_closed_and_foreign_memory(b, device.buffer_type, host)
        transfer_checks.check_a_closed_stream_refuses_transfers(b, device.buffer_type)


def test_a_remote_error_is_raised_as_the_same_polydev_error(remote):
    cpu = remote[0]
    ctx = Context()
    table = ctx.new_tensor(GGMLType.F32, (K, 4), "table")
    idx = ctx.new_tensor(GGMLType.I32, (2,), "idx")
    rows = ops.get_rows(ctx, table, idx)
    with alloc_ctx_tensors(ctx, cpu.buffer_type), cpu.init_backend() as backend:
        table.set_data(np.zeros((4, K), np.float32))
        idx.set_data(np.int32([0, 9]))
        with pytest.raises(OutOfBoundsError):
            backend.graph_compute(build_graph(rows))


# --- the compare catalogue, the scheduler and a model ----------------------------------------

SAMPLE_OPS = {"ADD", "MUL", "SCALE", "RMS_NORM", "SOFT_MAX", "ROPE", "GET_ROWS", "SET_ROWS",
              "CPY", "SWIGLU", "MUL_MAT", "FLASH_ATTN_EXT"}


def test_a_sample_of_the_catalogue_agrees_with_the_local_cpu(remote):
    """Every 24th case of a dozen ops, on each remote device against the local CPU backend
    (the whole catalogue runs locally on every device in test_compare)."""
    from polydev.tools.compare.catalogue import eval_cases
    from polydev.tools.compare.runner import Status, run_test

    cases = [c for c in eval_cases() if c.op in SAMPLE_OPS][::24]
    rng = np.random.default_rng(3)
    for device in filter(None, remote):
        with device.init_backend() as backend, polydev.init_backend("CPU") as cpu:
            results = [run_test(case, backend, cpu, rng) for case in cases]
        failed = [f"{r.case_name}: {r.error_message}" for r in results if r.status == Status.FAIL]
        assert not failed, f"{device.name}: " + "\n".join(failed[:10])
        ran = {r.op_name for r in results if r.status == Status.OK}
        assert len(ran) >= 10 and sum(r.status == Status.OK for r in results) >= 50


def _weights(backend, name, values):
    ctx = Context()
    t = ctx.new_tensor(GGMLType.F32, values.shape[::-1], name)
    buf = alloc_ctx_tensors(ctx, backend)
    buf.usage = BufferUsage.WEIGHTS
    t.set_data(values)
    return buf, t


def test_the_scheduler_splits_weights_over_two_remote_devices_and_the_cpu(remote, rng):
    """Layer i's weight lives on device i; the split graph gives the local result."""
    a_dev, b_dev = _remote_pair(remote)
    ws = rng.standard_normal((3, K, K)).astype(np.float32) / 8
    xv = rng.standard_normal((5, K)).astype(np.float32)
    backends = [a_dev.init_backend(), b_dev.init_backend(), polydev.init_backend("CPU")]
    made = [_weights(be, f"w{i}", w) for i, (be, w) in enumerate(zip(backends, ws))]
    try:
        with Scheduler(backends) as sched:
            ctx = Context()
            x = ctx.new_tensor(GGMLType.F32, (K, 5), "x").set_input()
            h = x
            for _, w in made:
                h = ops.silu(ctx, ops.mul_mat(ctx, w, h))
            h.set_output()
            graph = build_graph(h)
            sched.alloc_graph(graph)
            for _ in range(2):                      # the second time replays the plans
                x.set_data(xv)                      # (the allocator reuses inputs' memory)
                assert sched.compute(graph)
                want = xv
                for w in ws:
                    z = want @ w.T
                    want = z / (1 + np.exp(-z))
                np.testing.assert_allclose(h.numpy()[0, 0], want, rtol=1e-4, atol=1e-5)
            assert sched.n_splits == 3
            assert [sched.placement(n)[0] for n in graph.nodes[::2]] == [
                a_dev.name, b_dev.name, "CPU"]
    finally:
        for buf, _ in made:
            buf.close()
        for be in backends:
            be.close()


def test_a_model_with_layers_on_a_remote_device_gives_the_greedy_ids(remote, monkeypatch):
    """SmolLM2 with 12 layers on the remote CPU device: its weights are read from the node's
    own copy of the file (this machine's), and the greedy ids are the local run's."""
    pytest.importorskip("gguf")
    from polydev.backends.ray.device import RayBuffer
    from polydev.models import load

    read_there = []
    real = RayBuffer._set_from_file

    def counted(self, tensor, data, path, offset):
        read_there.append(real(self, tensor, data, path, offset))
        return read_there[-1]

    monkeypatch.setattr(RayBuffer, "_set_from_file", counted)

    path = model_path(SMOLLM2)
    n = 8
    with load(path, devices=[], n_ctx=256, progress=False) as local:
        prompt = local.tokenize("The capital of France is")
        "".join(local.generate(prompt, n, temperature=0))
        want = list(local.generated)
    with load(path, devices=[remote[0].name], n_gpu_layers=12, n_ctx=256,
              progress=False) as split:
        assert [b.device.name for b in split.evaluator.backends] == [remote[0].name, "CPU"]
        assert read_there and all(read_there)
        "".join(split.generate(prompt, n, temperature=0))
        assert list(split.generated) == want


def test_weights_are_read_on_the_node_only_where_its_file_is_the_drivers(remote,
                                                                          monkeypatch):
    """A node whose copy of the file is not the driver's (another size or first MiB) gets
    the bytes sent instead; a weight whose bytes differ there is an error of the load, never
    other weights."""
    pytest.importorskip("gguf")
    from polydev.backends.ray import device as ray_device
    from polydev.errors import WireError
    from polydev.models import load

    path = model_path(SMOLLM2)
    with load(path, devices=[], n_ctx=128, progress=False) as local:
        prompt = local.tokenize("Remote weights")
        "".join(local.generate(prompt, 4, temperature=0))
        want = list(local.generated)
    cpu = remote[0]
    monkeypatch.setattr(ray_device, "file_signature", lambda p: (0, "another file"))
    monkeypatch.setattr(cpu, "_files", {})
    with load(path, devices=[cpu.name], n_gpu_layers=99, n_ctx=128, progress=False) as sent:
        "".join(sent.generate(prompt, 4, temperature=0))
        assert list(sent.generated) == want
    assert cpu._files == {os.path.abspath(path): False}
    monkeypatch.undo()
    monkeypatch.setattr(ray_device, "bytes_digest", lambda data: "not these bytes")
    with pytest.raises(WireError, match="differs from the driver's at bytes"):
        with load(path, devices=[cpu.name], n_gpu_layers=99, n_ctx=128, progress=False):
            pass


# --- faults -------------------------------------------------------------------------------------

def test_without_ray_connecting_says_which_extra_to_install():
    import subprocess
    import sys

    code = ("import sys; sys.modules['ray'] = None\n"
            "from polydev.backends import ray as r\n"
            "from polydev.errors import MissingDependencyError\n"
            "try:\n    r.connect('local')\nexcept MissingDependencyError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert "pip install 'polydev[ray]'" in out



def test_a_malformed_graph_or_transfer_is_refused_before_anything_is_made(remote):
    """What an actor receives is checked field by field: each malformed message is a
    WireError naming what is wrong, and the actor keeps nothing of it."""
    from polydev.backends.ray.calls import wait
    from polydev.backends.ray.wire import graph_fields
    from polydev.errors import WireError

    cpu = remote[0]
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F32, (K,), "a")
    b = ops.scale(ctx, a, 2.0)
    with alloc_ctx_tensors(ctx, cpu.buffer_type) as buf:
        table, nodes = graph_fields([b], lambda t: buf.remote_id)
        leaf, node = table

        def with_field(entry, index, value):
            return entry[:index] + (value,) + entry[index + 1:]

        malformed = {
            "a graph is a": "import os; os.system('id')",
            "type 999 is not a GGML type": ((with_field(leaf, 0, 999), node), nodes),
            r"ne \(-1, 1, 1, 1\) is not 4 sizes": ((with_field(leaf, 1, (-1, 1, 1, 1)),
                                                     node), nodes),
            "sources must name tensors before it": ((leaf, with_field(node, 5, (1,))), nodes),
            "op_params must be": ((leaf, with_field(node, 4, ("rm -rf /",))), nodes),
            "buffer 12345 is not one of this device's": ((with_field(leaf, 8, 12345), node),
                                                          nodes),
            "pass the end of its buffer": ((with_field(leaf, 9, buf.size), node), nodes),
            "node 0 names tensor 7": ((leaf, node), (7,)),
        }
        for plan_id, (message, fields) in enumerate(malformed.items(), start=10**6):
            with pytest.raises(WireError, match=message):
                wait(cpu, cpu.actor.plan_create.remote(plan_id, fields), "making a plan")
            with pytest.raises(WireError, match="is not one of this device's"):
                wait(cpu, cpu.actor.plan_compute.remote(plan_id), "computing a plan")
        with pytest.raises(WireError, match="numpy array"):
            wait(cpu, cpu.actor.write.remote(buf.remote_id, 0, b"bytes"), "writing")
        bad_transfers = [
            ("write", (buf.remote_id, buf.size - 2, np.zeros(4, np.uint8)), "not within"),
            ("write", (buf.remote_id, -4, np.zeros(4, np.uint8)), "not within"),
            ("read", (buf.remote_id, 0, 1 << 40), "not within"),
            ("read", (buf.remote_id, True, 4), "not within"),
            ("memset", (buf.remote_id, 0, 0, buf.size + 1), "not within"),
            ("copy", (buf.remote_id, 0, buf.remote_id, 8, buf.size), "not within"),
            ("read_pieces", (buf.remote_id, 0, [4, -1]), "list of at most"),
            ("write_from_file", (buf.remote_id, 0, "/dev/zero", 0, 1 << 40, "x"), "not within"),
            ("alloc", (10**9, -1), "a size is a count of bytes"),
            ("set_usage", (buf.remote_id, 99), "not a buffer usage"),
            ("alloc_size", ((0, (-1, 1, 1, 1), (4, 4, 4, 4), 0, ()),), "is not 4 sizes"),
            ("run", ("import os",), "a batch is a list"),
            ("run", ([("__init__", ("CPU",), (), 0)],), "is not a call a batch runs"),
            ("run", ([("run", ([],), (), 0)],), "is not a call a batch runs"),
            ("run", ([("start_heartbeat", (None, "k", 1.0), (), 0)],), "not a call a batch"),
            ("run", ([("write", (buf.remote_id, 0), ((2, 0),), 0)],), "do not place"),
            ("run", ([("write", (buf.remote_id, 0), ((2, 7),), 0)],), "do not place"),
            ("run", ([("memory", (), (), -1)],), "count of values"),
            ("run", ([("write", (buf.remote_id, buf.size, np.zeros(4, np.uint8)), (), 0)],),
             "not within"),
            ("set_n_threads", (0,), "a thread count"),
        ]
        for method, args, message in bad_transfers:
            with pytest.raises(WireError, match=message):
                wait(cpu, getattr(cpu.actor, method).remote(*args), method)
        with pytest.raises(AllocationError):          # more than the node has: typed too
            wait(cpu, cpu.actor.alloc.remote(10**9, 1 << 62), "allocating")
        a.set_data(np.ones(K, np.float32))            # the device still serves
        with cpu.init_backend() as backend:
            backend.graph_compute(build_graph(b))
        np.testing.assert_array_equal(b.numpy().reshape(-1), np.full(K, 2, np.float32))


def test_the_thread_count_reaches_a_remote_cpu_through_its_reg(remote):
    """ggml's "set_n_threads" proc of the Ray reg sets the remote CPU stream's threads;
    a count that is not one is refused here, before anything is sent."""
    from polydev.errors import InvalidArgumentError, UnsupportedError

    cpu = remote[0]
    set_n_threads = cpu.reg.get_proc_address("set_n_threads")

    def remote_threads():
        return cpu.call(cpu.remote("__ray_call__", lambda actor: actor.backend.env.n_threads),
                        "reading its threads")

    before = remote_threads()
    with cpu.init_backend() as backend:
        try:
            set_n_threads(backend, 1)
            backend.synchronize()
            assert remote_threads() == 1
            for bad in (0, True, 1.5):
                with pytest.raises(InvalidArgumentError, match="thread count"):
                    set_n_threads(backend, bad)
            if remote[1] is not None:                 # a remote OpenCL device has none
                with remote[1].init_backend() as other:
                    with pytest.raises(UnsupportedError, match="no thread count"):
                        set_n_threads(other, 2)       # its type is CPU: found on the node
                        other.synchronize()
                    other.synchronize()               # and it serves on
        finally:
            set_n_threads(backend, before)
            backend.synchronize()
    assert remote_threads() == before


def test_a_node_with_another_polydev_is_refused_saying_what_differs(remote, monkeypatch):
    from polydev.backends import ray as polydev_ray
    from polydev.backends.ray import actor

    connected = {d.remote_name for d in remote if d is not None}
    spare = [d.name for d in polydev.devices() if d.name.startswith("OpenCL")
             and d.name not in connected]
    if not spare:
        missing("POLYDEV_REQUIRE_OPENCL", "needs a device of the node not connected yet (a "
                "second OpenCL device: POCL_DEVICES='pthread pthread')")
    real = actor.catalogue()
    monkeypatch.setattr(actor, "catalogue", lambda: {**real, "version": "0.0.1"})
    monkeypatch.setenv("POLYDEV_RAY_CPUS", "0")       # the cluster's CPUs are taken
    before = [d.name for d in polydev.devices()]
    with pytest.raises(RemoteDeviceError, match=rf"/{spare[0]}: polydev differs between this "
                                                r"process and the node \(version: here "
                                                r"'0.0.1', there "):
        polydev_ray.connect(None, devices=[spare[0]])
    assert [d.name for d in polydev.devices()] == before


def test_connecting_again_keeps_one_device_per_name(remote, monkeypatch):
    from polydev.backends import ray as polydev_ray

    monkeypatch.setenv("POLYDEV_RAY_CPUS", "0")       # the cluster's CPUs are taken
    before = [d.name for d in polydev.devices()]
    assert polydev_ray.connect(None, devices=["CPU"]) == []
    assert [d.name for d in polydev.devices()] == before
    assert remote[0].memory()[1] > 0                  # the first actor still serves it


def _wait_until_dead(actor, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.memory.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError("the killed actor still answers")


def test_a_killed_actor_is_a_typed_error_naming_the_device_and_the_rest_works(remote,
                                                                              monkeypatch):
    victim = remote[1] or remote[0]
    survivor = remote[0] if remote[1] is not None else None
    monkeypatch.setenv("POLYDEV_RAY_TIMEOUT", "20")
    ray.kill(victim.actor, no_restart=True)
    _wait_until_dead(victim.actor)                  # ray.kill returns before the actor is gone
    start = time.perf_counter()
    with pytest.raises(RemoteDeviceError, match=f"{victim.name} is lost: its actor is gone"):
        victim.memory()
    assert time.perf_counter() - start < 20
    ctx = Context()
    ctx.new_tensor(GGMLType.F32, (16,), "t")
    with pytest.raises(RemoteDeviceError, match=victim.name):
        alloc_ctx_tensors(ctx, victim.buffer_type)
    if survivor is not None:
        assert survivor.memory()[1] > 0
    assert polydev.device("CPU").memory()[1] > 0
