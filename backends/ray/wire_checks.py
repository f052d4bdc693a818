"""What a device actor checks in a graph or shape it receives, before it builds anything.

A graph arrives as the plain tuples of ``wire.py``. Before the actor makes one tensor of it,
every field is checked to be what polydev itself would send: a known type and op, four
dimensions and strides in range (a block type's blocks packed), op parameters that are
numbers, sources and views that name tensors before them, and for a tensor in one of the
actor's buffers, bytes that lie inside that buffer (a view's inside its source's, in the same
buffer). A field that is not raises ``WireError`` naming the tensor and the field; nothing of
the graph is kept. The shapes a device is asked about (``supports_op``, ``alloc_size``) are
checked the same way, and so is a batch of calls (``call_queue.py``): each entry names a call
the actor runs for the driver, with the arguments that call checks itself.
"""

from __future__ import annotations

from numbers import Real
from typing import Any, Mapping

from polydev.errors import WireError
from polydev.ops import Op
from polydev.tensor import Tensor, TensorFlag
from polydev.types import TYPE_TRAITS, GGMLType

from .call_queue import MAX_BATCH

__all__ = ["check_batch", "check_graph_fields", "check_node_signature", "check_shape_fields",
           "is_count"]

MAX_DIM = 1 << 40           # elements along one dimension (ggml's are int64; no device holds more)
MAX_PARAMS = 16             # ggml's GGML_MAX_OP_PARAMS is 64 bytes: 16 int32
MAX_SOURCES = 10            # ggml's GGML_MAX_SRC
MAX_NAME = 256              # ggml truncates at 64; polydev keeps longer names whole
_FIELDS = 12
_TYPES = {int(t) for t in GGMLType}
_OPS = {int(op) for op in Op}
_FLAGS = int(TensorFlag.INPUT | TensorFlag.OUTPUT | TensorFlag.PARAM | TensorFlag.LOSS)


def check_graph_fields(fields: Any, buffers: Mapping[int, Any]) -> None:
    """Raise ``WireError`` unless ``fields`` is a (tensor table, node indices) pair as
    ``wire.graph_fields`` makes, every tensor in range of the ``buffers`` it names."""
    if not (isinstance(fields, tuple) and len(fields) == 2):
        raise WireError("a graph is a (tensors, nodes) pair")
    table, nodes = fields
    if not isinstance(table, tuple) or not isinstance(nodes, tuple):
        raise WireError("a graph's tensors and nodes are tuples")
    spans: list[int] = []
    for i, entry in enumerate(table):
        spans.append(_check_tensor(i, entry, table, spans, buffers))
    for position, index in enumerate(nodes):
        if not _is_int(index) or not 0 <= index < len(table):
            raise WireError(f"node {position} names tensor {index!r}; the graph has "
                            f"{len(table)}")


def check_shape_fields(fields: Any, what: str = "a tensor") -> None:
    """Raise ``WireError`` unless ``fields`` is ``wire.tensor_shape``'s (type, ne, nb, op,
    op_params) of a tensor polydev could send."""
    if not (isinstance(fields, tuple) and len(fields) == 5):
        raise WireError(f"{what}: a shape is (type, ne, nb, op, op_params)")
    _check_shape(what, *fields)


def check_node_signature(signature: Any) -> None:
    """Raise ``WireError`` unless ``signature`` is ``wire.node_signature``'s."""
    if not (isinstance(signature, tuple) and len(signature) == 2
            and isinstance(signature[1], tuple) and len(signature[1]) <= MAX_SOURCES):
        raise WireError("a node's signature is (its shape, its sources' shapes)")
    check_shape_fields(signature[0], "a node")
    for i, source in enumerate(signature[1]):
        if source is not None:
            check_shape_fields(source, f"source {i}")


def check_batch(entries: Any, n_refs: int, runnable: frozenset[str]) -> None:
    """Raise ``WireError`` unless ``entries`` is a list of ``(method, args, slots, values)``
    as ``CallQueue.queue`` makes: a method in ``runnable``, a tuple of arguments, the
    ``(position, ref index)`` of each of the ``n_refs`` arguments resolved before the batch
    ran, and how many values the call answers with."""
    if not (isinstance(entries, list) and 0 < len(entries) <= MAX_BATCH):
        raise WireError(f"a batch is a list of 1 to {MAX_BATCH} calls")
    for i, entry in enumerate(entries):
        if not (isinstance(entry, tuple) and len(entry) == 4):
            raise WireError(f"call {i} of a batch: a call is (method, args, slots, values)")
        method, args, slots, values = entry
        if not (isinstance(method, str) and method in runnable):
            raise WireError(f"call {i} of a batch: {method!r} is not a call a batch runs")
        if not (isinstance(args, tuple) and isinstance(slots, tuple)
                and all(isinstance(s, tuple) and len(s) == 2 for s in slots)):
            raise WireError(f"call {i} of a batch: its arguments and slots are tuples")
        positions = [p for p, _ in slots]
        if not (all(is_count(p) and p <= len(args) + k for k, p in enumerate(positions))
                and positions == sorted(positions)
                and all(_is_int(r) and 0 <= r < n_refs for _, r in slots)):
            raise WireError(f"call {i} of a batch: its slots {slots!r} do not place the "
                            f"batch's {n_refs} resolved arguments")
        if not (is_count(values) and values <= MAX_BATCH):
            raise WireError(f"call {i} of a batch: it answers with a count of values, not "
                            f"{values!r}")


