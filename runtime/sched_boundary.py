"""Fewer bytes across a split's boundary: the scheduler's pass between ggml's fourth and fifth.

ggml's passes place an op that has no weight where the expansion of its neighbours reaches it,
which at a boundary between two devices often takes two tensors across where one would do:

- from a GPU to the CPU, the next layer's norm runs on the GPU (it follows the previous layer
  down), so both its output and the residual it normalised cross to the CPU;
- from the CPU to a GPU, the residual add that ends the last CPU layer runs on the GPU (it
  follows the next layer up), so both of its sources cross.

llama.cpp pins its norms to their layer's device for the first case (its graph callback, with
"FIXME: fix in ggml_backend_sched"); this pass fixes both in the scheduler, for any graph:
each elementwise or row op of a few rows (``MAX_ROWS``: a decode step's) that no weight,
input or user placed (``MOVABLE``, causes ``EXPANDED``) moves to the backend of one of its
sources or consumers where that copies fewer bytes across backends, counting a copy that
another reader needs anyway as free. Its cause becomes "4.cut". An op read through a view
stays, so does one that writes into its source's memory (in place: it is a view of it), and
one no other backend runs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from .ops import VIEW_OPS, Op

if TYPE_CHECKING:
    from .graph import Graph
    from .sched_split import SplitPlanner
    from .tensor import Tensor

# cheap ops on activations: moving one never trades a copy for real work on a slower device
MOVABLE = frozenset({Op.ADD, Op.MUL, Op.RMS_NORM, Op.NORM, Op.SCALE})
EXPANDED = frozenset({"2.sup", "3.best"})       # placed by no weight, input or user
# the most rows (ne1 ne2 ne3) of an op that may move: a decode step's activations, as
# llama.cpp pins its norms only for ubatches under 32 tokens (with bench/sched.py's 64 tokens
# over PoCL and the CPU, the moved ops halved the bytes copied and still slowed the step 10%)
MAX_ROWS = 31


def fewer_copies(planner: "SplitPlanner", graph: "Graph") -> None:
    """Move each movable op of ``graph`` to the neighbouring backend where its sources and its
    output cross between backends in the fewest bytes (see the module)."""
    ids = planner.ids
    readers: dict[int, Counter] = defaultdict(Counter)     # id(tensor) -> backend -> nodes
    consumers: dict[int, list] = defaultdict(list)
    viewed: set[int] = set()
    for node in graph.nodes:
        if node.view_src is not None:
            viewed.add(id(node.view_src))
        if node.op in VIEW_OPS:
            continue
        for src in _sources(node):
            readers[id(src)][ids.get(node)] += 1
            consumers[id(src)].append(node)
    for node in graph.nodes:
        if (node.op not in MOVABLE or ids.cause(node) not in EXPANDED or node.nrows > MAX_ROWS
                or id(node) in viewed or node.view_src is not None):
            continue
        here = ids.get(node)
        outs = {ids.get(c) for c in consumers[id(node)]}
        options = ({ids.get(s) for s in _sources(node)} | outs) - {here, -1}

        def cost(b: int) -> int:
            return _bytes_across(planner, node, here, b, readers, outs)
        best = min((b for b in sorted(options) if planner.supports_op(b, node)),
                   key=cost, default=here)
        if best != here and cost(best) < cost(here):
            for src in _sources(node):
                readers[id(src)][here] -= 1
                readers[id(src)][best] += 1
            ids.set(node, best, "4.cut")


def _sources(node: "Tensor") -> list:
    """``node``'s sources, each once."""
    seen: dict[int, Tensor] = {}
    for s in node.src:
        if s is not None:
            seen.setdefault(id(s), s)
    return list(seen.values())


def _bytes_across(planner: "SplitPlanner", node: "Tensor", here: int, b: int,
                  readers: dict[int, Counter], outs: set[int]) -> int:
    """The bytes copied between backends for ``node`` on backend ``b``: each source that must
    cross to ``b`` and that no other node on ``b`` reads, and its output once for each other
    backend that reads it and cannot read ``b``'s memory."""
    total = 0
    for src in _sources(node):
        others_on_b = readers[id(src)][b] - (1 if b == here else 0)
        if planner.ids.get(src) != b and not planner.buffer_supported(src, b) and not others_on_b:
            total += src.nbytes
    buft = planner.bufts[b]
    for c in outs:
        if c != b and not planner.backends[c].supports_buft(buft):
            total += node.nbytes
    return total
