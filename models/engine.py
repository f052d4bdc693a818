"""Continuous batching: many requests decoded together over one model's KV cache.

As llama-server's slots: each slot is a sequence of the cache. Requests wait in a queue and
take a free slot between steps; every step evaluates one batch holding the next token of each
decoding sequence and, in what room is left (``n_batch`` tokens in all), chunks of the prompts
still being read, so a long prompt never stops the others. Each sequence samples with its own
parameters and seed, and ends at an end-of-generation token, a stop string, ``max_tokens`` or
a full context. A slot keeps its cached tokens when its request ends: a later request that
begins the same way (a conversation's next turn) reads only what is new, and a request that
shares a prefix with another slot's cache shares those cells (``seq_cp``) instead of
recomputing them.

This is polydev's one generation loop: ``polydev serve`` runs it over many slots,
``Model.generate_batch`` over one per prompt, and ``Model.generate`` (``polydev run``) over a
single slot through ``stream``, so end-of-generation tokens, UTF-8 holding, stop strings,
length limits and prefix reuse are written once, here.

Requests are submitted from any thread (``submit``, ``Handle.cancel``); ``step``, ``run`` and
``stream`` belong to one thread, the one that owns the model. Results arrive through each
request's ``on_event`` callback, called on that thread; ``snapshot`` is what other threads
read of the engine's state (``/slots``, ``/metrics``).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from polydev.errors import ContextFullError, InvalidArgumentError, PolydevError

from .batch import Batch, common_prefix
from .kv_cells import MAX_SEQUENCES
from .kv_state import load_sequence, save_sequence
from .sampling import Sampler, SamplingParams, TokenLogprob
from .speculative import Drafter
from .stop_strings import StopMatcher
from .streaming import Utf8Stream
from .waiting import Waiting

__all__ = ["BatchEngine", "Constraint", "EngineSnapshot", "Event", "Finished", "Handle",
           "Piece", "QueueFullError", "SlotBusyError", "SlotState", "TokenLogprob"]

log = logging.getLogger(__name__)
_MAX_DRAFT_PAUSE = 32      # steps a slot goes without drafts after misses in a row
_MIN_SHARED_PREFIX = 16     # a shorter common prefix is cheaper to recompute than to share


class QueueFullError(PolydevError, RuntimeError):
    """The engine's queue of waiting requests is full; try again later."""


class SlotBusyError(PolydevError, RuntimeError):
    """A slot's cache cannot be saved, restored or erased while a request holds it."""


