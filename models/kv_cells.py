"""Which token each KV cache cell holds: its position and the sequences that use it.

llama.cpp's unified cache (``llama_kv_cells``) as numpy arrays: ``pos[i]`` is the position of
the token in cell ``i`` (-1: empty) and bit ``s`` of ``seqs[i]`` says sequence ``s`` uses it. A
cell shared by several sequences (a common prompt prefix, ``seq_cp``) is stored once and freed
when its last sequence leaves it. Masks are built from these arrays for each batch: a token of
sequence ``s`` at position ``p`` attends the cells of ``s`` at positions ``<= p`` (and, in a
sliding-window layer, ``> p - window``).

Positions moved by ``seq_add`` are kept per cell in ``shift`` until the cached keys have been
turned to match (``models/kv_shift.py``, run before the next step).
"""

from __future__ import annotations

import numpy as np

from polydev.errors import InvalidArgumentError

__all__ = ["KVCells", "MAX_SEQUENCES"]

MAX_SEQUENCES = 64              # one bit each in a uint64 (llama.cpp allows 256)
_NEG_INF = np.float16(-np.inf)
_ZERO = np.float16(0)


def _bit(seq_id: int) -> np.uint64:
    return np.uint64(1) << np.uint64(seq_id)


class KVCells:
    """Positions and sequence sets of ``size`` cells."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.pos = np.full(size, -1, dtype=np.int32)
        self.seqs = np.zeros(size, dtype=np.uint64)
        self.shift = np.zeros(size, dtype=np.int32)     # how far each cell's key must turn
        self._shifted = False                           # whether seq_add set any since
        self._end = 0                                   # 1 + the last cell in use
        # counts a decode step asks for, kept as the cells change (each was a pass over the
        # cells, and a decode step's bookkeeping with caches cold is a few percent of it):
        self._used = 0                                  # cells that hold a token
        self._low = 0                                   # every cell below this holds one
        # seq_pos_max's answers, kept up to date by assign and forgotten by every other change
        # (_release, seq_cp, clear): each step asks it of its sequences, and over the cells it
        # took about 60 µs of a decode step on a slow host
        self._last_pos: dict[int, int] = {}

    # --- counts -----------------------------------------------------------------------------

    @property
    def used(self) -> int:
        """Cells that hold a token."""
        return self._used

    @property
    def free(self) -> int:
        return self.size - self.used

    @property
    def has_shift(self) -> bool:
        # only seq_add sets shifts: a step asks this, and the look over the cells took it
        # about 30 µs on a slow host
        return self._shifted and bool(self.shift[:self._end].any())

    @property
    def end(self) -> int:
        """One past the last cell in use: a graph attends over at least this many cells."""
        return self._end

    # --- placing a batch ------------------------------------------------------------------

    def find(self, n: int) -> np.ndarray | None:
        """The first ``n`` empty cells (int32 indices, ascending), or None when fewer are
        free. Lowest cells first keeps the span a graph attends over short."""
        low = self._low
        if n == 1 and low < self.size and self.pos[low] < 0:   # a decode step's one token
            return np.array([low], dtype=np.int32)
        empty = np.flatnonzero(self.pos < 0)
        if empty.size:
            self._low = int(empty[0])
        return empty[:n].astype(np.int32) if empty.size >= n else None

    def assign(self, cells: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray) -> None:
        """Put the tokens at ``positions`` of sequences ``seq_ids`` into empty ``cells``."""
        if cells.size == 1:
            self._assign_one(int(cells[0]), int(positions[0]), int(seq_ids[0]))
            return
        self._used += int(np.count_nonzero(self.pos[cells] < 0))
        self.pos[cells] = positions
        self.seqs[cells] = np.left_shift(np.uint64(1), seq_ids.astype(np.uint64))
        self.shift[cells] = 0
        self._end = max(self._end, int(cells.max()) + 1)
        self._last_pos.clear()

    def _assign_one(self, cell: int, position: int, seq_id: int) -> None:
        """``assign`` of a decode step's one token, in scalars (numpy calls on a few values
        cost more than the work)."""
        if self.pos[cell] < 0:
            self._used += 1
        self.pos[cell] = position
        self.seqs[cell] = 1 << seq_id
        self.shift[cell] = 0
        self._end = max(self._end, cell + 1)
        if cell == self._low:
            self._low += 1
        last = self._last_pos.get(seq_id)
        if last is not None:
            self._last_pos[seq_id] = max(last, position)

    def mask(self, positions: np.ndarray, seq_ids: np.ndarray, n_kv: int, window: int,
             out: np.ndarray) -> np.ndarray:
        """Fill ``out`` [n_tokens, n_kv] (float16) with 0 where the token may attend the cell
        and -inf where not; llama.cpp's standard window masks ``pos - cell_pos >= window``.
        One sequence at a time: the rows of a sequence share which cells it owns, and no
        [n_tokens, n_kv] array wider than a boolean is made (a 512 x 4096 prompt's uint64
        bit sets were 17 MiB of peak memory)."""
        if positions.size == 1:
            return self._mask_one(int(positions[0]), int(seq_ids[0]), n_kv, window, out)
        cell_pos = self.pos[None, :n_kv]
        first = int(seq_ids[0])
        if (seq_ids == first).all():                    # one sequence: every row at once
            groups = [(first, slice(None))]
        else:
            groups = [(int(seq), np.flatnonzero(seq_ids == seq)) for seq in np.unique(seq_ids)]
        for seq, rows in groups:
            pos = positions[rows, None]
            allowed = ((self.seqs[:n_kv] & _bit(seq)) != 0) & (cell_pos <= pos)
            if window:
                allowed &= cell_pos > pos - window
            if isinstance(rows, slice):
                out.fill(_NEG_INF)
                out[allowed] = 0
            else:
                out[rows] = np.where(allowed, _ZERO, _NEG_INF)
        return out

    def _mask_one(self, position: int, seq_id: int, n_kv: int, window: int,
                  out: np.ndarray) -> np.ndarray:
        """``mask`` of a decode step's one token, in as few numpy calls as it takes (each
        costs more than its work here)."""
        cell_pos = self.pos[:n_kv]
        allowed = (self.seqs[:n_kv] & _bit(seq_id)) != 0
        allowed &= cell_pos <= position
        if window:
            allowed &= cell_pos > position - window
        out.fill(_NEG_INF)
        out[0, allowed] = _ZERO
        return out

    # --- sequences (llama.cpp's llama_memory_seq_*) -----------------------------------------

    def seq_rm(self, seq_id: int, p0: int = 0, p1: int = -1) -> None:
        """Remove sequence ``seq_id`` (every sequence when negative) from the cells at
        positions [p0, p1) (p1 < 0: to the end); a cell no sequence uses becomes empty."""
        sel = self._in_range(p0, p1)
        if seq_id < 0:
            self.seqs[sel] = 0
        else:
            self.seqs[sel] &= ~_bit(_checked(seq_id))
        self._release()

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Let ``dst`` use the cells of ``src`` at positions [p0, p1): shared, not copied."""
        if _checked(src) == _checked(dst):
            return
        sel = self._in_range(p0, p1) & ((self.seqs & _bit(src)) != 0)
        self.seqs[sel] |= _bit(dst)
        self._last_pos.clear()

    def seq_keep(self, seq_id: int) -> None:
        """Drop every sequence but ``seq_id``."""
        keep = _bit(_checked(seq_id))
        self.seqs &= keep
        self._release()

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Move the positions [p0, p1) of ``seq_id`` (p1 < 0: to the end) by ``delta``;
        cells moved before position 0 are dropped. A cell other sequences share cannot move
        (it would move for them too): that is an error, and nothing moves."""
        bit = _bit(_checked(seq_id))
        moving = self._in_range(p0, p1) & ((self.seqs & bit) != 0)
        if (self.seqs[moving] != bit).any():
            raise InvalidArgumentError(f"sequence {seq_id} shares cells in positions "
                                       f"[{p0}, {p1}) with other sequences: they cannot move")
        if delta == 0:
            return
        self.pos[moving] += delta
        self.shift[moving] += delta
        self._shifted = True
        dropped = moving & (self.pos < 0)     # emptied here: _release sees only pos >= 0
        self._emptied(dropped)
        self.seqs[dropped] = 0
        self.pos[dropped] = -1
        self.shift[dropped] = 0
        self._release()

    def take_shift(self) -> np.ndarray:
        """The pending shifts of the first ``end`` cells, forgotten from now on (the keys
        are being turned by them)."""
        shift = self.shift[:self._end].copy()
        self.shift.fill(0)
        self._shifted = False
        return shift

    def seq_pos_max(self, seq_id: int) -> int:
        """The last position of ``seq_id`` in the cache, -1 when it has none."""
        last = self._last_pos.get(seq_id)
        if last is None:
            used = (self.seqs[:self._end] & _bit(_checked(seq_id))) != 0
            last = int(self.pos[:self._end][used].max()) if used.any() else -1
            self._last_pos[seq_id] = last
        return last

    def seq_pos_min(self, seq_id: int) -> int:
        """The first position of ``seq_id`` in the cache, -1 when it has none."""
        used = (self.seqs[:self._end] & _bit(_checked(seq_id))) != 0
        return int(self.pos[:self._end][used].min()) if used.any() else -1

    def seq_cells(self, seq_id: int) -> int:
        """Cells ``seq_id`` uses (shared ones included)."""
        return int(np.count_nonzero(self.seqs[:self._end] & _bit(_checked(seq_id))))

    def clear(self) -> None:
        self._last_pos.clear()
        self.pos.fill(-1)
        self.seqs.fill(0)
        self.shift.fill(0)
        self._shifted = False
        self._end = 0
        self._used = self._low = 0

    # --- helpers ----------------------------------------------------------------------------

    def _in_range(self, p0: int, p1: int) -> np.ndarray:
        p0 = max(p0, 0)
        sel = self.pos >= p0
        if p1 >= 0:
            sel &= self.pos < p1
        return sel

    def _emptied(self, cells: np.ndarray) -> None:
        """Count the cells (a boolean mask over all of them) as emptied."""
        n = int(np.count_nonzero(cells))
        if n:
            self._used -= n
            self._low = min(self._low, int(cells.argmax()))

    def _release(self) -> None:
        """Empty the cells no sequence uses any more, and move ``end`` back."""
        gone = (self.seqs == 0) & (self.pos >= 0)
        self._last_pos.clear()
        self._emptied(gone)
        self.pos[gone] = -1
        self.shift[gone] = 0
        live = np.flatnonzero(self.pos[:self._end] >= 0)
        self._end = int(live[-1]) + 1 if live.size else 0


def _checked(seq_id: int) -> int:
    if not 0 <= seq_id < MAX_SEQUENCES:
        raise InvalidArgumentError(f"sequence id {seq_id} is outside [0, {MAX_SEQUENCES})")
    return seq_id
