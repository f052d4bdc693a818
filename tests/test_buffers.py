"""Buffers, tensor data access, copies, lifetimes and the placement helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import polydev
from polydev import (BufferUsage, Context, GGMLType, MultiBuffer, TensorAllocator,
                     alloc_ctx_tensors, alloc_ctx_tensors_size, tensor_copy, tensor_get,
                     tensor_memset, tensor_set, view_init)
from polydev import HostArrayBuffer
from polydev.buffer import BufferType, tensor_get_2d, tensor_set_2d
from polydev.errors import (AllocationError, ClosedError, NotAllocatedError, OutOfBoundsError,
                            ShapeError, UnsupportedError)

from resident import mapping_resident_bytes


def test_zero_size_buffer_is_a_dummy(cpu):
    buf = cpu.alloc_buffer(0)
    assert buf.size == 0
    buf.clear(1)          # a no-op, as in ggml


def test_buffer_is_aligned_and_cleared(cpu):
    with cpu.alloc_buffer(1000) as buf:
        assert buf.host_array.ctypes.data % 64 == 0
        buf.clear(7)
        assert (buf.host_array == 7).all()
        assert buf.usage == BufferUsage.ANY
        buf.usage = BufferUsage.WEIGHTS
        assert buf.usage == BufferUsage.WEIGHTS
    with pytest.raises(ClosedError):
        buf.clear()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and MADV_DONTNEED")
def test_a_large_cpu_buffer_is_resident_only_where_written(cpu):
    """A large buffer takes memory as it is written; clearing it to zero gives the memory back
    and reads as zeros; clearing to another value writes it."""
    size = 64 << 20
    before = _resident_bytes()
    with cpu.alloc_buffer(size) as buf:
        data = buf.host_array
        assert data.ctypes.data % 64 == 0 and not data.any()
        assert _resident_bytes() - before < size // 4
        data[: size // 2] = 5
        assert _resident_bytes() - before >= size // 2
        buf.clear(0)
        assert _resident_bytes() - before < size // 4
        assert not data.any()
        buf.clear(3)
        assert (data == 3).all()


def test_set_get_bounds_and_memset(cpu):
    ctx = Context()
    t = ctx.new_tensor_2d(GGMLType.F32, 4, 3)
    with pytest.raises(NotAllocatedError):
        tensor_set(t, np.zeros(12, np.float32))
    with alloc_ctx_tensors(ctx, cpu):
        tensor_set(t, np.arange(12, dtype=np.float32))
        assert tensor_get(t).view(np.float32).tolist() == list(range(12))
        tensor_set(t, np.float32([100]), offset=8)
        assert t.numpy()[0, 0, 0, 2] == 100
        with pytest.raises(OutOfBoundsError):
            tensor_set(t, np.zeros(13, np.float32))
        with pytest.raises(OutOfBoundsError):
            tensor_get(t, offset=40, size=16)
        tensor_memset(t, 0, offset=4, size=8)
        assert t.numpy()[0, 0, 0, :4].tolist() == [0, 0, 0, 3]
        out = np.zeros(2 * 4, np.uint8)
        tensor_set_2d(t, np.float32([9, 8]), 0, 4, 2, 16, 4)    # column 0 of rows 0 and 1
        tensor_get_2d(t, out, 0, 4, 2, 16, 4)
        assert out.view(np.float32).tolist() == [9, 8]


def test_set_data_numpy_round_trip_including_views(cpu, rng):
    ctx = Context()
    t = ctx.new_tensor_3d(GGMLType.F16, 5, 4, 3)
    q = ctx.new_tensor_2d(GGMLType.Q8_0, 64, 2)
    with alloc_ctx_tensors(ctx, cpu):
        values = rng.standard_normal((3, 4, 5)).astype(np.float32)
        t.set_data(values)
        np.testing.assert_array_equal(t.numpy()[0], values.astype(np.float16))
        tt = ctx.transpose(t)          # a view of allocated memory is allocated at once
        np.testing.assert_array_equal(tt.numpy()[0], values.astype(np.float16).swapaxes(-1, -2))
        tt.set_data(np.zeros((3, 5, 4)))   # non-contiguous write keeps the layout
        assert not t.numpy().any()
        x = rng.standard_normal((2, 64)).astype(np.float32)
        q.set_data(x)
        assert np.abs(q.numpy()[0, 0] - x).max() < 0.05
        with pytest.raises(ShapeError):
            t.set_data(np.zeros(7))


def test_tensor_copy_paths(cpu, rng):
    ctx = Context()
    a, b = ctx.new_tensor_1d(GGMLType.F32, 16), ctx.new_tensor_1d(GGMLType.F32, 16)
    c = ctx.new_tensor_1d(GGMLType.F16, 16)
    with alloc_ctx_tensors(ctx, cpu):
        a.set_data(rng.standard_normal(16))
        tensor_copy(a, b)
        np.testing.assert_array_equal(a.numpy(), b.numpy())
        with pytest.raises(ShapeError, match="same layout"):
            tensor_copy(a, c)


def test_alloc_ctx_tensors_splits_at_max_size_and_multibuffer():
    class SmallBuft(BufferType):
        def __init__(self):
            super().__init__("small", alignment=32, max_size=256, is_host=True)
            self.allocs = []

        def _alloc(self, size):
            self.allocs.append(size)
            return HostArrayBuffer(self, np.zeros(size, np.uint8))

    buft = SmallBuft()
    ctx = Context()
    ts = [ctx.new_tensor_1d(GGMLType.F32, 40) for _ in range(3)]   # 160 bytes each
    big = ctx.new_tensor_1d(GGMLType.F32, 100)                     # 400 > max: its own buffer
    view = ctx.view_1d(ts[0], 10, 4)
    assert alloc_ctx_tensors_size(ctx, buft) == 160 * 3 + 416
    buf = alloc_ctx_tensors(ctx, buft)
    assert isinstance(buf, MultiBuffer) and buft.allocs == [160, 160, 160, 416]
    assert all(t.buffer is not None for t in ts + [big]) and view.buffer is ts[0].buffer
    assert view.offset == ts[0].offset + 4
    buf.usage = BufferUsage.WEIGHTS
    assert all(b.usage == BufferUsage.WEIGHTS for b in buf.buffers)
    buf.close()
    assert all(b.closed for b in buf.buffers)
    assert alloc_ctx_tensors(Context(), buft) is None


def test_failed_allocation_leaves_nothing_allocated():
    class FailingBuft(BufferType):
        def __init__(self):
            super().__init__("failing", max_size=100, is_host=True)
            self.n = 0

        def _alloc(self, size):
            self.n += 1
            if self.n == 2:
                raise MemoryError("out of memory")
            return HostArrayBuffer(self, np.zeros(size, np.uint8))

    ctx = Context()
    ts = [ctx.new_tensor_1d(GGMLType.F32, 20) for _ in range(2)]
    with pytest.raises(AllocationError, match="failed to allocate"):
        alloc_ctx_tensors(ctx, FailingBuft())
    assert all(t.buffer is None for t in ts)


def _always_overcommits() -> bool:
    try:
        return Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1"
    except OSError:
        return False


@pytest.mark.parametrize("size", [
    pytest.param(1 << 40, marks=pytest.mark.skipif(_always_overcommits(), reason="this kernel "
                 "commits any size (vm.overcommit_memory=1)")),
    (1 << 48) + 12345,                  # more than a process's address space: always refused
])
def test_more_host_memory_than_there_is_is_an_allocation_error_naming_device_and_size(size):
    """A CPU buffer of 1 MiB or more is a mapping of its own; one the kernel will not commit
    is polydev's out-of-memory error, as on every other device, not OSError [Errno 12]."""
    device = polydev.device("CPU")
    with pytest.raises(AllocationError, match=rf"^CPU: cannot allocate {size / 2**20:,.2f} MiB "
                                              r"of host memory"):
        device.buffer_type.alloc_buffer(size)
    ctx = Context()
    t = ctx.new_tensor_1d(GGMLType.I8, size)
    with pytest.raises(AllocationError, match="CPU: cannot allocate"):
        alloc_ctx_tensors(ctx, device.buffer_type)
    assert t.buffer is None


