"""Tokens in, logits out: the step loop over one ``Scheduler``.

A prompt is evaluated in ubatches of ``n_batch`` tokens; each ubatch's graph computes logits
only for the rows asked for (the last token unless all are wanted). Graphs are built once per
``StepShape`` and computed again with new inputs, set after allocation on every step; the
scheduler reuses its splits, allocation and bound plans when the same graph comes back, so a
decode step is a replay.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from polydev import Backend, Scheduler, tensor_get
from polydev.errors import InvalidArgumentError
from polydev.lifetime import Resource
from polydev.numerics import DEFAULT_NUMERICS, check_numerics

from .arch import builder
from .kv_cache import KVCache
from .layers import Weights
from .loader import ModelWeights
from .step import StepGraph, StepShape

__all__ = ["Evaluator", "Timings"]

log = logging.getLogger(__name__)
_GRAPHS_KEPT = 8            # prompt shapes come and go; decode shapes are few


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


def _set_numerics(backend: Backend, numerics: str) -> None:
    """Tell a backend whose reg has a "set_numerics" proc how to compute; the others have one
    way only."""
    reg = backend.device.reg
    proc = reg.get_proc_address("set_numerics") if reg is not None else None
    if proc is not None:
        proc(backend, numerics)


class Evaluator(Resource):
    """Evaluates tokens at the end of the cached sequence and returns their logits."""

    def __init__(self, weights: ModelWeights, kv: KVCache, n_batch: int,
                 numerics: str = DEFAULT_NUMERICS) -> None:
        if n_batch <= 0:
            raise InvalidArgumentError(f"n_batch must be positive, got {n_batch}")
        self.hp = weights.placement.hparams
        self.weights, self.kv, self.n_batch = Weights(weights), kv, n_batch
        self._build = builder(self.hp.arch)
        placement = weights.placement
        used = {d.name for d in placement.layer_devices} | {d.name for d in placement.kv_devices}
        used |= {t.device.name for t in placement.tensors.values()}
        devices = [d for d in placement.offload_devices if d.name in used] + [placement.cpu]
        self.backends: list[Backend] = []
        try:
            self.backends = [d.init_backend() for d in devices]
            for b in self.backends:
                _set_numerics(b, check_numerics(numerics))
            self.sched = Scheduler(self.backends, graph_size=_graph_size(self.hp))
        except BaseException:
            for b in self.backends:
                b.close()
            raise
        self._graphs: OrderedDict[StepShape, StepGraph] = OrderedDict()
        self._last_graph: StepGraph | None = None       # the graph of the last step
        self.n_past = 0
        self.timings = Timings()

    def eval(self, tokens, all_logits: bool = False) -> np.ndarray:
        """Evaluate ``tokens`` after the cached ones; the logits of the last token, [n_vocab]
        (or of every token, [n_tokens, n_vocab], with ``all_logits``)."""
        self._check_open()
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if tokens.size == 0:
            raise InvalidArgumentError("eval needs at least one token")
        if tokens.min() < 0 or tokens.max() >= self.hp.n_vocab:
            bad = int(tokens[(tokens < 0) | (tokens >= self.hp.n_vocab)][0])
            raise InvalidArgumentError(f"token id {bad} is outside the vocabulary "
                                       f"[0, {self.hp.n_vocab})")
        if self.n_past + tokens.size > self.kv.size:
            raise InvalidArgumentError(
                f"the context holds {self.kv.size} tokens: {self.n_past} are cached and "
                f"{tokens.size} more do not fit (raise n_ctx, or reset)")
        start, rows = time.perf_counter(), []
        for first in range(0, tokens.size, self.n_batch):
            chunk = tokens[first:first + self.n_batch]
            last = first + chunk.size == tokens.size
            n_out = chunk.size if all_logits else 1
            logits = self._step(chunk, n_out)
            if all_logits or last:
                rows.append(logits)
        self.timings.add(int(tokens.size), time.perf_counter() - start, tokens.size > 1)
        out = rows[0] if len(rows) == 1 else np.concatenate(rows)   # one step: no copy
        return out if all_logits else out[-1]

    def reset(self) -> None:
        """Forget the cached sequence."""
        self.n_past = 0
        self.kv.clear()

    def truncate(self, n: int) -> None:
        """Keep only the first ``n`` cached tokens. The cells after them need no clearing: the
        next tokens overwrite them before any step can attend to them (the mask hides every
        cell past a token's own position)."""
        if not 0 <= n <= self.n_past:
            raise InvalidArgumentError(f"cannot keep {n} of {self.n_past} cached tokens")
        self.n_past = n

    def graph(self, n_tokens: int, n_outputs: int = 1) -> StepGraph:
        """The graph for a step of ``n_tokens`` at the current position (built if new)."""
        n_kv = self.kv.n_kv(self.n_past + n_tokens)
        last = self._last_graph
        if (last is not None and last.shape.n_kv == n_kv and last.shape.n_tokens == n_tokens
                and last.shape.n_outputs == n_outputs):
            return last                 # decode: the last step's graph, most recently used
        shape = StepShape(n_tokens, n_kv, n_outputs)
        g = self._graphs.get(shape)
        if g is None:
            g = self._graphs[shape] = StepGraph(self.hp, self.kv, shape,
                                                lambda s: self._build(s, self.weights))
            self.timings.graphs_built += 1
            while len(self._graphs) > _GRAPHS_KEPT:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(shape)
        return g

    def _step(self, chunk: np.ndarray, n_out: int) -> np.ndarray:
        g = self.graph(chunk.size, n_out)
        self.sched.alloc_graph(g.graph)
        g.set_inputs(chunk, self.n_past)
        self.sched.compute(g.graph)
        self.n_past += chunk.size
        if g is not self._last_graph:        # the same graph again keeps its splits
            self.timings.splits = self.sched.splits_per_backend()
            self._last_graph = g
        self.timings.copied_bytes = dict(self.sched.copied_bytes)
        raw = tensor_get(g.logits)
        return raw.view(np.float32).reshape(n_out, self.hp.n_vocab)

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
