"""The scheduler's bound graph plans, kept across graphs that bind to the same memory.

A plan binds every node of a split to its tensors' memory once. A program that builds a new
Graph object per step (the way llama.cpp rebuilds its decode graph) gets new twin tensors
from the scheduler each time, but the allocator places them exactly where they were, so the
old bound calls still compute the right thing. A plan is reused when its split binds the
same ops to the same bytes: same op, parameters, types, shapes and strides, the same buffer
objects (held here, so never a recycled ``id``) at the same offsets.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from .errors import UnsupportedError

if TYPE_CHECKING:
    from .device import Backend, GraphPlan
    from .graph import Graph
    from .tensor import Tensor

NO_PLANS = False      # the cached answer of a backend that has no graph plans


def _binding(t: "Tensor") -> tuple:
    return (t.buffer, t.offset, t.type, t.ne, t.nb)


def memory_key(graph: "Graph") -> tuple:
    """Everything a bound kernel call depends on, for every node of ``graph``."""
    return tuple((n.op, n.op_params, _binding(n),
                  tuple(_binding(s) if s is not None else None for s in n.src))
                 for n in graph.nodes)


class SplitPlans:
    """Up to ``keep`` plans per split (one per pipelined copy slot), by memory key."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._plans: dict[int, OrderedDict] = {}

    def plan(self, k: int, backend: "Backend", graph: "Graph") -> "GraphPlan | bool":
        """The plan of split ``k`` for ``graph``, made when its memory is new; NO_PLANS where
        the backend has none (it then computes the graph directly)."""
        key = (id(backend), memory_key(graph))
        plans = self._plans.setdefault(k, OrderedDict())
        plan = plans.get(key)
        if plan is not None:
            plans.move_to_end(key)
            return plan
        try:
            plan = backend.graph_plan_create(graph)
        except UnsupportedError:
            plan = NO_PLANS
        plans[key] = plan
        while len(plans) > self.keep:
            _, dropped = plans.popitem(last=False)
            _free(dropped)
        return plan

    def clear(self) -> None:
        """Free every plan."""
        for plans in self._plans.values():
            for plan in plans.values():
                _free(plan)
        self._plans.clear()


def _free(plan: "GraphPlan | bool") -> None:
    if plan is not NO_PLANS and not plan.backend.closed:
        plan.backend.graph_plan_free(plan)
