"""Text from token pieces as they come: bytes of a UTF-8 character split across tokens are
held back until the character is whole (llama.cpp's server does the same)."""

from __future__ import annotations

__all__ = ["Utf8Stream"]


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