def is_count(value: Any) -> bool:
    """An int of bytes or elements: not a bool, not negative."""
    return _is_int(value) and value >= 0


def _check_tensor(i: int, entry: Any, table: tuple, spans: list[int],
                  buffers: Mapping[int, Any]) -> int:
    """The tensor's byte span, once its fields are found sound."""
    if not isinstance(entry, tuple) or len(entry) != _FIELDS:
        raise WireError(f"tensor {i}: a tensor is a tuple of {_FIELDS} fields")
    (type_, ne, nb, op, params, sources, view, view_offs, buf_id, offset, name,
     flags) = entry
    where = f"tensor {i} ({name!r})" if isinstance(name, str) else f"tensor {i}"
    _check_shape(where, type_, ne, nb, op, params)
    _need(isinstance(sources, tuple) and len(sources) <= MAX_SOURCES
          and all(_is_int(s) and -1 <= s < i for s in sources), where,
          "sources must name tensors before it (-1: none)")
    _need(_is_int(view) and -1 <= view < i, where, "view_src must name a tensor before it")
    _need(isinstance(name, str) and len(name) <= MAX_NAME, where,
          f"the name must be text of at most {MAX_NAME} characters")
    _need(_is_int(flags) and 0 <= flags and flags & ~_FLAGS == 0, where,
          f"flags {flags!r} are not tensor flags")
    span = Tensor(GGMLType(type_), ne, nb, Op(op)).nbytes
    _need(is_count(view_offs), where, "view_offs must be a byte offset")
    if view >= 0:
        _need(view_offs + span <= spans[view], where,
              f"its {span} bytes at view offset {view_offs} pass the end of its view "
              f"source's {spans[view]}")
        _need(buf_id == table[view][8], where, "a view is in its source's buffer")
    if buf_id is not None:
        buffer = buffers.get(buf_id) if _is_int(buf_id) else None
        _need(buffer is not None, where, f"buffer {buf_id!r} is not one of this device's")
        _need(is_count(offset) and offset + span <= buffer.size, where,
              f"its {span} bytes at offset {offset!r} pass the end of its buffer's "
              f"{buffer.size}")
    return span


def _check_shape(where: str, type_: Any, ne: Any, nb: Any, op: Any, params: Any) -> None:
    _need(_is_int(type_) and type_ in _TYPES, where, f"type {type_!r} is not a GGML type")
    _need(_is_int(op) and op in _OPS, where, f"op {op!r} is not one of polydev's ops")
    _need(_dims(ne, 0, MAX_DIM), where, f"ne {ne!r} is not 4 sizes in 0..{MAX_DIM}")
    _need(_dims(nb, 0, MAX_DIM * 64), where, f"nb {nb!r} is not 4 strides")
    traits = TYPE_TRAITS[GGMLType(type_)]
    _need(ne[0] % traits.block_size == 0, where, f"ne[0] = {ne[0]} is not a multiple of its "
          f"type's block of {traits.block_size}")
    _need(traits.block_size == 1 or nb[0] == traits.type_size, where,
          f"nb[0] = {nb[0]}: a block type's rows are its blocks, {traits.type_size} bytes "
          f"apart")
    _need(isinstance(params, tuple) and len(params) <= MAX_PARAMS
          and all(isinstance(p, Real) or _numbers(p) for p in params), where,
          f"op_params must be at most {MAX_PARAMS} numbers or tuples of numbers")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _numbers(values: Any) -> bool:
    """A tuple of at most MAX_PARAMS numbers (a parameter of a few numbers: rope's sections,
    pad's sides)."""
    return (isinstance(values, tuple) and len(values) <= MAX_PARAMS
            and all(isinstance(v, Real) for v in values))


def _dims(values: Any, low: int, high: int) -> bool:
    return (isinstance(values, tuple) and len(values) == 4
            and all(_is_int(v) and low <= v <= high for v in values))


def _need(condition: bool, where: str, what: str) -> None:
    if not condition:
        raise WireError(f"a malformed graph: {where}: {what}")
