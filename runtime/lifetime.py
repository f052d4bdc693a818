"""``Resource``: what every object that holds memory, a stream or an event shares
(docs/design.md, decision 10): ``close()`` releases it once, ``with`` closes it, and using it
afterwards raises ``ClosedError`` naming it."""

from __future__ import annotations

from .errors import ClosedError

__all__ = ["Resource"]


class Resource:
    """A releasable resource. Subclasses override ``_free`` (what closing releases) and
    ``_describe`` (how errors name it); ``closed`` starts False."""

    closed = False

    def close(self) -> None:
        """Release the resource now; using it afterwards raises ClosedError."""
        if not self.closed:
            self.closed = True
            self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError(f"{self._describe()} was closed")

    def _describe(self) -> str:
        return type(self).__name__

    def _free(self) -> None:
        pass
