"""One step's graph: its input tensors, how they are filled, and the graph an architecture
builds over them.

A step evaluates ``n_tokens`` consecutive tokens of the one sequence, attends over ``n_kv``
cache cells and outputs logits for ``n_outputs`` rows (the last token, or all). Those three
numbers are the graph's shape: a ``StepGraph`` is built once per shape and computed again with
new inputs (llama.cpp reuses its graphs the same way), so a decode graph is built once per 256
positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polydev import Context, GGMLType, Graph, Tensor, build_graph, tensor_set

from .hparams import HParams
from .kv_cache import KVCache

__all__ = ["StepShape", "StepGraph"]

_NEG_INF = np.float16(-np.inf)


@dataclass(frozen=True)
class StepShape:
    n_tokens: int
    n_kv: int
    n_outputs: int


class StepGraph:
    """The inputs of one step shape, the graph built over them, and its logits."""

    def __init__(self, hp: HParams, kv: KVCache, shape: StepShape, build) -> None:
        self.hp, self.kv, self.shape = hp, kv, shape
        n, n_kv = shape.n_tokens, shape.n_kv
        ctx = self.ctx = Context(f"step {n}x{n_kv}")
        self.tokens = ctx.new_tensor(GGMLType.I32, [n], name="inp_tokens").set_input()
        self.positions = ctx.new_tensor(GGMLType.I32, [n], name="inp_pos").set_input()
        # the cache holds one sequence, cell i at position i: a token's cell index is its
        # position, and SET_ROWS takes i32 indices as well as i64
        self.cells = self.positions
        self.mask: Tensor | None = ctx.new_tensor(GGMLType.F16, [n_kv, n],
                                                  name="kq_mask").set_input()
        self.mask_swa = (ctx.new_tensor(GGMLType.F16, [n_kv, n], name="kq_mask_swa").set_input()
                         if hp.sliding_window > 0 else None)
        self._mask_rows = np.empty((n, n_kv), dtype=np.float16)     # filled, then written
        self._kv_pos = np.arange(n_kv, dtype=np.int32)
        self.out_ids = (ctx.new_tensor(GGMLType.I32, [shape.n_outputs], name="inp_out_ids")
                        .set_input() if shape.n_outputs < n else None)
        self.logits: Tensor = build(self).set_output()
        self.graph: Graph = build_graph(self.logits)
        # An input no node reads gets no memory, so it is never written: a gemma3 whose
        # layers all slide reads no global mask, one with no sliding layer no window mask.
        read = {id(t) for t in self.graph.leafs}
        self.mask = self.mask if id(self.mask) in read else None
        if self.mask_swa is not None and id(self.mask_swa) not in read:
            self.mask_swa = None

    def set_inputs(self, tokens: np.ndarray, n_past: int) -> None:
        """Fill the inputs for ``tokens`` at positions ``n_past``..; call after allocation.

        Each input is written as raw bytes of its exact type and size (``tensor_set``): at
        decode, Tensor.set_data's conversions and checks were most of this step's time."""
        n = self.shape.n_tokens
        pos = np.arange(n_past, n_past + n, dtype=np.int32)
        tensor_set(self.tokens, np.asarray(tokens, dtype=np.int32).reshape(n))
        tensor_set(self.positions, pos)
        if self.mask is not None:
            tensor_set(self.mask, self._fill_mask(pos, 0))
        if self.mask_swa is not None:
            tensor_set(self.mask_swa, self._fill_mask(pos, self.hp.sliding_window))
        if self.out_ids is not None:
            tensor_set(self.out_ids, np.arange(n - self.shape.n_outputs, n, dtype=np.int32))

    def _fill_mask(self, pos: np.ndarray, window: int) -> np.ndarray:
        """The mask rows of tokens at ``pos``: 0 where a token may attend a cell, -inf where
        not. A token attends the cells at its position and before, and with a ``window``
        only the last ``window`` of them (llama.cpp's standard window: masked when
        pos - cell >= window)."""
        rows = self._mask_rows
        if pos.size == 1:                   # decode: the one row is three runs of cells
            p = int(pos[0])
            first = max(0, p - window + 1) if window else 0
            rows[0, :first] = _NEG_INF
            rows[0, first:p + 1] = 0
            rows[0, p + 1:] = _NEG_INF
            return rows
        allowed = self._kv_pos <= pos[:, None]
        if window:
            allowed &= self._kv_pos > pos[:, None] - window
        rows.fill(_NEG_INF)
        rows[allowed] = 0
        return rows

    def mask_for(self, il: int) -> Tensor:
        """The attention mask of layer ``il``."""
        return self.mask_swa if self.mask_swa is not None and self.hp.is_swa(il) else self.mask
