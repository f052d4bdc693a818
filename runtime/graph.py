"""``Graph``: the nodes of a computation in topological order, and its leafs.

``build_forward_expand`` walks a result's sources depth first, sources in slot order, as
ggml_visit_parents does: a tensor with op NONE (and not a PARAM) is a leaf, anything else a node.
"""

from __future__ import annotations

from typing import Iterator

from .errors import GraphError
from .ops import Op
from .tensor import Tensor, TensorFlag

DEFAULT_GRAPH_SIZE = 2048


class Graph:
    """Nodes and leafs of a forward graph, at most ``size`` of each."""

    def __init__(self, size: int = DEFAULT_GRAPH_SIZE) -> None:
        self.size = size
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._visited: set[int] = set()

    @property
    def n_nodes(self) -> int:
        """How many nodes (computed tensors) the graph has."""
        return len(self.nodes)

    @property
    def n_leafs(self) -> int:
        """How many leafs (inputs and weights) the graph has."""
        return len(self.leafs)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Tensor]:
        return iter(self.nodes)

    def node(self, i: int) -> Tensor:
        """The i-th node; negative indices count from the end (ggml_graph_node)."""
        return self.nodes[i]

    def build_forward_expand(self, tensor: Tensor) -> "Graph":
        """Add ``tensor`` and every not yet visited ancestor, parents before children."""
        visited = self._visited
        if id(tensor) in visited:
            return self
        stack: list[tuple[Tensor, int]] = [(tensor, 0)]
        visited.add(id(tensor))
        while stack:
            t, i = stack.pop()
            srcs = t.src
            while i < len(srcs) and (srcs[i] is None or id(srcs[i]) in visited):
                i += 1
            if i < len(srcs):
                stack.append((t, i + 1))
                visited.add(id(srcs[i]))
                stack.append((srcs[i], 0))
                continue
            self._append(t)
        return self

    def _append(self, t: Tensor) -> None:
        if t.op == Op.NONE and not (t.flags & TensorFlag.PARAM):
            if len(self.leafs) >= self.size:
                raise GraphError(f"graph leaf capacity {self.size} exceeded; create the graph "
                                 f"with a larger size")
            if not t.name:
                t.name = f"leaf_{len(self.leafs)}"
            self.leafs.append(t)
        else:
            if len(self.nodes) >= self.size:
                raise GraphError(f"graph node capacity {self.size} exceeded; create the graph "
                                 f"with a larger size")
            if not t.name:
                t.name = f"node_{len(self.nodes)}"
            self.nodes.append(t)

    def add_node(self, tensor: Tensor) -> "Graph":
        """Append ``tensor`` to the nodes as it is, whatever its op (ggml_graph_add_node).

        Unlike ``build_forward_expand`` this neither visits sources nor sorts op-NONE tensors
        into the leafs: test harnesses use it to make guard tensors part of a compared graph.
        """
        if len(self.nodes) >= self.size:
            raise GraphError(f"graph node capacity {self.size} exceeded; create the graph "
                             f"with a larger size")
        self.nodes.append(tensor)
        self._visited.add(id(tensor))
        return self

    def view(self, i0: int, i1: int) -> "Graph":
        """The nodes [i0, i1) as a graph of their own, without leafs (ggml_graph_view)."""
        if not 0 <= i0 <= i1 <= len(self.nodes):
            raise GraphError(f"node range [{i0}, {i1}) is outside the graph's {len(self.nodes)} "
                             f"nodes")
        g = Graph(max(i1 - i0, 1))
        g.nodes = self.nodes[i0:i1]
        g._visited = {id(t) for t in g.nodes}
        return g

    def __repr__(self) -> str:
        return f"Graph(n_nodes={self.n_nodes}, n_leafs={self.n_leafs}, size={self.size})"


def build_graph(*outputs: Tensor, size: int = DEFAULT_GRAPH_SIZE) -> Graph:
    """A graph computing ``outputs`` (each expanded in order)."""
    g = Graph(size)
    for t in outputs:
        g.build_forward_expand(t)
    return g
