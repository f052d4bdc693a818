"""The CUDA backend (CuPy): discovery, memory, streams, async copies, events, peer copies.

The tests that need a GPU are marked ``cuda`` and skip without one. The backend's own kernels
are also checked on the CPU through an emulation (test_cuda_kernels_emu.py); on a GPU the op
tests (which run on every device) and ``polydev compare`` check every kernel against the CPU.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import polydev
from polydev import (Context, DeviceCaps, DeviceType, GGMLType, Reg, alloc_ctx_tensors,
                     build_graph, ops, tensor_copy_async)
from polydev.buffer import tensor_get, tensor_memset, tensor_set
from polydev.errors import OutOfBoundsError

CUDA = [d for d in polydev.devices() if d.reg is not None and d.reg.name == "CUDA"]
gpu = [pytest.mark.cuda, pytest.mark.skipif(not CUDA, reason="no CUDA GPU (CuPy finds none)")]
two_gpus = pytest.mark.skipif(len(CUDA) < 2, reason="needs two CUDA GPUs")


@pytest.fixture
def dev():
    return CUDA[0]


# --- without a GPU ----------------------------------------------------------------------------

def _reg_line(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout


@pytest.mark.skipif(bool(CUDA), reason="a GPU is present")
def test_without_a_gpu_the_reg_is_empty_and_says_why():
    reg = polydev.registry().reg_by_name("CUDA")
    assert reg is not None and reg.devices == []
    assert reg.unavailable_reason.startswith(("CuPy is not usable", "CUDA is not usable",
                                              "the CUDA driver shows no GPU"))


def test_without_cupy_there_are_no_devices_and_a_reason():
    out = _reg_line("import sys; sys.modules['cupy'] = None\n"
                    "import polydev\n"
                    "reg = polydev.registry().reg_by_name('CUDA')\n"
                    "print(len(reg.devices), reg.unavailable_reason)")
    assert out.startswith("0 CuPy is not usable")


@pytest.mark.parametrize("driver, built, hint", [
    (12080, 13000, "the driver runs CUDA 12.8, this CuPy is built for CUDA 13.0: pip install "
                   "'polydev[cuda12]'"),
    (13000, 12090, None),             # a newer driver runs an older CuPy: no version hint
    (0, 12090, None),                 # no driver at all
])
def test_a_cupy_newer_than_the_driver_says_which_extra_to_install(monkeypatch, driver, built,
                                                                  hint):
    from polydev.backends.cuda import _make_reg

    def refuse():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient")

    runtime = SimpleNamespace(getDeviceCount=refuse, driverGetVersion=lambda: driver,
                              runtimeGetVersion=lambda: built)
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(runtime=runtime)))
    reg = _make_reg()
    assert reg.devices == [] and reg.unavailable_reason.startswith("CUDA is not usable: cuda")
    assert (hint in reg.unavailable_reason) if hint else "pip install" not in reg.unavailable_reason


def _stand_in_cupy() -> SimpleNamespace:
    """The part of CuPy a CUDA device and its streams touch when they are made, over no GPU:
    enough to check the backend's wiring to the runtime's contract without one."""
    class Stream:
        def __init__(self, non_blocking=False):
            self.ptr, self.synchronized = 0, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def synchronize(self):
            self.synchronized += 1

    runtime = SimpleNamespace(
        getDeviceProperties=lambda i: {"name": b"Stand-in GPU", "integrated": 0, "major": 9,
                                       "minor": 0},
        deviceGetPCIBusId=lambda i: "0000:3B:00.0", memGetInfo=lambda: (1 << 30, 2 << 30),
        CUDARuntimeError=RuntimeError)
    cuda = SimpleNamespace(runtime=runtime, Device=lambda i: contextlib.nullcontext(),
                           Stream=Stream, Event=lambda disable_timing=False: object())
    pool = SimpleNamespace(free_bytes=lambda: 1 << 20)
    return SimpleNamespace(cuda=cuda, get_default_memory_pool=lambda: pool,
                           zeros=lambda n, dtype: SimpleNamespace(data=SimpleNamespace(ptr=64)))


def test_a_device_and_its_streams_meet_the_contract_without_a_gpu():
    from polydev.backends.cuda.backend import CUDABackend
    from polydev.backends.cuda.device import CUDADevice
    dev = CUDADevice(0, _stand_in_cupy(), [])
    Reg("CUDA (stand-in)", [dev])
    assert dev.caps == DeviceCaps(async_=True, host_buffer=True, buffer_from_host_ptr=False,
                                  events=True)
    props = dev.props()
    assert (props.name, props.description, props.device_id) == ("CUDA0", "Stand-in GPU",
                                                                "0000:3b:00.0")
    assert (props.memory_free, props.memory_total) == ((1 << 30) + (1 << 20), 2 << 30)
    assert dev.host_buffer_type.name == "CUDA_Host" and dev.supports_buft(dev.buffer_type)
    ctx = Context()
    w = ctx.new_tensor_2d(GGMLType.Q4_K, 256, 64)
    x = ctx.new_tensor_2d(GGMLType.F32, 256, 1)
    assert dev.supports_op(ops.mul_mat(ctx, w, x))          # its own mat-vec kernel
    assert dev.supports_op(ops.silu(ctx, x))                 # the array kernels through CuPy
    assert "MUL_MAT" in dev.supported_op_names()
    with dev.init_backend() as backend:
        assert isinstance(backend, CUDABackend) and backend.device is dev
    assert backend.closed and backend.stream.synchronized


def test_importing_polydev_touches_no_cuda():
    out = _reg_line("import sys, polydev\n"
                    "print('cupy' in sys.modules)")
    assert out.strip() == "False"


# --- discovery and memory ---------------------------------------------------------------------

def _marks(fn):
    """Marked ``cuda`` and skipped without a GPU."""
    for m in gpu:
        fn = m(fn)
    return fn


@_marks
def test_devices_are_named_typed_and_described(dev):
    import cupy
    assert [d.name for d in CUDA] == [f"CUDA{i}" for i in range(len(CUDA))]
    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    assert dev.description == name
    assert dev.type == (DeviceType.IGPU if props["integrated"] else DeviceType.GPU)
    free, total = dev.memory()
    assert 0 < free <= total
    caps = dev.props().caps
    assert caps.async_ and caps.events and caps.host_buffer and not caps.buffer_from_host_ptr
    assert polydev.device("cuda:0") is dev and polydev.device("CUDA0") is dev
    assert dev.device_id is None or re.fullmatch(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]",
                                                 dev.device_id)


@_marks
def test_buffer_types(dev):
    buft, host = dev.buffer_type, dev.host_buffer_type
    assert buft.alignment >= 128 and not buft.is_host
    assert host.name == "CUDA_Host" and host.is_host
    assert dev.supports_buft(buft)
    assert dev.supports_buft(host) == dev.integrated
    assert not dev.supports_buft(polydev.device("CPU").buffer_type)
    assert all(d.host_buffer_type is host for d in CUDA)


@_marks
def test_freed_buffers_count_as_free_memory(dev):
    free_before = dev.memory()[0]
    buf = dev.buffer_type.alloc_buffer(64 << 20)
    assert dev.memory()[0] <= free_before
    buf.close()
    assert dev.memory()[0] >= free_before - (1 << 20)


def _vector(n: int = 1000):
    ctx = Context()
    return ctx, ctx.new_tensor(GGMLType.F32, (n,), "v")


@_marks
def test_set_get_memset_clear_and_copies(dev, rng):
    ctx, v = _vector()
    with alloc_ctx_tensors(ctx, dev.buffer_type) as buf:
        values = rng.standard_normal(1000).astype(np.float32)
        tensor_set(v, values)
        np.testing.assert_array_equal(v.numpy().ravel(), values)
        tensor_set(v, values[:10] * 2, offset=40)
        np.testing.assert_array_equal(v.numpy().ravel()[10:20], values[:10] * 2)
        tensor_memset(v, 0, offset=0, size=400)
        assert not v.numpy().ravel()[:100].any() and (v.numpy().ravel()[100:] == values[100:]).all()
        buf.clear(0)
        assert not v.numpy().ravel().any()
        out = np.empty(4, np.uint8)
        tensor_get(v, 0, 4, out)
        assert not out.any()
        ctx2, w = _vector()
        with alloc_ctx_tensors(ctx2, dev.buffer_type):
            tensor_set(v, values)
            polydev.tensor_copy(v, w)                   # device to device
            np.testing.assert_array_equal(w.numpy().ravel(), values)


@_marks
def test_pinned_host_buffer_is_host_memory(dev, rng):
    ctx, v = _vector()
    with alloc_ctx_tensors(ctx, dev.host_buffer_type) as buf:
        values = rng.standard_normal(1000).astype(np.float32)
        tensor_set(v, values)
        assert buf.is_host
        np.testing.assert_array_equal(buf.host_array[:4000].view(np.float32), values)


# --- streams and events -------------------------------------------------------------------------

def _add_graph():
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F32, (4096,), "a")
    b = ctx.new_tensor(GGMLType.F32, (4096,), "b")
    return ctx, a, b, ops.add(ctx, a, b)


@_marks
def test_async_set_compute_get_from_pinned_memory(dev, rng):
    """Transfers from and to CUDA_Host memory queue on the stream; the plan is replayed."""
    ctx, a, b, out = _add_graph()
    with (alloc_ctx_tensors(ctx, dev.buffer_type),
            dev.host_buffer_type.alloc_buffer(3 * 4096 * 4) as pinned,
            dev.init_backend() as backend):
        x, y, result = pinned.host_array.view(np.float32).reshape(3, 4096)
        plan = backend.graph_plan_create(build_graph(out))
        for _ in range(3):                                     # plan once, replay
            x[...], y[...] = rng.standard_normal((2, 4096)).astype(np.float32)
            backend.set_tensor_async(a, x)
            backend.set_tensor_async(b, y)
            backend.graph_plan_compute(plan)
            backend.get_tensor_async(out, result)
            backend.synchronize()
            np.testing.assert_array_equal(result, x + y)


def _heavy_graph(n: int = 4096):
    """A product big enough to keep a stream busy for a while, then a small result. With b
    the identity, ggml's mul_mat(a, b) (row i of a dotted with row j of b at [j, i]) is a's
    values transposed."""
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F32, (n, n), "a")
    b = ctx.new_tensor(GGMLType.F32, (n, n), "b")
    return ctx, a, b, ops.mul_mat(ctx, a, b)


@_marks
def test_copy_between_streams_waits_for_the_producer_under_load(dev, rng):
    """A copy queued right after a long product reads its finished result: the consumer's
    stream waits on the producer's copy event, not on the host."""
    ctx, a, b, prod = _heavy_graph()
    dst_ctx = Context()
    dst = dst_ctx.new_tensor(GGMLType.F32, prod.ne, "dst")
    with (alloc_ctx_tensors(ctx, dev.buffer_type), alloc_ctx_tensors(dst_ctx, dev.buffer_type),
            dev.init_backend() as producer, dev.init_backend() as consumer):
        x = rng.standard_normal((4096, 4096)).astype(np.float32)
        a.set_data(x)
        b.set_data(np.eye(4096, dtype=np.float32))
        polydev.tensor_memset(dst, 0)
        producer.graph_compute_async(build_graph(prod))
        tensor_copy_async(producer, consumer, prod, dst)
        result = np.empty((4096, 4096), np.float32)
        consumer.get_tensor_async(dst, result)
        consumer.synchronize()
        np.testing.assert_allclose(result, x.T, rtol=1e-5, atol=1e-5)
        producer.synchronize()


