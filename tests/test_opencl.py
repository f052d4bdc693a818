"""The OpenCL backend on PoCL: discovery, memory, queues, async copies, events, two devices.

The kernels themselves are checked op by op against the CPU backend by ``polydev compare``
(the last test) and by the op tests, which run on every device. CI sets
POCL_DEVICES="pthread pthread" so the multi-device tests have two OpenCL devices.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import polydev
from polydev import (Context, DeviceType, GGMLType, alloc_ctx_tensors, build_graph, ops,
                     tensor_copy, tensor_copy_async)
from polydev.buffer import tensor_get, tensor_memset, tensor_set

from needs import OPENCL, opencl_mark

pytestmark = [pytest.mark.opencl, opencl_mark()]
two_devices = opencl_mark(2)


@pytest.fixture
def dev():
    return OPENCL[0]


def _vector(ctx_type=GGMLType.F32, n=1000):
    ctx = Context()
    return ctx, ctx.new_tensor(ctx_type, (n,), "v")


# --- discovery ----------------------------------------------------------------------------------

def test_devices_are_named_typed_and_described(dev):
    import pyopencl as cl
    assert [d.name for d in OPENCL] == [f"OpenCL{i}" for i in range(len(OPENCL))]
    cl_dev = dev.cl_device
    assert dev.description == f"{cl_dev.platform.name.strip()}: {cl_dev.name.strip()}"
    expected = DeviceType.CPU if cl_dev.type & cl.device_type.CPU else dev.type
    assert dev.type == expected
    free, total = dev.memory()
    assert total == cl_dev.global_mem_size and 0 < free <= total
    caps = dev.props().caps
    assert caps.async_ and caps.events and caps.host_buffer and caps.buffer_from_host_ptr
    assert polydev.device("opencl:0") is dev and polydev.device("OPENCL0") is dev


def test_the_cpu_backend_stays_last_and_best():
    names = [d.name for d in polydev.devices()]
    assert names[-1] == "CPU"
    if all(d.type == DeviceType.CPU for d in OPENCL):
        assert polydev.registry().best_device().name == "CPU"


def test_a_backend_on_the_host_cpu_says_it_shares_the_cores(dev):
    """The CPU kernels' threads spin briefly beside a driver on the host's cores
    (polydev.host_cores): an OpenCL backend on a CPU device says so as it opens."""
    from polydev.host_cores import host_core_sharers

    backend = dev.init_backend()
    try:
        assert (dev.name in host_core_sharers()) == (dev.type == DeviceType.CPU)
    finally:
        backend.close()


def test_a_model_split_with_pocl_keeps_the_kernels_threads_spin_short(tmp_path):
    """A model loaded over the CPU and an OpenCL CPU device (PoCL) opens the OpenCL backends
    before the CPU kernels load, so the kernels' threads spin SHARED_SPIN_COUNT rounds, not
    the longer count of a process alone on the cores (a fresh process: libgomp reads the
    count once)."""
    from model_files import write_test_model

    if OPENCL[0].type != DeviceType.CPU:
        pytest.skip("OpenCL0 is not a CPU device")
    path = write_test_model(tmp_path / "m.gguf", n_layer=2)
    code = ("import logging, sys\n"
            "logging.basicConfig(level=logging.DEBUG, stream=sys.stdout)\n"
            "from polydev.models import load\n"
            f"with load({str(path)!r}, devices=['OpenCL0'], n_gpu_layers=1, progress=False):\n"
            "    pass\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "OpenMP threads spin 20000 rounds (OpenCL0 computes on these cores)" in out.stdout


def _devices_output(env_update: dict) -> str:
    env = {**os.environ, **env_update}
    return subprocess.run([sys.executable, "-m", "polydev.tools.cli", "devices", "--verbose"],
                          env=env, capture_output=True, text=True, check=True).stdout


def test_selection_by_environment_and_the_reason_when_nothing_matches():
    out = _devices_output({"POLYDEV_OPENCL_DEVICE": "no-such-device"})
    assert "OpenCL0" not in out
    assert "backend OpenCL: no devices (no OpenCL device matches" in out
    out = _devices_output({"POLYDEV_OPENCL_PLATFORM": "0", "POLYDEV_OPENCL_DEVICE": "0"})
    assert "OpenCL0" in out and "OpenCL1" not in out


def test_without_pyopencl_there_are_no_devices_and_a_reason():
    code = ("import sys; sys.modules['pyopencl'] = None\n"
            "import polydev\n"
            "reg = polydev.registry().reg_by_name('OpenCL')\n"
            "print(len(reg.devices), reg.unavailable_reason)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("0 pyopencl is not usable")


# --- memory -------------------------------------------------------------------------------------

def test_buffer_type_follows_the_device(dev):
    buft = dev.buffer_type
    assert buft.alignment == max(dev.cl_device.mem_base_addr_align // 8, 16)
    assert buft.max_size == dev.cl_device.max_mem_alloc_size
    assert not buft.is_host and dev.host_buffer_type.is_host
    assert dev.supports_buft(buft)
    assert dev.supports_buft(dev.host_buffer_type) == dev.host_unified
    assert not dev.supports_buft(polydev.device("CPU").buffer_type)


def test_allocations_are_accounted_and_released(dev):
    free_before = dev.memory()[0]
    buf = dev.buffer_type.alloc_buffer(1 << 20)
    assert dev.memory()[0] == free_before - (1 << 20)
    buf.close()
    assert dev.memory()[0] == free_before


def test_set_get_memset_clear_and_copies(dev, rng):
    ctx, v = _vector()
    with alloc_ctx_tensors(ctx, dev.buffer_type) as buf:
        values = rng.standard_normal(1000).astype(np.float32)
        v.set_data(values)
        np.testing.assert_array_equal(v.numpy().ravel(), values)
        tensor_set(v, np.float32([7, 8]).view(np.uint8), offset=40)
        assert list(v.numpy().ravel()[10:12]) == [7, 8]
        tensor_memset(v, 0, 8, 8)
        assert list(v.numpy().ravel()[2:4]) == [0, 0]
        buf.clear(0xFF)
        assert (tensor_get(v) == 0xFF).all()
        # device to device (buffer copy), device to host and host to device
        ctx2, w = _vector()
        ctx3, h = _vector()
        with alloc_ctx_tensors(ctx2, dev.buffer_type), alloc_ctx_tensors(ctx3, polydev.device(
                "CPU").buffer_type):
            v.set_data(values)
            tensor_copy(v, w)
            tensor_copy(w, h)
            np.testing.assert_array_equal(h.numpy().ravel(), values)


def test_pinned_host_buffer_is_host_memory(dev, rng):
    ctx, v = _vector()
    with alloc_ctx_tensors(ctx, dev.host_buffer_type) as buf:
        assert buf.is_host
        values = rng.standard_normal(1000).astype(np.float32)
        v.set_data(values)
        view = buf.host_array[v.offset:v.offset + v.nbytes].view(np.float32)
        np.testing.assert_array_equal(view, values)            # the same memory
        ctx2, w = _vector()
        with alloc_ctx_tensors(ctx2, dev.buffer_type):
            tensor_copy(v, w)                                   # from pinned pages
            np.testing.assert_array_equal(w.numpy().ravel(), values)


def test_buffer_from_host_ptr_wraps_user_memory(dev, rng):
    host = np.zeros(512, np.float32)
    host[:256] = rng.standard_normal(256)
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, (256,), "x")
    out = ops.scale(ctx, x, 2.0)
    with dev.buffer_from_host_ptr(host) as buf, dev.init_backend() as backend:
        polydev.tensor_alloc(buf, x, 0)
        polydev.tensor_alloc(buf, out, 1024)
        # the user's values, with no upload
        np.testing.assert_array_equal(x.numpy().ravel(), host[:256])
        backend.graph_compute(build_graph(out))
        np.testing.assert_array_equal(out.numpy().ravel(), 2 * host[:256])
        if dev.host_unified:                                     # zero copy: written in place
            np.testing.assert_array_equal(host[256:], 2 * host[:256])


def _ctx_with(t):
    ctx = Context()
    ctx.tensors.append(t)
    return ctx


# --- queues, async copies, events -----------------------------------------------------------------

def _add_graph(dev):
    ctx = Context()
    a = ctx.new_tensor(GGMLType.F32, (4096,), "a")
    b = ctx.new_tensor(GGMLType.F32, (4096,), "b")
    out = ops.add(ctx, a, b)
    return ctx, a, b, out


def test_async_set_compute_get_on_one_queue(dev, rng):
    ctx, a, b, out = _add_graph(dev)
    with alloc_ctx_tensors(ctx, dev.buffer_type), dev.init_backend() as backend:
        plan = backend.graph_plan_create(build_graph(out))
        for _ in range(3):                                     # plan once, replay
            x, y = rng.standard_normal((2, 4096)).astype(np.float32)
            backend.set_tensor_async(a, x.copy())              # the copy may die: kept alive
            backend.set_tensor_async(b, y)
            backend.graph_plan_compute(plan)
            result = np.empty(4096, np.float32)
            backend.get_tensor_async(out, result)
            backend.synchronize()
            np.testing.assert_array_equal(result, x + y)


def test_events_order_two_queues(dev, rng):
    ctx, a, b, out = _add_graph(dev)
    with (alloc_ctx_tensors(ctx, dev.buffer_type), dev.init_backend() as producer,
            dev.init_backend() as consumer, dev.event_new() as done):
        x, y = rng.standard_normal((2, 4096)).astype(np.float32)
        a.set_data(x)
        b.set_data(y)
        producer.graph_compute_async(build_graph(out))
        done.record(producer)
        done.wait(consumer)                                    # consumer's queue waits
        result = np.empty(4096, np.float32)
        consumer.get_tensor_async(out, result)
        consumer.synchronize()
        np.testing.assert_array_equal(result, x + y)
        done.synchronize()


def test_a_bad_row_index_is_an_error_at_synchronize(dev, rng):
    from polydev.errors import OutOfBoundsError
    ctx = Context()
    table = ctx.new_tensor(GGMLType.F32, (8, 5), "table")
    rows = ctx.new_tensor(GGMLType.I32, (3,), "rows")
    out = ops.get_rows(ctx, table, rows)
    out.name = "picked"
    with alloc_ctx_tensors(ctx, dev.buffer_type), dev.init_backend() as backend:
        values = rng.standard_normal((5, 8)).astype(np.float32)
        table.set_data(values)
        rows.set_data(np.int32([1, 7, 2]))                     # 7: there are 5 rows
        graph = build_graph(out)
        with pytest.raises(OutOfBoundsError,
                           match=r"OpenCL\d: an index outside its tensor in GET_ROWS 'picked'"):
            backend.graph_compute(graph)
        rows.set_data(np.int32([1, 4, 2]))                     # the flag was reset
        backend.graph_compute(graph)
        np.testing.assert_array_equal(out.numpy()[0, 0], values[[1, 4, 2]])


@two_devices
def test_two_devices_share_a_context_and_copy_device_to_device(rng):
    d0, d1 = OPENCL[0], OPENCL[1]
    assert d0.platform is d1.platform
    assert d1.supports_buft(d0.buffer_type)
    ctx, a, b, out = _add_graph(d0)
    ctx1 = Context()
    dst = ctx1.new_tensor(GGMLType.F32, (4096,), "dst")
    with (alloc_ctx_tensors(ctx, d0.buffer_type), alloc_ctx_tensors(ctx1, d1.buffer_type),
            d0.init_backend() as b0, d1.init_backend() as b1):
        x, y = rng.standard_normal((2, 4096)).astype(np.float32)
        a.set_data(x)
        b.set_data(y)
        b0.graph_compute_async(build_graph(out))
        tensor_copy_async(b0, b1, out, dst)                    # ordered after the add
        assert b1._cpy_tensor_async(b0, out, dst)              # the device-to-device path
        doubled = ops.scale(ctx1, dst, 2.0)
        with alloc_ctx_tensors(_ctx_with(doubled), d1.buffer_type):
            b1.graph_compute(build_graph(doubled))
            np.testing.assert_allclose(doubled.numpy().ravel(), 2 * (x + y), rtol=1e-6)


def test_unsupported_ops_are_absent_from_the_kernel_table(dev):
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, (16, 16, 2, 1))
    pooled = ops.pool_2d(ctx, x, ops.PoolOp.MAX, 2, 2, 2, 2)
    assert not dev.supports_op(pooled)
    assert "POOL_2D" not in dev.supported_op_names()
    assert {"MUL_MAT", "MUL_MAT_ID", "FLASH_ATTN_EXT", "SOFT_MAX", "ROPE", "GET_ROWS",
            "RMS_NORM"} <= set(dev.supported_op_names())


# --- every kernel, against the CPU ----------------------------------------------------------------

def test_compare_passes_on_opencl(capsys, dev):
    """Every case of the catalogue whose ops OpenCL0 supports agrees with the CPU backend
    (the other PoCL devices run the same kernels)."""
    from polydev.tools.cli import main
    code = main(["compare", "-b", dev.name])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert f"Backend {dev.name}: OK" in out
    passed = int(out.split(" tests passed")[0].split()[-1].split("/")[0])
    assert passed > 2000


# --- half precision, converted by integer arithmetic on CPU devices ----------------------------

def test_every_half_converts_as_numpy_does(dev):
    """CPY f16 -> f32 over all 65,536 bit patterns: subnormals, infinities, -0 and NaN
    payloads as numpy's conversion gives them (bit for bit)."""
    halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    ctx = Context()
    src = ctx.new_tensor(GGMLType.F16, (halves.size,), "halves")
    out = ops.cpy(ctx, src, ctx.new_tensor(GGMLType.F32, (halves.size,), "floats"))
    with alloc_ctx_tensors(ctx, dev.buffer_type), dev.init_backend() as backend:
        src.set_data(halves)
        backend.graph_compute(build_graph(out))
        got = out.numpy().ravel()
    np.testing.assert_array_equal(got.view(np.uint32), halves.astype(np.float32).view(np.uint32))


