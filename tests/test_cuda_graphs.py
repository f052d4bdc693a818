"""CUDA graphs (polydev.backends.cuda.graphs) against a stand-in for CuPy's stream capture that
records what was captured and replays it, so the path runs without a GPU: warm-up, capture,
launches, what a failed capture leaves, the memory a graph holds, the error flags its kernels
set, and which steps are captured at all. On a GPU, test_cuda.py checks a model's decode steps
with graphs against the same steps call by call."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from polydev import Context, GGMLType, build_graph, ops
from polydev.backends.cuda import graphs
from polydev.backends.cuda.graphs import CapturedPlan, GraphCapture, one_token_step
from polydev.inflight import KernelErrorFlags


class StandInGraph:
    def __init__(self, work: list) -> None:
        self.work = work
        self.launches = 0

    def launch(self, stream) -> None:
        self.launches += 1
        for item in self.work:
            item()


class StandInStream:
    """A stream whose work runs at once, or is recorded while it captures."""

    def __init__(self) -> None:
        self.recording: list | None = None
        self.modes: list = []
        self.ended = 0

    def enqueue(self, work) -> None:
        if self.recording is not None:
            self.recording.append(work)
        else:
            work()

    def begin_capture(self, mode=None) -> None:
        assert self.recording is None, "a capture began inside another"
        self.recording = []
        self.modes.append(mode)

    def end_capture(self) -> StandInGraph:
        work, self.recording = self.recording, None
        self.ended += 1
        return StandInGraph(work)


class StandInCupy:
    """The few names of CuPy that graphs.py uses: the memory pool, the allocator hook and
    the capture mode."""

    RELAXED = "relaxed"

    def __init__(self) -> None:
        self.allocator = None
        self.pool_chunks: list = []
        pool = SimpleNamespace(malloc=self._pool_malloc)
        self.get_default_memory_pool = lambda: pool
        self.cuda = SimpleNamespace(using_allocator=self._using_allocator,
                                    runtime=SimpleNamespace(streamCaptureModeRelaxed=self.RELAXED))

    def _pool_malloc(self, size: int) -> object:
        chunk = SimpleNamespace(size=size)
        self.pool_chunks.append(chunk)
        return chunk

    @contextlib.contextmanager
    def _using_allocator(self, allocator):
        before, self.allocator = self.allocator, allocator
        try:
            yield
        finally:
            self.allocator = before

    def malloc(self, size: int) -> object:
        """What an array kernel's temporary takes: the current allocator's memory."""
        return (self.allocator or self._pool_malloc)(size)


@pytest.fixture
def rig():
    cupy, stream = StandInCupy(), StandInStream()
    errors = KernelErrorFlags("stand-in")
    done: list = []                       # the work the stream ran, in order
    python_calls: list = []               # the bound calls Python made

    def call(i: int, allocates: int = 0, checks: bool = False):
        def bound() -> None:
            python_calls.append(i)
            for _ in range(allocates):
                cupy.malloc(256)
            stream.enqueue(lambda: done.append(i))
            if checks:
                errors.launched()
        return bound
    return SimpleNamespace(cupy=cupy, stream=stream, errors=errors, done=done,
                           python_calls=python_calls, call=call,
                           capture=GraphCapture(cupy, stream, errors))


def _plan(calls, capturable: bool = True) -> CapturedPlan:
    return CapturedPlan(SimpleNamespace(name="CUDA0"), None, calls, capturable)


def test_a_plan_runs_call_by_call_then_is_captured_then_launched_whole(rig):
    plan = _plan([rig.call(i) for i in range(5)])
    for _ in range(4):
        rig.capture.compute(plan)
    assert rig.done == [0, 1, 2, 3, 4] * 4                 # every compute did all the work
    # the warm-up and the capture made the calls; the last two computes were launches alone
    assert rig.python_calls == [0, 1, 2, 3, 4] * 2
    assert rig.stream.modes == [StandInCupy.RELAXED]      # captured once
    assert plan.cuda_graph.launches == 3


def test_a_plan_that_is_not_capturable_always_runs_call_by_call(rig):
    plan = _plan([rig.call(i) for i in range(3)], capturable=False)
    for _ in range(3):
        rig.capture.compute(plan)
    assert rig.python_calls == rig.done == [0, 1, 2] * 3
    assert rig.stream.modes == [] and plan.cuda_graph is None


def test_memory_allocated_while_captured_belongs_to_the_graph(rig):
    plan = _plan([rig.call(0, allocates=2), rig.call(1, allocates=1)])
    rig.capture.compute(plan)                              # warm-up: the pool's, freed after
    assert plan.memory == []
    rig.capture.compute(plan)
    assert len(plan.memory) == 3 and all(m in rig.cupy.pool_chunks for m in plan.memory)
    assert rig.cupy.allocator is None                      # the hook ends with the capture
    rig.capture.compute(plan)
    assert len(plan.memory) == 3                           # a launch allocates nothing
    plan.release()
    assert plan.memory == [] and plan.cuda_graph is None


def test_a_failed_capture_is_ended_and_the_plan_runs_call_by_call_from_then_on(rig):
    def syncs() -> None:                                   # what CUDA refuses in a capture
        if rig.stream.recording is not None:
            raise RuntimeError("cudaErrorStreamCaptureUnsupported")
        rig.stream.enqueue(lambda: rig.done.append("sync"))
    plan = _plan([rig.call(0), syncs, rig.call(1)])
    for _ in range(3):
        rig.capture.compute(plan)
    assert rig.done == [0, "sync", 1] * 3                  # the failed capture ran nothing
    assert rig.stream.recording is None and rig.stream.ended == 1
    assert not plan.capturable and plan.cuda_graph is None
    assert len(rig.stream.modes) == 1                      # never tried again


def test_a_graph_of_checking_kernels_marks_the_error_flags_at_each_launch(rig):
    plan = _plan([rig.call(0), rig.call(1, checks=True)])
    rig.capture.compute(plan)
    rig.errors.pending = False                             # the backend synchronized
    rig.capture.compute(plan)                              # captured and launched
    assert plan.checks_indices and rig.errors.pending
    rig.errors.pending = False
    rig.capture.compute(plan)
    assert rig.errors.pending


def test_capturing_keeps_flags_another_kernel_left_pending(rig):
    plan = _plan([rig.call(0)])
    rig.capture.compute(plan)
    rig.errors.pending = True                              # set by work outside the plan
    rig.capture.compute(plan)
    assert not plan.checks_indices and rig.errors.pending


def test_graphs_can_be_turned_off(monkeypatch):
    assert graphs.graphs_enabled()
    monkeypatch.setenv(graphs.GRAPHS_ENV, "0")
    assert not graphs.graphs_enabled()


@pytest.mark.parametrize("columns, captured", [(1, True), (2, False)])
def test_steps_of_one_token_are_captured(columns, captured):
    ctx = Context()
    weight = ctx.new_tensor(GGMLType.Q8_0, [64, 16])
    x = ctx.new_tensor(GGMLType.F32, [64, columns])
    out = ops.rms_norm(ctx, ops.mul_mat(ctx, weight, x), 1e-6)
    assert one_token_step(build_graph(out)) is captured


@pytest.mark.parametrize("tokens, captured", [(1, True), (3, False)])
def test_expert_steps_of_one_token_are_captured(tokens, captured):
    ctx = Context()
    experts = ctx.new_tensor(GGMLType.Q8_0, [64, 16, 4])
    x = ctx.new_tensor(GGMLType.F32, [64, 2, tokens])
    ids = ctx.new_tensor(GGMLType.I32, [2, tokens])
    out = ops.mul_mat_id(ctx, experts, x, ids)
    assert one_token_step(build_graph(out)) is captured
    assert np.prod(out.ne) == 16 * 2 * tokens
