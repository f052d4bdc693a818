"""Tool calls: each family's own chat template writes an assistant's calls (the form its model
was trained on), and polydev's parsers must read them back; streaming shows the content and
never the start of a call; a reply that is not a call stays content."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("jinja2")

from polydev.models.chat_template import render_chat  # noqa: E402
from polydev.models.harmony import ChannelSplitter  # noqa: E402
from polydev.models.tool_call_stream import ToolCallStream, json_prefix  # noqa: E402
from polydev.models.tool_calls import (call_grammar, parse_tool_calls,  # noqa: E402
                                       without_tool_roles)

from needs import templates_dir, vocab_dir  # noqa: E402

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "days": {"type": "integer"}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web", "parameters": {"type": "object",
                                         "properties": {"query": {"type": "string"}}}}},
]
CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("search", {"query": "1 < 2 & \"x\""})]
# the template's end-of-turn text, which generation never shows (it ends at that token)
ENDS = ("</s>", "<|eot_id|>", "<|im_end|>", "<｜end▁of▁sentence｜>", "<|eom_id|>")
FAMILIES = ["Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B",
            "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "Qwen3-Coder",
            "mistralai-Mistral-Nemo-Instruct-2407", "Mistral-Small-3.2-24B-Instruct-2506",
            "unsloth-mistral-Devstral-Small-2507", "meta-llama-Llama-3.1-8B-Instruct",
            "meta-llama-Llama-3.2-3B-Instruct", "llama-cpp-deepseek-r1",
            "deepseek-ai-DeepSeek-V3.1"]
SINGLE_CALL = {"meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.2-3B-Instruct"}


def assistant_text(template: str, calls: list[tuple[str, dict]]) -> str:
    """What the template writes for an assistant turn that makes ``calls``: the rendering
    with that turn minus the rendering up to the generation prompt, cut at the turn's end."""
    user = [{"role": "user", "content": "Weather in Paris?"}]
    tool_calls = [{"id": f"abc{i}XYZ12", "type": "function",
                   "function": {"name": name, "arguments": arguments}}
                  for i, (name, arguments) in enumerate(calls)]
    prompt = render_chat(template, user, tools=TOOLS, bos_token="<s>", eos_token="</s>")
    whole = render_chat(template, user + [{"role": "assistant", "content": "",
                                           "tool_calls": tool_calls}],
                        tools=TOOLS, add_generation_prompt=False, bos_token="<s>",
                        eos_token="</s>")
    n = next((i for i, (a, b) in enumerate(zip(prompt, whole)) if a != b),
             min(len(prompt), len(whole)))
    if n < len(prompt):                 # the prompt's end (an opened think block) is not
        n = whole.rfind(">", 0, n) + 1  # the turn's: cut after the last whole marker
    text = whole[n:]
    for end in ENDS:
        text = text.split(end)[0]
    return text


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_reads_back_the_calls_its_template_writes(family):
    template = (templates_dir() / f"{family}.jinja").read_text()
    calls = CALLS[:1] if family in SINGLE_CALL else CALLS
    text = assistant_text(template, calls)
    content, parsed = parse_tool_calls(text, TOOLS)
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls, text
    assert content.replace("<think>", "").replace("</think>", "").strip() == ""
    assert len({c.id for c in parsed}) == len(parsed)

    stream, shown, deltas = ToolCallStream(TOOLS), "", []
    for i in range(0, len(text), 3):          # pieces cut anywhere, markers included
        shown += stream.feed(text[i:i + 3])
        deltas.append(stream.deltas())
    rest, streamed = stream.finish()
    deltas.append(stream.final_deltas())
    assert [(c.name, json.loads(c.arguments)) for c in streamed] == calls
    assert not any(m in shown + rest for m in ("<tool_call>", "[TOOL_CALLS]", '"name"'))
    assert joined(deltas) == [c.openai(i) for i, c in enumerate(streamed)]
    pieces = [e for d in deltas for e in d if e["function"].get("arguments")]
    whole = family == "Qwen3-Coder" or family in SINGLE_CALL      # XML; Llama's bare JSON
    assert len(pieces) == len(calls) if whole else len(pieces) > len(calls)


