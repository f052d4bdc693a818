"""The bodies of one reply, whole or chunk by chunk, as OpenAI writes them: its choices' text
(a harmony model's reasoning apart), tool calls, log-probabilities, finish reasons and usage.

``ChoiceText`` follows one choice as its pieces arrive: the text a client may see now (stop
strings are already held back by the engine; the start of a tool call is held back here),
the calls as they are written (the name, then the arguments piece by piece), and each
token's log-probability in OpenAI's form (chat's ``content`` list, or the completions API's
parallel lists).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Sequence

from polydev.models.engine import Finished, Piece
from polydev.models.harmony import ChannelSplitter
from polydev.models.reasoning import ThinkSplitter
from polydev.models.sampling import TokenLogprob
from polydev.models.tool_call_stream import CallDeltas, ToolCallStream, normalized_arguments
from polydev.models.tool_calls import ToolCall, new_call_id

__all__ = ["ChoiceText", "Reply", "finish_reason", "merge_logprobs", "usage"]

_FIELDS = {"content": "content", "reasoning": "reasoning_content"}


class ChoiceText:
    """One choice's text, parsed as it streams (see the module doc). ``token_text`` gives a
    token's bytes (for log-probabilities)."""

    def __init__(self, index: int, chat: bool, harmony: bool,
                 functions: Sequence[dict[str, Any]] | None,
                 token_text: Callable[[int], bytes], thinking: str | None = None,
                 stream: bool = True) -> None:
        """``thinking``: the model writes ``<think>`` reasoning ("open": its prompt opened
        it already, "closed": a reply may open it; None: it does not); ``stream``: calls are
        read as they grow (else only at the end)."""
        self.index, self.chat, self.stream = index, chat, stream
        self.splitter = ChannelSplitter() if chat and harmony else None
        self.thinker = (ThinkSplitter(thinking == "open")
                        if chat and thinking and not harmony else None)
        self.tools = (ToolCallStream(functions) if chat and functions and not harmony
                      else None)
        self.calls: list[ToolCall] = []
        self._harmony_calls: list[list[str]] = []        # [name, arguments so far] each
        self._harmony_deltas = CallDeltas()
        self._token_text = token_text
        self._offset = 0                                   # completions' text_offset

    def feed(self, text: str | None) -> list[Any]:
        """The deltas (chat) or texts (completions) of one piece of text; None: generation
        ended, flush what was held."""
        if not self.chat:
            return [text] if text else []
        if self.splitter is not None:
            parts = self.splitter.feed(text) if text is not None else self.splitter.finish()
            deltas = [d for d in (self._harmony_part(kind, part) for kind, part in parts) if d]
            calls = self._harmony_deltas.grown(self._harmony_calls) if self.stream else []
            if text is None:
                self.calls, final = self._harmony_deltas.final(
                    [ToolCall(name, normalized_arguments(arguments), new_call_id())
                     for name, arguments in self._harmony_calls])
                calls += final
            return deltas + ([{"tool_calls": calls}] if calls else [])
        if self.thinker is None:
            return self._content(text)
        parts = self.thinker.feed(text) if text is not None else self.thinker.finish()
        deltas: list[Any] = []
        for kind, part in parts:
            deltas += ([{"reasoning_content": part}] if kind == "reasoning"
                       else self._content(part))
        return deltas + (self._content(None) if text is None else [])

    def _content(self, text: str | None) -> list[Any]:
        """The deltas of the answer's text (None: it ended), tool calls held back."""
        if self.tools is not None:
            if text is not None:
                shown = self.tools.feed(text)
                calls = self.tools.deltas() if self.stream else []
            else:
                shown, self.calls = self.tools.finish()
                calls = self.tools.final_deltas()
            return (([{"content": shown}] if shown else [])
                    + ([{"tool_calls": calls}] if calls else []))
        return [{"content": text}] if text else []

    def _harmony_part(self, kind: str, part: str) -> dict | None:
        if kind == "call":
            self._harmony_calls.append([part, ""])
            return None
        if kind == "arguments":
            if self._harmony_calls:
                self._harmony_calls[-1][1] += part
            return None
        return {_FIELDS[kind]: part}

    def logprobs(self, piece: Piece, text: str) -> dict | None:
        """The log-probabilities of ``piece``'s tokens in OpenAI's form (None: not asked);
        ``text``: what the piece showed (for the completions API's offsets)."""
        if not piece.logprobs:
            return None
        if self.chat:
            return {"content": [self._chat_entry(lp) for lp in piece.logprobs], "refusal": None}
        tokens = [self._text(lp.token) for lp in piece.logprobs]
        offsets = []
        for token in tokens:
            offsets.append(self._offset)
            self._offset += len(token)
        self._offset += len(text) - sum(map(len, tokens))    # held-back text shown now
        return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in piece.logprobs],
                "top_logprobs": [{self._text(t): v for t, v in lp.top}
                                 for lp in piece.logprobs],
                "text_offset": offsets}

    def _chat_entry(self, lp: TokenLogprob) -> dict:
        entry = self._token_entry(lp.token, lp.logprob)
        entry["top_logprobs"] = [self._token_entry(t, v) for t, v in lp.top]
        return entry

    def _token_entry(self, token: int, logprob: float) -> dict:
        data = self._token_text(token)
        return {"token": data.decode("utf-8", errors="replace"), "logprob": logprob,
                "bytes": list(data)}

    def _text(self, token: int) -> str:
        return self._token_text(token).decode("utf-8", errors="replace")


def merge_logprobs(chat: bool, parts: list[dict]) -> dict | None:
    """A whole reply's log-probabilities from its pieces'."""
    if not parts:
        return None
    if chat:
        return {"content": [e for p in parts for e in p["content"]], "refusal": None}
    return {key: [v for p in parts for v in p[key]]
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}


class Reply:
    """The envelope of one reply's bodies: the same id and time in every chunk."""

    def __init__(self, model_name: str, chat: bool) -> None:
        self.model, self.chat, self.created = model_name, chat, int(time.time())
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(self, index: int, delta: Any, finish_reason: str | None,
              logprobs: dict | None = None) -> dict:
        key = "delta" if self.chat else "text"
        return self._envelope(self.kind, [{"index": index, key: delta,
                                           "finish_reason": finish_reason,
                                           "logprobs": logprobs}])

    def usage_chunk(self, ends: Sequence[Finished]) -> dict:
        body = self._envelope(self.kind, [])
        body["usage"] = usage(ends)
        return body

    def whole(self, choices: Sequence[dict]) -> dict:
        return self._envelope("chat.completion" if self.chat else "text_completion",
                              list(choices))

    def _envelope(self, kind: str, choices: list) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices}


def finish_reason(end: Finished, text: ChoiceText) -> str:
    """OpenAI's finish reason: "tool_calls" when the reply called functions."""
    return "tool_calls" if text.calls and end.reason == "stop" else end.reason


def usage(ends: Sequence[Finished]) -> dict:
    """Usage of a reply whose choices ended with ``ends`` (the prompt counted once)."""
    prompt, cached = ends[0].prompt_tokens, min(e.cached_tokens for e in ends)
    completion = sum(e.completion_tokens for e in ends)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}
