"""The CUDA backend: one non-blocking CuPy stream, its graph plans, async copies and events.

All of a backend's work is queued on its stream: kernels of cu/*.cu, CuPy's array kernels
(run inside the stream's context) and transfers. A copy between two GPUs follows ggml's
protocol: it runs peer to peer on the source's stream, after the source's work, and the
destination's stream waits for an event recorded after it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Sequence

import numpy as np

from polydev.device import Backend, BoundCall, Event, GraphPlan, computing_nodes
from polydev.inflight import KernelErrorFlags
from polydev.numerics import DEFAULT_NUMERICS, check_numerics
from polydev.tensor import Tensor

from .buffer import CUDABuffer
from .env import CupyEnv
from .fusion import bind_nodes
from .graphs import CapturedPlan, GraphCapture, graphs_enabled, one_token_step

if TYPE_CHECKING:
    from polydev.graph import Graph

    from .device import CUDADevice


class CUDAEvent(Event):
    """A ``cupy.cuda.Event(disable_timing=True)`` of one GPU; any stream may wait on it."""

    def __init__(self, device: CUDADevice) -> None:
        super().__init__(device)
        with device.cupy.cuda.Device(device.index):
            self.cuda_event = device.cupy.cuda.Event(disable_timing=True)

    def _synchronize(self) -> None:
        self.cuda_event.synchronize()

    def _free(self) -> None:
        self.cuda_event = None


class CUDABackend(Backend):
    """A stream on one GPU; also the ``Launcher`` its own kernels are bound through."""

    def __init__(self, device: CUDADevice) -> None:
        super().__init__(device)
        cupy = device.cupy
        self.cupy = cupy
        with cupy.cuda.Device(device.index):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.copy_event = cupy.cuda.Event(disable_timing=True)
            with self.stream:      # zeroed on this stream: ordered before every kernel of it
                # a slot each, set by GET_ROWS, SET_ROWS and MUL_MAT_ID kernels that meet an
                # index out of range
                self._error_flags = cupy.zeros(KernelErrorFlags.N_SLOTS, dtype=np.int32)
        self.kernel_errors = KernelErrorFlags(self.name)
        self.graphs = GraphCapture(cupy, self.stream, self.kernel_errors)
        self.env = CupyEnv(self, cupy)
        self.numerics = DEFAULT_NUMERICS

    def set_numerics(self, numerics: str) -> None:
        """"exact": products of more than a few columns in float32 (cuBLAS' SGEMM); "fast"
        (and "int8"): in half precision on the tensor cores, as ggml-cuda (gemm.py). For the
        graphs planned from now on."""
        self.numerics = check_numerics(numerics)

    @contextlib.contextmanager
    def on_stream(self) -> Iterator[None]:
        """This GPU current and this stream current: CuPy queues its work here."""
        with self.cupy.cuda.Device(self.device.index), self.stream:
            yield

    def _compute_scope(self) -> ContextManager:
        return self.on_stream()       # binding may upload small tables: on this stream too

    # --- plans: CUDA graphs for steps of one token (graphs.py) --------------------------------

    def _bind_graph(self, graph: "Graph") -> list[BoundCall]:
        """Each computing node's call, a norm and the MUL after it fused (fusion.py)."""
        with self._compute_scope():
            return bind_nodes(self, computing_nodes(graph), self.bind)

    def _graph_plan_create(self, graph: "Graph") -> GraphPlan:
        return CapturedPlan(self, graph, self._bind_graph(graph),
                            capturable=graphs_enabled() and one_token_step(graph))

    def _graph_plan_compute(self, plan: CapturedPlan) -> None:
        with self.on_stream():
            self.graphs.compute(plan)

    def _graph_plan_free(self, plan: CapturedPlan) -> None:
        if plan.cuda_graph is not None:
            self.stream.synchronize()  # a launch in flight still writes the graph's memory
        plan.release()
        plan.calls = []

    # --- Launcher (binders.py) ------------------------------------------------------------------

    def address(self, t: Tensor) -> int:
        return t.buffer.ptr + t.offset

    def error_flag(self, node: Tensor) -> np.uint64:
        """The int* that ``node``'s kernel sets when it meets an index out of range."""
        return np.uint64(self._error_flags.data.ptr + 4 * self.kernel_errors.slot(node))

    def kernel(self, name: str) -> Callable[[Sequence[int], Sequence[int], list], None]:
        """A call launching kernel ``name`` on this stream now (grid, block, args)."""
        fn, stream = self.device.programs.function(name), self.stream
        return lambda grid, block, args: fn(tuple(grid), tuple(block), args, stream=stream)

    def launch(self, name: str, grid: Sequence[int], block: Sequence[int], args: list,
               checks_indices: bool = False) -> Callable[[], None]:
        if min(grid) == 0:
            return lambda: None
        fn, stream = self.device.programs.function(name), self.stream
        grid, block = tuple(int(g) for g in grid), tuple(int(b) for b in block)
        if not checks_indices:
            return lambda: fn(grid, block, args, stream=stream)
        errors = self.kernel_errors

        def call() -> None:
            fn(grid, block, args, stream=stream)
            errors.launched()           # its flag is read when the backend synchronizes
        return call

    def scratch(self, nbytes: int) -> tuple[int, Any]:
        with self.on_stream():          # the pool's memory of this stream: freed in its order
            memory = self.cupy.cuda.alloc(nbytes)
        return memory.ptr, memory

    # --- data movement --------------------------------------------------------------------------

    def _device_buffer(self, t: Tensor) -> CUDABuffer | None:
        buf = t.buffer
        return buf if isinstance(buf, CUDABuffer) and buf.device is self.device else None

    def _holds_memory_of(self, t: Tensor) -> bool:
        return self._device_buffer(t) is not None

    def _set_tensor_async(self, t: Tensor, raw: np.ndarray, offset: int) -> None:
        with self.cupy.cuda.Device(self.device.index):
            (t.buffer.memptr + t.offset + offset).copy_from_host_async(
                raw.ctypes.data, raw.nbytes, self.stream)

    def _get_tensor_async(self, t: Tensor, out: np.ndarray, offset: int) -> None:
        with self.cupy.cuda.Device(self.device.index):
            (t.buffer.memptr + t.offset + offset).copy_to_host_async(
                out.ctypes.data, out.nbytes, self.stream)

    def _cpy_tensor_async(self, backend_src: Backend, src: Tensor, dst: Tensor) -> bool:
        """GPU to GPU (ggml's protocol): the copy runs on the source's stream after its work;
        this stream waits for the source's copy event."""
        if not isinstance(backend_src, CUDABackend):
            return False
        sbuf, dbuf = backend_src._device_buffer(src), self._device_buffer(dst)
        if sbuf is None or dbuf is None:
            return False
        runtime = self.cupy.cuda.runtime
        s_ptr, d_ptr = sbuf.ptr + src.offset, dbuf.ptr + dst.offset
        with self.cupy.cuda.Device(backend_src.device.index):
            if sbuf.device is dbuf.device:
                runtime.memcpyAsync(d_ptr, s_ptr, dst.nbytes, runtime.memcpyDeviceToDevice,
                                    backend_src.stream.ptr)
            else:
                self.device.enable_peer_access(backend_src.device)
                runtime.memcpyPeerAsync(d_ptr, dbuf.device.index, s_ptr, sbuf.device.index,
                                        dst.nbytes, backend_src.stream.ptr)
            if backend_src is not self:
                backend_src.copy_event.record(backend_src.stream)
        if backend_src is not self:
            self.stream.wait_event(backend_src.copy_event)
        dbuf.mark_modified()
        return True

    def _synchronize(self) -> None:
        self.stream.synchronize()

    def _read_error_flags(self) -> np.ndarray:
        with self.on_stream():
            flags = self._error_flags.get()
            if flags.any():
                self._error_flags.fill(0)
                self.stream.synchronize()
        return flags

    # --- events ---------------------------------------------------------------------------------

    def _event_record(self, event: Event) -> None:
        with self.cupy.cuda.Device(self.device.index):
            event.cuda_event.record(self.stream)

    def _event_wait(self, event: CUDAEvent) -> None:
        self.stream.wait_event(event.cuda_event)

    def _free(self) -> None:
        self.stream.synchronize()
        self._error_flags = None
