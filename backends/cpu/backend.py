"""The CPU backend (stream): numpy kernels bound to zero-copy views of host buffers.

The runtime's graph plans bind each node's kernel once (``Backend.bind``), so the per-node
cost of a repeated graph is one Python call plus the numpy work. The backend is synchronous
(it overrides none of the async hooks).
"""

from __future__ import annotations

from typing import ContextManager

import numpy as np

from polydev.backends.array import TABLE as NUMPY_TABLE
from polydev.device import Backend, GraphPlan
from polydev.errors import InvalidArgumentError
from polydev.kernels import KernelTable
from polydev.numerics import check_numerics
from polydev.tensor import Tensor

from .env import NumpyEnv
from .native import kernels as native_kernels
from .replay import ReplayPlan

# What a stream computes with: the compiled kernels where they apply (the default), or the
# numpy kernels alone (the reference ``polydev compare --reference numpy`` checks them against).
KERNEL_SETS = ("compiled", "numpy")


class CPUBackend(Backend):
    """A numpy compute stream on the CPU device; ``kernels="numpy"`` leaves out the compiled
    kernels (``init_backend("CPU", "numpy")``)."""

    def __init__(self, device, n_threads: int | None = None, numerics: str | None = None,
                 kernels: str = "compiled") -> None:
        if kernels not in KERNEL_SETS:
            raise InvalidArgumentError(f"the CPU backend's kernels are one of "
                                       f"{', '.join(KERNEL_SETS)}, got {kernels!r}")
        super().__init__(device, None if kernels == "compiled" else f"{device.name}-{kernels}")
        self._numpy_only = kernels == "numpy"
        if not self._numpy_only:
            native_kernels()             # loaded (built, where it must be) as the stream starts
        self.env = NumpyEnv(device.weight_cache)
        self.n_threads = None
        if n_threads is not None:
            self.set_n_threads(n_threads)
        if numerics is not None:
            self.set_numerics(numerics)

    @property
    def numerics(self) -> str:
        """How the quantized products compute (see polydev.numerics)."""
        return self.env.numerics

    def set_numerics(self, numerics: str) -> None:
        """"exact", "fast" or "int8" (polydev.numerics), for the graphs planned from now on: a plan
        already made keeps the kernels it bound."""
        self.env.numerics = check_numerics(numerics)

    def set_n_threads(self, n_threads: int) -> None:
        """Threads of this stream's compiled kernels, and of numpy's BLAS (process-wide, as
        BLAS has one pool)."""
        self.device.set_blas_threads(n_threads)
        self.n_threads = self.env.n_threads = n_threads

    @property
    def kernels(self) -> KernelTable:
        return NUMPY_TABLE if self._numpy_only else self.device.kernels

    def supports_op(self, op: Tensor) -> bool:
        if self._numpy_only:
            return NUMPY_TABLE.find(op) is not None
        return super().supports_op(op)

    def _graph_plan_create(self, graph) -> GraphPlan:
        plan = super()._graph_plan_create(graph)
        return plan if self._numpy_only else ReplayPlan(self, graph, plan.calls)

    def _graph_plan_compute(self, plan: GraphPlan) -> None:
        if not isinstance(plan, ReplayPlan):
            super()._graph_plan_compute(plan)
            return
        with self._compute_scope():
            plan.compute()

    def _graph_plan_free(self, plan: GraphPlan) -> None:
        super()._graph_plan_free(plan)
        if isinstance(plan, ReplayPlan):
            plan.steps = []              # its runs hold the calls, and they the tensors' memory

    def _compute_scope(self) -> ContextManager:
        return np.errstate(all="ignore")     # -inf masks and overflowing exps are expected
