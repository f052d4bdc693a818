"""llama.cpp's byte-level BPE (``llm_tokenizer_bpe_session``), for "gpt2" vocabularies.

Text is split into words by the pre-tokenizer's regexes (``pretokenizers.py``),
each applied in turn to the pieces the previous one left; each word's UTF-8 bytes are mapped
to GPT-2's printable characters, and its characters are merged pair by pair, the pair of
lowest merge rank first (the leftmost of equal ranks). A merged symbol that is no token falls
back to its single-byte tokens; bytes without one are dropped, as llama.cpp drops them.

The regexes need Unicode property classes (``\\p{L}``), which the ``regex`` module has and
``re`` lacks. Merge ranks are looked up by the merge's own text, ``"left right"``, in a
``TokenTexts`` table: llama.cpp asserts that no symbol holds a space, so that text names one
pair. Held this way, SmolLM2's 48,900 merges take about 2 MiB (a Rust ``tokenizers`` BPE
of the same vocabulary held about 35 MiB).
"""

from __future__ import annotations

import heapq
from typing import Iterable

import regex

from .pretokenizers import PreTokenizer
from .token_texts import TokenTexts

__all__ = ["ByteLevelBPE", "byte_level_decode"]


def _bytes_to_unicode() -> list[str]:
    """GPT-2's reversible map of the 256 byte values to printable characters."""
    printable = (set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1))
                 | set(range(ord("®"), ord("ÿ") + 1)))
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


_BYTE_CHARS = _bytes_to_unicode()
# latin-1 decoding makes byte b the character b; this table then maps it to GPT-2's character
_BYTE_TABLE = str.maketrans({chr(b): c for b, c in enumerate(_BYTE_CHARS)})
_CHAR_BYTES = {c: b for b, c in enumerate(_BYTE_CHARS)}
_WORDS_CACHED = 10_000        # words whose ids are remembered (Hugging Face keeps as many)


def byte_level_encode(text: str) -> str:
    """``text``'s UTF-8 bytes, each written as GPT-2's character for it."""
    return text.encode("utf-8", "surrogatepass").decode("latin-1").translate(_BYTE_TABLE)


def byte_level_decode(text: str) -> bytes:
    """The bytes a byte-level token text stands for; a character outside GPT-2's map stands
    for its own UTF-8 bytes."""
    return b"".join(bytes([_CHAR_BYTES[c]]) if c in _CHAR_BYTES else c.encode() for c in text)


class ByteLevelBPE:
    """Encodes plain text (no special tokens) to ids of a byte-level BPE vocabulary."""

    def __init__(self, tokens: TokenTexts, merges: Iterable[str], pre: PreTokenizer) -> None:
        self.tokens = tokens
        self.merges = TokenTexts.from_strings(merges)    # a merge's rank is its index
        self.ignore_merges = pre.ignore_merges
        self._splitters = [regex.compile(r) for r in pre.regexes]
        self._words: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``."""
        out: list[int] = []
        for word in self.split(text):
            ids = self._words.get(word)
            if ids is None:
                if len(self._words) >= _WORDS_CACHED:
                    self._words.clear()
                ids = self._words[word] = self._ids(byte_level_encode(word))
            out += ids
        return out

    def split(self, text: str) -> list[str]:
        """The pre-tokenizer's words: each regex splits every piece the previous one left into
        its matches and the text between them (llama.cpp's ``unicode_regex_split``)."""
        pieces = [text]
        for splitter in self._splitters:
            out = []
            for piece in pieces:
                start = 0
                for m in splitter.finditer(piece):
                    a, b = m.span()
                    if a == b:
                        continue
                    if a > start:
                        out.append(piece[start:a])
                    out.append(piece[a:b])
                    start = b
                if start < len(piece):
                    out.append(piece[start:])
            pieces = out
        return pieces

    def _ids(self, word: str) -> list[int]:
        """The ids of one byte-level encoded word."""
        if self.ignore_merges:
            whole = self.tokens.id_of(word)
            if whole is not None:
                return [whole]
        out = []
        for symbol in self.merge(word):
            token = self.tokens.id_of(symbol)
            if token is not None:
                out.append(token)
                continue
            # llama.cpp looks each byte of the symbol's UTF-8 up as a one-byte text: only an
            # ASCII byte can be one
            out += [t for ch in symbol if ord(ch) < 0x80
                    for t in [self.tokens.id_of(ch)] if t is not None]
        return out

    def merge(self, word: str) -> list[str]:
        """The symbols ``word``'s characters merge into, lowest rank first."""
        symbols = list(word)
        n = len(symbols)
        if n < 2:
            return symbols
        nxt = list(range(1, n)) + [-1]
        prev = list(range(-1, n - 1))
        queue: list[tuple[int, int, int, str]] = []
        for i in range(n - 1):
            self._push(queue, symbols, i, i + 1)
        while queue:
            _, left, right, text = heapq.heappop(queue)
            a, b = symbols[left], symbols[right]
            if not a or not b or a + b != text:
                continue                            # outdated by an earlier merge
            symbols[left], symbols[right] = text, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            if prev[left] >= 0:
                self._push(queue, symbols, prev[left], left)
            if nxt[left] >= 0:
                self._push(queue, symbols, left, nxt[left])
        return [s for s in symbols if s]

    def _push(self, queue: list, symbols: list[str], left: int, right: int) -> None:
        rank = self.merges.id_of(f"{symbols[left]} {symbols[right]}")
        if rank is not None:
            heapq.heappush(queue, (rank, left, right, symbols[left] + symbols[right]))
