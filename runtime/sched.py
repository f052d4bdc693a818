"""``Scheduler``: one graph across several backends (ggml_backend_sched).

Backends are given in priority order, the CPU last. ``alloc_graph`` places every tensor
(``sched_split.plan_splits``: ggml's five passes), cuts the graph into splits of one backend
each, and allocates the splits' memory plus a copy, on each split's backend, of every source
that lives elsewhere. ``compute`` then runs the splits in order, copying their inputs with
asynchronous device copies where both backends can, ordered by events.

Differences from ggml, on purpose:
- the caller's graph is never changed: the scheduler computes twins of its nodes whose sources
  point at the copies, and gives each original node its twin's memory;
- a graph with the same structure as the last one (same ops, shapes, strides and weights)
  reuses the last placement and splits without running the passes again, and a new graph of
  the allocated one's structure takes over its whole step (twins, memory, bound plans);
- a decode step's cheap ops at a boundary between backends move to where fewer bytes cross
  (``sched_boundary``);
- an eval callback that returns False cancels the rest of the compute, every split;
- every tensor keeps the cause of its placement (``placement(t)``), printed with
  ``POLYDEV_SCHED_DEBUG=1`` (splits) or ``=2`` (every node);
- ``trace()`` records each copy and compute and writes Chrome trace JSON.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

from .alloc import GraphAllocator
from .buffer import BufferType, tensor_copy
from .context import Context
from .device import Backend, DeviceType, Event, tensor_copy_async
from .env import env_int
from .errors import AllocationError, InvalidArgumentError, PolydevError
from .graph import DEFAULT_GRAPH_SIZE, Graph
from .lifetime import Resource
from .ops import VIEW_OPS, Op
from .sched_plans import NO_PLANS, SplitPlans
from .sched_split import Assignment, Split, plan_splits
from .tensor import Tensor, TensorFlag

__all__ = ["Scheduler", "EvalCallback", "MAX_BACKENDS", "MAX_COPIES"]

log = logging.getLogger(__name__)

MAX_BACKENDS = 16
MAX_COPIES = 4
# graphs whose placements (and bound plans) stay ready: speculative decoding alternates a
# decode graph with verification graphs, a server its decode graphs with prompt graphs of a
# few padded shapes, and re-placing each took 20-40 ms each time it came back
_GRAPHS_KEPT = 16
DEBUG_ENV = "POLYDEV_SCHED_DEBUG"      # 1: print the splits; 2: and every node's placement

EvalCallback = Callable[[Tensor, bool], bool]
"""``cb(t, ask)``: with ask=True, return whether you want ``t``'s value; with ask=False the
value is ready (synchronized), and returning False cancels the rest of the compute."""


@dataclass
class _Step:
    """What one compute runs: the splits, their twin graphs and their input copies."""

    splits: list[Split]
    graphs: list[Graph]                       # each split's twin nodes
    originals: list[list[Tensor]]             # each split's caller's nodes (for callbacks)
    copies: dict[tuple[int, int], list[Tensor]]   # (id(src), backend) -> copy per slot
    resolve: dict[int, Tensor]                # id(original node) -> its twin
    ids: Assignment
    planned: Graph          # the graph whose tensors the fields name (but ``originals``)
    planned_size: tuple[int, int]             # its nodes and leafs when it was planned
    # a graph of the same structure that took the step over (Scheduler._took_over_allocated)
    # and, made when first asked, id(its tensor) -> the planned graph's tensor in its place
    caller: Graph | None = None
    _names: dict[int, Tensor] | None = field(default=None, repr=False)

    def named(self, t: Tensor) -> Tensor:
        """The tensor of the planned graph that ``t`` stands for (``t`` itself if planned)."""
        if self.caller is None:
            return t
        if self._names is None:
            self._names = _correspondence(self.caller, self.planned)
        return self._names.get(id(t), t)


class Scheduler(Resource):
    """Runs graphs over ``backends`` (priority order; the last must be a CPU device)."""

    def __init__(self, backends: Sequence[Backend],
                 buffer_types: Sequence[BufferType] | None = None,
                 graph_size: int = DEFAULT_GRAPH_SIZE, parallel: bool = False,
                 op_offload: bool = True) -> None:
        backends = list(backends)
        if not 1 <= len(backends) <= MAX_BACKENDS:
            raise InvalidArgumentError(f"a scheduler takes 1 to {MAX_BACKENDS} backends, got "
                                       f"{len(backends)}")
        if backends[-1].device.type != DeviceType.CPU:
            raise InvalidArgumentError(f"the last backend of a scheduler must be a CPU device "
                                       f"(the fallback for every op); got {backends[-1].name}")
        if buffer_types is None:
            bufts = [b.default_buffer_type for b in backends]
        else:
            bufts = list(buffer_types)
        if len(bufts) != len(backends):
            raise InvalidArgumentError(f"{len(bufts)} buffer types for {len(backends)} backends")
        for b, buft in zip(backends, bufts):
            if not b.supports_buft(buft):
                raise InvalidArgumentError(f"backend {b.name} cannot use buffer type "
                                           f"{buft.name}")
        self.backends, self.bufts = backends, bufts
        self.graph_size, self.op_offload = graph_size, op_offload
        self.n_copies = MAX_COPIES if parallel else 1
        self.events: list[list[Event | None]] = [
            [b.device.event_new() if parallel else None for _ in range(self.n_copies)]
            for b in backends]
        self.galloc = GraphAllocator(bufts)
        self.debug = env_int(DEBUG_ENV)
        self._user = Assignment()
        self._step: _Step | None = None
        self._signature: list | None = None
        self._last_graph: Graph | None = None      # the graph the signature belongs to
        self._last_step: _Step | None = None       # and its placement
        # (id of a graph, copy slot) -> (the graph, its size, its step)
        self._kept: OrderedDict[tuple[int, int], tuple[Graph, tuple[int, int], _Step]]
        self._kept = OrderedDict()
        self._allocated_graph: Graph | None = None
        self._allocated_size = (0, 0)
        self._plans = SplitPlans(keep=self.n_copies * _GRAPHS_KEPT)
        self._step_plans: list = []       # each split's plan for the allocated graph
        self.cur_copy = 0
        self._next_copy = 0
        self._callback: EvalCallback | None = None
        self._trace: list[dict] | None = None
        # bytes copied into each backend's splits since the scheduler was made (per name)
        self.copied_bytes: dict[str, int] = {}
        self._trace_done: list[dict] = []

    # --- public API -----------------------------------------------------------------------------

    @property
    def n_backends(self) -> int:
        """How many backends the scheduler places ops on."""
        return len(self.backends)

    @property
    def n_splits(self) -> int:
        """How many splits the last allocated graph was cut into."""
        return len(self._step.splits) if self._step is not None else 0

    def splits_per_backend(self) -> dict[str, int]:
        """How many splits of the last allocated graph run on each backend, by name."""
        counts = {b.name: 0 for b in self.backends}
        for split in (self._step.splits if self._step is not None else []):
            counts[self.backends[split.backend_id].name] += 1
        return counts

    def backend_id(self, backend: Backend) -> int:
        """The index of ``backend`` in the scheduler's priority list."""
        for i, b in enumerate(self.backends):
            if b is backend:
                return i
        raise InvalidArgumentError(f"backend {backend.name} is not one of this scheduler's")

    def buffer_type(self, backend: Backend) -> BufferType:
        """The compute buffer type the scheduler uses for ``backend``."""
        return self.bufts[self.backend_id(backend)]

    def buffer_size(self, backend: Backend) -> int:
        """Compute-buffer bytes reserved for ``backend`` (a buffer type shared with an earlier
        backend is counted there)."""
        return self.galloc.buffer_size(self.backend_id(backend))

    def set_tensor_backend(self, t: Tensor, backend: Backend) -> None:
        """Pin ``t`` to ``backend``: every later placement keeps it (until ``reset``)."""
        self._user.set(t, self.backend_id(backend), "usr")
        self._signature = None
        self._kept.clear()
        self._allocated_graph = None            # the next alloc_graph places again

    def get_tensor_backend(self, t: Tensor) -> Backend | None:
        """The backend ``t`` was placed on (or pinned to), or None."""
        if self._step is None:
            b = self._user.get(t)
        else:
            b = self._step.ids.get(self._step.named(t))
        return self.backends[b] if b != -1 else None

    def placement(self, t: Tensor) -> tuple[str, str] | None:
        """(backend name, cause) of ``t`` in the last placement, e.g. ("OpenCL0", "1.wgt0")."""
        if self._step is None:
            return None
        t = self._step.named(t)
        b = self._step.ids.get(t)
        return None if b == -1 else (self.backends[b].name, self._step.ids.cause(t))

    def set_eval_callback(self, callback: EvalCallback | None) -> None:
        """Call ``callback`` around nodes (see EvalCallback); None removes it."""
        self._callback = callback

    def reset(self) -> None:
        """Forget the placement, the allocation and the user's pinned tensors."""
        self._user = Assignment()
        self._step = None
        self._signature = None
        self._last_graph = self._last_step = None
        self._kept.clear()
        self._allocated_graph = None
        self._plans.clear()
        self._step_plans = []

    def reserve(self, graph: Graph) -> None:
        """Size the compute buffers for ``graph`` (the largest one a program will run)."""
        self._check_open()
        self._sync_backends()
        step = self._plan(graph)
        sched_graph, node_ids, leaf_ids = self._allocation_graph(step)
        self.galloc.reserve(sched_graph, node_ids, leaf_ids)

    def alloc_graph(self, graph: Graph) -> None:
        """Place and allocate ``graph``: every node gets memory on its backend.

        Allocating again the graph that is allocated (the same object, no node or leaf added
        since) keeps everything as it is: a decode loop that computes one graph with new
        inputs pays nothing here, as ggml's graph reuse does. A new graph of the allocated
        graph's structure (a loop that builds one per step) takes over its step: its tensors
        get their counterparts' memory, and nothing is placed or allocated again."""
        self._check_open()
        size = (graph.n_nodes, graph.n_leafs)
        if self.n_copies == 1 and graph is self._allocated_graph and size == self._allocated_size:
            return
        self.cur_copy = self._next_copy
        self._next_copy = (self._next_copy + 1) % self.n_copies
        step = self._kept_step(graph)
        if step is None:
            signature = _signature(graph)
            if self.n_copies == 1 and self._took_over_allocated(graph, signature):
                return
            step = self._remembered(graph, self._plan(graph, signature))
        sched_graph, node_ids, leaf_ids = self._allocation_graph(step)
        if not self.galloc.alloc_graph(sched_graph):
            self._sync_backends()          # the copy slots stay as they are
            self.galloc.reserve(sched_graph, node_ids, leaf_ids)
            if not self.galloc.alloc_graph(sched_graph):
                raise AllocationError("the scheduler could not allocate the graph")
        self._give_memory(graph, step)
        self._step = step
        self._allocated_graph = graph
        self._allocated_size = (graph.n_nodes, graph.n_leafs)
        self._step_plans = [None] * len(step.splits)   # found (or made) on first compute
        if self.debug:
            self._print_splits(step)

    def compute(self, graph: Graph) -> bool:
        """Compute ``graph`` and wait; False when an eval callback cancelled it."""
        done = self.compute_async(graph)
        self.synchronize()
        return done

    def compute_async(self, graph: Graph) -> bool:
        """Queue ``graph``'s splits (allocating it first unless it is the allocated graph)."""
        self._check_open()
        if graph is not self._allocated_graph:
            self.alloc_graph(graph)
        return self._compute_splits()

    def synchronize(self) -> None:
        """Wait for every backend; without an allocated graph, pipelining restarts at slot 0."""
        self._check_open()
        self._sync_backends()
        if self._allocated_graph is None:
            self._next_copy = 0

    def _sync_backends(self) -> None:
        for b in self.backends:
            b.synchronize()

    def _free(self) -> None:
        """Wait for the backends, then free the plans, events and compute buffers (the
        backends stay the caller's)."""
        for b in self.backends:
            if not b.closed:
                try:
                    b.synchronize()
                except PolydevError as e:     # a lost remote device: free the rest
                    log.warning("closing the scheduler: %s", e)
        self._plans.clear()
        for row in self.events:
            for e in row:
                if e is not None:
                    e.close()
        self.galloc.close()

    def _describe(self) -> str:
        return "the scheduler"

    # --- tracing --------------------------------------------------------------------------------

    @contextmanager
    def trace(self) -> Iterator[list[dict]]:
        """Record every copy and compute inside the ``with`` (each synchronized to time it)."""
        self._trace = []
        try:
            yield self._trace
        finally:
            self._trace_done, self._trace = self._trace, None

    def write_trace(self, path: str, events: list[dict] | None = None) -> None:
        """Chrome trace JSON (chrome://tracing, ui.perfetto.dev): one row per backend."""
        events = events if events is not None else self._trace_done
        rows = [{"name": e["name"], "cat": e["kind"], "ph": "X", "pid": 0,
                 "tid": e["backend"], "ts": e["start_us"], "dur": e["end_us"] - e["start_us"],
                 "args": {"bytes": e["bytes"]}} for e in events]
        with open(path, "w") as f:
            json.dump({"traceEvents": rows, "displayTimeUnit": "ms"}, f)

    def _record(self, kind: str, name: str, backend: Backend, nbytes: int,
                run: Callable[[], None]) -> None:
        if self._trace is None:
            run()
            return
        start = time.perf_counter()
        run()
        backend.synchronize()
        end = time.perf_counter()
        self._trace.append({"kind": kind, "name": name, "backend": backend.name,
                            "bytes": nbytes, "start_us": start * 1e6, "end_us": end * 1e6})

    # --- planning -------------------------------------------------------------------------------

    def _kept_step(self, graph: Graph) -> _Step | None:
        """``graph``'s placement if kept from an earlier allocation of the same graph object
        (no node or leaf added since) in the same copy slot (a step's twins read the slot
        it was built for)."""
        key = (id(graph), self.cur_copy)
        kept = self._kept.get(key)
        if (kept is not None and kept[0] is graph and kept[1] == (graph.n_nodes, graph.n_leafs)
                and _planned_intact(kept[2])):
            self._kept.move_to_end(key)
            return kept[2]
        return None

    def _remembered(self, graph: Graph, step: _Step) -> _Step:
        """``step``, kept as ``graph``'s placement in the current copy slot."""
        self._kept[(id(graph), self.cur_copy)] = (graph, (graph.n_nodes, graph.n_leafs), step)
        while len(self._kept) > _GRAPHS_KEPT * self.n_copies:
            self._kept.popitem(last=False)
        return step

    def _took_over_allocated(self, graph: Graph, signature: list) -> bool:
        """Give ``graph`` the allocated graph's step when it has the same structure (a loop
        that builds a new graph each step, as llama.cpp rebuilds its decode graph): its
        nodes and leafs take the memory their counterparts in the planned graph have, and the
        twins, their copies, their memory and their bound plans stay as they are. Nothing is
        placed, built or allocated again: the step only learns the new graph's names for the
        planned tensors (placements) and its nodes (callbacks). False, changing nothing, for
        a graph of another structure (``signature``) or where the allocated step is not the
        last one planned."""
        old_graph, old = self._allocated_graph, self._step
        if (old_graph is None or old is not self._last_step or old_graph is not self._last_graph
                or signature != self._signature or not _planned_intact(old)):
            return False
        originals = [graph.nodes[split.i_start:split.i_end] for split in old.splits]
        step = replace(old, originals=originals, caller=graph, _names=None)
        self._give_memory(graph, step)
        self._step = self._last_step = self._remembered(graph, step)
        self._allocated_graph = self._last_graph = graph
        self._allocated_size = (graph.n_nodes, graph.n_leafs)
        if self.debug:
            self._print_splits(step)
        return True

    @staticmethod
    def _give_memory(graph: Graph, step: _Step) -> None:
        """The caller's nodes share their twins' memory; the leafs of a graph that took over
        another's step share their counterparts' in the planned graph (an input that the
        allocator placed; one the caller allocated is at the same bytes, as the signature
        says)."""
        planned = step.planned
        for node, planned_node in zip(graph.nodes, planned.nodes):
            twin = step.resolve[id(planned_node)]
            node.buffer, node.offset = twin.buffer, twin.offset
        if planned is not graph:
            for leaf, planned_leaf in zip(graph.leafs, planned.leafs):
                leaf.buffer, leaf.offset = planned_leaf.buffer, planned_leaf.offset

    def _plan(self, graph: Graph, signature: list | None = None) -> _Step:
        if graph.n_nodes + graph.n_leafs > 2 * self.graph_size:
            raise InvalidArgumentError(f"graph of {graph.n_nodes} nodes and {graph.n_leafs} "
                                       f"leafs exceeds the scheduler's graph size "
                                       f"{self.graph_size}")
        if signature is None:
            signature = _signature(graph)
        if self._last_step is not None and signature == self._signature:
            return self._replan(graph)
        ids, splits = plan_splits(self.backends, self.bufts, self.op_offload, self._user, graph)
        self._signature = signature
        self._last_graph = graph
        self._last_step = self._build_step(graph, ids, splits)
        return self._last_step

    def _replan(self, graph: Graph) -> _Step:
        """The last placement moved onto a graph of the same structure (no passes)."""
        old = self._last_step
        mapping = _correspondence(old.planned, graph)
        ids = old.ids.remapped(mapping)
        splits = _renamed_splits(old.splits, mapping)
        self._last_graph = graph
        self._last_step = self._build_step(graph, ids, splits)
        return self._last_step

    def _build_step(self, graph: Graph, ids: Assignment, splits: list[Split]) -> _Step:
        resolve: dict[int, Tensor] = {}

        def resolved(t: Tensor) -> Tensor:
            return resolve.get(id(t), t)

        copies: dict[tuple[int, int], list[Tensor]] = {}
        for split in splits:
            for src in split.inputs:
                name = src.name or "tensor"
                copies[(id(src), split.backend_id)] = [
                    _layout_copy(src, f"{self.backends[split.backend_id].name}#{name}#{c}",
                                 self.n_copies > 1)
                    for c in range(self.n_copies)]
        graphs, originals = [], []
        for split in splits:
            g = Graph(max(split.i_end - split.i_start, 1))
            def source_for(src: Tensor, b: int = split.backend_id) -> Tensor:
                return self._source_for(src, b, copies, ids, resolved)
            for node in graph.nodes[split.i_start:split.i_end]:
                twin = _twin(node, resolved, source_for)
                resolve[id(node)] = twin
                g.add_node(twin)
            graphs.append(g)
            originals.append(graph.nodes[split.i_start:split.i_end])
        return _Step(splits, graphs, originals, copies, resolve, ids, graph,
                     (graph.n_nodes, graph.n_leafs))

    def _source_for(self, src: Tensor, backend_id: int, copies, ids: Assignment,
                    resolved) -> Tensor:
        """What a twin on ``backend_id`` reads for ``src``: its copy there, or src itself."""
        slots = copies.get((id(src), backend_id))
        if slots is not None and ids.get(src) != backend_id:
            return slots[self.cur_copy]
        return resolved(src)

    def _allocation_graph(self, step: _Step) -> tuple[Graph, list, list]:
        """Input keep-alive views, input copies and twins per split, plus the leaves, for
        the graph ``step`` was planned for."""
        graph = step.planned
        n_inputs = sum(len(s.inputs) for s in step.splits)
        g = Graph(max(graph.n_nodes + 2 * n_inputs * self.n_copies, graph.n_leafs, 1))
        node_ids, leaf_ids = [], []
        ctx = Context("sched")
        for split, twins in zip(step.splits, step.graphs):
            for src in split.inputs:
                source = step.resolve.get(id(src), src)
                keep_alive = ctx.new_view(source, source.ne, source.nb, 0)
                keep_alive.src = [source]          # holds the source until its copy is made
                keep_alive.name = f"{source.name} (input of split)"
                g.add_node(keep_alive)
                node_ids.append(step.ids.get(src))
                g.add_node(step.copies[(id(src), split.backend_id)][self.cur_copy])
                node_ids.append(split.backend_id)
            for twin, node in zip(twins.nodes, graph.nodes[split.i_start:split.i_end]):
                g.add_node(twin)
                node_ids.append(step.ids.get(node))
        if self.n_copies > 1:                       # every slot of every copy stays in memory
            for (src_id, b), slots in step.copies.items():
                for c, slot in enumerate(slots):
                    if c != self.cur_copy:
                        g.leafs.append(slot)
                        leaf_ids.append(b)
        for leaf in graph.leafs:
            g.leafs.append(leaf)
            leaf_ids.append(step.ids.get(leaf) if step.ids.get(leaf) != -1 else
                            len(self.backends) - 1)
        return g, node_ids, leaf_ids

    # --- execution ------------------------------------------------------------------------------

    def _compute_splits(self) -> bool:
        step = self._step
        prev: Backend | None = None
        for k, split in enumerate(step.splits):
            backend = self.backends[split.backend_id]
            event = self.events[split.backend_id][self.cur_copy]
            if not split.inputs and prev is not None and prev is not backend:
                prev.synchronize()             # the allocator may reuse memory across splits
            for b in split.reads_from:         # memory another backend wrote, read in place
                self.backends[b].synchronize()
            self._copy_inputs(split, backend, event)
            if not self._run(k, backend):
                return False
            if event is not None:
                event.record(backend)
            prev = backend
        return True

    def _copy_inputs(self, split: Split, backend: Backend, event: Event | None) -> None:
        step = self._step
        for src in split.inputs:
            self.copied_bytes[backend.name] = self.copied_bytes.get(backend.name, 0) + src.nbytes
            copy = step.copies[(id(src), split.backend_id)][self.cur_copy]
            source = step.resolve.get(id(src), src)
            src_backend = self.backends[step.ids.get(src)]
            if src.flags & TensorFlag.INPUT:     # the user may overwrite it right after
                if not backend.writes_in_stream_order:
                    event.synchronize() if event is not None else backend.synchronize()
                self._record("copy", copy.name, backend, src.nbytes,
                             lambda: tensor_copy(source, copy))
                continue
            if event is not None:
                event.wait(backend)
            elif not backend.writes_in_stream_order:
                backend.synchronize()
            self._record("copy", copy.name, backend, src.nbytes,
                         lambda: tensor_copy_async(src_backend, backend, source, copy))

    def _run(self, k: int, backend: Backend) -> bool:
        graph, originals = self._step.graphs[k], self._step.originals[k]
        if self._callback is None:
            if self._trace is None:             # the replay path: nothing but the plan
                self._compute_planned(k, backend, graph)
                return True
            self._record("compute", f"split {k}", backend, sum(n.nbytes for n in graph.nodes),
                         lambda: self._compute_planned(k, backend, graph))
            return True
        cb, n, j0 = self._callback, graph.n_nodes, 0
        while j0 < n:
            need = cb(originals[j0], True)
            j1 = j0
            while not need and j1 < n - 1:
                j1 += 1
                need = cb(originals[j1], True)
            backend.graph_compute(graph.view(j0, j1 + 1))
            if need and cb(originals[j1], False) is False:
                return False                    # cancels every split, as ggml's header says
            j0 = j1 + 1
        return True

    def _compute_planned(self, k: int, backend: Backend, graph: Graph) -> None:
        plan = self._step_plans[k]
        if plan is None:
            plan = self._step_plans[k] = self._plans.plan(k, backend, graph)
        if plan is NO_PLANS:
            backend.graph_compute_async(graph)
        else:
            backend.graph_plan_compute(plan)

    # --- debugging ------------------------------------------------------------------------------

    def _print_splits(self, step: _Step) -> None:
        graph = step.planned
        out = sys.stderr
        for k, split in enumerate(step.splits):
            inputs = " ".join(f"[{s.name} ({s.nbytes / 1024:.0f}K)]" for s in split.inputs)
            print(f"## SPLIT #{k}: {self.backends[split.backend_id].name} # "
                  f"{len(split.inputs)} inputs: {inputs}", file=out)
            if self.debug < 2:
                continue
            for i in range(split.i_start, split.i_end):
                node = graph.nodes[i]
                srcs = " ".join(
                    f"{s.name} [{self._name_of(step.ids.get(s))} {step.ids.cause(s)}]"
                    for s in node.src if s is not None)
                print(f"node #{i:3d} ({node.op.name:>10}): {node.name} "
                      f"({node.nbytes / 1024:.0f}K) [{self._name_of(step.ids.get(node))} "
                      f"{step.ids.cause(node)}]: {srcs}", file=out)

    def _name_of(self, b: int) -> str:
        return self.backends[b].name if b != -1 else "NULL"


