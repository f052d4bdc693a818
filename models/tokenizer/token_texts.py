"""A vocabulary's token texts, held compactly, with lookup of a token by its text.

A list of 262,144 ``str`` (gemma-3) and a dict from them to ids held about 35 MiB; here the
texts are one UTF-8 buffer with offsets, and lookup goes through an open-addressing table
of the texts' hashes (about 10 MiB). A text is decoded when it is read.
"""

from __future__ import annotations

from array import array
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ..gguf.reader import StringArray

__all__ = ["TokenTexts"]


class TokenTexts(Sequence[str]):
    """Token ``i``'s text is ``texts[i]``; ``texts.id_of(text)`` is the id of a text, or None.
    Texts should be distinct (``n_distinct`` says whether they are); of equal texts,
    ``id_of`` finds one."""

    def __init__(self, texts: Iterable[str]) -> None:
        blob = bytearray()
        ends = array("Q", [0])        # text i is blob[ends[i]:ends[i + 1]]
        hashes = array("q")
        for text in texts:
            blob += text.encode("utf-8", "surrogatepass")
            ends.append(len(blob))
            hashes.append(hash(text))
        self._index(bytes(blob), ends, hashes)

    @classmethod
    def from_strings(cls, strings: StringArray | Iterable[str],
                     empty: Callable[[int], str] | None = None) -> "TokenTexts":
        """The texts of a GGUF array of strings (``empty(i)`` in place of an empty text i,
        where given): from the array's bytes as they are where every text is whole UTF-8,
        about 5x faster than text by text (a 128k vocabulary's load was a tenth of a
        second); else, and for any other iterable, text by text."""
        if isinstance(strings, StringArray):
            blob, ends = strings.joined()
            fast = cls._from_utf8(blob, ends, empty is not None)
            if fast is not None:
                return fast
        if empty is None:
            return cls(strings)
        return cls(t or empty(i) for i, t in enumerate(strings))

    @classmethod
    def _from_utf8(cls, blob: bytes, ends: np.ndarray, no_empty: bool) -> "TokenTexts | None":
        """None where a text is not whole UTF-8 by itself (a file's strings are not checked:
        those decode with replacements), or is empty where empties are replaced."""
        lengths = np.diff(ends)
        if no_empty and (lengths == 0).any():
            return None
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError:
            return None
        data = np.frombuffer(blob, np.uint8)
        starts_char = (data & 0xC0) != 0x80          # a character's first byte
        if not starts_char[ends[:-1][lengths > 0]].all():
            return None                              # a text starts inside a character
        chars = np.zeros(len(data) + 1, np.int64)
        np.cumsum(starts_char, out=chars[1:])
        bounds = chars[ends].tolist()
        hashes = array("q", [hash(text[a:b]) for a, b in zip(bounds, bounds[1:])])
        texts = cls.__new__(cls)
        texts._index(blob, array("Q", ends.astype(np.uint64).tobytes()), hashes)
        return texts

    def _index(self, blob: bytes, ends: array, hashes: array) -> None:
        self._blob = blob
        self._ends = ends
        self._hashes = hashes
        h = np.frombuffer(hashes, np.int64) if hashes else np.zeros(0, np.int64)
        self._mask = (1 << max(3, (2 * len(h) - 1).bit_length())) - 1     # load <= 1/2
        self._table = array("i", _open_addressing(h, self._mask).tobytes())
        self.n_distinct = len(self) - self._count_repeats(h)

    def __len__(self) -> int:
        return len(self._ends) - 1

    def __getitem__(self, i):                        # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"token {i} is outside [0, {len(self)})")
        return self._blob[self._ends[i]:self._ends[i + 1]].decode("utf-8", "surrogatepass")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.id_of(text) is not None

    def id_of(self, text: str) -> int | None:
        """The id of the token whose text is ``text``, or None."""
        h = hash(text)
        table, hashes, mask = self._table, self._hashes, self._mask
        slot = h & mask
        while (i := table[slot]) >= 0:
            if hashes[i] == h and self[i] == text:
                return i
            slot = (slot + 1) & mask
        return None

    def _count_repeats(self, h: np.ndarray) -> int:
        """How many texts repeat an earlier one (only texts of equal hashes can)."""
        values, counts = np.unique(h, return_counts=True)
        repeats = 0
        for value in values[counts > 1].tolist():
            ids = np.nonzero(h == value)[0].tolist()
            repeats += len(ids) - len({self[i] for i in ids})
        return repeats

    def __repr__(self) -> str:
        head = ", ".join(repr(self[i]) for i in range(min(3, len(self))))
        return f"TokenTexts([{head}{', ...' if len(self) > 3 else ''}], n={len(self)})"


def _open_addressing(h: np.ndarray, mask: int) -> np.ndarray:
    """A linear-probing table of ids by hash (-1: empty), filled in rounds: each round, the
    lowest id wanting each free slot takes it and the rest probe the next slot."""
    table = np.full(mask + 1, -1, np.int32)
    pending = np.arange(len(h))
    slots = h & mask
    while pending.size:
        want = slots[pending]
        free = table[want] == -1
        taken, first = np.unique(want[free], return_index=True)
        table[taken] = pending[free][first]
        placed = np.zeros(len(h), bool)
        placed[pending[free][first]] = True
        pending = pending[~placed[pending]]
        slots[pending] = (slots[pending] + 1) & mask
    return table
