"""Tool calls as a reply streams: the content is shown as it comes (never the start of a call),
and each call as OpenAI streams it: an entry with its index, id, type and name once the name
is whole, then its arguments piece by piece (llama-server streams them the same way, from a
partial parse of the text so far).

The pieces join into the arguments the whole reply gives (``parse_tool_calls``: the parsed
value dumped with ``json.dumps``): the text of a call's arguments so far is closed where it is
cut off, parsed, dumped, and cut back where the closing began (``json_prefix``); a number or a
literal that may still go on waits for its end. Qwen3-Coder's XML arguments, which are built
from its parameters rather than written, come whole at the end, as do calls whose text does
not parse as it goes.
"""

from __future__ import annotations

import json
import logging
import re
import string
from dataclasses import replace
from typing import Any, Sequence

from .streaming import marker_tail
from .tool_calls import (DEEPSEEK_BEGIN, DEEPSEEK_CALL, DEEPSEEK_FENCE, DEEPSEEK_SEP, HERMES,
                         MARKERS, MISTRAL, MISTRAL_ARGS, MISTRAL_CALL_ID, XML_FUNCTION,
                         XML_FUNCTION_CALL, ToolCall, first_marker, new_call_id,
                         parse_tool_calls)

__all__ = ["CallDeltas", "ToolCallStream", "json_prefix", "normalized_arguments",
           "partial_calls"]

log = logging.getLogger(__name__)

_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"
_CUT = "\ue000cut\ue000"          # where a closed text was cut off (private-use characters)


def json_prefix(text: str) -> str:
    """What ``json.dumps`` of the JSON value that ``text`` begins will begin with, whatever
    follows (the longest such text this can tell; "" where ``text`` does not parse)."""
    text, open_string, stack, expect = _scan(text)
    if expect is None:
        return ""
    if open_string:                 # inside a string: close it where it was cut off
        closing = _CUT + '"' + (': 0' if expect == "key" else "")
    else:
        closing = {"value": f'"{_CUT}"', "key": f'"{_CUT}": 0', "colon": f': "{_CUT}"',
                   "comma": ""}[expect]
    closing += "".join("}" if c == "{" else "]" for c in reversed(stack))
    try:
        dumped = json.dumps(json.loads(text + closing), ensure_ascii=False)
    except (ValueError, RecursionError):        # not JSON after all, or nested past Python's
        return ""
    at = dumped.find(_CUT)
    if at < 0:                      # nothing open but the containers: their closers go
        return dumped[:len(dumped) - len(stack)]
    if not open_string:             # a placeholder: its quote (and ": ") are not the text's
        at = dumped.rfind(": " if expect == "colon" else '"', 0, at)
    return dumped[:at]


def _scan(text: str) -> tuple[str, bool, list[str], str | None]:
    """``text`` without a number, literal or escape it ends in the middle of, whether it ends
    inside a string, its open containers, and what comes next ("value", "key", "colon" after
    a key, "comma" after a value; None: not JSON as far as this reads)."""
    stack: list[str] = []
    expect, in_string, escape_at, unicode_left, token_at = "value", False, -1, 0, -1
    high_at = -1                        # a \\uD800-\\uDBFF escape whose pair may follow
    for at, c in enumerate(text):
        if in_string:
            if unicode_left:
                if c not in string.hexdigits:
                    return text, False, stack, None
                unicode_left -= 1
                if not unicode_left:
                    code = int(text[escape_at + 2:at + 1], 16)
                    high_at = escape_at if 0xD800 <= code < 0xDC00 else -1
                    escape_at = -1
            elif escape_at >= 0:
                if c == "u":
                    unicode_left = 4
                else:
                    escape_at, high_at = -1, -1
            elif c == "\\":
                escape_at = at
            else:
                high_at = -1
                if c == '"':
                    in_string = False
                    expect = "colon" if expect == "key" else "comma"
            continue
        if c in _SPACE:
            token_at = -1
            continue
        if c == '"' and expect in ("value", "key"):
            in_string = True
        elif c in "{[" and expect == "value":
            stack.append(c)
            expect = "key" if c == "{" else "value"
        elif (c in "}]" and stack and stack[-1] == "{["["}]".index(c)]
              and expect in ("comma", "key" if c == "}" else "value")):
            stack.pop()
            expect = "comma"
        elif c == ":" and expect == "colon":
            expect = "value"
        elif c == "," and expect == "comma" and stack:
            expect = "key" if stack[-1] == "{" else "value"
        elif c.isalnum() or c in "-+.":             # a number or a literal, or its next char
            if expect == "value":
                expect, token_at = "comma", at
            elif token_at < 0:
                return text, False, stack, None
            continue
        else:
            return text, False, stack, None
        token_at = -1
    if in_string:
        cut = high_at if high_at >= 0 else escape_at
        return (text[:cut] if cut >= 0 else text), True, stack, expect
    if token_at >= 0:                   # it may go on: take it off, a value comes there
        return text[:token_at], False, stack, "value"
    return text, False, stack, expect