def test_tensor_allocator_and_view_init(cpu):
    ctx = Context()
    a, b = ctx.new_tensor_1d(GGMLType.F32, 10), ctx.new_tensor_1d(GGMLType.F32, 10)
    v = ctx.view_1d(a, 5, 8)
    with cpu.alloc_buffer(64) as buf:
        talloc = TensorAllocator(buf)
        talloc.alloc(a)
        assert a.offset == 0 and talloc.offset == 64
        with pytest.raises(AllocationError, match="not enough space"):
            talloc.alloc(b)
        view_init(v)
        assert v.buffer is buf and v.offset == 8
        with pytest.raises(AllocationError, match="already allocated"):
            polydev.tensor_alloc(buf, a, 0)


def test_buffer_from_host_ptr_is_zero_copy(rng):
    dev = polydev.device("CPU")
    host = np.zeros(64, np.float32)
    buf = dev.buffer_from_host_ptr(host)
    ctx = Context()
    t = ctx.new_tensor_1d(GGMLType.F32, 64)
    polydev.tensor_alloc(buf, t, 0)
    t.set_data(np.arange(64, dtype=np.float32))
    assert host[63] == 63                       # written straight into the user's array
    ro = dev.buffer_from_host_ptr(b"\x00" * 64)
    t2 = Context().new_tensor_1d(GGMLType.F32, 16)
    polydev.tensor_alloc(ro, t2, 0)
    with pytest.raises(UnsupportedError, match="read-only"):
        t2.set_data(np.ones(16))


