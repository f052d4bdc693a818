"""gpt-oss's harmony replies split into reasoning and answer: the streaming splitter against a
whole-text reading of the same reply, however the text is cut into pieces, and the server's
chat bodies (whole and streamed) built from it."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from hypothesis import example, given, settings, strategies as st

from polydev.models.harmony import ChannelSplitter

MESSAGE = re.compile(r"<\|channel\|>(\w+)[^<]*<\|message\|>(.*?)(?:<\|end\|>|<\|return\|>|"
                     r"<\|call\|>|$)", re.S)


def whole_text_reading(reply: str) -> dict[str, str]:
    """Each message's text by its channel's kind, read from the whole reply at once."""
    out = {"reasoning": "", "content": ""}
    for channel, text in MESSAGE.findall(reply):
        out["reasoning" if channel == "analysis" else "content"] += text
    return out


def streamed(reply: str, cuts: list[int]) -> dict[str, str]:
    splitter, out = ChannelSplitter(), {"reasoning": "", "content": ""}
    bounds = [0, *sorted(c % (len(reply) + 1) for c in cuts), len(reply)]
    for a, b in zip(bounds, bounds[1:]):
        for kind, text in splitter.feed(reply[a:b]):
            out[kind] += text
    for kind, text in splitter.finish():
        out[kind] += text
    return out


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="<"), max_size=12) | st.just(
    "a < b <| c")
REPLY = st.lists(st.tuples(st.sampled_from(["analysis", "final", "commentary"]), TEXT),
                 min_size=1, max_size=4).map(lambda messages: "<|end|><|start|>assistant".join(
                     f"<|channel|>{channel}<|message|>{text}" for channel, text in messages))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(reply=REPLY, cuts=st.lists(st.integers(0, 400), max_size=8))
@example(reply="<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final"
               " json<|message|>Paris", cuts=[3, 20, 31, 49])
def test_any_cut_into_pieces_reads_as_the_whole_text(reply, cuts):
    assert streamed(reply, cuts) == whole_text_reading(reply)


def test_a_reply_outside_the_format_is_all_content():
    assert streamed("Just an answer <| here", [5, 15]) == {"reasoning": "",
                                                           "content": "Just an answer <| here"}


def harmony_reply(reply_text: str, functions=None) -> tuple[dict, list[dict]]:
    """The server's whole choice and stream chunks for one harmony reply."""
    from polydev.models.engine import Finished, Piece

    app = pytest.importorskip("polydev.server.app")       # the serve extra
    from polydev.server.replies import ChoiceText, Reply

    def text() -> ChoiceText:
        return ChoiceText(0, chat=True, harmony=True, functions=functions,
                          token_text=lambda t: b"")
    end = Finished(reason="stop", prompt_tokens=3, completion_tokens=9, cached_tokens=0,
                   first_token_seconds=None)
    whole_text = text()
    parts = whole_text.feed(reply_text) + whole_text.feed(None)
    whole = app._whole_choice(True, whole_text, parts, [], end)

    async def events():
        queue: asyncio.Queue = asyncio.Queue()
        for i in range(0, len(reply_text), 5):
            queue.put_nowait((0, Piece(reply_text[i:i + 5], ())))
        queue.put_nowait((0, end))
        handle = type("Handle", (), {"cancel": lambda self: None})()
        return [chunk async for chunk in app._stream(Reply("m", chat=True), [text()], queue,
                                                     [handle], False)]
    chunks = [json.loads(c.removeprefix("data: ")) for c in asyncio.run(events())
              if c.startswith("data: {")]
    return whole, chunks


def test_the_server_sends_reasoning_content_apart():
    """The chat bodies: ``reasoning_content`` beside ``content``, whole and streamed."""
    whole, chunks = harmony_reply("<|channel|>analysis<|message|>The user asks.<|end|>"
                                  "<|start|>assistant<|channel|>final<|message|>Paris.")
    assert whole["message"] == {"role": "assistant", "content": "Paris.",
                                "reasoning_content": "The user asks."}
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user asks."
    assert "".join(d.get("content", "") for d in deltas) == "Paris."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_the_server_reads_calls_from_the_commentary_channel():
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    whole, chunks = harmony_reply(
        "<|channel|>analysis<|message|>Look it up.<|end|><|start|>assistant to=functions."
        'get_weather<|channel|>commentary <|constrain|>json<|message|>{"city": "Oslo"}', tools)
    [call] = whole["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
    deltas = [c["choices"][0]["delta"] for c in chunks]
    entries = [e for d in deltas for e in d.get("tool_calls") or ()]
    first, *rest = entries                  # the name, then the arguments piece by piece
    assert first["index"] == 0 and first["id"] and first["function"]["name"] == "get_weather"
    assert len(rest) > 1 and all(e["index"] == 0 and "name" not in e["function"] for e in rest)
    assert "".join(e["function"]["arguments"] for e in entries) == call["function"]["arguments"]
    assert "".join(d.get("content") or "" for d in deltas) == ""
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_polydev_run_prints_the_reasoning_to_stderr_and_keeps_the_answer(capsys):
    """``polydev run --chat`` with a harmony model: the answer on stdout (and in the
    conversation), the reasoning on stderr."""
    from polydev.tools.run import _stream

    reply = ("<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final"
             "<|message|>Yes.")
    kept = _stream([reply[i:i + 4] for i in range(0, len(reply), 4)], ChannelSplitter())
    out, err = capsys.readouterr()
    assert (kept, out, err) == ("Yes.", "Yes.", "Hmm.")
