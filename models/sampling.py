"""llama.cpp's sampler chain and defaults (``common_sampler``): repetition penalties over the
last ``repeat_last_n`` tokens (off by default), top-k 40, top-p 0.95, min-p 0.05, temperature
0.8, then a seeded draw from what is left. Temperature 0 (or less) is greedy.

Each step works on the logits of one token as numpy arrays of the surviving candidates; no
Python loop runs over the vocabulary.

``Sampler.logprobs`` reports a sampled token's log-probability, and its most likely
alternatives', in the distribution the draw came from: the logits after the penalties (and a
grammar's mask), at the request's temperature (1 when greedy), over the whole vocabulary. The
truncations (top-k, top-p, min-p) are left out, so that every alternative listed has a finite
log-probability. (llama-server reports the softmax of the raw logits by default, before
penalties, grammar and temperature.)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from polydev.errors import InvalidArgumentError

__all__ = ["SamplingParams", "Sampler", "TokenLogprob"]


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's log-probability and the ``top`` most likely tokens' (id, log-prob),
    most likely first, in the distribution it was drawn from (``Sampler.logprobs``)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class SamplingParams:
    """The knobs of the chain, with llama.cpp's defaults."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0       # 1.0: off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.top_p <= 1.0 or not 0.0 <= self.min_p <= 1.0:
            raise InvalidArgumentError(f"top_p ({self.top_p}) and min_p ({self.min_p}) must be "
                                       "in [0, 1]")
        if self.repeat_penalty <= 0:
            raise InvalidArgumentError(f"repeat_penalty must be > 0, got {self.repeat_penalty}")
        if self.seed is not None and self.seed < 0:
            raise InvalidArgumentError(f"seed must be 0 or more (None: a random one), got "
                                       f"{self.seed}")
        if self.repeat_last_n < -1:
            raise InvalidArgumentError(f"repeat_last_n must be -1 (the context) or more, got "
                                       f"{self.repeat_last_n}")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


class Sampler:
    """The chain with its state: the recent tokens the penalties look at, and the RNG."""

    def __init__(self, params: SamplingParams | None = None, n_ctx: int = 4096) -> None:
        self.params = params or SamplingParams()
        last_n = self.params.repeat_last_n
        self._recent: deque[int] = deque(maxlen=n_ctx if last_n == -1 else max(last_n, 0))
        self._rng = np.random.default_rng(self.params.seed)
        self._values: np.ndarray | None = None     # the last draw's logits, penalties applied

    def accept(self, token: int) -> None:
        """Record a token of the sequence (prompt or generated) for the penalties."""
        if self._recent.maxlen:
            self._recent.append(int(token))

    def sample(self, logits: np.ndarray) -> int:
        """The next token from one row of logits."""
        p = self.params
        logits = np.asarray(logits, dtype=np.float32)
        values = self._penalize(logits.copy()) if self._penalties_on() else logits
        self._values = values
        if p.greedy:
            best = int(np.argmax(values))      # a NaN's index, where there is one
            return best if not np.isnan(values[best]) else int(np.argmax(_numbers(values)))
        ids, values = _top_k(values, p.top_k)
        ids, values = _top_p(ids, values, p.top_p)
        ids, values = _min_p(ids, values, p.min_p)
        values = values / p.temperature
        probs = np.exp(values - values.max())
        probs /= probs.sum()
        return int(ids[self._rng.choice(len(ids), p=probs)])

    def logprobs(self, token: int, n_top: int) -> TokenLogprob:
        """``token``'s log-probability and the ``n_top`` most likely tokens' in the last
        ``sample``'s distribution (see the module doc)."""
        if self._values is None:
            raise InvalidArgumentError("logprobs needs a sample first")
        scaled = self._values / (self.params.temperature if not self.params.greedy else 1.0)
        finite = scaled[np.isfinite(scaled)]
        top = float(finite.max())
        log_total = top + float(np.log(np.sum(np.exp(finite - top))))
        k = min(n_top, finite.size)
        ids = _top_k(scaled, k)[0] if k else np.zeros(0, np.int64)
        return TokenLogprob(int(token), float(scaled[token]) - log_total,
                            tuple((int(i), float(scaled[i]) - log_total) for i in ids))

    def _penalties_on(self) -> bool:
        p = self.params
        return bool(self._recent) and (p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0
                                       or p.presence_penalty != 0.0)

    def _penalize(self, logits: np.ndarray) -> np.ndarray:
        """llama.cpp's penalties: positive logits divided by the repeat penalty, negative ones
        multiplied; then frequency * count and presence subtracted."""
        p = self.params
        tokens, counts = np.unique(np.fromiter(self._recent, dtype=np.int64), return_counts=True)
        tokens, counts = tokens[tokens < logits.shape[0]], counts[tokens < logits.shape[0]]
        seen = logits[tokens]
        seen = np.where(seen <= 0, seen * p.repeat_penalty, seen / p.repeat_penalty)
        logits[tokens] = seen - counts * p.frequency_penalty - p.presence_penalty
        return logits


