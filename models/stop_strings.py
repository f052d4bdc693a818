"""Stop strings over streamed text: what may be shown now, and where the text ends.

Text is held back while it could still be the beginning of a stop string, so a client never
sees part of a stop string that is then taken back (llama-server does the same).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["StopMatcher"]


class StopMatcher:
    """Feed text pieces; get back the text that is safe to show and whether a stop string
    ended the text (the stop string itself is never shown)."""

    def __init__(self, stops: Sequence[str] = ()) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """The part of ``held + text`` that can be shown, and True when a stop string
        occurred (the text before it is shown, nothing after)."""
        if not self.stops:
            return text, False
        buffer = self._held + text
        hits = [i for i in (buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            return buffer[:min(hits)], True
        hold = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - hold:]
        return buffer[:len(buffer) - hold], False

    def flush(self) -> str:
        """The text held back when the stream ends without a stop string."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest end of ``buffer`` that begins some stop string."""
        longest = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:n]):
                    longest = n
                    break
        return longest