def partial_calls(text: str) -> list[tuple[str, str | None]]:
    """The calls begun in ``text`` (a reply from its first marker on), each with its name
    once whole and the text of its arguments so far where they are a JSON object or array
    (None: sent whole at the end, as Qwen3-Coder's XML, arguments written as a JSON string,
    or the key ``parse_tool_calls`` does not prefer). Llama 3.x's bare objects are calls only
    if the whole reply is, so none is read before the end."""
    if text.startswith(HERMES):
        return _hermes(text)
    if text.startswith(XML_FUNCTION):
        return _xml(text)
    if text.startswith(MISTRAL):
        return _mistral(text)
    if text.startswith((DEEPSEEK_BEGIN, DEEPSEEK_CALL)):
        return _deepseek(text)
    return []


def _value_end(text: str, at: int) -> int | None:
    """Where the JSON value at ``text[at]`` ends (None: cut off, or not JSON; a number at the
    very end may still go on)."""
    try:
        _, end = _DECODER.raw_decode(text, at)
    except (ValueError, RecursionError):
        return None
    return None if end == len(text) and text[at] in "-0123456789" else end


def _skip(text: str, at: int, also: str = "") -> int:
    while at < len(text) and (text[at] in _SPACE or text[at] in also):
        at += 1
    return at


def _arguments(text: str) -> str | None:
    """Arguments streamed as they come: a JSON object or array (a string is sent whole)."""
    return text if text.startswith(("{", "[")) else None


def _object(text: str, at: int, key: str) -> tuple[str | None, str | None, int | None]:
    """A call written as one JSON object at ``text[at]``: its "name" once whole, the text so
    far of its ``key`` (its arguments), and where the object ends (None: cut off)."""
    name, arguments = None, None
    if not text.startswith("{", at):
        return None, None, None
    at = at + 1
    while True:
        at = _skip(text, at, ",")
        if text.startswith("}", at):
            return name, arguments, at + 1
        end = _value_end(text, at)
        if end is None or not text.startswith('"', at):
            return name, arguments, None
        member = json.loads(text[at:end])
        at = _skip(text, end)
        if not text.startswith(":", at):
            return name, arguments, None
        start = _skip(text, at + 1)
        end = _value_end(text, start)
        if member == "name" and end is not None:
            value = json.loads(text[start:end])
            name = value.strip() if isinstance(value, str) else None
        elif member == key and arguments is None and start < len(text):
            arguments = _arguments(text[start:end])
        if end is None:
            return name, arguments, None
        at = end


def _objects(text: str, at: int, key: str) -> list[tuple[str, str | None]]:
    """Calls as JSON objects one after another (``[...]``'s items, from ``at``)."""
    calls = []
    while True:
        at = _skip(text, at, ",")
        name, arguments, end = _object(text, at, key)
        if name is None:
            return calls
        calls.append((name, arguments))
        if end is None:
            return calls
        at = end


