"""Running one case in one mode: ``test`` against the CPU reference, ``perf`` and ``support``.

``run_test`` follows test-backend-ops' ``eval``: build the graph with guard tensors, check that
both backends support every tensor, allocate on the backend under test, fill the inputs, then
``compare_graph_backend`` node by node. Each node is checked in ggml's order: guard bytes,
NaN, Inf with sign, then the case's error function against its threshold.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

import numpy as np

from polydev import Backend, BufferUsage, Op, Tensor, alloc_ctx_tensors, build_graph
from polydev.buffer import Buffer, tensor_get
from polydev.compare import compare_graph_backend
from polydev.errors import UnsupportedError
from polydev.ops import op_desc

from .case import Case, CaseContext

log = logging.getLogger(__name__)

FLT_MAX = float(np.finfo(np.float32).max)
PERF_MIN_SECONDS = 1.0      # perf repeats a case until this much time has passed
PERF_BATCH_SECONDS = 0.1    # ... in batches of about this long, synchronizing after each


class Status(enum.Enum):
    OK = "OK"
    FAIL = "FAIL"
    NOT_SUPPORTED = "not supported"


@dataclass
class Result:
    """One line of output: the fields of test-backend-ops' test_result."""

    backend_name: str
    op_name: str
    op_params: str
    test_mode: str
    supported: bool
    passed: bool
    error_message: str = ""
    time_us: float = 0.0
    flops: float = 0.0
    bandwidth_gb_s: float = 0.0
    memory_kb: int = 0
    n_runs: int = 0
    device_description: str = ""
    backend_reg_name: str = ""
    test_time: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())

    @property
    def status(self) -> Status:
        if not self.supported:
            return Status.NOT_SUPPORTED
        return Status.OK if self.passed else Status.FAIL

    @property
    def case_name(self) -> str:
        return f"{self.op_name}({self.op_params})"

    def as_dict(self) -> dict:
        return asdict(self)


def _result(case: Case, backend: Backend, mode: str, supported: bool, passed: bool,
            message: str = "", **figures) -> Result:
    device = backend.device
    return Result(backend.name, case.op, case.vars, mode, supported, passed, message,
                  device_description=device.description,
                  backend_reg_name=device.reg.name if device.reg else "", **figures)


# --- test -----------------------------------------------------------------------------------

def _values(t: Tensor) -> np.ndarray:
    return t.numpy().astype(np.float64, copy=False)


def _inf_or_max(x: np.ndarray) -> np.ndarray:
    return np.isinf(x) | (np.abs(x) == FLT_MAX)


class NodeChecker:
    """The per-node callback of ``compare_graph_backend``; collects every failure message."""

    def __init__(self, case: Case, name1: str, name2: str) -> None:
        self.case = case
        self.name1, self.name2 = name1, name2
        self.messages: list[str] = []

    @property
    def ok(self) -> bool:
        return not self.messages

    def __call__(self, index: int, t1: Tensor, t2: Tensor) -> bool:
        if t1.op == Op.NONE:      # a guard: its bytes must be untouched on both sides
            if not np.array_equal(tensor_get(t1), tensor_get(t2)):
                self.messages.append(f"guard mismatch: {t1.name} (an out-of-bounds write)")
            return True
        message = self._check_values(op_desc(t1), _values(t1), _values(t2), t1)
        if message:
            self.messages.append(message)
        return True

    def _check_values(self, op: str, a: np.ndarray, b: np.ndarray, t1: Tensor) -> str | None:
        n1, n2 = self.name1, self.name2
        nan = np.isnan(a) | np.isnan(b)
        if nan.any():
            i = int(np.flatnonzero(nan.ravel())[0])
            return f"[{op}] NaN at index {i} ({n1}={a.flat[i]:g} {n2}={b.flat[i]:g})"
        inf_a, inf_b = _inf_or_max(a), _inf_or_max(b)
        if (inf_a != inf_b).any():
            i = int(np.flatnonzero((inf_a != inf_b).ravel())[0])
            return f"[{op}] inf mismatch: {n1}={a.flat[i]:g} {n2}={b.flat[i]:g}"
        both = inf_a & inf_b
        if (np.signbit(a) != np.signbit(b))[both].any():
            i = int(np.flatnonzero((both & (np.signbit(a) != np.signbit(b))).ravel())[0])
            return f"[{op}] inf sign mismatch: {n1}={a.flat[i]:g} {n2}={b.flat[i]:g}"
        if both.any():   # equal infinities agree; the error is over the finite values
            a, b = np.where(both, 0.0, a), np.where(both, 0.0, b)
        err = self.case.err(a, b, t1)
        if err > self.case.max_err:
            return f"[{op}] ERR = {err:.9f} > {self.case.max_err:.9f}"
        return None