class Constraint(Protocol):
    """What a request's tokens must follow (``polydev.models.grammar.GrammarMatcher``)."""

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` with the tokens refused next at minus infinity."""

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next."""

    def accept(self, token: int) -> None:
        """Advance past ``token``."""


@dataclass(frozen=True)
class Piece:
    """Text generated for a request (whole UTF-8 characters, stop strings held back) and the
    tokens sampled since the last piece (a token may show no text of its own), with their
    log-probabilities when the request asked for them."""

    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Finished:
    """A request's end: ``reason`` is "stop" (end-of-generation token or stop string),
    "length" (``max_tokens`` or the context), "cancelled" or "error" (``error`` says why)."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int                  # prompt tokens found in the cache, not evaluated
    first_token_seconds: float | None   # from submission to the first generated token
    error: Exception | None = None


Event = Piece | Finished


@dataclass(frozen=True)
class SlotState:
    """One slot as ``/slots`` shows it: its sequence, whether a request holds it, the tokens
    its sequence has in the cache and those generated for the request it holds."""

    id: int
    processing: bool
    n_cached: int
    n_decoded: int


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine's state at one moment, for other threads to read (``BatchEngine.snapshot``):
    slots, requests waiting and running, token counters and the KV cache's cells."""

    slots: tuple[SlotState, ...]
    queued: int
    processing: int
    prompt_tokens: int
    generated_tokens: int
    kv_cells_used: int
    kv_cells_size: int
    drafted_tokens: int = 0
    accepted_tokens: int = 0


@dataclass
class Handle:
    """A submitted request: its settings, and ``cancel()``. ``constraint``: what its tokens
    must follow; ``logprobs``: how many alternatives each token's log-probability lists
    (None: no log-probabilities); ``show_special``: control tokens appear as their text (a
    chat format's markers, such as Mistral's ``[TOOL_CALLS]``)."""

    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    stops: tuple[str, ...]
    on_event: Callable[[Event], None]
    constraint: Constraint | None = None
    logprobs: int | None = None
    show_special: bool = False
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False

    def cancel(self) -> None:
        """Stop the request at the next step and free its slot (any thread)."""
        self.cancelled = True


@dataclass
class _Slot:
    seq_id: int
    cached: list[int] = field(default_factory=list)    # tokens of this sequence in the cache
    handle: Handle | None = None
    pending: list[int] = field(default_factory=list)   # prompt tokens still to evaluate
    next_token: int | None = None                      # sampled, to evaluate next step
    sampler: Sampler | None = None
    utf8: Utf8Stream | None = None
    stop: StopMatcher | None = None
    generated: int = 0
    unsent: list[int] = field(default_factory=list)    # generated, their text not yet shown
    unsent_logprobs: list[TokenLogprob] = field(default_factory=list)
    cached_prompt: int = 0
    first_token: float | None = None
    last_used: int = 0
    draft: list[int] = field(default_factory=list)     # drafted tokens in this step's batch
    drafted: int = 0                                   # for the request: drafted and kept
    accepted: int = 0
    draft_misses: int = 0          # drafts in a row of which nothing was kept
    draft_pause: int = 0           # steps left without drafts (after misses: 2, 4, ... 32)


class BatchEngine(Waiting[Handle]):
    """Requests over the ``n_slots`` sequences of ``model``'s cache (see the module doc)."""

    def __init__(self, model, n_slots: int = 4, max_queued: int = 64,
                 drafter: Drafter | None = None) -> None:
        """``max_queued``: requests that may wait beyond those the free slots will take;
        ``drafter``: drafts for speculative decoding (``polydev.models.speculative``)."""
        if not 1 <= n_slots <= MAX_SEQUENCES:
            raise InvalidArgumentError(f"n_slots must be in [1, {MAX_SEQUENCES}], got {n_slots}")
        self.model = model
        model.reset()                   # the engine owns every sequence of the cache
        self.slots = [_Slot(seq_id) for seq_id in range(n_slots)]
        self.max_queued = max_queued
        super().__init__()
        self._steps = 0
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.drafter = drafter
        self.drafted_tokens = 0         # drafted tokens checked, and those the sampler kept
        self.accepted_tokens = 0

    # --- any thread ---------------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], on_event: Callable[[Event], None], *,
               max_tokens: int = 128, params: SamplingParams | None = None,
               stops: str | Sequence[str] = (), constraint: Constraint | None = None,
               logprobs: int | None = None, show_special: bool = False) -> Handle:
        """Queue a request for ``prompt`` (token ids); its events go to ``on_event``.
        ``stops``: strings that end the text (one string is one stop, not its characters);
        ``constraint``: what the tokens must follow (a grammar's matcher, new for this
        request); ``logprobs``: report each token's log-probability and its ``logprobs`` most
        likely alternatives'; ``show_special``: control tokens appear as their text."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise InvalidArgumentError("the prompt has no tokens")
        if max_tokens < 0:
            raise InvalidArgumentError(f"max_tokens must be >= 0, got {max_tokens}")
        n_ctx, n_vocab = self.model.n_ctx, self.model.hparams.n_vocab
        if len(prompt) >= n_ctx:
            raise ContextFullError(f"the prompt has {len(prompt)} tokens; the context holds "
                                   f"{n_ctx}, and at least one must be left to generate")
        bad = [t for t in prompt if not 0 <= t < n_vocab]
        if bad:
            raise InvalidArgumentError(f"token id {bad[0]} is outside the vocabulary "
                                       f"[0, {n_vocab})")
        if logprobs is not None and logprobs < 0:
            raise InvalidArgumentError(f"logprobs must be >= 0, got {logprobs}")
        stops = (stops,) if isinstance(stops, str) else tuple(stops)
        handle = Handle(prompt, max_tokens, params or SamplingParams(), stops, on_event,
                        constraint, logprobs, show_special)
        with self._wake:
            free_slots = sum(s.handle is None for s in self.slots)
            if len(self._queue) >= self.max_queued + free_slots:
                raise QueueFullError(f"{len(self._queue)} requests are waiting already")
            self._queue.append(handle)
            self._wake.notify()
        return handle

    @property
    def processing(self) -> int:
        return sum(s.handle is not None for s in self.slots)

    def snapshot(self) -> EngineSnapshot:
        """The slots, queue, counters and cache now (any thread: each figure is read once)."""
        slots = tuple(_slot_state(s) for s in self.slots)
        cells = self.model.memory.cells
        return EngineSnapshot(slots, len(self._queue), sum(s.processing for s in slots),
                              self.prompt_tokens, self.generated_tokens, cells.used, cells.size,
                              self.drafted_tokens, self.accepted_tokens)

    # --- the model's thread ---------------------------------------------------------------

    def step(self) -> bool:
        """Admit waiting requests, evaluate one batch, sample; False when there was nothing
        to do."""
        self._steps += 1
        self._drop_cancelled()
        self._admit()
        batch, owners = self._next_batch()
        if not len(batch):
            return False
        rows = [n for _, n in owners]
        owners = [slot for slot, _ in owners]
        try:
            logits = self.model.evaluator.decode(batch)   # the slots keep their own tokens
        except PolydevError as e:           # the batch is rolled back; its requests end
            log.error("a batch of %d tokens failed: %s", len(batch), e)
            for slot in self._slots_in(batch):
                self._finish(slot, "error", e)
            return True
        self._record(batch)
        first = 0
        for slot, n in zip(owners, rows):
            mine, first = logits[first:first + n], first + n
            if slot.handle is None:
                continue
            try:
                if slot.draft:
                    self._sample_drafted(slot, mine)
                else:
                    self._sample(slot, mine[0])
            except Exception as e:          # one request's failure is not the others'
                log.exception("sampling failed")
                self._finish(slot, "error", e, flush=False)
        return True

    def abort(self, error: Exception) -> None:
        """End every running and waiting request with ``error`` (the model's thread is
        stopping on a failure)."""
        for slot in self.slots:
            if slot.handle is not None:
                self._finish(slot, "error", error)
        with self._lock:
            waiting, self._queue = list(self._queue), deque()
        for handle in waiting:
            handle.on_event(Finished("error", len(handle.prompt), 0, 0, None, error))

    def run_until_done(self) -> None:
        """Step until no request is waiting or running."""
        while self._queue or self.processing:
            self.step()

    def stream(self, prompt: Sequence[int], *, max_tokens: int = 128,
               params: SamplingParams | None = None, stops: str | Sequence[str] = (),
               constraint: Constraint | None = None,
               logprobs: int | None = None) -> Iterator[Event]:
        """Submit a request (as ``submit``) and step the engine on this thread until it ends,
        yielding its events as they come (the last one is its ``Finished``). Leaving the loop
        early (a consumer that stops, Ctrl-C) cancels the request and frees its slot."""
        events: deque[Event] = deque()
        handle = self.submit(prompt, events.append, max_tokens=max_tokens, params=params,
                             stops=stops, constraint=constraint, logprobs=logprobs)
        finished = False
        try:
            while not finished:
                if not events and not self.step() and not events:
                    raise ContextFullError(     # nothing else runs that could free cells
                        f"the cache has no room for the prompt's {len(handle.prompt)} tokens "
                        f"({self.model.memory.cells.free} of {self.model.n_ctx} cells are "
                        "free: free other sequences, or raise n_ctx)")
                while events:
                    event = events.popleft()
                    finished = isinstance(event, Finished)
                    yield event
        finally:
            if not finished:
                self._cancel_now(handle)

    def release(self, seq_id: int) -> bool:
        """End the request that holds slot ``seq_id`` now ("cancelled"): its slot is free, and
        its cache keeps what was read. False when no request held it."""
        handle = self.slots[seq_id].handle
        if handle is not None:
            self._cancel_now(handle)
        return handle is not None

    def _cancel_now(self, handle: Handle) -> None:
        """Cancel ``handle`` and free its slot at once; cells a step left unrecorded (Ctrl-C
        between evaluating a batch and recording it) are forgotten, so the slot's tokens are
        what its sequence holds."""
        handle.cancel()
        for slot in self.slots:
            if slot.handle is handle:
                self.model.kv.cells.seq_rm(slot.seq_id, len(slot.cached))
        self._drop_cancelled()

    def adopt(self, seq_id: int, tokens: Sequence[int]) -> None:
        """Tell the engine that sequence ``seq_id`` of the cache holds ``tokens`` (evaluated
        outside the engine: ``Model.eval``), so that a request beginning with them reuses
        their cells. The slot must be free."""
        slot = self.slots[seq_id]
        if slot.handle is not None:
            raise InvalidArgumentError(f"slot {seq_id} is serving a request")
        slot.cached = [int(t) for t in tokens]

    def cached(self, seq_id: int) -> list[int]:
        """The tokens that sequence ``seq_id`` holds in the cache (a copy)."""
        return list(self.slots[seq_id].cached)

    def save_slot(self, seq_id: int, path) -> tuple[int, int]:
        """Write the cache of free slot ``seq_id`` to ``path`` (``kv_state``): the tokens
        saved and the bytes written."""
        slot = self._free_slot(seq_id)
        return len(slot.cached), save_sequence(self.model.kv, seq_id, slot.cached, path)

    def restore_slot(self, seq_id: int, path) -> tuple[int, int]:
        """Replace the cache of free slot ``seq_id`` with the one saved in ``path``, so that
        a request beginning with its tokens reuses them: the tokens restored and the bytes
        read."""
        slot = self._free_slot(seq_id)
        tokens, n_read = load_sequence(self.model.kv, seq_id, path)
        slot.cached = tokens
        return len(tokens), n_read

    def erase_slot(self, seq_id: int) -> int:
        """Forget the cache of free slot ``seq_id``: the tokens it held."""
        slot = self._free_slot(seq_id)
        n = len(slot.cached)
        self.model.kv.seq_rm(seq_id)
        slot.cached = []
        return n

    def _free_slot(self, seq_id: int) -> _Slot:
        if not 0 <= seq_id < len(self.slots):
            raise InvalidArgumentError(f"there is no slot {seq_id}: the slots are 0 to "
                                       f"{len(self.slots) - 1}")
        slot = self.slots[seq_id]
        if slot.handle is not None:
            raise SlotBusyError(f"slot {seq_id} is serving a request")
        return slot

    # --- admission --------------------------------------------------------------------------

    def _drop_cancelled(self) -> None:
        for slot in self.slots:
            if slot.handle is not None and slot.handle.cancelled:
                self._finish(slot, "cancelled")
        with self._lock:
            dropped = sum(h.cancelled for h in self._queue)
            if dropped:
                self._queue = deque(h for h in self._queue if not h.cancelled)
        if dropped:
            log.debug("%d waiting requests were cancelled", dropped)

    def _admit(self) -> None:
        while True:
            free = [s for s in self.slots if s.handle is None]
            with self._lock:
                if not free or not self._queue:
                    return
                handle = next((h for h in self._queue if not self._worth_waiting(h.prompt)),
                              None)
                if handle is None:
                    return
                self._queue.remove(handle)
            self._start(self._pick_slot(free, handle.prompt), handle)

    def _worth_waiting(self, prompt: list[int]) -> bool:
        """Whether a slot reading its prompt now will hold more of ``prompt``'s beginning
        than any cache holds: then ``prompt`` waits for it, to share those cells instead of
        computing them again (``n`` choices of one prompt, a common system prompt). A later
        request may start before one that waits so."""
        readers = [s for s in self.slots if s.handle is not None and s.pending]
        if not readers:
            return False
        head = prompt[:-1]
        start = head[:_MIN_SHARED_PREFIX]
        readers = [s for s in readers if s.handle.prompt[:_MIN_SHARED_PREFIX] == start]
        if not readers or len(start) < _MIN_SHARED_PREFIX:     # the common case, at once
            return False
        held = max(common_prefix(s.cached, head) for s in self.slots)
        return any(common_prefix(s.handle.prompt, head) >= max(held + 1, _MIN_SHARED_PREFIX)
                   for s in readers)

    def _pick_slot(self, free: list[_Slot], prompt: list[int]) -> _Slot:
        """The free slot whose cache begins as ``prompt`` does for longest; else the one
        unused for longest."""
        return max(free, key=lambda s: (common_prefix(s.cached, prompt), -s.last_used))

    def _start(self, slot: _Slot, handle: Handle) -> None:
        prompt = handle.prompt
        keep = common_prefix(slot.cached, prompt[:-1])     # the last token gives logits
        shared, donor = max(((common_prefix(s.cached, prompt[:-1]), s.seq_id)
                             for s in self.slots if s is not slot), default=(0, None))
        kv = self.model.kv
        if shared >= max(keep + 1, _MIN_SHARED_PREFIX):
            kv.seq_rm(slot.seq_id)
            kv.seq_cp(donor, slot.seq_id, 0, shared)
            keep = shared
        else:
            kv.seq_rm(slot.seq_id, keep)
        slot.cached = prompt[:keep]
        slot.handle, slot.pending, slot.next_token = handle, prompt[keep:], None
        slot.sampler = Sampler(handle.params, self.model.n_ctx)
        for t in prompt:
            slot.sampler.accept(t)
        slot.utf8, slot.stop = Utf8Stream(), StopMatcher(handle.stops)
        slot.generated, slot.cached_prompt, slot.first_token = 0, keep, None
        slot.drafted = slot.accepted = slot.draft_misses = slot.draft_pause = 0

    # --- the batch --------------------------------------------------------------------------

    def _next_batch(self) -> tuple[Batch, list[tuple[_Slot, int]]]:
        """The next token of every decoding sequence (and its draft, when speculating), then
        prompt chunks in what room is left; the slots whose logits come back, in the batch's
        order, with how many rows each."""
        decoding = [s for s in self.slots if s.handle is not None and s.next_token is not None]
        reading = [s for s in self.slots if s.handle is not None and s.pending]
        room = self._make_room(len(decoding), reading)
        decoding = [s for s in decoding if s.handle is not None]    # some may have ended
        space = min(room, self.model.evaluator.n_batch) - len(decoding)
        drafted = self._draft(decoding, space // 2 if reading else space)   # prompts go on
        batch, owners = Batch(), []
        for slot in decoding:
            batch.add(slot.next_token, slot.seq_id, logits=True)
            for token in slot.draft:
                batch.add(token, slot.seq_id, logits=True)
            owners.append((slot, 1 + len(slot.draft)))
            slot.last_used = self._steps
        used = len(decoding) + drafted
        budget = min(self.model.evaluator.n_batch - used, room - used)
        for slot in reading:
            chunk = slot.pending[:max(budget, 0)]
            if not chunk:
                break
            last = len(chunk) == len(slot.pending)
            batch.add_sequence(chunk, slot.seq_id, logits="last" if last else "none")
            if last:
                owners.append((slot, 1))
            budget -= len(chunk)
            slot.last_used = self._steps
        return batch, owners

    def _draft(self, decoding: list[_Slot], room: int) -> int:
        """Give each decoding slot its draft (``slot.draft``) in ``room`` cells and batch
        rows at most; the tokens drafted."""
        for slot in self.slots:
            slot.draft = []
        if self.drafter is None or not decoding or room <= 0:
            return 0
        n_ctx = self.model.n_ctx
        for slot in decoding:
            slot.draft_pause = max(slot.draft_pause - 1, 0)
        decoding = [s for s in decoding if not s.draft_pause]
        limits = {s.seq_id: min(s.handle.max_tokens - s.generated - 1,
                                n_ctx - len(s.cached) - 2) for s in decoding}
        histories = {s.seq_id: s.cached + [s.next_token] for s in decoding
                     if limits[s.seq_id] > 0}
        if not histories:
            return 0
        try:
            drafts = self.drafter.draft(histories, limits)
        except PolydevError as e:       # no drafts this step; the requests go on
            log.warning("drafting failed: %s", e)
            return 0
        used = 0
        for slot in decoding:
            draft = drafts.get(slot.seq_id, [])[:max(room - used, 0)]
            slot.draft = draft if len(draft) >= max(self.drafter.settings.draft_min, 1) else []
            used += len(slot.draft)
        return used

    def _make_room(self, n_decoding: int, reading: list[_Slot]) -> int:
        """Free cells for this step: idle slots' caches go first, then, while the decoding
        sequences' next tokens do not fit, the longest one ends ("length"). When nothing
        decodes and no prompt chunk fits, the prompt read last goes back to the queue."""
        cells = self.model.kv.cells
        free = cells.free           # counted once: a decode step's common case changes nothing
        if free >= n_decoding + (1 if reading else 0):
            return free
        for slot in self.slots:
            if slot.handle is None and slot.cached:
                self.model.kv.seq_rm(slot.seq_id)
                slot.cached = []
        while cells.free < n_decoding:
            longest = max((s for s in self.slots if s.next_token is not None and s.handle),
                          key=lambda s: len(s.cached))
            self._finish(longest, "length")
            n_decoding -= 1
        if not n_decoding and reading and not cells.free:
            slot = reading[-1]
            with self._lock:
                self._queue.appendleft(slot.handle)
            self.model.kv.seq_rm(slot.seq_id)
            slot.handle, slot.cached, slot.pending = None, [], []
            reading.pop()
        return cells.free

    def _slots_in(self, batch: Batch) -> list[_Slot]:
        ids = set(batch.seq_ids)
        return [s for s in self.slots if s.seq_id in ids and s.handle is not None]

    def _record(self, batch: Batch) -> None:
        """The batch is in the cache: move its tokens from pending to cached."""
        counts: dict[int, list[int]] = {}
        for token, seq in zip(batch.tokens, batch.seq_ids):
            counts.setdefault(seq, []).append(token)
        for slot in self.slots:
            tokens = counts.get(slot.seq_id)
            if not tokens:
                continue
            slot.cached += tokens
            if slot.next_token is not None:
                slot.next_token = None
                self.generated_tokens += 1
            else:
                del slot.pending[:len(tokens)]
                self.prompt_tokens += len(tokens)

    # --- sampling ---------------------------------------------------------------------------

    def _sample(self, slot: _Slot, logits: np.ndarray) -> None:
        if slot.handle.max_tokens == 0:     # the prompt is read and cached, nothing sampled
            self._finish(slot, "length")
            return
        token = self._draw(slot, logits)
        if slot.first_token is None:
            slot.first_token = time.perf_counter() - slot.handle.submitted
        tokenizer = self.model.tokenizer
        if tokenizer.is_eog(token):
            self._finish(slot, "stop")
            return
        if slot.handle.constraint is not None:
            slot.handle.constraint.accept(token)
        if slot.handle.logprobs is not None:
            slot.unsent_logprobs.append(slot.sampler.logprobs(token, slot.handle.logprobs))
        slot.sampler.accept(token)
        slot.generated += 1
        slot.unsent.append(token)
        text, stopped = slot.stop.feed(slot.utf8.feed(tokenizer.token_to_piece(
            token, special=slot.handle.show_special)))
        if text:
            self._send(slot, text)
        if stopped:
            self._finish(slot, "stop", flush=False)
        elif slot.generated >= slot.handle.max_tokens:
            self._finish(slot, "length")
        elif len(slot.cached) + 1 >= self.model.n_ctx:
            self._finish(slot, "length")
        else:
            slot.next_token = token

    @staticmethod
    def _draw(slot: _Slot, logits: np.ndarray) -> int:
        """The next token from ``logits`` by the slot's sampler, within its grammar. As
        llama.cpp's sampler does: the draw is made first and checked, and only a token the
        grammar refuses makes it mask the logits and draw again, which saves a pass over the
        vocabulary per token. (Greedy, that is the masked argmax; sampled, the truncations
        see unmasked logits first, and a refused draw takes a second random number.)
        Log-probabilities are of the masked distribution, so a request that asks for them is
        masked first."""
        constraint, sampler = slot.handle.constraint, slot.sampler
        if constraint is None:
            return sampler.sample(logits)
        if slot.handle.logprobs is None:
            token = sampler.sample(logits)
            if constraint.allows(token):
                return token
        logits = constraint.mask(logits)
        token = sampler.sample(logits)
        if not np.isfinite(logits[token]):
            raise InvalidArgumentError("the request's grammar allows no token here")
        return token

    def _sample_drafted(self, slot: _Slot, rows: np.ndarray) -> None:
        """Walk the rows of a drafted sequence: row i follows the draft's first i tokens.
        The token sampled from row i is kept; while it equals the draft's next token that
        token's cells are already computed and the walk goes on; at the first difference (or
        the request's end) the rest of the draft leaves the cache."""
        draft, kept = slot.draft, 0
        slot.draft = []
        self.drafted_tokens += len(draft)
        slot.drafted += len(draft)
        del slot.cached[len(slot.cached) - len(draft):]     # back as each one is kept
        for i, row in enumerate(rows):
            self._sample(slot, row)
            if slot.handle is None or i == len(draft) or slot.next_token != draft[i]:
                break
            slot.next_token = None          # drafted: its keys and values are cached
            slot.cached.append(draft[i])
            kept += 1
        self.accepted_tokens += kept
        self.generated_tokens += kept
        slot.accepted += kept
        # a slot whose drafts keep failing (text that does not repeat, a draft model that
        # guesses badly) drafts less often: every verification that keeps nothing costs a step
        slot.draft_misses = 0 if kept else slot.draft_misses + 1
        slot.draft_pause = min(2 ** slot.draft_misses, _MAX_DRAFT_PAUSE) if not kept else 0
        if kept < len(draft):
            self.model.kv.seq_rm(slot.seq_id, len(slot.cached))

    @staticmethod
    def _send(slot: _Slot, text: str) -> None:
        slot.handle.on_event(Piece(text, tuple(slot.unsent), tuple(slot.unsent_logprobs)))
        slot.unsent, slot.unsent_logprobs = [], []

    def _finish(self, slot: _Slot, reason: str, error: Exception | None = None,
                flush: bool = True) -> None:
        handle = slot.handle
        if flush and reason not in ("cancelled", "error"):
            tail, stopped = slot.stop.feed(slot.utf8.flush())
            tail += "" if stopped else slot.stop.flush()
            if tail or slot.unsent:
                self._send(slot, tail)
        slot.handle, slot.pending, slot.next_token = None, [], None
        slot.unsent, slot.unsent_logprobs = [], []
        if slot.drafted:
            log.info("slot %d: %d tokens, %d of %d drafted tokens kept (%.0f%%)", slot.seq_id,
                     slot.generated, slot.accepted, slot.drafted,
                     100.0 * slot.accepted / slot.drafted)
        handle.on_event(Finished(reason, len(handle.prompt), slot.generated, slot.cached_prompt,
                                 slot.first_token, error))


def _slot_state(slot: _Slot) -> SlotState:
    handle = slot.handle                   # read once: the model's thread may change it
    return SlotState(slot.seq_id, handle is not None, len(slot.cached),
                     slot.generated if handle is not None else 0)
