"""Placing tensors in buffers: ggml's tensor_alloc and view_init, the bump allocator,
alloc_ctx_tensors, and the graph allocator that lets a graph's intermediate tensors share
compute memory (ggml_gallocr)."""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from .buffer import Buffer, BufferType, BufferUsage, MultiBuffer
from .chunk_alloc import ChunkAllocator, align_up
from .context import Context
from .device import Backend
from .lifetime import Resource
from .errors import AllocationError, InvalidArgumentError, NotAllocatedError
from .graph import Graph
from .ops import INPLACE_OPS, Op
from .tensor import Tensor, TensorFlag

log = logging.getLogger(__name__)


def tensor_alloc(buffer: Buffer, t: Tensor, offset: int) -> None:
    """Place the non-view tensor ``t`` at byte ``offset`` of ``buffer``."""
    if t.buffer is not None:
        raise AllocationError(f"tensor {t.name or '<unnamed>'} is already allocated in "
                              f"{t.buffer.name}")
    if t.view_src is not None:
        raise AllocationError(f"tensor {t.name or '<unnamed>'} is a view; use view_init")
    size = buffer.alloc_size(t)
    if offset < 0 or offset + size > buffer.size:
        raise AllocationError(f"tensor {t.name or '<unnamed>'} ({size} bytes at offset {offset}) "
                              f"does not fit buffer {buffer.name} of {buffer.size} bytes")
    t.buffer, t.offset = buffer, offset
    buffer.init_tensor(t)


def view_init(t: Tensor) -> None:
    """Point the view ``t`` at its (allocated) source's memory."""
    src = t.view_src
    if src is None:
        raise AllocationError(f"tensor {t.name or '<unnamed>'} is not a view")
    if src.buffer is None:
        raise NotAllocatedError(f"view {t.name or '<unnamed>'}: its source "
                                f"{src.name or '<unnamed>'} is not allocated")
    t.buffer, t.offset = src.buffer, src.offset + t.view_offs
    src.buffer.init_tensor(t)


class TensorAllocator:
    """A bump allocator over one buffer: tensors are placed one after another, never freed."""

    def __init__(self, buffer: Buffer) -> None:
        self.buffer = buffer
        self.alignment = buffer.alignment
        self.offset = 0

    def alloc(self, t: Tensor) -> None:
        """Place ``t`` at the next aligned offset of the buffer."""
        size = align_up(self.buffer.alloc_size(t), self.alignment)
        if self.offset + size > self.buffer.size:
            raise AllocationError(
                f"not enough space in buffer {self.buffer.name} for {t.name or '<unnamed>'}: "
                f"needed {size} bytes, {self.buffer.size - self.offset} of {self.buffer.size} left")
        tensor_alloc(self.buffer, t, self.offset)
        self.offset += size


def _buft_of(target: Backend | BufferType) -> BufferType:
    return target.default_buffer_type if isinstance(target, Backend) else target


def _ranges(ctx: Context, buft: BufferType) -> list[tuple[int, int, int]]:
    """Split ctx's tensors into (first, last+1, bytes) ranges that fit buft's max size."""
    ranges, start, cur = [], 0, 0
    for i, t in enumerate(ctx.tensors):
        if t.buffer is not None or t.view_src is not None:
            continue
        size = align_up(buft.alloc_size(t), buft.alignment)
        if cur > 0 and cur + size > buft.max_size:
            ranges.append((start, i, cur))
            start, cur = i, 0
        cur += size
    ranges.append((start, len(ctx.tensors), cur))
    return ranges


def alloc_ctx_tensors_size(ctx: Context, target: Backend | BufferType) -> int:
    """Bytes ``alloc_ctx_tensors`` would allocate."""
    return sum(n for _, _, n in _ranges(ctx, _buft_of(target)))


