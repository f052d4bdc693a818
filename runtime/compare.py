"""Copying a graph to another backend, and comparing two backends node by node.

``graph_copy`` and ``compare_graph_backend`` follow ggml's ``ggml_backend_graph_copy`` and
``ggml_backend_compare_graph_backend``: the copy holds every node and, through sources and view
sources, every tensor they read, with the original's data; the comparison computes each node
alone on both backends (view ops compute nothing and are not reported) and hands both results
to a callback, which may stop the walk early by returning False. They work on any allocated
graph, a one-op test case or a whole model layer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from .alloc import alloc_ctx_tensors, view_init
from .buffer import Buffer, tensor_copy
from .context import Context
from .device import Backend
from .errors import AllocationError, GraphError, NotAllocatedError
from .graph import Graph
from .lifetime import Resource
from .ops import VIEW_OPS
from .tensor import Tensor

__all__ = ["GraphCopy", "graph_copy", "compare_graph_backend", "CompareCallback"]

log = logging.getLogger(__name__)

CompareCallback = Callable[[int, Tensor, Tensor], bool]
"""``callback(node_index, tensor_on_backend1, tensor_on_backend2)``; False stops the walk."""


@dataclass
class GraphCopy(Resource):
    """A graph deep-copied onto a backend: free it with ``close()`` (or use ``with``).

    ``ctx_allocated`` holds the copies of non-view tensors (they live in ``buffer``),
    ``ctx_unallocated`` the copies of views; ``graph`` has the copied nodes in the original
    order. ``copy_of(t)`` finds the copy of an original tensor.
    """

    buffer: Buffer | None
    ctx_allocated: Context
    ctx_unallocated: Context
    graph: Graph
    _copies: dict[int, Tensor] = field(default_factory=dict, repr=False)

    def copy_of(self, original: Tensor) -> Tensor:
        """The copy of ``t`` (a tensor of the original graph)."""
        try:
            return self._copies[id(original)]
        except KeyError:
            raise GraphError(f"tensor {original.name or '<unnamed>'} is not part of the copied "
                             f"graph") from None

    def _free(self) -> None:
        """Free the copy's buffer."""
        if self.buffer is not None:
            self.buffer.close()
            self.buffer = None


def _dependencies(t: Tensor) -> list[Tensor]:
    deps = [s for s in t.src if s is not None]
    if t.view_src is not None:
        deps.append(t.view_src)
    return deps


def _closure(roots: Iterable[Tensor]) -> list[Tensor]:
    """Every tensor the roots reach through sources and view sources, dependencies first.

    Iterative, so a graph of thousands of chained nodes needs no deep recursion.
    """
    order: list[Tensor] = []
    seen: set[int] = set()
    for root in roots:
        stack: list[tuple[Tensor, bool]] = [(root, False)]
        while stack:
            t, expanded = stack.pop()
            if expanded:
                order.append(t)
                continue
            if id(t) in seen:
                continue
            seen.add(id(t))
            stack.append((t, True))
            stack.extend((d, False) for d in reversed(_dependencies(t)) if id(d) not in seen)
    return order


def _duplicate(t: Tensor, copies: dict[int, Tensor], ctx_allocated: Context,
               ctx_unallocated: Context) -> Tensor:
    """A tensor with ``t``'s layout, op and flags over the copies of its sources."""
    if t.buffer is None:
        raise NotAllocatedError(f"graph_copy needs an allocated graph: tensor "
                                f"{t.name or '<unnamed>'} ne={list(t.ne)} has no buffer")
    view_src = copies[id(t.view_src)] if t.view_src is not None else None
    c = Tensor(t.type, t.ne, t.nb, t.op, view_src=view_src, view_offs=t.view_offs, name=t.name)
    c.op_params = t.op_params
    c.flags = t.flags
    c.src = [copies[id(s)] if s is not None else None for s in t.src]
    (ctx_unallocated if view_src is not None else ctx_allocated).tensors.append(c)
    return c


def graph_copy(backend: Backend, graph: Graph) -> GraphCopy:
    """Copy ``graph`` (an allocated graph) and the data of every tensor it reaches to ``backend``.

    Non-view tensors get one new buffer of the backend's default buffer type (split into a
    multi-buffer beyond its max size); views point into the copies of their sources. On failure
    nothing stays allocated and the error propagates.
    """
    ctx_allocated, ctx_unallocated = Context("graph_copy"), Context("graph_copy views")
    copies: dict[int, Tensor] = {}
    order = _closure(graph.nodes)
    for t in order:
        copies[id(t)] = _duplicate(t, copies, ctx_allocated, ctx_unallocated)
    buffer = alloc_ctx_tensors(ctx_allocated, backend)
    try:
        for t in order:
            c = copies[id(t)]
            if c.view_src is not None:
                view_init(c)
            else:
                tensor_copy(t, c)
    except Exception:
        if buffer is not None:
            buffer.close()
        raise
    copied = Graph(graph.size)
    for node in graph.nodes:
        copied.add_node(copies[id(node)])
    return GraphCopy(buffer, ctx_allocated, ctx_unallocated, copied, copies)


def compare_graph_backend(backend1: Backend, backend2: Backend, graph: Graph,
                          callback: CompareCallback,
                          test_nodes: Sequence[Tensor] | None = None) -> bool:
    """Compute ``graph`` (allocated on ``backend1``) on both backends and compare as it goes.

    The graph is first copied to ``backend2`` with its current data. Without ``test_nodes``
    each node is computed alone on both backends, in graph order, and every node that is not
    a view op is passed to ``callback(i, t1, t2)``; the walk stops when the callback returns
    False. With ``test_nodes`` (fused kernels) both whole graphs are computed and only those
    nodes are passed to the callback. Returns False only when the copy could not be allocated,
    as ggml does.
    """
    try:
        copy = graph_copy(backend2, graph)
    except AllocationError as e:
        log.error("compare_graph_backend: cannot copy the graph to %s: %s", backend2.name, e)
        return False
    with copy:
        g1, g2 = graph, copy.graph
        if test_nodes:
            _compare_whole_graphs(backend1, backend2, g1, g2, callback, test_nodes)
            return True
        for i, (t1, t2) in enumerate(zip(g1.nodes, g2.nodes)):
            backend1.graph_compute(g1.view(i, i + 1))
            backend2.graph_compute(g2.view(i, i + 1))
            if t1.op in VIEW_OPS:
                continue
            if not callback(i, t1, t2):
                break
    return True


def _compare_whole_graphs(backend1: Backend, backend2: Backend, g1: Graph, g2: Graph,
                          callback: CompareCallback, test_nodes: Sequence[Tensor]) -> None:
    backend1.graph_compute(g1)
    backend2.graph_compute(g2)
    wanted = {id(t) for t in test_nodes}
    hits = [i for i, t in enumerate(g1.nodes) if id(t) in wanted]
    if not hits:
        raise GraphError("compare_graph_backend: none of the test nodes is a node of the graph")
    for i in hits:
        callback(i, g1.nodes[i], g2.nodes[i])
