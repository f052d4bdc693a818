"""Speculative decoding's drafts: guesses of the next tokens of a sequence, which the target
model then checks all at once (``BatchEngine``: one batch holds a sequence's next token and
its draft, and the sampler walks the rows, keeping drafted tokens while they equal what it
samples). What comes out is what the target alone would give: greedy text token for token,
sampled text from the same distribution, since every token kept is one the sampler drew from
the target's own logits.

Two drafters, as llama-server's:
- ``NgramDrafter`` (``--spec-type ngram``): no model; the last few tokens are looked up in the
  sequence so far (prompt and reply), and what followed their latest earlier occurrence is
  the draft. Text that quotes its prompt (an edit of a given text, code refactored) drafts
  well.
- ``ModelDrafter`` (``-md FILE``): a small model of the same vocabulary drafts greedily, a
  sequence of its own cache per slot, stopping when its best token's probability falls below
  ``p_min``.

``draft_max`` caps a draft, ``draft_min`` is the shortest worth checking (shorter ones are
dropped, as llama-server's ``--draft-min``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from polydev.errors import InvalidArgumentError

from .batch import Batch, common_prefix

__all__ = ["Drafter", "ModelDrafter", "NgramDrafter", "SpeculativeSettings"]


@dataclass(frozen=True)
class SpeculativeSettings:
    """llama-server's knobs: ``--draft-max``, ``--draft-min``, ``--draft-p-min``, and the
    n-gram lookup's longest and shortest n-gram."""

    draft_max: int = 16
    draft_min: int = 0
    p_min: float = 0.75
    ngram_max: int = 4
    ngram_min: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.draft_max <= 64:
            raise InvalidArgumentError(f"draft_max (--draft-max) must be in [1, 64], got "
                                       f"{self.draft_max}")
        if not 0 <= self.draft_min <= self.draft_max:
            raise InvalidArgumentError(f"draft_min (--draft-min) must be in [0, draft_max], got "
                                       f"{self.draft_min}")
        if not 0.0 <= self.p_min <= 1.0:
            raise InvalidArgumentError(f"p_min (--draft-p-min) must be in [0, 1], got {self.p_min}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise InvalidArgumentError("ngram_min must be in [1, ngram_max]")


class Drafter(Protocol):
    """Drafts for many sequences at once."""

    settings: SpeculativeSettings

    def draft(self, histories: dict[int, list[int]], limits: dict[int, int]
              ) -> dict[int, list[int]]:
        """For each slot id, its history (every token of its sequence, the next one to
        evaluate last), at most ``limits[id]`` drafted tokens that may follow."""

    def close(self) -> None:
        """Free what the drafter holds."""


class NgramDrafter:
    """Drafts by looking the sequence's last n-gram up in the sequence itself."""

    def __init__(self, settings: SpeculativeSettings | None = None) -> None:
        self.settings = settings or SpeculativeSettings()

    def draft(self, histories: dict[int, list[int]], limits: dict[int, int]
              ) -> dict[int, list[int]]:
        return {slot: self._one(history, limits[slot]) for slot, history in histories.items()}

    def close(self) -> None:
        pass

    def _one(self, history: list[int], limit: int) -> list[int]:
        s = self.settings
        tokens = np.asarray(history, dtype=np.int64)
        for n in range(min(s.ngram_max, tokens.size - 1), s.ngram_min - 1, -1):
            found = _latest_earlier(tokens, n)
            if found >= 0:
                start = found + n
                return tokens[start:start + min(limit, s.draft_max)].tolist()
        return []


def _latest_earlier(tokens: np.ndarray, n: int) -> int:
    """Where the last ``n`` tokens occurred before, latest first; -1 when nowhere."""
    tail = tokens[-n:]
    windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)
    hits = np.flatnonzero((windows == tail).all(axis=1))
    return int(hits[-1]) if hits.size else -1


class ModelDrafter:
    """Drafts with a small model: greedy, while its best token is at least ``p_min`` likely.
    Its cache holds a sequence per slot (its ids are the slots'), kept in step with the
    slot's tokens by their common beginning."""

    def __init__(self, model, target_vocab: int,
                 settings: SpeculativeSettings | None = None) -> None:
        if model.hparams.n_vocab != target_vocab:
            raise InvalidArgumentError(f"the draft model's vocabulary has "
                                       f"{model.hparams.n_vocab} tokens, the target's "
                                       f"{target_vocab}: they must be the same")
        self.model, self.settings = model, settings or SpeculativeSettings()
        model.reset()
        self._cached: dict[int, list[int]] = {}

    def close(self) -> None:
        """Close the draft model."""
        self.model.close()

    def draft(self, histories: dict[int, list[int]], limits: dict[int, int]
              ) -> dict[int, list[int]]:
        rows = self._catch_up(histories)
        drafts: dict[int, list[int]] = {slot: [] for slot in histories}
        active = {slot: row for slot, row in rows.items()
                  if min(limits[slot], self.settings.draft_max) > 0}
        while active:
            batch, order = Batch(), []
            for slot, row in active.items():
                token, p = _best(row)
                if p < self.settings.p_min:
                    continue
                drafts[slot].append(token)
                if len(drafts[slot]) >= min(limits[slot], self.settings.draft_max):
                    continue
                batch.add(token, slot, logits=True)
                order.append(slot)
            if not order or self.model.memory.cells.free < len(order):
                break
            logits = self.model.evaluator.decode(batch)
            for slot, token in zip(order, batch.tokens):
                self._cached[slot].append(token)
            active = dict(zip(order, logits))
        return drafts

    def _catch_up(self, histories: dict[int, list[int]]) -> dict[int, np.ndarray]:
        """Evaluate what each sequence's history has that the draft cache lacks; the logits
        after each history's last token. Idle slots' sequences leave first when the cache
        has no room; it starts over when it still has none."""
        memory = self.model.memory
        needed = sum(map(len, histories.values()))
        for slot in [s for s in self._cached if s not in histories]:
            if memory.cells.free >= needed:
                break
            memory.seq_rm(slot)
            del self._cached[slot]
        batch, order = Batch(), []
        for slot, history in histories.items():
            keep = common_prefix(self._cached.get(slot, []), history[:-1])  # the last: logits
            memory.seq_rm(slot, keep)
            self._cached[slot] = history[:keep]
            batch.add_sequence(history[keep:], slot, logits="last")
            order.append(slot)
        if memory.cells.free < len(batch):
            memory.seq_rm(-1)
            self._cached.clear()
            return {}
        logits = self.model.evaluator.decode(batch)
        for slot in order:
            self._cached[slot] = list(histories[slot])
        return dict(zip(order, logits))


def _best(row: np.ndarray) -> tuple[int, float]:
    token = int(np.argmax(row))
    x = row.astype(np.float64)
    p = 1.0 / float(np.exp(x - x[token]).sum())
    return token, p
