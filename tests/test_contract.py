"""The backend contract of runtime/device.py and runtime/buffer.py: capabilities derived from
the hooks a backend overrides, the fallbacks of the hooks it leaves out, and misuse that
raises a typed error and changes nothing."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import polydev
from polydev import (Backend, BufferType, BufferUsage, Context, Device, Event, GGMLType,
                     HostArrayBuffer, Kernel, KernelTable, Op, Reg, UnaryOp, alloc_ctx_tensors,
                     build_graph, ops, tensor_copy_async)
from polydev.errors import (ClosedError, InvalidArgumentError, NotAllocatedError, ShapeError,
                            TensorTypeError, UnsupportedError)
from polydev.inflight import KernelErrorFlags

import transfer_checks
from needs import device_params, opencl_mark

needs_opencl = opencl_mark()


# --- a minimal backend: the least a backend author writes --------------------------------------

class _PlainBuft(BufferType):
    def _alloc(self, size):
        return HostArrayBuffer(self, np.zeros(size, np.uint8))


def _host_view(t):
    return np.ndarray(t.shape, np.float32, buffer=t.buffer.host_array, offset=t.offset,
                      strides=t.nb[::-1])


def _bind_neg(backend, node):
    a, d = _host_view(node.src[0]), _host_view(node)
    return lambda: np.negative(a, out=d)


# a kernel table of one kernel: what supports_op and bind read
NEG_ONLY = KernelTable({(Op.UNARY, UnaryOp.NEG): Kernel(lambda n: n.type == GGMLType.F32,
                                                        _bind_neg)})


class _MinimalBackend(Backend):
    """Overrides nothing: synchronous, no events, binds through the device's kernel table."""


class _MinimalDevice(Device):
    backend_class = _MinimalBackend

    def __init__(self):
        super().__init__("Minimal0", "the smallest backend")
        self._buft = _PlainBuft("Minimal0", self, is_host=True)

    def memory(self):
        return (1 << 20, 1 << 20)

    @property
    def buffer_type(self):
        return self._buft

    def supports_buft(self, buft):
        return buft.is_host

    @property
    def kernels(self):
        return NEG_ONLY


class _Stamp(Event):
    def _synchronize(self):
        pass


class _EventBackend(_MinimalBackend):
    def _event_record(self, event):
        event.recorded = True

    def _event_wait(self, event):
        event.waited_on_stream = True


class _EventDevice(_MinimalDevice):
    backend_class = _EventBackend

    def _event_new(self):
        return _Stamp(self)


def test_caps_are_derived_from_the_hooks_a_backend_overrides():
    minimal, events = _MinimalDevice(), _EventDevice()
    assert minimal.caps == polydev.DeviceCaps()              # nothing optional
    assert events.caps.events and not events.caps.async_
    assert polydev.device("CPU").caps.buffer_from_host_ptr
    for d in polydev.devices():                              # what each device says it can do,
        caps = d.caps                                        # it does
        assert (d.host_buffer_type is not None) == caps.host_buffer
        assert (d.event_new() is not None) == caps.events


def test_the_optional_hooks_fall_back_as_ggml_does(rng):
    dev = _MinimalDevice()
    assert dev.host_buffer_type is None and dev.event_new() is None
    with pytest.raises(UnsupportedError, match="cannot wrap host memory"):
        dev.buffer_from_host_ptr(np.zeros(16, np.uint8))
    ctx = Context()
    a = ctx.new_tensor_1d(GGMLType.F32, 8, "a")
    y = ops.neg(ctx, a)
    with dev.init_backend() as b, alloc_ctx_tensors(ctx, dev.buffer_type):
        values = rng.standard_normal(8).astype(np.float32)
        b.set_tensor_async(a, values)                        # synchronize + blocking set
        b.graph_compute(build_graph(y))                      # bound through the kernel table
        out = np.empty(8, np.float32)
        b.get_tensor_async(y, out)
        np.testing.assert_array_equal(out, -values)
        polydev.tensor_memset(a, 0)                           # memset: a _set of filled bytes
        assert not a.numpy().any()
        with pytest.raises(UnsupportedError, match="no events"):
            b.event_record(_Stamp(dev))
        assert dev.supports_op(y) and not dev.supports_op(ops.unary(ctx, a, UnaryOp.ABS))
        with pytest.raises(polydev.errors.UnsupportedOpError, match="Minimal0 has no kernel"):
            b.bind(ops.unary(ctx, a, UnaryOp.ABS))


def test_a_backend_must_override_both_hooks_of_a_pair():
    with pytest.raises(TypeError,
                       match="_set_tensor_async, _get_tensor_async and _holds_memory_of"):
        class _HalfAsync(Backend):
            def _set_tensor_async(self, t, data, offset):
                pass
    with pytest.raises(TypeError, match="_event_record and _event_wait"):
        class _HalfEvents(Backend):
            def _event_record(self, event):
                pass


