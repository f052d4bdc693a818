"""The calls the driver makes to one device actor: held back, and sent as few as a step needs.

Each actor call costs far more than the work of a small one: on a 2-core machine about 0.3 ms
of the actor's time and a round of messages through Ray, taken from the cores that compute. A
decode step split over two nodes made ten calls, and half of its time was theirs. So a
device's calls are *queued* (``queue``) into the device's open batch, which goes to the actor
as one call (``DeviceActor.run``), and the driver waits only where it needs an answer. A
batch is sent when

- the driver is about to block on any stream or event, remote or local (``send_all``, which
  the runtime calls first: ``polydev.device.before_host_waits``), or a call needs its answer
  at once (``remote``);
- another device's batch that takes one of its results is sent: an activation read here and
  written there goes from this actor's reply to the other actor's call inside Ray, without a
  turn of the driver's Python;
- a second graph compute would join it, or a result of another device would join it after its
  compute: so that the stages of a pipeline overlap, each batch holds one micro-batch's work;
- its writes hold more than HELD_WRITE_BYTES.

A decode step over two nodes is one call to each (it was ten in all); on one node, one call.

A batch may take another device's result while that result's batch is still open only where
that batch was opened before its own: a batch that was opened later is sent first. So no two
open batches wait for each other.

Ray runs one caller's calls to an in-order actor in the order they were made, so a call never
waits for an earlier call of its own actor. A queued call's answer is a ``Pending``, an
``ObjectRef`` once its batch is sent. Every batch sent is *posted*: the device's next wait also
waits for it, and raises its failure. A large write goes as its own call (Ray moves its bytes
through the object store), and posted writes are bounded (POSTED_LIMIT): a model loaded onto a
node that lacks its file waits for its writes as they pile up, rather than filling the object
store. A read comes back in Ray's reply, in pieces under Ray's inline limit, where it is small
enough: a larger return goes through the object stores of both nodes (5 ms for a decode step's
196 KB of logits, against about 1 ms in pieces). One lock guards every queue: the registry's
devices are shared by every thread of the process, and sending one batch may send another's.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, Sequence

import numpy as np

from polydev.errors import RemoteDeviceError

__all__ = ["CallQueue", "HELD_WRITE_BYTES", "MAX_BATCH", "MAX_PIECES", "POSTED_LIMIT", "Pending",
           "READ_PIECE_BYTES", "resolved", "send_all"]

# below Ray's max_direct_call_object_size (100 KiB by default): a reply carries the bytes
READ_PIECE_BYTES = 96 << 10
MAX_PIECES = 16
HELD_WRITE_BYTES = 64 << 10      # bytes of writes a batch holds, at most
MAX_BATCH = 4096                 # calls a batch holds, at most (a decode step's are about ten)
POSTED_LIMIT = 256 << 20         # bytes of posted writes before the queue waits for them

_lock = threading.RLock()
_opening_order = itertools.count()
_open_queues: "weakref.WeakSet[CallQueue]" = weakref.WeakSet()


class _Batch:
    """Calls queued for one actor call: entries of (method, args, ref slots, values)."""

    def __init__(self, queue: "CallQueue") -> None:
        self.queue = queue
        self.opened = next(_opening_order)
        self.entries: list[tuple[str, tuple, tuple, int]] = []
        self.refs: list[Any] = []               # ObjectRefs and Pendings, the call's arguments
        self.values = 0                         # values it returns besides its own completion
        self.write_bytes = 0
        self.computes = 0
        self.out: list[Any] | None = None       # the call's ObjectRefs, once sent
        self.error: Exception | None = None     # why it could not be sent


class Pending:
    """A queued call's answer: its ``ObjectRef`` once the call's batch is sent (asking for
    ``ref`` sends it)."""

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: _Batch, index: int) -> None:
        self._batch, self._index = batch, index

    @property
    def sent(self) -> bool:
        return self._batch.out is not None or self._batch.error is not None

    @property
    def ref(self) -> Any:
        batch = self._batch
        if not self.sent:
            batch.queue.send()
        if batch.error is not None:
            raise batch.error
        return batch.out[self._index]             # type: ignore[index]

    def done(self) -> "Pending":
        """The completion of the whole call it rides in (an event of it, with no bytes)."""
        return Pending(self._batch, 0)


def resolved(refs: Any) -> Any:
    """``refs`` (one or a list) with each ``Pending`` as its ``ObjectRef`` (batches sent)."""
    if isinstance(refs, list):
        return [r.ref if isinstance(r, Pending) else r for r in refs]
    return refs.ref if isinstance(refs, Pending) else refs


def send_all() -> None:
    """Send every open batch of every device (before the driver blocks on anything)."""
    with _lock:
        for queue in list(_open_queues):
            queue.send()


class CallQueue:
    """The driver's side of one actor's queue of calls."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._batch: _Batch | None = None
        self._posted: list[Any] = []          # refs no wait has answered yet
        self._posted_bytes = 0

    # --- queueing ------------------------------------------------------------------------------

    def queue(self, method: str, args: Sequence[Any] = (), refs: Sequence[Any] = (),
              values: int = 0, compute: bool = False, held_bytes: int = 0) -> list[Pending]:
        """Queue ``actor.method(*args, *refs)``; ``refs`` (``ObjectRef``s or ``Pending``s)
        are resolved before the call runs: an event to wait for, the bytes another device
        read. ``held_bytes``: the bytes ``args`` carry. Returns the answer's ``values``
        Pendings (``[completion]`` for none)."""
        with _lock:
            foreign = self._foreign_refs(refs)
            batch = self._batch_for(compute, bool(foreign))
            slots: list[tuple[int, int]] = []
            for ref in foreign:
                slots.append((len(args) + len(slots), len(batch.refs)))
                batch.refs.append(ref)
            first = 1 + batch.values
            batch.entries.append((method, tuple(args), tuple(slots), values))
            batch.values += values
            batch.computes += compute
            batch.write_bytes += held_bytes
            answers = [Pending(batch, first + i) for i in range(values)] or [Pending(batch, 0)]
            if batch.write_bytes > HELD_WRITE_BYTES or len(batch.entries) >= MAX_BATCH:
                self.send()
            return answers

    def _foreign_refs(self, refs: Sequence[Any]) -> list[Any]:
        """What of ``refs`` a call must wait for: another actor's calls (this actor's own
        come before it anyway). A result of a batch opened after this queue's open one is
        sent first, so that no two open batches wait for each other."""
        kept = []
        for ref in refs:
            if isinstance(ref, Pending):
                if ref._batch.queue is self:
                    continue
                newer = self._batch is not None and ref._batch.opened > self._batch.opened
                if newer and not ref.sent:
                    ref._batch.queue.send()
            kept.append(ref)
        return kept

    def _batch_for(self, compute: bool, waits_for_others: bool) -> _Batch:
        """The open batch a call joins: a new one after a batch's compute where the call is a
        second compute or waits for another device (one micro-batch's work per batch)."""
        batch = self._batch
        if batch is not None and batch.computes and (compute or waits_for_others):
            self.send()
            batch = None
        if batch is None:
            batch = self._batch = _Batch(self)
            _open_queues.add(self)
        return batch

    def remote(self, method: str, *args: Any, num_returns: int | None = None) -> Any:
        """Call the actor's ``method`` now, as its own call, after the calls queued before
        it: its ``ObjectRef`` (or ``num_returns`` refs). Pendings among ``args`` are sent
        and passed as their refs (Ray resolves them before the call runs)."""
        with _lock:
            args = tuple(resolved(list(args)))
            self.send()
            call = getattr(self.actor, method)
            if num_returns is not None:
                call = call.options(num_returns=num_returns)
            return call.remote(*args)

    def write(self, buffer_id: int, offset: int, data: np.ndarray,
              after: Sequence[Any] = ()) -> Any:
        """Write ``data`` to a buffer after ``after``, without waiting: queued where small,
        else its own call, posted. ``data`` may change once this returns. The write's
        completion: a Pending, or the ``ObjectRef`` of its own call."""
        with _lock:
            if data.nbytes <= HELD_WRITE_BYTES:
                copy = np.array(data, copy=True)
                return self.queue("write", (buffer_id, offset, copy), after,
                                  held_bytes=data.nbytes)[0]
            waits = resolved(self._foreign_refs(after))
            self.send()
            ref = self.actor.write.remote(buffer_id, offset, data, *waits)
            self._posted.append(ref)
            self._posted_bytes += data.nbytes
            return ref

    def read(self, buffer_id: int, offset: int, out: np.ndarray,
             after: Sequence[Any] = ()) -> list[tuple[Pending, np.ndarray]]:
        """Queue a read of ``out.nbytes`` bytes at ``offset`` of the actor's buffer: each
        answer's Pending with the bytes of ``out`` it fills (``after``: what it waits for)."""
        flat = out.reshape(-1).view(np.uint8)
        if len(flat) > READ_PIECE_BYTES * MAX_PIECES:
            return [(self.queue("read", (buffer_id, offset, len(flat)), after, 1)[0], flat)]
        places = [flat[start:start + READ_PIECE_BYTES]
                  for start in range(0, max(len(flat), 1), READ_PIECE_BYTES)]
        answers = self.queue("read_pieces", (buffer_id, offset, [len(p) for p in places]),
                             after, len(places))
        return list(zip(answers, places))

    # --- sending and waiting -------------------------------------------------------------------

    def send(self) -> None:
        """Send the open batch as one call of the actor's (posted). Where Ray refuses it, the
        error is raised here and by every answer of the batch."""
        with _lock:
            batch = self._batch
            if batch is None:
                return
            self._batch = None
            _open_queues.discard(self)
            try:
                refs = resolved(batch.refs)       # another device's batch may go first
                call = self.actor.run.options(num_returns=1 + batch.values)
                out = call.remote(batch.entries, *refs)
            except Exception as e:
                batch.error = RemoteDeviceError(f"{len(batch.entries)} calls could not be "
                                                f"sent to their actor: {e}")
                raise batch.error from e
            finally:
                batch.entries, batch.refs = [], []    # their bytes are Ray's now
            batch.out = list(out) if batch.values else [out]
            self._posted.append(batch.out[0])
            self._posted_bytes += batch.write_bytes

    def post(self, ref: Any) -> None:
        """A call made here (``remote``) whose answer nothing needs: waited for with the
        device's next wait."""
        with _lock:
            self._posted.append(ref)

    @property
    def over_limit(self) -> bool:
        """Whether the posted writes hold more than POSTED_LIMIT bytes in flight."""
        return self._posted_bytes > POSTED_LIMIT

    @property
    def unsettled(self) -> bool:
        """Whether calls were made or queued that no wait has answered yet."""
        return bool(self._posted or self._batch is not None)

    def with_posted(self, ref: Any) -> tuple[list, int]:
        """What a wait for ``ref`` (one ref or Pending, or a list) must get: the posted refs
        first, then ``ref``'s; and how many posted refs lead the list."""
        with _lock:
            refs = resolved(ref if isinstance(ref, list) else [ref])
            self.send()
            posted, self._posted, self._posted_bytes = self._posted, [], 0
        return [*posted, *refs], len(posted)
