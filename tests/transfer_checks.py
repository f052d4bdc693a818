"""The async transfer contract of ``Backend`` (runtime/device.py), checked on any stream: the
public wrappers own every check and fallback, so each backend (the CPU, OpenCL, CUDA, remote
devices, a third-party one) must behave the same. Shared by test_contract.py and test_ray.py."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from polydev import Backend, BufferType, Context, GGMLType, alloc_ctx_tensors
from polydev.errors import (ClosedError, InvalidArgumentError, NotAllocatedError,
                            OutOfBoundsError, ShapeError)

N = 64


def _fresh(buffer_type: BufferType, n: int = N):
    ctx = Context()
    t = ctx.new_tensor(GGMLType.F32, (n,), "t")
    return t, alloc_ctx_tensors(ctx, buffer_type)


def _read(backend: Backend, t, n: int = N) -> np.ndarray:
    out = np.empty(n, np.float32)
    backend.get_tensor_async(t, out)
    backend.synchronize()
    return out


def check_round_trips_keep_host_memory_alive(backend: Backend, buffer_type: BufferType,
                                             rng) -> None:
    """A write from a temporary array (any dtype: raw bytes) lands although the caller drops
    it at once; reads at an offset land after synchronize; the stream holds nothing after."""
    t, buf = _fresh(buffer_type)
    with buf:
        values = rng.standard_normal(N).astype(np.float32)
        backend.set_tensor_async(t, values.copy().view(np.float64))   # dropped at once
        gc.collect()
        backend.set_tensor_async(t, values[8:16] * 2, offset=32)
        backend.synchronize()
        assert len(backend.in_flight) == 0
        expected = values.copy()
        expected[8:16] *= 2
        tail = np.empty(N - 8, np.float32)
        backend.get_tensor_async(t, tail, offset=32)
        backend.synchronize()
        np.testing.assert_array_equal(tail, expected[8:])
        assert len(backend.in_flight) == 0


def check_bad_transfers_are_typed_and_change_nothing(backend: Backend,
                                                     buffer_type: BufferType) -> None:
    """Out of range, a bad offset, a bad output array: one typed error each, before anything
    is queued, and the tensor keeps its bytes."""
    t, buf = _fresh(buffer_type)
    with buf:
        before = np.arange(N, dtype=np.float32)
        backend.set_tensor_async(t, before)
        backend.synchronize()
        writes = [
            (OutOfBoundsError, r"\[0, 260\)", lambda: backend.set_tensor_async(
                t, np.zeros(N + 1, np.float32))),
            (OutOfBoundsError, r"\[252, 260\)", lambda: backend.set_tensor_async(
                t, np.zeros(2, np.float32), offset=4 * N - 4)),
            (OutOfBoundsError, r"\[-4, 0\)", lambda: backend.set_tensor_async(
                t, np.zeros(1, np.float32), offset=-4)),
            (InvalidArgumentError, "integer", lambda: backend.set_tensor_async(
                t, np.zeros(1, np.float32), offset=1.5)),
            (InvalidArgumentError, "raw bytes", lambda: backend.set_tensor_async(
                t, np.array([object()]))),
        ]
        reads = [
            (OutOfBoundsError, r"\[0, 260\)", lambda: backend.get_tensor_async(
                t, np.zeros(N + 1, np.float32))),
            (ShapeError, "C-contiguous", lambda: backend.get_tensor_async(
                t, np.zeros((N, 2), np.float32)[:, 0])),
            (InvalidArgumentError, "read-only", lambda: backend.get_tensor_async(
                t, np.frombuffer(bytes(16), np.uint8))),
            (InvalidArgumentError, "numpy array", lambda: backend.get_tensor_async(
                t, bytearray(16))),
        ]
        for error, message, call in writes + reads:
            with pytest.raises(error, match=message):
                call()
        assert len(backend.in_flight) == 0
        np.testing.assert_array_equal(_read(backend, t), before)


def check_unallocated_closed_and_foreign_memory(backend: Backend, buffer_type: BufferType,
                                                host_buffer_type: BufferType) -> None:
    """An unallocated tensor and a closed buffer are typed errors; memory of another kind (a
    host buffer) goes through the blocking fallback and still arrives."""
    loose = Context().new_tensor(GGMLType.F32, (N,), "loose")
    with pytest.raises(NotAllocatedError, match="loose"):
        backend.set_tensor_async(loose, np.zeros(N, np.float32))
    with pytest.raises(NotAllocatedError, match="loose"):
        backend.get_tensor_async(loose, np.zeros(N, np.float32))
    t, buf = _fresh(buffer_type)
    buf.close()
    with pytest.raises(ClosedError):
        backend.set_tensor_async(t, np.zeros(N, np.float32))
    host, host_buf = _fresh(host_buffer_type)
    with host_buf:
        values = np.arange(N, dtype=np.float32) + 0.5
        backend.set_tensor_async(host, values)
        np.testing.assert_array_equal(_read(backend, host), values)


def check_a_closed_stream_refuses_transfers(backend: Backend, buffer_type: BufferType) -> None:
    t, buf = _fresh(buffer_type)
    with buf:
        backend.close()
        with pytest.raises(ClosedError, match=backend.name):
            backend.set_tensor_async(t, np.zeros(N, np.float32))
        with pytest.raises(ClosedError, match=backend.name):
            backend.get_tensor_async(t, np.zeros(N, np.float32))
        with pytest.raises(ClosedError, match=backend.name):
            backend.synchronize()
