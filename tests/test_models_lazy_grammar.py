"""Lazy grammars (``tool_choice`` "auto"): every token is free until the reply writes the
marker that opens a call, the call then follows the grammar (its name one of the functions,
its arguments the function's schema) and the reply ends with it; a marker cut inside a token,
reasoning, and text the grammar refuses; and the engine generating under one."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from polydev.models import SamplingParams, load  # noqa: E402
from polydev.models.engine import BatchEngine, Finished, Piece  # noqa: E402
from polydev.models.gguf import GGUFFile  # noqa: E402
from polydev.models.grammar import Grammar, GrammarVocabulary  # noqa: E402
from polydev.models.lazy_grammar import LazyGrammar  # noqa: E402
from polydev.models.tokenizer import Tokenizer  # noqa: E402
from polydev.models.tool_calls import call_grammar, call_trigger, parse_tool_calls  # noqa: E402

from model_files import write_test_model  # noqa: E402
from needs import vocab_dir  # noqa: E402

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                           "days": {"type": "integer", "maximum": 9}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "noop", "parameters": {
             "type": "object", "properties": {}, "additionalProperties": False}}}]
CALL = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n'
        '</tool_call>')


@pytest.fixture(scope="module")
def qwen2():
    """A byte-level BPE vocabulary of 152k tokens where ``<tool_call>`` is text: ".<" is one
    token, so the marker begins inside one."""
    with GGUFFile(vocab_dir() / "ggml-vocab-qwen2.gguf") as f:
        tokenizer = Tokenizer.from_gguf(f)
    vocabulary = GrammarVocabulary(tokenizer)
    compiled = vocabulary.compile(Grammar("lark", hermes_grammar()))
    return tokenizer, vocabulary, compiled


def hermes_grammar(parallel: bool = False) -> str:
    return call_grammar(TOOLS, "required", parallel, "", lambda text: None)


def lazy(qwen2, thinking=None) -> LazyGrammar:
    _, vocabulary, compiled = qwen2
    return LazyGrammar(vocabulary, compiled, call_trigger(""), thinking)


def feed(grammar: LazyGrammar, tokenizer: Tokenizer, text: str) -> list[int]:
    tokens = tokenizer.encode(text, add_special=False)
    for t in tokens:
        assert grammar.allows(t)
        grammar.accept(t)
    return tokens


def test_tokens_are_free_until_the_marker_then_the_call_follows_the_grammar(qwen2):
    tokenizer, vocabulary, _ = qwen2
    grammar = lazy(qwen2)
    logits = np.random.default_rng(0).standard_normal(tokenizer.n_vocab).astype(np.float32)
    feed(grammar, tokenizer, "Sure, I will look it up for you. Any words, {\"even\": json}.")
    assert not grammar.triggered and grammar.mask(logits) is logits
    assert all(grammar.allows(t) for t in range(0, tokenizer.n_vocab, 997))
    tokens = tokenizer.encode("Sure.<tool_call>\n", add_special=False)
    assert tokenizer.token_to_piece(tokens[1]) == b".<"     # the marker begins mid-token
    for t in tokens:
        grammar.accept(t)
    assert grammar.triggered
    masked = grammar.mask(logits)
    allowed = np.isfinite(masked)
    assert allowed.sum() < tokenizer.n_vocab // 100
    assert all(b'{"'.startswith(tokenizer.token_to_piece(int(t))[:2])
               for t in np.flatnonzero(allowed))
    assert not grammar.allows(tokenizer.encode("Paris", add_special=False)[0])
    feed(grammar, tokenizer, CALL[len("<tool_call>\n"):])
    assert grammar.matcher.complete
    assert np.flatnonzero(np.isfinite(grammar.mask(logits))).tolist() == sorted(
        vocabulary.end_ids)


def test_the_grammar_holds_the_name_and_the_arguments_to_the_schema(qwen2):
    tokenizer, _, _ = qwen2
    for wrong in ('{"name": "get_time"', '{"name": "get_weather", "arguments": {"city": 3',
                  '{"name": "get_weather", "arguments": {"town"'):
        grammar = lazy(qwen2)
        feed(grammar, tokenizer, "<tool_call>\n")
        tokens = tokenizer.encode(wrong, add_special=False)
        for t in tokens[:-1]:
            if not grammar.allows(t):
                break
            grammar.accept(t)
        else:
            assert not grammar.allows(tokens[-1]), wrong


def test_reasoning_is_free_and_a_refused_marker_leaves_the_reply_free(qwen2):
    tokenizer, _, _ = qwen2
    grammar = lazy(qwen2, thinking="open")          # the prompt opened the block
    feed(grammar, tokenizer, "I could write <tool_call>\nhere, but I think on.")
    assert not grammar.triggered
    feed(grammar, tokenizer, "</think>\n\n<tool_call>\n")
    assert grammar.triggered
    grammar = lazy(qwen2)
    feed(grammar, tokenizer, "<think>maybe <tool_call>\n?</think>")
    assert not grammar.triggered
    grammar = lazy(qwen2)                           # "{" straight after the marker, no "\n"
    feed(grammar, tokenizer, 'Call: <tool_call>{"name"')
    assert grammar.free and not grammar.triggered
    feed(grammar, tokenizer, " <tool_call>\n anything")
    assert not grammar.triggered


def test_each_family_has_the_trigger_of_the_syntax_its_grammar_writes():
    hermes = call_trigger("{{ tools }} <tool_call>")
    assert hermes.search("x <tool_call>".encode()) and call_trigger("") is not None
    assert call_trigger("[TOOL_CALLS] [ARGS]").search(b"[TOOL_CALLS]get")
    harmony = call_trigger("<|channel|> to=functions")
    match = harmony.search(b"<|channel|>analysis<|message|>hm<|end|><|start|>assistant"
                           b"<|channel|>commentary to=functions.get")
    assert match and match.start("call") == match.start() and match.start() > 40
    assert call_trigger("<｜tool▁call▁begin｜>").search("<｜tool▁calls▁begin｜>".encode())
    assert call_trigger("<tool_call>\n<function=").pattern == hermes.pattern
    for template in ("<|python_tag|>", '"parameters" <|start_header_id|>'):
        assert call_trigger(template) is None, template


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_test_model(tmp_path_factory.mktemp("lazy") / "m.gguf", n_layer=2,
                            weight_type="F16")
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        yield m


def generate(model, constraint, max_tokens=60) -> tuple[list[int], str]:
    engine = BatchEngine(model, n_slots=1)
    tokens, ends = [], []
    prompt = model.tokenize("w1 w2 w3")
    engine.submit(prompt, lambda e: tokens.extend(e.tokens) if isinstance(e, Piece)
                  else ends.append(e) if isinstance(e, Finished) else None,
                  max_tokens=max_tokens, params=SamplingParams(temperature=0.0),
                  constraint=constraint)
    engine.run_until_done()
    return tokens, ends[0].reason


def test_the_engine_generates_freely_up_to_the_trigger_and_by_the_grammar_after(model):
    """The greedy reply's own tokens up to one of them taken as the trigger, then what the
    grammar allows from that token on, and the end."""
    free, _ = generate(model, None)
    pieces = [model.tokenizer.token_to_piece(t) for t in free]
    text = b"".join(pieces)
    at = next(i for i in range(3, len(free)) if pieces[i].isascii() and pieces[i].strip()
              and text.find(pieces[i]) == len(b"".join(pieces[:i])))
    marker = pieces[at].decode()
    vocabulary = model.grammar_vocabulary
    compiled = vocabulary.compile(Grammar("lark", f'start: {json.dumps(marker)} " n=" '
                                                  '/[0-9]{3}/'))
    trigger = re.compile(re.escape(pieces[at]))
    tokens, reason = generate(model, LazyGrammar(vocabulary, compiled, trigger))
    assert tokens[:at + 1] == free[:at + 1]
    rest = b"".join(model.tokenizer.token_to_piece(t) for t in tokens[at + 1:]).decode()
    assert re.fullmatch(r" n=[0-9]{3}", rest) and reason == "stop"


def test_a_call_read_back_from_a_reply_the_grammar_made(qwen2):
    """Whatever tokens the model would pick, a masked greedy walk from the marker on writes a
    call that parses, names a function, and validates against its schema."""
    tokenizer, vocabulary, _ = qwen2
    rng = np.random.default_rng(3)
    grammar = lazy(qwen2)
    text = b"".join(tokenizer.token_to_piece(t) for t in
                    feed(grammar, tokenizer, "Let me see.\n<tool_call>\n"))
    for _ in range(200):
        token = int(np.argmax(grammar.mask(rng.standard_normal(tokenizer.n_vocab)
                                           .astype(np.float32))))
        if token in vocabulary.end_ids:
            break
        grammar.accept(token)
        text += tokenizer.token_to_piece(token)
    content, [call] = parse_tool_calls(text.decode(), TOOLS)
    assert content == "Let me see." and call.name in ("get_weather", "noop")
    if call.name == "get_weather":
        jsonschema.validate(json.loads(call.arguments), SCHEMA)
