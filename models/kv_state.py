"""One sequence of the KV cache saved to a file and restored into another (llama.cpp's
``llama_state_seq_save_file``/``load_file``, what llama-server's ``/slots/{id}?action=save``
and ``restore`` use): its tokens, their positions, and each layer's K and V rows.

The file is a magic, a JSON header that names what the rows must fit (architecture, layers,
each layer's row types and widths), then the tokens and positions (int32), then the rows,
layer by layer. A file saved from another model (or another cache type) is refused with an
error that says what differs; a short or damaged file is refused before any cell changes.
Files are written whole or not at all (``polydev.files.replacing``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from polydev.buffer import tensor_get, tensor_set
from polydev.errors import ContextFullError, InvalidArgumentError
from polydev.files import replacing

from .kv_cache import KVCache

__all__ = ["checked_name", "load_sequence", "save_sequence"]

MAGIC = b"PDKVSEQ1"
_LENGTH = struct.Struct("<Q")


def _layout(kv: KVCache) -> dict:
    """What a file's rows must fit: per layer the K and V row types and widths."""
    return {"arch": kv.hp.arch, "n_layer": kv.hp.n_layer,
            "layers": [[k.type.name, k.ne[0], v.type.name if v is not None else None,
                        v.ne[0] if v is not None else None] for k, v in zip(kv.k, kv.v)]}


def _cells_of(kv: KVCache, seq_id: int) -> np.ndarray:
    """The cells of ``seq_id``, in the order of their positions."""
    cells = kv.cells
    end = cells.end
    mine = np.flatnonzero((cells.seqs[:end] & np.uint64(1 << seq_id)) != 0)
    return mine[np.argsort(cells.pos[mine], kind="stable")]


def save_sequence(kv: KVCache, seq_id: int, tokens: Sequence[int], path: Path) -> int:
    """Write sequence ``seq_id`` (whose cells hold ``tokens``, in order) to ``path``; the
    bytes written."""
    cells = _cells_of(kv, seq_id)
    if not cells.size:
        raise InvalidArgumentError(f"sequence {seq_id} holds no tokens: nothing to save")
    if cells.size != len(tokens):
        raise InvalidArgumentError(f"sequence {seq_id} holds {cells.size} cells, not the "
                                   f"{len(tokens)} tokens given")
    if kv.cells.shift[cells].any():
        raise InvalidArgumentError(f"sequence {seq_id} has moved keys not yet turned: "
                                   "evaluate a step first")
    header = json.dumps(_layout(kv) | {"n_tokens": int(cells.size)}).encode()
    with replacing(Path(path)) as tmp, open(tmp, "wb") as f:
        f.write(MAGIC + _LENGTH.pack(len(header)) + header)
        f.write(np.asarray(tokens, dtype="<i4").tobytes())
        f.write(kv.cells.pos[cells].astype("<i4").tobytes())
        for k, v in zip(kv.k, kv.v):
            for t in (k, v) if v is not None else (k,):
                f.write(_rows(t, cells).tobytes())
        written = f.tell()
    return written


def load_sequence(kv: KVCache, seq_id: int, path: Path) -> tuple[list[int], int]:
    """Replace sequence ``seq_id`` with the one saved in ``path``: its tokens, and the bytes
    read."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidArgumentError(f"cannot read {path}: {e.strerror}") from None
    header, at = _header(data, path)
    if {k: header.get(k) for k in ("arch", "n_layer", "layers")} != _layout(kv):
        raise InvalidArgumentError(f"{path} was saved from another model or cache: "
                                   f"{_difference(header, _layout(kv))}")
    n = int(header.get("n_tokens", -1))
    rows = sum(t.row_bytes * n for pair in zip(kv.k, kv.v) for t in pair if t is not None)
    if n <= 0 or len(data) != at + 8 * n + rows:
        raise InvalidArgumentError(f"{path} is damaged: {len(data)} bytes where its header "
                                   f"promises {at + 8 * n + rows}")
    tokens = np.frombuffer(data, "<i4", n, at).tolist()
    positions = np.frombuffer(data, "<i4", n, at + 4 * n).astype(np.int32)
    if positions.min() < 0 or np.unique(positions).size != n:
        raise InvalidArgumentError(f"{path} is damaged: its positions repeat or are negative")
    if not all(0 <= t < kv.hp.n_vocab for t in tokens):
        raise InvalidArgumentError(f"{path} is damaged: a token is outside the vocabulary")
    own = int(np.count_nonzero(kv.cells.seqs[:kv.cells.end] == np.uint64(1 << seq_id)))
    if kv.cells.free + own < n:          # checked before the sequence's cells are given up
        raise ContextFullError(f"{path} holds {n} tokens; the cache has {kv.cells.free + own} "
                               "cells for them")
    kv.seq_rm(seq_id)
    cells = kv.cells.find(n)
    at += 8 * n
    for k, v in zip(kv.k, kv.v):
        for t in (k, v) if v is not None else (k,):
            size = t.row_bytes
            _write_rows(t, cells, np.frombuffer(data, np.uint8, size * n, at))
            at += size * n
    kv.cells.assign(cells, positions, np.full(n, seq_id, dtype=np.int32))
    kv.edits += 1
    return tokens, len(data)


def _header(data: bytes, path: Path) -> tuple[dict, int]:
    start = len(MAGIC) + _LENGTH.size
    if len(data) < start or not data.startswith(MAGIC):
        raise InvalidArgumentError(f"{path} is not a saved sequence of polydev's")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start:start + length])
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgumentError(f"{path} is damaged: its header is not JSON") from None
    if not isinstance(header, dict):
        raise InvalidArgumentError(f"{path} is damaged: its header is not an object")
    return header, start + length


def _difference(saved: dict, ours: dict) -> str:
    for key in ("arch", "n_layer"):
        if saved.get(key) != ours[key]:
            return f"{key} {saved.get(key)!r}, this model's {ours[key]!r}"
    return "the rows of its layers differ in type or width from this cache's"


def _runs(cells: np.ndarray) -> list[tuple[int, int, int]]:
    """(first cell, count, index in ``cells``) of each run of consecutive cells."""
    breaks = np.flatnonzero(np.diff(cells) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [cells.size]])
    return [(int(cells[s]), int(e - s), int(s)) for s, e in zip(starts, ends)]


def _rows(t, cells: np.ndarray) -> np.ndarray:
    """The rows of ``t`` at ``cells``, in that order, as bytes."""
    size = t.row_bytes
    out = np.empty(cells.size * size, dtype=np.uint8)
    for first, count, index in _runs(cells):
        out[index * size:(index + count) * size] = tensor_get(t, first * t.nb[1], count * size)
    return out


def _write_rows(t, cells: np.ndarray, rows: np.ndarray) -> None:
    size = t.row_bytes
    for first, count, index in _runs(cells):
        tensor_set(t, rows[index * size:(index + count) * size], first * t.nb[1])


def checked_name(name: str) -> str:
    """A file name for a slot (llama-server's ``fs_validate_filename``): no folders, no
    leading dot, no control characters, at most 255 bytes."""
    if (not isinstance(name, str) or not name or len(name.encode()) > 255 or name[0] == "."
            or os.sep in name or "/" in name or "\\" in name
            or any(ord(c) < 32 for c in name)):
        raise InvalidArgumentError(f"invalid file name {name!r}: a plain name, no folders")
    return name