def test_events_of_another_backend_library_make_the_host_wait():
    dev, other = _EventDevice(), _EventDevice()
    Reg("Events", [dev])
    Reg("Other", [other])
    with dev.init_backend() as b, other.init_backend() as ob:
        mine, theirs = dev.event_new(), other.event_new()
        mine.record(b)
        mine.wait(b)
        assert mine.waited_on_stream                          # same reg: the stream waits
        theirs.record(ob)
        theirs.wait(b)
        assert not hasattr(theirs, "waited_on_stream")        # another reg: the host waited
        with pytest.raises(InvalidArgumentError, match="its own device"):
            b.event_record(theirs)
        mine.close()
        with pytest.raises(ClosedError):
            mine.wait(b)


def test_plans_belong_to_their_backend(rng):
    ctx = Context()
    a = ctx.new_tensor_1d(GGMLType.F32, 8, "a")
    graph = build_graph(ops.neg(ctx, a))
    with (polydev.init_backend("CPU") as b1, polydev.init_backend("CPU") as b2,
          alloc_ctx_tensors(ctx, b1)):
        plan = b1.graph_plan_create(graph)
        with pytest.raises(InvalidArgumentError, match="cannot run on"):
            b2.graph_plan_compute(plan)
        b1.graph_plan_free(plan)
        with pytest.raises(ClosedError, match="freed"):
            b1.graph_plan_compute(plan)


@pytest.mark.parametrize("device", ["CPU", pytest.param("OpenCL0", marks=needs_opencl)])
def test_computing_an_unallocated_graph_is_a_typed_error(device):
    ctx = Context()
    y = ops.neg(ctx, ctx.new_tensor_1d(GGMLType.F32, 8, "a"))
    with polydev.init_backend(device) as b:
        with pytest.raises(NotAllocatedError, match="cannot compute NEG .* is not allocated"):
            b.graph_compute(build_graph(y))
        with pytest.raises(NotAllocatedError):
            b.graph_plan_create(build_graph(y))


@needs_opencl
def test_computing_a_graph_in_another_devices_memory_is_a_typed_error():
    ctx = Context()
    a = ctx.new_tensor_1d(GGMLType.F32, 8, "a")
    y = ops.neg(ctx, a)
    cpu_memory = polydev.device("CPU").buffer_type        # not of the OpenCL context
    with polydev.init_backend("OpenCL0") as ocl, alloc_ctx_tensors(ctx, cpu_memory):
        with pytest.raises(UnsupportedError, match="OpenCL0 cannot use"):
            ocl.graph_compute(build_graph(y))


def test_a_closed_buffer_in_a_graph_is_a_typed_error():
    ctx = Context()
    y = ops.neg(ctx, ctx.new_tensor_1d(GGMLType.F32, 8, "a"))
    with polydev.init_backend("CPU") as cpu:
        buf = alloc_ctx_tensors(ctx, cpu)
        buf.close()
        with pytest.raises(ClosedError):
            cpu.graph_compute(build_graph(y))


# --- buffers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("usage", [7, -1, "weights", 1.5])
def test_a_bad_buffer_usage_is_refused(usage):
    with polydev.init_backend("CPU") as cpu, cpu.alloc_buffer(64) as buf:
        buf.usage = BufferUsage.WEIGHTS
        with pytest.raises(InvalidArgumentError, match="buffer usage must be one of"):
            buf.usage = usage
        assert buf.usage == BufferUsage.WEIGHTS              # unchanged


def test_buffer_ids_are_never_reused():
    cpu = polydev.device("CPU")
    seen = set()
    for _ in range(50):
        buf = cpu.buffer_type.alloc_buffer(64)
        assert buf.uid not in seen
        seen.add(buf.uid)
        buf.close()
        del buf
        gc.collect()


def test_tensor_copy_async_checks_the_layout():
    ctx = Context()
    a, b = ctx.new_tensor_1d(GGMLType.F32, 8), ctx.new_tensor_1d(GGMLType.F16, 8)
    c = ctx.new_tensor_2d(GGMLType.F32, 4, 2)
    with polydev.init_backend("CPU") as cpu, alloc_ctx_tensors(ctx, cpu):
        for dst in (b, c):
            with pytest.raises(ShapeError, match="same layout"):
                tensor_copy_async(cpu, cpu, a, dst)


# --- set_data misuse: a typed error, and the tensor is left as it was ------------------------

def _matrix(type_=GGMLType.F32):
    ctx = Context()
    t = ctx.new_tensor_2d(type_, 4, 3, "m")           # numpy shape (3, 4)
    return ctx, t


