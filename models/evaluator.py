"""Tokens in, logits out: the step loop over one ``Scheduler``.

A batch (tokens of one sequence, or of many: ``decode``) is evaluated in ubatches of
``n_batch`` tokens; each ubatch's tokens are placed in free cells of the KV cache and its graph
computes logits only for the rows asked for. Graphs are built once per
``StepShape`` and computed again with new inputs, set after allocation on every step; the
scheduler reuses its splits, allocation and bound plans when the same graph comes back, so a
decode step is a replay.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from polydev import Backend, Scheduler, tensor_set
from polydev.errors import (AllocationError, ContextFullError, InvalidArgumentError,
                            PolydevError)
from polydev.lifetime import Resource
from polydev.numerics import DEFAULT_NUMERICS, set_backend_numerics

from .arch import architecture
from .batch import Batch, UBatch, padded_size
from .graphs import builder
from .kv_cache import KVCache
from .kv_cells import MAX_SEQUENCES
from .kv_shift import KeyRope, KeyShiftGraph
from .layers import Weights
from .loader import ModelWeights
from .pipeline import micro_batch_size, pipeline_stages
from .step import MaskRows, StepGraph, StepShape

__all__ = ["Evaluator", "Timings"]

log = logging.getLogger(__name__)
# graphs kept built: prompts come in 35 padded shapes up to 512 tokens (batch.padded_size)
# and many sequences decode in batches of every size up to their number
_GRAPHS_KEPT = 48
# up to this many tokens (a decode step's) are checked against the vocabulary in Python: with
# the caches cold, as a step's weights leave them, each numpy call took 10-20 µs
_FEW_TOKENS = 16


@dataclass
class Timings:
    """llama.cpp's performance counters: prompt and generated tokens and their time."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    eval_tokens: int = 0
    eval_seconds: float = 0.0
    graphs_built: int = 0
    splits: dict[str, int] = field(default_factory=dict)        # per backend, last step
    copied_bytes: dict[str, int] = field(default_factory=dict)  # into each backend, in all

    def add(self, n_tokens: int, seconds: float, prompt: bool) -> None:
        if prompt:
            self.prompt_tokens += n_tokens
            self.prompt_seconds += seconds
        else:
            self.eval_tokens += n_tokens
            self.eval_seconds += seconds


