"""Remote devices on a Ray cluster of four nodes on this machine: a head and three workers,
each its own raylet with its own CPUs and node id, as Ray's own tests build clusters
(``ray.cluster_utils.Cluster``). One CPU device actor on each node.

The cluster starts once for the module. The last tests take a worker node away each (its
raylet killed): node-c while a model split over node-a and node-c generates, node-b while a
server with the model split over node-a and node-b streams to 8 clients; then node-b returns
(and the server places the model with it again), and node-c.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="remote devices need the ray extra")

import polydev  # noqa: E402
from polydev import Context, GGMLType, alloc_ctx_tensors, tensor_get, tensor_set  # noqa: E402
from polydev.errors import RemoteDeviceError  # noqa: E402

from model_files import SMOLLM2, model_path  # noqa: E402

pytestmark = pytest.mark.ray
WORKERS = ("node-a", "node-b", "node-c")


@pytest.fixture(scope="module")
def cluster():
    """(the Cluster, {node label: its remote CPU device}, {node label: the Cluster's node})."""
    from ray.cluster_utils import Cluster

    from polydev.backends import ray as polydev_ray

    small = dict(num_cpus=1, object_store_memory=80 << 20)
    built = Cluster(initialize_head=True, head_node_args=dict(small, include_dashboard=False))
    nodes = {name: built.add_node(**small, node_name=name) for name in WORKERS}
    try:
        built.wait_for_nodes()
        ray.init(address=built.address, log_to_driver=False)
        devices = polydev_ray.connect(None, devices=["CPU"])
        yield built, {d.node: d for d in devices}, nodes
    finally:
        if ray.is_initialized():
            polydev_ray.disconnect()
            ray.shutdown()
        built.shutdown()


def _node_ids() -> dict[str, str]:
    return {n["NodeName"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}


# --- the devices ------------------------------------------------------------------------------

def test_each_node_has_its_own_devices_named_by_the_node(cluster, capsys):
    _, devices, _ = cluster
    ids = _node_ids()
    head = next(name for name in ids if name not in WORKERS)
    assert list(devices) == [head, *WORKERS]            # the head first, then by name
    for label, device in devices.items():
        assert device.name == f"ray:{label}/CPU"
        assert device.node_id == ids[label]              # the actor runs on its node
        assert polydev.device(device.name) is device
    assert len({d.pid for d in devices.values()}) == len(WORKERS) + 1
    from polydev.tools.cli import main
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert all(d.name in out for d in devices.values())


def test_nodes_of_one_name_are_told_apart_by_port():
    from polydev.backends.ray import node_labels

    head = {"NodeName": "10.0.0.1", "NodeManagerAddress": "10.0.0.1", "NodeManagerPort": 9,
            "Resources": {"node:__internal_head__": 1.0}}
    twins = [{"NodeName": "10.0.0.2", "NodeManagerAddress": "10.0.0.2", "NodeManagerPort": p,
              "Resources": {}} for p in (7002, 7001)]
    named = {"NodeName": "gpu-box", "NodeManagerAddress": "10.0.0.3", "NodeManagerPort": 1,
             "Resources": {}}
    labels = [label for _, label in node_labels([*twins, named, head])]
    assert labels == ["10.0.0.1", "10.0.0.2:7001", "10.0.0.2:7002", "gpu-box"]


# --- a model over the nodes -------------------------------------------------------------------

@pytest.mark.parametrize("numerics", ["fast", "exact"])
def test_a_model_split_over_two_nodes_gives_the_local_logits_at_every_position(cluster,
                                                                             numerics):
    """SmolLM2's layers half on node-a, half on node-b (only activations cross): every
    position's logits are the all-local run's to the bit (each node runs this machine's CPU
    kernels, with the weights' interleaved copies and the numerics asked for, as the local
    CPU does), and so are the greedy ids."""
    pytest.importorskip("gguf")
    from polydev.models import load

    _, devices, _ = cluster
    a, b = devices["node-a"], devices["node-b"]
    path = model_path(SMOLLM2)
    with load(path, devices=[], n_ctx=128, progress=False, numerics=numerics) as local:
        tokens = local.tokenize("Ray clusters split a model by layers, and")
        local.eval(tokens, all_logits=True)
        want = local.logits()
        local.reset()
        "".join(local.generate(tokens, 6, temperature=0))
        want_ids = list(local.generated)
    with load(path, devices=[a.name, b.name], n_gpu_layers=99, tensor_split=[1, 1],
              n_ctx=128, progress=False, numerics=numerics) as split:
        layers = [d.name for d in split.placement.layer_devices]   # the output layer too
        assert abs(layers.count(a.name) - layers.count(b.name)) <= 1
        assert layers == sorted(layers) and set(layers) == {a.name, b.name}
        split.eval(tokens, all_logits=True)
        np.testing.assert_array_equal(split.logits(), want)
        split.reset()
        "".join(split.generate(tokens, 6, temperature=0))
        assert list(split.generated) == want_ids


class _CountedActor:
    """An actor handle that counts the calls made through it (``.remote``, with options or
    without) under ``name`` in ``counts``."""

    def __init__(self, actor, counts: dict, name: str) -> None:
        self._actor, self._counts, self._name = actor, counts, name

    def __getattr__(self, method: str):
        return _CountedMethod(getattr(self._actor, method), self._counts, self._name)


class _CountedMethod:
    def __init__(self, method, counts: dict, name: str) -> None:
        self._method, self._counts, self._name = method, counts, name

    def options(self, **options):
        return _CountedMethod(self._method.options(**options), self._counts, self._name)

    def remote(self, *args, **kwargs):
        self._counts[self._name] = self._counts.get(self._name, 0) + 1
        return self._method.remote(*args, **kwargs)


def test_a_decode_step_is_one_call_to_each_node(cluster, monkeypatch):
    """The driver queues a device's calls and sends them as one batch: a decode step split
    over node-a and node-b is one call to each (inputs, compute, and node-a's activations
    read there and written on node-b without the driver waiting between), and on node-a
    alone one call; the logits stay the local ones."""
    pytest.importorskip("gguf")
    from polydev.models import load

    _, devices, _ = cluster
    a, b = devices["node-a"], devices["node-b"]
    path = model_path(SMOLLM2)
    with load(path, devices=[], n_ctx=64, progress=False) as local:
        tokens = local.tokenize("One call a node")
        local.eval(tokens)
        local.evaluator.eval([tokens[0]])
        want = [local.evaluator.eval([t]).copy() for t in tokens]
    for used in ([a, b], [a]):
        with load(path, devices=[d.name for d in used], n_gpu_layers=99,
                  tensor_split=[1] * len(used), n_ctx=64, progress=False) as model:
            model.eval(tokens)
            model.evaluator.eval([tokens[0]])          # the decode graph's plans are made
            counts: dict[str, int] = {}
            for d in used:
                monkeypatch.setattr(d.calls, "actor", _CountedActor(d.actor, counts, d.name))
            got = [model.evaluator.eval([t]).copy() for t in tokens]
            monkeypatch.undo()
        assert counts == {d.name: len(tokens) for d in used}
        np.testing.assert_array_equal(np.concatenate(got), np.concatenate(want))


def test_batches_that_take_each_others_results_are_sent_in_an_order_that_works(cluster):
    """node-a's open batch takes a read of node-b's newer batch, and node-b's next batch a
    read of node-a's: the newer batch is sent first, so neither waits for the other, and
    the bytes cross both ways."""
    from polydev.backends.ray.calls import wait

    _, devices, _ = cluster
    a, b = devices["node-a"], devices["node-b"]
    ctx_a, ctx_b = Context(), Context()
    ta = ctx_a.new_tensor(GGMLType.I8, (32,), "a")
    tb = ctx_b.new_tensor(GGMLType.I8, (32,), "b")
    with alloc_ctx_tensors(ctx_a, a.buffer_type) as buf_a, alloc_ctx_tensors(
            ctx_b, b.buffer_type) as buf_b:
        tensor_set(ta, np.arange(32, dtype=np.int8))
        tensor_set(tb, -np.arange(32, dtype=np.int8))
        read_a = a.calls.queue("read", (buf_a.remote_id, ta.offset, 16), values=1)[0]
        read_b = b.calls.queue("read", (buf_b.remote_id, tb.offset, 16), values=1)[0]
        done_a = a.calls.queue("write", (buf_a.remote_id, ta.offset + 16), [read_b])[0]
        assert read_b.sent and not read_a.sent     # node-b's batch was opened after node-a's
        done_b = b.calls.queue("write", (buf_b.remote_id, tb.offset + 16), [read_a])[0]
        wait(a, done_a, "writing node-b's bytes")
        wait(b, done_b, "writing node-a's bytes")
        got_a, got_b = tensor_get(ta).view(np.int8), tensor_get(tb).view(np.int8)
    np.testing.assert_array_equal(got_a, np.r_[np.arange(16), -np.arange(16)])
    np.testing.assert_array_equal(got_b, np.r_[-np.arange(16), np.arange(16)])


def _prompt_and_step(model, tokens, pieces: int = 1):
    """Every position's logits of ``tokens``, then those of a decode step of 4 sequences;
    with ``pieces``, each evaluated in that many calls (the arithmetic of micro-batches: a
    product's kernel, and so its rounding, follows the batch's width)."""
    from polydev.models import Batch

    model.reset()
    size = -(-len(tokens) // pieces)
    prompt = []
    for first in range(0, len(tokens), size):
        model.eval(tokens[first:first + size], all_logits=True)
        prompt.append(model.logits())
    batch = Batch()
    for seq in range(4):
        batch.add_sequence(tokens[:3 + seq], seq, logits="last")
    model.reset()
    model.decode(batch)
    step = []
    for first in range(0, 4, 4 // pieces):
        piece = Batch()
        for seq in range(first, first + 4 // pieces):
            piece.add(100 + seq, seq, logits=True)
        step.append(model.decode(piece))
    return np.concatenate(prompt), np.concatenate(step)


def test_a_split_over_two_hosts_pipelines_micro_batches_and_gives_the_local_logits(
        cluster, monkeypatch):
    """Stages on two hosts (node-b's device made to look like another machine's): the
    scheduler keeps copies of its inputs, a prompt and a decode step of 4 sequences go as
    two micro-batches each, node-a's next while node-b's last, and every logit is the local
    run's. Stages of one host (the real case here) do not pipeline."""
    pytest.importorskip("gguf")
    from polydev.models import load

    _, devices, _ = cluster
    a, b = devices["node-a"], devices["node-b"]
    path = model_path(SMOLLM2)
    with load(path, devices=[], n_ctx=256, progress=False) as local:
        tokens = local.tokenize("Pipelines keep every node busy, one micro-batch apiece.")
        want = _prompt_and_step(local, tokens, pieces=2)
    knobs = dict(devices=[a.name, b.name], n_gpu_layers=99, tensor_split=[1, 1], n_ctx=256,
                 progress=False)
    with load(path, **knobs) as one_host:
        assert one_host.evaluator.stages == 0
    monkeypatch.setattr(b, "_host", "10.255.0.2")
    with load(path, **knobs) as split:
        assert split.evaluator.stages == 2 and split.evaluator.sched.n_copies > 1
        got = _prompt_and_step(split, tokens)
    for mine, theirs in zip(got, want):
        np.testing.assert_array_equal(mine, theirs)


# --- a lost node ------------------------------------------------------------------------------

def test_a_device_waiting_for_another_is_not_taken_for_lost(cluster, monkeypatch):
    """node-b's stream waits 3 s for node-a's (busy) with a heartbeat of 1 s: node-b's beats
    do not wait behind its calls (Ray runs one caller's calls to an actor in order, so a
    ping from the driver would), and neither device is lost."""
    from polydev.backends.ray.heartbeat import heartbeat

    _, devices, _ = cluster
    a, b = devices["node-a"], devices["node-b"]
    monkeypatch.setenv("POLYDEV_RAY_HEARTBEAT", "1")
    heartbeat().watch(list(devices.values()))        # every device beats at the new period
    try:
        busy = a.remote("__ray_call__", lambda actor: time.sleep(3))
        waiting = b.remote("marker", busy)
        start = time.monotonic()
        b.call(waiting, "waiting for node-a")
        assert time.monotonic() - start > 2
        assert a.lost is None and b.lost is None
    finally:
        monkeypatch.undo()
        heartbeat().watch(list(devices.values()))


def test_a_stalled_device_is_found_lost_by_its_heartbeat(cluster, monkeypatch):
    """The head's device actor is stopped (SIGSTOP: its connections stay open, so Ray sees
    nothing wrong): a call waiting on it ends with RemoteDeviceError once the device has
    missed its heartbeats for POLYDEV_RAY_HEARTBEAT seconds, far before the time-out."""
    from polydev.backends.ray.heartbeat import heartbeat

    _, devices, _ = cluster
    head = next(iter(devices.values()))
    monkeypatch.setenv("POLYDEV_RAY_HEARTBEAT", "2")
    monkeypatch.setenv("POLYDEV_RAY_TIMEOUT", "60")
    heartbeat().watch([head])                         # it beats, and is judged, at 2 s
    head.memory()                                     # answers while it runs
    os.kill(head.pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(RemoteDeviceError, match=f"{head.name} is lost: it has not sent "
                                                    f"a heartbeat"):
            head.memory()
        assert time.monotonic() - start < 2 * 2       # its period, a beat and a look
        with pytest.raises(RemoteDeviceError, match="is lost"):   # and at once from now on
            head.memory()
    finally:
        os.kill(head.pid, signal.SIGCONT)
    assert devices["node-a"].lost is None and devices["node-a"].memory()[1] > 0


def test_a_lost_node_ends_the_generation_with_a_typed_error_within_seconds(cluster):
    """node-c's raylet is killed while a model split over node-a and node-c generates: the
    generation raises RemoteDeviceError naming node-c's device within seconds (the call
    time-out is 60 s), and node-a's device and the local CPU go on working."""
    pytest.importorskip("gguf")
    from polydev.models import load

    built, devices, nodes = cluster
    a, c = devices["node-a"], devices["node-c"]
    with load(model_path(SMOLLM2), devices=[a.name, c.name], n_gpu_layers=99,
              tensor_split=[1, 1], n_ctx=512, progress=False) as split:
        tokens = split.tokenize("Once upon a time")
        started, outcome = threading.Event(), {}

        def generate() -> None:
            try:
                for _ in split.generate(tokens, 400, temperature=0):
                    started.set()
            except Exception as e:
                outcome["error"], outcome["at"] = e, time.monotonic()
            started.set()

        thread = threading.Thread(target=generate, daemon=True)
        thread.start()
        assert started.wait(60)
        killed = time.monotonic()
        built.remove_node(nodes["node-c"], allow_graceful=False)
        thread.join(30)
        assert not thread.is_alive(), "the generation still waits on the lost node"
    error = outcome.get("error")
    assert isinstance(error, RemoteDeviceError), error
    assert f"{c.name} is lost" in str(error)
    assert outcome["at"] - killed < 10
    assert c.lost is not None and a.lost is None
    assert a.memory()[1] > 0
    assert polydev.device("CPU").memory()[1] > 0


def test_a_server_over_two_nodes_ends_its_streams_serves_without_a_lost_node_and_with_it_back(
        cluster):
    """8 clients stream from a server whose model is split over node-a and node-b; node-b's
    raylet is killed. Every stream ends within 10 s with an error event (503,
    device_lost, naming the device), the server places the model over what remains
    (node-a, then the CPU), /health says which device is gone, and a new request is
    answered. node-b starts again under its name: the server finds its device back, places
    the model over node-a and node-b again, and answers."""
    pytest.importorskip("gguf")
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from polydev.models import load

    from test_server import live_server, request

    built, devices, nodes = cluster
    a, b = devices["node-a"], devices["node-b"]

    def load_split():
        return load(model_path(SMOLLM2), devices=[a.name, b.name], n_gpu_layers=99,
                    tensor_split=[1, 1], n_ctx=2048, progress=False)

    def stream(i: int):
        return request(url, "POST", "/v1/completions", {
            "prompt": f"Story number {i}:", "max_tokens": 200, "stream": True,
            "temperature": 0})

    with live_server(None, n_slots=8, load_model=load_split) as (url, worker):
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            streams = [pool.submit(stream, i) for i in range(8)]
            deadline = time.monotonic() + 60
            while worker.engine.snapshot().generated_tokens < 8 * 4:
                assert time.monotonic() < deadline, "the streams did not start"
                time.sleep(0.05)
            killed = time.monotonic()
            built.remove_node(nodes["node-b"], allow_graceful=False)
            ended = [f.result(timeout=30) for f in streams]
        assert time.monotonic() - killed < 10
        for status, _, body in ended:
            assert status == 200                     # the stream had begun
            errors = [json.loads(line[6:]) for line in body.splitlines()
                      if line.startswith("data: {\"error\"")]
            assert len(errors) == 1 and "[DONE]" not in body
            assert errors[0]["error"]["code"] == "device_lost"
            assert f"{b.name} is lost" in errors[0]["error"]["message"]
        deadline = time.monotonic() + 60
        while worker.state != "ready":
            assert worker.state == "placing" and time.monotonic() < deadline, worker.error
            time.sleep(0.05)
        status, _, health = request(url, "GET", "/health")
        assert status == 200 and b.name in health["lost_devices"]
        assert {d.name for d in worker.model.placement.layer_devices} == {a.name}
        status, _, body = request(url, "POST", "/v1/completions",
                                  {"prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] == 4

        nodes["node-b"] = built.add_node(num_cpus=1, object_store_memory=80 << 20,
                                         node_name="node-b")
        deadline = time.monotonic() + 60
        while not (worker.state == "ready" and {d.name for d in _layer_devices(worker)}
                   == {a.name, b.name}):
            assert time.monotonic() < deadline and worker.error is None, worker.error
            time.sleep(0.1)
        back = polydev.device(b.name)
        assert back is not b and back.lost is None
        status, _, health = request(url, "GET", "/health")
        assert status == 200 and "lost_devices" not in health
        status, _, body = request(url, "POST", "/v1/completions",
                                  {"prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] == 4


def _layer_devices(worker):
    model = worker.model
    return model.placement.layer_devices if model is not None else []


def test_a_node_that_returns_under_its_name_gets_its_device_back(cluster):
    """node-c (lost in a test before) starts again under its name: connecting again
    starts its device under the same name in place of the lost one (and the other lost
    devices of alive nodes), and no second actor for a device that serves."""
    from polydev.backends import ray as polydev_ray

    built, devices, _ = cluster
    lost = devices["node-c"]
    assert lost.lost is not None
    built.add_node(num_cpus=1, object_store_memory=80 << 20, node_name="node-c")
    built.wait_for_nodes()
    before = {d.name: d for d in polydev.devices()}
    back = {d.name: d for d in polydev_ray.connect(None, devices=["CPU"])}
    assert lost.name in back and all(before[name].lost for name in back)   # only lost ones
    device = back[lost.name]
    assert device is not lost and device.lost is None and device.memory()[1] > 0
    assert polydev.device(lost.name) is device
    assert sorted(d.name for d in polydev.devices()) == sorted(before)
