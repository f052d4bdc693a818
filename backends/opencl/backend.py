"""The OpenCL backend: an in-order command queue, its graph plans, async copies and events.

Async reads and writes are non-blocking enqueues; their events (which pin the host memory,
and whose deletion waits for them) live in the stream's keep-alive until it synchronizes. A
copy between two devices of one context runs on the source's queue and the destination's queue
waits for it with a barrier; events are markers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from polydev.device import Backend, DeviceType, Event
from polydev.host_cores import share_host_cores
from polydev.inflight import KernelErrorFlags
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
        if device.type == DeviceType.CPU:    # its threads and the CPU kernels' share the cores
            share_host_cores(device.name)
        cl = device.cl
        self.queue = cl.CommandQueue(device.platform.context, device.cl_device)
        # A slot each for GET_ROWS, SET_ROWS and MUL_MAT_ID kernels, set when they meet an
        # index out of range; a kernel gets its slot as a sub-buffer, whose origin OpenCL
        # wants aligned to the device's base address alignment.
        self.kernel_errors = KernelErrorFlags(self.name)
        self._flag_stride = max(4, device.cl_device.mem_base_addr_align // 8)
        self._error_flags = cl.Buffer(
            device.platform.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR,
            hostbuf=np.zeros(self.kernel_errors.n_slots * self._flag_stride // 4, np.int32))
        self._flag_slots: dict[int, object] = {}
        device.platform.track(self)

    def error_flag(self, node: Tensor):
        """The int buffer that ``node``'s kernel sets when it meets an index out of range."""
        slot = self.kernel_errors.slot(node)
        if slot not in self._flag_slots:
            self._flag_slots[slot] = self._error_flags.get_sub_region(slot * self._flag_stride, 4)
        return self._flag_slots[slot]

    # --- data movement --------------------------------------------------------------------------

    def _cl_buffer(self, t: Tensor):
        return cl_memory(t.buffer, self.device.platform)

    def _holds_memory_of(self, t: Tensor) -> bool:
        return self._cl_buffer(t) is not None

    def _set_tensor_async(self, t: Tensor, raw: np.ndarray, offset: int):
        return self.device.cl.enqueue_copy(self.queue, self._cl_buffer(t), raw,
                                           dst_offset=t.offset + offset, is_blocking=False)

    def _get_tensor_async(self, t: Tensor, out: np.ndarray, offset: int):
        return self.device.cl.enqueue_copy(self.queue, out, self._cl_buffer(t),
                                           src_offset=t.offset + offset, is_blocking=False)

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

    def _read_error_flags(self) -> np.ndarray:
        cl, stride = self.device.cl, self._flag_stride // 4
        flags = np.zeros(self.kernel_errors.n_slots * stride, np.int32)
        cl.enqueue_copy(self.queue, flags, self._error_flags, is_blocking=True)
        if flags.any():
            cl.enqueue_fill_buffer(self.queue, self._error_flags, np.int32(0), 0,
                                   flags.nbytes).wait()
        return flags[::stride]

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
        for flag in self._flag_slots.values():
            flag.release()
        self._error_flags.release()
