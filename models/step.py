"""One step's graph: its input tensors, how they are filled, and the graph an architecture
builds over them.

A step evaluates a ``UBatch`` of ``n_tokens`` tokens (of one sequence or many), attends over
the first ``n_kv`` cache cells and outputs logits for ``n_outputs`` of its tokens. Those three
numbers are the graph's shape: a ``StepGraph`` is built once per shape and computed again with
new inputs (llama.cpp reuses its graphs the same way), so a decode graph is built once per 256
positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polydev import Context, GGMLType, Graph, Tensor, tensor_set

from .batch import UBatch
from .hparams import HParams
from .kv_cache import KVCache
from .kv_shift import KeyRope

__all__ = ["MaskRows", "StepShape", "StepGraph", "attn_temperature_scale"]


def attn_temperature_scale(positions: np.ndarray, hp: HParams) -> np.ndarray:
    """log(floor(pos / n_ctx_orig) + 1) * attention.temperature_scale + 1 per token
    (llama.cpp's ``llm_graph_input_attn_temp``, as mistral3 sets it up)."""
    floors = np.floor(positions.astype(np.float64) / hp.n_ctx_orig)
    return (np.log(floors + 1.0) * hp.attn_temp_scale + 1.0).astype(np.float32)


@dataclass(frozen=True)
class StepShape:
    n_tokens: int
    n_kv: int
    n_outputs: int
    embeddings: bool = False        # output the final norm's rows, not logits


class MaskRows:
    """The float16 rows a step's masks are filled in before they are written, one array for
    every step graph of an evaluator (a graph of its own each held n_tokens x n_kv: 128 MiB
    at 512 x 131072, times every graph kept)."""

    def __init__(self) -> None:
        self._rows = np.empty(0, dtype=np.float16)

    def rows(self, n_tokens: int, n_kv: int) -> np.ndarray:
        if self._rows.size < n_tokens * n_kv:
            self._rows = np.empty(n_tokens * n_kv, dtype=np.float16)
        return self._rows[:n_tokens * n_kv].reshape(n_tokens, n_kv)


class StepGraph:
    """The inputs of one step shape, the graph built over them, and its logits."""

    def __init__(self, hp: HParams, kv: KVCache, shape: StepShape, build,
                 mask_rows: MaskRows | None = None) -> None:
        self.hp, self.kv, self.shape = hp, kv, shape
        n, n_kv = shape.n_tokens, shape.n_kv
        ctx = self.ctx = Context(f"step {n}x{n_kv}")
        self.tokens = ctx.new_tensor(GGMLType.I32, [n], name="inp_tokens").set_input()
        # the cache cells the tokens are written to (SET_ROWS takes i32 indices)
        self.cells = ctx.new_tensor(GGMLType.I32, [n], name="inp_cells").set_input()
        self.mask: Tensor | None = ctx.new_tensor(GGMLType.F16, [n_kv, n],
                                                  name="kq_mask").set_input()
        self.mask_swa = (ctx.new_tensor(GGMLType.F16, [n_kv, n], name="kq_mask_swa").set_input()
                         if hp.sliding_window > 0 else None)
        self._mask_rows = mask_rows or MaskRows()
        self.out_ids = (ctx.new_tensor(GGMLType.I32, [shape.n_outputs], name="inp_out_ids")
                        .set_input() if shape.n_outputs < n else None)
        # what RoPE turns q and k by
        self.positions: Tensor | None = ctx.new_tensor(GGMLType.I32, [n],
                                                       name="inp_pos").set_input()
        # Llama 4's attention temperature tuning (mistral3): one factor per token for its q
        self.attn_scale: Tensor | None = ctx.new_tensor(GGMLType.F32, [1, 1, n],
                                                        name="attn_scale").set_input()
        self.key_rope: dict[int, KeyRope] = {}      # filled by layers.attention
        self.graph = Graph()
        self.logits: Tensor = build(self).set_output()
        self.graph.build_forward_expand(self.logits)
        self._drop_unread_inputs()

    def together(self, *tensors: Tensor) -> None:
        """Put ``tensors`` (after what they need) into the graph now, one after another, as
        llama.cpp's build_attn expands its q, k and v: the products of one activation then
        sit next to each other, where the CPU backend runs them as one call (its
        shared_input.py)."""
        for t in tensors:
            self.graph.build_forward_expand(t)

    def _drop_unread_inputs(self) -> None:
        """An input no node reads gets no memory, so it must never be written: a granite
        without RoPE reads no positions, only mistral3 a temperature, a gemma3 whose layers
        all slide no global mask, one with no sliding layer no window mask."""
        read = {id(t) for t in self.graph.leafs}

        def kept(t: Tensor | None) -> Tensor | None:
            return t if t is not None and id(t) in read else None
        self.positions, self.attn_scale = kept(self.positions), kept(self.attn_scale)
        self.mask, self.mask_swa = kept(self.mask), kept(self.mask_swa)

    def set_inputs(self, ub: UBatch, cells: np.ndarray) -> None:
        """Fill the inputs for ``ub``, whose tokens the cache has placed in ``cells``; call
        after allocation.

        Each input is written as raw bytes of its exact type and size (``tensor_set``): at
        decode, Tensor.set_data's conversions and checks were most of this step's time."""
        tensor_set(self.tokens, ub.tokens)
        if self.positions is not None:
            tensor_set(self.positions, ub.positions)
        tensor_set(self.cells, cells)
        kv_cells, n_kv = self.kv.cells, self.shape.n_kv
        rows = self._mask_rows.rows(self.shape.n_tokens, n_kv)     # filled, then written
        if self.mask is not None:
            tensor_set(self.mask, kv_cells.mask(ub.positions, ub.seq_ids, n_kv, 0, rows))
        if self.mask_swa is not None:
            tensor_set(self.mask_swa, kv_cells.mask(ub.positions, ub.seq_ids, n_kv,
                                                    self.hp.sliding_window, rows))
        if self.out_ids is not None:
            tensor_set(self.out_ids, ub.outputs)
        if self.attn_scale is not None:
            tensor_set(self.attn_scale, attn_temperature_scale(ub.positions, self.hp))

    def mask_for(self, il: int) -> Tensor:
        """The attention mask of layer ``il``."""
        return self.mask_swa if self.mask_swa is not None and self.hp.is_swa(il) else self.mask