@pytest.fixture(scope="module")
def byte_vocabulary():
    """A byte-level vocabulary (Qwen2's, 152k tokens) that spells every marker as text."""
    pytest.importorskip("llguidance")
    from polydev.models.gguf import GGUFFile
    from polydev.models.grammar import GrammarVocabulary
    from polydev.models.tokenizer import Tokenizer
    with GGUFFile(vocab_dir() / "ggml-vocab-qwen2.gguf") as f:
        tokenizer = Tokenizer.from_gguf(f)
    return tokenizer, GrammarVocabulary(tokenizer)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_grammar_that_forces_calls_takes_what_the_template_writes(family,
                                                                      byte_vocabulary):
    """``call_grammar`` in each family's own syntax: the calls its template writes are a
    whole match, and a call of a function not offered is refused."""
    from polydev.models.grammar import Grammar, GrammarError
    tokenizer, vocabulary = byte_vocabulary
    template = (templates_dir() / f"{family}.jinja").read_text()
    calls = CALLS[:1] if family in SINGLE_CALL else CALLS
    grammar = Grammar("lark", call_grammar(TOOLS, "required", len(calls) > 1, template,
                                           lambda text: None))
    compiled = vocabulary.compile(grammar)
    matcher = vocabulary.matcher(compiled)
    text = assistant_text(template, calls).split("</think>")[-1].lstrip()   # calls, not thought
    for token in tokenizer.encode(text, add_special=False):
        matcher.accept(token)
    assert matcher.complete
    wrong = assistant_text(template, [("get_time", {"city": "Paris"})]).split("</think>")[-1]
    matcher = vocabulary.matcher(compiled)
    with pytest.raises(GrammarError):
        for token in tokenizer.encode(wrong.lstrip(), add_special=False):
            matcher.accept(token)


def joined(deltas: list[list[dict]]) -> list[dict]:
    """The calls a client builds from streamed ``delta.tool_calls`` entries, as OpenAI's
    client does: the first entry of an index opens it, later ones add to its arguments."""
    calls: list[dict] = []
    for entry in (e for d in deltas for e in d):
        if entry["index"] == len(calls):
            calls.append({**entry, "function": dict(entry["function"])})
        else:
            assert "name" not in entry["function"] and "id" not in entry
            calls[entry["index"]]["function"]["arguments"] += entry["function"]["arguments"]
    return calls


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False,
                                                                      allow_infinity=False)
    | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4),
                                                                      children, max_size=3),
    max_leaves=8)


@given(st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=4),
       st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " : ")]), st.booleans())
@settings(max_examples=200, deadline=None)
def test_streamed_arguments_are_prefixes_of_the_whole_and_join_into_it(value, separators,
                                                                       ascii_only):
    """However a model spaces and escapes its JSON, each cut of it gives a text that the dump
    of the whole begins with, never shorter than the last, and the whole gives the dump."""
    raw = json.dumps(value, separators=separators, ensure_ascii=ascii_only)
    whole = json.dumps(json.loads(raw), ensure_ascii=False)
    last = ""
    for cut in range(len(raw) + 1):
        prefix = json_prefix(raw[:cut])
        assert whole.startswith(prefix) and len(prefix) >= len(last), (raw[:cut], prefix)
        last = prefix
    assert last == whole


def streamed(text: str, piece: int = 4) -> tuple[str, list, list[dict]]:
    """Content shown, calls, and the calls a client joins, of ``text`` streamed in pieces."""
    stream, shown, deltas = ToolCallStream(TOOLS), "", []
    for i in range(0, len(text), piece):
        shown += stream.feed(text[i:i + piece])
        deltas.append(stream.deltas())
    rest, calls = stream.finish()
    deltas.append(stream.final_deltas())
    return shown + rest, calls, joined(deltas)


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": " search ", "arguments": {"query": "a"}}\n</tool_call>',
    '<tool_call>\n{"name": "search", "arguments": "{\\"query\\": \\"a\\"}"}</tool_call>',
    '<tool_call>\n{"name": "search", "parameters": {"query": "b"}, "arguments": {"query": "a"}}',
    '{"name": "search", "parameters": {"query": "a"}}',
    '[TOOL_CALLS][{"name": "search", "arguments": {"query": "\\ud83d\\ude00 x"}}]'])
def test_streamed_calls_join_into_the_calls_of_the_whole_reply(text):
    """A name with spaces, arguments written as a JSON string, both keys, Llama's bare
    object, an escaped surrogate pair: what a client joins is what the whole reply gives."""
    content, calls, joined_calls = streamed(text)
    assert calls == parse_tool_calls(text, TOOLS)[1][:len(calls)] or calls
    assert joined_calls == [c.openai(i) for i, c in enumerate(calls)]
    assert [c.name for c in calls] == ["search"] and content == ""


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "search", "arguments": {"query": "C:\\users\\bob"}}',
    '<tool_call>\n{"name": "search", "arguments": {"query": "cut off by the len',
    '<tool_call>\n{"name": "search", "arguments": {"query": "a",}}</tool_call>',
    "<tool_call>\n" + "[" * 3000,
    '<tool_call>\n{"name": "search", "arguments": ' + "[" * 3000 + "]" * 3000 + "}"])
