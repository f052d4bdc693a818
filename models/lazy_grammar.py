"""A grammar that applies from a trigger on: llama.cpp's lazy grammar, which keeps a tool call
well formed when ``tool_choice`` is "auto" (``common/sampling.cpp``, ``llama-grammar.cpp``).

Until the reply's text matches the trigger (a regular expression over its bytes, control
tokens as their text), every token is allowed and nothing is masked: the model answers in
prose or calls a function, as it likes. From the match on (its ``call`` group where it has
one), the text is the grammar's: the tokens already sampled from that point are fed to a
``GrammarMatcher`` (a token the point cuts, from the point on, spelled again by the
vocabulary), and every later token must follow it, so the call's name is one of the request's
functions and its arguments match that function's schema; once the calls are whole only the
end of the reply may follow. Text that the grammar refuses as it is fed (a marker written in
prose) leaves the reply free, as it was: what does not parse as a call stays content.

Reasoning is never constrained: while a ``<think>`` block is open (or the prompt opened one
the reply has not closed) the trigger is not looked for, as llama.cpp skips the grammar
inside its reasoning budget.
"""

from __future__ import annotations

import re

import numpy as np

from .grammar import GrammarError, GrammarMatcher, GrammarVocabulary

__all__ = ["LazyGrammar"]

THINK_OPEN, THINK_CLOSE = b"<think>", b"</think>"
_SEARCH_BACK = 256          # bytes before a new token's that a trigger may begin in


class LazyGrammar:
    """One sequence's lazy grammar (the engine's ``Constraint``): ``compiled`` (what
    ``GrammarVocabulary.compile`` gave) applies from the first match of ``trigger`` on.
    ``thinking``: "open" where the prompt opened a reasoning block the reply continues."""

    def __init__(self, vocabulary: GrammarVocabulary, compiled: str,
                 trigger: re.Pattern[bytes], thinking: str | None = None) -> None:
        self._vocabulary, self._compiled, self._trigger = vocabulary, compiled, trigger
        self._piece = vocabulary.piece
        self._text = b""
        self._ends: list[int] = []          # the text's length after each token
        self._tokens: list[int] = []
        self._searched = 0                  # where the trigger may still begin
        self._thinking = thinking == "open"
        self.matcher: GrammarMatcher | None = None
        self.free = False                   # the grammar refused the triggered text

    @property
    def triggered(self) -> bool:
        """Whether the grammar applies now."""
        return self.matcher is not None

    def allows(self, token: int) -> bool:
        return self.matcher is None or self.matcher.allows(token)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        return logits if self.matcher is None else self.matcher.mask(logits)

    def accept(self, token: int) -> None:
        """Advance past ``token``: the grammar's next token once triggered, else a token of
        the free text, which may complete the trigger."""
        if self.matcher is not None:
            self.matcher.accept(token)
            return
        if self.free:
            return
        self._tokens.append(int(token))
        self._text += self._piece(int(token))
        self._ends.append(len(self._text))
        start = self._trigger_start()
        if start is not None:
            self._apply_from(start)

    def _trigger_start(self) -> int | None:
        """Where the grammar's text begins, if the trigger matches outside reasoning."""
        text, begin = self._text, max(0, self._searched - _SEARCH_BACK)
        closed = text.rfind(THINK_CLOSE)
        if closed >= 0:
            begin = max(begin, closed + len(THINK_CLOSE))
        elif self._thinking:
            return None                     # the reasoning the prompt opened goes on
        if text.rfind(THINK_OPEN) > closed:
            return None                     # the reply opened a reasoning block
        match = self._trigger.search(text, begin)
        self._searched = len(text)
        if match is None:
            return None
        return match.start("call") if "call" in self._trigger.groupindex else match.start()

    def _apply_from(self, start: int) -> None:
        """Feed the text from byte ``start`` on to a new matcher: the tokens from there, the
        one ``start`` cuts spelled again from ``start``; free for good if it refuses."""
        first = next((i for i, end in enumerate(self._ends) if end > start), len(self._ends))
        tokens = self._tokens[first:]       # none where the grammar's text begins next
        token_start = self._ends[first - 1] if first else 0
        if tokens and token_start < start:  # the first began before it: spelled from it
            cut = self._text[start:self._ends[first]]
            tokens = self._vocabulary.spell(cut) + tokens[1:]
        matcher = self._vocabulary.matcher(self._compiled)
        try:
            for t in tokens:
                matcher.accept(t)
        except GrammarError:
            self.free = True
            return
        self.matcher = matcher
