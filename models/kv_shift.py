"""Turning the cached keys of cells whose positions moved (llama.cpp's K-shift).

RoPE turns a key by angles proportional to its position, so a key cached at position p that
moves to p + d (``seq_add``) must be turned once more by d. Each layer's keys are read as
float32, roped by every cell's pending shift with the rope that layer's step graph applied
(recorded as ``KeyRope`` while the graph was built, so an architecture's per-layer bases and
frequency factors come along), and written back in the cache's type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polydev import Context, GGMLType, Graph, Tensor, build_graph, ops

from .kv_cache import KVCache

__all__ = ["KeyRope", "KeyShiftGraph"]


@dataclass(frozen=True)
class KeyRope:
    """The rope a layer's keys were given: ``ops.rope_ext``'s frequency factors and keyword
    arguments, and where in each cached head the roped values sit: ``width`` values from
    ``first`` (None: the whole head; deepseek2's compressed rows keep them behind the
    compressed kv)."""

    freq_factors: Tensor | None
    params: dict[str, Any]
    first: int = 0
    width: int | None = None


class KeyShiftGraph:
    """Every layer's keys of the first ``n_cells`` cells turned by the ``shift`` input (I32,
    one value per cell; 0 leaves a key as it is)."""

    def __init__(self, kv: KVCache, key_rope: dict[int, KeyRope], n_cells: int) -> None:
        ctx = self.ctx = Context(f"k-shift {n_cells}")
        self.shift = ctx.new_tensor(GGMLType.I32, [n_cells], name="k_shift").set_input()
        written = []
        for il, rope in sorted(key_rope.items()):
            cache = kv.k[il]
            head, n_head = kv.hp.n_embd_head_k, kv.hp.n_head_kv[il]
            width = rope.width or head
            keys = ctx.view_3d(cache, width, n_head, n_cells, cache.traits.row_size(head),
                               cache.nb[1], cache.traits.row_size(rope.first))
            as_f32 = ops.cpy(ctx, keys, ctx.new_tensor(GGMLType.F32, [width, n_head, n_cells]))
            turned = ops.rope_ext(ctx, as_f32, self.shift, rope.freq_factors, **rope.params)
            written.append(ops.cpy(ctx, turned, keys).set_output())
        self.graph: Graph = build_graph(*written)