def test_backend_fallbacks_and_lifetime(cpu, rng):
    ctx = Context()
    t = ctx.new_tensor_1d(GGMLType.F32, 8)
    with alloc_ctx_tensors(ctx, cpu):
        data = rng.standard_normal(8).astype(np.float32)
        cpu.set_tensor_async(t, data)            # no async: synchronize + blocking set
        out = np.empty(8, np.float32)
        cpu.get_tensor_async(t, out)
        np.testing.assert_array_equal(out, data)
        assert polydev.device("CPU").event_new() is None     # no events on the CPU
        with pytest.raises(UnsupportedError):
            cpu.event_record(None)
    cpu.close()
    with pytest.raises(ClosedError):
        cpu.synchronize()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_dropped_pages_of_a_read_only_file_read_back_unchanged(cpu, tmp_path):
    """What the CPU kernels do to a model file's weights once they hold a copy of their own:
    the pages leave the process's memory and a later read gets the file's bytes."""
    import mmap

    data = np.random.default_rng(0).integers(0, 256, 3 * mmap.PAGESIZE + 100, dtype=np.uint8)
    (tmp_path / "weights").write_bytes(data.tobytes())
    with open(tmp_path / "weights", "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with cpu.device.buffer_from_host_ptr(mapping) as buf:
        assert np.array_equal(buf.host_array, data)       # resident
        buf.drop_pages(10, data.size - 20)                # the whole pages inside
        assert np.array_equal(buf.host_array, data)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_dropping_pages_leaves_memory_that_is_not_a_read_only_file_alone(cpu, tmp_path):
    """Dropping the pages of private or anonymous memory would zero them or lose writes."""
    import mmap

    size = 3 * mmap.PAGESIZE
    (tmp_path / "weights").write_bytes(bytes(size))
    with open(tmp_path / "weights", "r+b") as f:
        private = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)    # written, not saved
    private[:] = b"\x07" * size
    anonymous = np.full(size, 9, dtype=np.uint8)
    for host, value in ((private, 7), (anonymous, 9)):
        with cpu.device.buffer_from_host_ptr(host) as buf:
            buf.drop_pages(0, size)
            assert np.all(buf.host_array == value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_a_replaced_weight_leaves_memory_again_after_enough_rows_are_read(cpu, tmp_path):
    """A tied token embedding: the products use a copy, GET_ROWS still reads rows of the file,
    whose pages come back; every REDROP_ROWS rows they are dropped again."""
    import mmap

    from polydev.backends.cpu.buffer import REDROP_ROWS

    size = 64 * mmap.PAGESIZE
    data = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    (tmp_path / "weights").write_bytes(data.tobytes())
    with open(tmp_path / "weights", "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    with cpu.device.buffer_from_host_ptr(mapping) as buf:
        address = buf.host_array.ctypes.data
        assert buf.host_array.sum() == data.sum() and mapping_resident_bytes(address) == size
        buf.replaced_by_copy(0, size)
        assert mapping_resident_bytes(address) == 0
        assert buf.host_array.sum() == data.sum()            # read back: resident again
        buf.rows_read(0, size, REDROP_ROWS - 1)
        buf.rows_read(0, mmap.PAGESIZE, REDROP_ROWS)        # a range no copy replaced
        assert mapping_resident_bytes(address) == size
        buf.rows_read(0, size, 1)
        assert mapping_resident_bytes(address) == 0
