"""The calls the driver makes to one device actor: in order, as few as a step needs.

Ray runs one caller's calls to an in-order actor in the order they were made, so the driver
never waits for a call unless it needs its answer:

- a call whose answer nothing needs (a write of host bytes: Ray copies them as the call is
  made) is *posted*; the device's next wait also waits for it, and raises its failure;
- a small write is *held back*, copied, and sent with the actor's next call as one
  ``write_many`` (a decode step's few inputs were a call each, 130 µs of the actor's time
  apiece, and six of its eleven round trips);
- a read comes back in Ray's reply, in pieces under Ray's inline limit, where it is small
  enough: a larger return goes through the object stores of both nodes (5 ms for a decode
  step's 196 KB of logits, against about 1 ms in pieces).

Posted writes are bounded (``POSTED_LIMIT``): a model loaded onto a node that lacks its file
waits for its writes as they pile up, rather than filling the object store. One lock guards
the queue: the registry's devices are shared by every thread of the process.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["CallQueue", "HELD_WRITE_BYTES", "MAX_PIECES", "POSTED_LIMIT", "READ_PIECE_BYTES"]

# below Ray's max_direct_call_object_size (100 KiB by default): a reply carries the bytes
READ_PIECE_BYTES = 96 << 10
MAX_PIECES = 16
HELD_WRITE_BYTES = 64 << 10      # writes held back for the actor's next call, at most
POSTED_LIMIT = 256 << 20         # bytes of posted writes before the queue waits for them


class CallQueue:
    """The driver's side of one actor's queue of calls."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._lock = threading.Lock()
        self._posted: list[Any] = []          # refs no wait has answered yet
        self._posted_bytes = 0
        self._held: list[tuple[int, int, np.ndarray]] = []      # writes not sent yet
        self._held_bytes = 0

    def remote(self, method: str, *args: Any, num_returns: int | None = None) -> Any:
        """Call the actor's ``method`` without waiting (its ``ObjectRef``, or refs with
        ``num_returns``), after the writes held back for it."""
        with self._lock:
            self._flush()
            call = getattr(self.actor, method)
            if num_returns is not None:
                call = call.options(num_returns=num_returns)
            return call.remote(*args)

    def write(self, buffer_id: int, offset: int, data: np.ndarray) -> None:
        """Write ``data`` to a buffer without waiting: held back where small, else posted.
        ``data`` may change once this returns."""
        with self._lock:
            if data.nbytes > HELD_WRITE_BYTES:
                self._flush()
                self._posted.append(self.actor.write.remote(buffer_id, offset, data))
                self._posted_bytes += data.nbytes
                return
            self._held.append((buffer_id, offset, np.array(data, copy=True)))
            self._held_bytes += data.nbytes
            if self._held_bytes > HELD_WRITE_BYTES:
                self._flush()

    def post(self, ref: Any) -> None:
        """A call made here (``remote``) whose answer nothing needs: waited for with the
        device's next wait."""
        with self._lock:
            self._posted.append(ref)

    @property
    def over_limit(self) -> bool:
        """Whether the posted writes hold more than POSTED_LIMIT bytes in flight."""
        return self._posted_bytes > POSTED_LIMIT

    @property
    def unsettled(self) -> bool:
        """Whether calls were made that no wait has answered yet (posted or held back)."""
        return bool(self._posted or self._held)

    def with_posted(self, ref: Any) -> tuple[list, int]:
        """What a wait for ``ref`` (one ref or a list) must get: the posted refs first, then
        ``ref``'s; and how many posted refs lead the list."""
        with self._lock:
            self._flush()
            posted, self._posted, self._posted_bytes = self._posted, [], 0
        refs = ref if isinstance(ref, list) else [ref]
        return [*posted, *refs], len(posted)

    def read(self, buffer_id: int, offset: int, out: np.ndarray,
             *after: Any) -> list[tuple[Any, np.ndarray]]:
        """One call reading ``out.nbytes`` bytes at ``offset`` of the actor's buffer: each
        returned piece's ref with the bytes of ``out`` it fills (``after``: refs the call
        waits for)."""
        flat = out.reshape(-1).view(np.uint8)
        if len(flat) > READ_PIECE_BYTES * MAX_PIECES:
            return [(self.remote("read", buffer_id, offset, len(flat), *after), flat)]
        places = [flat[start:start + READ_PIECE_BYTES]
                  for start in range(0, max(len(flat), 1), READ_PIECE_BYTES)]
        refs = self.remote("read_pieces", buffer_id, offset, [len(p) for p in places], *after,
                           num_returns=len(places))
        return list(zip(refs if len(places) > 1 else [refs], places))

    def _flush(self) -> None:
        if self._held:
            held, self._held, self._held_bytes = self._held, [], 0
            self._posted.append(self.actor.write_many.remote(held))
