"""A CPU plan's bound calls replayed from C, a run of compiled calls at a time.

A plan binds each node's kernel once and replays the calls every step; from Python each call
costs about 1.5 µs of interpreter and ctypes time, 5% of a 1B-class model's decode step and
more of a smaller one's. A binder whose call is one compiled entry point marks it
``native`` (``replayable``): its kernel's code, its argument record, the floats beside the
record, where some argument changes between steps a ``prepare`` that rewrites it before each
replay, and where the call keeps Python bookkeeping an ``after`` run once the replay is done.
The plan groups consecutive marked calls into a ``NativeRun``, which runs the prepares, then
every call in one ``pd_replay`` (native/replay.c), then the afters; an unmarked call (a numpy
kernel) runs as before, between runs. Consecutive products of one activation take one entry of
the run's table, one call for them all (shared_input.py).

A call whose status is not 0 (no scratch memory, a bad row index) stops the replay there; its
Python call (a joined entry's: each of them) then does it again, raising the error that status
stands for (or finishing it, as SET_ROWS does for fp16 without F16C), and the replay goes on
after it. The kernels write their results from their sources, so doing a call again is
harmless.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Callable

from polydev.device import GraphPlan

from .call_record import CallCode, CallRecord
from .native import kernels
from .shared_input import SharedInputCall, shared_input_groups

if TYPE_CHECKING:
    from polydev.device import Backend
    from polydev.graph import Graph

Prepare = Callable[[], bool]


class NativeCall:
    """What the replay needs of a bound call: its record, the argument record it points to
    (kept alive here), ``prepare`` and ``after``. A prepare runs before every replay, maybe
    more than once (a pass of them until none changes the cache), to rewrite an argument of
    the record; it returns True when it changed the device's weight cache (made a copy), which
    may have evicted what an earlier prepare of the same run found. It runs before the calls
    of its run, so it may read only what is set before the graph runs; one with a
    ``release()`` method holds memory that a fallback to calls one by one lets go. ``after``
    is the call's Python bookkeeping, run once after each replay in which the call ran (the
    bound call does it itself when made one by one)."""

    def __init__(self, code: CallCode, args: ctypes.Structure, f0: float = 0.0, f1: float = 0.0,
                 prepare: Prepare | None = None,
                 after: Callable[[], None] | None = None) -> None:
        self.record = CallRecord(int(code), ctypes.addressof(args), f0, f1)
        self.args, self.prepare, self.after = args, prepare, after


def replayable(run: Callable[[], None], code: CallCode, args: ctypes.Structure, *,
               f0: float = 0.0, f1: float = 0.0, prepare: Prepare | None = None,
               after: Callable[[], None] | None = None) -> Callable[[], None]:
    """``run`` (the bound call, still what a plan calls outside a replay and after a failed
    status) marked as the compiled call ``code`` with the record ``args``."""
    run.native = NativeCall(code, args, f0, f1, prepare, after)
    return run


class NativeRun:
    """Consecutive replayable calls of a plan, run by one ``pd_replay``."""

    PREPARE_PASSES = 2

    def __init__(self, calls: list[Callable[[], None]]) -> None:
        self.calls = calls
        natives = [c.native for c in calls]
        # an entry of the table per call, or per run of products of one activation (one call
        # for them all: shared_input.py), with the calls it stands for
        self._entries = shared_input_groups(calls)
        self._joined = [SharedInputCall(group) for group in self._entries if len(group) > 1]
        joined = iter(self._joined)
        self._records = [group[0].native.record if len(group) == 1 else next(joined).record
                         for group in self._entries]                # kept alive
        self._table = (ctypes.c_int64 * len(self._records))(*map(ctypes.addressof,
                                                                 self._records))
        self._prepares = [n.prepare for n in natives if n.prepare is not None]
        # what the prepares hold (copies of weights), let go on a fallback to calls one by one
        self._releases = [p.release for p in self._prepares if hasattr(p, "release")]
        # the caches and buffers the copies' prepares compare (a few for the run's dozens of
        # copies), and their versions when a pass last changed nothing: while they hold, only
        # the other prepares run (the copies' took about 40 µs of a decode step, caches cold)
        self._watched = list(dict.fromkeys(pair for p in self._prepares
                                           if hasattr(p, "watched") for pair in [p.watched()]))
        self._others = [p for p in self._prepares if not hasattr(p, "watched")]
        self._quiet: tuple | None = None
        self._afters = [n.after for n in natives if n.after is not None]
        self._replay = kernels().replay

    def __call__(self) -> None:
        if not self._prepared():
            self._quiet = None
            for release in self._releases:   # the cache is too small for the run's copies:
                release()                    # none held beyond its budget
            for call in self.calls:
                call()
            return
        i, n, table = 0, len(self._entries), self._table
        while i < n:
            i = self._replay(table, i, n)
            if i < n:
                for call in self._entries[i]:    # raise the error of its status, or finish it
                    call()
                i += 1
        for after in self._afters:
            after()

    def _prepared(self) -> bool:
        """Run the prepares until a pass changes nothing in the weight cache (then every
        address they wrote is the cache's now); False if that takes more than
        PREPARE_PASSES: the run's copies evict each other, and only calls made one by one,
        each taking its copy as it runs, can use them."""
        prepares = self._others if self._quiet == self._versions() else self._prepares
        for _ in range(self.PREPARE_PASSES):
            changed = False
            for prepare in prepares:
                changed |= prepare()
            if not changed:
                if prepares is self._prepares:
                    self._quiet = self._versions()
                return True
            prepares = self._prepares
        return False

    def _versions(self) -> tuple:
        return tuple((cache.version, buffer.generation) for cache, buffer in self._watched)


class ReplayPlan(GraphPlan):
    """A CPU plan whose consecutive replayable calls run as NativeRuns. ``replayed`` False
    runs ``calls`` one by one instead (the bench scripts time each call that way)."""

    def __init__(self, backend: "Backend", graph: "Graph",
                 calls: list[Callable[[], None]]) -> None:
        super().__init__(backend, graph, calls)
        self.replayed = True
        self.steps = _steps(calls)

    def compute(self) -> None:
        for step in (self.steps if self.replayed else self.calls):
            step()


def _steps(calls: list[Callable[[], None]]) -> list[Callable[[], None]]:
    """``calls`` with each run of replayable ones (two or more) made one NativeRun."""
    steps: list[Callable[[], None]] = []
    run: list[Callable[[], None]] = []

    def close_run() -> None:
        if len(run) > 1:
            steps.append(NativeRun(list(run)))
        else:
            steps.extend(run)
        run.clear()

    for call in calls:
        if getattr(call, "native", None) is not None:
            run.append(call)
        else:
            close_run()
            steps.append(call)
    close_run()
    return steps
