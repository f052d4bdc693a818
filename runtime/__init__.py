"""polydev: one compute graph across CPU (numpy), CUDA (CuPy) and OpenCL devices.

The names here are the public API; see README.md for a tour.
"""

from . import env, ops
from .alloc import (GraphAllocator, TensorAllocator, alloc_ctx_tensors, alloc_ctx_tensors_size,
                    tensor_alloc, view_init)
from .buffer import (Buffer, BufferType, BufferUsage, DummyBuffer, HostArrayBuffer, MultiBuffer,
                     tensor_copy, tensor_get, tensor_get_2d, tensor_memset, tensor_set,
                     tensor_set_2d)
from .compare import GraphCopy, compare_graph_backend, graph_copy
from .context import Context
from .device import (Backend, Device, DeviceCaps, DeviceProps, DeviceType, Event,
                     ExcludedDevice, GraphPlan, Reg, tensor_copy_async)
from .errors import PolydevError
from .graph import DEFAULT_GRAPH_SIZE, Graph, build_graph
from .kernels import Kernel, KernelTable
from .ops import GluOp, Op, RopeMode, UnaryOp
from .registry import device, devices, init_backend, init_best_backend, register, registry
from .sched import Scheduler
from .tensor import Tensor, TensorFlag
from .types import TYPE_TRAITS, GGMLType, dequantize, quantize, row_size

__version__ = "0.1.0"

env.check_environment()       # a bad POLYDEV_* value is said at start, not only where used

__all__ = [
    "ops", "GraphAllocator", "TensorAllocator", "alloc_ctx_tensors", "alloc_ctx_tensors_size",
    "tensor_alloc", "view_init", "Buffer", "BufferType", "BufferUsage", "DummyBuffer",
    "HostArrayBuffer", "MultiBuffer", "tensor_copy", "tensor_get", "tensor_get_2d",
    "tensor_memset", "tensor_set", "tensor_set_2d", "GraphCopy", "compare_graph_backend",
    "graph_copy", "Context", "Backend", "Device", "DeviceCaps", "DeviceProps", "DeviceType",
    "Event", "ExcludedDevice", "GraphPlan", "Reg", "tensor_copy_async", "PolydevError",
    "DEFAULT_GRAPH_SIZE",
    "Graph", "build_graph", "Kernel", "KernelTable", "GluOp", "Op", "RopeMode", "UnaryOp",
    "device", "devices", "init_backend", "init_best_backend", "register", "registry", "Scheduler",
    "Tensor", "TensorFlag", "GGMLType", "TYPE_TRAITS", "dequantize", "quantize", "row_size",
    "__version__",
]