def alloc_ctx_tensors(ctx: Context, target: Backend | BufferType) -> Buffer | None:
    """Allocate every unallocated tensor of ``ctx`` in new buffers of ``target``'s buffer type.

    A new buffer starts whenever the next tensor would pass the type's max size (a tensor larger
    than the max size gets a buffer of its own); several buffers come back as a MultiBuffer.
    Returns None when there is nothing to allocate. On failure nothing stays allocated.
    """
    buft = _buft_of(target)
    ranges = [r for r in _ranges(ctx, buft) if r[2] > 0]
    if not ranges:
        _init_views(ctx.tensors)
        return None
    buffers: list[Buffer] = []
    placed: list[Tensor] = []
    try:
        for first, last, size in ranges:
            buf = buft.alloc_buffer(size)
            buffers.append(buf)
            talloc = TensorAllocator(buf)
            for t in ctx.tensors[first:last]:
                if t.buffer is None and t.view_src is None:
                    talloc.alloc(t)
                    placed.append(t)
                elif t.buffer is None and t.view_src is not None and t.view_src.buffer is not None:
                    view_init(t)
                    placed.append(t)
        _init_views(ctx.tensors)
    except Exception:
        for t in placed:
            t.buffer, t.offset = None, 0
        for b in buffers:
            b.close()
        raise
    return buffers[0] if len(buffers) == 1 else MultiBuffer(buffers)


def _init_views(tensors: list[Tensor]) -> None:
    for t in tensors:
        if t.buffer is None and t.view_src is not None and t.view_src.buffer is not None:
            view_init(t)


# --- the graph allocator (ggml_gallocr) ---------------------------------------------------------

class _Slot(NamedTuple):
    """Where the reservation put one tensor: ggml's tensor_alloc record."""

    buffer_id: int
    chunk: int
    offset: int
    size_max: int        # the tensor's alloc size when reserved; a larger one needs a new plan


class _Liveness:
    """A tensor's state while a graph's execution is simulated (ggml's hash_node)."""

    __slots__ = ("allocated", "buffer_id", "chunk", "has_output_view", "n_children", "n_views",
                 "offset")

    def __init__(self) -> None:
        self.n_children = 0
        self.n_views = 0
        self.buffer_id = -1
        self.chunk = -1
        self.offset = -1
        self.allocated = False   # placed by this simulation and not yet freed
        self.has_output_view = False


_UNSEEN = object()
# graphs whose placements stay recorded: a server alternates its decode graph with prompt
# graphs of a few shapes, and simulating one again took 10-20 ms each time it came back
_REPLAYS_KEPT = 16


class _Plan(NamedTuple):
    """A reservation: a slot (or None: a view or pre-allocated) per node, source and leaf, and
    the size of every chunk per allocator."""

    nodes: list[tuple[_Slot | None, tuple[_Slot | None, ...]]]
    leafs: list[_Slot | None]
    chunk_sizes: list[list[int]]


