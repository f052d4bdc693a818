"""What the engines share on the way in: requests that wait in a queue, submitted from any
thread, and the model's thread waiting for them (``BatchEngine``, ``EmbeddingEngine``)."""

from __future__ import annotations

import threading
from collections import deque
from typing import Generic, TypeVar

__all__ = ["Waiting"]

T = TypeVar("T")


class Waiting(Generic[T]):
    """A queue of requests under a lock, and a condition the model's thread waits on."""

    def __init__(self) -> None:
        self._queue: deque[T] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)

    @property
    def queued(self) -> int:
        """Requests waiting (any thread)."""
        return len(self._queue)

    def wait_for_work(self, timeout: float) -> None:
        """Block until a request is queued (or ``timeout`` seconds pass)."""
        with self._wake:
            if not self._queue:
                self._wake.wait(timeout)

    def wake(self) -> None:
        """End a ``wait_for_work`` early (to stop the thread that runs the engine)."""
        with self._wake:
            self._wake.notify_all()