# --- helpers --------------------------------------------------------------------------------------

def _layout_copy(src: Tensor, name: str, pinned: bool) -> Tensor:
    """A tensor with ``src``'s type, shape and strides (ggml_dup_tensor_layout)."""
    t = Tensor(src.type, src.ne, src.nb, Op.NONE, name=name)
    if pinned:      # pipelined copy slots must never share memory
        t.flags |= TensorFlag.INPUT | TensorFlag.OUTPUT
    return t


def _twin(node: Tensor, resolved, source_for) -> Tensor:
    """The scheduler's copy of ``node``: same op and layout, sources as the split reads them."""
    view_src = resolved(node.view_src) if node.view_src is not None else None
    if view_src is not None and view_src.view_src is not None:   # keep views rooted
        view_src, offs = view_src.view_src, view_src.view_offs + node.view_offs
    else:
        offs = node.view_offs
    twin = Tensor(node.type, node.ne, node.nb, node.op, view_src=view_src, view_offs=offs,
                  name=node.name)
    twin.op_params, twin.flags = node.op_params, node.flags
    twin.src = [source_for(s) if s is not None else None for s in node.src]
    if node.op in VIEW_OPS and twin.src and twin.src[0] is not None:
        twin.src[0] = resolved(node.src[0])   # a view reads its source where it is
    return twin