def _hermes(text: str) -> list[tuple[str, str | None]]:
    calls = []
    for part in text.split(HERMES)[1:]:
        at = _skip(part, 0)
        if part.startswith(XML_FUNCTION, at):
            calls += _xml(part[at:])
            continue
        name, arguments, end = _object(part, at, "arguments")
        if name is None:
            break
        calls.append((name, arguments))
        if end is None:
            break
    return calls


def _xml(text: str) -> list[tuple[str, str | None]]:
    return [(name.strip(), None) for name, _ in XML_FUNCTION_CALL.findall(text)]


def _mistral(text: str) -> list[tuple[str, str | None]]:
    calls: list[tuple[str, str | None]] = []
    for part in text.split(MISTRAL)[1:]:
        at = _skip(part, 0)
        if part.startswith("[", at):                 # Nemo: a list of objects
            return calls + _objects(part, at + 1, "arguments")
        head, found, arguments = part.partition(MISTRAL_ARGS)
        if not found:
            return calls
        calls.append((head.partition(MISTRAL_CALL_ID)[0].strip(), _json_text(arguments)))
    return calls


def _json_text(text: str) -> str | None:
    """The JSON object or array ``text`` begins with (after spaces), as far as it goes."""
    text = text.lstrip()
    end = _value_end(text, 0) if text else None
    return _arguments(text if end is None else text[:end])


def _deepseek(text: str) -> list[tuple[str, str | None]]:
    calls = []
    for part in text.split(DEEPSEEK_CALL)[1:]:
        head, found, rest = part.partition(DEEPSEEK_SEP)
        if not found:
            break
        if head in ("", "function"):                 # R1: NAME, a fence, the arguments
            fence = DEEPSEEK_FENCE.search(rest)
            if fence is None:
                break
            name, arguments = rest[:fence.start()], rest[fence.end():]
        else:                                        # V3.1: the arguments straight after
            name, arguments = head, rest
        calls.append((name.strip(), _json_text(arguments)))
    return calls


class CallDeltas:
    """OpenAI's ``delta.tool_calls`` entries for calls as they grow (see ``grown`` and
    ``final``). The arguments' text is read again only once it has grown by a sixteenth
    since it was last read, so a long one costs O(n log n), not O(n²), to stream."""

    def __init__(self) -> None:
        self._sent: list[tuple[str, str, str]] = []     # per call: id, name, arguments sent
        self._read: list[int] = []                      # per call: arguments' length read

    def grown(self, found: Sequence[tuple[str, str | None]],
              every: bool = False) -> list[dict[str, Any]]:
        """What is new in ``found`` (each call so far: its name, and the text of its
        arguments so far or None): a new call's entry (index, id, type, name, arguments so
        far), and more arguments of one already sent (``every``: however little they grew;
        the reply's end)."""
        out = []
        for i, (name, arguments) in enumerate(found):
            if i < len(self._sent) and not (every or self._worth_reading(i, arguments)):
                continue
            text = json_prefix(arguments) if arguments else ""
            if i == len(self._sent):
                call_id = new_call_id()
                self._sent.append((call_id, name, text))
                self._read.append(len(arguments or ""))
                out.append({"index": i, "id": call_id, "type": "function",
                            "function": {"name": name, "arguments": text}})
                continue
            call_id, name, sent = self._sent[i]
            self._read[i] = len(arguments or "")
            if len(text) > len(sent) and text.startswith(sent):
                self._sent[i] = (call_id, name, text)
                out.append({"index": i, "function": {"arguments": text[len(sent):]}})
        return out

    def _worth_reading(self, i: int, arguments: str | None) -> bool:
        grown = len(arguments or "") - self._read[i]
        return grown > 0 and grown >= self._read[i] // 16

    @property
    def as_sent(self) -> list[ToolCall]:
        """The calls as far as they were streamed."""
        return [ToolCall(name, arguments, call_id) for call_id, name, arguments in self._sent]

    def final(self, calls: Sequence[ToolCall]) -> tuple[list[ToolCall], list[dict[str, Any]]]:
        """The calls of the whole reply (with the ids streamed) and what they still lack: the
        entries of calls not sent, and the rest of the arguments of those sent. A name or
        arguments other than those streamed cannot be taken back; they are logged."""
        calls = [replace(c, id=self._sent[i][0]) if i < len(self._sent) else c
                 for i, c in enumerate(calls)]
        out = []
        for i, call in enumerate(calls):
            if i >= len(self._sent):
                out.append(call.openai(i))
                continue
            _, name, sent = self._sent[i]
            if name != call.name or not call.arguments.startswith(sent):
                log.debug("tool call %d streamed as %s(%.80s), read whole as %s(%.80s)", i,
                          name, sent, call.name, call.arguments)
            elif len(call.arguments) > len(sent):
                out.append({"index": i, "function": {"arguments": call.arguments[len(sent):]}})
        return calls, out