@_marks
def test_events_order_two_streams(dev, rng):
    ctx, a, b, prod = _heavy_graph()
    with (alloc_ctx_tensors(ctx, dev.buffer_type), dev.init_backend() as producer,
            dev.init_backend() as consumer, dev.event_new() as done):
        x = rng.standard_normal((4096, 4096)).astype(np.float32)
        a.set_data(x)
        b.set_data(np.eye(4096, dtype=np.float32))
        producer.graph_compute_async(build_graph(prod))
        done.record(producer)
        done.wait(consumer)                              # the consumer's stream waits
        result = np.empty((4096, 4096), np.float32)
        consumer.get_tensor_async(prod, result)
        consumer.synchronize()
        np.testing.assert_allclose(result, x.T, rtol=1e-5, atol=1e-5)
        done.synchronize()


@_marks
def test_a_bad_row_index_is_an_error_at_synchronize(dev, rng):
    ctx = Context()
    table = ctx.new_tensor(GGMLType.F32, (8, 5), "table")
    rows = ctx.new_tensor(GGMLType.I32, (3,), "rows")
    out = ops.get_rows(ctx, table, rows)
    out.name = "picked"
    with alloc_ctx_tensors(ctx, dev.buffer_type), dev.init_backend() as backend:
        values = rng.standard_normal((5, 8)).astype(np.float32)
        table.set_data(values)
        rows.set_data(np.int32([1, 7, 2]))                # 7: there are 5 rows
        graph = build_graph(out)
        with pytest.raises(OutOfBoundsError,
                           match=r"CUDA\d: an index outside its tensor in GET_ROWS 'picked'"):
            backend.graph_compute(graph)
        rows.set_data(np.int32([1, 4, 2]))                # the flag was reset
        backend.graph_compute(graph)
        np.testing.assert_array_equal(out.numpy()[0, 0], values[[1, 4, 2]])