def test_an_f16_weight_decodes_exactly_in_the_decode_product(dev):
    """MUL_MAT of an f16 weight holding every finite half by one-hot columns gives back each
    weight column exactly (the lane-wise conversion of the decode kernel)."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = bits.view(np.float16)[np.isfinite(bits.view(np.float16))]
    weight = finite[:finite.size // 32 * 32].reshape(-1, 32)          # rows of k = 32
    for j in (0, 5, 16, 31):
        ctx = Context()
        a = ctx.new_tensor(GGMLType.F16, (32, weight.shape[0]), "w")
        b = ctx.new_tensor(GGMLType.F32, (32, 1), "x")
        out = ops.mul_mat(ctx, a, b)
        with alloc_ctx_tensors(ctx, dev.buffer_type), dev.init_backend() as backend:
            a.set_data(weight)
            b.set_data(np.eye(32, dtype=np.float32)[j])
            backend.graph_compute(build_graph(out))
            np.testing.assert_array_equal(out.numpy().ravel(), weight[:, j].astype(np.float32))


def test_the_work_group_kernels_of_gpus_still_agree_on_a_cpu_device(capsys, dev, monkeypatch):
    """CPU devices take the barrier-free decode product and attention; the work-group kernels
    GPUs take are checked here on the same PoCL device, against the CPU backend."""
    from polydev.backends.opencl.probe import compiler_identity
    from polydev.backends.opencl.programs import ProgramCache
    from polydev.tools.cli import main

    monkeypatch.setattr(dev, "barrier_free", False)
    monkeypatch.setattr(dev, "_programs", ProgramCache(
        dev.cl, dev.platform.context, dev.cl_device,
        {"LS": dev.row_group_size, "TS": dev.tile_size},
        compiler_identity(dev.platform.platform, dev.cl_device)))
    code = main(["compare", "-b", dev.name, "-o", "MUL_MAT,FLASH_ATTN_EXT,CPY",
                 "-p", r"n=1,|nb=1,|type_src=f16"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert int(out.split(" tests passed")[0].split()[-1].split("/")[0]) > 50


def test_a_program_that_does_not_build_is_a_compile_error_naming_it(dev, monkeypatch, tmp_path):
    """The driver's own error lines, the program and the device named; nothing cached."""
    from polydev.backends.opencl.probe import compiler_identity
    from polydev.backends.opencl.programs import ProgramCache
    from polydev.errors import CompileError

    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(tmp_path))
    programs = ProgramCache(dev.cl, dev.platform.context, dev.cl_device,
                            {"LS": dev.row_group_size, "TS": dev.tile_size},
                            compiler_identity(dev.platform.platform, dev.cl_device))
    with pytest.raises(CompileError, match=r"OpenCL program rows\.cl on .* did not build: .*"
                                           r"error"):
        programs.kernel("rows", "get_rows", DST_T="no_such_type")
    assert [p for p in (tmp_path / "opencl").glob("*.bin")] == []
    assert programs.kernel("rows", "get_rows", DST_T="f32") is not None    # the others build
    assert len(list((tmp_path / "opencl").glob("*.bin"))) == 1


def test_what_the_driver_says_about_a_build_goes_to_the_debug_log(dev, monkeypatch, tmp_path,
                                                                   caplog):
    """A build that succeeds with a non-empty log (here: a macro the options define and the
    source defines again) reaches no one as a warning: pyopencl's CompilerWarning is caught,
    and the driver's log is in polydev's debug log. Both builds say it: from the source, and
    from the binary kept in the cache."""
    from polydev.backends.opencl.probe import compiler_identity
    from polydev.backends.opencl.programs import ProgramCache

    monkeypatch.setenv("POLYDEV_CACHE_DIR", str(tmp_path))     # built now, not read back
    programs = ProgramCache(dev.cl, dev.platform.context, dev.cl_device,
                            {"LS": dev.row_group_size, "TS": dev.tile_size},
                            compiler_identity(dev.platform.platform, dev.cl_device))
    with warnings.catch_warnings(), caplog.at_level(logging.DEBUG, "polydev.backends.opencl"):
        warnings.simplefilter("error")            # any warning that reaches the user fails
        assert programs.kernel("rows", "get_rows", DST_T="f32", ROW_INDICES=1) is not None
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG
            and "the driver said" in r.getMessage()]
    assert len(said) == 2 and all("ROW_INDICES" in m for m in said), said
