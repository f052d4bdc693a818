"""llama.cpp's SentencePiece tokenizer (``tokenizer.ggml.model == "llama"``) over the token
scores, without merges.

The text is split into characters; the adjacent pair whose joined text is the
highest-scoring token is merged (ties: the leftmost), again and again until no pair joins
into a token. Each final symbol is then emitted as its token, or split back along the pairs
that formed it, and a character with no token of its own becomes its UTF-8 bytes' ``<0xXX>``
tokens. This is ``llm_tokenizer_spm_session`` step for step, its stale-pair and
``rev_merge`` rules included, so the ids are llama.cpp's.

Why not a Hugging Face BPE: expressing this as BPE needs every split of every token as a
merge (514,847 for gemma-3's 262,144 tokens), which held about 290 MiB of RSS. Here the lookup
is ``TokenTexts.id_of`` over the texts the ``Vocab`` already holds.
"""

from __future__ import annotations

import heapq
from typing import Callable

import numpy as np

from polydev.errors import TokenizerError

from .token_texts import TokenTexts

__all__ = ["SentencePieceEncoder"]


class SentencePieceEncoder:
    """Encodes escaped text (spaces already ``▁``) into token ids, as llama.cpp does."""

    def __init__(self, tokens: TokenTexts, scores: np.ndarray | None) -> None:
        self._tokens = tokens
        self._scores = (scores.astype(np.float32) if scores is not None
                        else np.zeros(len(tokens), np.float32))

    def encode(self, text: str) -> list[int]:
        """The token ids of ``text``."""
        if not text:
            return []
        session = _Session(text, self._tokens, self._scores)
        return session.run()


class _Session:
    """One text's symbols: runs of characters linked as a list, merged in place. Symbol ``i``
    starts at character ``i`` (a merge grows the left symbol), so only lengths change."""

    def __init__(self, text: str, tokens: TokenTexts, scores: np.ndarray) -> None:
        n = len(text)
        self.text = text
        self.id_of = tokens.id_of
        self.scores = scores
        self.length = [1] * n
        self.prev = list(range(-1, n - 1))
        self.next = list(range(1, n + 1))
        self.next[-1] = -1
        self.queue: list[tuple[float, int, int, int]] = []   # (-score, left, right, size)
        self.formed_by: dict[str, tuple[int, int]] = {}        # llama.cpp's rev_merge

    def run(self) -> list[int]:
        for i in range(1, len(self.text)):
            self._try_pair(i - 1, i)
        length, prev, nxt = self.length, self.prev, self.next
        while self.queue:
            _, left, right, size = heapq.heappop(self.queue)
            # a pair one of whose symbols has changed since it was queued is stale
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue
            length[left] += length[right]
            length[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            self._try_pair(prev[left], left)
            self._try_pair(left, nxt[left])
        out: list[int] = []
        i = 0
        while i != -1:
            self._emit(i, out)
            i = nxt[i]
        return out

    def _try_pair(self, left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        size = self.length[left] + self.length[right]
        joined = self.text[left:left + size]
        token = self.id_of(joined)
        if token is None:
            return
        heapq.heappush(self.queue, (-float(self.scores[token]), left, right, size))
        self.formed_by[joined] = (left, right)

    def _emit(self, symbol: int, out: list[int]) -> None:
        """The symbol's token, or its parts' tokens (llama.cpp's resegment)."""
        pending = [symbol]
        while pending:
            i = pending.pop()
            piece = self.text[i:i + self.length[i]]
            token = self.id_of(piece)
            if token is not None:
                out.append(token)
                continue
            parts = self.formed_by.get(piece)
            if parts is None:
                out.extend(self._byte_tokens(piece))
                continue
            pending.append(parts[1])       # the stack pops the left part first
            pending.append(parts[0])

    def _byte_tokens(self, piece: str) -> list[int]:
        # "surrogatepass": a lone surrogate has no UTF-8; its code point's bytes stand in
        data = piece.encode("utf-8", "surrogatepass")
        return [_byte_token(self.id_of, b) for b in data]


def _byte_token(id_of: Callable[[str], int | None], byte: int) -> int:
    token = id_of(f"<0x{byte:02X}>")
    if token is None and byte < 0x80:
        token = id_of(chr(byte))
    if token is None:
        raise TokenizerError(f"the vocabulary has no token for the byte 0x{byte:02X}, "
                             f"which a character of the text falls back to")
    return token
