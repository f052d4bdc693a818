"""The scheduler's placement passes and split formation (ggml_backend_sched_split_graph).

``plan_splits`` assigns every node, source and leaf of a graph to a backend with ggml's five passes
(ggml-backend.c's, in its order), keeping the cause of each choice ("1.wgt0", "2.sup", ...), moves
the cheap ops at a boundary between backends to where they copy fewer bytes (``sched_boundary``;
"4.cut"), then cuts the node list into splits, one backend each, and lists the sources each split
must have copied onto its backend. It reads the graph and never changes it: where ggml rewrites
``node.src[j]`` to a copy, the plan records the copy and the scheduler's own node twins use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from .buffer import BufferType, BufferUsage
from .errors import GraphError
from .ops import VIEW_OPS, Op
from .sched_boundary import fewer_copies
from .tensor import Tensor, TensorFlag

if TYPE_CHECKING:
    from .device import Backend
    from .graph import Graph

MAX_SPLIT_INPUTS = 30       # GGML_SCHED_MAX_SPLIT_INPUTS: a soft limit per split


@dataclass
class Split:
    """Consecutive nodes [i_start, i_end) of the graph that run on one backend."""

    backend_id: int
    i_start: int
    i_end: int = 0
    inputs: list[Tensor] = field(default_factory=list)   # sources copied onto this backend
    reads_from: set[int] = field(default_factory=set)    # backends whose memory it reads as is


class Assignment:
    """Backend ids and causes keyed by tensor (ggml's hv_tensor_backend_ids)."""

    def __init__(self) -> None:
        self._ids: dict[int, tuple[Tensor, int, str]] = {}

    def get(self, t: Tensor | None) -> int:
        if t is None:
            return -1
        entry = self._ids.get(id(t))
        return entry[1] if entry is not None else -1

    def cause(self, t: Tensor) -> str:
        entry = self._ids.get(id(t))
        return entry[2] if entry is not None else ""

    def set(self, t: Tensor, backend_id: int, cause: str) -> None:
        self._ids[id(t)] = (t, backend_id, cause)

    def remapped(self, mapping: dict[int, Tensor]) -> "Assignment":
        """The assignments of the tensors ``mapping`` names (id(old) -> new), onto the new."""
        other = Assignment()
        for old_id, (_, backend_id, cause) in self._ids.items():
            new = mapping.get(old_id)
            if new is not None:
                other.set(new, backend_id, cause)
        return other

    def copy(self) -> "Assignment":
        other = Assignment()
        other._ids = dict(self._ids)
        return other


class SplitPlanner:
    """Runs the passes for one graph over the scheduler's backends and buffer types."""

    def __init__(self, backends: Sequence["Backend"], bufts: Sequence[BufferType],
                 op_offload: bool, user: Assignment) -> None:
        self.backends, self.bufts, self.op_offload = backends, bufts, op_offload
        self.last = len(backends) - 1
        self.ids = user.copy()             # user assignments are never overwritten
        self._supports: dict[tuple[int, int], bool] = {}

    # --- helpers ------------------------------------------------------------------------------

    def supports_op(self, b: int, t: Tensor) -> bool:
        key = (b, id(t))
        hit = self._supports.get(key)
        if hit is None:
            hit = self._supports[key] = self.backends[b].supports_op(t)
        return hit

    def buffer_supported(self, t: Tensor, b: int) -> bool:
        """Backend ``b`` can use ``t`` where it is (or where its backend will put it)."""
        buf = (t.buffer if t.buffer is not None else
            (t.view_src.buffer if t.view_src is not None else None))
        if buf is not None:
            buft = buf.buft
        else:
            owner = self.ids.get(t)
            if owner == -1 and t.view_src is not None:
                owner = self.ids.get(t.view_src)
            if owner == -1:
                return False
            buft = self.bufts[owner]
        return self.backends[b].supports_buft(buft)

    def _backend_from_buffer(self, t: Tensor, op: Tensor) -> int:
        buf = t.buffer if t.buffer is not None else t.view_src.buffer
        for b, backend in enumerate(self.backends):
            if backend.supports_buft(buf.buft) and self.supports_op(b, op):
                return b
        return -1

    def _set_if_supported(self, t: Tensor, b: int, cause: str) -> bool:
        if self.supports_op(b, t):
            self.ids.set(t, b, cause)
            return True
        return False

    # --- pass 1: pre-allocated tensors, graph inputs, weights ---------------------------------

    def _from_current(self, t: Tensor) -> tuple[int, str]:
        allocated = t.buffer is not None or (t.view_src is not None
                                             and t.view_src.buffer is not None)
        if allocated:
            b = self._backend_from_buffer(t, t)
            if b < 0:
                buf = t.buffer or t.view_src.buffer
                raise GraphError(f"tensor {t.name or '<unnamed>'} ({t.op.name}) lives in "
                                 f"{buf.name}, and no backend of the scheduler can run it "
                                 f"there")
            return b, "1.dst" if t.buffer is not None else "1.vsrc"
        if t.flags & TensorFlag.INPUT:
            return self.last, "1.inp"
        if t.op in (Op.ROPE, Op.FLASH_ATTN_EXT):   # freq factors / sinks are too small to decide
            return -1, ""
        for j, src in enumerate(t.src):
            if src is None or src.buffer is None or src.buffer.usage != BufferUsage.WEIGHTS:
                continue
            b = self._backend_from_buffer(src, t)
            if self.op_offload and b == self.last and src.buffer.is_host:
                for hi in range(self.last):
                    if self.supports_op(hi, t) and self.backends[hi].offload_op(t):
                        return hi, "1.off"
            return b, f"1.wgt{j}"
        return -1, ""

    def pass1(self, graph: "Graph") -> None:
        for t in list(graph.leafs) + list(graph.nodes):
            if self.ids.get(t) == -1:
                b, cause = self._from_current(t)
                if b != -1:
                    self.ids.set(t, b, cause)

    # --- pass 2: spread assignments over neighbouring nodes ----------------------------------

    def _expand(self, nodes: Sequence[Tensor], carry_cpu: bool) -> None:
        cur = -1
        for node in nodes:
            if node.op in VIEW_OPS:
                continue
            b = self.ids.get(node)
            if b != -1:
                cur = -1 if (b == self.last and not carry_cpu) else b
            elif cur != -1:
                self._set_if_supported(node, cur, "2.sup")

    def pass2(self, graph: "Graph") -> None:
        nodes = graph.nodes
        self._expand(nodes, carry_cpu=False)            # 2a: accelerators down
        self._expand(nodes[::-1], carry_cpu=False)      # 2b: accelerators up
        self._expand(nodes, carry_cpu=True)             # 2c: the rest down
        self._expand(nodes[::-1], carry_cpu=True)       # 2d: the rest up

    # --- pass 3: the best backend for what is left; upgrades within one buffer type ----------

    def pass3(self, graph: "Graph") -> None:
        for node in graph.nodes:
            if node.op in VIEW_OPS:
                continue
            cur = self.ids.get(node)
            srcs = [s for s in node.src if s is not None]
            if cur == -1:
                best_count = -1
                for b in range(len(self.backends)):
                    if not self.supports_op(b, node):
                        continue
                    count = sum(1 for s in srcs
                                if (self.ids.get(s) != -1 or self.ids.get(s.view_src) != -1)
                                and self.buffer_supported(s, b))
                    if count > best_count:
                        best_count = count
                        self.ids.set(node, b, "3.best")
                continue
            if self.ids.cause(node) == "usr":      # the user's choice is never moved
                continue
            for b in range(cur):
                if (self.bufts[b] is self.bufts[cur] and self.supports_op(b, node) and
                        all(self.buffer_supported(s, b) for s in srcs)):
                    self.ids.set(node, b, "3.upg")
                    break

    # --- pass 4: sources and views follow their consumers ------------------------------------

    def pass4(self, graph: "Graph") -> None:
        for node in graph.nodes:
            cur = self.ids.get(node)
            if node.view_src is not None and cur == -1:
                cur = self.ids.get(node.view_src)
                if cur != -1:
                    self.ids.set(node, cur, "4.vsrc")
            for src in node.src:
                if src is None or self.ids.get(src) != -1:
                    continue
                if src.view_src is not None and self.ids.get(src.view_src) != -1:
                    self.ids.set(src, self.ids.get(src.view_src), "4.vsrc")
                elif cur != -1:
                    self.ids.set(src, cur, "4.cur")
            if cur == -1:
                for b in range(len(self.backends)):
                    if self._set_if_supported(node, b, "4.sup"):
                        break
                else:
                    raise GraphError(f"no backend of the scheduler supports {node.op.name} "
                                     f"of {node.name!r} (the CPU backend comes last and has "
                                     f"no kernel for it either)")
        for leaf in graph.leafs:            # a leaf nothing reads lives on the CPU
            if self.ids.get(leaf) == -1:
                self.ids.set(leaf, self.last, "4.leaf")

    # --- pass 5: splits and the inputs to copy ------------------------------------------------

    def pass5(self, graph: "Graph") -> list[Split]:
        nodes = graph.nodes
        first = next((i for i, n in enumerate(nodes) if n.op not in VIEW_OPS), None)
        if first is None:       # only views: one split on the CPU computes nothing
            return [Split(self.last, 0, len(nodes))]
        split = Split(self.ids.get(nodes[first]), 0)
        splits = [split]
        copied: set[tuple[int, int]] = set()        # (tensor id, backend) with a copy
        for i in range(first, len(nodes)):
            node = nodes[i]
            if node.op in VIEW_OPS:
                continue
            b = self.ids.get(node)
            if b != split.backend_id or (split.inputs and self._needs_new_split(node, split,
                                                                                 copied)):
                split.i_end = i
                split = Split(b, i)
                splits.append(split)
            for src in node.src:
                if src is None:
                    continue
                sb = self.ids.get(src)
                if sb == split.backend_id:
                    continue
                if self.buffer_supported(src, split.backend_id):
                    split.reads_from.add(sb)       # read in place: ordered, not copied
                elif (id(src), split.backend_id) not in copied:
                    copied.add((id(src), split.backend_id))
                    split.inputs.append(src)
        split.i_end = len(nodes)
        return splits

    def _needs_new_split(self, node: Tensor, split: Split, copied: set) -> bool:
        for src in node.src:
            if src is None:
                continue
            sb = self.ids.get(src)
            # foreign weights: a new split lets the copies of earlier weights be reused
            if (src.buffer is not None and src.buffer.usage == BufferUsage.WEIGHTS and
                    sb != split.backend_id and not self.buffer_supported(src, split.backend_id)):
                return True
            if (len(split.inputs) >= MAX_SPLIT_INPUTS and sb != split.backend_id and
                    (id(src), split.backend_id) not in copied and
                    not self.buffer_supported(src, split.backend_id)):
                return True
        return False


def plan_splits(backends: Sequence["Backend"], bufts: Sequence[BufferType], op_offload: bool,
                user: Assignment, graph: "Graph") -> tuple[Assignment, list[Split]]:
    """Every tensor's backend (with causes) and the splits of ``graph``."""
    planner = SplitPlanner(backends, bufts, op_offload, user)
    planner.pass1(graph)
    planner.pass2(graph)
    planner.pass3(graph)
    planner.pass4(graph)
    fewer_copies(planner, graph)
    return planner.ids, planner.pass5(graph)