class Evaluator(Resource):
    """Evaluates tokens at the end of the cached sequence and returns their logits."""

    def __init__(self, weights: ModelWeights, kv: KVCache, n_batch: int,
                 numerics: str = DEFAULT_NUMERICS) -> None:
        if n_batch <= 0:
            raise InvalidArgumentError(f"n_batch must be positive, got {n_batch}")
        self.hp = weights.placement.hparams
        self.weights = Weights(weights, architecture(self.hp.arch))
        self.kv, self.n_batch = kv, n_batch
        self._build = builder(self.hp.arch)
        placement = weights.placement
        used = {d.name for d in placement.layer_devices} | {d.name for d in placement.kv_devices}
        used |= {t.device.name for t in placement.tensors.values()}
        devices = [d for d in placement.offload_devices if d.name in used] + [placement.cpu]
        self.backends: list[Backend] = []
        try:
            self.backends = [d.init_backend() for d in devices]
            for b in self.backends:
                set_backend_numerics(b, numerics)
            self.stages = pipeline_stages(placement)
            self.sched = Scheduler(self.backends, graph_size=_graph_size(self.hp),
                                   parallel=self.stages > 1)
        except BaseException:
            for b in self.backends:
                b.close()
            raise
        self._graphs: OrderedDict[StepShape, StepGraph] = OrderedDict()
        self._mask_rows = MaskRows()                    # one scratch for every graph's masks
        self._last_graph: StepGraph | None = None       # the graph of the last step
        self._key_rope: dict[int, KeyRope] | None = None   # each layer's rope of its keys
        self.timings = Timings()
        self.embeddings = False     # steps output the final norm's rows (n_embd), not logits
        try:
            self._reserve()
        except BaseException:
            self._free()
            raise

    def _reserve(self) -> None:
        """Size the compute buffers for the largest prompt step (``n_batch`` tokens over the
        whole cache, one output), as llama.cpp reserves its worst case when a context is
        made: a buffer that grows later moves every graph's tensors, and each graph kept must
        be placed again. Host memory stays untouched until a step uses it; a device's is
        taken at load. Where that much cannot be had, the buffers grow as steps need (a step
        that outputs every row still grows them, once)."""
        n_tokens = min(self.n_batch, self.kv.size)
        shape = StepShape(n_tokens, self.kv.size, 1)
        graph = StepGraph(self.hp, self.kv, shape, lambda s: self._build(s, self.weights),
                          self._mask_rows)
        try:
            self.sched.reserve(graph.graph)
        except AllocationError as e:
            log.info("compute buffers grow as steps need them: %s", e)

    @property
    def n_past(self) -> int:
        """Tokens cached for sequence 0, the one ``eval`` continues."""
        return self.kv.seq_pos_max(0) + 1

    def eval(self, tokens, all_logits: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` after the cached ones of sequence 0; the logits of the last token,
        [n_vocab] (or of every token, [n_tokens, n_vocab], with ``all_logits``)."""
        self._check_open()
        tokens = self._checked_tokens(tokens)
        ub = UBatch.of_sequence(tokens, self.n_past, 0, "all" if all_logits else "last")
        out = self._run(ub)
        return out if all_logits else out[-1]

    def decode(self, batch: Batch) -> np.ndarray:
        """Evaluate ``batch`` (tokens of one or many sequences); the logits of the tokens it
        asked for, [n_asked, n_vocab], in the batch's order. Nothing of it stays cached when
        it fails."""
        self._check_open()
        return self._run(self._ubatch(batch))

    def reset(self) -> None:
        """Forget every cached sequence."""
        self.kv.clear()

    def prepare(self, ub: UBatch, n_real: int | None = None) -> tuple[StepGraph, np.ndarray]:
        """Place ``ub``'s tokens in free cells of the cache; the graph of the step (built if
        its shape is new, not yet allocated) and the cells. Rows from ``n_real`` on are
        padding (``UBatch.padded``): each is given a free cell that it writes, that no row
        reads (the mask leaves out free cells) and that stays free."""
        n_real = ub.n_tokens if n_real is None else n_real
        cells = self.kv.cells.find(ub.n_tokens)
        if cells is None:
            raise self._context_full(ub.n_tokens)
        self.kv.cells.assign(cells[:n_real], ub.positions[:n_real], ub.seq_ids[:n_real])
        n_outputs = max(1, ub.outputs.size)
        return self.graph(ub.n_tokens, n_outputs, prompt=n_outputs < n_real), cells

    def graph(self, n_tokens: int, n_outputs: int = 1, prompt: bool = False) -> StepGraph:
        """The graph for a step of ``n_tokens`` over the cells in use (built if new); a step
        that reads a prompt (some row outputs nothing) attends over a few recurring counts of
        them (``KVCache.n_kv``)."""
        n_kv = self.kv.n_kv(prompt)
        last = self._last_graph
        shape = StepShape(n_tokens, n_kv, n_outputs, self.embeddings)
        if last is not None and last.shape == shape:
            return last                 # decode: the last step's graph, most recently used
        g = self._graphs.get(shape)
        if g is None:
            g = self._graphs[shape] = StepGraph(self.hp, self.kv, shape,
                                                lambda s: self._build(s, self.weights),
                                                self._mask_rows)
            self._key_rope = g.key_rope
            self.timings.graphs_built += 1
            while len(self._graphs) > _GRAPHS_KEPT:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(shape)
        return g

    def _context_full(self, n_tokens: int) -> ContextFullError:
        return ContextFullError(
            f"the context holds {self.kv.size} tokens: {self.kv.cells.used} are cached and "
            f"{n_tokens} more do not fit (raise n_ctx, or free sequences)")

    def _checked_tokens(self, tokens) -> np.ndarray:
        n_vocab = self.hp.n_vocab
        if (isinstance(tokens, list) and 0 < len(tokens) <= _FEW_TOKENS
                and all(type(t) is int and 0 <= t < n_vocab for t in tokens)):
            return np.array(tokens, dtype=np.int32)   # a decode step's: one numpy call
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise InvalidArgumentError("eval needs at least one token")
        if tokens.size <= _FEW_TOKENS:   # numpy's two reductions cost more than the check
            in_range = all(0 <= t < n_vocab for t in tokens.tolist())
        else:
            in_range = tokens.min() >= 0 and tokens.max() < n_vocab
        if not in_range:
            bad = int(tokens[(tokens < 0) | (tokens >= n_vocab)][0])
            raise InvalidArgumentError(f"token id {bad} is outside the vocabulary "
                                       f"[0, {n_vocab})")
        return tokens.astype(np.int32)

    def _ubatch(self, batch: Batch) -> UBatch:
        """``batch`` checked against the cache, its positions filled in."""
        tokens = self._checked_tokens(batch.tokens)
        seq_ids = np.asarray(batch.seq_ids, dtype=np.int32)
        bad = seq_ids[(seq_ids < 0) | (seq_ids >= MAX_SEQUENCES)]
        if bad.size:
            raise InvalidArgumentError(f"sequence id {int(bad[0])} is outside "
                                       f"[0, {MAX_SEQUENCES})")
        following: dict[int, int] = {}
        positions = np.empty(tokens.size, dtype=np.int32)
        for i, (seq, pos) in enumerate(zip(batch.seq_ids, batch.positions)):
            expected = following.get(seq)
            if expected is None:
                expected = self.kv.seq_pos_max(seq) + 1
            if pos is not None and pos != expected:
                raise InvalidArgumentError(
                    f"token {i} of the batch is at position {pos} of sequence {seq}, which "
                    f"continues at position {expected}")
            positions[i] = expected
            following[seq] = expected + 1
        outputs = np.flatnonzero(np.asarray(batch.logits, dtype=bool)).astype(np.int32)
        return UBatch(tokens, positions, seq_ids, outputs)

    def _run(self, ub: UBatch) -> np.ndarray:
        """Evaluate ``ub`` in pieces of ``n_batch`` (micro-batches over a pipeline); the
        logits of its output rows. When a piece fails, the tokens of ``ub`` already cached
        are forgotten (llama.cpp's rollback)."""
        if ub.n_tokens > self.kv.cells.free:
            raise self._context_full(ub.n_tokens)
        self._turn_moved_keys()
        start = time.perf_counter()
        try:
            size = micro_batch_size(ub.n_tokens, self.n_batch, self.stages)
            reads = [self._step(piece) for piece in ub.split(size)]
            if self.stages > 1:
                self.sched.synchronize()
            rows = [read() for read in reads]
        except BaseException:
            if self.stages > 1:
                self._drain()
            for seq in np.unique(ub.seq_ids):    # the cells only: no edit of the sequences
                self.kv.cells.seq_rm(int(seq), int(ub.positions[ub.seq_ids == seq].min()))
            raise
        self.timings.add(ub.n_tokens, time.perf_counter() - start, ub.n_tokens > 1)
        return rows[0] if len(rows) == 1 else np.concatenate(rows)   # one step: no copy

    def _drain(self) -> None:
        """Wait out what a failed pipelined batch left queued on every stream, so that the
        next batch does not meet its error."""
        for backend in self.backends:
            try:
                backend.synchronize()
            except PolydevError as e:
                log.debug("%s after a failed batch: %s", backend.name, e)

    def _turn_moved_keys(self) -> None:
        """Turn the cached keys of cells that ``seq_add`` moved, before a step reads them,
        with the ropes the step graphs apply (a graph is built for them if none was)."""
        cells = self.kv.cells
        if not cells.has_shift:
            return
        if self._key_rope is None:
            self.graph(1)
        if not self._key_rope:          # no layer ropes its keys (granite without RoPE)
            cells.take_shift()
            return
        g = KeyShiftGraph(self.kv, self._key_rope, cells.end)
        self.sched.alloc_graph(g.graph)
        tensor_set(g.shift, cells.shift[:cells.end])
        self.sched.compute(g.graph)
        cells.take_shift()

    def _step(self, ub: UBatch) -> Callable[[], np.ndarray]:
        """Queue ``ub``'s step; what gives its output rows (over a pipeline, once the
        scheduler has synchronized: the rows are read on the output's stream)."""
        wanted = ub.outputs.size
        if not wanted:              # a graph outputs at least one row; none is returned
            ub = replace(ub, outputs=np.array([ub.n_tokens - 1], dtype=np.int32))
        n_real, ub = ub.n_tokens, self._padded(ub)
        g, cells = self.prepare(ub, n_real)
        self.sched.alloc_graph(g.graph)
        g.set_inputs(ub, cells)
        width = self.hp.n_embd if self.embeddings else self.hp.n_vocab
        # the read is queued behind the compute on the output's stream, then waited for: a
        # remote device answers both in one call (a read after the wait was a round trip more)
        self.sched.compute_async(g.graph)
        raw = np.empty(g.logits.nbytes, np.uint8)
        self.sched.get_tensor_backend(g.logits).get_tensor_async(g.logits, raw)
        if self.stages <= 1:
            self.sched.synchronize()
        if g is not self._last_graph:        # the same graph again keeps its splits
            self.timings.splits = self.sched.splits_per_backend()
            self._last_graph = g
        self.timings.copied_bytes = dict(self.sched.copied_bytes)
        return lambda: raw.view(np.float32).reshape(-1, width)[:wanted]

    def _padded(self, ub: UBatch) -> UBatch:
        """``ub`` padded to a recurring shape (``padded_size``) when it reads a prompt (some
        row outputs nothing) and the cache has free cells for the padding. A step that
        outputs every row (decode, of one sequence or many, a draft's verification, a
        perplexity run) keeps its shape step after step, so it is never padded."""
        if ub.outputs.size == ub.n_tokens:
            return ub
        size = padded_size(ub.n_tokens, self.n_batch)
        return ub.padded(size) if size <= self.kv.cells.free else ub

    def _describe(self) -> str:
        return "the evaluator"

    def _free(self) -> None:
        self._graphs.clear()
        self._last_graph = None
        self.sched.close()
        for b in self.backends:
            b.close()


def _graph_size(hp) -> int:
    """Nodes a step graph of this model may have (llama.cpp sizes it by tensors too)."""
    return max(2048, 64 * (hp.n_layer + 2))
