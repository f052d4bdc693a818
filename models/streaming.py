"""Text from token pieces as they come: bytes of a UTF-8 character split across tokens are
held back until the character is whole (llama.cpp's server does the same); and what the
streaming parsers of a reply's markup share (``MarkupSplitter``, ``marker_tail``: harmony's
channels, ``<think>`` reasoning, tool calls)."""

from __future__ import annotations

from typing import Sequence

__all__ = ["MarkupSplitter", "Utf8Stream", "marker_tail"]


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end of ``data`` start a UTF-8 character not yet complete."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:          # a continuation byte: look further back
            continue
        need = (2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0
                else 4 if byte & 0xF8 == 0xF0 else 1)
        return back if back < need else 0
    return 0


class Utf8Stream:
    """Feed bytes, get the text that is complete so far."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, piece: bytes) -> str:
        data = self._pending + piece
        cut = len(data) - _incomplete_tail(data)
        self._pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def flush(self) -> str:
        """Whatever is left (an unfinished character becomes U+FFFD)."""
        data, self._pending = self._pending, b""
        return data.decode("utf-8", errors="replace")


def marker_tail(text: str, markers: Sequence[str]) -> int:
    """How many characters at the end of ``text`` may begin one of ``markers``: held back
    until the next piece says whether they do."""
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


class MarkupSplitter:
    """A streaming parser of a reply's markup: ``feed`` adds a piece and returns the (kind,
    text) parts it completes; a subclass's ``_step`` consumes what can be decided from the
    text held, returning False when more is needed."""

    def __init__(self) -> None:
        self._buffer = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        self._buffer += text
        parts: list[tuple[str, str]] = []
        while self._step(parts):
            pass
        return parts

    def _step(self, parts: list[tuple[str, str]]) -> bool:
        raise NotImplementedError
