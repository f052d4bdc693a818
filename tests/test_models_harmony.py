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


def test_the_server_sends_reasoning_content_apart():
    """The chat bodies: ``reasoning_content`` beside ``content``, whole and streamed."""
    from polydev.models.engine import Finished, Piece

    app = pytest.importorskip("polydev.server.app")       # the serve extra
    _Reply, _stream = app._Reply, app._stream

    reply_text = ("<|channel|>analysis<|message|>The user asks.<|end|><|start|>assistant"
                  "<|channel|>final<|message|>Paris.")
    end = Finished(reason="stop", prompt_tokens=3, completion_tokens=9, cached_tokens=0,
                   first_token_seconds=None)
    whole = _Reply("m", chat=True, harmony=True).whole(reply_text, end)
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "Paris.",
                                              "reasoning_content": "The user asks."}

    async def events():
        queue: asyncio.Queue = asyncio.Queue()
        for i in range(0, len(reply_text), 5):
            queue.put_nowait(Piece(reply_text[i:i + 5], ()))
        queue.put_nowait(end)
        handle = type("Handle", (), {"cancel": lambda self: None})()
        return [chunk async for chunk in _stream(_Reply("m", chat=True, harmony=True), queue,
                                                 handle, False)]
    chunks = [json.loads(c.removeprefix("data: ")) for c in asyncio.run(events())
              if c.startswith("data: {")]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "The user asks."
    assert "".join(d.get("content", "") for d in deltas) == "Paris."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_polydev_run_prints_the_reasoning_to_stderr_and_keeps_the_answer(capsys):
    """``polydev run --chat`` with a harmony model: the answer on stdout (and in the
    conversation), the reasoning on stderr."""
    from polydev.tools.run import _stream

    reply = ("<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>final"
             "<|message|>Yes.")
    kept = _stream([reply[i:i + 4] for i in range(0, len(reply), 4)], ChannelSplitter())
    out, err = capsys.readouterr()
    assert (kept, out, err) == ("Yes.", "Yes.", "Hmm.")
