"""The OpenCL backend: an in-order command queue, its graph plans, async copies and events.

Async reads and writes are non-blocking enqueues whose host memory pyopencl keeps alive until
they finish; a copy between two devices of one context runs on the source's queue and the
destination's queue waits for it with a barrier; events are markers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from polydev.buffer import as_bytes, tensor_get, tensor_set
from polydev.device import Backend, Event
from polydev.errors import OutOfBoundsError
from polydev.tensor import Tensor

from .buffer import cl_memory

if TYPE_CHECKING:
    from .device import OpenCLDevice


class OpenCLEvent(Event):
    """A marker on the queue that recorded it; other queues of the context wait with a
    barrier, the host with ``synchronize``."""

    def __init__(self, device: OpenCLDevice) -> None:
        super().__init__(device)
        self.marker = None

    def _synchronize(self) -> None:
        if self.marker is not None:
            self.marker.wait()

    def _free(self) -> None:
        self.marker = None


class OpenCLBackend(Backend):
    """One in-order queue on an OpenCL device."""

    def __init__(self, device: OpenCLDevice) -> None:
        super().__init__(device)
        cl = device.cl
        self.queue = cl.CommandQueue(device.platform.context, device.cl_device)
        self._in_flight: list = []      # events of async transfers (they pin host memory)
        # set by GET_ROWS, SET_ROWS and MUL_MAT_ID kernels that meet an index out of range
        self.bad_index = cl.Buffer(device.platform.context,
                                   cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
                                   hostbuf=np.zeros(1, np.int32))
        self.index_check_pending = False
        device.platform.track(self)

    # --- data movement --------------------------------------------------------------------------

    def _cl_buffer(self, t: Tensor):
        return cl_memory(t.buffer, self.device.platform)

    def _set_tensor_async(self, t: Tensor, data, offset: int) -> None:
        target = self._cl_buffer(t)
        if target is None:                  # memory of another kind: the blocking path
            self.synchronize()
            tensor_set(t, data, offset)
            return
        raw = as_bytes(data)
        self._in_flight.append(self.device.cl.enqueue_copy(
            self.queue, target, raw, dst_offset=t.offset + offset, is_blocking=False))
        t.buffer.mark_modified()

    def _get_tensor_async(self, t: Tensor, out: np.ndarray, offset: int) -> None:
        source = self._cl_buffer(t)
        if source is None:
            self.synchronize()
            tensor_get(t, offset, out.nbytes, out)
            return
        self._in_flight.append(self.device.cl.enqueue_copy(
            self.queue, out.reshape(-1).view(np.uint8), source, src_offset=t.offset + offset,
            is_blocking=False))

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """Device to device within one context: the copy runs on the source's queue, after
        its work; this queue waits for it."""
        same_context = (isinstance(backend_src, OpenCLBackend)
                        and backend_src.device.platform is self.device.platform)
        s, d = self._cl_buffer(src), self._cl_buffer(dst)
        if not same_context or s is None or d is None:
            return False
        cl = self.device.cl
        done = cl.enqueue_copy(backend_src.queue, d, s, byte_count=src.nbytes,
                               src_offset=src.offset, dst_offset=dst.offset)
        cl.enqueue_barrier(self.queue, wait_for=[done])
        dst.buffer.mark_modified()
        return True

    def finish_queue(self) -> None:
        """Wait for this queue (blocking transfers of the context call this)."""
        if not self.closed:
            self.queue.finish()

    def _synchronize(self) -> None:
        self.queue.finish()
        self._in_flight.clear()
        if self.index_check_pending:
            self._raise_on_bad_index()

    def _raise_on_bad_index(self) -> None:
        """Kernels cannot raise: a bad row or expert index sets a flag, read here."""
        self.index_check_pending = False
        cl, flag = self.device.cl, np.zeros(1, np.int32)
        cl.enqueue_copy(self.queue, flag, self.bad_index, is_blocking=True)
        if flag[0]:
            cl.enqueue_fill_buffer(self.queue, self.bad_index, np.int32(0), 0, 4).wait()
            raise OutOfBoundsError(
                f"{self.name}: a GET_ROWS, SET_ROWS or MUL_MAT_ID index was outside its "
                f"tensor; the rows it named hold NaN (reads) or were not written (writes)")

    # --- events ---------------------------------------------------------------------------------

    def _event_record(self, event: Event) -> None:
        event.marker = self.device.cl.enqueue_marker(self.queue)

    def _event_wait(self, event: OpenCLEvent) -> None:
        if event.marker is None:            # never recorded: nothing to wait for
            return
        if event.device.platform is self.device.platform:
            self.device.cl.enqueue_barrier(self.queue, wait_for=[event.marker])
        else:                 # events cannot cross contexts: the host waits instead
            event.marker.wait()

    def _free(self) -> None:
        self.queue.finish()
        self._in_flight.clear()
        self.bad_index.release()
