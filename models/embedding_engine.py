"""Embedding requests batched together: what ``polydev serve --embeddings`` runs in place of
the generation engine, as llama-server's ``--embeddings`` mode serves embeddings only.

Requests are submitted from any thread and wait in a queue; each ``step`` (on the model's
thread) takes every waiting request and embeds all their inputs in as few batches as the cache
allows (``embeddings.embed``), then answers each request through its ``on_done``. It offers
the generation engine's face to the server's worker: ``step``, ``wait_for_work``, ``wake``,
``abort``, ``queued``, ``processing`` and ``snapshot``.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from polydev.errors import ContextFullError, InvalidArgumentError

from .embeddings import POOLING, embed
from .engine import EngineSnapshot, QueueFullError
from .waiting import Waiting

__all__ = ["EmbeddingEngine", "EmbeddingJob"]

log = logging.getLogger(__name__)


@dataclass
class EmbeddingJob:
    """One request: its inputs (token ids), pooling and normalization, and where its vectors
    (or the error that stopped them) go."""

    inputs: list[list[int]]
    pooling: str
    normalization: int
    on_done: Callable[[list[np.ndarray] | Exception], None]
    cancelled: bool = False

    def cancel(self) -> None:
        """Drop the request if it has not been embedded yet (any thread)."""
        self.cancelled = True


class EmbeddingEngine(Waiting[EmbeddingJob]):
    """Embedding requests over ``model``'s cache (see the module doc)."""

    def __init__(self, model, max_queued: int = 64) -> None:
        self.model, self.max_queued = model, max_queued
        model.reset()
        super().__init__()
        self._busy = False
        self.prompt_tokens = 0

    def submit(self, inputs: Sequence[Sequence[int]],
               on_done: Callable[[list[np.ndarray] | Exception], None], *,
               pooling: str, normalization: int = 2) -> EmbeddingJob:
        """Queue the embedding of ``inputs`` (lists of token ids); ``on_done`` gets one vector
        per input (or, pooling "none", one row per token), or the error."""
        if pooling not in POOLING:
            raise InvalidArgumentError(f"pooling must be one of {POOLING}, got {pooling!r}")
        inputs = [[int(t) for t in ids] for ids in inputs]
        n_ctx, n_vocab = self.model.n_ctx, self.model.hparams.n_vocab
        for i, ids in enumerate(inputs):
            if not ids:
                raise InvalidArgumentError(f"input {i} has no tokens")
            if len(ids) > n_ctx:
                raise ContextFullError(f"input {i} has {len(ids)} tokens; the context holds "
                                       f"{n_ctx}")
            if not all(0 <= t < n_vocab for t in ids):
                raise InvalidArgumentError(f"input {i} has a token id outside the vocabulary "
                                           f"[0, {n_vocab})")
        job = EmbeddingJob(inputs, pooling, normalization, on_done)
        with self._wake:
            if len(self._queue) >= max(self.max_queued, 1):     # one step takes them all
                raise QueueFullError(f"{len(self._queue)} requests are waiting already")
            self._queue.append(job)
            self._wake.notify()
        return job

    @property
    def processing(self) -> int:
        return int(self._busy)

    def snapshot(self) -> EngineSnapshot:
        """The queue and counters now; there are no slots."""
        cells = self.model.memory.cells
        return EngineSnapshot((), len(self._queue), int(self._busy), self.prompt_tokens, 0,
                              cells.used, cells.size)

    def step(self) -> bool:
        """Embed every waiting request; False when none waited."""
        with self._lock:
            jobs = [j for j in self._queue if not j.cancelled]
            self._queue.clear()
            self._busy = bool(jobs)
        try:
            groups: dict[tuple[str, int], list[EmbeddingJob]] = {}
            for job in jobs:
                groups.setdefault((job.pooling, job.normalization), []).append(job)
            for (pooling, normalization), group in groups.items():
                self._embed(group, pooling, normalization)
        finally:
            self._busy = False
        return bool(jobs)

    def _embed(self, jobs: list[EmbeddingJob], pooling: str, normalization: int) -> None:
        inputs = [ids for job in jobs for ids in job.inputs]
        try:
            vectors = embed(self.model, inputs, pooling, normalization)
        except Exception as e:              # the requests fail, the server goes on
            log.error("embedding %d inputs failed: %s", len(inputs), e)
            for job in jobs:
                job.on_done(e)
            return
        self.prompt_tokens += sum(map(len, inputs))
        start = 0
        for job in jobs:
            job.on_done(vectors[start:start + len(job.inputs)])
            start += len(job.inputs)

    def abort(self, error: Exception) -> None:
        """Answer every waiting request with ``error``."""
        with self._lock:
            jobs, self._queue = list(self._queue), deque()
        for job in jobs:
            job.on_done(error)