@_marks
def test_op_offload_follows_the_batch(dev):
    ctx = Context()
    w = ctx.new_tensor(GGMLType.Q4_0, (256, 64), "w")
    small = ops.mul_mat(ctx, w, ctx.new_tensor(GGMLType.F32, (256, 8)))
    big = ops.mul_mat(ctx, w, ctx.new_tensor(GGMLType.F32, (256, 32)))
    rows = ops.get_rows(ctx, w, ctx.new_tensor(GGMLType.I32, (512,)))
    assert not dev.offload_op(small) and dev.offload_op(big) and not dev.offload_op(rows)


@two_gpus
@_marks
def test_two_gpus_copy_peer_to_peer(rng):
    ctx0, v0 = _vector(1 << 20)
    ctx1, v1 = _vector(1 << 20)
    with (alloc_ctx_tensors(ctx0, CUDA[0].buffer_type),
            alloc_ctx_tensors(ctx1, CUDA[1].buffer_type),
            CUDA[0].init_backend() as b0, CUDA[1].init_backend() as b1):
        values = rng.standard_normal(1 << 20).astype(np.float32)
        b0.set_tensor_async(v0, values)
        tensor_copy_async(b0, b1, v0, v1)
        result = np.empty(1 << 20, np.float32)
        b1.get_tensor_async(v1, result)
        b1.synchronize()
        np.testing.assert_array_equal(result, values)
        polydev.tensor_copy(v1, v0)                       # the blocking peer path
        np.testing.assert_array_equal(v0.numpy(), values)


