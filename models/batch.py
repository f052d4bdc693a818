"""A batch of tokens from one or many sequences (llama.cpp's ``llama_batch``).

Each token has a sequence id, a position in that sequence, and a flag that asks for its logits.
``Batch`` is what a caller fills; the evaluator checks it against the cache (positions must
continue each sequence where the cache leaves it) and cuts it into ``UBatch`` es of at most
``n_batch`` tokens, the unit one graph computes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["Batch", "UBatch", "common_prefix", "padded_size"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many tokens ``a`` and ``b`` share at their beginning."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


def padded_size(n_tokens: int, limit: int) -> int:
    """The token count a step that reads ``n_tokens`` of a prompt is padded to, at most
    ``limit``: the next power of two up to 8, then the next multiple of 8 up to 128, then of
    an eighth of the power of two below (16 from 128 to 255 tokens, 32 from 256 to 511, ...).

    A prompt's length changes from request to request, and a step of a new length builds,
    places and binds a graph in Python: tens of milliseconds, more than the compute of a
    short prompt. Padded, a server meets 35 shapes up to 512 tokens, each built once,
    for at most an eighth more rows from 64 tokens on, and 4 rows more on average below."""
    if n_tokens <= 8:
        size = 1 << max(0, n_tokens - 1).bit_length()
    else:
        step = max(8, (1 << (n_tokens.bit_length() - 1)) // 8)
        size = -(-n_tokens // step) * step
    return max(n_tokens, min(size, limit))


class Batch:
    """Tokens to evaluate in one call: ``add`` one at a time or ``add_sequence`` many."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.positions: list[int | None] = []   # None: the next position of the sequence
        self.seq_ids: list[int] = []
        self.logits: list[bool] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, seq_id: int = 0, pos: int | None = None,
            logits: bool = False) -> "Batch":
        """Append ``token`` of sequence ``seq_id`` at ``pos`` (default: right after the
        sequence's last token, in the cache or earlier in this batch); ``logits`` asks for
        its logits."""
        self.tokens.append(int(token))
        self.positions.append(None if pos is None else int(pos))
        self.seq_ids.append(int(seq_id))
        self.logits.append(bool(logits))
        return self

    def add_sequence(self, tokens: Sequence[int], seq_id: int = 0, *,
                     logits: str = "last") -> "Batch":
        """Append ``tokens`` of ``seq_id`` at the sequence's next positions; ``logits`` is
        "last" (the last token's, for the next one), "all" or "none"."""
        n = len(tokens)
        for i, token in enumerate(tokens):
            self.add(token, seq_id, logits=logits == "all" or (logits == "last" and i == n - 1))
        return self


@dataclass(frozen=True)
class UBatch:
    """Tokens one graph evaluates: int32 arrays of equal length, and the indices of the tokens
    whose logits are output (ascending)."""

    tokens: np.ndarray
    positions: np.ndarray
    seq_ids: np.ndarray
    outputs: np.ndarray

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @classmethod
    def of_sequence(cls, tokens, first_pos: int, seq_id: int = 0,
                    outputs: str = "last") -> "UBatch":
        """``tokens`` of one sequence from position ``first_pos``."""
        tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        n = tokens.size
        if n == 1 and outputs == "last":    # a decode step: one array for its three numbers
            numbers = np.array([first_pos, seq_id, 0], dtype=np.int32)
            return cls(tokens, numbers[0:1], numbers[1:2], numbers[2:3])
        out = np.arange(n, dtype=np.int32) if outputs == "all" else np.array([n - 1], np.int32)
        return cls(tokens, np.arange(first_pos, first_pos + n, dtype=np.int32),
                   np.full(n, seq_id, dtype=np.int32), out)

    def padded(self, n_tokens: int) -> "UBatch":
        """This ubatch with rows added up to ``n_tokens``, each a copy of the last row (its
        token, position and sequence, so that it attends what that row attends and no row
        of it is all masked); the outputs stay the real rows'."""
        extra = n_tokens - self.n_tokens
        if extra <= 0:
            return self

        def grown(a: np.ndarray) -> np.ndarray:
            return np.concatenate([a, np.repeat(a[-1:], extra)])
        return UBatch(grown(self.tokens), grown(self.positions), grown(self.seq_ids),
                      self.outputs)

    def split(self, n_batch: int) -> list["UBatch"]:
        """Consecutive pieces of at most ``n_batch`` tokens."""
        if self.n_tokens <= n_batch:
            return [self]
        pieces = []
        for first in range(0, self.n_tokens, n_batch):
            last = min(first + n_batch, self.n_tokens)
            out = self.outputs[(self.outputs >= first) & (self.outputs < last)] - first
            pieces.append(UBatch(self.tokens[first:last], self.positions[first:last],
                                 self.seq_ids[first:last], out.astype(np.int32)))
        return pieces
