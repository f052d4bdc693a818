"""A decode step's plan launched as one CUDA graph instead of a kernel call at a time.

Replaying a plan from Python costs each node its launch (about 8 µs on the host for a raw
kernel, 11 µs for a CuPy array kernel, on an H200's host): a 1B-class decode step of 155 nodes
spent 2.7 ms enqueuing. Captured once with CuPy's stream capture, the same step is one graph
launch of about 10 µs. What a bound call does on the GPU changes between steps only through
memory (the token ids, positions, KV cell indices and masks are written into the same input
tensors each step; a plan's memory key, runtime/sched_plans.py, is the same exactly when the
bytes it binds are; what a call derives on the host from its op's parameters is uploaded when
it is bound, never when it runs), so a graph replays a plan as faithfully as its calls do.

As in ggml-cuda: graphs for steps of one token only (a product of more columns, a prompt, runs
call by call: its kernels dwarf its launches, and cuBLAS may allocate while it runs), a plan
replayed call by call on its first compute (CuPy compiles its array kernels and grows its
memory pool there, which a capture must not see), captured on its second, launched whole
after that. A plan whose capture fails (a call that waits for the GPU or copies from pageable
host memory cannot be captured) runs call by call from then on. ``POLYDEV_CUDA_GRAPHS=0``
turns graphs off (ggml's GGML_CUDA_DISABLE_GRAPHS).

Memory a call allocates while captured (CuPy's array kernels take their temporaries from the
memory pool) belongs to the graph, which writes it at every launch: it is held with the graph
and released with it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

from polydev.device import BoundCall, GraphPlan
from polydev.env import env_int
from polydev.inflight import KernelErrorFlags
from polydev.ops import Op

if TYPE_CHECKING:
    from polydev.device import Backend
    from polydev.graph import Graph

log = logging.getLogger(__name__)

GRAPHS_ENV = "POLYDEV_CUDA_GRAPHS"
WARMUP_COMPUTES = 1            # computes call by call before a plan is captured


def graphs_enabled() -> bool:
    """Whether plans become CUDA graphs (``POLYDEV_CUDA_GRAPHS``: 1, the default, or 0)."""
    return env_int(GRAPHS_ENV) == 1


def one_token_step(graph: "Graph") -> bool:
    """Whether every product of ``graph`` multiplies single columns (one token; a batch of
    matrices, as the heads of DeepSeek's absorbed attention, still one column each): the
    steps ggml-cuda captures."""
    for node in graph.nodes:
        if node.op == Op.MUL_MAT and node.src[1].ne[1] > 1:
            return False
        if node.op == Op.MUL_MAT_ID and node.src[1].ne[2] > 1:
            return False
    return True


class CapturedPlan(GraphPlan):
    """A plan that becomes a CUDA graph after its warm-up computes (``capturable``)."""

    def __init__(self, backend: "Backend", graph: "Graph", calls: list[BoundCall],
                 capturable: bool) -> None:
        super().__init__(backend, graph, calls)
        self.capturable = capturable
        self.computes = 0                  # computes call by call so far
        self.cuda_graph: Any = None        # cupy.cuda.Graph once captured
        self.memory: list[Any] = []        # what the calls allocated while captured
        self.checks_indices = False        # whether a captured kernel sets an error flag

    def release(self) -> None:
        """Drop the graph and its memory (the stream must have finished with them)."""
        self.cuda_graph = None
        self.memory = []


class GraphCapture:
    """Captures calls into a graph on one stream and launches plans: CuPy's stream capture
    (``cupy``: the module, or the tests' stand-in with the same few names)."""

    def __init__(self, cupy: Any, stream: Any, errors: KernelErrorFlags) -> None:
        self.cupy = cupy
        self.stream = stream
        self.errors = errors

    def compute(self, plan: CapturedPlan) -> None:
        """Queue one compute of ``plan`` on the stream (the device and stream current)."""
        if plan.cuda_graph is None and plan.capturable and plan.computes >= WARMUP_COMPUTES:
            self._capture(plan)
        if plan.cuda_graph is None:
            plan.computes += 1
            for call in plan.calls:
                call()
            return
        plan.cuda_graph.launch(self.stream)
        if plan.checks_indices:
            self.errors.launched()         # the flags are read at the next synchronize

    def _capture(self, plan: CapturedPlan) -> None:
        """Capture the plan's calls; a plan that cannot be captured is never tried again."""
        errors, pending = self.errors, self.errors.pending
        errors.pending = False
        try:
            plan.cuda_graph, plan.memory = self.capture(plan.calls)
            plan.checks_indices = errors.pending
        except Exception as e:              # nothing ran: the plan runs call by call instead
            plan.capturable = False
            log.debug("%s: a plan of %d calls runs call by call: its capture failed (%s: %s)",
                      plan.backend.name, len(plan.calls), type(e).__name__, e)
        finally:
            errors.pending = pending

    def capture(self, calls: Sequence[Callable[[], None]]) -> tuple[Any, list[Any]]:
        """The graph of ``calls`` (queued on the stream while it captures, so nothing runs)
        and the memory they allocated meanwhile, which the graph's launches write."""
        cupy, stream = self.cupy, self.stream
        pool = cupy.get_default_memory_pool()
        memory: list[Any] = []

        def allocate(size: int) -> Any:
            chunk = pool.malloc(size)
            memory.append(chunk)
            return chunk
        with cupy.cuda.using_allocator(allocate):
            # relaxed: CuPy may grow its pool (cudaMalloc) while the calls are captured
            stream.begin_capture(cupy.cuda.runtime.streamCaptureModeRelaxed)
            try:
                for call in calls:
                    call()
            except BaseException:
                _end_quietly(stream)
                raise
            graph = stream.end_capture()
        return graph, memory


def _end_quietly(stream: Any) -> None:
    """End a capture a call broke (CUDA reports it invalidated; that is known already)."""
    try:
        stream.end_capture()
    except Exception:
        pass
