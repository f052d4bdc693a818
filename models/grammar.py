"""Constrained sampling: a grammar decides which tokens may come next, as llama.cpp's grammar
sampler does, computed by llguidance (the library llama.cpp itself can use).

A ``Grammar`` is what a request asks for: a JSON schema (``response_format`` ``json_schema``,
llama-server's ``json_schema``), any JSON object (``json_object``), a GBNF grammar
(llama-server's ``grammar``), a Lark grammar or a regular expression. ``GrammarVocabulary``
holds a model's tokens as llguidance needs them (built once per model: 0.1-0.6 s for 49k-262k
tokens) and compiles grammars, refusing a bad one with a ``GrammarError`` that names the fault.
A ``GrammarMatcher`` follows one sequence: ``allows`` checks one token, ``mask`` sets the logits
of every token the grammar refuses to minus infinity (the engine masks only when a draw was
refused, as llama.cpp's sampler does), ``accept`` advances it by the sampled token. Once the
text is a whole match the end-of-generation tokens are allowed (and, where the grammar cannot
go on, only they), so the text may end there.

Why llguidance (``python bench/grammar_masks.py``, 2026-11-27, Zen 5): its mask takes 0.01 ms
per token at the median (0.6 ms p99) over 49k-262k tokens (unpacking it over the logits here
adds about 0.1 ms for 150k tokens), and a schema compiles in 1 ms, as
it computes masks lazily; xgrammar's masks are as fast but a schema compiles in 136-727 ms,
and it imports torch and transformers; outlines-core precomputes an index over the whole
vocabulary, 0.2-4.4 s per schema. A request's schema is new each time, so compilation is part
of its time to first token.

JSON follows Python's ``json.dumps`` spacing (", " and ": "), with no free whitespace: a small
model allowed free whitespace can fill ``max_tokens`` with blank lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from polydev.errors import InvalidArgumentError, MissingDependencyError

from .tokenizer import Tokenizer
from .tool_calls import JSON_SPACING
from .tokenizer.tokenizer import TokenType

__all__ = ["Grammar", "GrammarError", "GrammarMatcher", "GrammarVocabulary"]

KINDS = ("json_schema", "gbnf", "lark", "regex")
CONTROL_TYPES = (TokenType.CONTROL, TokenType.UNUSED)   # never text: named by id


class GrammarError(InvalidArgumentError):
    """A grammar or JSON schema that cannot be compiled (the message says what is wrong), or a
    token the grammar refuses."""


@dataclass(frozen=True)
class Grammar:
    """What a sequence must match: ``kind`` is one of ``KINDS`` and ``text`` the grammar (a
    JSON schema as JSON text)."""

    kind: str
    text: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"a grammar's kind is one of {KINDS}, got {self.kind!r}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool) -> "Grammar":
        """JSON text valid under ``schema``."""
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def json_object(cls) -> "Grammar":
        """Any JSON object (OpenAI's ``json_object`` response format)."""
        return cls.json_schema({"type": "object"})


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy
    except ImportError:
        raise MissingDependencyError("constrained sampling (grammars, JSON schemas) needs "
                                     "llguidance: pip install 'polydev[serve]'") from None
    return llguidance


class GrammarVocabulary:
    """A model's tokens as llguidance sees them: each token's bytes, control tokens marked
    (they are never text a grammar can match), and the end-of-generation tokens, which the
    grammar allows once it is complete."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        llg = _llguidance()
        vocab = tokenizer.vocab
        control = np.flatnonzero(np.isin(vocab.types, [int(t) for t in CONTROL_TYPES])).tolist()
        ends = sorted(tokenizer.eog_ids) or [tokenizer.eos_id if tokenizer.eos_id is not None
                                             else 0]
        self.n_vocab = tokenizer.n_vocab
        self.end_ids = tuple(ends)
        self._text_tokenizer = tokenizer
        self._tokenizer = _LlguidanceTokenizer(tokenizer, control, ends[0])
        self.lltokenizer = llg.LLTokenizer(llg.TokenizerWrapper(self._tokenizer),
                                           eos_token=ends)

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` adds to a reply (a control token's, its own text)."""
        return self._text_tokenizer.token_to_piece(token, special=True)

    def spell(self, text: bytes) -> list[int]:
        """Tokens whose bytes are ``text`` (a grammar takes any tokens that spell its text)."""
        return self._tokenizer(text)

    def compile(self, grammar: Grammar) -> str:
        """llguidance's form of ``grammar``, checked against this vocabulary."""
        llg = _llguidance()
        try:
            if grammar.kind == "json_schema":
                schema = json.loads(grammar.text)
                if not isinstance(schema, (dict, bool)):
                    raise GrammarError("a JSON schema must be an object or a boolean")
                compiled = llg.LLMatcher.grammar_from_json_schema(schema,
                                                                  defaults=JSON_SPACING)
            else:
                compiled = llg.grammar_from(grammar.kind, grammar.text)
        except (ValueError, TypeError) as e:        # json.JSONDecodeError is a ValueError
            raise GrammarError(f"the {_NAMES[grammar.kind]} is not valid: {e}") from None
        error = llg.LLMatcher.validate_grammar(compiled, self.lltokenizer)
        if error:
            raise GrammarError(f"the {_NAMES[grammar.kind]} is not valid: {error}")
        return compiled

    def matcher(self, grammar: Grammar | str) -> "GrammarMatcher":
        """A matcher at the start of ``grammar`` (a ``Grammar``, or what ``compile`` gave)."""
        compiled = self.compile(grammar) if isinstance(grammar, Grammar) else grammar
        return GrammarMatcher(self, compiled)


_NAMES = {"json_schema": "JSON schema", "gbnf": "GBNF grammar", "lark": "Lark grammar",
          "regex": "regular expression"}


class _LlguidanceTokenizer:
    """The attributes and the call llguidance's ``TokenizerWrapper`` reads: token bytes
    (control tokens behind a 0xff byte, as its llama.cpp bridge marks them) and an encoder
    (used to tokenize a grammar's literal strings)."""

    def __init__(self, tokenizer: Tokenizer, control: Sequence[int], eos: int) -> None:
        marked, vocab = set(control), tokenizer.vocab
        self.tokens = [b"\xff" + tokenizer.token_to_piece(i, special=True) if i in marked
                       else tokenizer.token_to_piece(i) for i in range(tokenizer.n_vocab)]
        self.eos_token_id, self.bos_token_id = eos, tokenizer.bos_id
        self.special_token_ids = list(control)
        self._tokenizer = tokenizer
        byte_ids = np.flatnonzero(vocab.types == int(TokenType.BYTE)).tolist()
        self._bytes = {tokenizer.token_to_piece(i)[0]: i for i in byte_ids}

    def __call__(self, text: bytes) -> list[int]:
        """Tokens that spell ``text`` exactly: the tokenizer's, or where they spell something
        else (a SentencePiece space without a "▁" piece) the byte tokens."""
        ids = self._tokenizer.encode_fragment(text.decode("utf-8", errors="replace"))
        if self._tokenizer.decode_bytes(ids) == text or not all(b in self._bytes for b in text):
            return ids
        return [self._bytes[b] for b in text]


class GrammarMatcher:
    """One sequence's place in a grammar (see the module doc)."""

    def __init__(self, vocabulary: GrammarVocabulary, compiled: str) -> None:
        llg = _llguidance()
        self._fill = llg.numpy.fill_next_token_bitmask
        self._matcher = llg.LLMatcher(vocabulary.lltokenizer, compiled, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"the grammar is not valid: {self._matcher.get_error()}")
        self._n_vocab = vocabulary.n_vocab
        self._bits = np.zeros((1, (vocabulary.n_vocab + 31) // 32), dtype=np.int32)
        self._filled = False                # the bits are this position's

    def _filled_bits(self) -> np.ndarray:
        if not self._filled:
            self._fill(self._matcher, self._bits)
            self._filled = True
        return self._bits[0]

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next: the parser tries its bytes, 0.002 ms, where a
        whole mask takes 0.05 ms (262k tokens, inside a JSON string)."""
        return 0 <= token < self._n_vocab and self._matcher.validate_tokens([int(token)]) == 1

    def allowed(self) -> np.ndarray:
        """A boolean per token: may it come next?"""
        bits = np.unpackbits(self._filled_bits().view(np.uint8), bitorder="little")
        return bits[:self._n_vocab].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` (a copy) with every token the grammar refuses at minus infinity."""
        return np.where(self.allowed(), logits, np.float32(-np.inf)).astype(np.float32,
                                                                           copy=False)

    def accept(self, token: int) -> None:
        """Advance by ``token``; a token the grammar refuses is a ``GrammarError``."""
        self._filled = False
        if not self._matcher.consume_token(int(token)):
            raise GrammarError(f"the grammar refuses token {token}: "
                               f"{self._matcher.get_error() or 'not allowed here'}")

    @property
    def complete(self) -> bool:
        """Whether the text so far is a whole match (the grammar allows ending here)."""
        return bool(self._matcher.is_accepting())

