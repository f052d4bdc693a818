"""A reply's reasoning between ``<think>`` and ``</think>`` (DeepSeek R1, Qwen3, QwQ, SmolLM3
and others) on the way out, as llama-server's ``reasoning_content`` (its default
``--reasoning-format deepseek``): the reasoning apart, the answer after it as content.

``ThinkSplitter`` reads the generated text piece by piece as it streams. A reply that opens
with ``<think>`` (after whitespace), or one whose prompt already opened it (R1's generation
prompt ends in ``<think>\\n``), is reasoning up to ``</think>``; the newlines after it are
dropped; the rest is content. A reply that opens with anything else is all content. A marker
cut between pieces is held back until it is whole.
"""

from __future__ import annotations

from .streaming import MarkupSplitter, marker_tail

__all__ = ["ThinkSplitter", "opens_thinking", "thinks"]

OPEN, CLOSE = "<think>", "</think>"


def thinks(chat_template: str | None) -> bool:
    """Whether a model's chat template knows ``<think>`` reasoning."""
    return bool(chat_template) and CLOSE in chat_template


def opens_thinking(prompt: str) -> bool:
    """Whether a rendered prompt ends inside an opened ``<think>``."""
    return prompt.rstrip().endswith(OPEN)


class ThinkSplitter(MarkupSplitter):
    """The streaming splitter (see the module doc): ``feed`` returns the ("reasoning", text)
    and ("content", text) parts a piece completes, ``finish`` the rest."""

    def __init__(self, opened: bool = False) -> None:
        super().__init__()
        self._state = "reasoning" if opened else "start"

    def finish(self) -> list[tuple[str, str]]:
        """What is held: an unclosed reasoning stays reasoning, anything else is content."""
        rest, self._buffer = self._buffer, ""
        if not rest or self._state == "after":
            return []
        return [("reasoning" if self._state == "reasoning" else "content", rest)]

    def _step(self, parts: list[tuple[str, str]]) -> bool:
        """Consume what can be decided now; False when more text is needed."""
        if self._state == "start":
            head = self._buffer.lstrip()
            if head.startswith(OPEN):
                self._buffer = head[len(OPEN):]
                self._state = "reasoning"
                return True
            if OPEN.startswith(head):            # nothing yet, or a marker beginning
                return False
            self._state = "content"
            return True
        if self._state == "reasoning":
            cut = self._buffer.find(CLOSE)
            if cut < 0:
                keep = marker_tail(self._buffer, (CLOSE,))
                self._emit(parts, "reasoning", self._buffer[:len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep:]
                return False
            self._emit(parts, "reasoning", self._buffer[:cut])
            self._buffer = self._buffer[cut + len(CLOSE):]
            self._state = "after"
            return True
        if self._state == "after":                # the newlines between reasoning and answer
            self._buffer = self._buffer.lstrip("\n")
            if not self._buffer:
                return False
            self._state = "content"
            return True
        self._emit(parts, "content", self._buffer)
        self._buffer = ""
        return False

    @staticmethod
    def _emit(parts: list[tuple[str, str]], kind: str, text: str) -> None:
        if text:
            parts.append((kind, text))