class GraphAllocator(Resource):
    """Places a graph's tensors in compute buffers that its intermediate results share.

    ggml's ``ggml_gallocr``. Reserving simulates the graph's execution in node order: a tensor
    gets memory when it is first needed and gives it back once its last consumer and its last
    view have run, and ops that ggml lets run in place take over their source's memory when the
    source has no other use. Graph inputs (``TensorFlag.INPUT``) are placed first, so no two
    overlap; graph outputs (``TensorFlag.OUTPUT``) are never freed or reused; views take no
    memory and keep their source alive; tensors that already have a buffer of their own
    (weights, caches) are left where they are.

    ``buffer_types`` are indexed by buffer id. Identical buffer types (the same object) share
    one allocator and one set of buffers, as in ggml. Each allocator owns up to 16 chunk
    buffers of usage COMPUTE, each at most the type's ``max_size`` unless a single tensor is
    larger. Buffers only grow. Tensors this allocator placed are re-placed by the next
    ``alloc_graph``, so the same graph can be allocated, computed and allocated again.

    Three deliberate differences from ggml: a node runs in place only over memory of its own
    buffer type; the source of an OUTPUT view is kept alive like an output itself; and a node
    may run in place of a view that starts its source's memory, a rule ggml states but never
    applies.
    """

    def __init__(self, buffer_types: BufferType | Sequence[BufferType]) -> None:
        bufts = [buffer_types] if isinstance(buffer_types, BufferType) else list(buffer_types)
        if not bufts:
            raise InvalidArgumentError("a graph allocator needs at least one buffer type")
        self.buffer_types = bufts
        self._allocator_of: list[int] = []        # buffer id -> allocator index
        self._allocators: list[ChunkAllocator] = []
        distinct: list[BufferType] = []
        for buft in bufts:
            for j, known in enumerate(distinct):
                if known is buft:
                    self._allocator_of.append(j)
                    break
            else:
                distinct.append(buft)
                self._allocator_of.append(len(self._allocators))
                self._allocators.append(ChunkAllocator(buft.alignment, buft.max_size))
        self._distinct_bufts = distinct
        # per allocator: its chunk buffers, or None before the first reservation
        self._chunks: list[list[Buffer] | None] = [None] * len(self._allocators)
        self._own_buffers: weakref.WeakSet[Buffer] = weakref.WeakSet()
        self._plan: _Plan | None = None
        # the recorded placements of recent graphs, by _Replay.key; valid while the chunk
        # buffers they name are this allocator's (a reallocation forgets them all)
        self._replays: OrderedDict[tuple, _Replay] = OrderedDict()
        self._states: dict[Tensor, _Liveness] = {}

    # --- public API --------------------------------------------------------------------------

    def reserve(self, graph: Graph, node_buffer_ids: Sequence[int] | None = None,
                leaf_buffer_ids: Sequence[int] | None = None) -> None:
        """Plan ``graph``'s memory and make the buffers large enough for it, computing nothing.

        ``node_buffer_ids[i]`` / ``leaf_buffer_ids[i]`` name the buffer type of node/leaf i
        (default: buffer 0). Reserving the largest graph a program will run (e.g. the longest
        batch) sizes the buffers once; later graphs that fit are allocated without growing.
        Raises AllocationError if a buffer cannot be allocated; the allocator then holds no
        reservation (and no buffers for the failed type).
        """
        self._check_open()
        plan = self._simulate(graph, node_buffer_ids, leaf_buffer_ids)
        self._plan = None
        for a, sizes in enumerate(plan.chunk_sizes):
            self._grow(a, sizes)
        self._plan = plan

    def reserve_sizes(self, graph: Graph, node_buffer_ids: Sequence[int] | None = None,
                      leaf_buffer_ids: Sequence[int] | None = None) -> list[int]:
        """Bytes per buffer id that ``reserve`` would need for ``graph``; allocates nothing and
        leaves the current reservation as it is. A buffer id sharing an earlier id's buffer
        type reports 0."""
        self._check_open()
        plan = self._simulate(graph, node_buffer_ids, leaf_buffer_ids)
        return self._per_buffer_id([sum(sizes) for sizes in plan.chunk_sizes])

    def alloc_graph(self, graph: Graph) -> bool:
        """Give every tensor of ``graph`` that has no memory of its own its reserved place.

        Reserves first when there is no reservation or ``graph`` no longer fits it (a different
        node or leaf count, a tensor larger than reserved, a tensor that was pre-allocated
        before and is not now). That happens automatically with one buffer type; with several,
        the buffer ids are unknown, so it returns False and the caller must call ``reserve``
        with explicit ids. Returns True once the graph is allocated.

        Allocating one of the last 16 graphs again (the same node and leaf tensors) replays
        the placements recorded then, without checking sizes again: a tensor's shape does not
        change after it is created. A new reservation may move tensors, so create backend
        graph plans after ``alloc_graph``.
        """
        self._check_open()
        key = _Replay.key(graph)
        replay = self._replays.get(key)
        if replay is not None and replay.matches(graph):
            self._replays.move_to_end(key)
            replay.run(self._chunks)
            return True
        replay = self._replay_for(graph, self._plan) if self._plan is not None else None
        if replay is None:
            if len(self.buffer_types) > 1:
                log.debug("graph allocator: the graph does not fit the reservation; call "
                          "reserve with buffer ids")
                return False
            log.debug("graph allocator: reserving again for %s", graph)
            self.reserve(graph)
            replay = self._replay_for(graph, self._plan)
            assert replay is not None, "a graph must fit its own reservation"
        self._replays[key] = replay
        while len(self._replays) > _REPLAYS_KEPT:
            self._replays.popitem(last=False)
        replay.run(self._chunks)
        return True

    def buffer_size(self, buffer_id: int) -> int:
        """Bytes allocated for ``buffer_id``: the sum of its chunks; 0 when it shares an
        earlier buffer id's buffer type (ggml_gallocr_get_buffer_size)."""
        if not 0 <= buffer_id < len(self.buffer_types):
            raise InvalidArgumentError(f"buffer id {buffer_id} is not in 0..."
                                       f"{len(self.buffer_types) - 1}")
        sizes = [sum(b.size for b in chunks or ()) for chunks in self._chunks]
        return self._per_buffer_id(sizes)[buffer_id]

    def chunk_buffers(self, buffer_id: int) -> list[Buffer]:
        """The backend buffers that hold ``buffer_id``'s tensors (shared between ids of one
        buffer type)."""
        return list(self._chunks[self._allocator_of[buffer_id]] or ())

    def owns(self, t: Tensor) -> bool:
        """Whether ``t`` lives in memory this allocator placed it in (so it may move)."""
        return t.buffer is not None and t.buffer in self._own_buffers

    def _free(self) -> None:
        """Free every buffer; tensors placed in them can no longer be used."""
        for chunks in self._chunks:
            for b in chunks or ():
                b.close()
        self._chunks = [None] * len(self._allocators)
        self._plan = None
        self._replays.clear()

    def __repr__(self) -> str:
        sizes = ", ".join(f"{b.name}: {self.buffer_size(i)}"
                          for i, b in enumerate(self.buffer_types))
        return f"GraphAllocator({sizes})"

    # --- reservation: simulating the graph's execution ------------------------------------

    def _simulate(self, graph: Graph, node_ids: Sequence[int] | None,
                  leaf_ids: Sequence[int] | None) -> _Plan:
        node_ids = self._check_ids(node_ids, graph.n_nodes, "node")
        leaf_ids = self._check_ids(leaf_ids, graph.n_leafs, "leaf")
        for a in self._allocators:
            a.reset()
        self._states = {}
        try:
            for leaf, bid in zip(graph.leafs, leaf_ids):
                self._allocate(leaf, bid)
            self._count_uses(graph, node_ids)
            for node, bid in zip(graph.nodes, node_ids):
                for parent in node.src:
                    if parent is not None:
                        self._allocate(parent, bid)
                self._allocate(node, bid)
                self._release_parents(node)
            return self._record(graph)
        finally:
            self._states = {}

    def _check_ids(self, ids: Sequence[int] | None, n: int, what: str) -> Sequence[int]:
        if ids is None:
            return [0] * n
        if len(ids) != n:
            raise InvalidArgumentError(f"graph allocator: {len(ids)} {what} buffer ids for a "
                                       f"graph of {n} {what}s")
        bad = [i for i in ids if not 0 <= i < len(self.buffer_types)]
        if bad:
            raise InvalidArgumentError(f"graph allocator: {what} buffer id {bad[0]} is not in "
                                       f"0...{len(self.buffer_types) - 1}")
        return ids

    def _state(self, t: Tensor) -> _Liveness:
        s = self._states.get(t)
        if s is None:
            s = self._states[t] = _Liveness()
        return s

    def _preallocated(self, t: Tensor) -> bool:
        return t.buffer is not None and not self.owns(t)

    def _count_uses(self, graph: Graph, node_ids: Sequence[int]) -> None:
        """Count each tensor's consumers and views; place graph inputs before anything else."""
        for node, bid in zip(graph.nodes, node_ids):
            # op NONE views are the scheduler's dependency markers, not real uses
            if node.view_src is not None and node.op != Op.NONE:
                self._state(node.view_src).n_views += 1
            if node.flags & TensorFlag.INPUT:
                self._allocate(node, bid)
            self._pin_output_view(node)
            for src in node.src:
                if src is not None:
                    self._pin_output_view(src)
                    self._state(src).n_children += 1
                    if src.flags & TensorFlag.INPUT:
                        self._allocate(src, bid)

    def _pin_output_view(self, t: Tensor) -> None:
        # ggml protects only tensors flagged OUTPUT, so an output view's memory could be
        # handed out again once the view's consumers ran; we keep its source alive instead
        if t.view_src is not None and t.flags & TensorFlag.OUTPUT:
            self._state(t.view_src).has_output_view = True

    def _is_output(self, t: Tensor) -> bool:
        return bool(t.flags & TensorFlag.OUTPUT) or self._state(t).has_output_view

    def _allocate(self, t: Tensor, buffer_id: int) -> None:
        s = self._state(t)
        if s.allocated or t.view_src is not None or self._preallocated(t):
            return
        s.allocated = True
        a = self._allocator_of[buffer_id]
        if t.op in INPLACE_OPS and self._reuse_parent(t, s, a):
            return
        s.buffer_id = buffer_id
        s.chunk, s.offset = self._allocators[a].alloc(self.buffer_types[buffer_id].alloc_size(t))

    def _reuse_parent(self, node: Tensor, s: _Liveness, allocator: int) -> bool:
        """Take over the memory of a source whose last use is ``node`` (in-place).

        Only memory of the node's own buffer type qualifies: ggml would also hand a node the
        memory of another buffer type (the scheduler never lets that happen, but a direct
        caller with several buffer ids would get a node placed on the wrong device).
        """
        for parent in node.src:
            if parent is None:
                continue
            p = self._state(parent)
            if not p.allocated and parent.view_src is None:
                continue                       # pre-allocated: not ours to reuse
            if self._is_output(parent) or (
                    parent.view_src is not None and self._is_output(parent.view_src)):
                continue
            if not node.same_layout(parent) or p.n_children != 1 or p.n_views != 0:
                continue
            owner = parent if parent.view_src is None else parent.view_src
            o = self._state(owner)
            # a view can pass on its source's memory only when it is that source's only view,
            # starts at its first byte, and the source has no other consumer. (ggml states this
            # rule but its ownership check, made on the view itself, never lets it apply.)
            if owner is not parent and not (o.allocated and o.n_views == 1 and
                                             o.n_children == 0 and parent.view_offs == 0):
                continue
            if self._allocator_of[o.buffer_id] != allocator:
                continue
            s.buffer_id, s.chunk, s.offset = o.buffer_id, o.chunk, o.offset
            o.allocated = False
            p.allocated = False                # the node frees this memory, not the parent
            self._free_extra_space(node, s, owner)
            return True
        return False

    def _free_extra_space(self, node: Tensor, s: _Liveness, owner: Tensor) -> None:
        """Give back the end of ``owner``'s memory that the smaller ``node`` does not use."""
        alloc = self._allocators[self._allocator_of[s.buffer_id]]
        buft = self.buffer_types[s.buffer_id]
        owner_size = align_up(buft.alloc_size(owner), alloc.alignment)
        node_size = align_up(buft.alloc_size(node), alloc.alignment)
        if owner_size > node_size:
            alloc.free(s.chunk, s.offset + node_size, owner_size - node_size)

    def _free_tensor(self, t: Tensor) -> None:
        if self._is_output(t):
            return
        s = self._states[t]
        alloc = self._allocators[self._allocator_of[s.buffer_id]]
        alloc.free(s.chunk, s.offset, self.buffer_types[s.buffer_id].alloc_size(t))
        s.allocated = False

    def _release_parents(self, node: Tensor) -> None:
        """``node`` has run: free each source whose last consumer and last view it was."""
        for parent in node.src:
            if parent is None:
                continue
            p = self._states[parent]
            p.n_children -= 1
            if p.n_children or p.n_views:
                continue
            if parent.view_src is not None:
                o = self._state(parent.view_src)
                o.n_views -= 1
                if o.n_views == 0 and o.n_children == 0 and o.allocated:
                    self._free_tensor(parent.view_src)
            elif p.allocated:
                self._free_tensor(parent)

    def _record(self, graph: Graph) -> _Plan:
        def slot(t: Tensor | None) -> _Slot | None:
            if t is None or t.view_src is not None or self._preallocated(t):
                return None
            s = self._states[t]
            return _Slot(s.buffer_id, s.chunk, s.offset,
                         self.buffer_types[s.buffer_id].alloc_size(t))

        nodes = [(slot(n), tuple(slot(src) for src in n.src)) for n in graph.nodes]
        leafs = [slot(t) for t in graph.leafs]
        return _Plan(nodes, leafs, [a.chunk_sizes for a in self._allocators])

    # --- buffers -----------------------------------------------------------------------------

    def _grow(self, a: int, sizes: list[int]) -> None:
        """Give allocator ``a`` chunk buffers of at least ``sizes`` (reallocating if any
        chunk must grow; a type with no tensors still gets an empty list, as views need it)."""
        old = self._chunks[a]
        if (old is not None and len(sizes) <= len(old) and
                all(n <= b.size for n, b in zip(sizes, old))):
            return
        buft = self._distinct_bufts[a]
        self._replays.clear()           # they name the buffers about to be freed
        if old:
            log.debug("graph allocator: reallocating %s from %.2f MiB to %.2f MiB", buft.name,
                      sum(b.size for b in old) / 2**20, sum(sizes) / 2**20)
            for b in old:
                b.close()
        self._chunks[a] = None
        chunks: list[Buffer] = []
        try:
            for size in sizes:
                buf = buft.alloc_buffer(size)
                buf.usage = BufferUsage.COMPUTE
                chunks.append(buf)
        except AllocationError as e:
            for b in chunks:
                b.close()
            raise AllocationError(f"graph allocator: cannot allocate {buft.name} compute "
                                  f"buffers of {sum(sizes) / 2**20:.2f} MiB "
                                  f"({len(sizes)} chunks): {e}") from e
        self._own_buffers.update(chunks)
        self._chunks[a] = chunks

    def _per_buffer_id(self, sizes: list[int]) -> list[int]:
        seen: set[int] = set()
        out = []
        for a in self._allocator_of:
            out.append(0 if a in seen else sizes[a])
            seen.add(a)
        return out

    def _describe(self) -> str:
        return "this graph allocator"

    # --- allocation from a reservation -------------------------------------------------------

    def _replay_for(self, graph: Graph, plan: _Plan) -> _Replay | None:
        """The placements ``plan`` gives ``graph``'s tensors, or None when ``graph`` does not
        fit it (ggml_gallocr_needs_realloc): other node or leaf counts, a tensor larger than
        its slot, or one that was pre-allocated when planned and is not now.

        Like ggml, slots are matched by position (leaf i; node i and its source j). A tensor met
        again must meet the same slot, which also catches a graph whose structure changed while
        its counts did not (ggml would place such a graph wrongly). Placements keep ggml's
        order, each tensor once; views follow their source wherever it is when replayed.
        """
        if len(plan.nodes) != graph.n_nodes or len(plan.leafs) != graph.n_leafs:
            return None
        own, bufts = self._own_buffers, self.buffer_types
        chunks, allocator_of = self._chunks, self._allocator_of
        placements: list[tuple[Tensor, Tensor | None, Buffer | None, int]] = []
        first: dict[int, _Slot | None] = {}
        visits = [((leaf,), (slot,)) for leaf, slot in zip(graph.leafs, plan.leafs)]
        for node, (dst, srcs) in zip(graph.nodes, plan.nodes):
            if len(node.src) != len(srcs):
                return None
            visits.append(((*node.src, node), (*srcs, dst)))
        for tensors, slots in visits:
            for t, slot in zip(tensors, slots):
                if t is None:
                    continue
                seen = first.get(id(t), _UNSEEN)
                if seen is not _UNSEEN:
                    if seen != slot:
                        return None
                    continue
                first[id(t)] = slot
                if t.buffer is not None and t.buffer not in own:
                    continue                                  # pre-allocated: left alone
                if t.view_src is not None:
                    placements.append((t, t.view_src, None, t.view_offs))
                elif slot is None or bufts[slot.buffer_id].alloc_size(t) > slot.size_max:
                    return None
                else:
                    buf = chunks[allocator_of[slot.buffer_id]][slot.chunk]
                    placements.append((t, None, buf, slot.offset))
        return _Replay(graph, placements)


