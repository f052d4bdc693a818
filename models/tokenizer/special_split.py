"""Special tokens written in a text, split out before the text is tokenized (llama.cpp's
``tokenizer_st_partition``).

Control, unknown and user-defined tokens are taken longest first: each one splits every run
of text not yet split at each of its occurrences, left to right, so a longer token wins
over a shorter one it overlaps. Control and unknown tokens are taken only when special
tokens are parsed; user-defined ones always are.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..gguf import TokenType

__all__ = ["SpecialTokenSplitter"]

_ALWAYS = (TokenType.USER_DEFINED,)
_WHEN_PARSED = (TokenType.CONTROL, TokenType.UNKNOWN)


class SpecialTokenSplitter:
    """Splits text into runs of plain text (``str``) and special token ids (``int``)."""

    def __init__(self, tokens: Sequence[str], types: np.ndarray) -> None:
        kinds = np.isin(types, [*_ALWAYS, *_WHEN_PARSED])
        ids = sorted(np.nonzero(kinds)[0].tolist(), key=lambda i: -len(tokens[i]))
        always = set(np.nonzero(np.isin(types, _ALWAYS))[0].tolist())
        # (text, id, split even when special tokens are not parsed), longest first (stable)
        self._specials = [(tokens[i], i, i in always) for i in ids if tokens[i]]

    def split(self, text: str, parse_special: bool) -> list[str | int]:
        """``text`` as runs of plain text and token ids, in order; no run is empty."""
        # only the tokens the text contains can split it; finding them is one C-level scan
        # per token, where splitting is a Python loop over the runs
        present = [(t, i) for t, i, always in self._specials
                   if (always or parse_special) and t in text]
        parts: list[str | int] = [text] if text else []
        for special, token in present:
            parts = _split_runs(parts, special, token)
        return parts


def _split_runs(parts: list[str | int], special: str, token: int) -> list[str | int]:
    out: list[str | int] = []
    for part in parts:
        if isinstance(part, int) or special not in part:
            out.append(part)
            continue
        pieces = part.split(special)
        for k, piece in enumerate(pieces):
            if k:
                out.append(token)
            if piece:
                out.append(piece)
    return out