_BLOCK = 256        # values per block whose maximum bounds the top k from below (_candidates)


def _top_k(values: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The token ids of the k largest values and those values, sorted descending (k <= 0:
    all, sorted); of equal values the lower ids. A NaN counts as minus infinity: never
    drawn while a number is left."""
    if values.size and np.isnan(values.max()):     # NaN where any value is: 14 µs at 262k
        values = _numbers(values)
    if 0 < k < len(values):
        ids = _candidates(values, k)
        chosen = values if ids is None else values[ids]
        # the k-th largest value among them, then the ids at or above it (more than k only
        # where values tie with it)
        kth = np.partition(chosen, len(chosen) - k)[len(chosen) - k]
        ids = np.flatnonzero(chosen >= kth) if ids is None else ids[chosen >= kth]
        if ids.size > k:
            above = ids[values[ids] > kth]
            ids = np.concatenate([above, ids[values[ids] == kth][:k - above.size]])
    else:
        ids = np.arange(len(values))
    values = values[ids]
    order = np.argsort(-values, kind="stable")
    return ids[order], values[order]


def _numbers(values: np.ndarray) -> np.ndarray:
    """``values`` with each NaN as minus infinity (never drawn while a number is left)."""
    return np.where(np.isnan(values), np.float32(-np.inf), values)


def _candidates(values: np.ndarray, k: int) -> np.ndarray | None:
    """Ascending ids that include the k largest values and every value tied with the k-th:
    those at or above the k-th largest of the blocks' maxima (k blocks' maxima are k values
    at or above it, so the k-th largest value is too). A selection over a 262k vocabulary
    took 1.6 ms, most of a sampled token's time; the blocks' maxima and one comparison take
    about a tenth of that, and leave a few hundred values to select from. None (select from
    all) for few blocks."""
    n_blocks = len(values) // _BLOCK
    if n_blocks < 4 * k:
        return None
    maxima = values[:n_blocks * _BLOCK].reshape(n_blocks, _BLOCK).max(axis=1)
    floor = np.partition(maxima, n_blocks - k)[n_blocks - k]
    return np.flatnonzero(values >= floor)


def _top_p(ids: np.ndarray, values: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest prefix (of the sorted candidates) whose probability reaches p."""
    if p >= 1.0:
        return ids, values
    probs = np.exp(values - values[0])
    cum = np.cumsum(probs / probs.sum())
    n = int(np.searchsorted(cum, p)) + 1
    return ids[:n], values[:n]


def _min_p(ids: np.ndarray, values: np.ndarray, p: float) -> tuple[np.ndarray, np.ndarray]:
    """Those whose probability is at least p times the largest one's."""
    if p <= 0.0:
        return ids, values
    keep = values >= values[0] + np.log(p)
    keep[0] = True
    return ids[keep], values[keep]