def unsupported_by(ctx: CaseContext, backends: list[Backend]) -> list[str]:
    """The names of the backends that cannot run some tensor of the case (empty: all can)."""
    tensors = ctx.weights.tensors + ctx.tensors
    names = [b.name for b in backends if not all(b.supports_op(t) for t in tensors)]
    return list(dict.fromkeys(names))


def _allocate(ctx: CaseContext, backend: Backend) -> list[Buffer]:
    buffers = []
    weights = alloc_ctx_tensors(ctx.weights, backend)
    if weights is not None:
        weights.usage = BufferUsage.WEIGHTS
        buffers.append(weights)
    try:
        buf = alloc_ctx_tensors(ctx, backend)
    except Exception:
        for b in buffers:
            b.close()
        raise
    if buf is not None:
        buffers.append(buf)
    return buffers


def run_test(case: Case, backend: Backend, reference: Backend,
             rng: np.random.Generator) -> Result:
    """Compare ``case`` on ``backend`` with the same case on ``reference`` (the CPU)."""
    ctx = CaseContext(guards=True)
    ctx.add_guard(ctx)                       # before the graph's first tensor
    out = case.build(ctx)
    unsupported = unsupported_by(ctx, [backend, reference])
    if unsupported:
        return _result(case, backend, "test", False, False, ", ".join(unsupported))
    ctx.add_guard(ctx)                       # after its last one
    buffers: list[Buffer] = []
    try:
        buffers = _allocate(ctx, backend)
        graph = build_graph(out)
        for guard in ctx.guards:
            graph.add_node(guard)
        ctx.initialize(rng)
        checker = NodeChecker(case, backend.name, reference.name)
        if not compare_graph_backend(backend, reference, graph, checker):
            return _result(case, backend, "test", True, False, "compare failed")
        return _result(case, backend, "test", True, checker.ok, "; ".join(checker.messages))
    except Exception as e:   # a crashing kernel fails its case; the run goes on
        log.debug("case %s raised", case.name, exc_info=True)
        return _result(case, backend, "test", True, False, f"{type(e).__name__}: {e}")
    finally:
        for b in buffers:
            b.close()


# --- perf -----------------------------------------------------------------------------------

def op_bytes(t: Tensor) -> int:
    """Bytes an op moves: its result plus its sources (test-backend-ops' op_size)."""
    return t.nbytes + sum(s.nbytes for s in t.src if s is not None)


class _Runner:
    """Computes a graph through a plan where the backend has plans, else graph_compute."""

    def __init__(self, backend: Backend, graph) -> None:
        self.backend, self.graph = backend, graph
        try:
            self.plan = backend.graph_plan_create(graph)
        except UnsupportedError:
            self.plan = None

    def run(self, n: int) -> None:
        for _ in range(n):
            if self.plan is not None:
                self.backend.graph_plan_compute(self.plan)
            else:
                self.backend.graph_compute_async(self.graph)
        self.backend.synchronize()

    def close(self) -> None:
        if self.plan is not None:
            self.backend.graph_plan_free(self.plan)


def run_perf(case: Case, backend: Backend, rng: np.random.Generator) -> Result:
    """Time ``case`` on ``backend``: repeated until at least a second has passed."""
    ctx = CaseContext(guards=False)
    out = case.build(ctx)
    if not backend.supports_op(out):
        return _result(case, backend, "perf", False, False, "not supported")
    buffers = _allocate(ctx, backend)
    try:
        ctx.initialize(rng)
        runner = _Runner(backend, build_graph(out))
        try:
            start = time.perf_counter()
            runner.run(1)                                  # warm-up
            batch = max(1, int(PERF_BATCH_SECONDS / max(time.perf_counter() - start, 1e-6)))
            total, runs = 0.0, 0
            while total < PERF_MIN_SECONDS:
                start = time.perf_counter()
                runner.run(batch)
                total += time.perf_counter() - start
                runs += batch
        finally:
            runner.close()
    finally:
        for b in buffers:
            b.close()
    flops = case.flops(out) if case.flops else 0
    seconds_per_run = total / runs
    figures = dict(time_us=seconds_per_run * 1e6, n_runs=runs, memory_kb=op_bytes(out) // 1024)
    if flops:
        figures["flops"] = flops / seconds_per_run
    else:
        figures["bandwidth_gb_s"] = op_bytes(out) / seconds_per_run / 2**30
    return _result(case, backend, "perf", True, True, **figures)


# --- support --------------------------------------------------------------------------------

def run_support(case: Case, backend: Backend) -> Result:
    """Whether ``backend`` supports the case's output op; nothing is allocated or computed."""
    ctx = CaseContext(guards=False)
    out = case.build(ctx)
    ok = backend.supports_op(out)
    return _result(case, backend, "support", ok, ok, "yes" if ok else "no")


__all__ = ["Result", "Status", "NodeChecker", "run_test", "run_perf", "run_support", "op_bytes"]