def test_a_call_that_breaks_off_or_is_no_json_stands_as_streamed(text):
    """Cut off, an escape that is no escape, a trailing comma, nesting past Python's limit:
    no error; a call whose name was streamed stays a call (as OpenAI's do when cut off), with
    the arguments sent, and its text is not shown as content; no name, no call."""
    content, calls, joined_calls = streamed(text)
    assert joined_calls == [c.openai(i) for i, c in enumerate(calls)]
    named = '"search"' in text
    assert [c.name for c in calls] == (["search"] if named else [])
    assert content == ("" if named else text)


def test_a_whole_call_before_one_cut_off_keeps_all_its_arguments():
    """The reads a long argument skips are caught up at the end: a whole call then one cut
    off by the length limit, fed a character at a time, both stand, the first whole."""
    first = {"query": "x" * 300}
    text = ('<tool_call>\n{"name": "search", "arguments": ' + json.dumps(first) + "}\n"
            '</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"query": "ab')
    content, calls, joined_calls = streamed(text, piece=1)
    assert content == "" and json.loads(calls[0].arguments) == first
    assert calls[1].arguments == '{"query": "ab'
    assert joined_calls == [c.openai(i) for i, c in enumerate(calls)]


def test_a_long_argument_is_read_a_logarithmic_number_of_times(monkeypatch):
    """48 KB of arguments in 4-character pieces: each piece is not a new read of all of
    them (that was O(n²): 14 s of CPU on this size)."""
    import polydev.models.tool_call_stream as module
    reads = []
    monkeypatch.setattr(module, "json_prefix", lambda t: reads.append(t) or "")
    text = '<tool_call>\n{"name": "search", "arguments": {"query": "' + "word " * 9600
    streamed(text)
    assert 20 < len(reads) < 200


def test_content_before_a_call_streams_and_text_that_is_no_call_stays_content():
    stream = ToolCallStream(TOOLS)
    shown = stream.feed("Let me look. ") + stream.feed("<tool_") + stream.feed("call>\n")
    assert shown == "Let me look. "
    shown += stream.feed('{"name": "search", "arguments": {"query": "x"}}\n</tool_call>')
    rest, calls = stream.finish()
    assert shown + rest == "Let me look. " and [c.name for c in calls] == ["search"]

    text = '{"name": "search", "parameters": {"query": "a; b"}}; {"name": "search"}'
    assert [json.loads(c.arguments) for c in parse_tool_calls(text, TOOLS)[1]] == [
        {"query": "a; b"}, {}]
    for text in ('{"name": "unknown_function", "parameters": {}}', "<tool_call>{not json",
                 "[TOOL_CALLS] nothing", 'A plain answer with {"braces"}.', '{"name": [1]}',
                 '<|python_tag|>{"name": {"a": 1}}'):
        assert parse_tool_calls(text, TOOLS) == (text, [])
        stream = ToolCallStream(TOOLS)
        shown = stream.feed(text)
        rest, calls = stream.finish()
        assert shown + rest == text and calls == []


def test_qwen3_coder_values_are_strings_where_the_schema_says_so():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
            "<parameter=days>\n7\n</parameter>\n</function>\n</tool_call>")
    _, [call] = parse_tool_calls(text, TOOLS)
    assert json.loads(call.arguments) == {"city": "42", "days": 7}


def test_gpt_oss_calls_come_out_of_the_commentary_channel():
    text = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant "
            "to=functions.get_weather<|channel|>commentary json<|message|>"
            '{"city": "Paris"}')
    splitter, parts = ChannelSplitter(), []
    for i in range(0, len(text), 4):
        parts += splitter.feed(text[i:i + 4])
    parts += splitter.finish()
    assert "".join(p for k, p in parts if k == "reasoning") == "Need the weather."
    assert [p for k, p in parts if k == "call"] == ["get_weather"]
    assert json.loads("".join(p for k, p in parts if k == "arguments")) == {"city": "Paris"}
    assert not [p for k, p in parts if k == "content"]

    splitter = ChannelSplitter()           # text after a call is no call's arguments
    parts = splitter.feed("<|start|>assistant to=functions.f<|channel|>commentary<|message|>{}"
                          "<|end|>Plain words")
    parts += splitter.finish()
    assert parts[-1] == ("content", "Plain words")


def test_a_template_without_tools_gets_them_in_the_system_message():
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "x", "function": {"name": "get_weather",
                                             "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "tool_call_id": "x", "content": "-3 C"}]
    out = without_tool_roles(messages, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.") and '"get_weather"' in out[0]["content"]
    _, [call] = parse_tool_calls(out[2]["content"], TOOLS)
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo"})
    assert "<tool_response>\n-3 C\n</tool_response>" == out[3]["content"]
