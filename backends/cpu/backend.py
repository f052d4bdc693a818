"""The CPU backend (stream): graph plans that bind each node's kernel to numpy views once.

Computing a plan replays the bound calls, so the per-node cost of a repeated graph is one
Python call plus the numpy work. The backend is synchronous (caps.async_ is false).
"""

from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from polydev.device import Backend, BoundGraphPlan
from polydev.errors import UnsupportedOpError
from polydev.graph import Graph
from polydev.ops import VIEW_OPS, Op, op_desc
from polydev.tensor import Tensor

from polydev.backends.array import find_kernel

from .env import NumpyEnv

log = logging.getLogger(__name__)


CPUGraphPlan = BoundGraphPlan      # the CPU backend's plans (the shared bound plan)


class CPUBackend(Backend):
    """A numpy compute stream on the CPU device."""

    def __init__(self, device, n_threads: int | None = None) -> None:
        super().__init__(device)
        self.env = NumpyEnv(device.weight_cache)
        self.n_threads = None
        if n_threads is not None:
            self.set_n_threads(n_threads)

    def set_n_threads(self, n_threads: int) -> None:
        """Threads numpy's BLAS may use (process-wide, as BLAS has one pool)."""
        self.n_threads = n_threads
        self.device.set_blas_threads(n_threads)

    def bind(self, node: Tensor) -> Callable[[], None]:
        """The call that computes ``node`` on this backend."""
        kernel = find_kernel(node)
        if kernel is None:
            types = ", ".join(f"{s.type}" for s in node.src if s is not None)
            raise UnsupportedOpError(f"CPU has no kernel for {op_desc(node)} of {node.name!r} "
                                     f"(result {node.type}, sources {types})")
        return kernel.bind(self.env, node)

    def _graph_plan_create(self, graph: Graph) -> CPUGraphPlan:
        calls = [self.bind(n) for n in graph.nodes if n.op not in VIEW_OPS and n.op != Op.NONE]
        return CPUGraphPlan(graph, calls)

    def _graph_plan_compute(self, plan: CPUGraphPlan) -> None:
        with np.errstate(all="ignore"):   # -inf masks and overflowing exps are expected
            for call in plan.calls:
                call()

    def _graph_compute(self, graph: Graph) -> None:
        self._graph_plan_compute(self._graph_plan_create(graph))