@pytest.mark.parametrize("bad,error,message", [
    (np.array([["a"] * 4] * 3), TensorTypeError, "from an array of <U1 values"),
    (np.array([[1.0] * 4] * 3, dtype=object), TensorTypeError, "object values"),
    (np.ones((3, 4)) + 2j, TensorTypeError, "complex128 values"),
    (np.ones((4, 3)), ShapeError, "from an array of shape \\(4, 3\\)"),
    (np.ones(12), ShapeError, "from an array of shape \\(12,\\)"),
    (np.ones((3, 4, 2)), ShapeError, "shape"),
    (b"\x00" * 47, ShapeError, "from 47 raw bytes"),
    (b"\x00" * 49, ShapeError, "from 49 raw bytes"),
    (bytearray(8), ShapeError, "from 8 raw bytes"),
    ("abc", TensorTypeError, "<U3 values"),
    ([[1, 2], [3]], ShapeError, "cannot set m"),
])
def test_set_data_refuses_what_it_cannot_write_and_writes_nothing(bad, error, message):
    ctx, t = _matrix()
    with polydev.init_backend("CPU") as cpu, alloc_ctx_tensors(ctx, cpu):
        before = np.arange(12, dtype=np.float32).reshape(3, 4)
        t.set_data(before)
        with pytest.raises(error, match=message):
            t.set_data(bad)
        np.testing.assert_array_equal(t.numpy().reshape(3, 4), before)


@pytest.mark.parametrize("good", [np.ones((3, 4)), np.ones((1, 1, 3, 4)), np.ones((3, 4), bool),
                                  np.ones((3, 4), np.int64), [[1.0] * 4] * 3, b"\x00" * 48])
def test_set_data_takes_values_in_numpy_order_up_to_leading_ones(good):
    ctx, t = _matrix()
    with polydev.init_backend("CPU") as cpu, alloc_ctx_tensors(ctx, cpu):
        t.set_data(good)
        assert t.numpy().shape == (1, 1, 3, 4)


def test_set_data_of_a_quantized_tensor_takes_values_or_exactly_its_bytes():
    ctx = Context()
    t = ctx.new_tensor_2d(GGMLType.Q8_0, 32, 2, "q")   # 2 blocks of 34 bytes
    with polydev.init_backend("CPU") as cpu, alloc_ctx_tensors(ctx, cpu):
        t.set_data(np.ones((2, 32)))
        raw = polydev.tensor_get(t).copy()
        t.set_data(raw)                                 # its own bytes
        with pytest.raises(ShapeError):
            t.set_data(raw[:-1])
        np.testing.assert_array_equal(polydev.tensor_get(t), raw)


# --- the CPU weight cache and a reloaded buffer ------------------------------------------------

def _load_and_multiply(cpu, values: np.ndarray, xv: np.ndarray) -> tuple[np.ndarray, int]:
    """Load Q8_0 weights into a fresh WEIGHTS buffer, multiply, free everything; the result
    and the id() the buffer had."""
    wctx, ctx = Context(), Context()
    w = wctx.new_tensor_2d(GGMLType.Q8_0, 64, 16, "w")
    x = ctx.new_tensor_1d(GGMLType.F32, 64, "x")
    y = ops.mul_mat(ctx, w, x)
    with alloc_ctx_tensors(wctx, cpu) as wbuf, alloc_ctx_tensors(ctx, cpu):
        wbuf.usage = BufferUsage.WEIGHTS
        w.set_data(values)                       # one write: the same generation every time
        x.set_data(xv)
        cpu.graph_compute(build_graph(y))
        return y.numpy().reshape(-1), id(wbuf)


def test_weights_reloaded_into_a_fresh_buffer_are_not_served_stale(rng):
    """Python reuses a freed buffer's id(); decoded weights must follow the new bytes."""
    xv = rng.standard_normal(64).astype(np.float32)
    ids = set()
    with polydev.init_backend("CPU") as cpu:
        for _ in range(8):
            values = rng.standard_normal((16, 64)).astype(np.float32)
            out, buffer_id = _load_and_multiply(cpu, values, xv)
            ids.add(buffer_id)
            decoded = polydev.dequantize(polydev.quantize(values, GGMLType.Q8_0), GGMLType.Q8_0)
            # stale weights would be off by about 1; int16 activations (the default numerics)
            # by at most sum |w| * max |x| / 32767 / 2, about 2e-3 here (typically 2e-4)
            np.testing.assert_allclose(out, decoded.reshape(16, 64) @ xv, rtol=1e-3, atol=3e-3)
            gc.collect()
    assert polydev.device("CPU").weight_cache.nbytes == 0   # freed buffers took their entries
    print(f"{8 - len(ids)} reloads reused a freed buffer's id()")


