"""The KV cache: per layer, a K and a V matrix of ``kv_size`` cells on that layer's device.

A cell holds one token's keys (``n_embd_k_gqa`` values) or values; ``cells`` (``KVCells``)
says which token of which sequences each cell holds, as llama.cpp's unified cache: many
sequences share one cache, and a prompt prefix they have in common is stored once
(``seq_cp``). Graphs write a batch's rows with SET_ROWS at the cells the batch was given and
read the first ``n_kv`` cells through views of what SET_ROWS returns, so every read is ordered
after the write by the graph's own edges. ``n_kv`` is the span of cells in use padded to 256
cells: a decode graph keeps its shape for 256 steps (llama.cpp pads the same way).

Types are llama.cpp's: F16 by default, Q8_0 or F32 on request (``type_k``/``type_v``).
"""

from __future__ import annotations

from polydev import BufferUsage, Context, Tensor, alloc_ctx_tensors, ops
from polydev.buffer import Buffer
from polydev.errors import InvalidArgumentError
from polydev.lifetime import Resource

from .hparams import HParams
from .kv_cells import KVCells
from .placement import KV_PAD, Placement, kv_size

__all__ = ["KVCache"]


class KVCache(Resource):
    """K and V tensors for every layer, allocated on the devices ``placement.kv_devices`` names,
    of the size and types its settings say (``n_ctx``, ``type_k``, ``type_v``)."""

    def __init__(self, hp: HParams, placement: Placement) -> None:
        settings = placement.settings
        n_ctx, self.type_k, self.type_v = settings.n_ctx, settings.type_k, settings.type_v
        for name, t, head in (("type_k", self.type_k, hp.n_embd_head_k),
                              ("type_v", self.type_v, hp.n_embd_head_v)):
            if head % t.traits.block_size:
                raise InvalidArgumentError(f"{name} {t} needs heads of a multiple of "
                                           f"{t.traits.block_size} values; this model's are "
                                           f"{head}")
        self.hp = hp
        self.size = kv_size(n_ctx)   # padded to 256 cells: llama.cpp's n_ctx (and n_ctx_seq)
        self.cells = KVCells(self.size)
        self.edits = 0          # seq_* calls so far: a user's edit tells Model its tokens moved
        self.k: list[Tensor] = []
        self.v: list[Tensor | None] = []      # None: read from the keys (hp.v_in_k)
        self.buffers: list[Buffer] = []
        contexts: dict[int, tuple] = {}
        for il in range(hp.n_layer):
            device = placement.kv_devices[il]
            buft, ctx = contexts.setdefault(id(device), (device.buffer_type,
                                                         Context(f"kv {device.name}")))
            self.k.append(ctx.new_tensor(self.type_k, [hp.n_embd_k_gqa(il), self.size],
                                         name=f"cache_k_l{il}"))
            self.v.append(None if hp.v_in_k else ctx.new_tensor(
                self.type_v, [hp.n_embd_v_gqa(il), self.size], name=f"cache_v_l{il}"))
        try:
            for buft, ctx in contexts.values():
                buf = alloc_ctx_tensors(ctx, buft)
                if buf is not None:
                    buf.usage = BufferUsage.ANY
                    buf.clear(0)
                    self.buffers.append(buf)
        except BaseException:
            self._free()
            raise

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds on all its devices."""
        return sum(b.size for b in self.buffers)

    def n_kv(self, prompt: bool = False) -> int:
        """Cells a graph attends over: those up to the last one in use, padded to a multiple
        of 256, or for a step that reads a prompt (``prompt``) of a quarter of the power of
        two below (4 sizes per doubling from 1024 cells on): a prompt may come at any fill of
        the cache, and its graph should be one built before. The cells past the last in use
        are masked, and the CPU's attention skips masked cells a block at a time; other
        kernels read at most a quarter more."""
        end = max(KV_PAD, self.cells.end)
        pad = max(KV_PAD, (1 << (end.bit_length() - 1)) // 4) if prompt else KV_PAD
        return min(self.size, -(-end // pad) * pad)

    # --- sequences: llama.cpp's llama_memory_seq_* ------------------------------------------

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Forget positions [p0, p1) of ``seq_id`` (p1 < 0: to the end; seq_id < 0: every
        sequence)."""
        self.edits += 1
        self.cells.seq_rm(seq_id, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Give ``dst`` the positions [p0, p1) of ``src``: the cells are shared, not copied."""
        self.edits += 1
        self.cells.seq_cp(src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        """Forget every sequence but ``seq_id``."""
        self.edits += 1
        self.cells.seq_keep(seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Move positions [p0, p1) of ``seq_id`` by ``delta`` (p1 < 0: to the end), as after
        ``seq_rm`` of a span before them (llama.cpp's context shift). The cached keys are
        turned to their new positions before the next step."""
        self.edits += 1
        self.cells.seq_add(seq_id, p0, p1, delta)

    def seq_pos_max(self, seq_id: int) -> int:
        """The last cached position of ``seq_id``; -1 when it has none."""
        return self.cells.seq_pos_max(seq_id)

    def store_and_view(self, ctx: Context, il: int, k: Tensor, v: Tensor | None, cells: Tensor,
                       n_kv: int) -> tuple[Tensor, Tensor]:
        """Write the batch's K and V rows (``k`` [head_k, n_head_kv, n_tokens], ``v`` alike;
        None where the values live in the keys, ``HParams.v_in_k``) at ``cells`` and return
        views of the first ``n_kv`` cells, [head, n_kv, n_head_kv], that read after the
        writes."""
        n_tokens = k.ne[2]
        K, V = self.k[il], self.v[il]
        k_new = ops.set_rows(ctx, K, ctx.reshape(k, K.ne[0], n_tokens), cells)
        head_k = k.ne[0]
        k_view = ctx.view_3d(k_new, head_k, n_kv, k.ne[1], K.nb[1],
                             K.traits.row_size(head_k), 0)
        if V is None:                     # the first head_v values of each key row
            head_v = self.hp.n_embd_head_v
            return k_view, ctx.view_3d(k_new, head_v, n_kv, k.ne[1], K.nb[1],
                                       K.traits.row_size(head_k), 0)
        v_new = ops.set_rows(ctx, V, ctx.reshape(v, V.ne[0], n_tokens), cells)
        head_v = v.ne[0]
        v_view = ctx.view_3d(v_new, head_v, n_kv, v.ne[1], V.nb[1],
                             V.traits.row_size(head_v), 0)
        return k_view, v_view

    def clear(self) -> None:
        """Forget every cell of every sequence (``Model.reset``)."""
        self.cells.clear()
        for buf in self.buffers:
            buf.clear(0)

    def _describe(self) -> str:
        return "the KV cache"

    def _free(self) -> None:
        for buf in self.buffers:
            buf.close()
        self.buffers.clear()