def normalized_arguments(text: str) -> str:
    """Arguments written as JSON text, as ``parse_tool_calls`` gives them: dumped again where
    they parse (the form streamed pieces join into), else the text ("{}" where empty)."""
    try:
        return json.dumps(json.loads(text), ensure_ascii=False)
    except (ValueError, RecursionError):
        return text.strip() or "{}"


class ToolCallStream:
    """A streamed reply with tool calls in it: ``feed`` returns the content that is safe to
    show (never the start of a call) and ``deltas`` what the calls gained since it was last
    asked (OpenAI's ``delta.tool_calls`` entries); ``finish`` returns the rest of the content
    and the calls, and ``final_deltas`` what they still lack. Calls streamed that the whole
    reply does not read (cut off by the length limit, or not JSON after all) stand as they
    were sent, as OpenAI's do, and their text is not shown as content."""

    def __init__(self, functions: Sequence[dict[str, Any]]) -> None:
        self.functions = functions
        self._shown = 0
        self._text = ""
        self._deltas = CallDeltas()
        self._final: list[dict[str, Any]] = []

    def feed(self, piece: str) -> str:
        """The content of ``piece`` that may be shown now."""
        self._text += piece
        hold = self._hold_from()
        shown, self._shown = self._text[self._shown:hold], max(self._shown, hold)
        return shown

    def deltas(self) -> list[dict[str, Any]]:
        """The ``delta.tool_calls`` entries of what the calls gained since the last ask."""
        start = first_marker(self._text)
        return self._deltas.grown(partial_calls(self._text[start:])) if start >= 0 else []

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content not shown yet and the calls of the whole reply."""
        caught_up = []
        start = first_marker(self._text)
        if start >= 0 and self._deltas.as_sent:     # what the last reads skipped
            caught_up = self._deltas.grown(partial_calls(self._text[start:]), every=True)
        content, calls = parse_tool_calls(self._text, self.functions)
        if len(calls) < len(self._deltas.as_sent):
            calls = self._deltas.as_sent
            content = self._text[:start].rstrip()
        calls, final = self._deltas.final(calls)
        self._final = caught_up + final
        if not calls:
            return self._text[self._shown:], []
        return content[self._shown:], calls

    def final_deltas(self) -> list[dict[str, Any]]:
        """After ``finish``: the calls' entries not sent yet, and the rest of the arguments
        of those begun."""
        return self._final

    def _hold_from(self) -> int:
        """Where the text that may be a call begins (its length: nothing to hold)."""
        text = self._text
        if not text[self._shown:].strip() and self._shown == 0:
            return 0                        # nothing yet: a reply may open with a call
        if self._shown == 0 and text.lstrip().startswith("{"):
            return 0                        # a Llama-style call, perhaps
        start = first_marker(text)
        if start >= 0:
            return start
        return len(text) - marker_tail(text, MARKERS)     # a marker may be beginning