class _Replay:
    """A graph's placements, recorded once and replayed by every later ``alloc_graph`` of the
    same graph: the steady state of a decode loop costs one assignment per tensor."""

    def __init__(self, graph: Graph,
                 placements: list[tuple[Tensor, Tensor | None, Buffer | None, int]]) -> None:
        self.nodes, self.leafs = list(graph.nodes), list(graph.leafs)
        self.placements = placements
        # buffers whose backend keeps per-tensor state need init_tensor after every reset
        self.needs_init = any(type(b)._init_tensor is not Buffer._init_tensor or
                              type(b)._reset is not Buffer._reset
                              for _, _, b, _ in placements if b is not None)

    @staticmethod
    def key(graph: Graph) -> tuple:
        """What finds a graph's replay: its counts and its first and last tensors (a replay
        holds its tensors, so their ids cannot be reused while it is kept); ``matches``
        then compares every tensor."""
        ends = (id(graph.nodes[0]), id(graph.nodes[-1])) if graph.nodes else ()
        first_leaf = id(graph.leafs[0]) if graph.leafs else None
        return graph.n_nodes, graph.n_leafs, first_leaf, *ends

    def matches(self, graph: Graph) -> bool:
        return graph.nodes == self.nodes and graph.leafs == self.leafs

    def run(self, chunks: list[list[Buffer] | None]) -> None:
        if self.needs_init:
            for bufs in chunks:
                for b in bufs or ():
                    b.reset()
        for t, root, buf, offset in self.placements:
            if root is None:
                t.buffer, t.offset = buf, offset
            else:                           # a view: where its source is now
                buf = root.buffer
                t.buffer, t.offset = buf, (root.offset + offset if buf is not None else 0)
            if self.needs_init and buf is not None:
                buf.init_tensor(t)