def _tensor_key(t: Tensor) -> tuple:
    buf = t.buffer
    if buf is None:
        return (t.op, t.type, t.ne, t.nb, t.op_params, t.flags, None, None)
    return (t.op, t.type, t.ne, t.nb, t.op_params, t.flags, id(buf), t.offset)


def _signature(graph: Graph) -> list:
    """The structure of ``graph``: equal signatures place and split the same way. A source
    is named by its place in the graph (nodes from 1, leafs from -1), or by its key when it
    is in neither. (Computed for every new graph of a loop that builds one per step, so
    written for speed: one flat tuple a node, a source in the graph looked up, not keyed.)"""
    index = {id(t): i for i, t in enumerate(graph.nodes, 1)}
    index.update({id(t): -i for i, t in enumerate(graph.leafs, 1)})
    place = index.get
    signature = []
    for n in graph.nodes:
        refs = []
        for t in n.src:
            refs.append(None if t is None else place(id(t)) or _tensor_key(t))
        t, buf = n.view_src, n.buffer
        signature.append((n.op, n.type, n.ne, n.nb, n.op_params, n.flags,
                          None if buf is None else id(buf), None if buf is None else n.offset,
                          None if t is None else place(id(t)) or _tensor_key(t), *refs))
    signature += [_tensor_key(leaf) for leaf in graph.leafs]
    return signature


def _planned_intact(step: _Step) -> bool:
    """Whether the graph ``step`` was planned for has no node or leaf added since."""
    return (step.planned.n_nodes, step.planned.n_leafs) == step.planned_size


def _renamed_splits(splits: list[Split], mapping: dict[int, Tensor]) -> list[Split]:
    """``splits`` with their inputs named by the new graph's tensors (``mapping``)."""
    return [Split(s.backend_id, s.i_start, s.i_end, [mapping[id(t)] for t in s.inputs],
                  set(s.reads_from)) for s in splits]


def _correspondence(old: Graph, new: Graph) -> dict[int, Tensor]:
    """id(old tensor) -> the new graph's tensor in the same place."""
    mapping: dict[int, Tensor] = {}
    for a, b in zip(old.nodes, new.nodes):
        mapping[id(a)] = b
        for sa, sb in zip(a.src, b.src):
            if sa is not None:
                mapping[id(sa)] = sb
        if a.view_src is not None:
            mapping[id(a.view_src)] = b.view_src
    for a, b in zip(old.leafs, new.leafs):
        mapping[id(a)] = b
    return mapping