def test_the_op_maths_lives_in_the_ops():
    assert polydev.ops.yarn_corr_dims(128, 4096, 10000.0, 32.0, 1.0) == (20.0, 46.0)
    slopes = polydev.ops.alibi_slopes(8, 8.0)
    np.testing.assert_allclose(slopes, 2.0 ** -np.arange(1, 9))


def test_an_unknown_name_and_a_non_name_are_typed_errors():
    with pytest.raises(InvalidArgumentError, match="got None"):
        polydev.device(None)
    with pytest.raises(InvalidArgumentError):
        polydev.init_backend(3)



# --- async transfers: the wrappers own the checks, on every backend ----------------------------

@pytest.fixture(params=[*device_params(), "minimal"])
def stream(request):
    """A stream of every registered device and of the minimal backend above: every one must
    keep the transfer contract."""
    device = _MinimalDevice() if request.param == "minimal" else polydev.device(request.param)
    with device.init_backend() as b:
        yield b


def test_async_round_trips_keep_the_host_memory_alive(stream, rng):
    transfer_checks.check_round_trips_keep_host_memory_alive(
        stream, stream.device.buffer_type, rng)


def test_bad_async_transfers_are_typed_errors_that_change_nothing(stream):
    transfer_checks.check_bad_transfers_are_typed_and_change_nothing(
        stream, stream.device.buffer_type)


def test_async_transfers_of_unallocated_closed_and_foreign_memory(stream):
    transfer_checks.check_unallocated_closed_and_foreign_memory(
        stream, stream.device.buffer_type, polydev.device("CPU").buffer_type)


def test_a_closed_stream_refuses_transfers(stream):
    transfer_checks.check_a_closed_stream_refuses_transfers(stream, stream.device.buffer_type)


# --- errors kernels report later ---------------------------------------------------------------

class _FlagBackend(_MinimalBackend):
    """A backend whose kernels report bad indices through flags, as GPU kernels do: its NEG
    kernel sets its node's flag when the input's first value is negative."""

    def __init__(self, device):
        super().__init__(device)
        self.kernel_errors = KernelErrorFlags(self.name, n_slots=4)
        self.flags = np.zeros(4, np.int32)

    def bind(self, node):
        compute, slot = super().bind(node), self.kernel_errors.slot(node)
        errors = self.kernel_errors

        def call():
            compute()
            if node.src[0].numpy().ravel()[0] < 0:
                self.flags[slot] = 1
            errors.launched()
        return call

    def _read_error_flags(self):
        flags, self.flags = self.flags, np.zeros(4, np.int32)
        return flags


class _FlagDevice(_MinimalDevice):
    backend_class = _FlagBackend


def test_a_kernel_error_is_raised_at_synchronize_naming_the_op_and_tensor():
    ctx = Context()
    a = ctx.new_tensor_1d(GGMLType.F32, 8, "a")
    first = ops.neg(ctx, a)
    first.name = "first"
    second = ops.neg(ctx, first)
    second.name = "second"
    with _FlagDevice().init_backend() as b, alloc_ctx_tensors(ctx, b.device.buffer_type):
        graph = build_graph(second)
        a.set_data(np.ones(8, np.float32))
        b.graph_compute_async(graph)
        with pytest.raises(polydev.errors.OutOfBoundsError,
                           match=r"Minimal0: an index outside its tensor in NEG 'second'"):
            b.synchronize()
        b.synchronize()                          # raised once: the flags were read and zeroed
        a.set_data(-np.ones(8, np.float32))
        with pytest.raises(polydev.errors.OutOfBoundsError, match="in NEG 'first':"):
            b.graph_compute(graph)
        a.set_data(np.ones(8, np.float32))
        with pytest.raises(polydev.errors.OutOfBoundsError, match="in NEG 'second':"):
            b.graph_compute(graph)


def test_kernel_error_slots_are_stable_and_shared_past_their_number():
    errors = KernelErrorFlags("S0", n_slots=2)
    ctx = Context()
    a = ctx.new_tensor_1d(GGMLType.F32, 8, "a")
    nodes = [ops.neg(ctx, a) for _ in range(3)]
    for i, n in enumerate(nodes):
        n.name = f"n{i}"
    assert [errors.slot(n) for n in nodes] == [0, 1, 0]
    assert errors.slot(nodes[1]) == 1                   # bound again: the same slot
    errors.launched()
    with pytest.raises(polydev.errors.OutOfBoundsError, match="NEG 'n0' or NEG 'n2'"):
        errors.raise_reported(np.array([1, 0], np.int32))
    assert not errors.pending
    errors.raise_reported(np.zeros(2, np.int32))        # nothing set: nothing raised
