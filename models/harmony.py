"""gpt-oss's harmony format on the way out: the reply of a harmony model is a sequence of
messages, each ``<|channel|>NAME<|message|>TEXT`` and closed by ``<|end|>`` before the next
``<|start|>assistant...`` (generation itself ends at ``<|return|>`` or ``<|call|>``). The
"analysis" channel is the model's reasoning, "final" (and any other) is the answer.

``ChannelSplitter`` turns the generated text, piece by piece as it streams, into
("reasoning", text) and ("content", text) parts without the markup, as llama-server's
``reasoning_content``/``content`` split does. A message addressed to a function (``to=
functions.NAME`` in its header: a tool call) is ("call", NAME) and then its arguments as
("arguments", text) parts. A marker cut between two pieces is held back until it is whole.
"""

from __future__ import annotations

import re

from .streaming import MarkupSplitter, marker_tail

__all__ = ["ChannelSplitter", "is_harmony"]

_CHANNEL, _MESSAGE, _END, _START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
_CLOSERS = (_END, "<|return|>", "<|call|>")
_HEADS = (_CHANNEL, _START, "assistant")      # how a message's header may begin
REASONING_CHANNELS = ("analysis",)
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")


def is_harmony(chat_template: str | None, token_texts) -> bool:
    """Whether a model speaks harmony: its vocabulary has the channel and message tokens and
    its chat template writes them."""
    return bool(chat_template) and _CHANNEL in chat_template and all(
        token_texts.id_of(t) is not None for t in (_CHANNEL, _MESSAGE))


class ChannelSplitter(MarkupSplitter):
    """The streaming parser (see the module docstring). ``feed`` returns the parts a piece
    completes; ``finish`` the rest once generation ends."""

    def __init__(self) -> None:
        super().__init__()
        self._channel: str | None = None     # None: reading a message's header
        self._recipient: str | None = None   # the function a message calls

    def finish(self) -> list[tuple[str, str]]:
        """What is left: an unfinished header is shown as it is (the model did not follow the
        format), a message's text as its channel's."""
        rest, self._buffer = self._buffer, ""
        if not rest:
            return []
        if self._channel is None:
            return [("content", rest)]
        return [(self._kind(), rest)]

    def _step(self, parts: list[tuple[str, str]]) -> bool:
        """Consume what can be decided now; False when more text is needed."""
        if self._channel is None:
            return self._header(parts)
        cut = min((i for i in (self._buffer.find(c) for c in _CLOSERS) if i >= 0), default=-1)
        if cut < 0:
            keep = marker_tail(self._buffer, _CLOSERS)
            self._emit(parts, self._buffer[:len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep:]
            return False
        self._emit(parts, self._buffer[:cut])
        closer = next(c for c in _CLOSERS if self._buffer.startswith(c, cut))
        self._buffer = self._buffer[cut + len(closer):]
        self._channel, self._recipient = None, None
        return True

    def _header(self, parts: list[tuple[str, str]]) -> bool:
        """``[<|start|>]assistant[ to=...]<|channel|>NAME[ json]<|message|>``: the channel of
        the message that follows. Text that cannot begin a header means the model left the
        format: from there on everything is content."""
        end = self._buffer.find(_MESSAGE)
        if end < 0:
            head = self._buffer.lstrip()
            if head and not any(h.startswith(head) or head.startswith(h) for h in _HEADS):
                self._channel, self._recipient = "final", None
                return True
            return False
        header, self._buffer = self._buffer[:end], self._buffer[end + len(_MESSAGE):]
        name = header.partition(_CHANNEL)[2].split()
        self._channel = name[0] if name else "final"
        recipient = _RECIPIENT.search(header)
        self._recipient = recipient.group(1) if recipient else None
        if self._recipient is not None:
            parts.append(("call", self._recipient))
        return True

    def _kind(self) -> str:
        if self._recipient is not None:
            return "arguments"
        return "reasoning" if self._channel in REASONING_CHANNELS else "content"

    def _emit(self, parts: list[tuple[str, str]], text: str) -> None:
        if text:
            parts.append((self._kind(), text))
