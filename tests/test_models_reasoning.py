"""``<think>`` reasoning split from the answer as llama-server's ``reasoning_content``: for
replies written by the templates of the families that think (Qwen3, DeepSeek R1), streamed in
pieces cut anywhere, with a prompt that opened the reasoning or not, and with a tool call
after it."""

from __future__ import annotations

import pytest

pytest.importorskip("jinja2")

from polydev.models.chat_template import render_chat  # noqa: E402
from polydev.models.reasoning import ThinkSplitter, opens_thinking, thinks  # noqa: E402

from needs import templates_dir  # noqa: E402


def split(text: str, opened: bool = False, size: int = 3) -> tuple[str, str]:
    splitter, parts = ThinkSplitter(opened), []
    for i in range(0, len(text), size):
        parts += splitter.feed(text[i:i + size])
    parts += splitter.finish()
    return ("".join(p for k, p in parts if k == "reasoning"),
            "".join(p for k, p in parts if k == "content"))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_replies_split_whatever_the_pieces(size):
    assert split("<think>\nThe user asks.\n</think>\n\nParis.", size=size) == (
        "\nThe user asks.\n", "Paris.")
    assert split("  <think>a</think>b", size=size) == ("a", "b")
    assert split("Just an answer with </think> in it.", size=size) == (
        "", "Just an answer with </think> in it.")
    assert split("<thin", size=size) == ("", "<thin")                  # not a marker after all
    assert split("Still thinking when cut", opened=True, size=size) == (
        "Still thinking when cut", "")
    assert split("Checked.\n</think>\n\nYes.", opened=True, size=size) == ("Checked.\n", "Yes.")


def test_qwen3s_template_writes_what_the_splitter_reads():
    template = (templates_dir() / "Qwen-Qwen3-0.6B.jinja").read_text()
    assert thinks(template)
    user = [{"role": "user", "content": "Capital of France?"}]
    prompt = render_chat(template, user)
    whole = render_chat(template, user + [{"role": "assistant", "content":
                                           "<think>\nIt is Paris.\n</think>\n\nParis."}],
                        add_generation_prompt=False)
    reply = whole[len(prompt):].split("<|im_end|>")[0]
    assert split(reply, opens_thinking(prompt)) == ("\nIt is Paris.\n", "Paris.")


def test_deepseek_r1s_prompt_opens_the_reasoning():
    template = (templates_dir() / "llama-cpp-deepseek-r1.jinja").read_text()
    prompt = render_chat(template, [{"role": "user", "content": "2+2?"}])
    assert thinks(template) and opens_thinking(prompt)
    assert split("Four, surely.\n</think>\n\n4", opens_thinking(prompt)) == ("Four, surely.\n",
                                                                             "4")


def test_the_server_reply_has_reasoning_then_a_tool_call():
    replies = pytest.importorskip("polydev.server.replies")
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    text = replies.ChoiceText(0, chat=True, harmony=False, functions=tools,
                              token_text=lambda t: b"", thinking="closed")
    reply = ('<think>Need data.</think>\n\n<tool_call>\n{"name": "lookup", "arguments": {}}'
             '\n</tool_call>')
    deltas = []
    for i in range(0, len(reply), 4):
        deltas += text.feed(reply[i:i + 4])
    deltas += text.feed(None)
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need data."
    assert "".join(d.get("content") or "" for d in deltas) == ""
    assert [c.name for c in text.calls] == ["lookup"]
