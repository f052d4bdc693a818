"""Graphs and tensors as plain tuples of polydev's own tensor fields, for the trip to an actor.

A graph travels once, when its plan is made: a table of every tensor its nodes reach (sources
before the tensors that use them) and the indices of its nodes. A tensor is ``(type, ne, nb,
op, op_params, sources, view_src, view_offs, buffer_id, offset, name, flags)``: sources and
view_src are indices into the table (-1: none), buffer_id names one of the actor's buffers.
Types and ops travel as their values; op_params as they are (numbers, and polydev's own
enums for the unary and glu functions).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from polydev.graph import Graph
from polydev.ops import Op
from polydev.tensor import Tensor, TensorFlag
from polydev.types import GGMLType

__all__ = ["graph_fields", "graph_from", "loose_node", "loose_tensor", "tensor_shape"]


def tensor_shape(t: Tensor) -> tuple:
    """What a buffer type's alloc_size may read: type, ne, nb, op and op_params."""
    return (int(t.type), tuple(t.ne), tuple(t.nb), int(t.op), tuple(t.op_params))


def loose_tensor(shape: tuple) -> Tensor:
    """A tensor with the shape fields of ``tensor_shape``, in no buffer."""
    type_, ne, nb, op, params = shape
    t = Tensor(GGMLType(type_), ne, nb, Op(op))
    t.op_params = params
    return t


def node_signature(node: Tensor) -> tuple:
    """What a device's supports_op reads: the node's shape fields and its sources'."""
    return (tensor_shape(node),
            tuple(None if s is None else tensor_shape(s) for s in node.src))


def loose_node(signature: tuple) -> Tensor:
    node_shape, src_shapes = signature
    node = loose_tensor(node_shape)
    node.src = [None if s is None else loose_tensor(s) for s in src_shapes]
    return node


def graph_fields(nodes: Sequence[Tensor], buffer_id: Callable[[Tensor], int | None]) -> tuple:
    """(tensor table, node indices) of ``nodes``; ``buffer_id`` gives a tensor's buffer on the
    actor (None: not in its memory)."""
    index: dict[int, int] = {}
    table: list[tuple] = []

    def add(t: Tensor | None) -> int:
        if t is None:
            return -1
        known = index.get(id(t))
        if known is not None:
            return known
        sources = tuple(add(s) for s in t.src)
        view = add(t.view_src)
        table.append((int(t.type), tuple(t.ne), tuple(t.nb), int(t.op), tuple(t.op_params),
                      sources, view, t.view_offs, buffer_id(t), t.offset, t.name, int(t.flags)))
        index[id(t)] = len(table) - 1
        return index[id(t)]

    node_indices = tuple(add(n) for n in nodes)
    return tuple(table), node_indices


def graph_from(fields: tuple, buffers: dict[int, Any]) -> Graph:
    """The graph ``graph_fields`` described, its tensors in the actor's ``buffers``."""
    table, node_indices = fields
    tensors: list[Tensor] = []
    for (type_, ne, nb, op, params, sources, view, view_offs, buf_id, offset, name,
         flags) in table:
        t = Tensor(GGMLType(type_), ne, nb, Op(op),
                   view_src=tensors[view] if view >= 0 else None, view_offs=view_offs,
                   name=name)
        t.op_params = params
        t.src = [tensors[i] if i >= 0 else None for i in sources]
        t.flags = TensorFlag(flags)
        if buf_id is not None:
            t.buffer, t.offset = buffers[buf_id], offset
            t.buffer.init_tensor(t)
        tensors.append(t)
    graph = Graph(max(len(node_indices), 1))
    graph.nodes = [tensors[i] for i in node_indices]
    return graph
