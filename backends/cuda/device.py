"""A CUDA device: its buffer types, memory, kernels, op offload rule and capabilities."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from polydev.buffer import BufferType
from polydev.device import Device, DeviceType, Event
from polydev.env import env_int
from polydev.kernels import KernelTable
from polydev.ops import Op
from polydev.tensor import Tensor

from .backend import CUDABackend, CUDAEvent
from .buffer import CUDABufferType, CUDAHostBufferType
from .kernels import TABLE
from .programs import KernelModule, gpu_name

OFFLOAD_MIN_BATCH_ENV = "POLYDEV_OP_OFFLOAD_MIN_BATCH"
PEER_ACCESS_ALREADY_ENABLED = 704        # cudaErrorPeerAccessAlreadyEnabled


def op_batch_size(op: Tensor) -> int:
    """The batch an op works on, as ggml-cuda counts it for offloading (GET_ROWS: never)."""
    if op.op == Op.GET_ROWS:
        return 0
    if op.op == Op.MUL_MAT:
        return op.ne[1]
    if op.op in (Op.MUL_MAT_ID, Op.ROPE):
        return op.ne[2]
    return op.ne[1] * op.ne[2] * op.ne[3]


def _pci_bus_id(cupy: Any, index: int) -> str | None:
    try:
        return str(cupy.cuda.runtime.deviceGetPCIBusId(index)).lower()
    except cupy.cuda.runtime.CUDARuntimeError:    # not every platform reports one
        return None


class CUDADevice(Device):
    """One GPU ("CUDA0"), as CuPy sees it."""

    backend_class = CUDABackend

    def __init__(self, index: int, cupy: Any, siblings: list["CUDADevice"],
                 ordinal: int | None = None) -> None:
        """GPU ``index`` as CUDA counts it, named "CUDA<ordinal>" (default: its index; a GPU
        left out at discovery shifts the names of those after it)."""
        props = cupy.cuda.runtime.getDeviceProperties(index)
        super().__init__(f"CUDA{index if ordinal is None else ordinal}", gpu_name(props))
        self.cupy = cupy
        self.index = index
        self.integrated = bool(props.get("integrated", 0))
        self.type = DeviceType.IGPU if self.integrated else DeviceType.GPU
        self.compute_capability = f"{props.get('major', 0)}.{props.get('minor', 0)}"
        self._pci_bus_id = _pci_bus_id(cupy, index)
        self.siblings = siblings          # every CUDA device of the reg, this one included
        self._buft = CUDABufferType(self)
        # one pinned host buffer type for all GPUs, owned by the first (ggml's is a singleton)
        self._host_buft = siblings[0]._host_buft if siblings else CUDAHostBufferType(self)
        self.programs = KernelModule(cupy, index)     # the compiled cu/*.cu of this GPU
        self._transfer_stream: Any = None
        self._peers_enabled: set[int] = set()
        self._lock = threading.Lock()

    # --- synchronization of blocking transfers ------------------------------------------------

    @contextlib.contextmanager
    def idle(self) -> Iterator[Any]:
        """Wait for every stream of this GPU, then give a stream for a blocking transfer,
        which is finished on exit."""
        cuda = self.cupy.cuda
        with cuda.Device(self.index):
            cuda.runtime.deviceSynchronize()
            with self._lock:
                if self._transfer_stream is None:
                    self._transfer_stream = cuda.Stream(non_blocking=True)
                stream = self._transfer_stream
            yield stream
            stream.synchronize()

    def reg_idle(self) -> None:
        """Wait for every GPU: pinned host memory may be read or written by any of them."""
        for dev in self.siblings:
            with self.cupy.cuda.Device(dev.index):
                self.cupy.cuda.runtime.deviceSynchronize()

    def enable_peer_access(self, peer: "CUDADevice") -> None:
        """Let this GPU read ``peer``'s memory directly, where the hardware can (else peer
        copies go through the host, which the driver does by itself)."""
        runtime = self.cupy.cuda.runtime
        with self._lock:
            if peer.index in self._peers_enabled:
                return
            self._peers_enabled.add(peer.index)
        if not runtime.deviceCanAccessPeer(self.index, peer.index):
            return
        with self.cupy.cuda.Device(self.index):
            try:
                runtime.deviceEnablePeerAccess(peer.index)
            except runtime.CUDARuntimeError as e:
                if e.status != PEER_ACCESS_ALREADY_ENABLED:
                    raise

    def mapped_host_pointer(self, pinned: Any, size: int) -> Any:
        """A device MemoryPointer over pinned host memory (integrated GPUs share it)."""
        cuda = self.cupy.cuda
        return cuda.MemoryPointer(cuda.UnownedMemory(int(pinned.ptr), size, pinned, self.index),
                                  0)

    @property
    def device_id(self) -> str | None:
        """The PCI bus id, lower case as ggml gives it ("0000:3b:00.0")."""
        return self._pci_bus_id

    # --- memory ----------------------------------------------------------------------------

    def memory(self) -> tuple[int, int]:
        """(free, total): the driver's free bytes plus what CuPy's pool holds unused."""
        cupy = self.cupy
        with cupy.cuda.Device(self.index):
            free, total = cupy.cuda.runtime.memGetInfo()
            return free + cupy.get_default_memory_pool().free_bytes(), total

    @property
    def buffer_type(self) -> BufferType:
        return self._buft

    def _host_buffer_type(self) -> BufferType:
        return self._host_buft

    def supports_buft(self, buft: BufferType) -> bool:
        """This GPU's memory; pinned host memory too on an integrated GPU (as ggml)."""
        if isinstance(buft, CUDABufferType):
            return buft.device is self
        return self.integrated and isinstance(buft, CUDAHostBufferType)

    # --- compute ------------------------------------------------------------------------------

    @property
    def kernels(self) -> KernelTable:
        return TABLE

    @property
    def offload_min_batch(self) -> int:
        """ggml's op_offload_min_batch_size: $POLYDEV_OP_OFFLOAD_MIN_BATCH, default 32."""
        return env_int(OFFLOAD_MIN_BATCH_ENV)

    def offload_op(self, op: Tensor) -> bool:
        """Worth copying weights from the host for: a batch of POLYDEV_OP_OFFLOAD_MIN_BATCH
        (32) or more, never GET_ROWS."""
        return op_batch_size(op) >= self.offload_min_batch

    def _event_new(self) -> Event:
        return CUDAEvent(self)