@_marks
def test_compare_passes_on_cuda(capsys, dev):
    """Every case of the catalogue whose ops CUDA0 supports agrees with the CPU backend."""
    from polydev.tools.cli import main
    code = main(["compare", "-b", dev.name])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert f"Backend {dev.name}: OK" in out


@pytest.mark.parametrize("n_expert", [0, 4], ids=["dense", "experts"])
@_marks
def test_decode_steps_as_cuda_graphs_equal_the_steps_call_by_call(tmp_path, monkeypatch,
                                                                   n_expert):
    """The same prompt and decode steps with graphs (captured at the second step of a shape)
    and without: the same kernels on the same memory, so the same logits to the bit."""
    from model_files import write_test_model
    from polydev.backends.cuda.graphs import GRAPHS_ENV, CapturedPlan
    from polydev.models import load

    path = write_test_model(tmp_path / "m.gguf", n_layer=2, n_expert=n_expert)
    tokens = np.random.default_rng(0).integers(0, 320, 24).tolist()

    def decode(graphs: str) -> tuple[np.ndarray, int]:
        monkeypatch.setenv(GRAPHS_ENV, graphs)
        with load(path, devices=["CUDA0"], n_gpu_layers=-1, n_ctx=64, progress=False) as m:
            rows = [m.evaluator.eval(tokens[:8])]
            rows += [m.evaluator.eval([t]) for t in tokens[8:]]
            plans = [p for p in m.evaluator.sched._step_plans if isinstance(p, CapturedPlan)]
            return np.stack(rows), sum(p.cuda_graph is not None for p in plans)
    want, captured_off = decode("0")
    got, captured_on = decode("1")
    assert captured_off == 0 and captured_on >= 1
    np.testing.assert_array_equal(got, want)
